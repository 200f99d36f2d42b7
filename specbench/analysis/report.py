"""Reading answer files back into numbers: grouping, speedups with their noise, audits.

Every metric formula lives here (and in `metrics`), with upstream Spec-Bench's definitions
as the default. Writing tables and figures is left to `leaderboard` and `figures`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbench.analysis import metrics
from specbench.core.answers import ANSWERS, ERRORS, EXTRA_KEY, META, read_answers, read_meta
from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASKS, subtask_of

BASELINE = "baseline"
UPSTREAM_BASELINES = ("vanilla", "baseline")
BOOTSTRAP_SAMPLES = 1000


@dataclass
class Run:
    """One answers file and where it came from."""

    dataset: str
    model: str
    method: str
    temperature: float
    run: int
    records: list[dict[str, Any]]
    meta: dict[str, Any] | None = None
    source: Path | None = None
    failed: dict[int, str] = field(default_factory=dict)  # question id -> reason (errors.jsonl)
    problems: list[str] = field(default_factory=list)


@dataclass
class MethodResult:
    """A method's numbers in one (dataset, model, temperature) group."""

    method: str
    runs: int
    rows: dict[str, dict[str, float]]  # subtask (and "overall") -> metric -> value
    accept_hist: Counter = field(default_factory=Counter)
    depth_acceptance: list[float] | None = None
    time_split: dict[str, float] | None = None
    audit: dict[str, Any] | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Group:
    dataset: str
    model: str
    temperature: float
    methods: dict[str, list[Run]]
    results: list[MethodResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.dataset} / {self.model} / temperature {self.temperature:g}"

    def environment(self) -> dict[str, Any]:
        for runs in self.methods.values():
            for run in runs:
                if run.meta and run.meta.get("environment"):
                    return run.meta["environment"]
        return {}


# ---------------------------------------------------------------- loading


def _our_run(folder: Path) -> Run:
    """A run folder (`.../<method>/temp-<t>/run-<r>`), merging its shards if it has any."""
    shards = sorted(p.parent for p in folder.glob(f"shard-*/{ANSWERS}")) or [folder]
    parts = folder.parts
    run = Run(parts[-5], parts[-4], parts[-3], float(parts[-2].removeprefix("temp-")),
              int(parts[-1].removeprefix("run-")), [], None, folder)
    expected: set[int] = set()
    for part in shards:
        meta = read_meta(part / META) or {}
        run.meta = run.meta or meta or None
        expected.update(meta.get("expected_questions", []))
        run.records += read_answers(part / ANSWERS)
        for row in read_answers(part / ERRORS):
            run.failed[row["question_id"]] = row["error"]
    counts = Counter(r["question_id"] for r in run.records)
    if dupes := sorted(q for q, n in counts.items() if n > 1):
        run.problems.append(f"{folder}: question ids answered more than once (in several shards?): {dupes[:10]}")
        seen: set[int] = set()
        run.records = [r for r in run.records if not (r["question_id"] in seen or seen.add(r["question_id"]))]
    for qid in counts:
        run.failed.pop(qid, None)  # failed once, answered on a later resume
    if missing := sorted(expected - set(counts) - set(run.failed)):
        run.problems.append(
            f"{folder}: INCOMPLETE, {len(missing)} of {len(expected)} expected questions have no answer "
            f"(e.g. {missing[:5]}); run the same command again to finish it (numbers below cover the rest)"
        )
    return run


def _upstream_run(path: Path, model: str) -> Run:
    """An upstream `model_answer/<name>-temperature-<t>.jsonl` file (run from `..._run_<r>/`)."""
    stem = path.stem
    temp = re.search(r"temp(?:erature)?-([0-9.]+)$", stem)
    run = re.search(r"run_(\d+)", path.parent.name)
    method = stem[: temp.start()].rstrip("-") if temp else stem
    if any(tag in method for tag in UPSTREAM_BASELINES):
        method = BASELINE
    dataset = "spec_bench" if "spec_bench" in path.parts else path.parent.name
    return Run(dataset, model, method, float(temp.group(1)) if temp else 0.0, int(run.group(1)) if run else 1,
               read_answers(path), None, path)


def load_runs(root: str | Path, upstream_model: str = "upstream") -> list[Run]:
    """Every answer file under `root`: our layout, and upstream's `*.jsonl` answer files."""
    root = Path(root)
    if not root.exists():
        raise SpecbenchError(f"results folder {root} does not exist; run `python -m specbench run ...` first")
    runs = []
    for path in sorted(root.rglob("*.jsonl")):
        if path.name == ANSWERS:
            folder = path.parent.parent if path.parent.name.startswith("shard-") else path.parent
            if re.fullmatch(r"run-\d+", folder.name) and folder.parent.name.startswith("temp-") and (
                    not runs or runs[-1].source != folder):
                runs.append(_our_run(folder))
        elif path.name != ERRORS and "question" not in path.name:
            runs.append(_upstream_run(path, upstream_model))
    runs = [r for r in runs if r.records or r.failed or r.problems]
    if not runs:
        raise SpecbenchError(f"no answer files under {root}")
    return runs


