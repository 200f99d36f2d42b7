"""REST: retrieval-based speculative decoding (He et al. 2023).

Each step the longest suffix of the context (prompt + generated, up to `max_suffix` tokens,
at least `min_suffix`) that occurs in the datastore retrieves the tokens that followed its
occurrences; their most frequent `num_draft` prefixes form a trie, verified as a token tree
by the shared engine (deterministic candidates, lossless under sampling too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specbench import datastore as ds
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.models import resolve_path


@dataclass
class RestSettings:
    """`method=rest`."""

    datastore: str | None  # datastore folder (`python -m specbench datastore build`) or zoo:datastore
    max_suffix: int  # longest context suffix matched
    min_suffix: int  # shortest suffix that still retrieves
    num_draft: int  # trie nodes verified per step
    draft_depth: int  # continuation tokens retrieved per match (the deepest draft)
    max_matches: int  # occurrences read per step (evenly spread over the match range)


def resolve_datastore(spec: str | None) -> Path:
    if not spec:
        raise SpecbenchError("method rest needs a datastore: build one with `python -m specbench datastore build "
                             "--corpus FILE --model MODEL --out DIR` and set method.datastore=DIR")
    return Path(resolve_path(str(spec)))


class RestDrafter(Drafter):
    """Longest-suffix retrieval from a datastore, merged into a frequency-ranked trie."""

    def __init__(self, store: ds.Datastore, max_suffix: int, min_suffix: int, num_draft: int, draft_depth: int,
                 max_matches: int) -> None:
        if not 1 <= min_suffix <= max_suffix or num_draft < 1 or draft_depth < 1 or max_matches < 1:
            raise SpecbenchError("rest needs 1 <= min_suffix <= max_suffix and positive num_draft, draft_depth, "
                                 "max_matches")
        self.store = store
        self.max_suffix, self.min_suffix = max_suffix, min_suffix
        self.num_draft, self.depth, self.max_matches = num_draft, draft_depth, max_matches
        self.prompt: list[int] = []

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.prompt = state.input_ids[0, -self.max_suffix :].tolist()

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.depth, ctx.max_depth)
        if depth <= 0:
            return DraftTree.empty(ctx.device)
        tail = ctx.tokens[-self.max_suffix :]
        if len(tail) < self.max_suffix:
            tail = self.prompt[max(0, len(self.prompt) - (self.max_suffix - len(tail))) :] + tail
        match = self.store.longest_suffix(tail, self.max_suffix, self.min_suffix)
        if match is None:
            return DraftTree.empty(ctx.device)
        conts = self.store.continuations(match, depth, self.max_matches)
        tokens, parents, counts = ds.top_trie(conts, self.num_draft, with_counts=True)
        if not tokens:
            return DraftTree.empty(ctx.device)
        # Confidence: the share of the parent's continuations that go on with this token.
        above = [len(conts) if p < 0 else counts[p] for p in parents]
        confidence = torch.tensor([c / max(a, 1) for c, a in zip(counts, above)])
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=ctx.device), tuple(parents),
                         confidence=confidence)


class REST(SpeculativeMethod):
    """`method=rest`: `method.datastore` is a datastore folder or `zoo:datastore`."""

    Settings = RestSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        store = ds.Datastore.load(resolve_datastore(s.datastore), self.target.tokenizer)
        return RestDrafter(store, max_suffix=s.max_suffix, min_suffix=s.min_suffix, num_draft=s.num_draft,
                           draft_depth=s.draft_depth, max_matches=s.max_matches)
