"""Leaderboard files (Markdown, CSV, LaTeX) shaped like upstream Spec-Bench's table."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.analysis.audit import NOISE, RECHECK_VERDICTS, STREAM_PARTS, above_floor
from specbench.analysis.batching import BatchPoint, batch_points, crossovers
from specbench.analysis.frame import OVERALL
from specbench.analysis.lengths import LengthPoint, length_points
from specbench.analysis.report import BASELINE, Group, MethodResult, budget_pairs, contention_note, schedule_note
from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASK_TITLES, SUBTASKS
from specbench.core.table import markdown

DEFINITIONS = (
    "Speedup: mean per-question tokens/s of the method divided by the baseline's on the same questions "
    "(upstream Spec-Bench definition), mean over runs; ± is the std over runs, [lo, hi] the 95% bootstrap "
    "interval over questions (answers decoded in one batch resampled together: they share its clock). "
    "#Mean accepted tokens: tokens emitted per decoding step (one target forward), "
    "the target's own bonus token counted in every step, as Spec-Bench (its accept_lengths are accepted draft "
    "tokens + 1 per step; 1.00 for autoregressive decoding): all tokens emitted in decoding / all steps. It is "
    "what vLLM calls mean acceptance length (1 + accepted / drafts) and SGLang accept length. Acceptance rate "
    "(vLLM's draft acceptance rate): accepted draft tokens / drafted tokens, no bonus token (tree drafts count "
    "every drafted node), a ratio of sums over the subtask's questions and runs, not a mean of per-question "
    "ratios; '-' for methods that record no draft counts. Per-depth acceptance: of the steps whose draft "
    "reached depth d, the share that accepted the token at depth d. Lossless audit (greedy runs): answers "
    "equal to the baseline's token for token; a mismatch is a near-tie when the baseline's top-2 logit margin "
    "at the first diverging token is within the larger of --tie-margin and the spread the run measured for its "
    "dtype (one-row vs multi-row forwards), and `report --recheck` re-runs the target alone in float64 on the "
    "run's own weights there: numerical (float64 picks neither token, or the two tokens' float64 logits lie "
    "within the margin, which also covers the dtype's error measured at that prefix), baseline off (float64 "
    "picks the method's token), bug (float64 picks the baseline's token by more than that). Tokens are counted "
    "from generated token ids. Nodes/step: draft nodes verified per decoding step (drafted tokens / steps; a "
    "tree counts every node). Efficiency: speedup / #mean accepted "
    "tokens, the share measured of the speedup a free drafter with one-step verification would reach. "
    "Draft/step and Verify/step: the method's drafting and verification time per decoding step relative to one "
    "baseline decode step of the same group (the baseline's wall time less prefill, per step); the baseline's "
    "step is 1 (verifying one token), so speedup ≈ #mean accepted tokens / (draft/step + verify/step + other), "
    "other being the rest of a step's time."
)
CSV_METRICS = ("speedup", "speedup_std", "ci_low", "ci_high", "mean_accepted", "acceptance_rate", "tokens_per_s")


def stem(group: Group) -> str:
    base = f"{group.dataset}-{group.model}"
    base = base if group.temperature == 0 else f"{base}-temp-{group.temperature:g}"
    base = f"{base}-len-{group.length}" if group.length is not None else base
    return f"{base}-batch-{group.batch}" if group.batch > 1 else base


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _subtasks(group: Group) -> list[str]:
    present = set(_table(group).index.get_level_values("subtask"))
    return [s for s in SUBTASKS if s in present]


def _table(group: Group) -> pd.DataFrame:
    """The group's speedups (one row per method x subtask) for the methods it reports."""
    methods = [r.method for r in group.results]
    table = group.speedups
    return table[table.index.get_level_values("method").isin(methods)]


def _speedup_cell(row: pd.Series, runs: int) -> str:
    if _fmt(row["speedup"]) == "-":  # no speedup (the baseline generated no tokens there)
        return "-"
    cell = f"{_fmt(row['speedup'])}x"
    return cell + (f" ± {_fmt(row['speedup_std'])}" if runs > 1 else "")


#: the main table's column of `report --beside`: the auto budget's overall speedup from its own job
AUTO_HEADER = "Overall, budget=auto"


def _auto_cell(group: Group, method: str) -> str:
    auto = group.beside.get(method)
    if auto is None:
        return "-"
    overall = auto.rows["overall"]
    return f"{_fmt(overall['speedup'])}x ({_fmt(overall['mean_accepted'])})"


