"""Answer files back into runs: our layout (shards, errors.jsonl), upstream's files, grouping."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.core.answers import ANSWERS, ERRORS, META, read_answers, read_meta
from specbench.core.errors import SpecbenchError

BASELINE = "baseline"
UPSTREAM_BASELINES = ("vanilla", "baseline")


@dataclass
class Run:
    """One answers file (or a run folder's shards merged) and where it came from."""

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
class Group:
    """The runs of one (dataset, model, temperature), by method; `report.analyse` fills the rest."""

    dataset: str
    model: str
    temperature: float
    methods: dict[str, list[Run]]
    results: list[Any] = field(default_factory=list)  # report.MethodResult, best overall speedup first
    problems: list[str] = field(default_factory=list)
    frame: pd.DataFrame | None = None  # frame.tidy: one row per question x turn x method x run
    speedups: pd.DataFrame | None = None  # frame.speedups: one row per method x subtask

    @property
    def title(self) -> str:
        return f"{self.dataset} / {self.model} / temperature {self.temperature:g}"

    def environment(self) -> dict[str, Any]:
        for runs in self.methods.values():
            for run in runs:
                if run.meta and run.meta.get("environment"):
                    return run.meta["environment"]
        return {}


def read_run(folder: Path) -> Run:
    """A run folder (`.../<dataset>/<model>/<method>/temp-<t>/run-<r>`), its shards merged."""
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


def read_upstream(path: Path, model: str) -> Run:
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
                runs.append(read_run(folder))
        elif path.name != ERRORS and "question" not in path.name:
            runs.append(read_upstream(path, upstream_model))
    runs = [r for r in runs if r.records or r.failed or r.problems]
    if not runs:
        raise SpecbenchError(f"no answer files under {root}")
    return runs


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by (dataset, model, temperature); each method's runs sorted by run number."""
    groups: dict[tuple[str, str, float], Group] = {}
    for run in runs:
        key = (run.dataset, run.model, run.temperature)
        group = groups.setdefault(key, Group(run.dataset, run.model, run.temperature, {}))
        group.methods.setdefault(run.method, []).append(run)
    for group in groups.values():
        for method_runs in group.methods.values():
            method_runs.sort(key=lambda r: r.run)
    return [groups[k] for k in sorted(groups)]


def method_facts(runs: list[Run]) -> dict[str, Any]:
    """The method's taxonomy and extra parameters, as recorded in its meta.json (`facts`; answer
    folders written before labels left the resume identity keep them under identity.method)."""
    for run in runs:
        if run.meta:
            method_cfg = run.meta.get("identity", {}).get("method") or {}
            facts = dict(run.meta.get("facts") or method_cfg.get("facts") or {})
            if "extra_parameters" in run.meta:
                facts["extra_parameters"] = run.meta["extra_parameters"]
            return facts
    return {}
