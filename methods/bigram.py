"""A bigram-cache drafter: the worked example of a user method (docs/extending.md).

It remembers, for every token of the prompt and the output so far, the token that most recently
followed it, and drafts a chain by following those successors from the pending token: after
"the quick brown fox ... the" it proposes "quick brown fox". Training-free and cheap (a dict
lookup per drafted token); the shared engine verifies the chain, so output is lossless.

This file and `bigram.yaml` are all a method needs: specbench finds `methods/<name>.yaml` in
the working directory and loads the module its `impl` names from this folder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Prefilled, SpeculativeMethod


@dataclass
class Settings:
    """The method's settings: the YAML's keys besides name, impl, facts and suites. Types and
    meaning live here, values in bigram.yaml (declared once; a missing key is an error)."""

    max_draft: int  # longest chain proposed per step
    from_prompt: bool  # learn successors from the prompt too, not only from the output


class BigramDrafter(Drafter):
    """Proposes the chain of most recent successors, starting at the pending token."""

    def __init__(self, settings: Settings) -> None:
        if settings.max_draft < 1:
            raise SpecbenchError(f"bigram needs max_draft >= 1, got {settings.max_draft}")
        self.settings = settings
        self.successor: dict[int, int] = {}
        self.previous: int | None = None  # the last token already learned
        self.seen = 0  # generated tokens already learned

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        """A new generate call: start from the prompt (or from nothing)."""
        self.successor = {}
        self.previous = None
        self.seen = 0
        if self.settings.from_prompt:
            self._learn(state.input_ids[0].tolist())

    def _learn(self, tokens: list[int]) -> None:
        for token in tokens:
            if self.previous is not None:
                self.successor[self.previous] = token
            self.previous = token

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._learn(ctx.tokens[self.seen:])  # ctx.tokens[-1] is the pending root
        self.seen = len(ctx.tokens)
        chain: list[int] = []
        token = ctx.tokens[-1]
        while len(chain) < min(self.settings.max_draft, ctx.max_depth) and token in self.successor:
            token = self.successor[token]
            chain.append(token)
        return DraftTree.chain(torch.tensor(chain, dtype=torch.long, device=ctx.device))


class BigramCache(SpeculativeMethod):
    """`method=bigram`: the engine's draft-then-verify loop with the bigram drafter."""

    Settings = Settings

    def build_drafter(self) -> Drafter:
        return BigramDrafter(self.settings)
