# specbench: `make bench` runs the main job on the embedded default, `make test` the tests.
# Both create a virtualenv under the repo (.venv) and install what they need on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine set TORCH to the CUDA build you want.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

# The methods of the main job and the leaderboard (Hydra multirun; the baseline runs first).
METHODS ?= baseline,sps,sps_plain,pld,hf_assisted,hf_pld,eagle,eagle2,medusa,lookahead,lookahead_cpu,jacobi,rest,recycling,self_spec
BENCH_ARGS ?= task=all limit=10
# results/leaderboard holds what `report` writes; results/answers (git-ignored) the answer files.

.PHONY: install bench leaderboard check test zoo data synth lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

bench: install  ## the main job: every method on all 480 synthetic questions with the tiny zoo, then the table
	$(PY) -m specbench zoo build
	$(PY) -m specbench -m run method=$(METHODS) $(BENCH_ARGS)
	$(PY) -m specbench report

leaderboard: bench  ## regenerate results/leaderboard (tables, figures) from a full run

check: install  ## quick regression check against results/reference (what CI runs after the tests)
	$(PY) -m specbench check --quick

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
