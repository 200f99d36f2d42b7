"""Looking inside a method's answers: lossless audit, acceptance by length and depth, time split,
cost of a step."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from specbench.analysis.frame import SECTION, measured_rows
from specbench.analysis.runs import BASELINE, Run
from specbench.core.answers import EXTRA_KEY
from specbench.core.record import turn_stats

#: `report --recheck` verdicts on a greedy mismatch (see analysis.recheck); "not rechecked: <why>" otherwise
NUMERICAL, BASELINE_OFF, BUG = "numerical", "baseline off", "bug"
RECHECK_VERDICTS = (NUMERICAL, BASELINE_OFF, BUG)


def accept_histogram(runs: list[Run]) -> Counter:
    """Decoding steps by the number of tokens they emitted (bonus included)."""
    return Counter(a for run in runs for r in run.records for a in r["choices"][0].get("accept_lengths", []))


def depth_acceptance(runs: list[Run]) -> list[float] | None:
    """Per-depth acceptance: of the steps whose draft reached depth d, the share that
    accepted a token at depth d (from the engine's `position_drafted` / `position_accepted`)."""
    drafted: Counter = Counter()
    accepted: Counter = Counter()
    for run in runs:
        for r in run.records:
            for stats in turn_stats(r):
                for d, (n, a) in enumerate(zip(stats.position_drafted or [], stats.position_accepted or [])):
                    drafted[d] += n
                    accepted[d] += a
    if not drafted:
        return None
    return [accepted[d] / drafted[d] if drafted[d] else 0.0 for d in range(max(drafted) + 1)]


#: how many consecutive parts `stream_acceptance` cuts a run's question stream into
STREAM_PARTS = 5


def stream_acceptance(
    runs: list[Run], parts: int = STREAM_PARTS, twin: list[Run] | None = None
) -> dict[str, Any] | None:
    """Mean accepted tokens per step in each of `parts` consecutive parts of the question stream
    (the answers in the order they were made, by `tstamp`; pooled over runs), and the draft
    updates of methods that learn online (`online_updates` / `online_update_seconds` per turn).
    With `twin` (the runs of a static method to compare with, e.g. the same draft without
    updates) also `twin_accepted`: the twin's mean accepted tokens on the same questions as each
    part (pooled over the twin's runs), so that what the questions do is told apart from what the
    learning does. None when no run has `parts` answers."""
    emitted, steps = [0] * parts, [0] * parts
    ids: list[set[int]] = [set() for _ in range(parts)]
    updates, seconds = 0, 0.0
    for run in runs:
        records = sorted(run.records, key=lambda r: r.get("tstamp") or 0.0)
        if len(records) < parts:
            continue
        for i, r in enumerate(records):
            lengths = r["choices"][0].get("accept_lengths", [])
            part = i * parts // len(records)
            emitted[part] += sum(lengths)
            steps[part] += len(lengths)
            ids[part].add(r["question_id"])
            for stats in turn_stats(r):
                updates += int(stats.counters.get("online_updates", 0) or 0)
                seconds += float(stats.counters.get("online_update_seconds", 0.0) or 0.0)
    if not any(steps):
        return None
    out: dict[str, Any] = {"mean_accepted": [e / s if s else None for e, s in zip(emitted, steps)],
                           "online_updates": updates, "online_update_seconds": seconds}
    if twin:
        totals: dict[int, list[int]] = {}  # question id -> [tokens emitted, steps], pooled over the twin's runs
        for run in twin:
            for r in run.records:
                lengths = r["choices"][0].get("accept_lengths", [])
                total = totals.setdefault(r["question_id"], [0, 0])
                total[0] += sum(lengths)
                total[1] += len(lengths)
        pooled = [[sum(totals[q][k] for q in wanted if q in totals) for k in (0, 1)] for wanted in ids]
        out["twin_accepted"] = [e / s if s else None for e, s in pooled]
    return out


def time_split(rows: pd.DataFrame) -> dict[str, float] | None:
    """Shares of wall time in tidy-frame rows: prefill, each timed section (draft, verify, ...),
    and the rest (bookkeeping). None when no section was timed."""
    sections = sorted(c for c in rows.columns if c.startswith(SECTION) and rows[c].notna().any())
    total = rows["wall_time"].sum()
    if not total or not sections:
        return None
    split = {"prefill": rows["prefill_time"].sum() / total}
    split.update({c.removeprefix(SECTION): rows[c].sum() / total for c in sections})
    split = {k: float(v) for k, v in split.items()}
    split["other"] = max(0.0, 1.0 - sum(split.values()))
    return split


def step_costs(frame: pd.DataFrame, baseline: str = BASELINE) -> dict[str, dict[str, float | None]]:
    """Per method, over the questions its speedup uses (`frame.measured_rows`): `nodes_per_step`
    (draft nodes verified per decoding step), `draft_per_step` and `verify_per_step` (its drafting
    and verification seconds per step, in baseline decode steps: the baseline's (wall time - prefill)
    / steps in the same frame). None where not recorded."""
    rows = measured_rows(frame, baseline)
    base = rows[(rows["method"] == baseline) & rows["prefill_time"].notna()]
    base_step = _per_step(base["wall_time"] - base["prefill_time"], base["steps"])
    out = {}
    for method, own in rows.groupby("method"):
        costs: dict[str, float | None] = {"nodes_per_step": _per_step(own["drafted"], own["steps"])}
        for section in ("draft", "verify"):
            seconds = _per_step(own[SECTION + section], own["steps"]) if SECTION + section in own else None
            costs[f"{section}_per_step"] = seconds / base_step if seconds is not None and base_step else None
        out[str(method)] = costs
    return out


def _per_step(values: pd.Series, steps: pd.Series) -> float | None:
    """sum(values) / sum(steps) over the rows where the value was recorded; None when none was
    (or they took no step)."""
    recorded = values.notna()
    total = steps[recorded].sum()
    return float(values[recorded].sum() / total) if recorded.any() and total > 0 else None


#: the method whose answers are the noise floor of the lossless audit (methods.noise: random drafts)
NOISE = "noise"
#: z of the two-sided 95% Wilson interval
Z95 = 1.959964


def run_precision(run: Run | None) -> dict[str, Any]:
    """What the run measured of its dtype (meta `precision`: engine.precision), or {} if nothing."""
    found = ((run.meta or {}) if run is not None else {}).get("precision")
    return found if isinstance(found, dict) else {}


def run_dtype(run: Run | None) -> str | None:
    """The dtype the run decoded in (its identity), None when not recorded."""
    ident = ((run.meta or {}) if run is not None else {}).get("identity") or {}
    return str(ident["dtype"]) if isinstance(ident, dict) and ident.get("dtype") else None


def tie_rule(tie_margin: float, spread: float | None, dtype: str | None) -> str:
    """The near-tie rule in words: which margin applied, and why."""
    if spread is None:
        return f"--tie-margin {tie_margin:g} (no measured spread recorded)"
    where = f"measured {dtype} spread {spread:.3g} (one-row vs multi-row forwards)"
    if spread <= tie_margin:
        return f"--tie-margin {tie_margin:g} (above the {where})"
    return f"the {where}, above --tie-margin {tie_margin:g}"


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion k / n ((0, 1) when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def lossless_audit(method_runs: list[Run], base_runs: list[Run], tie_margin: float) -> dict[str, Any]:
    """Greedy runs only: which answers equal the baseline's token for token; for each
    mismatch the first diverging position, both answers' tokens there (None where one ended),
    and whether the baseline's top-2 logit margin there was a numerical near-tie or not (a bug,
    unless `report --recheck` finds otherwise: see `is_bug`). The near-tie margin is the larger
    of `tie_margin` and the spread the two runs measured for their dtype (meta `precision`: how far
    one-row and multi-row forwards move a top-2 gap); `rule` says which applied. `rate` and
    `interval` (95% Wilson) are the share of compared answers that diverge; `token_rate` and
    `token_interval` the divergences per token compared (each answer counted up to its first
    divergence): the sharper measure in half precision, where most long answers diverge somewhere."""
    base_by_run = {r.run: r for r in base_runs}
    compared = equal = tokens = 0  # tokens: compared up to and including each answer's first divergence
    mismatches = []
    spreads: list[float] = []
    dtypes: set[str] = set()
    for run in method_runs:
        partner = base_by_run.get(run.run, base_runs[0])
        measured = [float(p["spread"]) for r in (run, partner) if isinstance((p := run_precision(r)).get("spread"),
                                                                                (int, float))]
        spreads += measured
        dtypes.update(d for r in (run, partner) if (d := run_dtype(r)))
        margin = max([tie_margin, *measured])
        base = {r["question_id"]: r for r in partner.records}
        for record in run.records:
            ours, ref = record.get(EXTRA_KEY) or {}, (base.get(record["question_id"]) or {}).get(EXTRA_KEY) or {}
            if "output_ids" not in ours or "output_ids" not in ref:
                continue
            compared += 1
            diverge = first_divergence(ours["output_ids"], ref["output_ids"])
            if diverge is None:
                equal += 1
                tokens += sum(len(ids) for ids in ref["output_ids"])
                continue
            turn, pos = diverge
            tokens += sum(len(ids) for ids in ref["output_ids"][:turn]) + pos + 1
            ref_stats = turn_stats(base[record["question_id"]])
            margins = (ref_stats[turn].top2_margin or []) if turn < len(ref_stats) else []
            top2 = margins[pos] if pos < len(margins) else None
            mismatches.append({
                "run": run.run, "baseline_run": partner.run, "question_id": record["question_id"], "turn": turn,
                "position": pos, "margin": top2, "near_tie": top2 is not None and top2 <= margin, "tie_margin": margin,
                "token": _token(ours["output_ids"], turn, pos), "baseline_token": _token(ref["output_ids"], turn, pos),
            })
    spread = max(spreads) if spreads else None
    dtype = "/".join(sorted(dtypes)) or None
    return {"compared": compared, "equal": equal, "mismatches": mismatches, "tie_margin": tie_margin,
            "spread": spread, "dtype": dtype, "rule": tie_rule(tie_margin, spread, dtype),
            "rate": (compared - equal) / compared if compared else None, "interval": wilson(compared - equal, compared),
            "tokens": tokens, "token_rate": (compared - equal) / tokens if tokens else None,
            "token_interval": wilson(compared - equal, tokens)}


def above_floor(audit: dict[str, Any] | None, floor: dict[str, Any] | None) -> bool | None:
    """Whether a method diverges more often than the noise floor: its 95% interval of divergences per
    token compared wholly above the floor's (per answer for audits without token counts); None when
    either is missing."""
    if not audit or not floor or not audit.get("compared") or not floor.get("compared"):
        return None
    key = "token_interval" if audit.get("tokens") and floor.get("tokens") else "interval"
    return audit[key][0] > floor[key][1]


def _token(output_ids: list[list[int]], turn: int, pos: int) -> int | None:
    """The token at (turn, pos); None where that answer had already ended."""
    ids = output_ids[turn] if turn < len(output_ids) else []
    return ids[pos] if pos < len(ids) else None


def is_bug(mismatch: dict[str, Any]) -> bool:
    """Whether a greedy mismatch counts as a lossless bug: the float64 recheck's verdict when there
    is one ("bug" yes; "numerical", "baseline off" no), else the near-tie rule (not a near-tie)."""
    verdict = mismatch.get("recheck")
    if verdict in RECHECK_VERDICTS:
        return verdict == BUG
    return not mismatch["near_tie"]


def first_divergence(ours: list[list[int]], ref: list[list[int]]) -> tuple[int, int] | None:
    """(turn, position) of the first token where two answers differ; None when equal."""
    for turn, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return turn, pos
    return None
