"""The session: questions -> prompts -> method (timed) -> answer files.

It owns timing and I/O; methods only compute. Re-running the same command resumes. The
summary printed after a run comes from `specbench.analysis` (the cli asks for it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import shutil
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
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
from specbench.core.files import write_atomic
from specbench.core.origin import summary as origin_summary
from specbench.core.prompts import prompt_ids
from specbench.core.resources import CONFIG_DIR
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria, answer_text
from specbench.core.timing import Timer, Timing, timer_for
from specbench.engine.api import GenerationResult, Method, Request, Requests
from specbench.engine.batch import batch_problem
from specbench.engine.budget import BUDGET_MODES
from specbench.engine.precision import measure_spread
from specbench.engine.target import model_context
from specbench.models import RESOLVED, load_model, resolve_device, resolve_dtype
from specbench.run.config import BOTH, SEQUENTIAL, check_values, compose_method, in_run, selected_subtasks
from specbench.run.interrupts import interrupt_flag
from specbench.run.monitor import ContentionGuard, MemoryProbe, drafter_memory, resumed
from specbench.run.provenance import comparable_identity, environment, identity, weights_fingerprint
from specbench.run.registry import build_method, method_label
from specbench.run.shards import shard, shard_dir


def load_dataset(dataset_cfg: DictConfig) -> list[data.Question]:
    """The dataset's questions. A generated dataset (`generator: module:function` in its config,
    called with the seed, returning question dicts) is written to its path first, but never over
    a different file already there: that is somebody's own question file."""
    path = Path(dataset_cfg.path)
    if dataset_cfg.get("generator"):
        write_generated(dataset_cfg, path)
    elif not path.exists():
        raise SpecbenchError(
            f"question file {path} not found; run `python -m specbench data fetch` (or `make data`) to download it"
        )
    return data.load_questions(path)


def write_generated(dataset_cfg: DictConfig, path: Path) -> None:
    module, _, function = str(dataset_cfg.generator).partition(":")
    try:
        generate = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise SpecbenchError(f"dataset {dataset_cfg.name}: generator '{dataset_cfg.generator}' cannot be imported; "
                             "write it as module:function") from None
    text = data.questions_jsonl(generate(int(dataset_cfg.seed)))
    if path.is_file():
        if path.read_bytes() == text.encode("utf-8"):
            return
        raise SpecbenchError(
            f"{path} exists and is not the {dataset_cfg.name} set of seed {dataset_cfg.seed}; to run that file use "
            f"dataset=spec_bench dataset.path={path}, to regenerate the {dataset_cfg.name} set remove it or choose "
            "another dataset.path=..."
        )
    write_atomic(path, text)


