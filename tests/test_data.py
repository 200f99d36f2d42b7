import http.server
import threading
from pathlib import Path

import pytest

from helpers import OFFICIAL
from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASKS, Question, fetch, interleave, load_questions, select, sha256_of

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds


@pytest.mark.skipif(not OFFICIAL.exists(), reason="official question file not present")
def test_official_file_has_six_subtasks_of_80():
    questions = load_questions(OFFICIAL)
    assert len(questions) == 480
    for subtask in SUBTASKS:
        chosen = [q for q in questions if q.subtask == subtask]
        assert len(chosen) == 80, subtask
    assert all(len(q.turns) == 2 for q in questions if q.subtask == "mt_bench")
    assert all(len(q.turns) == 1 for q in questions if q.subtask != "mt_bench")
    assert len(select(questions, ["qa", "rag"], limit=3)) == 6


GOOD = '{"question_id": 1, "category": "qa", "turns": ["hi"]}'


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('{"question_id": 2, "turns": ["x"]}', "missing field 'category'"),
        ('{"question_id": 2, "category": "poetry", "turns": ["x"]}', "unknown category 'poetry'"),
        ('{"question_id": 2, "category": "qa", "turns": ["  "]}', "turn 1 is empty"),
        ('{"question_id": 2, "category": "qa", "turns": []}', "turns must be a list of 1 or 2"),
        ('{"question_id": "two", "category": "qa", "turns": ["x"]}', "question_id must be an integer"),
        ('{"question_id": 1, "category": "qa", "turns": ["x"]}', "duplicate question_id 1"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(GOOD + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(SpecbenchError) as info:
        load_questions(path)
    text = str(info.value)
    assert f"{path}:2" in text and message in text
    assert "\n" not in text


def test_non_utf8_and_missing_file(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(SpecbenchError, match=r"q.jsonl:2: not UTF-8"):
        load_questions(path)
    with pytest.raises(SpecbenchError, match="not found"):
        load_questions(tmp_path / "absent.jsonl")


def test_interleave_goes_round_robin_over_subtasks():
    def q(i: int, category: str) -> Question:
        return Question(i, category, ("x",))

    questions = [q(1, "writing"), q(2, "coding"), q(3, "qa"), q(4, "rag"), q(5, "rag"), q(6, "rag")]
    # writing and coding are both mt_bench; subtasks in order of first appearance
    assert [x.question_id for x in interleave(questions)] == [1, 3, 4, 2, 5, 6]
    assert interleave([]) == []


@pytest.fixture()
def http_file(tmp_path):
    """Serve a file over HTTP on loopback (the downloader's real code path, no network)."""
    served = tmp_path / "srv"
    served.mkdir()
    (served / "question.jsonl").write_text(GOOD + "\n", encoding="utf-8")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/question.jsonl", sha256_of(served / "question.jsonl")
    server.shutdown()


def test_fetch_verifies_checksum(tmp_path, http_file):
    url, digest = http_file
    dest = tmp_path / "data" / "question.jsonl"
    assert fetch(url, dest, digest) == dest
    assert load_questions(dest)[0].question_id == 1


def test_fetch_refuses_mismatch_and_keeps_nothing(tmp_path, http_file):
    url, _ = http_file
    dest = tmp_path / "data" / "question.jsonl"
    with pytest.raises(SpecbenchError, match="checksum mismatch"):
        fetch(url, dest, "0" * 64)
    assert not dest.exists()
    assert list(Path(dest.parent).iterdir()) == []