def main_table(group: Group) -> tuple[list[str], list[list[str]]]:
    subtasks = _subtasks(group)
    headers = ["Method", *[SUBTASK_TITLES[s] for s in subtasks], "#Mean Accepted Tokens", "Acceptance Rate",
               "Overall", *([AUTO_HEADER] if group.beside else [])]
    runs = {r.method: r.runs for r in group.results}
    table = _table(group)
    cells = pd.Series([_speedup_cell(row, runs[m]) for (m, _), row in table.iterrows()], index=table.index)
    wide = cells.unstack("subtask").reindex(index=list(runs), columns=[*subtasks, OVERALL]).fillna("-")
    accepted = table["mean_accepted"].xs(OVERALL, level="subtask").map(_fmt)
    wide.insert(len(subtasks), "accepted", accepted)
    wide.insert(len(subtasks) + 1, "rate", table["acceptance_rate"].xs(OVERALL, level="subtask").map(_fmt))
    contended = {r.method for r in group.results if r.contended}
    beside = [[_auto_cell(group, m)] if group.beside else [] for m in wide.index]
    unverified = {r.method for r in group.results if r.unverified}
    return headers, [[m + (CONTROL if m == NOISE else "") + (f" {UNVERIFIED}" if m in unverified else ""), *cells[:-1],
                      cells[-1] + (f" {CONTENDED}" if m in contended else ""), *auto]
                     for m, cells, auto in zip(wide.index, wide.to_numpy().tolist(), beside)]


#: after the noise lane's name in the speed table: it is the lossless audit's control, not a method to rank
CONTROL = " (audit control)"


#: marks the Overall speedup of a method measured while other processes loaded the machine
CONTENDED = "†"
#: marks a method whose answers have no meta.json: what made them cannot be checked
UNVERIFIED = "‡ UNVERIFIED"


def timing_footnote(group: Group) -> list[str]:
    """The lines under a speed table: how it was timed (paired or not), and the contention mark's
    meaning when a row carries it."""
    lines = [note] if (note := schedule_note(group)) else []
    if group.beside:
        questions = max(int(r.rows["overall"].get("questions", 0) or 0) for r in group.beside.values())
        lines.append(f"{AUTO_HEADER}: the method with its draft budget on (budget=auto), from a job of its own "
                     f"({questions} questions; the baseline, each preset and auto in turn: make leaderboard-budget), "
                     "against that job's baseline, with its mean accepted tokens in brackets. The rows rank on the "
                     "presets (<method>-fixed), whose acceptance does not depend on the machine.")
    note = contention_note(group)
    lines += [f"{CONTENDED} {note[0].upper()}{note[1:]}."] if note else []
    if unverified := [f"{r.method} run {n}" for r in group.results for n in r.unverified]:
        lines.append(f"{UNVERIFIED}: answers without a meta.json ({', '.join(unverified)}): which model, settings and "
                     "questions made them cannot be checked; rerun them to have them verified.")
    lines += [f"Head of {r.method}: {line}" for r in group.results for line in r.heads]
    return lines


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n == 0:
        return "none"
    shown = float(f"{n:.3g}")  # rounded first, so 999.6 MB reads 1 GB, not 1e+03 MB
    for factor, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if shown >= factor:
            return f"{shown / factor:.3g} {unit}"
    return f"{n} B"


def _memory(r: MethodResult) -> list[str]:
    """Peak memory of the method's phase and its drafter's own weights (meta `memory`)."""
    m = r.memory or {}
    return [_bytes(m.get("peak_bytes")), _bytes(m.get("drafter_bytes"))]


def memory_footnote(group: Group) -> list[str]:
    """What the memory columns count (none when no run measured memory)."""
    how = sorted({r.memory["measured_by"] for r in group.results if r.memory and r.memory.get("measured_by")})
    if not how:
        return []
    return [f"Peak memory: {'; '.join(how)}, per method run (the target's weights included; the largest over "
            "runs). Drafter memory: the drafter's own weights (draft model or heads; parameters shared with the "
            "target left out); its KV cache and draft trees are inside the peak."]


def _split(r: MethodResult) -> str:
    if not r.time_split:
        return "-"
    return " / ".join(f"{k} {v:.0%}" for k, v in r.time_split.items())


def _audit(r: MethodResult) -> str:
    if r.audit is None:
        return "-" if r.method == BASELINE else r.audit_skipped
    a = r.audit
    bugs = sum(not m["near_tie"] for m in a["mismatches"])
    text = f"{a['equal']}/{a['compared']} equal"
    if a["mismatches"]:
        text += f", {len(a['mismatches']) - bugs} near-tie, {bugs} NOT near-tie"
    verdicts = Counter(m["recheck"] for m in a["mismatches"] if "recheck" in m)
    if verdicts:
        shown = [f"{verdicts.pop(v)} {v}" for v in RECHECK_VERDICTS if v in verdicts]
        skipped = sum(verdicts.values())  # "not rechecked: <why>"
        text += "; float64 recheck: " + ", ".join(shown + ([f"{skipped} not rechecked"] if skipped else []))
    return text


def _rate(a: dict[str, Any]) -> str:
    """'k/n (lo-hi%)': the answers that diverge, with the 95% Wilson interval of their share."""
    lo, hi = a["interval"]
    return f"{a['compared'] - a['equal']}/{a['compared']} ({lo:.0%}-{hi:.0%})"


def _per_token(a: dict[str, Any]) -> str:
    """Divergences per 1,000 tokens compared, with the 95% Wilson interval."""
    if not a.get("tokens"):
        return "-"
    lo, hi = a["token_interval"]
    return f"{1000 * a['token_rate']:.2f} ({1000 * lo:.2f}-{1000 * hi:.2f})"


