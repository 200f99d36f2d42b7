"""The runner: questions -> answer files, for any backend (specbench.run.backend).

It plans the lanes (one per method run), opens them (identity checked, answers already there kept,
meta written), lets the methods answer the questions in turn, writes each record as it comes and
reports the outcome. The backend computes and measures; the runner owns the files. Re-running the
same command resumes. The summary printed after a run is read back from the answer files
(specbench.analysis.summary).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.core import questions as data
from specbench.core.answers import (
    ANSWERS,
    ERRORS,
    EXTRA_KEY,
    META,
    AnswerWriter,
    locked,
    read_answers,
    read_meta,
    repair_torn_tail,
    run_dir,
    write_meta,
)
from specbench.core.errors import SpecbenchError
from specbench.core.files import find_only
from specbench.core.longinput import parse_length
from specbench.core.record import stamp
from specbench.models import RESOLVED
from specbench.run.backend import Backend, MethodRun, backend_class
from specbench.run.config import SHUFFLED, check_values, selected_subtasks
from specbench.run.dataset import check_writable, load_dataset, long_inputs
from specbench.run.interrupts import interrupt_flag
from specbench.run.prepare import FIND_ONLY, prepare_parts
from specbench.run.provenance import comparable_identity, identity_hash, question_fingerprint
from specbench.run.shards import shard, shard_dir


@dataclass
class Outcome:
    """What one method run did (answers written, questions failed, where)."""

    label: str
    folder: Path
    todo: int
    kept: int = 0  # answers already there (a resumed run)
    written: int = 0
    failed: int = 0
    first_error: str = ""


@dataclass
class Lane:
    """One method run being answered: its folder, what is left to answer, what it has done."""

    method: MethodRun
    run: int
    folder: Path
    todo: list[data.Question]
    meta: dict[str, Any]
    previous: dict[str, Any] | None  # the meta of the part answered before (a resumed run)
    outcome: Outcome
    tokens: float = 0.0
    seconds: float = 0.0

    def rate(self) -> str:
        return f"{self.tokens / self.seconds:.1f} tok/s" if self.seconds else "-"


@dataclass
class RunResult:
    """What a run did, for the summary (which reads the answers back from `folder`'s files)."""

    cfg: DictConfig  # as the backend filed it
    batch_size: int
    questions: list[int]  # this shard's question ids
    labels: list[str] = field(default_factory=list)  # the method runs' names, as filed
    outcomes: list[Outcome] = field(default_factory=list)

    def folder(self, label: str, run: int) -> Path:
        c = self.cfg
        folder = run_dir(c.output_dir, c.dataset.name, c.model.name, label, float(c.temperature), run,
                         self.batch_size, parse_length(c.get("length")))
        return folder / shard_dir(c.shard) if c.shard else folder

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]


