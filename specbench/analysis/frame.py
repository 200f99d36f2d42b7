"""The tidy frame (one row per question x turn x method x run) and the one speedup computation.

Upstream Spec-Bench definitions (speed.py), kept as the default so numbers are comparable:
- tokens/s of a question = sum(new_tokens) / sum(wall_time) over its turns;
- a method's speedup on a subtask = mean of its per-question tokens/s / mean of the baseline's
  over the same questions, the baseline run paired by run number (else the baseline's first
  run); mean over runs, ± sample std (ddof=1), 95% paired bootstrap interval over questions
  (over the baseline's batches where it answered in batches: a batch's answers share one clock,
  so their times rise and fall together and are resampled whole);
- #mean accepted tokens = mean over all decoding steps of accept_lengths, the target's own bonus
  token counted in every step (Spec-Bench's convention: accepted draft tokens + 1 per step; 1.00
  for autoregressive decoding); a ratio of sums: all tokens emitted in decoding / all steps.

Besides upstream's: the acceptance rate in vLLM's sense (its spec-decode metrics'
"draft acceptance rate") = accepted draft tokens / drafted tokens, no bonus token, from the
engine's per-turn `drafted_tokens` / `accepted_tokens` (tree drafts count every node drafted);
a ratio of sums over the subtask's answers (every run), not a mean of per-question ratios; nan
for methods that record no draft stats (the baseline, most non-speculative methods).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from specbench.analysis.runs import BASELINE, Run
from specbench.core.answers import EXTRA_KEY
from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASKS, subtask_of
from specbench.core.record import TurnStats, turn_stats

KEYS = ["dataset", "model", "temperature", "method", "run", "question_id", "category", "subtask", "turn"]
MEASURES = ["new_tokens", "ref_tokens", "wall_time", "steps", "accepted", "drafted", "draft_accepted", "prefill_time"]
#: the timing unit of a turn: its batch's id within the run where it was decoded in a batch (extra `batch`),
#: else nan (a question timed on its own)
SEQUENCE = "sequence"
SECTION = "section_"  # prefix of the per-section time columns (section_draft, section_verify, ...)
OVERALL = "overall"
ORDER = [*SUBTASKS, OVERALL]
METRICS = ["speedup", "speedup_std", "ci_low", "ci_high", "tokens_per_s", "tokens_per_s_std",
           "baseline_tokens_per_s", "mean_accepted", "acceptance_rate", "questions", "runs"]
BOOTSTRAP_SAMPLES = 1000


def tidy(runs: Iterable[Run], *, upstream_tokenizer: Any = None) -> pd.DataFrame:
    """One row per question x turn x method x run (columns KEYS, MEASURES, SEQUENCE, then sections).

    `ref_tokens` is what counts when the row serves as the baseline's reference: its new tokens,
    or with `upstream_tokenizer` the baseline's text re-tokenised as upstream speed.py counts it
    (`len(tokenizer(turn).input_ids) - 1`)."""
    rows = [row for run in runs for record in run.records
            for row in _turn_rows(run, record, upstream_tokenizer if run.method == BASELINE else None)]
    sections = sorted({k for row in rows for k in row if k.startswith(SECTION)})
    return pd.DataFrame(rows, columns=[*KEYS, *MEASURES, SEQUENCE, *sections])


def _turn_rows(run: Run, record: dict[str, Any], tokenizer: Any) -> Iterator[dict[str, Any]]:
    choice = record["choices"][0]
    extra = record.get(EXTRA_KEY) or {}
    prefill, sections = extra.get("prefill_time") or [], extra.get("sections") or []
    batches = extra.get("batch") or []
    stats = turn_stats(record)
    accepts = _accepts_by_turn(choice)
    if tokenizer is not None and "turns" not in choice:
        raise SpecbenchError(f"{run.source}: question {record['question_id']} has no answer text (choices[0].turns) "
                             "to count upstream's way; leave out --upstream-count")
    for turn, (tokens, seconds) in enumerate(zip(choice["new_tokens"], choice["wall_time"])):
        row = {
            "dataset": run.dataset, "model": run.model, "temperature": run.temperature, "method": run.method,
            "run": run.run, "question_id": record["question_id"], "category": record["category"],
            "subtask": subtask_of(record["category"]), "turn": turn, "new_tokens": tokens,
            "ref_tokens": tokens if tokenizer is None else len(tokenizer(choice["turns"][turn]).input_ids) - 1,
            "wall_time": seconds, "steps": len(accepts[turn]), "accepted": sum(accepts[turn]),
            "prefill_time": _float(prefill[turn] if turn < len(prefill) else None),
            SEQUENCE: batch_id(batches[turn] if turn < len(batches) else None),
            **_draft_counts(stats[turn] if turn < len(stats) else None),
        }
        row.update({SECTION + k: v for k, v in ((sections[turn] if turn < len(sections) else None) or {}).items()})
        yield row


def _draft_counts(stats: TurnStats | None) -> dict[str, float]:
    """A turn's engine counters: draft tokens proposed and accepted (nan when not recorded)."""
    drafted, accepted = (stats.drafted_tokens, stats.accepted_tokens) if stats is not None else (None, None)
    if not isinstance(drafted, (int, float)) or not isinstance(accepted, (int, float)):
        return {"drafted": float("nan"), "draft_accepted": float("nan")}
    return {"drafted": float(drafted), "draft_accepted": float(accepted)}


