"""Ctrl-C during a run: finish the question in flight, then stop cleanly; a second Ctrl-C stops at once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def interrupt_flag() -> Iterator[Callable[[], bool]]:
    """Within the block SIGINT sets a flag (read it with the yielded function) instead of
    raising; a second SIGINT raises KeyboardInterrupt at once. The previous handler comes back
    on exit. Outside the main thread (where signals cannot be caught) the flag stays False."""
    pressed = [False]
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handler(signum: int, frame: Any) -> None:
        if pressed[0]:
            raise KeyboardInterrupt
        pressed[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: pressed[0]
    finally:
        signal.signal(signal.SIGINT, previous)
