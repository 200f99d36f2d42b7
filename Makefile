# specbench: `make bench` runs the main job on the embedded default, `make test` the tests.
# Both create a virtualenv under the repo (.venv) and install what they need on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine set TORCH to the CUDA build you want.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

# The methods of the main job and the leaderboard (Hydra multirun; the baseline runs first): empty
# means the registry's `bench` suite (`specbench methods --names --suite bench`: the built-ins and
# your methods/ folder), asked when the recipe runs; `make bench METHODS=baseline,sps` picks some.
METHODS ?=
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
	methods="$(or $(METHODS),$$($(PY) -m specbench methods --names --suite bench))" && \
	$(PY) -m specbench -m run method=$$methods $(BENCH_ARGS)
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
	$(PY) -m ruff check specbench tests methods

.PHONY: wheel-smoke
wheel-smoke:  ## build the wheel, install it in a scratch venv, run it from an empty folder (scripts/wheel_smoke.sh)
	PYTHON="$(PYTHON)" TORCH="$(TORCH)" bash scripts/wheel_smoke.sh