def noise_floor(group: Group) -> dict[str, Any] | None:
    """The audit of the group's `noise` lane (methods.noise): the noise floor; None without one."""
    return next((r.audit for r in group.results if r.method == NOISE and r.audit), None)


def audit_rule(group: Group) -> str | None:
    """The near-tie rule the group's audits used (the one with the largest measured spread)."""
    audits = [r.audit for r in group.results if r.audit]
    if not audits:
        return None
    return max(audits, key=lambda a: a.get("spread") or 0.0).get("rule")


def audit_table(group: Group) -> tuple[list[str], list[list[str]]] | None:
    """Per audited method: equal answers, the share that diverges beside the noise floor's, and what
    the divergences are (near-tie rule; float64 recheck when it ran). None without greedy audits."""
    audited = [r for r in group.results if r.audit is not None and r.audit.get("compared")]
    if not audited:
        return None
    floor = noise_floor(group)
    rows = []
    for r in audited:
        a = r.audit
        verdicts = Counter(m.get("recheck", "not rechecked") for m in a["mismatches"])
        recheck = ", ".join(f"{verdicts[v]} {v}" for v in RECHECK_VERDICTS if verdicts[v]) if any(
            "recheck" in m for m in a["mismatches"]) else "-"
        near = sum(m["near_tie"] for m in a["mismatches"])
        above = above_floor(a, floor) if r.method != NOISE else None
        rows.append([r.method + (" (noise floor)" if r.method == NOISE else ""), f"{a['equal']}/{a['compared']}",
                     _rate(a), _per_token(a), f"{near} / {len(a['mismatches']) - near}", recheck,
                     "-" if above is None else ("ABOVE" if above else "within")])
    return ["Method", "Equal", "Diverge (95% CI)", "Per 1k tokens (95% CI)", "Near-tie / not", "float64 recheck",
            "vs noise floor"], rows


AUDIT_NOTE = (
    "Lossless audit of greedy answers against the baseline's, token for token. Diverge: answers that leave the "
    "baseline's somewhere, with the 95% Wilson interval of their share; per 1k tokens: first divergences per "
    "1,000 tokens compared (each answer counted up to its first divergence), the sharper measure where most "
    "long answers diverge somewhere. The noise floor is the `noise` lane (random drafts, so its tokens are the "
    "baseline's computed in forwards of 1-60 rows): how often the arithmetic of this dtype alone moves an "
    "answer; 'ABOVE' marks a method whose per-token interval lies wholly above the floor's. Near-tie: the "
    "baseline's top-2 logit margin at the first diverging token is within the rule's "
    "margin. float64 recheck (`report --recheck`): exact arithmetic on the run's own weights; numerical or "
    "baseline off = explained by precision, bug = the baseline's token wins by more than the run's precision "
    "can move it (the margin: the largest of --tie-margin, the run's measured spread and the error of its dtype "
    "measured at that prefix).")


def audit_lines(group: Group) -> list[str]:
    """The near-tie rule, then one line per method whose greedy answers left the baseline's: its audit
    cell, and its divergence beside the noise floor when the group has one."""
    floor = noise_floor(group)
    lines = []
    for r in group.results:
        if not (r.audit or {}).get("mismatches"):
            continue
        text = f"lossless audit, {r.method}: {_audit(r)}"
        if floor is not None and r.method != NOISE:
            text += (f"; diverge {_rate(r.audit)}, {_per_token(r.audit)} per 1k tokens vs noise floor "
                     f"{_rate(floor)}, {_per_token(floor)}") + (
                " ABOVE the floor" if above_floor(r.audit, floor) else "")
        lines.append(text)
    if lines and (rule := audit_rule(group)):
        lines.insert(0, f"lossless audit: near-tie margin: {rule}")
    return lines


def _recheck_numbers(m: dict[str, Any]) -> str:
    """The recheck's float64 gap against the margin it was held to, where it ran."""
    if "recheck_gap" not in m or "recheck_margin" not in m:
        return ""
    return f"; float64 gap {m['recheck_gap']:.3g} vs margin {m['recheck_margin']:.3g}"


def _verdict(m: dict[str, Any]) -> str:
    tie = "near-tie" if m["near_tie"] else "NOT a near-tie"
    if "recheck" in m:
        return f"{tie}; float64 recheck: {m['recheck']}"
    return tie if m["near_tie"] else f"{tie}: a bug"


def detail_table(group: Group) -> tuple[list[str], list[list[str]]]:
    headers = ["Method", "tok/s", "Overall 95% CI", "Nodes/step", "Efficiency", "Draft/step", "Verify/step",
               "Per-depth acceptance", "Time split", "Lossless audit", "Drafting", "Verification", "Training",
               "Extra params", "Peak memory", "Drafter memory"]
    overall = _table(group).xs(OVERALL, level="subtask")
    rows = []
    for r in group.results:
        o = overall.loc[r.method]
        depth = " ".join(f"{x:.2f}" for x in r.depth_acceptance[:8]) if r.depth_acceptance else "-"
        f = r.facts
        params = f.get("extra_parameters")
        rows.append([
            r.method, f"{_fmt(o['tokens_per_s'], '.1f')} ± {_fmt(o['tokens_per_s_std'], '.1f')}",
            f"[{_fmt(o['ci_low'])}, {_fmt(o['ci_high'])}]", *_step_cells(r), depth, _split(r), _audit(r),
            f.get("drafting", "-"), f.get("verification", "-"), str(f.get("training", "-")),
            f"{params / 1e6:.2f}M" if isinstance(params, (int, float)) else "-", *_memory(r),
        ])
    return headers, rows


