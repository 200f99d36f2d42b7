"""The contention guard's own error, measured: what a background load does to a sequential table and
to a paired one, and how much of it the guard sees.

For each background load (a process that keeps one core busy for a given share of every 10 ms), one
job of the baseline and SpS in turn on the embedded default (the default schedule), with the load
running throughout. Printed per load: the baseline's tokens/s (what a sequential table's speedups rest
on), SpS's paired speedup (its time per token over the baseline's, question by question), the load the
guard measured (mean other processes' cores during the run) and whether it flagged the run.

    .venv/bin/python scripts/contention_error.py --loads 0,0.25,0.5,1.0 --out results/reference/contention.md
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specbench.analysis import paired  # noqa: E402
from specbench.core.table import markdown  # noqa: E402
from specbench.presentation import check  # noqa: E402


def burn(share: float, stop: multiprocessing.Event) -> None:
    """Keep one core busy `share` of every 10 ms until `stop` is set."""
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.01 * share:
            pass
        time.sleep(0.01 * (1 - share))


def job(out: Path, args: list[str]) -> None:
    command = check.job_command(["sps"], out, args)
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"job failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,0.25,0.5,1.0", help="background loads, in cores (comma-separated)")
    parser.add_argument("--out", type=Path, help="write the table (markdown) here")
    parser.add_argument("args", nargs="*", default=["task=all", "limit=2", "max_new_tokens=96", "warmup=1",
                                                    "progress=false", "budget=fixed"])
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="contention-") as tmp:
        for i, load in enumerate(float(x) for x in opts.loads.split(",")):
            stop = multiprocessing.Event()
            burners = [multiprocessing.Process(target=burn, args=(min(load - k, 1.0), stop))
                       for k in range(math.ceil(load))]
            for b in burners:
                b.start()
            out = Path(tmp) / f"load-{i}"
            try:
                job(out, opts.args)
            finally:
                stop.set()
                for b in burners:
                    b.join()
            runs = check.job_runs(out)
            base, sps = runs["baseline"], runs["sps-fixed" if "sps-fixed" in runs else "sps"]
            tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in base.records)
            seconds = sum(sum(r["choices"][0]["wall_time"]) for r in base.records)
            ratios = list(paired.log_ratios(sps, base).values())
            speedup = math.exp(-sum(ratios) / len(ratios))
            meta = json.loads(next(out.rglob("baseline/temp-0/run-1/meta.json")).read_text())
            seen = meta["contention"]
            rows.append([f"{load:g}", f"{tokens / seconds:.1f}", f"{speedup:.3f}",
                         f"{seen.get('busy_other_cores') or 0.0:.2f}", "yes" if seen["flagged"] else "no"])
            print(" | ".join(rows[-1]), flush=True)
    headers = ["Background load (cores)", "Baseline tok/s", "SpS paired speedup (geo. mean)",
               "Guard: other cores seen", "Flagged"]
    text = "\n".join(["# The contention guard's error (scripts/contention_error.py)", "",
                      f"One job per load, the baseline and SpS in turn ({' '.join(opts.args)}).", "",
                      markdown(headers, rows)])
    print("\n" + text)
    if opts.out:
        opts.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