class Runner:
    """One `specbench run`: the questions, the backend, the method runs over the questions."""

    def __init__(self, cfg: DictConfig, backend: type | None = None) -> None:
        check_values(cfg)
        self.cls = backend or backend_class(cfg)
        cfg = self.cls.filed_config(cfg)
        subtasks = selected_subtasks(cfg.task)
        self.dataset = load_dataset(cfg.dataset)
        self.all_questions = data.select(self.dataset, subtasks, cfg.limit)
        self.questions = shard(self.all_questions, cfg.shard)
        if not self.questions:
            raise SpecbenchError(f"no questions of task {subtasks} in {cfg.dataset.path}")
        check_writable(Path(cfg.output_dir))
        self.cfg = cfg
        self.phases = self.cls.plan(cfg)  # composed and resolved once, here
        self.result = RunResult(cfg, int(cfg.get("batch_size", 1)), [q.question_id for q in self.questions])
        self.interrupted = lambda: False

    def run(self) -> RunResult:
        """Every part the run names built first (`prepare_parts`); then every phase of the job (its
        methods answering in turn), `runs` times each, where resolving a path only finds. One Ctrl-C
        ends the run at the next question boundary, whichever phase it falls in."""
        RESOLVED.clear()  # what this run resolves (its meta's weights_origin), not an earlier run's of the process
        prepare_parts(self.cls.parts(self.cfg, self.phases))
        if (tokens := parse_length(self.cfg.get("length"))) is not None:  # long inputs: the model's tokens
            self.questions = long_inputs(self.cfg, self.questions, self.dataset, tokens)
        self.question_ids = {q.question_id: question_fingerprint(q) for q in self.questions}  # as answered
        with find_only(FIND_ONLY), interrupt_flag() as interrupted:
            self.interrupted = interrupted
            self.backend: Backend = self.cls(self.cfg, self.questions)
            for phase in self.phases:
                methods = self.backend.open(phase)
                self.result.labels.extend(m.label for m in methods)
                for run in range(1, int(self.cfg.runs) + 1):
                    folders = [self.result.folder(m.label, run) for m in methods]
                    with contextlib.ExitStack() as stack:
                        for folder in folders:
                            stack.enter_context(locked(folder))
                        lanes = [lane for m, f in zip(methods, folders, strict=True)
                                 if (lane := self.open_lane(m, run, f)) is not None]
                        if lanes:
                            self.run_lanes(lanes)
        return self.result

    def open_lane(self, method: MethodRun, run: int, folder: Path) -> Lane | None:
        """One method run's folder made ready (its meta written, answers already there kept), or None
        when it holds every answer. Answers of another config are never mixed in."""
        if self.cfg.overwrite and folder.exists():
            shutil.rmtree(folder)
        identity, hashed = method.identity, identity_hash(method.identity)
        before = read_meta(folder / META)
        stored = comparable_identity(before.get("identity")) if before is not None else None
        if before is not None and stored != identity:
            changed = sorted(k for k in identity if (stored or {}).get(k) != identity[k])
            raise SpecbenchError(f"{folder} holds answers made with a different config ({', '.join(changed)} differ); "
                                 f"{KEEP_BOTH}")
        kept = read_answers(folder / ANSWERS, repair=True)
        check_records(folder, kept, hashed, self.question_ids, meta=before is not None)
        done = {r["question_id"] for r in kept}
        repair_torn_tail(folder / ERRORS)  # a torn error row would glue onto the next one
        todo = self.backend.todo(method, [q for q in self.questions if q.question_id not in done])
        label = f"{method.label} run {run}" + (f" shard {self.cfg.shard}" if self.cfg.shard else "")
        outcome = Outcome(label, folder, len(todo), len(done))
        self.result.outcomes.append(outcome)
        if not todo:
            print(f"{label}: all {len(self.questions)} answers already in {folder}", file=sys.stderr)
            return None
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"identity": identity, "identity_hash": hashed, "facts": method.facts,
                "config": OmegaConf.to_container(self.cfg, resolve=True), **self.backend.lane_meta(method),
                "expected_questions": [q.question_id for q in self.all_questions],  # all shards together
                "started": time.time()}
        write_meta(folder / META, meta)
        return Lane(method, run, folder, todo, meta, before if done else None, outcome)

    def run_lanes(self, lanes: list[Lane]) -> None:
        phase = {"schedule": str(self.cfg.get("schedule") or "interleaved"), "id": uuid.uuid4().hex[:12],
                 "lanes": [lane.method.label for lane in lanes],  # the method runs timed in turn with this one
                 "lane_order": self.lane_order()}
        for lane in lanes:
            lane.meta["phase"] = phase
        if self.interrupted():
            raise interruption(lanes)
        try:
            with self.backend.phase(lanes):  # set up and warmed up; measured around the answers
                write_metas(lanes)  # what the set-up learned (a server's command, ...), before the answers
                for lane in lanes:
                    if lane.outcome.kept:
                        print(f"{lane.outcome.label}: resuming, {lane.outcome.kept} answers kept, {len(lane.todo)} "
                              "to go", file=sys.stderr)
                self.answer_all(lanes)
        except BaseException:
            write_metas(lanes, failing=True)
            raise
        write_metas(lanes)  # with what the phase measured

    def lane_order(self) -> str:
        return str(self.cfg.get("lane_order") or SHUFFLED)

    def answer_all(self, lanes: list[Lane]) -> None:
        """Answer each lane's `todo`, one flushed line each. Several lanes take turns question by
        question (batch by batch), in the order `turn_orders` gives (each order followed by its
        reverse), so a drift of the machine's speed falls on all of them alike. A failing question
        becomes a row in errors.jsonl and the run goes on; Ctrl-C (seen at the next question
        boundary, the last one included) keeps what was written, says so and ends the whole run."""
        few = len(lanes) <= 4
        desc = " + ".join(lane.outcome.label for lane in lanes) if few else f"{len(lanes)} method runs in turn"
        bar = tqdm(total=sum(len(lane.todo) for lane in lanes), desc=desc, unit="q", disable=not self.cfg.progress,
                   file=sys.stderr)
        size = self.backend.questions_per_call
        try:
            with contextlib.ExitStack() as stack:
                turns = [(lane, stack.enter_context(AnswerWriter(lane.folder / ANSWERS))) for lane in lanes]
                starts = range(0, max(len(lane.todo) for lane in lanes), size)
                orders = turn_orders(len(turns), len(starts), self.lane_order(), int(self.cfg.seed), lanes[0].run)
                for start, order in zip(starts, orders, strict=True):
                    self.backend.tick()
                    for lane, writer in (turns[k] for k in order):
                        if self.interrupted():
                            raise KeyboardInterrupt
                        if group := lane.todo[start : start + size]:
                            self.answer_group(lane, group, writer)
                            bar.update(len(group))
                            if few:
                                bar.set_postfix_str(" | ".join(f"{x.method.label} {x.rate()}" for x in lanes))
            if self.interrupted():
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            bar.close()
            raise interruption(lanes) from None
        bar.close()
        for lane in lanes:
            outcome = lane.outcome
            if outcome.failed == outcome.todo and not outcome.kept:  # not one answer: something is broken
                raise SpecbenchError(
                    f"{outcome.label}: all {outcome.failed} questions failed (first: {outcome.first_error}); "
                    f"the reasons are in {outcome.folder / ERRORS}"
                )
            if outcome.failed:
                print(f"{outcome.label}: {outcome.failed} question(s) failed, listed in {outcome.folder / ERRORS}",
                      file=sys.stderr)

    def answer_group(self, lane: Lane, group: list[data.Question], writer: AnswerWriter) -> None:
        """One timed call of a lane (a question, or a batch) written, or its failure recorded."""
        outcome = lane.outcome
        try:
            records = self.backend.answer(lane.method, group)
        except Exception as exc:  # noqa: BLE001 - any failure of one question (batch) is recorded
            if self.backend.failed(exc) or self.cfg.on_error == "raise":
                raise
            for question in group:
                outcome.failed += 1
                reason = self.record_error(lane, question, exc)
                outcome.first_error = outcome.first_error or f"question {question.question_id}: {reason}"
            return
        for record in records:
            # what a resume checks, meta or not: the run's identity and the question as it was asked
            record[EXTRA_KEY].update(identity=lane.meta["identity_hash"],
                                     question=self.question_ids[record["question_id"]])
            writer.write(stamp(record, str(self.cfg.model.name), lane.method.label, lane.run))
            outcome.written += 1
            lane.tokens += sum(record["choices"][0]["new_tokens"])
            lane.seconds += sum(record["choices"][0]["wall_time"])

    @staticmethod
    def record_error(lane: Lane, question: data.Question, exc: Exception) -> str:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(f"question {question.question_id} failed: {reason}", file=sys.stderr)
        with AnswerWriter(lane.folder / ERRORS) as errors:
            errors.write({"question_id": question.question_id, "category": question.category,
                          "method": lane.method.label, "run": lane.run, "error": reason, "tstamp": time.time()})
        return reason


