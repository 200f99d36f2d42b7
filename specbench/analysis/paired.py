"""Paired speed: a method's time per token over the baseline's on the same question and turn.

In one job the baseline and the methods answer each question in turn (`interleave=[...]`), so a
question's ratio r = (method seconds / method tokens) / (baseline seconds / baseline tokens) is
measured within seconds, under the same machine state; a drift of the machine's speed between
questions or jobs cancels in r. Under greedy decoding both emit the same tokens and r is the plain
time ratio.

A regression gate compares two such jobs (the base commit's and the change's, on the same machine)
unit by unit: d = log r_change - log r_base for each (question, turn) both answered. A real
slowdown of the method by a factor s shifts every d by log s; noise does not move their centre.
The test is a one-sided sign-flip (randomisation) test on the trimmed mean of d: exact under the
null that each d is symmetric about 0, with no normality assumed, and robust to the odd question
that a hiccup of the machine hit on one side only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specbench.analysis.runs import Run

Unit = tuple[int, int]  # (question_id, turn)

#: share of units cut from each end before averaging (robust to single hiccups)
TRIM = 0.1
FLIPS = 20000


def unit_costs(run: Run) -> dict[Unit, float]:
    """Seconds per new token of each (question, turn) of a run (turns without tokens left out)."""
    costs = {}
    for record in run.records:
        choice = record["choices"][0]
        for turn, (seconds, tokens) in enumerate(zip(choice["wall_time"], choice["new_tokens"], strict=False)):
            if tokens and seconds > 0:
                costs[(int(record["question_id"]), turn)] = float(seconds) / float(tokens)
    return costs


def log_ratios(method: Run, baseline: Run) -> dict[Unit, float]:
    """log(method's time per token / the baseline's) for each unit both answered."""
    ours, base = unit_costs(method), unit_costs(baseline)
    return {u: math.log(ours[u] / base[u]) for u in sorted(ours.keys() & base.keys())}


def log_costs(run: Run) -> dict[Unit, float]:
    """log(seconds per new token) of each unit: a lane's own time, compared between two jobs (not paired
    in time: what the machine's drift between the jobs does to it stays in)."""
    return {u: math.log(c) for u, c in unit_costs(run).items()}


def trimmed_mean(values: np.ndarray, trim: float = TRIM, axis: int = -1) -> np.ndarray:
    """Mean after cutting `trim` of the values from each end (along `axis`)."""
    n = values.shape[axis]
    cut = int(math.floor(trim * n))
    ordered = np.sort(values, axis=axis)
    kept = np.take(ordered, np.arange(cut, n - cut), axis=axis)
    return kept.mean(axis=axis)


@dataclass
class Shift:
    """How much slower a method is in the change than in the base, relative to its own baseline."""

    units: int
    slowdown: float  # exp(trimmed mean of d) - 1: +0.15 = 15% more time per token than in the base
    low: float  # 95% interval of the slowdown (bootstrap over units)
    high: float
    p_value: float  # one-sided: the chance of a shift at least this large under no change
    spread: float  # standard deviation of d: the per-unit noise of a paired ratio between two jobs


def paired_shift(base: dict[Unit, float], change: dict[Unit, float], seed: int = 0,
                 trim: float = TRIM, flips: int = FLIPS) -> Shift | None:
    """The shift of the change's log ratios over the base's on the units both have; None below 3 units."""
    units = sorted(base.keys() & change.keys())
    if len(units) < 3:
        return None
    d = np.array([change[u] - base[u] for u in units])
    observed = float(trimmed_mean(d, trim))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(flips, len(d)))
    null = trimmed_mean(signs * np.abs(d)[None, :], trim, axis=1)
    p_value = float((1 + np.count_nonzero(null >= observed - 1e-12)) / (flips + 1))
    boots = trimmed_mean(d[rng.integers(0, len(d), size=(2000, len(d)))], trim, axis=1)
    low, high = np.percentile(boots, [2.5, 97.5])
    return Shift(len(d), math.expm1(observed), math.expm1(float(low)), math.expm1(float(high)), p_value,
                 float(d.std(ddof=1)))


def is_regression(shift: Shift, alpha: float, min_slowdown: float) -> bool:
    """A slowdown both significant at `alpha` (already divided among the methods gated) and at
    least `min_slowdown` large (a shift too small to matter is not failed, however sure)."""
    return shift.p_value < alpha and shift.slowdown >= min_slowdown
