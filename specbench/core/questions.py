"""Spec-Bench questions: loading with validation, subtask mapping, and the pinned download."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SUBTASK_TITLES = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}


def subtask_of(category: str) -> str:
    """The Spec-Bench subtask of a raw category (the 8 MT-bench categories form `mt_bench`)."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in SUBTASKS:
        return category
    raise KeyError(category)


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]
    reference: tuple[object, ...] = ()

    @property
    def subtask(self) -> str:
        return subtask_of(self.category)


def _parse_line(raw: str, where: str) -> Question:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"{where}: not valid JSON ({exc.msg}); fix or remove the line") from None
    if not isinstance(obj, dict):
        raise SpecbenchError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("question_id", "category", "turns"):
        if key not in obj:
            raise SpecbenchError(f"{where}: missing field '{key}' (needs question_id, category, turns)")
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    if not isinstance(qid, int) or isinstance(qid, bool):
        raise SpecbenchError(f"{where}: question_id must be an integer, got {qid!r}")
    if not isinstance(category, str):
        raise SpecbenchError(f"{where}: category must be a string, got {category!r}")
    try:
        subtask_of(category)
    except KeyError:
        known = ", ".join(MT_BENCH_CATEGORIES + SUBTASKS[1:])
        raise SpecbenchError(f"{where}: unknown category '{category}'; known: {known}") from None
    if not isinstance(turns, list) or not 1 <= len(turns) <= 2:
        raise SpecbenchError(f"{where}: turns must be a list of 1 or 2 strings")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise SpecbenchError(f"{where}: turn {i + 1} is empty or not a string")
    reference = obj.get("reference") or []
    if not isinstance(reference, list):  # entries are strings, or lists of strings (official rag)
        raise SpecbenchError(f"{where}: reference must be a list")
    return Question(qid, category, tuple(turns), tuple(reference))


MAX_LINE_BYTES = 4 << 20  # the longest official question is ~10 KB


def _lines(fh: Any) -> Iterator[bytes]:
    """Lines of a binary file, refusing to read a line longer than MAX_LINE_BYTES into memory."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise ValueError
        yield line


def load_questions(path: str | os.PathLike) -> list[Question]:
    """Read and validate a Spec-Bench question file; errors name the file, line and problem."""
    path = Path(path)
    if path.is_dir():
        raise SpecbenchError(f"question file {path} is a folder; give the .jsonl file itself")
    if not path.is_file():
        raise SpecbenchError(f"question file {path} not found")
    questions: list[Question] = []
    seen: dict[int, int] = {}
    with path.open("rb") as fh:
        lines = _lines(fh)
        for lineno in itertools.count(1):
            where = f"{path}:{lineno}"
            try:
                raw_bytes = next(lines)
            except StopIteration:
                break
            except ValueError:
                raise SpecbenchError(
                    f"{where}: line longer than {MAX_LINE_BYTES >> 20} MiB; is this a question file?"
                ) from None
            try:
                raw = raw_bytes.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM some editors write
            except UnicodeDecodeError:
                raise SpecbenchError(f"{where}: not UTF-8 text; re-save the file as UTF-8") from None
            if not raw.strip():
                continue
            q = _parse_line(raw, where)
            if q.question_id in seen:
                raise SpecbenchError(
                    f"{where}: duplicate question_id {q.question_id} (first on line {seen[q.question_id]})"
                )
            seen[q.question_id] = lineno
            questions.append(q)
    if not questions:
        raise SpecbenchError(f"{path}: no questions in the file")
    return questions


def select(questions: list[Question], subtasks: list[str], limit: int | None) -> list[Question]:
    """The questions of the chosen subtasks, the first `limit` of each, in file order."""
    counts: dict[str, int] = {}
    chosen = []
    for q in questions:
        if q.subtask not in subtasks:
            continue
        if limit is not None and counts.get(q.subtask, 0) >= limit:
            continue
        counts[q.subtask] = counts.get(q.subtask, 0) + 1
        chosen.append(q)
    return chosen


def interleave(questions: list[Question]) -> list[Question]:
    """The questions round-robin across their subtasks (the first of each subtask, in the order the
    subtasks first appear, then the second of each, ...): a stream whose every stretch mixes the
    subtasks like the whole, instead of one subtask after another."""
    groups: dict[str, list[Question]] = {}
    for q in questions:
        groups.setdefault(q.subtask, []).append(q)
    rounds = itertools.zip_longest(*groups.values())
    return [q for row in rounds for q in row if q is not None]


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(url: str, dest: str | os.PathLike, sha256: str, *, timeout: float = 60.0) -> Path:
    """Download `url` to `dest` and keep it only if its SHA-256 matches."""
    dest = Path(dest)
    if dest.is_file() and sha256_of(dest) == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (pinned URL)
                    for block in iter(lambda: resp.read(1 << 16), b""):
                        out.write(block)
            except OSError as exc:
                raise SpecbenchError(f"download of {url} failed: {exc}; check the network and retry") from None
        got = sha256_of(tmp)
        if got != sha256:
            raise SpecbenchError(
                f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}; the file was not saved"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def questions_jsonl(questions: Iterable[dict[str, Any]]) -> str:
    """Question dicts as the official file's JSONL text (UTF-8, one object a line)."""
    return "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions)
