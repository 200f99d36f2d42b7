"""core.files: the one atomic writer, the one lock and the one cached-folder builder that processes share."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from specbench.core.files import build_once, exclusive, write_atomic

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

HOLD = """
import sys, time
from specbench.core.files import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_second_process_waits_for_the_lock_and_is_told(tmp_path, capsys):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with exclusive(lock, waiting="busy: waiting") as waited:
            assert waited  # the lock was held elsewhere: this one waited for it
        assert "busy: waiting" in capsys.readouterr().err
    finally:
        holder.wait(timeout=30)
    with exclusive(lock, waiting="busy: waiting") as waited:  # free now: no wait, nothing said
        assert not waited
    assert "busy" not in capsys.readouterr().err


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "meta.json"
    write_atomic(path, "one\n")
    write_atomic(path, "two\n")
    assert path.read_text() == "two\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["meta.json"]


def _card_writer(calls: list[str], text: str = "ok", pause: float = 0.0):
    def build(tmp):
        calls.append(text)
        (tmp / "data.txt").write_text(text)
        time.sleep(pause)
        (tmp / "card.json").write_text("{}")  # last
    return build


def test_build_once_builds_once_and_a_concurrent_caller_reuses(tmp_path):
    final, calls = tmp_path / "part", []
    builders = [threading.Thread(target=build_once, args=(final, "card.json", _card_writer(calls, pause=0.5)))
                for _ in range(2)]
    for b in builders:
        b.start()
    for b in builders:
        b.join()
    assert calls == ["ok"]  # the second waited on the lock, then found the card
    assert build_once(final, "card.json", _card_writer(calls)) == final and calls == ["ok"]
    assert (final / "data.txt").read_text() == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part", "part.lock"]  # no temporary folder left


def test_build_once_leaves_nothing_from_a_failed_or_unfinished_build(tmp_path):
    final = tmp_path / "part"

    def fails(tmp):
        (tmp / "data.txt").write_text("half")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        build_once(final, "card.json", fails)
    with pytest.raises(RuntimeError, match="wrote no card.json"):
        build_once(final, "card.json", lambda tmp: (tmp / "data.txt").write_text("no card"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.lock"]
    build_once(final, "card.json", _card_writer([], "first"))
    with pytest.raises(ValueError):  # a failed rebuild keeps the folder that was there
        build_once(final, "card.json", fails, rebuild=True)
    assert (final / "data.txt").read_text() == "first"
    build_once(final, "card.json", _card_writer([], "second"), rebuild=True)
    assert (final / "data.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part", "part.lock"]
