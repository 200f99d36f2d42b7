"""Analysing a group of runs: speedups with their noise (from the tidy frame), then the audits.

Loading and grouping answer files live in `runs`, every metric formula in `frame` and `audit`;
writing tables and figures is left to `presentation`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbench.analysis import audit
from specbench.analysis.frame import SEQUENCE, bootstrap_ratio_ci, per_question, speedups, tidy, timing_units
from specbench.analysis.runs import (
    BASELINE,
    Group,
    Run,
    group_runs,
    load_runs,
    method_facts,
    method_heads,
    method_memory,
    run_contention,
)
from specbench.core.answers import FIXED_SUFFIX

__all__ = ["BASELINE", "Group", "MethodResult", "Run", "analyse", "budget_pairs", "group_runs", "load_runs"]

FIXED = FIXED_SUFFIX  # the runner files a method run with `method.budget=fixed` as <name>-fixed


@dataclass
class MethodResult:
    """A method's numbers in one (dataset, model, temperature) group."""

    method: str
    runs: int
    rows: dict[str, dict[str, float]]  # subtask (and "overall") -> metric (frame.METRICS) -> value
    accept_hist: Counter = field(default_factory=Counter)
    depth_acceptance: list[float] | None = None
    time_split: dict[str, float] | None = None
    audit: dict[str, Any] | None = None
    audit_skipped: str = "n/a (sampled)"  # what the audit cell says where no audit ran (not the baseline)
    facts: dict[str, Any] = field(default_factory=dict)
    contended: list[dict[str, Any]] = field(default_factory=list)  # runs.run_contention of its flagged runs
    unverified: list[int] = field(default_factory=list)  # its runs without a meta.json (runs.check_identities)
    memory: dict[str, Any] | None = None  # runs.method_memory: measured peak and drafter weights
    heads: list[str] = field(default_factory=list)  # runs.method_heads: the published heads it loaded
    stream: dict[str, Any] | None = None  # audit.stream_acceptance: acceptance across the question stream
    steps: dict[str, float | None] = field(default_factory=dict)  # audit.step_costs: nodes, draft, verify per step

    @property
    def efficiency(self) -> float | None:
        """Overall speedup / overall mean accepted tokens: the share measured of the speedup a free
        drafter with one-step verification would reach. None for the baseline or where either is missing."""
        overall = self.rows.get("overall", {})
        speedup, accepted = overall.get("speedup", math.nan), overall.get("mean_accepted", math.nan)
        if self.method == BASELINE or math.isnan(speedup) or math.isnan(accepted) or not accepted:
            return None
        return speedup / accepted


def metric_rows(table: pd.DataFrame, method: str) -> dict[str, dict[str, float]]:
    """A method's rows of `frame.speedups` as plain Python numbers, by subtask."""
    counts = ("questions", "runs")
    return {subtask: {k: int(v) if k in counts else float(v) for k, v in row.items()}
            for subtask, row in table.loc[method].iterrows()}


def _screen(group: Group) -> bool:
    """Leave failed questions out for every method alike; refuse mixed models. Notes problems."""
    failed = {qid for runs in group.methods.values() for run in runs for qid in run.failed}
    for runs in group.methods.values():
        for run in runs:
            group.problems += run.problems
            group.problems += [f"{run.source}: question {q} failed: {why}" for q, why in sorted(run.failed.items())]
            run.records = [r for r in run.records if r["question_id"] not in failed]
    if failed:
        group.problems.append(f"{group.title}: {len(failed)} failed question(s) excluded from every method's numbers")
    kept = {name: [run for run in runs if not run.skipped] for name, runs in group.methods.items()}
    group.methods = {name: runs for name, runs in kept.items() if runs}
    if not group.methods:
        return False  # every file of the group was unreadable: named above, nothing to report
    models = {str((run.meta.get("identity") or {}).get("model")) for runs in group.methods.values() for run in runs
              if run.meta and (run.meta.get("identity") or {}).get("model") is not None}
    if len(models) > 1:
        group.problems.append(f"{group.title}: answers of different models ({', '.join(sorted(models))}) are mixed "
                              "in one folder; keep each model's answers in its own folder. Not reported.")
        return False
    for runs in group.methods.values():
        for run in runs:
            if len(ids := {r.get("model_id") for r in run.records}) > 1:
                group.problems.append(f"{run.source}: one answer file holds several model_ids {sorted(map(str, ids))}")
    return True