def _step_cells(r: MethodResult) -> list[str]:
    """Nodes/step, efficiency, draft/step and verify/step (the last two in baseline decode steps)."""
    nodes, draft, verify = (r.steps.get(k) for k in ("nodes_per_step", "draft_per_step", "verify_per_step"))
    return [_fmt(nodes), _fmt(r.efficiency), *("-" if x is None else f"{x:.2f}x" for x in (draft, verify))]


def _with_ci(r: MethodResult) -> str:
    o = r.rows["overall"]
    return f"{_fmt(o['speedup'])}x [{_fmt(o['ci_low'])}, {_fmt(o['ci_high'])}]"


def _change(before: float | None, after: float | None) -> str:
    return f"{_fmt(before)} -> {_fmt(after)}"


def budget_table(group: Group) -> tuple[list[str], list[list[str]]] | None:
    """One row per method run with both draft budgets (X and X-fixed); None when none was."""
    pairs = budget_pairs(group)
    if not pairs:
        return None
    headers = ["Method", "Speedup fixed", "Speedup auto", "auto/fixed", "Mean accepted fixed -> auto",
               "Nodes/step fixed -> auto", "Efficiency fixed -> auto", "auto >= fixed"]
    rows = []
    for pair in pairs:
        auto, fixed = pair.auto, pair.fixed
        a, f = auto.rows["overall"], fixed.rows["overall"]
        rows.append([auto.method, _with_ci(fixed), _with_ci(auto),
                     f"{_fmt(pair.ratio, '.3f')} [{_fmt(pair.low, '.3f')}, {_fmt(pair.high, '.3f')}]",
                     _change(f["mean_accepted"], a["mean_accepted"]),
                     _change(fixed.steps.get("nodes_per_step"), auto.steps.get("nodes_per_step")),
                     _change(fixed.efficiency, auto.efficiency), pair.verdict])
    return headers, rows


BUDGET_NOTE = (
    "Draft budgets: a method run with `method.budget=auto` (its plain name) and with `method.budget=fixed` (named "
    "<method>-fixed) on the same questions (`make leaderboard-budget` runs every method both ways and the baseline in "
    "one job, in turn question by question: `interleave=[...] budget=both`). auto/fixed: auto's mean per-question "
    "tokens/s over fixed's on the questions both answered, with its 95% paired bootstrap interval over those "
    "questions. auto >= fixed: yes when that ratio is at least 1, within noise when it is below 1 but its interval "
    "reaches 1, NO otherwise."
)


def learns_online(r: MethodResult) -> bool:
    return str(r.facts.get("training", "")).lower() == "online"


def stream_table(group: Group) -> tuple[list[str], list[list[str]]] | None:
    """Mean accepted tokens in each fifth of the question stream, for every method, when a method
    that learns online is in the group (for the others the fifths show what the questions do).
    Under a method that learns online, when its static twin is in the group: the twin on the same
    questions as each fifth, and the gain (online / twin) per fifth."""
    if not any(learns_online(r) for r in group.results):
        return None
    headers = ["Method", *(f"part {i + 1}" for i in range(STREAM_PARTS)), "last / first", "Draft updates"]
    rows = []
    for r in group.results:
        if r.stream is None or r.method == BASELINE:
            continue
        parts = r.stream["mean_accepted"]
        updates = (f"{r.stream['online_updates']} ({r.stream['online_update_seconds']:.1f} s)"
                   if r.stream["online_updates"] else "-")
        rows.append([r.method, *_cells(parts), _last_over_first(parts), updates])
        if twin := r.stream.get("twin_accepted"):
            rows.append([f"{r.facts['static_twin']}, same questions", *_cells(twin), _last_over_first(twin), "-"])
            gain = [a / b if a and b else None for a, b in zip(parts, twin)]
            rows.append([f"{r.method} / {r.facts['static_twin']}", *_cells(gain, ".3f"), _last_over_first(gain), "-"])
    return headers, rows


def _cells(values: list[float | None], spec: str = ".2f") -> list[str]:
    return [_fmt(x, spec) for x in values]


def _last_over_first(values: list[float | None]) -> str:
    return f"{values[-1] / values[0]:.3f}" if values[0] and values[-1] else "-"


STREAM_NOTE = (
    "Acceptance across the question stream: #mean accepted tokens in each fifth of every run's answers, in the "
    "order they were made (pooled over runs). Static methods answer in file order, subtask by subtask, so their "
    "fifths differ by what the questions are; a method that learns online answers round-robin over the subtasks "
    "(every fifth mixes them alike; its `stream` setting) and its static twin (online_spec: sps, the same draft "
    "without updates) is shown on the same questions as each of its fifths, with the gain per fifth. Draft "
    "updates: how many ran over all runs and their time, which is inside the method's timed decode and so in "
    "its speedup."
)