def check_writable(folder: Path, need_bytes: int = 50 << 20) -> None:
    """Fail before the model loads when answers could not be saved."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise SpecbenchError(
            f"results folder {folder} is not writable ({exc.strerror or exc}); choose another with output_dir=..."
        ) from None
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise SpecbenchError(
            f"only {free >> 20} MiB free under {folder}; free some space or choose another output_dir=..."
        )


@dataclass
class Outcome:
    """What one method run of a session did (answers written, questions failed, where)."""

    label: str
    folder: Path
    todo: int
    kept: int = 0  # answers already there (a resumed run)
    written: int = 0
    failed: int = 0
    first_error: str = ""


#: what `budget=auto` learns, and from what (engine.loop, engine.budget)
BUDGET_LEARNS = ("the cost curve (target forward time against rows verified) is measured once per device, model, "
                 "dtype and batch size and cached; the acceptance model (how often a node of each depth and rank, "
                 "at each draft confidence, is accepted) starts empty at the run's start, learns from every verdict "
                 "of the warm-up passes and the questions in order, and is kept across questions; each method run "
                 "has its own, so other methods in the job do not change it")


@dataclass
class Lane:
    """One method run being answered: its folder, what is left to answer, what it has done."""

    method: Method
    name: str
    run: int
    folder: Path
    todo: list[data.Question]
    meta: dict[str, Any]
    previous: dict[str, Any] | None  # the meta of the part answered before (a resumed run)
    outcome: Outcome
    tokens: float = 0.0
    seconds: float = 0.0
    working: int | None = None  # the largest transient memory peak over its own calls (None: not measured)
    steps: int = 0  # decoding steps with a draft, and the nodes verified / proposed over them (the budget's record)
    verified: int = 0
    proposed: int = 0
    budgeted: int = 0  # steps whose verified nodes the draft budget chose (budget=auto)

    def count_budget(self, record: dict[str, Any]) -> None:
        for stats in record[EXTRA_KEY].get("stats") or []:
            if not isinstance(stats, dict) or "draft_lengths" not in stats:
                continue
            self.steps += len(stats["draft_lengths"])
            self.verified += sum(stats["draft_lengths"])
            if stats.get("proposed_lengths"):
                self.budgeted += len(stats["proposed_lengths"])
                self.proposed += sum(stats["proposed_lengths"])

    def budget_record(self) -> dict[str, Any]:
        """What the draft budget did in this part of the run (meta `budget`)."""
        mode = self.meta["identity"]["method"].get("budget")  # the lane's own (the run-wide budget= applied)
        out: dict[str, Any] = {"mode": mode, "steps": self.steps,
                               "mean_verified_nodes": self.verified / self.steps if self.steps else None}
        if self.budgeted:
            out.update(mean_proposed_nodes=self.proposed / self.budgeted, learned=BUDGET_LEARNS)
        return out

    def rate(self) -> str:
        return f"{self.tokens / self.seconds:.1f} tok/s" if self.seconds else "-"


class Session:
    """One `specbench run`: the target loaded once, the methods run over the questions."""

    def __init__(self, cfg: DictConfig) -> None:
        check_values(cfg)
        self.cfg = cfg
        self.subtasks = selected_subtasks(cfg.task)
        self.all_questions = data.select(load_dataset(cfg.dataset), self.subtasks, cfg.limit)
        self.questions = shard(self.all_questions, cfg.shard)
        if not self.questions:
            raise SpecbenchError(f"no questions of task {self.subtasks} in {cfg.dataset.path}")
        check_writable(Path(cfg.output_dir))
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        device = resolve_device(cfg.device)
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # CUDA events (the timer, the budget's clock) record on this device's stream
        self.guard = ContentionGuard(cfg.contention_threshold, device)  # from here: "before" the first run
        dtype = resolve_dtype(cfg.model.dtype or cfg.dtype, device)
        self.sampling = SamplingParams(float(cfg.temperature), float(cfg.top_p), int(cfg.top_k))
        self.target = load_model(
            cfg.model.path, device=device, dtype=dtype, trust_remote_code=bool(cfg.model.trust_remote_code)
        )
        self.stop = StopCriteria.build(
            self.target.eos_ids, int(cfg.max_new_tokens), cfg.model.stop_strings, self.target.tokenizer.decode
        )
        self.timer: Timer = timer_for(device)
        self.context = model_context(self.target.model.config)
        if self.context is not None and int(cfg.max_new_tokens) >= self.context:
            raise SpecbenchError(
                f"max_new_tokens={cfg.max_new_tokens} does not fit the context of {cfg.model.path} "
                f"({self.context} positions for prompt and answer together); use max_new_tokens=... below "
                f"{self.context} (longer prompts get the rest of the context, noted per answer)"
            )
        self.batch_size = int(cfg.batch_size)
        if self.batch_size > 1 and (problem := batch_problem(self.target)) is not None:
            raise SpecbenchError(f"batch_size={self.batch_size}: {cfg.model.path} cannot decode batches ({problem}); "
                                 "run it with batch_size=1")
        self.interrupted: Callable[[], bool] = lambda: False  # `run` sets the Ctrl-C flag
        self.outcomes: list[Outcome] = []
        self.labels: list[str] = []  # the method runs' names, as filed (<name>-fixed under budget=fixed)
        self.memory = MemoryProbe(device)
        self.resident: dict[str, int] = {}  # the loaded method runs' resident bytes (their growth when built)
        self.precision: dict[str, Any] | None = None  # measure_spread's record, once per session (meta `precision`)

    def run_dir(self, method_name: str, run: int) -> Path:
        c = self.cfg
        folder = run_dir(c.output_dir, c.dataset.name, c.model.name, method_name, float(c.temperature), run,
                         self.batch_size)
        return folder / shard_dir(c.shard) if c.shard else folder

    def run_methods(self, method_cfgs: list[DictConfig]) -> None:
        """Every run of these methods, answering the questions in turn (one lane each; `answer_all`);
        under the run-wide `budget=both`, a method with a draft budget is two lanes, `auto` and
        `fixed`."""
        cfgs = []
        for method_cfg in method_cfgs:
            both = self.cfg.get("budget") == BOTH and "budget" in method_cfg
            cfgs += [with_run_budget(method_cfg, b) for b in (BUDGET_MODES if both else (self.cfg.get("budget"),))]
        methods, self.resident = [], {}
        for c in cfgs:  # each method's resident memory: what building it added (drafter, heads, datastore)
            before = self.memory.current()
            methods.append(build_method(c, self.target, self.cfg.model))
            after = self.memory.current()
            weights = drafter_memory(methods[-1], self.target)["weights_bytes"]
            grew = after - before if after is not None and before is not None else 0
            self.resident[method_label(c)] = max(grew, weights)
        self.labels.extend(method_label(c) for c in cfgs)
        self.measure_precision()
        for method, c in zip(methods, cfgs, strict=True):
            if self.batch_size > 1 and method.batch_problem is not None:
                raise SpecbenchError(f"method '{c.name}' cannot run batched: {method.batch_problem}; run it with "
                                     "batch_size=1")
            method.prepare(self.batch_size)  # untimed: e.g. the draft budget's cost curve for this device
        for run in range(1, int(self.cfg.runs) + 1):
            self.run_once(list(zip(methods, cfgs, strict=True)), run)

    def measure_precision(self) -> None:
        """Untimed, once: how far this dtype on this device moves the target's top-2 logit gaps between
        one-row and multi-row forwards (engine.precision), over the first turn of the first two
        questions; printed, and written to every lane's meta as `precision`."""
        tokens = int(self.cfg.get("precision_probe", 0) or 0)
        if self.precision is not None or tokens < 2:
            return
        prompts = []
        for question in self.questions[:2]:
            ids = self.prompt(question, 0, [])
            if self.context is None or len(ids) + tokens <= self.context:
                prompts.append(torch.tensor([ids]))
        if not prompts:
            return
        self.precision = measure_spread(self.target, prompts, new_tokens=tokens)
        p = self.precision
        print(f"precision: {p['dtype']} on {p['device']}: one-row vs multi-row forwards move a top-2 logit gap by up "
              f"to {p['spread']:.3g} ({p['positions']} positions over {len(p['shapes'])} shapes, {p['flips']} argmax "
              f"flips, {p['seconds']:.1f} s)", file=sys.stderr)

    def run_once(self, pairs: list[tuple[Method, DictConfig]], run: int) -> None:
        folders = [self.run_dir(method_label(c), run) for _, c in pairs]
        with contextlib.ExitStack() as stack:
            for folder in folders:
                stack.enter_context(locked(folder))
            self._run_once([(m, c, run, f) for (m, c), f in zip(pairs, folders, strict=True)])

    def open_lane(self, method: Method, method_cfg: DictConfig, run: int, folder: Path) -> Lane | None:
        """One method run's folder made ready (its meta written, answers already there kept), or None
        when it holds every answer."""
        ident = identity(self.cfg, method_cfg, self.target.dtype)
        self.prepare(folder, ident)
        done = {r["question_id"] for r in read_answers(folder / ANSWERS, repair=True)}
        repair_torn_tail(folder / ERRORS)  # a torn error row would glue onto the next one
        todo = method.stream([q for q in self.questions if q.question_id not in done])
        name = method_label(method_cfg)
        label = f"{name} run {run}" + (f" shard {self.cfg.shard}" if self.cfg.shard else "")
        if not todo:
            print(f"{label}: all {len(self.questions)} answers already in {folder}", file=sys.stderr)
            return None
        folder.mkdir(parents=True, exist_ok=True)
        previous = read_meta(folder / META) if done else None
        meta = {
            "identity": ident,
            "facts": OmegaConf.to_container(method_cfg.facts, resolve=True) if method_cfg.get("facts") else {},
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "environment": environment(self.target),
            "target_parameters": sum(p.numel() for p in self.target.model.parameters()),
            "target_weights": weights_fingerprint(self.target.path),
            # shipped, published or trained here (the zoo's folders): their fingerprint (specbench.core.origin)
            "weights_origin": origin_summary(RESOLVED),
            "extra_parameters": method.extra_parameters(),
            "expected_questions": [q.question_id for q in self.all_questions],  # all shards together
            "started": time.time(),
        }
        if self.precision is not None:
            meta["precision"] = self.precision
        write_meta(folder / META, meta)
        return Lane(method, name, run, folder, todo, meta, previous, Outcome(label, folder, len(todo), len(done)))

    def _run_once(self, plans: list[tuple[Method, DictConfig, int, Path]]) -> None:
        lanes = [lane for plan in plans if (lane := self.open_lane(*plan)) is not None]
        if not lanes:
            return
        phase = {"schedule": str(self.cfg.get("schedule") or "interleaved"), "id": uuid.uuid4().hex[:12],
                 "lanes": [lane.name for lane in lanes]}  # the method runs timed in turn with this one
        for lane in lanes:
            lane.meta["phase"] = phase
        for lane in lanes:
            lane.method.reset()
        if self.interrupted():
            raise self.interruption(*[lane.outcome for lane in lanes])
        memory = self.memory
        memory.start()
        for lane in lanes:
            for _ in range(int(self.cfg.warmup)):
                if self.batch_size > 1:
                    self.answer_batch(lane.method, self.questions[: self.batch_size], self.questions[0].question_id)
                else:
                    self.answer(lane.method, self.questions[0])
            lane.method.start_stream()
            if lane.outcome.kept:
                print(f"{lane.outcome.label}: resuming, {lane.outcome.kept} answers kept, {len(lane.todo)} to go",
                      file=sys.stderr)
        before = self.guard.before()
        self.guard.start()
        try:
            self.answer_all(lanes)
        except BaseException:
            with contextlib.suppress(Exception):  # e.g. a broken CUDA context: the run's own error tells more
                during, peak = self.guard.stop(), memory.stop()
                for lane in lanes:
                    self.write_measurements(lane, before, during, peak, failing=True)
            raise
        during, peak = self.guard.stop(), memory.stop()  # the phase's, once; each lane's own peak from it
        for lane in lanes:
            self.write_measurements(lane, before, during, peak)

    def write_measurements(
        self, lane: Lane, before: dict[str, Any], during: dict[str, Any], peak: dict[str, Any],
        failing: bool = False,
    ) -> None:
        """The meta again, with what the timed run measured besides its answers: contention (other
        processes' load before and during it; a resumed run stays flagged when an earlier part was)
        and memory (the phase's peak, the drafter's weights). Warns when the run was contended. On
        the way out of a failing run, a meta that cannot be written is left as it was."""
        meta, label = lane.meta, lane.outcome.label
        try:
            contention = self.guard.summary(before, during)
            measured = self.memory.per_run(peak, self.resident, lane.name, lane.working)
            resumed(contention, measured, lane.previous)
            measured["drafter"] = drafter_memory(lane.method, self.target)
        except Exception:  # noqa: BLE001 - e.g. a broken CUDA context: the run's own error tells more
            if failing:
                return
            raise
        meta.update(contention=contention, memory=measured, budget=lane.budget_record(), finished=time.time())
        if contention["flagged"]:
            why = "; ".join(contention["reasons"]) or "an earlier part of this resumed run was"
            print(f"warning: {label}: measured under contention: {why} (threshold {contention['threshold']:g} "
                  "cores); `report` marks its numbers; run it again on a quiet machine for clean ones", file=sys.stderr)
        try:
            write_meta(lane.folder / META, meta)
        except OSError:
            if not failing:
                raise

    def prepare(self, folder: Path, ident: dict[str, Any]) -> None:
        """Start over when asked; refuse to mix answers of another config into a folder."""
        if self.cfg.overwrite and folder.exists():
            shutil.rmtree(folder)
        meta = read_meta(folder / META)
        stored = comparable_identity(meta.get("identity")) if meta is not None else None
        if meta is not None and stored != ident:
            changed = sorted(k for k in ident if (stored or {}).get(k) != ident[k])
            raise SpecbenchError(
                f"{folder} holds answers made with a different config ({', '.join(changed)} differ); "
                "use overwrite=true to replace them or output_dir=... to keep both"
            )

    def answer_all(self, lanes: list[Lane]) -> None:
        """Answer each lane's `todo`, one flushed line each. Several lanes (`budget=both`,
        `interleave=[...]`) take turns question by question (batch by batch), their order reversed
        every other turn, so a drift of the machine's speed falls on all of them alike. A failing
        question becomes a row in errors.jsonl and the run goes on; Ctrl-C (seen at the next
        question boundary, the last one included) keeps what was written, says so and ends the
        whole run."""
        self.outcomes.extend(lane.outcome for lane in lanes)
        few = len(lanes) <= 4
        desc = " + ".join(lane.outcome.label for lane in lanes) if few else f"{len(lanes)} method runs in turn"
        bar = tqdm(total=sum(len(lane.todo) for lane in lanes), desc=desc, unit="q", disable=not self.cfg.progress,
                   file=sys.stderr)
        size = self.batch_size  # questions per timed call: one, a static batch, or a continuous one's queue
        if size > 1 and self.cfg.batch_mode == "continuous":
            size *= int(self.cfg.batch_queue)
        try:
            with contextlib.ExitStack() as stack:
                writers = [stack.enter_context(AnswerWriter(lane.folder / ANSWERS)) for lane in lanes]
                turns = list(zip(lanes, writers, strict=True))
                for i, start in enumerate(range(0, max(len(lane.todo) for lane in lanes), size)):
                    self.guard.tick()  # a question (batch) boundary: contention counters, no waiting
                    for lane, writer in turns if i % 2 == 0 else turns[::-1]:
                        if self.interrupted():
                            raise KeyboardInterrupt
                        group = lane.todo[start : start + size]
                        if group:
                            self.answer_group(lane, group, writer)
                            bar.update(len(group))
                            if few:
                                bar.set_postfix_str(" | ".join(f"{x.name} {x.rate()}" for x in lanes))
            if self.interrupted():
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            bar.close()
            raise self.interruption(*[lane.outcome for lane in lanes]) from None
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
        held = self.memory.call_start()
        try:
            if self.batch_size > 1:
                records = self.answer_batch(lane.method, group, group[0].question_id)
            else:
                records = [self.answer(lane.method, group[0])]
            if (rose := self.memory.call_end(held)) is not None:
                lane.working = max(lane.working or 0, rose)
        except Exception as exc:  # noqa: BLE001 - any failure of one question (batch) is recorded
            if self.cfg.on_error == "raise":
                raise
            for question in group:
                outcome.failed += 1
                reason = self.record_error(lane.folder, question, lane.name, lane.run, exc)
                outcome.first_error = outcome.first_error or f"question {question.question_id}: {reason}"
            return
        for record in records:
            record.update(model_id=self.cfg.model.name, answer_id=uuid.uuid4().hex, tstamp=time.time())
            record[EXTRA_KEY].update(method=lane.name, run=lane.run)
            writer.write(record)
            lane.count_budget(record)
            outcome.written += 1
            lane.tokens += sum(record["choices"][0]["new_tokens"])
            lane.seconds += sum(record["choices"][0]["wall_time"])

    @staticmethod
    def interruption(*outcomes: Outcome) -> KeyboardInterrupt:
        for outcome in outcomes:
            print(f"\n{outcome.label}: interrupted after {outcome.written} of {outcome.todo} questions; the answers "
                  f"so far are saved in {outcome.folder}; run the same command again to resume", file=sys.stderr)
        return KeyboardInterrupt()

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    def record_error(self, folder: Path, question: data.Question, name: str, run: int, exc: Exception) -> str:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(f"question {question.question_id} failed: {reason}", file=sys.stderr)
        with AnswerWriter(folder / ERRORS) as errors:
            errors.write({"question_id": question.question_id, "category": question.category,
                          "method": name, "run": run, "error": reason, "tstamp": time.time()})
        return reason

    def answer(self, method: Method, question: data.Question) -> dict[str, Any]:
        """Generate every turn of one question; returns the upstream-format record."""
        torch.manual_seed(int(self.cfg.seed))  # upstream: torch.manual_seed(choice index)
        method.start_question()  # the answer depends on this question alone (Method.start_question)
        answer = Answer(question)
        for j in range(len(question.turns)):
            ids = self.prompt(question, j, answer.texts)
            stop = self.stop_for(len(ids))
            input_ids = torch.tensor([ids], device=self.target.device)
            self.timer.start()
            state = method.prefill(input_ids, self.sampling)
            self.timer.mark("prefill")
            result = method.decode(state, self.sampling, stop, self.timer)
            timing = self.timer.stop()
            check_result(method, result)
            prefill = timing.marks["prefill"] if method.splits_prefill else None
            answer.texts.append(self.answer_text(result.tokens))
            answer.add_turn(ids, stop, result, timing.total, prefill, timing.sections)
        return answer.record()

    def answer_batch(self, method: Method, questions: list[data.Question], batch_id: int) -> list[dict[str, Any]]:
        """Generate the questions with `batch_size` rows decoded together.

        continuous (`batch_mode`): one timed sequence for all of them; a row that stops frees its
        slot for the next prompt waiting, and a finished first turn queues the question's next
        turn (its prompt built from its own answer). static: turn by turn, each turn's prompts
        one batch (so second turns are batched with second turns), one timed sequence per turn.

        An answer's wall_time (and prefill time, sections) is its share of its sequence's, in
        proportion to its tokens: summed over answers they give the sequence's time, and tokens
        / seconds is the batch's throughput. `extra.batch` keeps, per turn, the sequence's own
        numbers and when the turn was queued, admitted into a row and finished (seconds from the
        sequence's start); its latency is finished - admitted (the wait before is queueing)."""
        torch.manual_seed(int(self.cfg.seed))
        method.start_question()
        answers = [Answer(q) for q in questions]
        continuous = self.cfg.batch_mode == "continuous"
        for turn in [None] if continuous else range(max(len(q.turns) for q in questions)):
            queue = TurnQueue(self, method, follow_up=continuous)
            self.timer.start()
            for answer in answers:
                if turn is None or len(answer.question.turns) > turn:
                    queue.add(answer, turn or 0, at_start=True)
            method.generate_batch(queue, self.batch_size, self.sampling, self.timer)
            timing = self.timer.stop()
            queue.settle(timing, {"id": batch_id, "size": self.batch_size, "mode": str(self.cfg.batch_mode),
                                  "questions": len(questions)})
        return [a.record() for a in answers]

    def prompt(self, question: data.Question, turn: int, texts: list[str]) -> list[int]:
        return prompt_ids(self.cfg.model.template, self.target.tokenizer, question.turns[: turn + 1], texts)

    def stop_for(self, prompt_tokens: int) -> StopCriteria:
        """The stop rules of one turn: max_new_tokens, cut to what the context leaves after the
        prompt (the same cut for every method, since all see the same prompt)."""
        if self.context is None or prompt_tokens + self.stop.max_new_tokens <= self.context:
            return self.stop
        room = self.context - prompt_tokens
        if room < 1:
            raise SpecbenchError(f"prompt of {prompt_tokens} tokens does not fit the model's context of {self.context}")
        return dataclasses.replace(self.stop, max_new_tokens=room)

    def answer_text(self, tokens: list[int]) -> str:
        """The answer as text: EOS dropped, cut at a stop string, stripped (as upstream)."""
        return answer_text(tokens, self.target.tokenizer.decode, self.stop.eos_ids, self.cfg.model.stop_strings)


