#!/usr/bin/env bash
# The GPU study of scripts/gpu_study.sh spread over a cluster with a Hydra launcher preset from
# configs/hydra/launcher/: `slurm` (one SLURM job per method, submitit) or `ray_local` (Ray tasks).
#   1. fetch the official questions here (the login node; the folder must be on a shared filesystem);
#   2. the baseline as one job (RUNS runs over all 480 questions), waited for;
#   3. every other method of METHODS as its own job, in parallel, waited for;
#   4. the leaderboard under REPORT_DIR.
# Paths are made absolute so that jobs find the questions and answers wherever they start.
# Re-running the same command resumes: finished answers are kept.
#
#   pip install 'specbench[slurm]'        # or '.[slurm]' in a checkout; '[ray]' for Ray
#   PARTITION=gpu bash scripts/cluster_study.sh
#   LAUNCHER=ray_local RAY_ADDRESS=auto METHODS=baseline,sps,eagle EXTRA='method.head=/ckpt/eagle' \
#       bash scripts/cluster_study.sh
#   bash scripts/cluster_study.sh --dry-run              # (or DRY_RUN=1) print the commands only
#
# Settings (environment variables), besides MODEL, MODEL_PATH, METHODS, RUNS, TEMPERATURE, TASK,
# EXTRA and SPECBENCH as in scripts/gpu_study.sh:
#   LAUNCHER     slurm (default) or ray_local
#   PARTITION    SLURM partition (default: the cluster's default)
#   TIMEOUT_MIN  SLURM time limit per job in minutes (default 720)
#   RESULTS, REPORT_DIR  answer and report folders (default results/answers, results/leaderboard)
set -euo pipefail

MODEL=${MODEL:-vicuna-7b-v1.3}
MODEL_PATH=${MODEL_PATH:-}
METHODS=${METHODS:-baseline,sps,pld,lookahead,hf_assisted,hf_pld}
RUNS=${RUNS:-3}
TEMPERATURE=${TEMPERATURE:-0}
TASK=${TASK:-all}
LAUNCHER=${LAUNCHER:-slurm}
PARTITION=${PARTITION:-}
TIMEOUT_MIN=${TIMEOUT_MIN:-720}
RESULTS=${RESULTS:-results/answers}
REPORT_DIR=${REPORT_DIR:-results/leaderboard}
EXTRA=${EXTRA:-}
SPECBENCH=${SPECBENCH:-specbench}
DRY_RUN=${DRY_RUN:-0}

source "$(dirname "${BASH_SOURCE[0]}")/lib/study.sh"
parse_study_args "$@"
case $LAUNCHER in
    slurm|ray_local) ;;
    *) echo "error: unknown LAUNCHER '$LAUNCHER'; use slurm or ray_local (configs/hydra/launcher/)" >&2; exit 2 ;;
esac
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }

read -r -a CLI <<<"$SPECBENCH"
read -r -a EXTRA_ARGS <<<"$EXTRA"
QUESTIONS=$(absolute data/spec_bench/question.jsonl)
RESULTS=$(absolute "$RESULTS")
COMMON=(model="$MODEL" dataset=spec_bench dataset.path="$QUESTIONS" task="$TASK" runs="$RUNS" device=cuda
        temperature="$TEMPERATURE" output_dir="$RESULTS" hydra/launcher="$LAUNCHER")
[[ -n $MODEL_PATH ]] && COMMON+=(model.path="$MODEL_PATH")
if [[ $LAUNCHER == slurm ]]; then
    COMMON+=(hydra.launcher.timeout_min="$TIMEOUT_MIN")
    [[ -n $PARTITION ]] && COMMON+=(hydra.launcher.partition="$PARTITION")
fi

IFS=, read -r -a LIST <<<"$METHODS"
OTHERS=()
for method in "${LIST[@]}"; do
    [[ $method == baseline ]] || OTHERS+=("$method")
done

run "${CLI[@]}" data fetch --dest "$QUESTIONS"
# Hydra's launchers wait for their jobs, so the baseline is done before the methods start.
run "${CLI[@]}" -m run method=baseline "${COMMON[@]}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
if ((${#OTHERS[@]})); then
    others=$(IFS=,; echo "${OTHERS[*]}")
    run "${CLI[@]}" -m run method="$others" "${COMMON[@]}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
fi
run "${CLI[@]}" report "$RESULTS" --out "$REPORT_DIR"