BATCH_NOTE = (
    "Throughput: all generated tokens / all wall time of the method's batches (tokens per second of the whole "
    "batch). Speedup: the method's throughput / the baseline's at the same batch size; 95% CI: its paired "
    "bootstrap interval over timing units, each of the baseline's batches (per run) resampled whole with the "
    "method's answers to the same questions (a batch's answers share one clock: one measurement, not one per "
    "question; at batch size 1 each question is a unit). Latency: from a "
    "question's admission into a row of the batch (its prefill) until its row stopped, summed over its turns "
    "(batch size 1: its wall time; waiting in the queue is not counted); mean and 90th percentile over questions. "
    "#Mean accepted: tokens emitted per target step of a row. Peak memory: the "
    "run's measured peak (the target's weights included). TTFT (time to first token): from a turn's arrival "
    "(every first turn arrives at the start, so waiting for a row counts, as a server's client sees it) to its "
    "first token; batch size 1: its prefill. TPOT (time per output token): from a turn's first token to its "
    "last, per token after the first. p50/p90/p99 over turns (nearest rank). A method named NAME-fixed runs "
    "its published preset (`method.budget=fixed`); NAME alone the draft budget chosen per step "
    "(`method.budget=auto`). Crossover: the smallest batch size at which a method is slower than the baseline "
    "after being faster at a smaller one."
)


