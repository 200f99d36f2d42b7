"""What the report needs of an answer file, checked once when it is read: every field the
metrics use, with its type and range, so a bad file is named in one line instead of ending in a
traceback (KeyError, ZeroDivisionError) or in a silently wrong number (inf tokens/s)."""

from __future__ import annotations

import math
from typing import Any

from specbench.core.answers import EXTRA_KEY
from specbench.core.errors import SpecbenchError
from specbench.core.questions import MT_BENCH_CATEGORIES, SUBTASKS

CATEGORIES = frozenset(MT_BENCH_CATEGORIES + SUBTASKS[1:])
STAT_LISTS = ("position_drafted", "position_accepted", "top2_margin")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(x) and x >= 0 for x in value)


def _numbers_or_none(value: Any) -> bool:
    return isinstance(value, list) and all(x is None or is_number(x) for x in value)


def record_problem(record: dict[str, Any]) -> str | None:
    """The first thing wrong with one answer record (upstream Spec-Bench format, our extras
    optional), or None when the report can use it."""
    for key in ("question_id", "category"):
        if key not in record:
            return f"no '{key}'"
    qid, category = record["question_id"], record["category"]
    if not is_int(qid):
        return f"question_id must be an integer, got {qid!r}"
    if category not in CATEGORIES:
        return f"question {qid}: unknown category {category!r}"
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return f"question {qid}: 'choices' is missing or not a list of objects"
    return choice_problem(choices[0], qid) or extra_problem(record.get(EXTRA_KEY), qid)


def choice_problem(choice: dict[str, Any], qid: int) -> str | None:
    """Per-turn new_tokens and wall_time (the tokens/s), accept_lengths and decoding_steps."""
    tokens, seconds = choice.get("new_tokens"), choice.get("wall_time")
    for key, value in (("new_tokens", tokens), ("wall_time", seconds)):
        if value is None:
            return f"question {qid}: choices[0] has no '{key}'"
        if not isinstance(value, list) or not value:
            return f"question {qid}: {key} must be a list with one entry per turn, got {value!r}"
    if not _counts(tokens):
        return f"question {qid}: new_tokens must be token counts (integers >= 0), got {tokens!r}"
    if not all(is_number(s) and s >= 0 for s in seconds):
        return f"question {qid}: wall_time must be seconds (finite numbers >= 0), got {seconds!r}"
    if len(tokens) != len(seconds):
        return f"question {qid}: {len(tokens)} new_tokens but {len(seconds)} wall_time entries (one per turn each)"
    if sum(seconds) <= 0:
        return f"question {qid}: wall_time adds up to 0 seconds, so its tokens/s would be infinite"
    turns = choice.get("turns")
    if turns is not None and (not isinstance(turns, list) or len(turns) != len(tokens)
                              or not all(isinstance(t, str) for t in turns)):
        return f"question {qid}: turns must be a list of {len(tokens)} answer text(s), one per turn"
    if not _counts(choice.get("accept_lengths", [])):
        return f"question {qid}: accept_lengths must be a list of tokens per step (integers >= 0)"
    if choice.get("decoding_steps") is not None and not _counts(choice["decoding_steps"]):
        return f"question {qid}: decoding_steps must be a list of step counts (integers >= 0)"
    return None


def extra_problem(extra: Any, qid: int) -> str | None:
    """Our fields under EXTRA_KEY that the report reads (all optional)."""
    if extra is None:
        return None
    where = f"question {qid}: {EXTRA_KEY}"
    if not isinstance(extra, dict):
        return f"{where} must be an object"
    if "prefill_time" in extra and not _numbers_or_none(extra["prefill_time"]):
        return f"{where}.prefill_time must be a list of seconds"
    if "output_ids" in extra and not (isinstance(extra["output_ids"], list)
                                      and all(_counts(ids) for ids in extra["output_ids"])):
        return f"{where}.output_ids must be a list of token id lists"
    for key in ("sections", "stats"):
        entries = extra.get(key, [])
        if not isinstance(entries, list) or not all(e is None or isinstance(e, dict) for e in entries):
            return f"{where}.{key} must be a list of objects (one per turn)"
    for sections in extra.get("sections", []):
        if not all(is_number(v) for v in (sections or {}).values()):
            return f"{where}.sections must map section names to seconds"
    for stats in extra.get("stats", []):
        if any(not _numbers_or_none((stats or {}).get(key, [])) for key in STAT_LISTS):
            return f"{where}.stats: {', '.join(STAT_LISTS)} must be lists of numbers"
    return None


def check_records(records: list[dict[str, Any]], path: Any) -> list[dict[str, Any]]:
    """`records` (read from `path`) when the report can use every one; else a one-line error
    naming the file, the record and its first problem."""
    for index, record in enumerate(records, 1):
        if problem := record_problem(record):
            raise SpecbenchError(f"{path}: record {index}: {problem}; fix or delete the file")
    return records


def check_failures(rows: list[dict[str, Any]], path: Any) -> dict[int, str]:
    """errors.jsonl rows -> {question id: reason}."""
    failed = {}
    for index, row in enumerate(rows, 1):
        if not is_int(row.get("question_id")):
            raise SpecbenchError(f"{path}: row {index}: question_id must be an integer; fix or delete the file")
        failed[row["question_id"]] = str(row.get("error") or "no reason recorded")
    return failed


def check_meta(meta: Any, path: Any) -> dict[str, Any]:
    """A run's meta.json as the report reads it (identity, facts, environment, expected questions)."""
    if not isinstance(meta, dict):
        raise SpecbenchError(f"{path}: holds a JSON {type(meta).__name__}, not an object; fix or delete the file")
    for key in ("identity", "facts", "environment"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise SpecbenchError(f"{path}: '{key}' must be an object; fix or delete the file")
    expected = meta.get("expected_questions", [])
    if not isinstance(expected, list) or not all(is_int(q) for q in expected):
        raise SpecbenchError(f"{path}: expected_questions must be a list of question ids; fix or delete the file")
    method = (meta.get("identity") or {}).get("method")
    if method is not None and not isinstance(method, dict):
        raise SpecbenchError(f"{path}: identity.method must be an object; fix or delete the file")
    return meta
