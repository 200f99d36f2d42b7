"""core.files: the one atomic writer and the one lock that processes share."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specbench.core.files import exclusive, write_atomic

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
