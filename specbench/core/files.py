"""Files that several processes share: the one way specbench writes a small file whole (a unique
temporary sibling, then a rename, so a reader never sees half a file and two writers never share a
temporary name), and the one way it makes processes take turns (a lock file, through filelock)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` through a temporary sibling and a rename: never half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


@contextmanager
def exclusive(path: str | os.PathLike, waiting: str | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on the lock file `path` for the block: another process (or thread) that
    asks for it waits until the block ends. `waiting` is said on stderr when the lock is held elsewhere;
    yields whether this one had to wait."""
    lock = FileLock(str(path))
    waited = False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            print(waiting, file=sys.stderr, flush=True)
        lock.acquire()
        waited = True
    try:
        yield waited
    finally:
        lock.release()
