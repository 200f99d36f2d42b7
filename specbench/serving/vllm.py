"""`specbench run backend=vllm`: the questions answered by vLLM servers, one per method, in turn.

The baseline is vLLM without speculation and every method is one of the backend's presets (a
vLLM `--speculative-config`), so every speedup is vLLM against vLLM, paired question by question
(the servers run side by side; one answers at a time, the order alternating). Prompts are rendered
and tokenised exactly as the local runner does (the model's template, the second turn seeing the
first answer) and sent as token ids; the answer's token ids come back in the stream and its text is
decoded from them as the local runner does. A turn's wall time runs from the request to the last
streamed chunk (the client's clock: HTTP and detokenisation included, for the baseline as for the
methods); its acceptance comes from the server's counters read before and after it. The runner
(specbench.run.runner) files the answers, as it does the local backend's.

Answers are filed as model `<model>-vllm` (a group of its own in `report`) in the same answer
files as the local runner's: appended per question, resumed by running the same command again."""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from specbench.core import questions as data
from specbench.core.errors import SpecbenchError
from specbench.core.prompts import prompt_ids
from specbench.core.record import AnswerRecord, Turn
from specbench.core.stopping import answer_text, eos_token_ids
from specbench.models import resolve_path
from specbench.run.provenance import parts_identity
from specbench.serving.client import Client, Completion, ServerError
from specbench.serving.metrics import Counters, step_lengths
from specbench.serving.server import Server, fill, free_port

BASELINE = "baseline"
#: how long the counters may lag behind the last streamed chunk (vLLM updates them from its output loop)
SETTLE_SECONDS = 5.0


@dataclass
class Preset:
    """One of the backend's methods (a vLLM `--speculative-config`) and its server."""

    label: str
    identity: dict[str, Any]
    facts: dict[str, Any]
    server: Server
    client: Client | None = None


