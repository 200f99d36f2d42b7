"""The verification-cost curve of a model: one forward's time against the rows it verifies at once.

    python scripts/cost_curve.py --model smollm2:target --dtypes float32,bfloat16 --out results/real/cost-curve

For each dtype, a cache of `--context` random tokens is filled, then a forward over 1, 2, 4, ...
64 new rows is timed and cropped back, every (dtype, rows) pair once per pass, in turn, so a
drift of the machine's speed hits all alike; the table gives the median of `--repeats` passes
(the first pass warms up) and each row count's cost as a multiple of one row, the number that
decides whether a tree of k nodes is worth verifying. Writes `<out>.md` and `<out>.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    import specbench.kit  # noqa: F401 - registers the kits' resolvers
    import specbench.zoo  # noqa: F401 - registers `zoo:`
    from specbench.core.hardware import device_name
    from specbench.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:target", help="model spec (folder, hub id, zoo:/kit: name)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=256, help="cached positions before the timed forward")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    dtypes = [d.strip() for d in opts.dtypes.split(",") if d.strip()]
    rows = [int(r) for r in opts.rows.split(",")]
    cpu = torch.device("cpu")
    models = {d: load_model(opts.model, device=cpu, dtype=getattr(torch, d)) for d in dtypes}
    vocab = int(next(iter(models.values())).model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (1, opts.context), generator=gen)
    blocks = {n: torch.randint(0, vocab, (1, n), generator=gen) for n in rows}
    caches = {}
    with torch.inference_mode():
        for d, m in models.items():
            caches[d] = m.new_cache()
            m.model(input_ids=context, cache=caches[d], use_cache=True, logits_to_keep=1)
        seen: dict[tuple[str, int], list[float]] = {(d, n): [] for d in dtypes for n in rows}
        for i in range(opts.repeats + 1):
            for d in dtypes:
                for n in rows:
                    t = time.perf_counter()
                    models[d].model(input_ids=blocks[n], cache=caches[d], use_cache=True)
                    if i:
                        seen[(d, n)].append(time.perf_counter() - t)
                    caches[d].crop(-n)
    ms = {d: {n: 1000 * statistics.median(seen[(d, n)]) for n in rows} for d in dtypes}
    head = "| rows verified | " + " | ".join(f"{d} ms | {d} x one row" for d in dtypes) + " |"
    lines = [f"Verification cost of `{opts.model}` on {device_name(cpu)}, {opts.threads} threads, "
             f"{opts.context} cached positions, median of {opts.repeats} passes "
             f"(`python scripts/cost_curve.py --model {opts.model} --dtypes {opts.dtypes}`)", "",
             head, "|" + "---|" * (1 + 2 * len(dtypes))]
    for n in rows:
        cells = " | ".join(f"{ms[d][n]:.1f} | {ms[d][n] / ms[d][rows[0]]:.2f}x" for d in dtypes)
        lines.append(f"| {n} | {cells} |")
    text = "\n".join(lines)
    print(text)
    if opts.out:
        out = Path(opts.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(
            {"model": opts.model, "device": device_name(cpu), "threads": opts.threads, "context": opts.context,
             "repeats": opts.repeats, "ms": {d: {str(n): round(v, 3) for n, v in ms[d].items()} for d in dtypes}},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
