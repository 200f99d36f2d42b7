"""Time a target's step of 1..16 rows over a cached context with PyTorch's linear and with RowsFirstLinear
(specbench.models), side by side in one process (the two kernels alternate, row count by row count), and
print the table docs/running.md gives ("Small steps on a CPU").

    .venv/bin/python scripts/linear_kernel.py                 # SmolLM2 (fetched once by `kit fetch smollm2`)
    .venv/bin/python scripts/linear_kernel.py zoo:target      # the zoo's target
    .venv/bin/python scripts/linear_kernel.py PATH --context 1000 --repeats 25
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.engine.target import TargetScorer, keep_rows
from specbench.engine.tree import DraftTree
from specbench.models import RowsFirstLinear, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2:target")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,3,4,5,8,16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=torch.device("cpu"), dtype=torch.float32)
    model = loaded.model
    fast = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # small models too: the rule's gain
    scorer = TargetScorer(model, torch.device("cpu"), torch.float32)
    cache = loaded.new_cache()
    with torch.inference_mode():  # the context: random tokens, prefilled once
        model(input_ids=torch.randint(100, 2000, (1, args.context)), cache=cache, use_cache=True)

    def step(rows: int) -> float:
        tree = DraftTree.chain(torch.arange(5, 4 + rows)) if rows > 1 else DraftTree.empty()
        start = time.perf_counter()
        scorer.score(cache, args.context, 42, tree, False)
        took = time.perf_counter() - start
        keep_rows(cache, args.context, tree.rows, [0])
        cache.crop(-1)
        return took

    rows = [int(r) for r in args.rows.split(",")]
    times: dict[str, dict[int, list[float]]] = {"torch": {r: [] for r in rows}, "rows-first": {r: [] for r in rows}}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for r in rows:
                for kernel in ("torch", "rows-first"):
                    for m in fast:
                        m.__class__ = torch.nn.Linear if kernel == "torch" else RowsFirstLinear
                    times[kernel][r].append(step(r))
    print(f"{args.model}: one step of n rows over {args.context} cached positions, {args.threads} threads, "
          f"median of {args.repeats} (ms)")
    print("| Linear | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for kernel, found in times.items():
        print(f"| {kernel} | " + " | ".join(f"{statistics.median(found[r]) * 1e3:.1f}" for r in rows) + " |")


if __name__ == "__main__":
    main()