def check_result(method: Method, result: GenerationResult) -> None:
    if len(result.tokens) != 1 + sum(result.accept_lengths):
        raise RuntimeError(f"{type(method).__name__} returned tokens that its accept_lengths do not add up to")


class TurnQueue(Requests):
    """The runner's side of a batched method call: the prompts waiting and what came back.

    The clock belongs to the runner: it marks when each prompt was queued and when its answer
    came back on the method's timer, and `settle` turns the finished turns into answer records."""

    def __init__(self, session: Session, method: Method, follow_up: bool) -> None:
        self.session, self.method, self.follow_up = session, method, follow_up
        self.waiting: deque[Request] = deque()
        self.done: list[tuple[Request, GenerationResult]] = []
        self.queued_at_start: set[str] = set()

    @staticmethod
    def label(answer: Answer, turn: int) -> str:
        return f"{answer.question.question_id}/{turn}"

    def add(self, answer: Answer, turn: int, at_start: bool = False) -> None:
        session = self.session
        ids = session.prompt(answer.question, turn, answer.texts)
        stop = session.stop_for(len(ids))
        key = (answer, turn, ids)
        self.waiting.append(Request(key, torch.tensor([ids], device=session.target.device), stop))
        if at_start:
            self.queued_at_start.add(self.label(answer, turn))
        else:
            session.timer.mark(f"queued {self.label(answer, turn)}")

    def pop(self) -> Request | None:
        if not self.waiting:
            return None
        request = self.waiting.popleft()
        answer, turn, _ = request.key
        self.session.timer.mark(f"admitted {self.label(answer, turn)}")  # the method takes it into a row now
        return request

    def finished(self, request: Request, result: GenerationResult) -> None:
        answer, turn, _ = request.key
        self.session.timer.mark(f"done {self.label(answer, turn)}")
        check_result(self.method, result)
        answer.texts.append(self.session.answer_text(result.tokens))
        self.done.append((request, result))
        if self.follow_up and len(answer.question.turns) > turn + 1:
            self.add(answer, turn + 1)

    def settle(self, timing: Timing, batch: dict[str, Any]) -> None:
        if self.waiting:
            raise RuntimeError(f"the method left {len(self.waiting)} prompt(s) of the batch unanswered")
        tokens = sum(len(result.tokens) for _, result in self.done)
        sections = dict(timing.sections)
        prefill = sections.pop("prefill", 0.0)
        info = {**batch, "wall_time": timing.total, "tokens": tokens, "prefill_time": prefill}
        for request, result in sorted(self.done, key=lambda d: d[0].key[1]):  # each answer's turns in order
            answer, turn, ids = request.key
            label = self.label(answer, turn)
            share = len(result.tokens) / tokens
            queued = 0.0 if label in self.queued_at_start else timing.marks[f"queued {label}"]
            answer.add_turn(ids, request.stop, result, timing.total * share, prefill * share,
                            {k: v * share for k, v in sections.items()})
            admitted, finished = timing.marks[f"admitted {label}"], timing.marks[f"done {label}"]
            answer.extra.setdefault("batch", []).append(
                {**info, "queued": queued, "admitted": admitted, "finished": finished, "latency": finished - admitted})


