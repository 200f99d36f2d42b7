"""Long inputs: every question of a dataset given a first turn of about N tokens (`length=N`).

The extra tokens come from the dataset's own material: the documents of its summarization and
retrieval questions (articles, passages: every line of their first turns with at least
`MIN_WORDS` words, an instruction such as "Summarize:" or "Passage 3:" cut off its front). A
question's first turn becomes

    Background documents:

    [1] <a document of another question>

    [2] ...

    <the question's own first turn, unchanged>

so the task stays the question's own and the documents before it are the long context a
retrieval-augmented assistant sees. The documents are drawn in an order fixed by the question's id and
the length (the same input in every run and for every method), never from the question itself, and
the last one is cut at a word so the turn has about N tokens. Later turns are unchanged. A question
whose first turn is already N tokens or longer (or so near that no document fits) keeps it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from specbench.core.errors import SpecbenchError
from specbench.core.questions import Question

#: subtasks whose first turns hold documents (the material of every long input)
DOCUMENT_SUBTASKS = ("summarization", "rag")
#: a line shorter than this (in words) is an instruction or a question, not a document
MIN_WORDS = 20
#: an instruction before a document on its line ("Summarize:", "Passage 2:") has at most this many words
PREFIX_WORDS = 4
HEADER = "Background documents:"


@dataclass(frozen=True)
class Document:
    source: int  # the question it was taken from
    text: str


def documents(questions: list[Question]) -> list[Document]:
    """The documents of the dataset's summarization and retrieval questions, in file order."""
    out = []
    for q in questions:
        if q.subtask not in DOCUMENT_SUBTASKS or not q.turns:
            continue
        for line in q.turns[0].splitlines():
            line = line.strip()
            head, sep, rest = line.partition(": ")
            if sep and len(head.split()) <= PREFIX_WORDS and not head.endswith("."):
                line = rest.strip()
            if len(line.split()) >= MIN_WORDS:
                out.append(Document(q.question_id, line))
    return out


def lengthen(question: Question, material: list[Document], tokens: int, count: Callable[[str], int],
             seed: int = 0) -> Question:
    """`question` with a first turn of about `tokens` tokens (`count` measures a text), the documents
    of other questions before its own turn; unchanged when its turn is that long already."""
    own = question.turns[0]
    if count(own) >= tokens:
        return question
    pool = [d.text for d in material if d.source != question.question_id]
    random.Random(f"{seed}:{question.question_id}:{tokens}").shuffle(pool)
    chosen: list[str] = []

    def turn(docs: list[str]) -> str:
        listed = "\n\n".join(f"[{i}] {text}" for i, text in enumerate(docs, 1))
        return f"{HEADER}\n\n{listed}\n\n{own}"

    for doc in pool:
        if count(turn([*chosen, doc])) < tokens:
            chosen.append(doc)
            continue
        words = doc.split()
        low, high = 0, len(words)  # the most words of `doc` that keep the turn within `tokens`
        while low < high:
            mid = (low + high + 1) // 2
            if count(turn([*chosen, " ".join(words[:mid])])) <= tokens:
                low = mid
            else:
                high = mid - 1
        if low:
            chosen.append(" ".join(words[:low]))
        if not chosen:  # the header alone would pass N: the turn is as long as it gets
            return question
        return replace(question, turns=(turn(chosen), *question.turns[1:]))
    have = count(turn(chosen)) if chosen else count(own)
    raise SpecbenchError(
        f"length={tokens}: the dataset's documents give question {question.question_id} only {have} tokens; "
        f"choose a smaller length=... (or a dataset with more {' or '.join(DOCUMENT_SUBTASKS)} questions)"
    )


def lengthen_all(questions: list[Question], pool: list[Question], tokens: int, count: Callable[[str], int],
                 seed: int = 0) -> list[Question]:
    """Every question of `questions` lengthened from the documents of `pool` (the whole dataset)."""
    material = documents(pool)
    if not material:
        raise SpecbenchError(
            f"length={tokens}: the dataset has no documents to build long inputs from (no "
            f"{' or '.join(DOCUMENT_SUBTASKS)} question with a line of {MIN_WORDS} or more words); use a dataset "
            "that has them or leave length unset"
        )
    return [lengthen(q, material, tokens, count, seed) for q in questions]


def parse_length(value: object) -> int | None:
    """`length`'s value: null, a positive integer, or a string such as "2k" (2048 tokens)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", value)) and int(m.group(1)) > 0:
        return int(m.group(1)) * (1024 if m.group(2) else 1)
    raise SpecbenchError(f"length must be a positive number of input tokens (e.g. length=2048 or length=2k) or null, "
                         f"got {value!r}")
