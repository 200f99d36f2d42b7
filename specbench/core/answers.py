"""Answer files: upstream Spec-Bench JSONL, appended and flushed per question, resumable.

Layout: <output_dir>/<dataset>/<model>/<method>/temp-<t>/run-<r>/{answers.jsonl,meta.json}.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonlines

from specbench.core.errors import SpecbenchError

ANSWERS = "answers.jsonl"
ERRORS = "errors.jsonl"  # questions that failed (reason per row); kept apart so answers stay upstream-readable
META = "meta.json"
EXTRA_KEY = "specbench"  # our fields beyond the upstream format live under this one key


def run_dir(output_dir: str | os.PathLike, dataset: str, model: str, method: str, temperature: float, run: int) -> Path:
    return Path(output_dir) / dataset / model / method / f"temp-{temperature:g}" / f"run-{run}"


def read_answers(path: str | os.PathLike, *, repair: bool = False) -> list[dict[str, Any]]:
    """All complete records of an answer file.

    A last line without its newline is what a killed write leaves: it is dropped (and cut
    from the file when `repair`). A bad complete line (not a JSON object) is an error, not a
    torn write.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    complete, newline, torn = data.rpartition(b"\n")
    if torn and repair:
        with path.open("r+b") as fh:
            fh.truncate(len(complete) + len(newline))
    lines = complete.split(b"\n") if newline else []
    try:
        return list(jsonlines.Reader(lines).iter(type=dict, skip_empty=True))
    except jsonlines.InvalidLineError as exc:
        raise SpecbenchError(f"{path}:{exc.lineno}: corrupt answer line; fix or delete the file") from None


class AnswerWriter:
    """Appends one JSON line per question and flushes it to disk before the next one."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._writer = jsonlines.Writer(self._fh, compact=True, flush=True)

    def write(self, record: dict[str, Any]) -> None:
        self._writer.write(record)
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._writer.close()
        self._fh.close()

    def __enter__(self) -> AnswerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_meta(path: str | os.PathLike, meta: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(path)
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def iter_run_dirs(root: str | os.PathLike) -> Iterator[Path]:
    """Every folder under `root` that holds an answers file."""
    for path in sorted(Path(root).rglob(ANSWERS)):
        yield path.parent


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock for a run folder, so parallel jobs (Hydra launchers) that reach
    the same folder (e.g. the shared baseline) take turns instead of writing twice."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
