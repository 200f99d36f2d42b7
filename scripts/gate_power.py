"""The regression gate's power, measured: how often `check --quick`'s test catches a slowed method,
and how often it fails unchanged code.

Each repeat runs the base's and the change's jobs on this machine in the order `check --quick` does
(check.job_order: the questions in check.yaml's quick.blocks shards, base and change in turn, who goes
first alternating), each with the gate's own run settings (check.yaml's quick.overrides) and the same lanes:
the baseline, SpS, and three copies of SpS that sleep `slowdown` x each step's own time
(tests/methods/slow_sps.py). In the base job every copy sleeps 0; in the change job they sleep
10%, 15% and 25%. The gate's test (`specbench.check.paired_verdicts`, with the false-alarm rate
divided among as many methods as the quick suite gates in CI) then judges each copy against its
base, and SpS against SpS for the false alarms. It prints a table and writes it as markdown.

    make gate-power                       # or:
    .venv/bin/python scripts/gate_power.py --repeats 10 --out results/reference/gate-power.md
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specbench.analysis import paired  # noqa: E402
from specbench.core.answers import FIXED_SUFFIX  # noqa: E402
from specbench.core.table import markdown  # noqa: E402
from specbench.presentation import check  # noqa: E402

LEVELS = {"slow10": 0.10, "slow15": 0.15, "slow25": 0.25}
METHOD = "sps"


def write_methods(folder: Path, slowdowns: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "methods" / "slow_sps.py", folder / "slow_sps.py")
    for name, slowdown in slowdowns.items():
        (folder / f"{name}.yaml").write_text(
            f"defaults: [{METHOD}, _self_]\nname: {name}\nimpl: slow_sps.SlowSpS\nslowdown: {slowdown}\nsuites: []\n",
            encoding="utf-8")


def job(methods_dir: Path, out: Path, overrides: list[str]) -> float:
    command = check.job_command([METHOD, *LEVELS], out, overrides)
    env = {"SPECBENCH_METHODS_DIR": str(methods_dir), "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def strip_labels(runs: dict) -> dict:
    """Runs by method name (budget=fixed files them as <name>-fixed)."""
    return {name.removesuffix(FIXED_SUFFIX): run for name, run in runs.items()}


def injected(change: dict) -> dict[str, float]:
    """The slowdown each copy actually had in the change job: its time per token over SpS's, paired
    per unit within that job (trimmed mean of the log ratios)."""
    out = {}
    for name in LEVELS:
        ratios = paired.log_ratios(change[name], change[METHOD])
        out[name] = math.expm1(float(paired.trimmed_mean(np.array(list(ratios.values())))))
    return out


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def exact_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a rate seen k times in n (bisection on the binomial tail)."""
    tail = (1 - level) / 2

    def solve(f, lo: float = 0.0, hi: float = 1.0) -> float:
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: 1 - binomial_cdf(k - 1, n, p) < tail)
    high = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p) > tail)
    return low, high


def rate(k: int, n: int) -> str:
    low, high = exact_interval(k, n)
    return f"{k / n:.0%} [{low:.0%}, {high:.0%}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="gate runs per level (default 10)")
    parser.add_argument("--out", type=Path, help="write the table (markdown) here")
    parser.add_argument("--keep", type=Path, help="keep every job's answers under this folder")
    parser.add_argument("overrides", nargs="*", help="check.yaml overrides, e.g. quick.gate.min_slowdown=0.1")
    opts = parser.parse_args()
    cfg = check.load_check_config(opts.overrides)
    gated = len(check.quick_methods(cfg))  # CI divides the false-alarm rate among this many methods
    overrides = list(cfg.quick.overrides)
    names = {METHOD: METHOD, **{name: name for name in LEVELS}}
    caught = {name: 0 for name in names}
    shifts: dict[str, list[float]] = {name: [] for name in names}
    actual: dict[str, list[float]] = {name: [] for name in LEVELS}
    spreads, seconds = [], []
    with tempfile.TemporaryDirectory(prefix="gate-power-") as tmp:
        work = opts.keep.absolute() if opts.keep else Path(tmp)
        write_methods(work / "base-methods", {name: 0.0 for name in LEVELS})
        write_methods(work / "change-methods", LEVELS)
        for rep in range(1, opts.repeats + 1):
            base_out, change_out = work / f"base-{rep}", work / f"change-{rep}"
            took = 0.0
            for side, block, blocks in check.job_order(int(cfg.quick.blocks)):  # as the gate orders its jobs
                extra = [f"shard={block}/{blocks}"] if blocks > 1 else []
                took += job(work / f"{side}-methods", base_out if side == "base" else change_out, [*overrides, *extra])
            seconds.append(took)
            base, change = (strip_labels(check.job_runs(out)) for out in (base_out, change_out))
            rows, _ = check.paired_verdicts(base, change, cfg.quick.gate, names, methods_gated=gated)
            for row in rows:
                name, verdict = row[0], row[-1]
                caught[name] += verdict.startswith("REGRESSED")
                shifts[name].append(float(row[2].rstrip("%")) / 100)
                spreads.append(float(row[5]))
            for name, value in injected(change).items():
                actual[name].append(value)
            print(f"repeat {rep}/{opts.repeats} ({took:.0f} s): " + ", ".join(
                f"{r[0]} {r[2]} {r[-1]}" for r in rows), flush=True)
    n = opts.repeats
    table = [["none (unchanged code)", "-", f"{statistics.median(shifts[METHOD]):+.1%}", f"{caught[METHOD]}/{n}",
              f"false alarms {rate(caught[METHOD], n)}"]]
    for name, level in LEVELS.items():
        table.append([f"{level:.0%}", f"{statistics.median(actual[name]):+.1%}",
                      f"{statistics.median(shifts[name]):+.1%}", f"{caught[name]}/{n}",
                      f"detected {rate(caught[name], n)}"])
    headers = ["Injected slowdown", "Measured in the change job (median)", "Gate's estimate (median)", "Flagged",
               "Rate [95% exact interval]"]
    blocks = int(cfg.quick.blocks)
    jobs = "two jobs (base, then change)" if blocks < 2 else (
        f"{2 * blocks} jobs (the questions in {blocks} shards, base and change in turn, who goes first alternating)")
    text = "\n".join([
        "# The regression gate's power (scripts/gate_power.py)",
        "",
        f"{n} gate runs per level on this machine, each {jobs} with the gate's run settings "
        f"({' '.join(overrides)}); the test as `check --quick` applies it: one-sided sign-flip test on the "
        f"trimmed mean of the per-(question, turn) log ratio shift, alpha {cfg.quick.gate.alpha:g} divided among "
        f"{gated} gated methods, and a slowdown of at least {cfg.quick.gate.min_slowdown:.0%}.",
        "",
        markdown(headers, table),
        "",
        f"Per-unit spread of the paired log ratio between two jobs, sd(d): median {statistics.median(spreads):.3f}. "
        f"The jobs of one gate run took {statistics.median(seconds) / 60:.1f} min together (median), 5 lanes each; "
        "the CI gate's jobs have the quick suite's lanes.",
    ])
    print("\n" + text)
    if opts.out:
        opts.out.write_text(text + "\n", encoding="utf-8")
        print(f"\nwrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