class Answer:
    """One question's answer record (upstream format plus our extras), built turn by turn."""

    EXTRA_KEYS = ("output_ids", "prompt_tokens", "prefill_time", "sections", "stats", "max_new_tokens")

    def __init__(self, question: data.Question) -> None:
        self.question = question
        self.texts: list[str] = []
        self.choice: dict[str, list[Any]] = {k: [] for k in ("turns", "decoding_steps", "new_tokens", "wall_time")}
        self.accept: list[int] = []
        self.extra: dict[str, list[Any]] = {k: [] for k in self.EXTRA_KEYS}

    def add_turn(self, ids: list[int], stop: StopCriteria, result: GenerationResult, seconds: float,
                 prefill: float | None, sections: dict[str, float]) -> None:
        """Record a turn whose text is already the last of `texts`."""
        self.choice["turns"].append(self.texts[len(self.choice["turns"])])
        self.choice["decoding_steps"].append(len(result.accept_lengths))
        self.choice["new_tokens"].append(len(result.tokens))
        self.choice["wall_time"].append(seconds)
        self.accept.extend(result.accept_lengths)
        for key, value in zip(self.EXTRA_KEYS, (result.tokens, len(ids), prefill, sections, result.stats,
                                                stop.max_new_tokens), strict=True):
            self.extra[key].append(value)

    def record(self) -> dict[str, Any]:
        q = self.question
        return {
            "question_id": q.question_id,
            "category": q.category,
            "choices": [{"index": 0, **self.choice, "accept_lengths": self.accept}],
            EXTRA_KEY: {"subtask": q.subtask, **self.extra},
        }