def _triple(values: tuple[float, float, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if values is None else " / ".join(f"{v * scale:.{digits}f}" for v in values)


def crossover_line(points: list[BatchPoint]) -> str:
    """One sentence: each method's crossover batch size (where it has one)."""
    found = crossovers(points)
    if not found:
        return "Crossover: no method falls below the baseline after being faster at a smaller batch size."
    return "Crossover (smallest batch size slower than the baseline): " + ", ".join(
        f"{method} {batch}" for method, batch in sorted(found.items(), key=lambda kv: (kv[1], kv[0]))) + "."


def batch_stem(key: tuple[str, str, float]) -> str:
    dataset, model, temperature = key
    return f"{dataset}-{model}" + ("" if temperature == 0 else f"-temp-{temperature:g}") + "-batch"


def batch_table(points: list[BatchPoint]) -> tuple[list[str], list[list[str]]]:
    headers = ["Method", "Batch size", "#Q", "Throughput tok/s", "Speedup", "95% CI", "Mean latency s",
               "p90 latency s", "TTFT s p50 / p90 / p99", "TPOT ms p50 / p90 / p99", "#Mean accepted", "Peak memory"]
    rows = [[p.method, str(p.batch), str(p.questions), f"{p.throughput:.1f}",
             "-" if p.speedup is None else f"{p.speedup:.2f}x",
             "-" if math.isnan(p.ci_low) else f"[{p.ci_low:.2f}, {p.ci_high:.2f}]", f"{p.latency:.2f}",
             f"{p.latency_p90:.2f}",
             _triple(p.ttft), _triple(p.tpot, 1e3, 1), f"{p.mean_accepted:.2f}", _bytes(p.peak_bytes)]
            for p in points]
    return headers, rows


def batch_row(point: BatchPoint) -> dict[str, Any]:
    """A point as a CSV row: the percentile triples in columns of their own."""
    row = {k: v for k, v in vars(point).items() if k not in ("ttft", "tpot")}
    for name in ("ttft", "tpot"):
        values = getattr(point, name) or (None, None, None)
        row.update({f"{name}_p{q}": v for q, v in zip((50, 90, 99), values, strict=True)})
    return row


def batch_console(groups: list[Group]) -> str:
    """The batch-size tables of every (dataset, model, temperature) measured at several batch sizes."""
    parts = []
    for (dataset, model, temperature), points in batch_points(groups).items():
        parts.append(f"\nBatch sizes: {dataset} / {model} / temperature {temperature:g}\n\n"
                     f"{markdown(*batch_table(points))}\n{crossover_line(points)}\n")
    return "".join(parts)


def write_batches(groups: list[Group], out_dir: Path, figures: bool) -> list[Path]:
    """<dataset>-<model>[-temp-t]-batch.{md,csv} (and the figure) where several batch sizes exist."""
    written: list[Path] = []
    for key, points in batch_points(groups).items():
        title = f"{key[0]} / {key[1]} / temperature {key[2]:g}"
        written += write_points(out_dir / batch_stem(key), f"Speedup against batch size: {title}",
                                f"{markdown(*batch_table(points))}\n\n{crossover_line(points)}\n\n{BATCH_NOTE}",
                                [batch_row(p) for p in points])
        if figures:
            from specbench.presentation.figures import batch_figure

            written += batch_figure(points, title, out_dir / batch_stem(key))
    return written


LENGTH_NOTE = (
    "Input length: every first turn made about N tokens of the model's tokenizer (`length=N`) with the dataset's "
    "own documents (its summarization articles and retrieval passages, never the question's own) before the "
    "question, which stays last and unchanged; later turns unchanged. \"as is\": the same questions without "
    "`length`. Each cell: the method's overall speedup over the baseline at the same length (paired per "
    "question, as in the main table) / its mean accepted tokens per step; the baseline's cells give its tokens "
    "per second."
)


def length_stem(key: tuple[str, str, float, int]) -> str:
    dataset, model, temperature, batch = key
    return (f"{dataset}-{model}" + ("" if temperature == 0 else f"-temp-{temperature:g}")
            + (f"-batch-{batch}" if batch > 1 else "") + "-length")


def length_title(key: tuple[str, str, float, int]) -> str:
    dataset, model, temperature, batch = key
    return f"{dataset} / {model} / temperature {temperature:g}" + (f" / batch size {batch}" if batch > 1 else "")


def write_points(base: Path, heading: str, body: str, rows: list[dict[str, Any]]) -> list[Path]:
    """<base>.md (the heading, then the table and its notes) and <base>.csv (one row per point, 4 decimals):
    the batch-size and input-length tables."""
    md, csv_path = Path(f"{base}.md"), Path(f"{base}.csv")
    md.write_text(f"# {heading}\n\n{body}\n", encoding="utf-8")
    pd.DataFrame(rows).round(4).to_csv(csv_path, index=False, na_rep="nan", lineterminator="\r\n", encoding="utf-8")
    return [md, csv_path]


def length_table(points: list[LengthPoint]) -> tuple[list[str], list[list[str]]]:
    """One row per method, one column per input length: speedup / mean accepted (the baseline: tok/s)."""
    lengths = sorted({p.length for p in points}, key=lambda n: -1 if n is None else n)
    cells: dict[str, dict[int | None, str]] = {}
    for p in points:
        if p.method == BASELINE:
            cell = f"{_fmt(p.tokens_per_s, '.1f')} tok/s"
        else:
            cell = f"{_fmt(p.speedup)}x / {_fmt(p.mean_accepted)}"
        cells.setdefault(p.method, {})[p.length] = cell
    headers = ["Method", *("as is" if n is None else f"{n} tokens" for n in lengths)]
    return headers, [[method, *(row.get(n, "-") for n in lengths)] for method, row in cells.items()]


def lengths_console(groups: list[Group]) -> str:
    parts = []
    for key, points in length_points(groups).items():
        parts.append(f"\nInput lengths: {length_title(key)}\n\n{markdown(*length_table(points))}\n")
    return "".join(parts)


def write_lengths(groups: list[Group], out_dir: Path, figures: bool) -> list[Path]:
    """<dataset>-<model>[-temp-t][-batch-B]-length.{md,csv} (and the figure) where several input lengths exist."""
    written: list[Path] = []
    for key, points in length_points(groups).items():
        out_dir.mkdir(parents=True, exist_ok=True)
        title = length_title(key)
        written += write_points(out_dir / length_stem(key), f"Speedup against input length: {title}",
                                f"{markdown(*length_table(points))}\n\n{LENGTH_NOTE}", [vars(p) for p in points])
        if figures:
            from specbench.presentation.figures import length_figure

            written += length_figure(points, title, out_dir / length_stem(key))
    return written


def environment_line(group: Group) -> str:
    env = group.environment()
    if not env:
        return "Environment: not recorded (upstream answer files)."
    keys = ("device_name", "device", "dtype", "threads", "torch", "transformers", "python", "git_commit")
    shown = [f"{k}={env.get(k)}" for k in keys if env.get(k) is not None]
    features = (env.get("cpu") or {}).get("features") if env.get("device") == "cpu" else None
    if features is not None:  # recorded since 2026-12-07: two CPUs of one model name may differ in these
        shown.insert(1, f"cpu_features={'+'.join(features) or 'none'}")
    return "Environment: " + ", ".join(shown)


def render_markdown(group: Group) -> str:
    runs = max((r.runs for r in group.results), default=0)
    questions = _table(group).loc[(group.results[0].method, OVERALL), "questions"] if group.results else 0
    parts = [
        f"# Leaderboard: {group.title}",
        "",
        f"{questions} questions, {runs} run(s). {environment_line(group)}",
        "",
        markdown(*main_table(group)),
        *[line for note in timing_footnote(group) for line in ("", note)],
        "",
        "## Details",
        "",
        markdown(*detail_table(group)),
        *[line for note in memory_footnote(group) for line in ("", note)],
        "",
        DEFINITIONS,
    ]
    if (budgets := budget_table(group)) is not None:
        parts += ["", "## Draft budgets: auto against fixed", "", markdown(*budgets), "", BUDGET_NOTE]
    if (stream := stream_table(group)) is not None:
        parts += ["", "## Acceptance across the question stream", "", markdown(*stream), "", STREAM_NOTE]
    if (audits := audit_table(group)) is not None and any(r.audit and r.audit["mismatches"] for r in group.results):
        parts += ["", "## Lossless audit", "", f"Near-tie margin: {audit_rule(group)}.", "", markdown(*audits), "",
                  AUDIT_NOTE]
    if group.problems:
        parts += ["", "## Problems", "", *[f"- {p}" for p in group.problems]]
    for r in group.results:
        for m in (r.audit or {}).get("mismatches", [])[:10]:
            parts.append(f"- {r.method}: question {m['question_id']} run {m['run']} turn {m['turn'] + 1} diverges at "
                         f"token {m['position']} (baseline top-2 margin {m['margin']}; "
                         f"{_verdict(m)}{_recheck_numbers(m)})")
    return "\n".join(parts) + "\n"


def write_csv(group: Group, path: Path) -> None:
    """One row per method: runs, then for each subtask (and overall) its CSV_METRICS."""
    subtasks = [*_subtasks(group), OVERALL]
    wide = _table(group)[list(CSV_METRICS)].apply(lambda col: col.map(lambda x: round(x, 4))).unstack("subtask")
    wide = wide.swaplevel(axis=1).reindex(index=[r.method for r in group.results],
                                          columns=[(s, k) for s in subtasks for k in CSV_METRICS])
    wide.columns = [f"{s}_{k}" for s, k in wide.columns]
    wide.insert(0, "runs", [r.runs for r in group.results])
    wide.index.name = "method"
    wide.to_csv(path, na_rep="nan", lineterminator="\r\n", encoding="utf-8")


def _tex_escape(text: str) -> str:
    return text.replace("_", r"\_").replace("%", r"\%").replace("#", r"\#").replace(CONTENDED, r"$^\dagger$")


def render_tex(group: Group) -> str:
    headers, rows = main_table(group)
    lines = [r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule",
             " & ".join(_tex_escape(h) for h in headers) + r" \\", r"\midrule"]
    lines += [" & ".join(_tex_escape(c).replace("±", r"$\pm$") for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_group(group: Group, out_dir: Path) -> list[Path]:
    """Write <dataset>-<model>[-temp-t].{md,csv,tex}; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv_path, tex = (out_dir / f"{stem(group)}.{ext}" for ext in ("md", "csv", "tex"))
    md.write_text(render_markdown(group), encoding="utf-8")
    write_csv(group, csv_path)
    tex.write_text(render_tex(group), encoding="utf-8")
    return [md, csv_path, tex]


def console(group: Group) -> str:
    footnote = "".join(f"\n{line}\n" for line in timing_footnote(group))
    if (budgets := budget_table(group)) is not None:
        footnote += f"\nDraft budgets, auto against fixed:\n\n{markdown(*budgets)}\n"
    if (stream := stream_table(group)) is not None:
        footnote += f"\nAcceptance across the question stream (fifths):\n\n{markdown(*stream)}\n"
    return f"\n{group.title}  ({environment_line(group)})\n\n{markdown(*main_table(group))}\n{footnote}"


@dataclass
class Report:
    """What `build` made: the analysed groups and the files written; `console()` is what `specbench
    report` prints, `warnings()` what it prints on stderr, `ok` whether any group had results."""

    groups: list[Group]
    written: list[Path]
    out_dir: Path
    tie_margin: float
    recheck: bool

    @property
    def ok(self) -> bool:
        return any(g.results for g in self.groups)

    def warnings(self) -> list[str]:
        return [problem for group in self.groups for problem in [*group.problems, *group.notes]]

    def console(self) -> str:
        lines: list[str] = []
        for group in self.groups:
            if not group.results:
                continue
            lines.append(console(group))
            if self.recheck and group.temperature == 0 and group.batch == 1:
                lines += audit_lines(group) or ["lossless audit: every greedy answer equals the baseline's; "
                                                "nothing to recheck"]
        if engines := engines_table(self.groups, self.tie_margin):
            lines.append("\n" + engines_markdown(engines))
        if batches := batch_console(self.groups):
            lines += [batches, BATCH_NOTE]
        if lengths := lengths_console(self.groups):
            lines += [lengths, LENGTH_NOTE]
        lines.append(DEFINITIONS)
        if self.written:
            lines.append(f"\nwrote {len(self.written)} files to {self.out_dir}")
        return "\n".join(lines)


def build(
    results_dir: Path, out_dir: Path, *, upstream_model: str = "upstream", tie_margin: float = 0.05,
    upstream_tokenizer: Any = None, figures: bool = True, recheck: bool = False, recheck_limit: int | None = None,
    recheck_device: str = "auto", beside: Path | None = None,
) -> Report:
    """Analyse every group under `results_dir` (with `recheck`, each greedy mismatch judged by the
    float64 target: analysis.recheck), write tables (and figures) to `out_dir`. `beside`: answers of a
    `budget=both` job; each main-table row X-fixed gets X's auto speedup from there."""
    from specbench.analysis import report

    groups = [report.analyse(g, tie_margin=tie_margin, upstream_tokenizer=upstream_tokenizer)
              for g in report.group_runs(report.load_runs(results_dir, upstream_model))]
    if beside is not None:
        others = {g.key: report.analyse(g, tie_margin=tie_margin)
                  for g in report.group_runs(report.load_runs(beside, upstream_model))} if beside.is_dir() else {}
        if not others:
            raise SpecbenchError(f"--beside {beside}: no answer files there; give the answers folder of "
                                 "`make leaderboard-budget` (results/answers-budget)")
        for group in groups:
            if (other := others.get(group.key)) is not None:
                group.beside = {pair.fixed.method: pair.auto for pair in budget_pairs(other)}
    if recheck:
        from specbench.analysis.recheck import recheck_groups

        recheck_groups(groups, tie_margin=tie_margin, limit=recheck_limit, device=recheck_device)
    written: list[Path] = []
    try:
        for group in groups:
            if group.results:
                written += write_group(group, out_dir)
        written += write_batches(groups, out_dir, figures)
        written += write_lengths(groups, out_dir, figures)
        if engines := engines_table(groups, tie_margin):
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "engines.md").write_text(engines_markdown(engines), encoding="utf-8")
            written.append(out_dir / "engines.md")
        if figures:
            written += _figures(groups, out_dir)
        if any(group.results for group in groups):  # the page: these tables and figures in one file
            from specbench.presentation import page

            tables = page.Tables(main_table, detail_table, environment_line, stem, DEFINITIONS,
                                 timing_footnote, memory_footnote)
            written.append(page.write(groups, out_dir, tables, figures=written))
    except OSError as exc:
        raise SpecbenchError(f"cannot write the leaderboard to {out_dir} ({exc.strerror or exc}"
                             f"{': ' + exc.filename if exc.filename else ''}); choose another --out") from None
    return Report(groups, written, out_dir, tie_margin, recheck)


def _figures(groups: list[Group], out_dir: Path) -> list[Path]:
    from specbench.presentation import figures

    written: list[Path] = []
    by_model: dict[tuple[str, str], list[Group]] = {}
    for group in groups:
        if not any(r.method != BASELINE for r in group.results):
            continue
        written += figures.figure5(group, out_dir / f"{stem(group)}-fig5")
        written += figures.acceptance(group, out_dir / f"{stem(group)}-acceptance")
        if group.batch == 1 and group.length is None:  # Figure 6: across temperatures, one sequence, inputs as they are
            by_model.setdefault((group.dataset, group.model), []).append(group)
    for (dataset, model), same in by_model.items():
        if len(same) > 1:
            written += figures.figure6(same, out_dir / f"{dataset}-{model}-fig6")
    return written


ENGINES_NOTE = (
    "Engines: each engine's speedup is against its own baseline (vLLM without speculation for vLLM's methods, "
    "our baseline for ours), paired question by question within its job; the two jobs ran apart, so their "
    "tokens/s are shown, not divided. vLLM's #Mean accepted tokens: tokens per engine step, read off its stream "
    "(one chunk per step), steps without a draft counted as in ours; 1 + acc./drafts: vLLM's own mean "
    "acceptance length from its counters (vllm:spec_decode_num_accepted_tokens / _num_drafts: steps with a draft "
    "only, and accepted tokens past max_tokens counted); its acceptance rate: its counters too "
    "(vllm:spec_decode_num_accepted_tokens / _num_draft_tokens). Greedy: the engine's answers equal "
    "to our baseline's token for token; a divergence at a near-tie of our baseline's top-2 logits is arithmetic "
    "(another engine's kernels or batch shapes round differently), one that is not needs a look."
)


def engines_table(groups: list[Group], tie_margin: float = 0.05) -> list[tuple[str, list[str], list[list[str]]]]:
    """For each engine group with ours beside it: (title, headers, rows) of the engines table."""
    from specbench.analysis import engines

    tables = []
    for engine, local in engines.pairs(groups):
        headers = ["Engine", "Method", "Speedup", "#Mean acc.", "1 + acc./drafts", "Accept rate", "tok/s", "Ours",
                   "Speedup",
                   "#Mean acc.", "Accept rate", "tok/s", "Greedy: = our baseline"]
        body = []
        for row in engines.rows(engine, local, tie_margin):
            o = row["ours_numbers"]
            body.append([row["engine"], row["method"], _ci_cell(row), _fmt(row["mean_accepted"]),
                         _fmt(row["counter_length"]), _fmt(row["acceptance_rate"], ".1%"),
                         _fmt(row["tokens_per_s"], ".1f"), row["ours"] or "-",
                         _ci_cell(o), _fmt(o["mean_accepted"]), _fmt(o["acceptance_rate"], ".1%"),
                         _fmt(o["tokens_per_s"], ".1f"), engines.greedy_cell(row["greedy"])])
        where = (f"{local.title}" if local is not None else f"{engine.title} (no answers of ours on this model, "
                 "dataset and temperature)")
        tables.append((f"Engines: {engine.model} beside {where}", headers, body))
    return tables


def _ci_cell(numbers: dict[str, float]) -> str:
    if math.isnan(numbers["speedup"]):
        return "-"
    cell = f"{numbers['speedup']:.2f}x"
    if not math.isnan(numbers["ci_low"]):
        cell += f" [{numbers['ci_low']:.2f}, {numbers['ci_high']:.2f}]"
    return cell


def engines_markdown(tables: list[tuple[str, list[str], list[list[str]]]]) -> str:
    parts = [f"## {title}\n\n{markdown(headers, rows)}\n" for title, headers, rows in tables]
    return "\n".join(parts) + f"\n{ENGINES_NOTE}\n"
