"""How the zoo's reference weights are stored: bfloat16 where a part keeps its held-out agreement within 1%
of float32's, else float32 (issue 42), measured, not assumed.

From the built cache folders (the zoo, its heads, Hydra's head, trained on this machine in float32) it writes
two candidate releases, every part in float32 and every part in bfloat16 (`zoo ship`'s storage), restores
each into an empty cache of its own as a run would, and measures on each
- the zoo's held-out metrics (the quality card's: the target's next-token accuracy, each draft's top-1
  agreement with the target) on the zoo's held-out conversations, and
- every trained method's #mean accepted tokens (greedy, each method's preset draft size: budget=fixed) with
  the baseline, on LIMIT synthetic benchmark questions per subtask (never trained on), one job each;
then compares them part by part and writes the verdict (JSON for `zoo ship --measured`, and a table).

    .venv/bin/python scripts/weights_storage.py --out results/reference/weights-storage
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbench.core.table import markdown  # noqa: E402

#: trained methods and the parts their acceptance depends on (the target for all)
METHODS = {
    "sps": ["draft"], "sps_plain": ["draft_plain"], "specinfer": ["draft", "draft_plain"], "online_spec": ["draft"],
    "eagle": ["eagle"], "eagle2": ["eagle"], "eagle3": ["eagle3"], "medusa": ["medusa"], "hydra": ["hydra"],
    "ppd": ["ppd"], "specdec": ["specdec"],
}
TOLERANCE = 0.01


def env_for(weights: Path, cache: Path) -> dict[str, str]:
    return {**os.environ, "SPECBENCH_WEIGHTS_DIR": str(weights), "SPECBENCH_ZOO_DIR": str(cache),
            "SPECBENCH_ZOO_FETCH": "0", "PYTHONPATH": str(ROOT)}


PARTS = ["target", "draft", "draft_plain", "eagle", "eagle3", "medusa", "ppd", "specdec", "hydra"]


def ship(storage: dict[str, str], out: Path) -> None:
    command = [sys.executable, "-m", "specbench", "zoo", "ship", "--out", str(out), "--release", "candidate",
               "--storage", *[f"{part}={storage[part]}" for part in PARTS]]
    subprocess.run(command, cwd=ROOT, check=True)


def heldout(weights: Path, cache: Path) -> dict[str, float]:
    code = """
import json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from specbench.zoo import data, ensure_zoo, load_zoo_config
from specbench.zoo.card import heldout_metrics
torch.set_num_threads(2)
cfg = load_zoo_config(); zoo = ensure_zoo(cfg)
tok = AutoTokenizer.from_pretrained(zoo / "target")
rows = data.pack(data.encode_items(tok, data.conversations(cfg, "heldout")), int(cfg.seq_len), tok, int(cfg.seed))
models = {n: AutoModelForCausalLM.from_pretrained(zoo / n, dtype=torch.float32).eval()
          for n in ("target", "draft", "draft_plain")}
