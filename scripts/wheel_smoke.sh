#!/usr/bin/env bash
# Wheel smoke test: does specbench work when installed from its wheel, away from the checkout?
#
# Builds the wheel from a clean copy of the sources, installs it with its dependencies into a
# scratch virtualenv, then, from an empty temporary folder (no configs/, no checkout on sys.path):
#   specbench --help; specbench run method=sps --cfg job; specbench data synth;
#   a short real run on a tiny random Llama saved in that folder; specbench report.
# Each step is printed; the script fails on the first step that does.
#
#   bash scripts/wheel_smoke.sh                 # or: make wheel-smoke
#   PYTHON=python3.11 TORCH='torch==2.13.0' KEEP=1 bash scripts/wheel_smoke.sh
#
# PYTHON builds the venv (default python3); TORCH is the torch requirement installed first (the
# CPU build, as the Makefile); KEEP=1 keeps the scratch folder for a look afterwards. pip uses
# its usual indexes and cache; nothing else touches the network, and no GPU is needed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/specbench-wheel-smoke.XXXXXX")
if [[ ${KEEP:-0} == 1 ]]; then
    trap 'echo "kept $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi
SECONDS=0

step() { printf '\n==> [%3ds] %s\n' "$SECONDS" "$*"; }
fail() { echo "wheel smoke test FAILED: $*" >&2; exit 1; }
# pip without the notes some machines' configs cause about local index folders lacking a package
pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

step "build the wheel from a clean copy of the sources"
mkdir -p "$WORK/src"
cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/configs" "$ROOT/specbench" "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
pip_quiet "$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/specbench-*.whl)
echo "$WHEEL"
"$PYTHON" -m zipfile -l "$WHEEL" > "$WORK/wheel-files.txt"
grep -q "specbench/configs/config.yaml" "$WORK/wheel-files.txt" || fail "the wheel has no specbench/configs/"
grep -q "specbench/zoo/release.json" "$WORK/wheel-files.txt" || fail "the wheel has no specbench/zoo/release.json (the zoo's release manifest)"
echo "$(grep -c "specbench/configs/.*\.yaml" "$WORK/wheel-files.txt") config files under specbench/configs/"

step "scratch venv: $TORCH, then the wheel and its dependencies"
"$PYTHON" -m venv "$WORK/venv"
# --no-compile: skip byte-compiling the thousands of files of torch and friends (a smoke test needs no .pyc)
pip_quiet "$WORK/venv/bin/python" -m pip install -q --no-compile "$TORCH"
pip_quiet "$WORK/venv/bin/python" -m pip install -q --no-compile "$WHEEL"
"$WORK/venv/bin/python" -m pip list 2>/dev/null | grep -i -E "^(specbench|torch|transformers|hydra-core|datasets) "

# From here on only the venv's specbench exists: an empty folder, no checkout on the path.
export PATH="$WORK/venv/bin:$PATH"
unset PYTHONPATH
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir "$WORK/empty"
cd "$WORK/empty"
PY="$WORK/venv/bin/python"

step "where the installed package reads its configs"
"$PY" - <<'PYEOF'
from importlib.metadata import entry_points

from specbench.core.resources import CONFIG_DIR, source_checkout

print("CONFIG_DIR:", CONFIG_DIR)
assert source_checkout() is None, "the installed package took a folder for a checkout"
assert (CONFIG_DIR / "config.yaml").is_file() and CONFIG_DIR.parent.name == "specbench", CONFIG_DIR
names = {e.name: e.value for e in entry_points(group="specbench.resolvers")}
assert names.get("zoo") == "specbench.zoo:resolve", names
print("resolvers:", names)
PYEOF

step "specbench --help"
specbench --help > "$WORK/help.txt"
head -3 "$WORK/help.txt"
grep -q "^commands:" "$WORK/help.txt" || fail "no command list in --help"

step "specbench run method=sps --cfg job"
specbench run method=sps --cfg job > "$WORK/cfg.txt"
head -8 "$WORK/cfg.txt"
grep -q "name: sps" "$WORK/cfg.txt" || fail "--cfg job did not compose method=sps"

step "specbench data synth"
specbench data synth
test -s data/synthetic/question.jsonl || fail "no data/synthetic/question.jsonl in the current folder"
echo "$(wc -l < data/synthetic/question.jsonl) questions in $PWD/data/synthetic/question.jsonl"

step "a tiny random Llama and a BPE tokenizer with a chat template in ./tiny"
"$PY" - <<'PYEOF'
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

text = ["speculative decoding drafts tokens and the target verifies them", "what is the capital of nowhere"]
core = Tokenizer(models.BPE())
core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
core.decoder = decoders.ByteLevel()
special = ["<|bos|>", "<|end|>"]
core.train_from_iterator(text * 10, trainers.BpeTrainer(
    vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|end|>")
tok.chat_template = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512,
    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
)
AutoModelForCausalLM.from_config(config).save_pretrained("tiny")
tok.save_pretrained("tiny")
print("saved ./tiny")
PYEOF

step "specbench run model=local model.path=./tiny method=pld (the baseline in turn with it)"
specbench run model=local model.path=./tiny method=pld dataset=synthetic task=qa limit=2 max_new_tokens=16 \
    warmup=0 progress=false
ANSWERS=$(find results/answers -name answers.jsonl | sort)
[[ -n $ANSWERS ]] || fail "no results/answers/.../answers.jsonl in the current folder"
for file in $ANSWERS; do echo "$(wc -l < "$file") answers in $file"; done
grep -q "pld" <<<"$ANSWERS" || fail "no answer file for method=pld"

step "specbench report"
specbench report | tail -12
ls results/leaderboard

step "wheel smoke test passed in ${SECONDS}s"