def analyse(group: Group, *, tie_margin: float = 0.05, upstream_tokenizer: Any = None) -> Group:
    """Fill `group.frame`, `group.speedups`, `group.results` (best overall speedup first) and
    `group.problems`. Questions that failed for any method are left out for every method alike."""
    if not _screen(group):
        return group
    base_runs = [run for run in group.methods.get(BASELINE, []) if run.records]
    if not base_runs:
        group.problems.append(
            f"{group.title}: no baseline answers, so no speedups; run `python -m specbench run method=baseline` "
            f"with the same model, dataset and temperature"
        )
        return group
    group.frame = tidy((run for runs in group.methods.values() for run in runs), upstream_tokenizer=upstream_tokenizer)
    group.speedups = speedups(group.frame)
    if (zero := group.speedups[group.speedups["baseline_tokens_per_s"] == 0]).size:
        subtasks = sorted(set(zero.index.get_level_values("subtask")))
        group.problems.append(f"{group.title}: the baseline generated no tokens on {', '.join(subtasks)}, "
                              "so no speedup there")
    measured = set(group.speedups.index.get_level_values("method"))
    costs = audit.step_costs(group.frame)
    reference = base_runs if group.batch == 1 else [r for r in group.reference or [] if r.records]
    for name, runs in group.methods.items():
        if name not in measured:
            group.problems.append(f"{group.title}: {name} answered no question the baseline answered; not reported")
            continue
        result = MethodResult(name, len(runs), metric_rows(group.speedups, name))
        result.accept_hist = audit.accept_histogram(runs)
        result.depth_acceptance = audit.depth_acceptance(runs)
        result.time_split = audit.time_split(group.frame[group.frame["method"] == name])
        result.facts = method_facts(runs)
        result.contended = [c for run in runs if (c := run_contention(run))]
        result.unverified = [run.run for run in runs if run.unverified]
        result.memory = method_memory(runs)
        result.heads = method_heads(runs)
        result.steps = costs.get(name, {})
        twin = str(result.facts.get("static_twin") or "")
        result.stream = audit.stream_acceptance(runs, twin=group.methods.get(twin) if twin else None)
        if group.temperature == 0 and (name != BASELINE or group.batch > 1) and reference:
            result.audit = audit.lossless_audit(runs, reference, tie_margin)
        elif group.temperature == 0:
            result.audit_skipped = "n/a (no batch-1 baseline)" if group.batch > 1 else "n/a (no baseline)"
        group.results.append(result)
    group.results.sort(key=lambda r: -r.rows["overall"]["speedup"])
    if group.batch > 1 and group.temperature == 0 and not reference:
        group.problems.append(f"{group.title}: no batch-1 baseline answers, so the batched answers are not audited "
                              "against it; run `python -m specbench run method=baseline batch_size=1` with the same "
                              "model, dataset and output_dir")
    if note := contention_note(group):
        group.notes.append(f"{group.title}: {note}")
    if note := weights_note(group):
        group.notes.append(f"{group.title}: {note}")
    return group


@dataclass
class BudgetPair:
    """A method run with both draft budgets in one group: `auto` (X) and `fixed` (X-fixed), and
    auto's tokens/s over fixed's on the questions both answered (mean per-question tokens/s, runs
    averaged), with its 95% paired bootstrap interval over those questions (a batch's resampled whole)."""

    auto: MethodResult
    fixed: MethodResult
    ratio: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """"yes" (auto at least as fast), "within noise" (slower, but the interval reaches 1), "NO"."""
        if self.ratio >= 1:
            return "yes"
        return "within noise" if self.high >= 1 else "NO"


