"""Answer files: upstream Spec-Bench JSONL, appended and flushed per question, resumable.

Layout: <output_dir>/<dataset>/<model>/<method>/temp-<t>/[batch-<B>/]run-<r>/{answers.jsonl,meta.json}
(the batch level only for batched runs, batch_size > 1).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import jsonlines

from specbench.core.errors import SpecbenchError
from specbench.core.files import exclusive, write_atomic

ANSWERS = "answers.jsonl"
ERRORS = "errors.jsonl"  # questions that failed (reason per row); kept apart so answers stay upstream-readable
META = "meta.json"
EXTRA_KEY = "specbench"  # our fields beyond the upstream format live under this one key
#: a run with `method.budget=fixed` is filed and reported as <method><FIXED_SUFFIX> (auto keeps the name)
FIXED_SUFFIX = "-fixed"


def run_dir(
    output_dir: str | os.PathLike, dataset: str, model: str, method: str, temperature: float, run: int, batch: int = 1,
    length: int | None = None,
) -> Path:
    """`<output_dir>/<dataset>/<model>/<method>/temp-<t>/[len-<N>/][batch-<B>/]run-<r>`: the levels of a
    long-input run (`length=N`) and of a batched one only where they apply."""
    folder = Path(output_dir) / dataset / model / method / f"temp-{temperature:g}"
    if length is not None:
        folder = folder / f"len-{length}"
    return (folder / f"batch-{batch}" if batch > 1 else folder) / f"run-{run}"


def repair_torn_tail(path: str | os.PathLike) -> bytes:
    """Cut a last line without its newline (what a killed write leaves) from a JSONL file; returns
    the file's bytes as they are afterwards (b"" when there is no file)."""
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as fh:
            fh.truncate(keep)
    return data[:keep]


def read_answers(path: str | os.PathLike, *, repair: bool = False) -> list[dict[str, Any]]:
    """All complete records of an answer file.

    A last line without its newline is what a killed write leaves: it is dropped (and cut
    from the file when `repair`). A bad complete line (not a JSON object) is an error, not a
    torn write.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = repair_torn_tail(path) if repair else path.read_bytes()
    complete, newline, _torn = data.rpartition(b"\n")
    lines = complete.split(b"\n") if newline else []
    try:
        return list(jsonlines.Reader(lines).iter(type=dict, skip_empty=True))
    except jsonlines.InvalidLineError as exc:
        raise SpecbenchError(f"{path}:{exc.lineno}: corrupt line (not a JSON object); fix or delete the file") from None


class AnswerWriter:
    """Appends one JSON line per question and flushes it to disk before the next one.

    A failed write (disk full, quota, I/O error) becomes one SpecbenchError naming the file;
    closing after such a failure does not raise a second error over it. Whatever reached the
    disk of a failed line is a torn tail, which the next run cuts before it resumes.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self._open()
        self._writer = jsonlines.Writer(self._fh, compact=True, flush=True)
        self._failed = False

    def _open(self) -> IO[str]:
        return self.path.open("a", encoding="utf-8")

    def _explain(self, exc: OSError) -> SpecbenchError:
        self._failed = True
        return SpecbenchError(
            f"cannot write {self.path} ({exc.strerror or exc}); free space, then run again to resume"
        )

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._writer.write(record)
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise self._explain(exc) from None

    def close(self) -> None:
        try:
            self._writer.close()
            self._fh.close()
        except OSError as exc:
            if not self._failed:
                raise self._explain(exc) from None
            # the buffered remains of the line that failed cannot be written either: drop them
            with contextlib.suppress(OSError, ValueError):
                os.close(self._fh.fileno())

    def __enter__(self) -> AnswerWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._failed = True  # the error in flight is the one to report
        self.close()


def write_meta(path: str | os.PathLike, meta: dict[str, Any]) -> None:
    """A run folder's meta.json, whole or not at all (a full disk or a read-only folder: one line)."""
    try:
        write_atomic(path, json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    except OSError as exc:
        raise SpecbenchError(f"cannot write {path} ({exc.strerror or exc}); free some space or make the folder "
                             "writable, then run the same command again to resume") from None


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """A run folder's meta.json (None when absent); a file that is not a JSON object is an error."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        meta = exc
    if not isinstance(meta, dict):
        why = f"cannot be read ({meta})" if isinstance(meta, Exception) else "is not a JSON object"
        raise SpecbenchError(f"{path} {why}; restore it, or start that run over with overwrite=true")
    return meta


def iter_run_dirs(root: str | os.PathLike) -> Iterator[Path]:
    """Every folder under `root` that holds an answers file."""
    for path in sorted(Path(root).rglob(ANSWERS)):
        yield path.parent


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock for a run folder, so parallel jobs (Hydra launchers) that reach
    the same folder (e.g. the shared baseline) take turns instead of writing twice."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(folder.parent / f".{folder.name}.lock"):
        yield
