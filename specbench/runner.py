"""The runner: questions -> prompts -> method (timed) -> answer files -> summary.

It owns timing and I/O; methods only compute. Re-running the same command resumes.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench import data, metrics, table
from specbench.answers import (
    ANSWERS,
    ERRORS,
    EXTRA_KEY,
    META,
    AnswerWriter,
    locked,
    read_answers,
    read_meta,
    run_dir,
    write_meta,
)
from specbench.config import CONFIG_DIR, check_values, selected_subtasks
from specbench.errors import SpecbenchError
from specbench.methods import Method, build_method
from specbench.models import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench.prompts import prompt_ids
from specbench.sampling import SamplingParams
from specbench.stopping import StopCriteria
from specbench.timing import Timer, timer_for

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_dataset(dataset_cfg: DictConfig) -> list[data.Question]:
    path = Path(dataset_cfg.path)
    if dataset_cfg.name == "synthetic":
        from specbench import synth

        synth.write_questions(path, seed=int(dataset_cfg.seed))
    elif not path.is_file():
        raise SpecbenchError(
            f"question file {path} not found; run `python -m specbench data fetch` (or `make data`) to download it"
        )
    return data.load_questions(path)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment(target: LoadedModel) -> dict[str, Any]:
    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "device_name": name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def weights_fingerprint(folder: str) -> str | None:
    """Short SHA-256 of a local model's safetensors files: answers (and check references) made
    with other weights under the same name are told apart."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(data.sha256_of(file).encode())
    return digest.hexdigest()[:16]


def identity(cfg: DictConfig, method_cfg: DictConfig, dtype: torch.dtype) -> dict[str, Any]:
    """What must not change between a run and its resumption."""
    return {
        "dataset": cfg.dataset.name,
        "model": cfg.model.path,
        "template": cfg.model.template,
        "method": OmegaConf.to_container(method_cfg, resolve=True),
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "dtype": str(dtype).removeprefix("torch."),
    }


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """`i/n` (1 <= i <= n) -> (i, n)."""
    if spec in (None, ""):
        return None
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise SpecbenchError(f"shard must look like i/n with 1 <= i <= n (e.g. shard=1/4), got {spec!r}")
    return i, n


def shard(questions: list[data.Question], spec: str | None) -> list[data.Question]:
    """Every n-th question starting at the i-th: deterministic, and balanced across subtasks."""
    parsed = parse_shard(spec)
    if parsed is None:
        return questions
    i, n = parsed
    return questions[i - 1 :: n]


def shard_dir(spec: str) -> str:
    i, n = parse_shard(spec)  # type: ignore[misc]
    return f"shard-{i}-of-{n}"


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


_previous_handler: Any = None


def install_interrupt_flag() -> Any:
    """Ctrl-C during a run finishes the question in flight, then stops cleanly (a second
    Ctrl-C stops at once). Returns a function telling whether Ctrl-C was pressed."""
    global _previous_handler
    pressed = [False]
    if threading.current_thread() is not threading.main_thread():
        return lambda: False

    def handler(signum: int, frame: Any) -> None:
        if pressed[0]:
            raise KeyboardInterrupt
        pressed[0] = True

    _previous_handler = signal.signal(signal.SIGINT, handler)
    return lambda: pressed[0]


def restore_interrupt() -> None:
    global _previous_handler
    if _previous_handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _previous_handler)
        _previous_handler = None