def group_runs(runs: list[Run]) -> list[Group]:
    groups: dict[tuple[str, str, float], Group] = {}
    for run in runs:
        key = (run.dataset, run.model, run.temperature)
        group = groups.setdefault(key, Group(run.dataset, run.model, run.temperature, {}))
        group.methods.setdefault(run.method, []).append(run)
    for group in groups.values():
        for method_runs in group.methods.values():
            method_runs.sort(key=lambda r: r.run)
    return [groups[k] for k in sorted(groups)]


# ---------------------------------------------------------------- metrics


def token_count(record: dict[str, Any], tokenizer: Any = None) -> int:
    """New tokens of a record: from the token ids (default), or re-tokenised text as upstream's
    speed.py counts the baseline (`len(tokenizer(turn).input_ids) - 1` per turn)."""
    if tokenizer is None:
        return sum(record["choices"][0]["new_tokens"])
    return sum(len(tokenizer(t).input_ids) - 1 for t in record["choices"][0]["turns"])


def _tps(record: dict[str, Any], tokenizer: Any = None) -> float:
    return token_count(record, tokenizer) / sum(record["choices"][0]["wall_time"])


def _subtask_ids(records: list[dict[str, Any]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {"overall": set()}
    for r in records:
        out.setdefault(subtask_of(r["category"]), set()).add(r["question_id"])
        out["overall"].add(r["question_id"])
    return out


def bootstrap_ratio_ci(ours: np.ndarray, base: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval over questions of mean(ours) / mean(base)."""
    if len(ours) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ours), size=(BOOTSTRAP_SAMPLES, len(ours)))
    ratios = ours[idx].mean(axis=1) / base[idx].mean(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def _per_run_speedups(
    method_runs: list[Run], base_runs: list[Run], upstream_tokenizer: Any
) -> tuple[list[dict[str, float]], dict[int, float], dict[int, float]]:
    """Speedup per subtask for each run (paired with the baseline run of the same number,
    else the baseline's first run), and per-question tokens/s averaged over runs."""
    base_by_run = {r.run: r for r in base_runs}
    per_run, ours_q, base_q = [], {}, {}
    counts: Counter = Counter()
    for run in method_runs:
        base = base_by_run.get(run.run, base_runs[0])
        base_tps = {r["question_id"]: _tps(r, upstream_tokenizer) for r in base.records}
        ours_tps = {r["question_id"]: _tps(r) for r in run.records}
        shared = [r for r in run.records if r["question_id"] in base_tps]
        row = {}
        for subtask, ids in _subtask_ids(shared).items():
            row[subtask] = metrics.mean([ours_tps[i] for i in ids]) / metrics.mean([base_tps[i] for i in ids])
        per_run.append(row)
        for r in shared:
            qid = r["question_id"]
            ours_q[qid] = ours_q.get(qid, 0.0) + ours_tps[qid]
            base_q[qid] = base_q.get(qid, 0.0) + base_tps[qid]
            counts[qid] += 1
    return per_run, {q: v / counts[q] for q, v in ours_q.items()}, {q: v / counts[q] for q, v in base_q.items()}


def _rows(
    method_runs: list[Run], base_runs: list[Run], upstream_tokenizer: Any = None
) -> dict[str, dict[str, float]]:
    per_run, ours_q, base_q = _per_run_speedups(method_runs, base_runs, upstream_tokenizer)
    records = [r for run in method_runs for r in run.records if r["question_id"] in ours_q]
    rows = {}
    for subtask, ids in _subtask_ids(records).items():
        ids_sorted = sorted(ids)
        speedups = [row[subtask] for row in per_run if subtask in row]
        low, high = bootstrap_ratio_ci(np.array([ours_q[i] for i in ids_sorted]),
                                       np.array([base_q[i] for i in ids_sorted]))
        steps = [a for r in records if r["question_id"] in ids for a in r["choices"][0]["accept_lengths"]]
        per_run_tps = [
            metrics.mean([_tps(r) for r in run.records if r["question_id"] in ids]) for run in method_runs
        ]
        rows[subtask] = {
            "speedup": metrics.mean(speedups),
            "speedup_std": metrics.std(speedups),
            "ci_low": low,
            "ci_high": high,
            "tokens_per_s": metrics.mean(per_run_tps),
            "tokens_per_s_std": metrics.std(per_run_tps),
            "mean_accepted": metrics.mean(steps),
            "questions": len(ids),
        }
    order = [s for s in SUBTASKS if s in rows] + ["overall"]
    return {s: rows[s] for s in order}


def _time_split(runs: list[Run]) -> dict[str, float] | None:
    """Shares of wall time: prefill, draft, verify, and the rest (bookkeeping)."""
    total = prefill = 0.0
    sections: Counter = Counter()
    for run in runs:
        for r in run.records:
            extra = r.get(EXTRA_KEY, {})
            total += sum(r["choices"][0]["wall_time"])
            prefill += sum(p or 0.0 for p in extra.get("prefill_time", []))
            for part in extra.get("sections", []):
                sections.update(part)
    if not total or not sections:
        return None
    split = {"prefill": prefill / total, **{k: v / total for k, v in sorted(sections.items())}}
    split["other"] = max(0.0, 1.0 - sum(split.values()))
    return split


def depth_acceptance(runs: list[Run]) -> list[float] | None:
    """Per-depth acceptance: of the steps whose draft reached depth d, the share that
    accepted a token at depth d (from the engine's `position_drafted` / `position_accepted`)."""
    drafted: Counter = Counter()
    accepted: Counter = Counter()
    for run in runs:
        for r in run.records:
            for stats in r.get(EXTRA_KEY, {}).get("stats", []):
                for d, (n, a) in enumerate(zip((stats or {}).get("position_drafted", []),
                                               (stats or {}).get("position_accepted", []))):
                    drafted[d] += n
                    accepted[d] += a
    if not drafted:
        return None
    return [accepted[d] / drafted[d] if drafted[d] else 0.0 for d in range(max(drafted) + 1)]


def lossless_audit(method_runs: list[Run], base_runs: list[Run], tie_margin: float) -> dict[str, Any]:
    """Greedy runs only: which answers equal the baseline's token for token; for each
    mismatch the first diverging position and whether the baseline's top-2 logit margin
    there was a numerical near-tie (<= tie_margin) or not (a bug)."""
    base_by_run = {r.run: r for r in base_runs}
    compared = equal = 0
    mismatches = []
    for run in method_runs:
        base = {r["question_id"]: r for r in base_by_run.get(run.run, base_runs[0]).records}
        for record in run.records:
            ref = base.get(record["question_id"])
            if ref is None or EXTRA_KEY not in record or EXTRA_KEY not in ref:
                continue
            compared += 1
            diverge = _first_divergence(record[EXTRA_KEY]["output_ids"], ref[EXTRA_KEY]["output_ids"])
            if diverge is None:
                equal += 1
                continue
            turn, pos = diverge
            ref_stats = ref[EXTRA_KEY].get("stats") or []
            margins = ((ref_stats[turn] or {}).get("top2_margin") or []) if turn < len(ref_stats) else []
            margin = margins[pos] if pos < len(margins) else None
            mismatches.append({
                "run": run.run, "question_id": record["question_id"], "turn": turn, "position": pos,
                "margin": margin, "near_tie": margin is not None and margin <= tie_margin,
            })
    return {"compared": compared, "equal": equal, "mismatches": mismatches, "tie_margin": tie_margin}


def _first_divergence(ours: list[list[int]], ref: list[list[int]]) -> tuple[int, int] | None:
    for turn, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return turn, pos
    return None


def method_facts(runs: list[Run]) -> dict[str, Any]:
    """The method's taxonomy and extra parameters, as recorded in its meta.json."""
    for run in runs:
        if run.meta:
            method_cfg = run.meta.get("identity", {}).get("method") or {}
            facts = dict(method_cfg.get("facts") or {})
            if "extra_parameters" in run.meta:
                facts["extra_parameters"] = run.meta["extra_parameters"]
            return facts
    return {}


def analyse(group: Group, *, tie_margin: float = 0.05, upstream_tokenizer: Any = None) -> Group:
    """Fill `group.results` (sorted by overall speedup) and `group.problems`.

    Questions that failed for any method are left out for every method alike."""
    failed = {qid: reason for runs in group.methods.values() for run in runs for qid, reason in run.failed.items()}
    for runs in group.methods.values():
        for run in runs:
            group.problems += run.problems
            group.problems += [f"{run.source}: question {q} failed: {why}" for q, why in sorted(run.failed.items())]
            run.records = [r for r in run.records if r["question_id"] not in failed]
    if failed:
        group.problems.append(f"{group.title}: {len(failed)} failed question(s) excluded from every method's numbers")
    models = {run.meta.get("identity", {}).get("model") for runs in group.methods.values() for run in runs
              if run.meta} - {None}
    if len(models) > 1:
        group.problems.append(f"{group.title}: answers of different models ({', '.join(sorted(models))}) are mixed "
                              "in one folder; keep each model's answers in its own folder. Not reported.")
        return group
    for runs in group.methods.values():
        for run in runs:
            if len(ids := {r.get("model_id") for r in run.records}) > 1:
                group.problems.append(f"{run.source}: one answer file holds several model_ids {sorted(map(str, ids))}")
    base_runs = [run for run in group.methods.get(BASELINE, []) if run.records]
    if not base_runs:
        group.problems.append(
            f"{group.title}: no baseline answers, so no speedups; run `python -m specbench run method=baseline` "
            f"with the same model, dataset and temperature"
        )
        return group
    for name, runs in group.methods.items():
        result = MethodResult(name, len(runs), _rows(runs, base_runs, upstream_tokenizer))
        result.accept_hist = Counter(a for run in runs for r in run.records for a in r["choices"][0]["accept_lengths"])
        result.depth_acceptance = depth_acceptance(runs)
        result.time_split = _time_split(runs)
        result.facts = method_facts(runs)
        if group.temperature == 0 and name != BASELINE:
            result.audit = lossless_audit(runs, base_runs, tie_margin)
        group.results.append(result)
    group.results.sort(key=lambda r: -r.rows["overall"]["speedup"])
    return group
