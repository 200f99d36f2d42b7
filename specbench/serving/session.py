"""`specbench run backend=vllm`: the questions answered by vLLM servers, one per method, in turn.

The baseline is vLLM without speculation and every method is one of the backend's presets (a
vLLM `--speculative-config`), so every speedup is vLLM against vLLM, paired question by question
(the servers run side by side; one answers at a time, the order alternating). Prompts are rendered
and tokenised exactly as the local runner does (the model's template, the second turn seeing the
first answer) and sent as token ids; the answer's token ids come back in the stream and its text is
decoded from them as the local runner does. A turn's wall time runs from the request to the last
streamed chunk (the client's clock: HTTP and detokenisation included, for the baseline as for the
methods); its acceptance comes from the server's counters read before and after it.

Answers are filed as model `<model>-vllm` (a group of its own in `report`) in the same answer
files as the local runner's: appended per question, resumed by running the same command again."""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

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
from specbench.core.prompts import prompt_ids
from specbench.core.stopping import answer_text, eos_token_ids
from specbench.run.session import Outcome  # the local runner's record of a method run, shared
from specbench.serving.client import Client, Completion, ServerError
from specbench.serving.metrics import Counters, step_lengths
from specbench.serving.server import Server, fill, free_port

BASELINE = "baseline"
#: how long the counters may lag behind the last streamed chunk (vLLM updates them from its output loop)
SETTLE_SECONDS = 5.0


@dataclass
class Lane:
    name: str
    preset: dict[str, Any]
    server: Server
    folder: Path
    todo: list[data.Question] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome | None = None
    client: Client | None = None


