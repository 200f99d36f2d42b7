# Shared by scripts/gpu_study.sh and scripts/cluster_study.sh (sourced, not run): their command-line
# flags, the MODEL check, and `run`, which prints each command and runs it unless DRY_RUN=1.

# --dry-run sets DRY_RUN=1; --help prints the calling script's comment block.
parse_study_args() {
    local arg
    for arg in "$@"; do
        case $arg in
            --dry-run) DRY_RUN=1 ;;
            -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) echo "error: unknown argument '$arg'; use --dry-run or --help" >&2; exit 2 ;;
        esac
    done
    if [[ $MODEL == local && -z $MODEL_PATH ]]; then
        echo "error: MODEL=local needs MODEL_PATH (a hub id or model folder)" >&2
        exit 2
    fi
}

# Print a command (quoted where the shell needs it); run it unless this is a dry run.
run() {
    local line="+" arg
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $arg"; else line+=" $(printf '%q' "$arg")"; fi
    done
    echo "$line"
    [[ $DRY_RUN == 1 ]] || "$@"
}
