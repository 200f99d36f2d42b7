"""The one answer record and the one step-statistics type (specbench.core.record): what every backend
writes and what the analysis reads back."""

from __future__ import annotations

import pytest

from specbench.core.answers import EXTRA_KEY
from specbench.core.questions import Question
from specbench.core.record import AnswerRecord, Turn, TurnStats, stamp, turn_stats

pytestmark = pytest.mark.fast


def test_turn_stats_round_trip_and_read_like_the_json_they_are():
    stats = TurnStats(steps=3, drafted_tokens=6, accepted_tokens=4, draft_lengths=[2, 2, 2],
                      position_drafted=[3, 3], position_accepted=[3, 1], counters={"online_updates": 2})
    data = stats.as_dict()
    assert data == {"steps": 3, "drafted_tokens": 6, "accepted_tokens": 4, "draft_lengths": [2, 2, 2],
                    "position_drafted": [3, 3], "position_accepted": [3, 1], "online_updates": 2}
    assert TurnStats.from_dict(data) == stats  # a method's own counters come back as its counters
    assert stats["accepted_tokens"] == 4 and stats.get("tree_steps") is None and "draft_depths" not in stats
    assert TurnStats().as_dict() == {} and TurnStats.from_dict(None) == TurnStats()


def test_an_older_server_record_reads_as_the_same_type():
    old = {"drafted_tokens": 20, "accepted_tokens": 5, "drafts": 2, "draft_tokens": 20, "accepted_per_pos": [2, 3],
           "generation_tokens": 9, "steps_exact": True}
    stats = TurnStats.from_dict(old)
    assert (stats.drafts, stats.drafted_tokens, stats.position_accepted) == (2, 20, [2, 3])
    assert stats.counters == {}  # nothing of it left unread


def test_a_record_is_built_turn_by_turn_in_upstream_format():
    question = Question(question_id=7, category="writing", turns=("a", "b"))
    answer = AnswerRecord(question)
    answer.add(Turn("one", [5, 6, 7], [2], 0.5, prompt_tokens=4, max_new_tokens=8,
                    stats=TurnStats(steps=1, accepted_tokens=1)))
    answer.texts.append("two")  # a batch that finished the turn put its text first: it is not added twice
    answer.add(Turn("two", [8], [], 0.25, prompt_tokens=9, max_new_tokens=8, finish_reason="stop"))
    record = stamp(answer.record(), "m", "sps", 2)
    choice = record["choices"][0]
    assert answer.texts == ["one", "two"] and choice["turns"] == ["one", "two"]
    assert choice["new_tokens"] == [3, 1] and choice["decoding_steps"] == [1, 0] and choice["accept_lengths"] == [2]
    assert record[EXTRA_KEY]["finish_reason"] == [None, "stop"] and record[EXTRA_KEY]["run"] == 2
    assert turn_stats(record) == [TurnStats(steps=1, accepted_tokens=1), TurnStats()]
    assert record["model_id"] == "m" and record[EXTRA_KEY]["method"] == "sps"
