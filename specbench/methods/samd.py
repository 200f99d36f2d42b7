"""SAM-Decoding: retrieval by suffix automaton (Hu et al. 2024).

A suffix automaton over the token ids of the prompt and the text generated so far is grown by
one token at a time (amortised O(1) per token). Alongside it the drafter tracks the longest
suffix of the context that occurs *earlier* in the context (matching statistics: one
transition, or a few suffix-link steps, per new token). The tokens that followed that earlier
occurrence (its first one: each state keeps the end of its first occurrence) are the draft,
a deterministic chain verified by the shared engine. A match shorter than `min_match` drafts
nothing. Optionally a static corpus joins in: the REST datastore (`method.datastore`), searched
for the longest context suffix; the longer of the two matches drafts (the dynamic one on ties).
Dynamic and training-free.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specbench import datastore as ds
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.models import resolve_path


@dataclass
class SamdSettings:
    """`method=samd`."""

    max_draft: int  # tokens proposed after a match (the chain's length)
    min_match: int  # shortest match that still drafts
    datastore: str | None  # optional static corpus: a REST datastore folder or zoo:datastore; null = dynamic only
    static_max_match: int  # longest context suffix searched in the datastore
    static_matches: int  # datastore occurrences read to pick the most frequent continuation


class SuffixAutomaton:
    """Suffix automaton of a growing token sequence, with the longest earlier match of its end.

    States are parallel lists: `next` (token -> state), `link` (suffix link), `length` (the
    longest string of the state), `first_end` (end position of the state's first occurrence).
    After `extend(t)`, (`match_state`, `match_len`) is the longest suffix of the text that also
    ends at an earlier position; `match_end` is that earlier end position (-1 if none).
    """

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0
        self.tokens: list[int] = []
        self.match_state = 0
        self.match_len = 0

    def _new_state(self, length: int, link: int, nxt: dict[int, int], first_end: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def _advance_match(self, token: int) -> None:
        """Extend the match by `token` over the automaton of the text before it."""
        state, length = self.match_state, self.match_len
        while state > 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            self.match_state, self.match_len = self.next[state][token], length + 1
        else:
            self.match_state, self.match_len = 0, 0

    def extend(self, token: int) -> None:
        self._advance_match(token)  # before the text grows: the match ends earlier
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, 0, {}, pos)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.link[q], dict(self.next[q]), self.first_end[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        # A split may have moved the match's (shorter) string from its state to the new clone.
        while self.match_state > 0 and self.match_len <= self.length[self.link[self.match_state]]:
            self.match_state = self.link[self.match_state]

    def extend_all(self, tokens: list[int]) -> None:
        for token in tokens:
            self.extend(token)

    @property
    def match_end(self) -> int:
        return self.first_end[self.match_state] if self.match_len else -1

    def continuation(self, limit: int) -> list[int]:
        """Up to `limit` tokens after the first occurrence of the current match."""
        end = self.match_end
        return self.tokens[end + 1 : end + 1 + limit] if end >= 0 else []

    def longest_earlier_match(self, pattern: list[int]) -> tuple[int, int]:
        """(length, first end) of the longest suffix of `pattern` that occurs in the text (for tests)."""
        state, length = 0, 0
        for token in pattern:
            while state > 0 and token not in self.next[state]:
                state = self.link[state]
                length = self.length[state]
            if token in self.next[state]:
                state, length = self.next[state][token], length + 1
            else:
                state, length = 0, 0
        return length, (self.first_end[state] if length else -1)


def most_frequent_chain(conts: np.ndarray) -> list[int]:
    """The chain that follows, depth by depth, the most frequent next token among the rows
    agreeing so far (ties to the smaller id); stops at a document's end (-1)."""
    rows = conts
    chain: list[int] = []
    for depth in range(conts.shape[1]):
        column = [int(t) for t in rows[:, depth] if t >= 0]
        if not column:
            break
        token = min(Counter(column).items(), key=lambda kv: (-kv[1], kv[0]))[0]
        chain.append(token)
        rows = rows[rows[:, depth] == token]
    return chain


class SamdDrafter(Drafter):
    """Chain drafts from a suffix automaton over prompt + output (and an optional datastore)."""

    def __init__(self, max_draft: int, min_match: int, store: ds.Datastore | None = None,
                 static_max_match: int = 16, static_matches: int = 64) -> None:
        if max_draft < 1 or min_match < 1 or static_max_match < 1 or static_matches < 1:
            raise SpecbenchError("samd needs max_draft, min_match, static_max_match and static_matches >= 1")
        self.max_draft, self.min_match = max_draft, min_match
        self.store = store
        self.static_max_match, self.static_matches = static_max_match, static_matches
        self.sam = SuffixAutomaton()
        self.prompt_len = 0

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.sam = SuffixAutomaton()
        prompt = state.input_ids[0].tolist()
        self.prompt_len = len(prompt)
        self.sam.extend_all(prompt)

    def _static(self, limit: int) -> tuple[int, list[int]]:
        """(match length, chain) from the datastore; (0, []) without one or without a match."""
        if self.store is None:
            return 0, []
        tail = self.sam.tokens[-self.static_max_match :]
        match = self.store.longest_suffix(tail, self.static_max_match, self.min_match)
        if match is None:
            return 0, []
        return match.length, most_frequent_chain(self.store.continuations(match, limit, self.static_matches))

    def propose(self, ctx: DraftContext) -> DraftTree:
        seen = len(self.sam.tokens) - self.prompt_len
        if len(ctx.tokens) > seen:
            self.sam.extend_all(ctx.tokens[seen:])
        limit = min(self.max_draft, ctx.max_depth)
        if limit <= 0:
            return DraftTree.empty(ctx.device)
        dynamic_len = self.sam.match_len
        draft = self.sam.continuation(limit) if dynamic_len >= self.min_match else []
        static_len, static_draft = self._static(limit)
        if static_draft and static_len > (dynamic_len if draft else 0):
            draft = static_draft
        if not draft:
            return DraftTree.empty(ctx.device)
        return DraftTree.chain(torch.tensor(draft, dtype=torch.long, device=ctx.device))


class SAMD(SpeculativeMethod):
    """`method=samd`: `method.datastore` (optional) adds a static corpus to the dynamic automaton."""

    Settings = SamdSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        store = None
        if s.datastore:
            store = ds.Datastore.load(Path(resolve_path(str(s.datastore))), self.target.tokenizer)
        return SamdDrafter(max_draft=s.max_draft, min_match=s.min_match, store=store,
                           static_max_match=s.static_max_match, static_matches=s.static_matches)
