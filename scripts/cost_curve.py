"""The verification-cost curve of a model: one forward's time against the rows it verifies at once.

    python scripts/cost_curve.py --model smollm2:target --dtypes float32,bfloat16 --out results/real/cost-curve
    python scripts/cost_curve.py --dtypes float32 --batch 8 --context 512 --rows 1,2,4 --unmasked

For each dtype, a cache of `--context` random tokens is filled, then a forward over 1, 2, 4, ...
64 new rows is timed and cropped back, every (dtype, rows) pair once per pass, in turn, so a
drift of the machine's speed hits all alike; the table gives the median of `--repeats` passes
(the first pass warms up) and each row count's cost as a multiple of one row, the number that
decides whether a tree of k nodes is worth verifying. Writes `<out>.md` and `<out>.json`.

`--batch B`: B batch rows at once, each forward with the 4D mask and positions a batched step passes
(`specbench.engine.budget.curve_inputs`, what the budget's curves are timed with); `--unmasked` times the
same forwards without them too, in turn (a masked and an unmasked step can take different attention paths).
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
    from specbench.engine.budget import curve_inputs
    from specbench.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:target", help="model spec (folder, hub id, zoo:/kit: name)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=256, help="cached positions before the timed forward")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="batch rows of every forward (> 1: the batch's mask)")
    parser.add_argument("--unmasked", action="store_true", help="with --batch: time each forward without the mask too")
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    dtypes = [d.strip() for d in opts.dtypes.split(",") if d.strip()]
    rows = [int(r) for r in opts.rows.split(",")]
    if opts.batch < 1 or (opts.unmasked and opts.batch == 1):
        parser.error("--batch must be >= 1, and --unmasked needs --batch above 1 (one row passes no mask)")
    cpu = torch.device("cpu")
    kinds = [d if opts.batch == 1 else f"{d} masked" for d in dtypes] + (
        [f"{d} unmasked" for d in dtypes] if opts.unmasked else [])
    models = {d: load_model(opts.model, device=cpu, dtype=getattr(torch, d)) for d in dtypes}
    vocab = int(next(iter(models.values())).model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (opts.batch, opts.context), generator=gen)
    blocks = {n: torch.randint(0, vocab, (opts.batch, n), generator=gen) for n in rows}
    caches = {}
    with torch.inference_mode():
        for d, m in models.items():
            caches[d] = m.new_cache()
            m.model(input_ids=context, cache=caches[d], use_cache=True, logits_to_keep=1)
        extras = {(k, n): curve_inputs(opts.batch, n, opts.context, cpu, models[k.split()[0]].dtype)
                  if not k.endswith("unmasked") else {} for k in kinds for n in rows}
        seen: dict[tuple[str, int], list[float]] = {(k, n): [] for k in kinds for n in rows}
        for i in range(opts.repeats + 1):
            for k in kinds:
                d = k.split()[0]
                for n in rows:
                    t = time.perf_counter()
                    models[d].model(input_ids=blocks[n], cache=caches[d], use_cache=True, **extras[(k, n)])
                    if i:
                        seen[(k, n)].append(time.perf_counter() - t)
                    caches[d].crop(-n)
    ms = {k: {n: 1000 * statistics.median(seen[(k, n)]) for n in rows} for k in kinds}
    head = "| rows verified | " + " | ".join(f"{k} ms | {k} x one row" for k in kinds) + " |"
    flags = f" --batch {opts.batch}" + (" --unmasked" if opts.unmasked else "") if opts.batch > 1 else ""
    lines = [f"Verification cost of `{opts.model}` on {device_name(cpu)}, {opts.threads} threads, "
             f"{opts.batch} batch row{'s' if opts.batch > 1 else ''} over {opts.context} cached positions each, "
             f"median of {opts.repeats} passes (`python scripts/cost_curve.py --model {opts.model} --dtypes "
             f"{opts.dtypes} --context {opts.context} --rows {opts.rows}{flags}`)", "",
             head, "|" + "---|" * (1 + 2 * len(kinds))]
    for n in rows:
        cells = " | ".join(f"{ms[k][n]:.1f} | {ms[k][n] / ms[k][rows[0]]:.2f}x" for k in kinds)
        lines.append(f"| {n} | {cells} |")
    text = "\n".join(lines)
    print(text)
    if opts.out:
        out = Path(opts.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(
            {"model": opts.model, "device": device_name(cpu), "threads": opts.threads, "context": opts.context,
             "batch": opts.batch, "repeats": opts.repeats,
             "ms": {k: {str(n): round(v, 3) for n, v in ms[k].items()} for k in kinds}},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