def write_metas(lanes: list[Lane], failing: bool = False) -> None:
    """Each lane's meta as it is now; on the way out of a failing run, a meta that cannot be written
    is left as it was (the run's own error tells more)."""
    for lane in lanes:
        try:
            write_meta(lane.folder / META, lane.meta)
        except SpecbenchError:
            if not failing:
                raise


def interruption(lanes: list[Lane]) -> KeyboardInterrupt:
    for lane in lanes:
        o = lane.outcome
        print(f"\n{o.label}: interrupted after {o.written} of {o.todo} questions; the answers so far are saved in "
              f"{o.folder}; run the same command again to resume", file=sys.stderr)
    return KeyboardInterrupt()


def turn_orders(lanes: int, turns: int, how: str, seed: int, run: int) -> list[list[int]]:
    """The order in which `lanes` lanes answer at each of `turns` turns. Every even turn's order is
    followed by its reverse, so that a steady drift of the machine's speed charges every lane the
    same over the two. `alternating`: the lanes' own order, then its reverse, and so on: each lane
    always runs right after the same neighbour (whatever a lane leaves behind, in the allocator or
    the caches, falls on the same lane every time). `shuffled` (the default): each pair of turns
    draws its order at random, seeded by the run's seed and run number (the same orders on a
    rerun), so what a lane leaves behind falls on every other lane in turn."""
    rng = random.Random(f"lane-order:{seed}:{run}")
    orders: list[list[int]] = []
    for i in range(turns):
        if i % 2:
            orders.append(orders[-1][::-1])
        else:
            order = list(range(lanes))
            if how == SHUFFLED:
                rng.shuffle(order)
            orders.append(order)
    return orders


def run(cfg: DictConfig) -> RunResult:
    """`python -m specbench run`: the run's backend (configs/backend/) answers the questions."""
    return Runner(cfg).run()


#: how to go on when a folder holds answers this run may not resume
KEEP_BOTH = "use overwrite=true to replace them or output_dir=... to keep both"


def check_records(folder: Path, records: list[dict[str, Any]], expected: str, questions: dict[int, str], *,
                  meta: bool) -> None:
    """Answers already in `folder` are resumed only when each carries this run's identity hash and its
    question is the one this run asks (`questions`: id -> fingerprint): a record of another identity (its
    meta.json edited or replaced), of a question edited since, or, without meta.json, a record that cannot
    tell (written before records carried it) is a one-line refusal, never a guess."""
    for record in records:
        extra = record.get(EXTRA_KEY) or {}
        asked, qid = extra.get("question"), record.get("question_id")
        if asked is not None and qid in questions and asked != questions[qid]:
            raise SpecbenchError(f"{folder} holds an answer to question {qid} as it was asked before (the question "
                                 f"file was edited or replaced since); {KEEP_BOTH}")
        found = extra.get("identity")
        if found == expected:
            continue
        if found is None and meta:
            continue  # written before records carried the hash; its meta.json's identity was checked above
        why = (f"holds answers without a meta.json and without their run's identity (question "
               f"{record.get('question_id')}), so what made them cannot be told" if found is None else
               f"holds answers of another run (question {record.get('question_id')}: identity {found}, this run "
               f"{expected}){'' if meta else '; its meta.json is missing'}")
        raise SpecbenchError(f"{folder} {why}; {KEEP_BOTH}")
