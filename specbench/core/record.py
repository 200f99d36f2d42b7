"""What a run records, defined once: one turn's draft statistics (`TurnStats`, the same for our
engine and for an engine we did not write) and one question's answer record (`AnswerRecord`,
upstream Spec-Bench's format with our extras under `specbench`), built turn by turn by the runner's
backends and read back from the answer files by the analysis.

The answer file keeps upstream's keys (`question_id`, `category`, `choices[0]` with `turns`,
`decoding_steps`, `new_tokens`, `wall_time`, `accept_lengths`), so upstream's speed script reads it;
our per-turn extras (`output_ids`, `prompt_tokens`, `prefill_time`, `sections`, `stats`,
`max_new_tokens`, and a server's `finish_reason`) sit under EXTRA_KEY, one entry per turn.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from specbench.core.answers import EXTRA_KEY


@dataclass
class TurnStats(Mapping):
    """One turn's draft statistics (answer record `specbench.stats[turn]`). Every field is optional:
    a method records what it knows (the baseline none, a server its counters). Read like the JSON
    object it is written as (`stats["accepted_tokens"]`, `stats.get("draft_lengths")`)."""

    steps: int | None = None  # decoding steps after the prefill (our engine: every one, drafted or not)
    drafts: int | None = None  # steps that verified a draft (a server's count: steps without one are not counted)
    drafted_tokens: int | None = None  # draft tokens verified over the turn
    accepted_tokens: int | None = None  # of them, accepted (before the stop rule's cut)
    draft_lengths: list[int] | None = None  # nodes verified per step
    position_drafted: list[int] | None = None  # [d]: steps whose draft reached depth d + 1
    position_accepted: list[int] | None = None  # [d]: steps that accepted the draft's token at depth d + 1
    draft_depths: list[int] | None = None  # trees: depth per step (recorded where it differs from the length)
    tree_steps: int | None = None  # steps verified with a tree mask
    tree_fallback: str | None = None  # why trees fell back to chains
    budget: str | None = None  # "auto": the draft budget chose the verified nodes out of `proposed_lengths`
    proposed_lengths: list[int] | None = None
    top2_margin: list[float] | None = None  # the baseline's greedy top-2 logit margins (the lossless audit)
    generation_tokens: int | None = None  # a server's tokens generated over the turn
    steps_exact: bool | None = None  # a server: whether `accept_lengths` are its engine steps (streamed chunks)
    counters: dict[str, Any] = field(default_factory=dict)  # a method's own counters (online_updates, ...)

    #: keys an older answer file wrote for a server's counters, and the field each is now
    LEGACY = {"accepted_per_pos": "position_accepted", "draft_tokens": "drafted_tokens"}

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of the answer file: the fields that are set, then the method's counters."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "counters"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.counters}

    @classmethod
    def from_dict(cls, data: Any) -> TurnStats:
        """A turn's statistics as an answer file holds them (None, or an object: other keys are the
        method's counters; an older file's server keys are mapped)."""
        if isinstance(data, TurnStats):
            return data
        if not isinstance(data, Mapping):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)} - {"counters"}
        known, counters = {}, {}
        for key, value in data.items():
            if key in names:
                known[key] = value
            elif key in cls.LEGACY:
                known.setdefault(cls.LEGACY[key], value)
            else:
                counters[key] = value
        return cls(**known, counters=counters)

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


def turn_stats(record: Mapping[str, Any]) -> list[TurnStats]:
    """An answer record's statistics, one per turn (empty ones where a turn recorded none)."""
    extra = record.get(EXTRA_KEY) or {}
    entries = extra.get("stats") or [] if isinstance(extra, Mapping) else []
    return [TurnStats.from_dict(s) for s in entries]


@dataclass
class Turn:
    """One answered turn, as a backend measured it."""

    text: str  # the answer's text (EOS dropped, cut at a stop string, stripped)
    output_ids: list[int]  # every new token id (`1 + sum(accept_lengths)` of them)
    accept_lengths: list[int]  # tokens emitted per decoding step after the prefill
    seconds: float  # the turn's wall time (its share of a batch's)
    prompt_tokens: int
    max_new_tokens: int  # the stop rule's limit for this turn (the context may cut it)
    prefill: float | None = None  # seconds to the first token, where the backend splits it
    sections: dict[str, float] = field(default_factory=dict)  # timed sections (our engine's timer)
    stats: TurnStats = field(default_factory=TurnStats)
    finish_reason: str | None = None  # a server's
    batch: dict[str, Any] | None = None  # a batched sequence's own numbers (our engine's batches)


class AnswerRecord:
    """One question's answer record (upstream's format plus our extras), built turn by turn; the
    runner stamps who made it (`stamp`) and writes it."""

    EXTRA_KEYS = ("output_ids", "prompt_tokens", "prefill_time", "sections", "stats", "max_new_tokens")

    def __init__(self, question: Any) -> None:
        self.question = question
        self.texts: list[str] = []  # the answers so far (a later turn's prompt is built from them)
        self.choice: dict[str, list[Any]] = {k: [] for k in ("turns", "decoding_steps", "new_tokens", "wall_time")}
        self.accept: list[int] = []
        self.extra: dict[str, list[Any]] = {k: [] for k in self.EXTRA_KEYS}

    def add(self, turn: Turn) -> None:
        """The next turn (its text joins `texts` unless a batch put it there when the turn finished)."""
        if len(self.texts) == len(self.choice["turns"]):
            self.texts.append(turn.text)
        self.choice["turns"].append(turn.text)
        self.choice["decoding_steps"].append(len(turn.accept_lengths))
        self.choice["new_tokens"].append(len(turn.output_ids))
        self.choice["wall_time"].append(turn.seconds)
        self.accept.extend(turn.accept_lengths)
        for key, value in zip(self.EXTRA_KEYS, (turn.output_ids, turn.prompt_tokens, turn.prefill, turn.sections,
                                                turn.stats.as_dict(), turn.max_new_tokens), strict=True):
            self.extra[key].append(value)
        for key, value in (("finish_reason", turn.finish_reason), ("batch", turn.batch)):  # some backends' only
            if value is not None or key in self.extra:  # one entry per turn from the first one that has it
                self.extra.setdefault(key, [None] * (len(self.choice["turns"]) - 1)).append(value)

    def record(self) -> dict[str, Any]:
        q = self.question
        return {
            "question_id": q.question_id,
            "category": q.category,
            "choices": [{"index": 0, **self.choice, "accept_lengths": self.accept}],
            EXTRA_KEY: {"subtask": q.subtask, **self.extra},
        }


def stamp(record: dict[str, Any], model: str, method: str, run: int) -> dict[str, Any]:
    """Who made the record: upstream's model_id, answer_id and tstamp, our method and run."""
    record.update(model_id=model, answer_id=uuid.uuid4().hex, tstamp=time.time())
    record[EXTRA_KEY].update(method=method, run=run)
    return record
