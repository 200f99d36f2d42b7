"""Time a target's verification step of 1..8 rows over caches of several lengths with transformers' SDPA and
with `packed_sdpa` (specbench.models), side by side in one process (the two alternate, row count by row count),
and print the table docs/running.md gives ("Long contexts on a CPU").

    .venv/bin/python scripts/packed_attention.py                     # SmolLM2 (fetched once by `kit fetch smollm2`)
    .venv/bin/python scripts/packed_attention.py PATH --contexts 512,4096 --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.engine.target import TargetScorer, keep_rows
from specbench.engine.tree import DraftTree
from specbench.models import PACKED_SDPA, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2:target")
    parser.add_argument("--contexts", default="512,2048,4096,7168")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,3,4,8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=torch.device("cpu"), dtype=torch.float32)
    model = loaded.model
    if model.config._attn_implementation != PACKED_SDPA:
        raise SystemExit(f"{args.model}: packed attention does not apply (attention "
                         f"{model.config._attn_implementation!r}: it needs SDPA with grouped-query heads on a CPU)")
    scorer = TargetScorer(model, torch.device("cpu"), torch.float32)
    rows = [int(r) for r in args.rows.split(",")]
    kinds = ("sdpa", PACKED_SDPA)
    print(f"{args.model}: one verification step (a chain of n rows, the tree mask) over C cached positions, "
          f"{args.threads} threads, median of {args.repeats} (ms)")
    print("| Context | Attention | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---" * (len(rows) + 2) + "|")
    for context in (int(c) for c in args.contexts.split(",")):
        cache = loaded.new_cache()
        times: dict[str, dict[int, list[float]]] = {k: {r: [] for r in rows} for k in kinds}
        with torch.inference_mode():
            model(input_ids=torch.randint(100, 2000, (1, context)), cache=cache, use_cache=True, logits_to_keep=1)
            for repeat in range(args.repeats + 1):  # the first pass warms up
                for r in rows:
                    for kind in kinds:
                        model.config._attn_implementation = kind
                        tree = DraftTree.chain(torch.arange(5, 4 + r)) if r > 1 else DraftTree.empty()
                        start = time.perf_counter()
                        scorer.score(cache, context, 42, tree, True)
                        took = time.perf_counter() - start
                        keep_rows(cache, context, tree.rows, [0])
                        cache.crop(-1)
                        if repeat:
                            times[kind][r].append(took)
        model.config._attn_implementation = PACKED_SDPA
        for kind in kinds:
            print(f"| {context} | {kind} | " + " | ".join(f"{statistics.median(times[kind][r]) * 1e3:.1f}"
                                                         for r in rows) + " |", flush=True)


if __name__ == "__main__":
    main()
