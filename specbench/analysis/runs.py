"""Answer files back into runs: our layout (shards, errors.jsonl), upstream's files, grouping."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.analysis.records import check_failures, check_meta, check_records
from specbench.core.answers import ANSWERS, ERRORS, EXTRA_KEY, META, read_answers, read_meta
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
    skipped: str | None = None  # why its files could not be read: then it holds nothing and counts nowhere
    part_metas: list[dict[str, Any]] = field(default_factory=list)  # the meta of each part (shards) read
    batch: int = 1  # questions decoded together (the folder's batch-<B> level; 1 without it)
    length: int | None = None  # long inputs: first turns of about this many tokens (the folder's len-<N> level)
    unverified: str | None = None  # why what made its answers cannot be checked (a folder without meta.json)


@dataclass
class Group:
    """The runs of one (dataset, model, temperature, batch size, input length), by method; `report.analyse`
    fills the rest."""

    dataset: str
    model: str
    temperature: float
    methods: dict[str, list[Run]]
    batch: int = 1
    length: int | None = None  # long inputs (length=N): first turns of about N tokens; None: the questions as they are
    reference: list[Run] | None = None  # batched groups: the batch-1 baseline's runs (the lossless audit's reference)
    results: list[Any] = field(default_factory=list)  # report.MethodResult, best overall speedup first
    problems: list[str] = field(default_factory=list)
    frame: pd.DataFrame | None = None  # frame.tidy: one row per question x turn x method x run
    notes: list[str] = field(default_factory=list)  # caveats on sound numbers (measured under contention)
    speedups: pd.DataFrame | None = None  # frame.speedups: one row per method x subtask
    #: `report --beside`: a <method>-fixed run's method with its draft budget on (budget=auto), from a job
    #: of its own (report.MethodResult of that job, against that job's baseline)
    beside: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, float, int, int | None]:
        return self.dataset, self.model, self.temperature, self.batch, self.length

    @property
    def title(self) -> str:
        batch = f" / batch size {self.batch}" if self.batch > 1 else ""
        length = f" / inputs of about {self.length} tokens" if self.length is not None else ""
        return f"{self.dataset} / {self.model} / temperature {self.temperature:g}{batch}{length}"

    def environment(self) -> dict[str, Any]:
        for runs in self.methods.values():
            for run in runs:
                if run.meta and run.meta.get("environment"):
                    return run.meta["environment"]
        return {}


def read_run(folder: Path) -> Run:
    """A run folder (`.../<dataset>/<model>/<method>/temp-<t>/[len-<N>/][batch-<B>/]run-<r>`): its own
    answers file and its shards' merged. A folder with any unreadable file is left out whole (`Run.skipped`)."""
    parts = list(folder.absolute().parts)  # `report .` inside a method folder still knows its dataset and model
    batch, length = 1, None
    if re.fullmatch(r"batch-\d+", parts[-2]):
        batch = int(parts.pop(-2).removeprefix("batch-"))
    if re.fullmatch(r"len-\d+", parts[-2]):
        length = int(parts.pop(-2).removeprefix("len-"))
    temperature = _float(parts[-2].removeprefix("temp-"), math.nan)
    run = Run(parts[-5], parts[-4], parts[-3], temperature, int(parts[-1].removeprefix("run-")), [], None, folder,
              batch=batch, length=length)
    if math.isnan(temperature):
        return _skip(run, f"{folder}: '{parts[-2]}' is not temp-<number> (e.g. temp-0.7); rename the folder")
    try:
        _read_parts(run, folder)
    except SpecbenchError as exc:
        return _skip(run, str(exc))
    return run


def _read_parts(run: Run, folder: Path) -> None:
    shards = sorted(p.parent for p in folder.glob(f"shard-*/{ANSWERS}"))
    parts = [folder, *shards] if (folder / ANSWERS).exists() or not shards else shards
    expected: set[int] = set()
    answers: list[tuple[Path, list[dict[str, Any]]]] = []
    for part in parts:
        meta = _meta(part / META)
        run.meta = run.meta or meta or None
        run.part_metas.append(meta)
        expected.update(meta.get("expected_questions", []))
        answers.append((part / ANSWERS, _records(part / ANSWERS)))
        try:
            run.failed.update(_failures(part / ERRORS))
        except SpecbenchError as exc:  # the answers are still good: only the list of failures is lost
            run.problems.append(f"{exc}; until then the questions it lists as failed are not excluded from the "
                                "other methods' numbers")
        if torn := _torn_tail(part / ANSWERS):
            run.problems.append(torn)
    run.records, copies = merge_answers(answers, folder)
    check_identities(run, folder)
    if copies:
        run.problems.append(f"{folder}: {copies} answer(s) stored twice, identically (e.g. shard files copied into "
                            f"{ANSWERS}); each counted once")
    answered = {r["question_id"] for r in run.records}
    for qid in answered:
        run.failed.pop(qid, None)  # failed once, answered on a later resume
    if missing := sorted(expected - answered - set(run.failed)):
        run.problems.append(
            f"{folder}: INCOMPLETE, {len(missing)} of {len(expected)} expected questions have no answer "
            f"(e.g. {missing[:5]}); run the same command again to finish it (numbers below cover the rest)"
        )