class Session:
    def __init__(self, cfg: DictConfig) -> None:
        from specbench.run.config import check_values, selected_subtasks
        from specbench.run.session import check_writable, load_dataset
        from specbench.run.shards import shard

        check_values(cfg)
        cfg = cfg.copy()
        with open_dict(cfg):  # filed as <model>-<suffix>: a group of its own, with its own baseline
            cfg.model.name = f"{cfg.model.name}-{cfg.backend.suffix}"
        self.cfg = cfg
        self.backend = cfg.backend
        self.subtasks = selected_subtasks(cfg.task)
        self.all_questions = data.select(load_dataset(cfg.dataset), self.subtasks, cfg.limit)
        self.questions = shard(self.all_questions, cfg.shard)
        if not self.questions:
            raise SpecbenchError(f"no questions of task {self.subtasks} in {cfg.dataset.path}")
        if int(cfg.get("batch_size", 1)) != 1:
            raise SpecbenchError("backend=vllm answers one question at a time; leave batch_size at 1")
        check_writable(Path(cfg.output_dir))
        self.names = self.method_names()
        self.model_dir = self.resolve(str(cfg.model.path))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.eos_ids = eos_ids(Path(self.model_dir), self.tokenizer)
        known = [n for n in (context_length(Path(self.model_dir)), int(self.backend.max_model_len)) if n]
        self.context = min(known) if known else None  # the server holds prompt + answer within max_model_len
        self.labels: list[str] = []
        self.outcomes: list[Outcome] = []
        self.merged_warned = False

    # -- what runs -------------------------------------------------------------------------------

    def method_names(self) -> list[str]:
        presets = self.backend.presets
        names = [str(self.cfg.method.name), *[str(n) for n in self.cfg.get("interleave") or []]]
        if self.cfg.baseline and BASELINE not in names:
            names.insert(0, BASELINE)
        for name in names:
            if name not in presets:
                raise SpecbenchError(f"backend=vllm has no preset '{name}' (its presets: {', '.join(presets)}); "
                                     "pick one with method=... interleave=[...] or add it under backend.presets")
        return list(dict.fromkeys(names))

    @staticmethod
    def resolve(spec: str) -> str:
        from specbench.models import resolve_path

        return resolve_path(spec)

    def speculative_config(self, name: str) -> dict[str, Any] | None:
        spec = self.backend.presets[name].get("speculative_config")
        if spec is None:
            return None
        spec = OmegaConf.to_container(spec, resolve=True)
        if "model" in spec and str(spec["model"]) == "{draft}":
            if not self.cfg.model.get("draft"):
                raise SpecbenchError(f"preset '{name}' needs the model's draft, and model {self.cfg.model.name} "
                                     "names none (model.draft=...)")
            spec["model"] = self.resolve(str(self.cfg.model.draft))
        return spec

    def server(self, name: str, log_dir: Path) -> Server:
        b = self.backend
        label = f"vllm {name}"
        if b.url:
            if not OmegaConf.is_dict(b.url) or not b.url.get(name):
                raise SpecbenchError(f"backend.url gives no server for '{name}': map every method to its running "
                                     "server, backend.url={baseline:http://HOST:PORT,ngram:http://HOST:PORT}, or "
                                     "leave it unset for specbench to start them")
            return Server(label, None, str(b.url[name]), str(b.served_name), log_dir / f"{name}.log", {},
                          b.start_timeout, b.request_timeout)
        port = int(b.port) + len(self.labels) if b.port else free_port(str(b.host))
        values = {"python": str(b.python), "model": self.model_dir, "served": str(b.served_name),
                  "host": str(b.host), "port": port, "dtype": str(b.dtype), "max_model_len": int(b.max_model_len),
                  "seed": int(self.cfg.seed)}
        command = fill(list(b.command), values) + [str(a) for a in b.extra_args]
        spec = self.speculative_config(name)
        if spec is not None:
            command += ["--speculative-config", json.dumps(spec)]
        values["venv"] = str(Path(str(b.python)).absolute().parent.parent)
        env = {str(k): str(v).format(**values) for k, v in (b.env or {}).items()}
        return Server(label, command, f"http://{b.host}:{port}", str(b.served_name), log_dir / f"{name}.log", env,
                      b.start_timeout, b.request_timeout)

    def identity(self, name: str) -> dict[str, Any]:
        c = self.cfg
        return {"backend": str(self.backend.name), "dataset": c.dataset.name, "model": c.model.path,
                "template": c.model.template, "preset": {"name": name, "speculative_config":
                                                         self.speculative_config(name)},
                "dtype": str(self.backend.dtype), "temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k,
                "max_new_tokens": c.max_new_tokens, "seed": c.seed}

    def run_dir(self, name: str, run: int) -> Path:
        from specbench.run.shards import shard_dir

        c = self.cfg
        folder = run_dir(c.output_dir, c.dataset.name, str(c.model.name), name, float(c.temperature), run)
        return folder / shard_dir(c.shard) if c.shard else folder

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> None:
        for run in range(1, int(self.cfg.runs) + 1):
            self.run_once(run)

    def run_once(self, run: int) -> None:
        lanes = []
        log_dir = Path(self.cfg.output_dir) / "logs" / str(self.cfg.model.name)
        for name in self.names:
            folder = self.run_dir(name, run)
            lane = Lane(name, dict(self.backend.presets[name]), self.server(name, log_dir), folder)
            lanes.append(lane)
            if name not in self.labels:
                self.labels.append(name)
        with contextlib.ExitStack() as stack:
            for lane in lanes:
                stack.enter_context(locked(lane.folder))
            open_lanes = [lane for lane in lanes if self.open_lane(lane, run)]
            if not open_lanes:
                return
            try:
                for lane in open_lanes:  # every server starts at once; then each is waited for
                    print(f"{lane.outcome.label}: starting {lane.server.label}"
                          + (f" ({' '.join(lane.server.command)})" if lane.server.command else ""), file=sys.stderr,
                          flush=True)
                    lane.server.launch()
                for lane in open_lanes:
                    lane.client = lane.server.start()
                    lane.meta["environment"].update(self.server_facts(lane))
                    write_meta(lane.folder / META, lane.meta)
                    for _ in range(int(self.cfg.warmup)):
                        self.answer(lane, self.questions[0])
                self.answer_all(open_lanes)
            finally:
                for lane in open_lanes:
                    lane.meta["finished"] = time.time()
                    if (peak := lane.server.peak_memory()) is not None:  # read by `report` and `recommend`
                        lane.meta["memory"] = {"peak_bytes": peak, "measured_by": "the vLLM server's processes: "
                                               "peak resident memory (VmHWM) summed"}
                    with contextlib.suppress(OSError):
                        write_meta(lane.folder / META, lane.meta)
                    lane.server.stop()

    def open_lane(self, lane: Lane, run: int) -> bool:
        ident = self.identity(lane.name)
        folder = lane.folder
        if self.cfg.overwrite and folder.exists():
            import shutil

            shutil.rmtree(folder)
        meta = read_meta(folder / META)
        if meta is not None and meta.get("identity") != ident:
            changed = sorted(k for k in ident if (meta.get("identity") or {}).get(k) != ident[k])
            raise SpecbenchError(f"{folder} holds answers made with a different config ({', '.join(changed)} differ); "
                                 "use overwrite=true to replace them or output_dir=... to keep both")
        done = {r["question_id"] for r in read_answers(folder / ANSWERS, repair=True)}
        repair_torn_tail(folder / ERRORS)
        lane.todo = [q for q in self.questions if q.question_id not in done]
        label = f"vllm {lane.name} run {run}" + (f" shard {self.cfg.shard}" if self.cfg.shard else "")
        lane.outcome = Outcome(label, folder, len(lane.todo), len(done))
        self.outcomes.append(lane.outcome)
        if not lane.todo:
            print(f"{label}: all {len(self.questions)} answers already in {folder}", file=sys.stderr)
            return False
        folder.mkdir(parents=True, exist_ok=True)
        facts = dict(lane.preset.get("facts") or {})
        if lane.preset.get("ours"):
            facts["ours"] = str(lane.preset["ours"])  # the specbench method of the same algorithm (engines table)
        lane.meta = {
            "identity": ident, "facts": facts, "config": OmegaConf.to_container(self.cfg, resolve=True),
            "environment": {"engine": "vllm", "python": platform.python_version(), "machine": platform.machine(),
                            "platform": platform.platform(), "dtype": str(self.backend.dtype)},
            "expected_questions": [q.question_id for q in self.all_questions], "started": time.time(),
            "phase": {"schedule": "interleaved", "lanes": list(self.names)},
            "measures": MEASURES,
        }
        if done:
            lane.meta["resumed_from"] = read_meta(folder / META)
        write_meta(folder / META, lane.meta)
        return True

    def server_facts(self, lane: Lane) -> dict[str, Any]:
        facts: dict[str, Any] = {"server_command": lane.server.command, "server_url": lane.server.url,
                                 "server_start_seconds": lane.server.started_in}
        try:
            response = lane.client.http.get(lane.client.url + "/version", timeout=10)
            facts["vllm"] = response.json().get("version") if response.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a fact that cannot be read is None
            facts["vllm"] = None
        return facts

    def answer_all(self, lanes: list[Lane]) -> None:
        from tqdm import tqdm

        writers = [AnswerWriter(lane.folder / ANSWERS) for lane in lanes]
        total = sum(len(lane.todo) for lane in lanes)
        bar = tqdm(total=total, desc="vllm", disable=not self.cfg.progress, file=sys.stderr)
        try:
            for i in range(max(len(lane.todo) for lane in lanes)):
                pairs = list(zip(lanes, writers, strict=True))
                for lane, writer in pairs if i % 2 == 0 else pairs[::-1]:
                    if i < len(lane.todo):
                        self.answer_one(lane, lane.todo[i], writer)
                        bar.update(1)
        except KeyboardInterrupt:
            bar.close()
            for lane in lanes:
                o = lane.outcome
                print(f"\n{o.label}: interrupted after {o.written} of {o.todo} questions; the answers so far are "
                      f"saved in {o.folder}; run the same command again to resume", file=sys.stderr)
            raise
        finally:
            bar.close()
            for writer in writers:
                writer.close()
        for lane in lanes:
            o = lane.outcome
            if o.failed == o.todo and not o.kept:  # not one answer: something is broken
                raise SpecbenchError(f"{o.label}: all {o.failed} questions failed (first: {o.first_error}); the "
                                     f"reasons are in {o.folder / ERRORS}")
            if o.failed:
                print(f"{o.label}: {o.failed} question(s) failed, listed in {o.folder / ERRORS}", file=sys.stderr)

    def answer_one(self, lane: Lane, question: data.Question, writer: AnswerWriter) -> None:
        outcome = lane.outcome
        lane.server.check_alive()
        try:
            record = self.answer(lane, question)
        except ServerError as exc:
            if exc.fatal:
                lane.server.check_alive(wait=3.0)  # a dead server says so first
                raise
            outcome.failed += 1
            reason = str(exc)
            outcome.first_error = outcome.first_error or f"question {question.question_id}: {reason}"
            print(f"question {question.question_id} failed: {reason}", file=sys.stderr)
            with AnswerWriter(lane.folder / ERRORS) as errors:
                errors.write({"question_id": question.question_id, "category": question.category,
                              "method": lane.name, "error": reason, "tstamp": time.time()})
            return
        record.update(model_id=str(self.cfg.model.name), answer_id=uuid.uuid4().hex, tstamp=time.time())
        record[EXTRA_KEY].update(method=lane.name)
        writer.write(record)
        outcome.written += 1

    def answer(self, lane: Lane, question: data.Question) -> dict[str, Any]:
        c = self.cfg
        texts: list[str] = []
        choice: dict[str, list[Any]] = {k: [] for k in ("turns", "decoding_steps", "new_tokens", "wall_time")}
        accepts: list[int] = []
        extra: dict[str, list[Any]] = {k: [] for k in ("output_ids", "prompt_tokens", "prefill_time", "stats",
                                                        "max_new_tokens", "finish_reason")}
        for turn in range(len(question.turns)):
            ids = prompt_ids(c.model.template, self.tokenizer, question.turns[: turn + 1], texts)
            room = int(c.max_new_tokens)
            if self.context is not None:
                room = min(room, self.context - len(ids))
                if room < 1:
                    raise ServerError(f"prompt of {len(ids)} tokens does not fit the model's context of "
                                      f"{self.context}", fatal=False)
            before = lane.client.counters()
            done = lane.client.complete(ids, room, temperature=float(c.temperature), top_p=float(c.top_p),
                                        top_k=int(c.top_k), seed=int(c.seed), stop=list(c.model.stop_strings) or None,
                                        stop_token_ids=sorted(self.eos_ids))
            delta = self.settled(lane.client, before, len(done.token_ids))
            steps, exact = step_lengths(done.sizes, delta)
            if not exact:  # merged chunks: the steps are unknown; this turn stays out of #mean accepted tokens
                if not self.merged_warned:
                    print(f"warning: {lane.name}: the server merged engine steps into one streamed chunk (a loaded "
                          "server?): such turns are left out of #mean accepted tokens (stats.steps_exact=false)",
                          file=sys.stderr)
                    self.merged_warned = True
                steps = []
            texts.append(self.answer_text(done))
            choice["turns"].append(texts[-1])
            choice["decoding_steps"].append(len(steps))
            choice["new_tokens"].append(len(done.token_ids))
            choice["wall_time"].append(done.seconds)
            accepts += steps
            extra["output_ids"].append(done.token_ids)
            extra["prompt_tokens"].append(len(ids))
            extra["prefill_time"].append(done.first_token)
            extra["stats"].append({"drafted_tokens": delta.draft_tokens, "accepted_tokens": delta.accepted,
                                   **delta.as_dict(), "steps_exact": exact})
            extra["max_new_tokens"].append(room)
            extra["finish_reason"].append(done.finish_reason)
        return {"question_id": question.question_id, "category": question.category,
                "choices": [{"index": 0, **choice, "accept_lengths": accepts}],
                EXTRA_KEY: {"subtask": question.subtask, **extra}}

    @staticmethod
    def settled(client: Client, before: Counters, tokens: int) -> Counters:
        """The counters' difference over one answer, read once they count its tokens."""
        deadline = time.perf_counter() + SETTLE_SECONDS
        while True:
            delta = client.counters().minus(before)
            if delta.generated >= tokens or time.perf_counter() > deadline:
                return delta
            time.sleep(0.05)

    def answer_text(self, done: Completion) -> str:
        return answer_text(done.token_ids, self.tokenizer.decode, self.eos_ids, self.cfg.model.stop_strings)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]


#: what an answer of backend=vllm measured, and how (meta `measures`)
MEASURES = ("wall_time: request sent to last streamed chunk, on the client's clock; prefill_time: to the first "
            "chunk with a token; output_ids: the token ids streamed (return_token_ids); accept_lengths: the tokens "
            "of each streamed chunk after the first (vLLM streams one chunk per engine step); stats: the server's "
            "spec-decode counters over the turn (after minus before)")


def eos_ids(folder: Path, tokenizer: Any) -> set[int]:
    """EOS ids from the generation config (may be several) and the tokenizer, as the local runner."""
    path = folder / "generation_config.json"
    generation = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    return eos_token_ids(generation, tokenizer.eos_token_id)


def context_length(folder: Path) -> int | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def run(cfg: DictConfig) -> Session:
    session = Session(cfg)
    session.run()
    return session