def write_or_explain(writer: AnswerWriter, record: dict[str, Any]) -> None:
    try:
        writer.write(record)
    except OSError as exc:
        raise SpecbenchError(
            f"cannot write {writer.path} ({exc.strerror or exc}); free space, then run again to resume"
        ) from None


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
        dtype = resolve_dtype(cfg.model.dtype or cfg.dtype, device)
        self.sampling = SamplingParams(float(cfg.temperature), float(cfg.top_p), int(cfg.top_k))
        self.target = load_model(
            cfg.model.path, device=device, dtype=dtype, trust_remote_code=bool(cfg.model.trust_remote_code)
        )
        self.stop = StopCriteria.build(
            self.target.eos_ids, int(cfg.max_new_tokens), cfg.model.stop_strings, self.target.tokenizer.decode
        )
        self.timer: Timer = timer_for(device)
        self.context = getattr(self.target.model.config, "max_position_embeddings", None)

    def run_dir(self, method_name: str, run: int) -> Path:
        c = self.cfg
        folder = run_dir(c.output_dir, c.dataset.name, c.model.name, method_name, float(c.temperature), run)
        return folder / shard_dir(c.shard) if c.shard else folder

    def run_method(self, method_cfg: DictConfig) -> None:
        method = build_method(method_cfg, self.target, self.cfg.model)
        for run in range(1, int(self.cfg.runs) + 1):
            self.run_once(method, method_cfg, run)

    def run_once(self, method: Method, method_cfg: DictConfig, run: int) -> None:
        folder = self.run_dir(method_cfg.name, run)
        with locked(folder):
            self._run_once(method, method_cfg, run, folder)

    def _run_once(self, method: Method, method_cfg: DictConfig, run: int, folder: Path) -> None:
        ident = identity(self.cfg, method_cfg, self.target.dtype)
        self.prepare(folder, ident)
        done = {r["question_id"] for r in read_answers(folder / ANSWERS, repair=True)}
        todo = [q for q in self.questions if q.question_id not in done]
        label = f"{method_cfg.name} run {run}" + (f" shard {self.cfg.shard}" if self.cfg.shard else "")
        if not todo:
            print(f"{label}: all {len(self.questions)} answers already in {folder}", file=sys.stderr)
            return
        folder.mkdir(parents=True, exist_ok=True)
        write_meta(folder / META, {
            "identity": ident,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "environment": environment(self.target),
            "target_parameters": sum(p.numel() for p in self.target.model.parameters()),
            "target_weights": weights_fingerprint(self.target.path),
            "extra_parameters": method.extra_parameters(),
            "expected_questions": [q.question_id for q in self.all_questions],  # all shards together
            "started": time.time(),
        })
        method.reset()
        for _ in range(int(self.cfg.warmup)):
            self.answer(method, self.questions[0])
        if done:
            print(f"{label}: resuming, {len(done)} answers kept, {len(todo)} to go", file=sys.stderr)
        self.answer_all(method, method_cfg.name, run, folder, todo, label)

    def prepare(self, folder: Path, ident: dict[str, Any]) -> None:
        """Start over when asked; refuse to mix answers of another config into a folder."""
        if self.cfg.overwrite and folder.exists():
            shutil.rmtree(folder)
        meta = read_meta(folder / META)
        if meta is not None and meta.get("identity") != ident:
            changed = sorted(k for k in ident if meta.get("identity", {}).get(k) != ident[k])
            raise SpecbenchError(
                f"{folder} holds answers made with a different config ({', '.join(changed)} differ); "
                "use overwrite=true to replace them or output_dir=... to keep both"
            )

    def answer_all(
        self, method: Method, name: str, run: int, folder: Path, todo: list[data.Question], label: str
    ) -> None:
        """Answer `todo`, one flushed line each. A failing question becomes a row in
        errors.jsonl and the run goes on; Ctrl-C keeps what was written and says so."""
        written = failed = 0
        tokens = seconds = 0.0
        bar = tqdm(todo, desc=label, unit="q", disable=not self.cfg.progress, file=sys.stderr)
        interrupted = install_interrupt_flag()
        try:
            with AnswerWriter(folder / ANSWERS) as writer:
                for question in bar:
                    if interrupted():
                        raise KeyboardInterrupt
                    try:
                        record = self.answer(method, question)
                    except Exception as exc:  # noqa: BLE001 - any failure of one question is recorded
                        if self.cfg.on_error == "raise":
                            raise
                        failed += 1
                        self.record_error(folder, question, name, run, exc)
                        continue
                    record.update(model_id=self.cfg.model.name, answer_id=uuid.uuid4().hex, tstamp=time.time())
                    record[EXTRA_KEY].update(method=name, run=run)
                    write_or_explain(writer, record)
                    written += 1
                    tokens += sum(record["choices"][0]["new_tokens"])
                    seconds += sum(record["choices"][0]["wall_time"])
                    bar.set_postfix_str(f"{tokens / seconds:.1f} tok/s")
        except KeyboardInterrupt:
            bar.close()
            print(f"\n{label}: interrupted after {written} of {len(todo)} questions; the answers so far are saved "
                  f"in {folder}; run the same command again to resume", file=sys.stderr)
            raise
        finally:
            restore_interrupt()
        if failed:
            print(f"{label}: {failed} question(s) failed, listed in {folder / ERRORS}", file=sys.stderr)

    def record_error(self, folder: Path, question: data.Question, name: str, run: int, exc: Exception) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(f"question {question.question_id} failed: {reason}", file=sys.stderr)
        with AnswerWriter(folder / ERRORS) as errors:
            write_or_explain(errors, {"question_id": question.question_id, "category": question.category,
                                      "method": name, "run": run, "error": reason, "tstamp": time.time()})

    def answer(self, method: Method, question: data.Question) -> dict[str, Any]:
        """Generate every turn of one question; returns the upstream-format record."""
        tok = self.target.tokenizer
        torch.manual_seed(int(self.cfg.seed))  # upstream: torch.manual_seed(choice index)
        texts: list[str] = []
        choice: dict[str, list[Any]] = {k: [] for k in ("turns", "decoding_steps", "new_tokens", "wall_time")}
        accept: list[int] = []
        extra_keys = ("output_ids", "prompt_tokens", "prefill_time", "sections", "stats")
        extra: dict[str, list[Any]] = {k: [] for k in extra_keys}
        for j in range(len(question.turns)):
            ids = prompt_ids(self.cfg.model.template, tok, question.turns[: j + 1], texts)
            if self.context and len(ids) >= self.context:
                raise SpecbenchError(f"prompt of {len(ids)} tokens does not fit the model's context of {self.context}")
            input_ids = torch.tensor([ids], device=self.target.device)
            self.timer.start()
            state = method.prefill(input_ids, self.sampling)
            self.timer.mark("prefill")
            result = method.decode(state, self.sampling, self.stop, self.timer)
            timing = self.timer.stop()
            if len(result.tokens) != 1 + sum(result.accept_lengths):
                raise RuntimeError(f"{type(method).__name__} returned tokens that its accept_lengths do not add up to")
            texts.append(self.answer_text(result.tokens))
            choice["turns"].append(texts[-1])
            choice["decoding_steps"].append(len(result.accept_lengths))
            choice["new_tokens"].append(len(result.tokens))
            choice["wall_time"].append(timing.total)
            accept.extend(result.accept_lengths)
            extra["output_ids"].append(result.tokens)
            extra["prompt_tokens"].append(len(ids))
            extra["prefill_time"].append(timing.marks["prefill"] if method.splits_prefill else None)
            extra["sections"].append(timing.sections)
            extra["stats"].append(result.stats)
        return {
            "question_id": question.question_id,
            "category": question.category,
            "choices": [{"index": 0, **choice, "accept_lengths": accept}],
            EXTRA_KEY: {"subtask": question.subtask, **extra},
        }

    def answer_text(self, tokens: list[int]) -> str:
        """The answer as text: EOS dropped, cut at a stop string, stripped (as upstream)."""
        text = self.target.tokenizer.decode(
            [t for t in tokens if t not in self.stop.eos_ids], skip_special_tokens=True
        )
        for stop in self.cfg.model.stop_strings:
            if stop in text:
                text = text[: text.index(stop)]
        return text.strip()

    def summary(self, method_name: str) -> list[dict[str, Any]] | None:
        """Speedup rows against the baseline, averaged over runs; None without baseline answers."""
        per_run = []
        for run in range(1, int(self.cfg.runs) + 1):
            ours = read_answers(self.run_dir(method_name, run) / ANSWERS)
            base = read_answers(self.run_dir("baseline", run) / ANSWERS)
            wanted = {q.question_id for q in self.questions}
            ours = [r for r in ours if r["question_id"] in wanted]
            base = [r for r in base if r["question_id"] in wanted]
            if ours and base:
                per_run.append(metrics.speedup_rows(ours, base))
        return metrics.average_runs(per_run) if per_run else None


def run(cfg: DictConfig) -> None:
    """`python -m specbench run`: the baseline first (unless baseline=false), then the method."""
    session = Session(cfg)
    plan = [cfg.method]
    if cfg.baseline and cfg.method.name != "baseline":
        plan.insert(0, OmegaConf.load(CONFIG_DIR / "method" / "baseline.yaml"))
    for method_cfg in plan:
        session.run_method(method_cfg)
    rows = session.summary(cfg.method.name)
    header = f"{cfg.method.name} vs baseline | {cfg.model.name} | {cfg.dataset.name} | temperature {cfg.temperature:g}"
    if rows is None:
        print(f"{header}: no baseline answers to compare with (run with baseline=true)")
        return
    print(table.speedup_table(rows, title=header, runs=int(cfg.runs)))