def check_identities(run: Run, folder: Path) -> None:
    """Answers of two runs in one folder (records of different identity hashes, or records whose hash
    is not their meta.json's) leave the run out (raised); answers without a meta.json are marked
    unverified: nothing says which model, settings and questions made them."""
    hashes = {(r.get(EXTRA_KEY) or {}).get("identity") for r in run.records} - {None}
    metas = {m.get("identity_hash") for m in run.part_metas if m} - {None}
    if len(hashes) > 1 or (hashes and metas and not hashes <= metas):
        raise SpecbenchError(
            f"{folder}: answers of {len(hashes | metas)} different runs are mixed (identities "
            f"{', '.join(sorted(hashes | metas))}); left out: rerun it into a new folder or with overwrite=true"
        )
    if run.records and not any(run.part_metas):
        run.unverified = "no meta.json"
        run.problems.append(f"{folder}: UNVERIFIED, answers without a meta.json: which model, settings and questions "
                            "made them cannot be checked (its rows are marked); rerun it to have them verified")


def merge_answers(files: list[tuple[Path, list[dict[str, Any]]]], where: Path) -> tuple[list[dict[str, Any]], int]:
    """One record per question from several answer files (a run folder's own file and its shards):
    a record stored twice unchanged counts once (returned: how many such copies); two different
    answers to one question are refused, since a question is measured once per run and the
    report cannot know which measurement counts."""
    first: dict[int, tuple[dict[str, Any], Path]] = {}
    copies = 0
    for path, records in files:
        for record in records:
            qid = record["question_id"]
            if qid not in first:
                first[qid] = (record, path)
            elif first[qid][0] == record:
                copies += 1
            else:
                raise SpecbenchError(
                    f"{where}: question {qid} has two different answers ({first[qid][1]} and {path}); a run measures "
                    "each question once: delete the answer that should not count"
                )
    return [record for record, _ in first.values()], copies


def _skip(run: Run, reason: str) -> Run:
    """`run` emptied and marked: named among the problems, left out of every number."""
    run.records, run.failed, run.meta, run.skipped = [], {}, None, reason
    run.problems = [f"{reason}; this run is left out of the report"]
    return run


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return check_records(read_answers(path), path)
    except OSError as exc:
        raise SpecbenchError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _failures(path: Path) -> dict[int, str]:
    try:
        return check_failures(read_answers(path), path)
    except OSError as exc:
        raise SpecbenchError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _meta(path: Path) -> dict[str, Any]:
    meta = read_meta(path)  # a SpecbenchError naming the file when it is not a JSON object
    return {} if meta is None else check_meta(meta, path)


def _torn_tail(path: Path) -> str | None:
    """A last line without its newline: a write cut short (the reader drops it)."""
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) == 0:
                return None
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
    except OSError:
        return None
    return f"{path}: the last line is cut short (a killed write?) and is left out; run the same command " \
           "again to redo that question" if torn else None


def read_upstream(path: Path, model: str) -> Run:
    """An upstream `model_answer/<name>-temperature-<t>.jsonl` file (run from `..._run_<r>/`)."""
    stem = path.stem
    temp = re.search(r"temp(?:erature)?-([0-9.]+)$", stem)
    run = re.search(r"run_(\d+)", path.parent.name)
    method = stem[: temp.start()].rstrip("-") if temp else stem
    if any(tag in method for tag in UPSTREAM_BASELINES):
        method = BASELINE
    dataset = "spec_bench" if "spec_bench" in path.parts else path.parent.name
    found = Run(dataset, model, method, _float(temp.group(1)) if temp else 0.0, int(run.group(1)) if run else 1,
                [], None, path)
    try:
        found.records, copies = merge_answers([(path, _records(path))], path)
    except SpecbenchError as exc:
        return _skip(found, str(exc))
    if copies:
        found.problems.append(f"{path}: {copies} answer(s) stored twice, identically; each counted once")
    if torn := _torn_tail(path):
        found.problems.append(torn)
    return found


def _float(text: str, default: float = 0.0) -> float:
    try:
        return float(text)
    except ValueError:  # e.g. "0.0.1"
        return default


