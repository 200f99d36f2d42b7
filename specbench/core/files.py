"""Files that several processes share: the one way specbench writes a small file whole (a unique
temporary sibling, then a rename, so a reader never sees half a file and two writers never share a
temporary name), the one way it makes processes take turns (a lock file, through filelock), and the
one way it builds a cached folder (`build_once`: built aside, its card written last, renamed into
place under the folder's lock, so a reader never sees half a build and two builders never race)."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock, Timeout

from specbench.core.errors import SpecbenchError


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


#: set within `find_only`: why nothing may be built there (a run's parts are built before its clock)
_FIND_ONLY: ContextVar[str | None] = ContextVar("specbench_find_only", default=None)


@contextmanager
def find_only(why: str) -> Iterator[None]:
    """Within the block a cached folder that is not built is an error (`check_buildable`) instead of a
    build: resolving a path only finds. `why` ends the error's line (what should have built it)."""
    token = _FIND_ONLY.set(why)
    try:
        yield
    finally:
        _FIND_ONLY.reset(token)


def check_buildable(final: Path) -> None:
    """A one-line error when `final` would be built inside `find_only`."""
    if (why := _FIND_ONLY.get()) is not None:
        raise SpecbenchError(f"{final} is not built; {why}")


def build_once(final: Path, card: str, build: Callable[[Path], None], announce: str | None = None,
               rebuild: bool = False) -> Path:
    """The cached folder `final`, complete when its file `card` exists: when it is not (or `rebuild`),
    `replace_folder` builds it, under `final`'s lock file, so a second process waits and then reuses
    it; `announce` is said on stderr when this process builds. Inside `find_only`, a folder to build
    is an error."""
    final = Path(final)
    if (final / card).is_file() and not rebuild:
        return final
    check_buildable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(final.with_name(final.name + ".lock")):
        if (final / card).is_file() and not rebuild:
            return final
        if announce:
            print(announce, file=sys.stderr, flush=True)
        return replace_folder(final, card, build)


def replace_folder(final: Path, card: str, build: Callable[[Path], None]) -> Path:
    """`build(tmp)` fills a temporary sibling of `final` (its file `card` written last, the mark of a
    complete build), which then takes `final`'s place; the caller holds `final`'s lock. A build that
    fails leaves nothing behind and `final` as it was."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a finished folder is a readable cache
        build(tmp)
        if not (tmp / card).is_file():
            raise RuntimeError(f"building {final.name} wrote no {card}: the build is incomplete")
        if final.exists():  # a rebuild: the old one moved aside first (a rename cannot overwrite a folder)
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def safetensors_header(data: bytes | BinaryIO) -> tuple[int, dict]:
    """(header length, header) of a safetensors file: its bytes, or the file open at its start (left just
    after the header, where the tensors' data begins). The layout: 8 bytes little-endian length, then
    the JSON header (each tensor's dtype, shape and data offsets, and `__metadata__`)."""
    read = data.read if hasattr(data, "read") else io.BytesIO(data).read
    size = int.from_bytes(read(8), "little")
    return size, json.loads(read(size))