def budget_pairs(group: Group) -> list[BudgetPair]:
    """The group's methods run with both draft budgets (X and X-fixed), in the group's order."""
    by_name = {r.method: r for r in group.results}
    if group.frame is None:
        return []
    by_question = per_question(group.frame).groupby(["method", "question_id"])
    tps, unit = by_question["tokens_per_s"].mean(), by_question[SEQUENCE].first()
    pairs = []
    for r in group.results:
        if (fixed := by_name.get(r.method + FIXED)) is None:
            continue
        both = pd.concat([tps.loc[r.method], tps.loc[fixed.method], unit.loc[r.method]], axis=1, join="inner")
        values = both.iloc[:, :2].to_numpy()
        ratio = float(values[:, 0].mean() / values[:, 1].mean()) if len(values) else math.nan
        units = timing_units(both.iloc[:, 2], both.index)  # a batch's answers: one unit
        low, high = bootstrap_ratio_ci(values[:, 0], values[:, 1], clusters=units)
        pairs.append(BudgetPair(r, fixed, ratio, low, high))
    return pairs


def contention_note(group: Group) -> str | None:
    """Which runs were measured while other processes loaded the machine, and how much; None when
    none was."""
    flagged = [(r.method, c) for r in group.results for c in r.contended]
    if not flagged:
        return None
    cores = [c["other_cores"] for _, c in flagged if c["other_cores"] is not None]
    threshold = next((c["threshold"] for _, c in flagged if c["threshold"] is not None), None)
    load = f"other processes used up to {max(cores):.2f} CPU cores" if cores else "other processes held the GPU"
    runs = ", ".join(f"{method} run {c['run']}" for method, c in flagged)
    base = " (a contended baseline skews every speedup)" if any(m == BASELINE for m, _ in flagged) else ""
    limit = f", threshold {threshold:g}" if threshold is not None else ""
    return (f"measured under contention ({load}{limit}): {runs}{base}; "
            "run them again on a quiet machine (overwrite=true) for clean timings")


def weights_note(group: Group) -> str | None:
    """Whose weights the runs used, when it matters: trained on this machine (local), or more than one
    set of weights in one table; None when every run used the same shipped or published weights (or
    the runs do not say: real models, older files)."""
    seen: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for name, runs in sorted(group.methods.items()):
        for run in runs:
            for meta in run.part_metas or [run.meta or {}]:
                origin = (meta or {}).get("weights_origin")
                if isinstance(origin, dict) and origin.get("fingerprint"):
                    seen.setdefault(str(origin["fingerprint"]), []).append(name)
                    sources[str(origin["fingerprint"])] = str(origin.get("source"))
    if len(seen) > 1:
        return ("runs of different weights in one table: " + "; ".join(
            f"{sources[fp]} {fp} ({', '.join(sorted(set(names)))})" for fp, names in sorted(seen.items()))
            + "; their acceptance is not comparable: run them again on one set of weights")
    for fp, source in sources.items():  # one set of weights at most here
        if source not in ("shipped", "published"):
            return (f"weights trained on this machine ({source}, fingerprint {fp}), not the shipped reference "
                    "weights: acceptance is not comparable with the committed tables")
    return None


def schedule_note(group: Group) -> str | None:
    """How the speeds were timed: paired (each method in turn with the baseline, question by question,
    in one job: its meta's `phase`) or not (timed apart: a drift of the machine between jobs moves the
    speedup); None for upstream files, which do not say."""
    paired, apart = [], []
    for r in group.results:
        if r.method == BASELINE:
            continue
        phases = [m.get("phase") for run in group.methods.get(r.method, []) for m in run.part_metas]
        if not any(isinstance(p, dict) for p in phases):
            continue  # not recorded (upstream files, or answers older than the schedules)
        together = all(isinstance(p, dict) and BASELINE in (p.get("lanes") or []) for p in phases)
        (paired if together else apart).append(r.method)
    if not paired and not apart:
        return None
    if not apart:
        return (f"Speedups are paired: the baseline and the {len(paired)} method(s) answered every question in turn "
                "in one job (schedule: interleaved), so a drift of the machine's speed falls on all of them alike.")
    note = (f"Not paired: {', '.join(apart)} timed apart from the baseline (schedule: sequential, or the baseline's "
            "answers were already there): their speedups carry any drift of the machine between the jobs")
    return note + (f"; {', '.join(paired)} paired with it in one job." if paired else ".")
