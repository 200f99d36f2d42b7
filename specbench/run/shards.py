"""Shards: one long run split over workers, `shard=i/n` answering every n-th question from the i-th."""

from __future__ import annotations

from specbench.core.errors import SpecbenchError
from specbench.core.questions import Question


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """`i/n` (1 <= i <= n) -> (i, n)."""
    if spec in (None, ""):
        return None
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise SpecbenchError(f"shard must look like i/n with 1 <= i <= n (e.g. shard=1/4), got {spec!r}")
    return i, n


def shard(questions: list[Question], spec: str | None) -> list[Question]:
    """Every n-th question starting at the i-th: deterministic, and balanced across subtasks."""
    parsed = parse_shard(spec)
    if parsed is None:
        return questions
    i, n = parsed
    return questions[i - 1 :: n]


def shard_dir(spec: str) -> str:
    i, n = parse_shard(spec)  # type: ignore[misc]
    return f"shard-{i}-of-{n}"