def load_runs(root: str | Path, upstream_model: str = "upstream") -> list[Run]:
    """Every answer file under `root`: our layout, and upstream's `*.jsonl` answer files. A file
    that cannot be read is named among its run's problems and left out (`Run.skipped`); when
    nothing readable is left, that is an error."""
    root = Path(root)
    if not root.exists():
        raise SpecbenchError(f"results folder {root} does not exist; run `python -m specbench run ...` first")
    if not root.is_dir():
        raise SpecbenchError(f"results path {root} is a file; give the folder that holds the answer files")
    runs = []
    for path in sorted(root.rglob("*.jsonl")):
        if path.name == ANSWERS:
            folder = path.parent.parent if path.parent.name.startswith("shard-") else path.parent
            parent = folder.parent
            for level in (r"batch-\d+", r"len-\d+"):  # the optional levels between temp-<t> and run-<r>
                parent = parent.parent if re.fullmatch(level, parent.name) else parent
            if re.fullmatch(r"run-\d+", folder.name) and parent.name.startswith("temp-") and (
                    not runs or runs[-1].source != folder):
                runs.append(read_run(folder))
        elif path.name != ERRORS and "question" not in path.name:
            runs.append(read_upstream(path, upstream_model))
    runs = [r for r in runs if r.records or r.failed or r.problems]
    if not runs:
        raise SpecbenchError(f"no answer files under {root}")
    if all(r.skipped for r in runs):
        more = f" (and {len(runs) - 1} more unreadable)" if len(runs) > 1 else ""
        raise SpecbenchError(f"no readable answer files under {root}: {runs[0].skipped}{more}")
    return runs


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by (dataset, model, temperature, batch size, input length); each method's runs sorted by
    run number."""
    groups: dict[tuple[str, str, float, int, int | None], Group] = {}
    for run in runs:
        key = (run.dataset, run.model, run.temperature, run.batch, run.length)
        group = groups.setdefault(key, Group(run.dataset, run.model, run.temperature, {}, batch=run.batch,
                                             length=run.length))
        group.methods.setdefault(run.method, []).append(run)
    for group in groups.values():
        for method_runs in group.methods.values():
            method_runs.sort(key=lambda r: r.run)
    for (dataset, model, temperature, batch, length), group in groups.items():
        if batch > 1 and (single := groups.get((dataset, model, temperature, 1, length))) is not None:
            group.reference = single.methods.get(BASELINE)
    return [groups[k] for k in sorted(groups, key=lambda k: (*k[:4], -1 if k[4] is None else k[4]))]


def method_facts(runs: list[Run]) -> dict[str, Any]:
    """The method's taxonomy and extra parameters, as recorded in its meta.json (`facts`; answer
    folders written before labels left the resume identity keep them under identity.method)."""
    for run in runs:
        if run.meta:
            method_cfg = (run.meta.get("identity") or {}).get("method") or {}
            facts = dict(run.meta.get("facts") or method_cfg.get("facts") or {})
            if "extra_parameters" in run.meta:
                facts["extra_parameters"] = run.meta["extra_parameters"]
            return facts
    return {}


def run_contention(run: Run) -> dict[str, Any] | None:
    """How much other processes loaded the machine while the run was measured (meta `contention`,
    the most loaded of its shards) when that was flagged; None for a clean or unmeasured run."""
    found = [meta.get("contention") for meta in run.part_metas]
    flagged = [c for c in found if isinstance(c, dict) and c.get("flagged") is True]
    if not flagged:
        return None
    cores = [c["busy_other_cores"] for c in flagged if isinstance(c.get("busy_other_cores"), (int, float))]
    reasons = [r for c in flagged for r in c.get("reasons") or [] if isinstance(r, str)]
    threshold = next((c["threshold"] for c in flagged if isinstance(c.get("threshold"), (int, float))), None)
    return {"run": run.run, "other_cores": max(cores) if cores else None, "threshold": threshold, "reasons": reasons}


def method_memory(runs: list[Run]) -> dict[str, Any] | None:
    """A method's measured memory (meta `memory`): the largest phase peak over its runs and shards,
    how it was measured, and the drafter's own weights; None when no run measured it."""
    peaks: list[tuple[int, str]] = []
    drafter = None
    for meta in (m for run in runs for m in run.part_metas):
        memory = meta.get("memory")
        if not isinstance(memory, dict):
            continue
        if isinstance(peak := memory.get("peak_bytes"), int) and not isinstance(peak, bool) and peak > 0:
            peaks.append((peak, str(memory.get("measured_by") or "")))
        drafted = memory.get("drafter")
        weights = drafted.get("weights_bytes") if isinstance(drafted, dict) else None
        if isinstance(weights, int) and not isinstance(weights, bool) and weights >= 0:
            drafter = weights
    if not peaks and drafter is None:
        return None
    peak, how = max(peaks) if peaks else (None, None)
    return {"peak_bytes": peak, "measured_by": how, "drafter_bytes": drafter}


def method_heads(runs: list[Run]) -> list[str]:
    """One provenance line per published or outside head a method's runs loaded (meta `heads`: what
    `method.head` named, the format and variant recognised, the weight file's sha256); the zoo's and a
    kit's own parts are named by their fingerprints elsewhere (weights_origin) and left out."""
    from specbench.core.origin import head_line

    lines: dict[str, None] = {}
    for meta in (m for run in runs for m in run.part_metas):
        for record in meta.get("heads") or []:
            if isinstance(record, dict) and {"head", "format", "variant", "file", "sha256"} <= set(record) \
                    and record.get("source") != "built":
                lines[head_line(record)] = None
    return list(lines)
