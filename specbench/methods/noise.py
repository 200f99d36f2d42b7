"""`method=noise`: the lossless audit's control for low precision, not a method to decode with.

Its drafter proposes random tokens, so a step almost never accepts one and emits the target's own
next token: the answers are the baseline's greedy tokens, each computed in a forward over several
rows (the root and the random nodes: the shapes the methods verify, chains through the causal mask
and trees through the 4D mask) instead of one. In float32 they equal the baseline's token for token;
in bfloat16 and float16 the share of its answers that leave the baseline's is the *noise floor*:
how often arithmetic alone moves a correctly verified greedy answer. The report shows every
method's divergence rate beside it (analysis.audit.lossless_audit, above_floor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbench.core.errors import SpecbenchError
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod


@dataclass
class NoiseSettings:
    """`method=noise`."""

    rows: list[int]  # draft nodes per step, in turn
    tree_every: int = field(metadata={"min": 0})  # every n-th step a random tree (0 = chains only)
    seed: int = field(metadata={"min": 0})  # of the random tokens (the sampling generator is untouched)


class NoiseDrafter(Drafter):
    """Random drafts of `rows[i % len(rows)]` nodes at step i: chains, and every `tree_every`-th step a
    tree with random parents. Its own generator, reseeded per call, so answers repeat."""

    def __init__(self, vocab: int, rows: list[int], tree_every: int, seed: int) -> None:
        if not rows or any(int(r) < 1 for r in rows):
            raise SpecbenchError(f"noise needs rows of at least 1 node each, got {list(rows)} (e.g. rows=[1,4,16,60])")
        self.vocab, self.rows, self.tree_every, self.seed = vocab, [int(r) for r in rows], tree_every, seed
        self.gen = torch.Generator().manual_seed(seed)

    def begin(self, state, sampling) -> None:
        self.gen.manual_seed(self.seed)

    def propose(self, ctx: DraftContext) -> DraftTree:
        n = self.rows[ctx.step % len(self.rows)]
        if ctx.max_depth < 1:
            return DraftTree.empty(ctx.device)
        tokens = torch.randint(self.vocab, (n,), generator=self.gen)
        if self.tree_every and ctx.step % self.tree_every == self.tree_every - 1 and n > 1:
            parents = tuple(int(torch.randint(i + 1, (1,), generator=self.gen)) - 1 for i in range(n))
            return DraftTree(tokens.to(ctx.device), parents)
        return DraftTree.chain(tokens[: ctx.max_depth].to(ctx.device))


class Noise(SpeculativeMethod):
    """`method=noise`."""

    Settings = NoiseSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        vocab = int(self.target.model.get_output_embeddings().weight.shape[0])
        return NoiseDrafter(vocab, list(s.rows), s.tree_every, s.seed)