def with_run_budget(method_cfg: DictConfig, budget: str | None) -> DictConfig:
    """The run-wide `budget=auto|fixed` applied to a method with a draft budget (its `budget` key);
    other methods (the baseline) and `budget=null` keep their config."""
    if budget is None or "budget" not in method_cfg:
        return method_cfg
    return OmegaConf.merge(method_cfg, {"budget": budget})


def run(cfg: DictConfig) -> Session:
    """`python -m specbench run`: the baseline (unless baseline=false), the method and the methods of
    `interleave=[...]`, all in turn question by question (`schedule=interleaved`, the default), or
    one after another, the baseline first (`schedule=sequential`). One Ctrl-C ends the run at the next
    question boundary, whichever phase it falls in."""
    RESOLVED.clear()  # what this run resolves, not an earlier run's of the process (multirun, library use)
    session = Session(cfg)
    plan = [in_run(cfg, cfg.method)]  # `${parts:...}` resolved against the run's model, lanes alike
    for name in cfg.get("interleave") or []:
        if name not in {m.name for m in plan}:
            plan.append(in_run(cfg, compose_method(name)))
    if cfg.baseline and all(m.name != "baseline" for m in plan):
        plan.insert(0, OmegaConf.load(CONFIG_DIR / "method" / "baseline.yaml"))
    with interrupt_flag() as interrupted:
        session.interrupted = interrupted
        if cfg.get("schedule") == SEQUENTIAL:
            for method_cfg in plan:
                session.run_methods([method_cfg])
        else:
            session.run_methods(plan)  # one phase: every method in turn, question by question
    return session
