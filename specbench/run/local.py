"""The local backend: specbench's own draft-then-verify engine on a Hugging Face model.

It loads the target once, builds the methods, probes the dtype's precision, and answers the
runner's questions with its own clock (CUDA events on a GPU, perf counters on a CPU), one question
at a time or in batches (a continuous batch's turn queue); around each phase it measures the
machine's contention and the memory (specbench.run.monitor)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core import questions as data
from specbench.core.errors import SpecbenchError
from specbench.core.origin import summary as origin_summary
from specbench.core.prompts import prompt_ids
from specbench.core.record import AnswerRecord, Turn, TurnStats, turn_stats
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
from specbench.run.config import BOTH, SEQUENTIAL, compose_method, in_run
from specbench.run.monitor import ContentionGuard, MemoryProbe, drafter_memory, resumed
from specbench.run.provenance import environment, identity, parts_identity, weights_fingerprint
from specbench.run.registry import build_method, method_label

#: what `budget=auto` learns, and from what (engine.loop, engine.budget)
BUDGET_LEARNS = ("the cost curve (target forward time against rows verified) is measured once per device, model, "
                 "dtype and batch size and cached; the acceptance model (how often a node of each depth and rank, "
                 "at each draft confidence, is accepted) starts empty at the run's start, learns from every verdict "
                 "of the warm-up passes and the questions in order, and is kept across questions; each method run "
                 "has its own, so other methods in the job do not change it")


@dataclass
class LocalMethod:
    """A method built on the loaded target, with what its timed calls measured."""

    method: Method
    cfg: DictConfig
    label: str
    identity: dict[str, Any]
    facts: dict[str, Any]
    working: int | None = None  # the largest transient memory peak over its own calls (None: not measured)
    steps: int = 0  # decoding steps with a draft, and the nodes verified / proposed over them (the budget's record)
    verified: int = 0
    proposed: int = 0
    budgeted: int = 0  # steps whose verified nodes the draft budget chose (budget=auto)

    def count_budget(self, stats: TurnStats) -> None:
        if stats.draft_lengths is None:
            return
        self.steps += len(stats.draft_lengths)
        self.verified += sum(stats.draft_lengths)
        if stats.proposed_lengths:
            self.budgeted += len(stats.proposed_lengths)
            self.proposed += sum(stats.proposed_lengths)

    def budget_record(self) -> dict[str, Any]:
        """What the draft budget did in this part of the run (meta `budget`)."""
        out: dict[str, Any] = {"mode": self.identity["method"].get("budget"), "steps": self.steps,
                               "mean_verified_nodes": self.verified / self.steps if self.steps else None}
        if self.budgeted:
            out.update(mean_proposed_nodes=self.proposed / self.budgeted, learned=BUDGET_LEARNS)
        return out


def warmup_passes(questions: int, batch_size: int) -> int:
    """Untimed passes over a run's first batch before its clock starts: enough to answer `warmup`
    questions (upstream Spec-Bench: 3 passes over one question). A pass of batch size B answers B
    questions at once (every shape and allocation of the timed batches, the budget's first
    evidence), so ceil(warmup / B) passes: 3 at batch size 1, 2 at 2, 1 from 3 on. Three passes of
    16 questions took 11 of the 20 minutes of a 15-lane run at batch size 16 on 2 cores."""
    return -(-questions // batch_size)


class LocalBackend:
    """`backend=local`: the target loaded once, the methods run on it (specbench.run.backend)."""

    @staticmethod
    def filed_config(cfg: DictConfig) -> DictConfig:
        return cfg

    def __init__(self, cfg: DictConfig, questions: list[data.Question]) -> None:
        self.cfg, self.questions = cfg, questions
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
        self.questions_per_call = self.batch_size  # one, a static batch, or a continuous one's queue
        if self.batch_size > 1 and cfg.batch_mode == "continuous":
            self.questions_per_call *= int(cfg.batch_queue)
        self.memory = MemoryProbe(device)
        self.resident: dict[str, int] = {}  # the loaded method runs' resident bytes (their growth when built)
        self.precision: dict[str, Any] | None = None  # measure_spread's record, once per run (meta `precision`)

    # -- what runs -------------------------------------------------------------------------------

    @staticmethod
    def plan(cfg: DictConfig) -> list[list[DictConfig]]:
        """The baseline (unless baseline=false), the method and the methods of `interleave=[...]`, all
        in one phase (`schedule=interleaved`, the default), or one after another, the baseline first
        (`schedule=sequential`); each method's config resolved against the run's (once: what it is
        built from)."""
        plan = [in_run(cfg, cfg.method)]  # `${parts:...}` resolved against the run's model, lanes alike
        for name in cfg.get("interleave") or []:
            if name not in {m.name for m in plan}:
                plan.append(in_run(cfg, compose_method(name)))
        if cfg.baseline and all(m.name != "baseline" for m in plan):
            plan.insert(0, OmegaConf.load(CONFIG_DIR / "method" / "baseline.yaml"))
        return [[m] for m in plan] if cfg.get("schedule") == SEQUENTIAL else [plan]

    @staticmethod
    def parts(cfg: DictConfig, phases: list[list[DictConfig]]) -> list[str]:
        """The target, and every path the methods' settings name (their facts aside); the model's draft
        where a method leaves its `draft` empty (it then reads the model's: methods.drafts.load_draft)."""
        return [spec for m in (m for phase in phases for m in phase) for spec in method_parts(cfg, m)] or [
            str(cfg.model.path)]

    def open(self, phase: list[DictConfig]) -> list[LocalMethod]:
        """The phase's methods built on the target (under the run-wide `budget=both`, a method with a
        draft budget twice, `auto` and `fixed`), each one's resident memory measured, the precision
        probed once, and each prepared for the batch size (untimed)."""
        cfgs = []
        for method_cfg in phase:
            both = self.cfg.get("budget") == BOTH and "budget" in method_cfg
            cfgs += [with_run_budget(method_cfg, b) for b in (BUDGET_MODES if both else (self.cfg.get("budget"),))]
        opened, self.resident = [], {}
        for c in cfgs:  # each method's resident memory: what building it added (drafter, heads, datastore)
            before = self.memory.current()
            method = build_method(c, self.target, self.cfg.model, resolved=True)
            after = self.memory.current()
            weights = drafter_memory(method, self.target)["weights_bytes"]
            grew = after - before if after is not None and before is not None else 0
            self.resident[method_label(c)] = max(grew, weights)
            facts = OmegaConf.to_container(c.facts, resolve=True) if c.get("facts") else {}
            ident = identity(self.cfg, c, self.target.dtype, parts_identity(method_parts(self.cfg, c)))
            opened.append(LocalMethod(method, c, method_label(c), ident, facts))
        self.measure_precision()
        longest = self.longest_context() if any(getattr(m.method, "budget_mode", None) == "auto"
                                                for m in opened) else None
        for m in opened:
            if self.batch_size > 1 and m.method.batch_problem is not None:
                raise SpecbenchError(f"method '{m.cfg.name}' cannot run batched: {m.method.batch_problem}; run it "
                                     "with batch_size=1")
            m.method.prepare(self.batch_size, longest)  # untimed: e.g. the draft budget's cost curve for this device
        return opened

    def longest_context(self) -> int:
        """About the most cached positions a step of this run reaches: the longest question's prompt with
        all its turns' text, and max_new_tokens for each turn's answer, within the model's context."""
        longest = max((len(self.prompt(q, len(q.turns) - 1, [""] * (len(q.turns) - 1)))
                       + len(q.turns) * self.stop.max_new_tokens for q in self.questions), default=0)
        return min(longest, self.context) if self.context else longest

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

    def lane_meta(self, m: LocalMethod) -> dict[str, Any]:
        meta = {
            "environment": environment(self.target),
            "target_parameters": sum(p.numel() for p in self.target.model.parameters()),
            "target_weights": weights_fingerprint(self.target.path),
            # shipped, published or trained here (the zoo's folders): their fingerprint (specbench.core.origin)
            "weights_origin": origin_summary(RESOLVED),
            "extra_parameters": m.method.extra_parameters(),
        }
        if heads := m.method.provenance():  # where each loaded head came from: format, variant, sha256
            meta["heads"] = heads
        if self.precision is not None:
            meta["precision"] = self.precision
        return meta

    def todo(self, m: LocalMethod, questions: list[data.Question]) -> list[data.Question]:
        return m.method.stream(questions)

    # -- a phase ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, lanes: list[Any]) -> Iterator[None]:
        """Every method reset and warmed up (`warmup_passes` over the first question, or batch), then
        the timed answers; after them, into each lane's meta: the warm-up, the contention (other
        processes' load before and during the phase; a resumed run stays flagged when an earlier part
        was), the memory (the phase's peak, the drafter's weights) and what the draft budget did."""
        for lane in lanes:
            lane.method.method.reset()
        self.memory.start()
        first = self.questions[: self.batch_size]
        passes = warmup_passes(int(self.cfg.warmup), self.batch_size)
        for lane in lanes:
            began = time.perf_counter()
            for _ in range(passes):
                self.answer_some(lane.method.method, first)
            lane.method.method.start_stream()
            lane.meta["warmup"] = {"passes": passes, "questions": passes * len(first),
                                   "seconds": round(time.perf_counter() - began, 3)}
        before = self.guard.before()
        self.guard.start()
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # e.g. a broken CUDA context: the run's own error tells more
                during, peak = self.guard.stop(), self.memory.stop()
                for lane in lanes:
                    self.measurements(lane, before, during, peak)
            raise
        during, peak = self.guard.stop(), self.memory.stop()  # the phase's, once; each lane's own peak from it
        for lane in lanes:
            self.measurements(lane, before, during, peak)

    def measurements(self, lane: Any, before: dict[str, Any], during: dict[str, Any], peak: dict[str, Any]) -> None:
        m: LocalMethod = lane.method
        contention = self.guard.summary(before, during)
        measured = self.memory.per_run(peak, self.resident, m.label, m.working)
        resumed(contention, measured, lane.previous)
        measured["drafter"] = drafter_memory(m.method, self.target)
        lane.meta.update(contention=contention, memory=measured, budget=m.budget_record(), finished=time.time())
        if contention["flagged"]:
            why = "; ".join(contention["reasons"]) or "an earlier part of this resumed run was"
            print(f"warning: {lane.outcome.label}: measured under contention: {why} (threshold "
                  f"{contention['threshold']:g} cores); `report` marks its numbers; run it again on a quiet machine "
                  "for clean ones", file=sys.stderr)

    def tick(self) -> None:
        self.guard.tick()  # a question (batch) boundary: contention counters, no waiting

    def answer(self, m: LocalMethod, questions: list[data.Question]) -> list[dict[str, Any]]:
        """One timed call of a method (a question, or a batch): its records, its memory peak noted."""
        held = self.memory.call_start()
        records = self.answer_some(m.method, questions)
        if (rose := self.memory.call_end(held)) is not None:
            m.working = max(m.working or 0, rose)
        for record in records:
            for stats in turn_stats(record):
                m.count_budget(stats)
        return records

    def failed(self, exc: BaseException) -> bool:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return False

    # -- answering -------------------------------------------------------------------------------

    def answer_some(self, method: Method, questions: list[data.Question]) -> list[dict[str, Any]]:
        if self.batch_size > 1:
            return self.answer_batch(method, questions, questions[0].question_id)
        return [self.answer_one(method, questions[0])]

    def answer_one(self, method: Method, question: data.Question) -> dict[str, Any]:
        """Generate every turn of one question; returns the upstream-format record."""
        torch.manual_seed(int(self.cfg.seed))  # upstream: torch.manual_seed(choice index)
        method.start_question()  # the answer depends on this question alone (Method.start_question)
        answer = AnswerRecord(question)
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
            answer.add(self.turn(ids, stop, result, timing.total, prefill, timing.sections))
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
        numbers and when the turn was queued, admitted into a row, had its first token (prefill
        done) and finished (seconds from the sequence's start); its latency is finished - admitted
        (the wait before is queueing)."""
        torch.manual_seed(int(self.cfg.seed))
        method.start_question()
        answers = [AnswerRecord(q) for q in questions]
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

    def turn(self, ids: list[int], stop: StopCriteria, result: GenerationResult, seconds: float,
             prefill: float | None, sections: dict[str, float], batch: dict[str, Any] | None = None) -> Turn:
        return Turn(self.answer_text(result.tokens), result.tokens, result.accept_lengths, seconds, len(ids),
                    stop.max_new_tokens, prefill, sections, TurnStats.from_dict(result.stats), batch=batch)

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


@dataclass
class _Waiting:
    answer: AnswerRecord
    turn: int
    ids: list[int]


class TurnQueue(Requests):
    """The backend's side of a batched method call: the prompts waiting and what came back.

    The clock belongs to the backend: it marks when each prompt was queued and when its answer
    came back on the method's timer, and `settle` turns the finished turns into the records' turns."""

    def __init__(self, backend: LocalBackend, method: Method, follow_up: bool) -> None:
        self.backend, self.method, self.follow_up = backend, method, follow_up
        self.waiting: deque[Request] = deque()
        self.done: list[tuple[Request, GenerationResult]] = []
        self.queued_at_start: set[str] = set()

    @staticmethod
    def label(key: _Waiting) -> str:
        return f"{key.answer.question.question_id}/{key.turn}"

    def add(self, answer: AnswerRecord, turn: int, at_start: bool = False) -> None:
        backend = self.backend
        ids = backend.prompt(answer.question, turn, answer.texts)
        key = _Waiting(answer, turn, ids)
        self.waiting.append(Request(key, torch.tensor([ids], device=backend.target.device), backend.stop_for(len(ids))))
        if at_start:
            self.queued_at_start.add(self.label(key))
        else:
            backend.timer.mark(f"queued {self.label(key)}")

    def pop(self) -> Request | None:
        if not self.waiting:
            return None
        request = self.waiting.popleft()
        self.backend.timer.mark(f"admitted {self.label(request.key)}")  # the method takes it into a row now
        return request

    def started(self, request: Request) -> None:
        self.backend.timer.mark(f"first {self.label(request.key)}")

    def finished(self, request: Request, result: GenerationResult) -> None:
        key = request.key
        self.backend.timer.mark(f"done {self.label(key)}")
        check_result(self.method, result)
        key.answer.texts.append(self.backend.answer_text(result.tokens))  # a follow-up turn's prompt reads it
        self.done.append((request, result))
        if self.follow_up and len(key.answer.question.turns) > key.turn + 1:
            self.add(key.answer, key.turn + 1)

    def settle(self, timing: Timing, batch: dict[str, Any]) -> None:
        if self.waiting:
            raise RuntimeError(f"the method left {len(self.waiting)} prompt(s) of the batch unanswered")
        tokens = sum(len(result.tokens) for _, result in self.done)
        sections = dict(timing.sections)
        prefill = sections.pop("prefill", 0.0)
        info = {**batch, "wall_time": timing.total, "tokens": tokens, "prefill_time": prefill}
        for request, result in sorted(self.done, key=lambda d: d[0].key.turn):  # each answer's turns in order
            key = request.key
            label, share = self.label(key), len(result.tokens) / tokens
            queued = 0.0 if label in self.queued_at_start else timing.marks[f"queued {label}"]
            admitted, finished = timing.marks[f"admitted {label}"], timing.marks[f"done {label}"]
            first = timing.marks.get(f"first {label}", admitted)  # a method without the hook: its admission
            turn = self.backend.turn(key.ids, request.stop, result, timing.total * share, prefill * share,
                                     {k: v * share for k, v in sections.items()},
                                     batch={**info, "queued": queued, "admitted": admitted, "first": first,
                                            "finished": finished, "latency": finished - admitted})
            key.answer.add(turn)


def method_parts(cfg: DictConfig, method: DictConfig) -> list[str]:
    """The target and every path a method's settings name (its facts aside); the model's draft where the
    method leaves its `draft` empty (it then reads the model's: methods.drafts.load_draft)."""
    specs = [str(cfg.model.path)]
    settings = {k: v for k, v in OmegaConf.to_container(method, resolve=True).items() if k not in ("facts", "suites")}
    if "draft" in settings and not settings["draft"] and cfg.model.get("draft"):
        specs.append(str(cfg.model.draft))
    return specs + list(strings(settings))


def strings(value: Any) -> Iterator[str]:
    """Every text in a plain config value (dicts and lists walked)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def with_run_budget(method_cfg: DictConfig, budget: str | None) -> DictConfig:
    """The run-wide `budget=auto|fixed` applied to a method with a draft budget (its `budget` key);
    other methods (the baseline) and `budget=null` keep their config."""
    if budget is None or "budget" not in method_cfg:
        return method_cfg
    return OmegaConf.merge(method_cfg, {"budget": budget})