class VllmBackend:
    """`backend=vllm`: one server per method, started for each phase and stopped after it
    (specbench.run.backend)."""

    @staticmethod
    def filed_config(cfg: DictConfig) -> DictConfig:
        """The run's config with its answers filed as model <model>-<suffix>: a group of its own,
        with its own baseline."""
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.model.name = f"{cfg.model.name}-{cfg.backend.suffix}"
        return cfg

    def __init__(self, cfg: DictConfig, questions: list[data.Question]) -> None:
        self.cfg, self.questions = cfg, questions
        self.backend = cfg.backend
        if int(cfg.get("batch_size", 1)) != 1:
            raise SpecbenchError("backend=vllm answers one question at a time; leave batch_size at 1")
        self.batch_size = self.questions_per_call = 1
        self.model_dir = resolve_path(str(cfg.model.path))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.eos_ids = eos_ids(Path(self.model_dir), self.tokenizer)
        known = [n for n in (context_length(Path(self.model_dir)), int(self.backend.max_model_len)) if n]
        self.context = min(known) if known else None  # the server holds prompt + answer within max_model_len
        self.started = 0  # servers started so far (their ports, backend.port + n)
        self.current: Preset | None = None  # the method answering now
        self.merged_warned = False

    # -- what runs -------------------------------------------------------------------------------

    @staticmethod
    def plan(cfg: DictConfig) -> list[list[str]]:
        """One phase: the baseline's and the methods' presets (the servers run side by side; one
        answers at a time)."""
        presets = cfg.backend.presets
        names = [str(cfg.method.name), *[str(n) for n in cfg.get("interleave") or []]]
        if cfg.baseline and BASELINE not in names:
            names.insert(0, BASELINE)
        for name in names:
            if name not in presets:
                raise SpecbenchError(f"backend=vllm has no preset '{name}' (its presets: {', '.join(presets)}); "
                                     "pick one with method=... interleave=[...] or add it under backend.presets")
        return [list(dict.fromkeys(names))]

    @staticmethod
    def parts(cfg: DictConfig, phases: list[list[str]]) -> list[str]:
        """The target, and the model's draft where a preset serves it (`"{draft}"`)."""
        drafts = [name for phase in phases for name in phase
                  if str((cfg.backend.presets[name].get("speculative_config") or {}).get("model")) == "{draft}"]
        return [str(cfg.model.path)] + ([str(cfg.model.draft)] if drafts and cfg.model.get("draft") else [])

    def open(self, phase: list[str]) -> list[Preset]:
        log_dir = Path(self.cfg.output_dir) / "logs" / str(self.cfg.model.name)
        opened = []
        for name in phase:
            preset = self.backend.presets[name]
            facts = dict(preset.get("facts") or {})
            if preset.get("ours"):
                facts["ours"] = str(preset["ours"])  # the specbench method of the same algorithm (engines table)
            opened.append(Preset(name, self.identity(name), facts, self.server(name, log_dir)))
        return opened

    def speculative_config(self, name: str) -> dict[str, Any] | None:
        spec = self.backend.presets[name].get("speculative_config")
        if spec is None:
            return None
        spec = OmegaConf.to_container(spec, resolve=True)
        if "model" in spec and str(spec["model"]) == "{draft}":
            if not self.cfg.model.get("draft"):
                raise SpecbenchError(f"preset '{name}' needs the model's draft, and model {self.cfg.model.name} "
                                     "names none (model.draft=...)")
            spec["model"] = resolve_path(str(self.cfg.model.draft))
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
        port = int(b.port) + self.started if b.port else free_port(str(b.host))
        self.started += 1
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
                "max_new_tokens": c.max_new_tokens, "seed": c.seed,
                "stop_strings": list(c.model.get("stop_strings") or []),
                "parts": parts_identity([str(c.model.path),
                                         str((self.speculative_config(name) or {}).get("model") or "")]),
                **({"length": c.length} if c.get("length") is not None else {})}

    def lane_meta(self, preset: Preset) -> dict[str, Any]:
        return {"environment": {"engine": "vllm", "python": platform.python_version(), "machine": platform.machine(),
                                "platform": platform.platform(), "dtype": str(self.backend.dtype)},
                "measures": MEASURES}

    def todo(self, preset: Preset, questions: list[data.Question]) -> list[data.Question]:
        return questions

    # -- a phase ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, lanes: list[Any]) -> Iterator[None]:
        """Every lane's server started (all at once, then each waited for) and warmed up; after the
        phase, its peak memory into the lane's meta and the server stopped."""
        try:
            for lane in lanes:
                server = lane.method.server
                print(f"{lane.outcome.label}: starting {server.label}"
                      + (f" ({' '.join(server.command)})" if server.command else ""), file=sys.stderr, flush=True)
                server.launch()
            for lane in lanes:
                preset = lane.method
                preset.client = preset.server.start()
                lane.meta["environment"].update(self.server_facts(preset))
                if lane.previous is not None:
                    lane.meta["resumed_from"] = lane.previous
                for _ in range(int(self.cfg.warmup)):
                    self.answer_one(preset, self.questions[0])
            yield
        finally:
            for lane in lanes:
                lane.meta["finished"] = time.time()
                if (peak := lane.method.server.peak_memory()) is not None:  # read by `report` and `recommend`
                    lane.meta["memory"] = {"peak_bytes": peak, "measured_by": "the vLLM server's processes: "
                                           "peak resident memory (VmHWM) summed"}
                lane.method.server.stop()

    def server_facts(self, preset: Preset) -> dict[str, Any]:
        facts: dict[str, Any] = {"server_command": preset.server.command, "server_url": preset.server.url,
                                 "server_start_seconds": preset.server.started_in}
        try:
            response = preset.client.http.get(preset.client.url + "/version", timeout=10)
            facts["vllm"] = response.json().get("version") if response.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a fact that cannot be read is None
            facts["vllm"] = None
        return facts

    def tick(self) -> None:
        pass

    def answer(self, preset: Preset, questions: list[data.Question]) -> list[dict[str, Any]]:
        self.current = preset
        preset.server.check_alive()
        return [self.answer_one(preset, questions[0])]

    def failed(self, exc: BaseException) -> bool:
        """A refused question is recorded; a server that is gone ends the run (saying so first)."""
        if not isinstance(exc, ServerError):
            return True
        if exc.fatal and self.current is not None:
            self.current.server.check_alive(wait=3.0)  # a dead server says so (its exit code, its log's last line)
        return exc.fatal

    def answer_one(self, preset: Preset, question: data.Question) -> dict[str, Any]:
        c = self.cfg
        answer = AnswerRecord(question)
        for turn in range(len(question.turns)):
            ids = prompt_ids(c.model.template, self.tokenizer, question.turns[: turn + 1], answer.texts)
            room = int(c.max_new_tokens)
            if self.context is not None:
                room = min(room, self.context - len(ids))
                if room < 1:
                    raise ServerError(f"prompt of {len(ids)} tokens does not fit the model's context of "
                                      f"{self.context}", fatal=False)
            before = preset.client.counters()
            done = preset.client.complete(ids, room, temperature=float(c.temperature), top_p=float(c.top_p),
                                          top_k=int(c.top_k), seed=int(c.seed),
                                          stop=list(c.model.stop_strings) or None, stop_token_ids=sorted(self.eos_ids))
            delta = self.settled(preset.client, before, len(done.token_ids))
            steps, exact = step_lengths(done.sizes, delta)
            if not exact:  # merged chunks: the steps are unknown; this turn stays out of #mean accepted tokens
                if not self.merged_warned:
                    print(f"warning: {preset.label}: the server merged engine steps into one streamed chunk (a loaded "
                          "server?): such turns are left out of #mean accepted tokens (stats.steps_exact=false)",
                          file=sys.stderr)
                    self.merged_warned = True
                steps = []
            answer.add(Turn(self.answer_text(done), done.token_ids, steps, done.seconds, len(ids), room,
                            prefill=done.first_token, stats=delta.stats(exact), finish_reason=done.finish_reason))
        return answer.record()

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

