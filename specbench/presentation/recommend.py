"""`python -m specbench recommend`: pick a method from measured leaderboard results.

Among the methods that fit the memory budget and the training constraint, recommend the best
overall speedup measured at the temperature nearest the one asked for, and say why with the
numbers. A method's memory is its measured peak (meta `memory`: the GPU allocator's peak, or the
process's peak resident set on CPU, over its run) where the answers recorded one, else an estimate
from parameter counts (target + extra weights in the run's dtype; KV caches not counted); the
table says which.
"""

from __future__ import annotations

import math
from pathlib import Path

from specbench.analysis import report
from specbench.core.args import ArgumentParser
from specbench.core.errors import SpecbenchError
from specbench.core.table import markdown

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _weights_gb(run: report.Run, extra: bool) -> float | None:
    meta = run.meta or {}
    params = meta.get("target_parameters")
    if params is None:
        return None
    if extra:
        params += meta.get("extra_parameters", 0)
    width = BYTES.get(meta.get("identity", {}).get("dtype", "float32"), 4)
    return params * width / 1e9


def _memory_gb(result: report.MethodResult, run: report.Run) -> tuple[float | None, str]:
    """(GB, where the figure comes from): the measured peak when recorded, else the weights estimate."""
    peak = (result.memory or {}).get("peak_bytes")
    if peak:
        return peak / 1e9, "measured peak"
    gb = _weights_gb(run, extra=True)
    return gb, "parameter estimate" if gb is not None else "unknown"


def recommend_main(args: list[str]) -> int:
    parser = ArgumentParser(prog="python -m specbench recommend", description=__doc__.splitlines()[0])
    parser.add_argument("--memory-gb", type=float, required=True,
                        help="memory available, in GB (against each method's measured peak memory, else the size "
                             "of its weights)")
    parser.add_argument("--training", choices=["yes", "no"], required=True,
                        help="whether methods that need trained drafters/heads are acceptable")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--results", default="results/answers", help="answer files to recommend from")
    opts = parser.parse_args(args)
    if not math.isfinite(opts.memory_gb) or opts.memory_gb <= 0:
        raise SpecbenchError(f"--memory-gb must be a positive number of GB, got {opts.memory_gb:g}")
    if not math.isfinite(opts.temperature) or opts.temperature < 0:
        raise SpecbenchError(f"--temperature must be a finite number >= 0, got {opts.temperature:g}")
    groups = [report.analyse(g) for g in report.group_runs(report.load_runs(Path(opts.results)))]
    groups = [g for g in groups if g.results and g.batch == 1]  # one sequence at a time, as it recommends
    if not groups:
        raise SpecbenchError(f"no measured results under {opts.results}; run `make leaderboard` first")
    chosen = min({g.temperature for g in groups}, key=lambda t: (abs(t - opts.temperature), t))
    rows, best = [], None
    for group in (g for g in groups if g.temperature == chosen):
        for result in group.results:
            run = group.methods[result.method][0]
            gb, source = _memory_gb(result, run)
            trained = bool(result.facts.get("training"))
            fits = gb is None or gb <= opts.memory_gb
            allowed = opts.training == "yes" or not trained
            speedup = result.rows["overall"]["speedup"]
            verdict = "ok" if fits and allowed else ("needs training" if not allowed else "too large")
            accepted = result.rows["overall"]["mean_accepted"]
            rows.append([group.model, result.method, f"{speedup:.2f}x", f"{accepted:.2f}",
                         "-" if gb is None else f"{gb:.2f}", source, "yes" if trained else "no", verdict])
            if verdict == "ok" and (best is None or speedup > best[0]):
                best = (speedup, group, result, gb, source)
    print(f"Measured at temperature {chosen:g} (nearest to {opts.temperature:g}):\n")
    headers = ["Model", "Method", "Overall speedup", "#Mean accepted", "Memory GB", "Memory from", "Training",
               "Verdict"]
    print(markdown(headers, rows))
    if best is None:
        print("\nNo measured method fits these constraints; plain autoregressive decoding (baseline) is the fallback.")
        return 1
    speedup, group, result, gb, source = best
    how = (result.memory or {}).get("measured_by") if source == "measured peak" else None
    memory = "unknown" if gb is None else f"{gb:.2f} GB ({source}{': ' + how if how else ''})"
    print(f"\nRecommendation: {result.method} on {group.model} ({group.dataset}): {speedup:.2f}x overall speedup, "
          f"{result.rows['overall']['mean_accepted']:.2f} mean accepted tokens per step, "
          f"memory {memory} within {opts.memory_gb:g} GB, "
          f"{'needs' if result.facts.get('training') else 'no'} training.")
    return 0