m = heldout_metrics(models, rows, int(cfg.card.eval_batch_size))
print(json.dumps({"target": m["target"]["accuracy_all"], "draft": m["draft"]["agreement_all"],
                  "draft_plain": m["draft_plain"]["agreement_all"]}))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env_for(weights, cache), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def acceptance(weights: Path, cache: Path, answers: Path, limit: int, methods: list[str]) -> dict[str, float]:
    command = [sys.executable, "-m", "specbench", "run", "method=baseline", f"interleave=[{','.join(methods)}]",
               "budget=fixed", "task=all", f"limit={limit}", "warmup=0", "progress=false", f"output_dir={answers}",
               "threads=2"]
    subprocess.run(command, cwd=ROOT, env=env_for(weights, cache), check=True)
    out = {}
    for path in answers.rglob("answers.jsonl"):
        method = path.parts[-4].removesuffix("-fixed")
        steps = [a for line in path.read_text().splitlines() if line.strip()
                 for a in json.loads(line)["choices"][0]["accept_lengths"]]
        out[method] = sum(steps) / len(steps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for storage.json and storage.md")
    parser.add_argument("--limit", type=int, default=2, help="questions per subtask (default 2)")
    opts = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="weights-storage-") as tmp:
        def measure(name: str, storage: dict[str, str], methods: list[str]) -> dict:
            weights, cache = Path(tmp) / f"weights-{name}", Path(tmp) / f"cache-{name}"
            ship(storage, weights)
            manifest = json.loads((weights / "MANIFEST.json").read_text())
            results[name] = {"storage": storage, "bytes": manifest["bytes"], "heldout": heldout(weights, cache),
                             "accepted": acceptance(weights, cache, Path(tmp) / f"answers-{name}", opts.limit,
                                                    methods)}
            print(name, json.dumps(results[name]), flush=True)
            return results[name]

        f32 = measure("float32", dict.fromkeys(PARTS, "float32"), list(METHODS))
        b16 = measure("bfloat16", dict.fromkeys(PARTS, "bfloat16"), list(METHODS))
        rows, verdicts = [], {}

        def judge(part: str, what: str, a: float, b: float, label: str = "bfloat16") -> bool:
            rel = (b - a) / a if a else 0.0
            ok = abs(rel) <= TOLERANCE
            verdicts[part] = verdicts.get(part, True) and ok
            rows.append([part, what, label, f"{a:.4f}", f"{b:.4f}", f"{rel:+.2%}", "ok" if ok else "beyond 1%"])
            return ok

        for part, value in f32["heldout"].items():
            judge(part, "held-out " + ("accuracy" if part == "target" else "agreement with the target"), value,
                  b16["heldout"][part])
        failed = []
        for method in METHODS:
            if not judge(method, f"{method}: #mean accepted tokens", f32["accepted"][method],
                         b16["accepted"][method]):
                failed.append(method)
        verdicts = {part: ok for part, ok in verdicts.items() if part in PARTS}
        # The target is shared by every method: a method beyond 1% is first put on its own parts; only when
        # storing those in float32 (the target in bfloat16) does not bring it back is the target stored in float32.
        own = sorted({part for method in failed for part in METHODS[method]})
        for part in own:
            verdicts[part] = False
        storage = {part: "bfloat16" if verdicts.get(part, True) else "float32" for part in PARTS}
        if failed:
            mixed = measure("mixed", storage, failed)
            for method in failed:
                if not judge(method, f"{method}: #mean accepted tokens", f32["accepted"][method],
                             mixed["accepted"][method], "bfloat16, " + "+".join(own) + " float32"):
                    storage["target"] = "float32"
    measured = {"tolerance": TOLERANCE, "limit": opts.limit, **results, "storage": storage}
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "storage.json").write_text(json.dumps(measured, indent=2) + "\n")
    text = "\n".join([
        "# How the zoo's reference weights are stored (scripts/weights_storage.py)",
        "",
        f"Every part in float32 ({f32['bytes'] / 1e6:.1f} MB shipped) against every part in bfloat16 "
        f"({b16['bytes'] / 1e6:.1f} MB), both restored to float32 as a run restores them. A part is stored in "
        f"bfloat16 when every measure that depends on it stays within {TOLERANCE:.0%} of float32's: the held-out "
        "metrics of the zoo's quality card, and the #mean accepted tokens (greedy, budget=fixed) of every method "
        f"that uses it, on {opts.limit} synthetic questions per subtask. A method beyond {TOLERANCE:.0%} puts its "
        "own parts in float32 and is measured again with the target in bfloat16; only if it is still beyond, the "
        "target (which every method shares) is stored in float32 too.",
        "",
        markdown(["Part or method", "Measure", "Candidate", "float32", "Candidate's", "Change", "Verdict"], rows),
        "",
        "Storage: " + ", ".join(f"{part} {how}" for part, how in sorted(storage.items())),
    ])
    (opts.out / "storage.md").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