def batch_id(batch: Any) -> float:
    """The id of the batch a turn was decoded in, from its `extra.batch` entry (nan: none recorded,
    or a batch of one)."""
    if not isinstance(batch, dict) or batch.get("size", 1) <= 1 or batch.get("id") is None:
        return float("nan")
    return float(batch["id"])


def _float(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _accepts_by_turn(choice: dict[str, Any]) -> list[list[int]]:
    """accept_lengths is one list for all turns; cut it by decoding_steps when they add up,
    else keep it whole on the first turn (the question's totals are what the metrics use)."""
    accept, steps = choice.get("accept_lengths") or [], choice.get("decoding_steps") or []
    turns = len(choice["new_tokens"])
    if len(steps) != turns or sum(steps) != len(accept):
        return [list(accept)] + [[] for _ in range(turns - 1)]
    bounds = np.cumsum([0, *steps])
    return [list(accept[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def per_question(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per method x run x question: its turns summed, and its tokens/s."""
    sums = ["new_tokens", "ref_tokens", "wall_time", "steps", "accepted", "drafted", "draft_accepted"]
    grouped = frame.groupby(["method", "run", "question_id"], sort=True)
    out = grouped[sums].sum(min_count=1).join(grouped[["subtask", SEQUENCE]].first()).reset_index()
    out["tokens_per_s"] = out["new_tokens"] / out["wall_time"]
    out["ref_tokens_per_s"] = out["ref_tokens"] / out["wall_time"]
    return out


def pair_with_baseline(questions: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """`per_question` rows with `base_tokens_per_s`: the baseline's on the same question, from its
    run of the same number (else its first run), and `base_sequence`: the baseline's batch there.
    Questions the baseline lacks are left out."""
    base = questions.loc[questions["method"] == baseline, ["run", "question_id", "ref_tokens_per_s", SEQUENCE]]
    runs = sorted(base["run"].unique())
    partner = questions["run"].where(questions["run"].isin(runs), runs[0] if runs else -1)
    base = base.rename(columns={"run": "base_run", "ref_tokens_per_s": "base_tokens_per_s",
                                SEQUENCE: "base_sequence"})
    return questions.assign(base_run=partner).merge(base, on=["base_run", "question_id"], how="inner")


def measured_rows(frame: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """The frame's rows on the questions each method's speedup uses: those it answered in some run
    where the baseline did too (every run of the method on them, as `speedups` counts)."""
    pairs = pair_with_baseline(per_question(frame), baseline)[["method", "question_id"]].drop_duplicates()
    return frame.merge(pairs, on=["method", "question_id"])


def with_overall(table: pd.DataFrame) -> pd.DataFrame:
    """The rows once under their subtask and once more under "overall"."""
    return pd.concat([table, table.assign(subtask=OVERALL)], ignore_index=True)


def sample_std(values: pd.Series) -> float:
    """Sample standard deviation (ddof=1, as upstream); 0 for a single value."""
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def bootstrap_ratio_ci(ours: np.ndarray, base: np.ndarray, seed: int = 0,
                       clusters: np.ndarray | None = None) -> tuple[float, float]:
    """95% paired bootstrap interval of sum(ours) / sum(base) (the ratio of their means) over questions,
    or over `clusters` (a label per question) resampled whole: the questions of one batch share its
    clock, so their times are one measurement, not several. Below two units: no interval (nan)."""
    if clusters is not None:  # units in order of first appearance: one question a unit draws as without
        units, labels = pd.factorize(np.asarray(clusters))
        ours = np.bincount(units, weights=ours, minlength=len(labels))
        base = np.bincount(units, weights=base, minlength=len(labels))
    return bootstrap_sums(np.column_stack([ours, base]), lambda sums: sums[:, 0] / sums[:, 1], seed)


def bootstrap_sums(table: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray],
                   seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of `statistic` over the column sums of `table`'s rows (one row a unit),
    the rows drawn with replacement BOOTSTRAP_SAMPLES times; `statistic` maps the (samples, columns)
    sums to one value per sample. Below two units: no interval (nan)."""
    if len(table) < 2:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(table), size=(BOOTSTRAP_SAMPLES, len(table)))
    with np.errstate(divide="ignore", invalid="ignore"):  # a baseline without tokens gives no ratio (nan)
        values = statistic(table[idx].sum(axis=1))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def timing_unit(batch: float, question: Any) -> str:
    """What was timed as one: the batch (`batch`: its id, nan where none, see `batch_id`) where the
    question had one, else the question alone."""
    return f"b{batch:g}" if batch == batch else f"q{question}"


def timing_units(batches: Any, questions: Any) -> np.ndarray:
    """A label per question of what was timed as one: its batch (`batches`: the batch ids, nan where
    none) where it had one, else the question alone."""
    return np.array([timing_unit(b, q) for b, q in zip(batches, questions, strict=True)])


def speedups(frame: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """One row per method x subtask (Spec-Bench order, then "overall"), columns METRICS.

    A subtask's questions are those a method answered in some run where the baseline did too;
    #mean accepted tokens, the acceptance rate and tokens/s count every run's answers to them
    (the first two as ratios of sums)."""
    questions = per_question(frame)
    pairs = with_overall(pair_with_baseline(questions, baseline))
    keys = ["method", "subtask"]
    if pairs.empty:
        return pd.DataFrame(columns=METRICS, index=pd.MultiIndex.from_tuples([], names=keys))
    per_run = pairs.groupby([*keys, "run"]).agg(ours=("tokens_per_s", "mean"), base=("base_tokens_per_s", "mean"))
    per_run["speedup"] = (per_run["ours"] / per_run["base"]).where(per_run["base"] > 0)  # no baseline tokens: nan
    runs = per_run.groupby(level=keys)
    out = pd.DataFrame({"speedup": runs["speedup"].mean(), "speedup_std": runs["speedup"].agg(sample_std),
                        "baseline_tokens_per_s": runs["base"].mean(), "runs": runs.size()})
    per_q = pairs.groupby([*keys, "question_id"]).agg(ours=("tokens_per_s", "mean"), base=("base_tokens_per_s", "mean"),
                                                      unit=("base_sequence", "first"))
    ci = {key: bootstrap_ratio_ci(g["ours"].to_numpy(), g["base"].to_numpy(),
                                  clusters=timing_units(g["unit"], g.index.get_level_values("question_id")))
          for key, g in per_q.groupby(level=keys)}
    out["ci_low"] = pd.Series({k: v[0] for k, v in ci.items()})
    out["ci_high"] = pd.Series({k: v[1] for k, v in ci.items()})
    out["questions"] = per_q.groupby(level=keys).size()
    answered = with_overall(questions).merge(per_q.index.to_frame(index=False), on=[*keys, "question_id"])
    sums = answered.groupby(keys)[["accepted", "steps", "drafted", "draft_accepted"]].sum(min_count=1)
    out["mean_accepted"] = sums["accepted"] / sums["steps"]
    out["acceptance_rate"] = (sums["draft_accepted"] / sums["drafted"]).where(sums["drafted"] > 0)
    run_tps = answered.groupby([*keys, "run"])["tokens_per_s"].mean().groupby(level=keys)
    out["tokens_per_s"] = run_tps.mean()
    out["tokens_per_s_std"] = run_tps.agg(sample_std)
    rank = {name: i for i, name in enumerate(ORDER)}
    out = out.sort_index(level=["method", "subtask"], key=lambda idx: idx.map(rank) if idx.name == "subtask" else idx)
    return out[METRICS]
