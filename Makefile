# specbench: `make bench` runs the main job on the embedded default, `make test` the tests.
# Both create a virtualenv under the repo (.venv) and install what they need on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine set TORCH to the CUDA build you want.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install bench test zoo data synth lint clean-results

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

bench: install  ## the main job: every method on all 480 synthetic questions with the tiny zoo
	$(PY) -m specbench run method=baseline task=all

test: install  ## the test suite (builds the zoo once, cached under ~/.cache/specbench/zoo)
	$(PY) -m pytest -q

zoo: install  ## build (or reuse) the embedded model zoo
	$(PY) -m specbench zoo build

data: install  ## download the official Spec-Bench questions (checksum verified)
	$(PY) -m specbench data fetch

synth: install  ## write the synthetic benchmark to data/synthetic/question.jsonl
	$(PY) -m specbench data synth

lint: install
	$(PY) -m ruff check specbench tests
