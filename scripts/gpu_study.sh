#!/usr/bin/env bash
# A full Spec-Bench study of one real model on one GPU, with specbench commands only:
#   1. fetch the official questions (data/spec_bench/question.jsonl, SHA-256 checked; kept if present);
#   2. for each method of METHODS in turn (the baseline first), RUNS runs over all 480 questions,
#      each method in its own process (a clean GPU for every method);
#   3. the leaderboard: tables and figures under REPORT_DIR.
# Re-running the same command resumes: finished answers are kept, a torn run goes on where it stopped.
#
#   bash scripts/gpu_study.sh                               # vicuna-7b-v1.3, the defaults below
#   MODEL=llama-3.1-8b-instruct METHODS=baseline,sps,pld RUNS=3 bash scripts/gpu_study.sh
#   MODEL=local MODEL_PATH=Qwen/Qwen2.5-7B-Instruct EXTRA='model.draft=Qwen/Qwen2.5-0.5B-Instruct' \
#       bash scripts/gpu_study.sh
#   bash scripts/gpu_study.sh --dry-run                     # (or DRY_RUN=1) print the commands only
#
# Settings (environment variables):
#   MODEL        a configs/model name (vicuna-7b-v1.3, llama-3.1-8b-instruct, ...) or `local`
#   MODEL_PATH   with MODEL=local: the hub id or folder of the model
#   METHODS      comma-separated configs/method names; EAGLE, Medusa and REST need their head or
#                datastore for this model in EXTRA (method.head=..., method.datastore=...)
#   RUNS         repeated runs per method (upstream Spec-Bench reports the mean of 3)
#   DEVICE       cuda, cuda:1, ... (a GPU study: the default is cuda)
#   TEMPERATURE  0 = greedy (the default), as upstream
#   TASK         all (480 questions) or one subtask, e.g. qa
#   RESULTS      answer folder (default results/answers); REPORT_DIR where report writes
#   EXTRA        further Hydra overrides for every run, e.g. 'dtype=bfloat16 limit=10'
#   SPECBENCH    the command to call (default specbench; e.g. '.venv/bin/python -m specbench')
set -euo pipefail

MODEL=${MODEL:-vicuna-7b-v1.3}
MODEL_PATH=${MODEL_PATH:-}
METHODS=${METHODS:-baseline,sps,pld,lookahead,hf_assisted,hf_pld}
RUNS=${RUNS:-3}
DEVICE=${DEVICE:-cuda}
TEMPERATURE=${TEMPERATURE:-0}
TASK=${TASK:-all}
RESULTS=${RESULTS:-results/answers}
REPORT_DIR=${REPORT_DIR:-results/leaderboard}
EXTRA=${EXTRA:-}
SPECBENCH=${SPECBENCH:-specbench}
DRY_RUN=${DRY_RUN:-0}

source "$(dirname "${BASH_SOURCE[0]}")/lib/study.sh"
parse_study_args "$@"

read -r -a CLI <<<"$SPECBENCH"
read -r -a EXTRA_ARGS <<<"$EXTRA"
COMMON=(model="$MODEL" dataset=spec_bench task="$TASK" runs="$RUNS" device="$DEVICE"
        temperature="$TEMPERATURE" output_dir="$RESULTS")
[[ -n $MODEL_PATH ]] && COMMON+=(model.path="$MODEL_PATH")

run "${CLI[@]}" data fetch
# The baseline first, so that every method's speedup has its reference; then the others in order.
IFS=, read -r -a LIST <<<"$METHODS"
ORDERED=(baseline)
for method in "${LIST[@]}"; do
    [[ $method == baseline ]] || ORDERED+=("$method")
done
for method in "${ORDERED[@]}"; do
    run "${CLI[@]}" run method="$method" "${COMMON[@]}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
done
run "${CLI[@]}" report "$RESULTS" --out "$REPORT_DIR"
