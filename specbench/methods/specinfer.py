"""SpecInfer: several small draft models whose proposals are merged into one token tree
(Miao et al. 2024).

Each draft model proposes a chain of K tokens from the same context with its own KV cache
(the SpS drafter: greedy at temperature 0, sampled at temperature > 0); the chains are merged
into a token trie (shared prefixes become one node, so siblings are distinct tokens) and the
shared engine verifies the trie in one target forward.

Verification under sampling: the drafts come from different distributions, while the engine's
"iid" / "without_replacement" rules take one draft distribution per row shared by all siblings,
so a tree mixing two draft models is verified with the candidates as "deterministic" (no draft
probabilities): at a row the target tries its children in order, accepts child x with
probability q(x) and otherwise continues with q without x, as SpecInfer's multi-step
rejection with one-hot draft distributions. That rule is lossless for any candidates drawn
independently of the target's randomness, and duplicate siblings would change nothing, so the
trie merge is lossless too. (It accepts less than min(1, q/p) would for a single draft's chain.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod, Verdict
from specbench.engine.api import Prefilled
from specbench.methods.drafts import SpsDrafter, load_draft, logits_width
from specbench.models import LoadedModel


@dataclass
class SpecInferSettings:
    """`method=specinfer`."""

    drafts: list[Optional[str]]  # noqa: UP045 - the draft models (hub ids, folders, zoo:NAME or KIT:NAME), each
    # sharing the target's tokenizer; null entries are the ${parts:...} of a model without built drafts
    num_speculative_tokens: int  # K, tokens each draft model proposes per step (the tree's depth)


def merge_chains(chains: list[list[int]]) -> tuple[list[int], list[int]]:
    """The token trie of chains from the same root: (tokens, parents), nodes in topological
    order, the first chain's nodes first (its chain is the tree's first branch)."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, int], int] = {}
    for chain in chains:
        parent = -1
        for token in chain:
            node = node_of.get((parent, token))
            if node is None:
                node = len(tokens)
                node_of[(parent, token)] = node
                tokens.append(token)
                parents.append(parent)
            parent = node
    return tokens, parents


class SpecInferDrafter(Drafter):
    """Merges the chains of several SpS drafters (one KV cache each) into one token tree."""

    def __init__(self, drafters: list[SpsDrafter]) -> None:
        if not drafters:
            raise SpecbenchError("specinfer needs at least one draft model; set method.drafts=[...]")
        self.drafters = drafters
        self.chains: list[list[int]] = []

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()

    def start_question(self) -> None:
        for d in self.drafters:
            d.start_question()

    def fork(self) -> SpecInferDrafter:
        return SpecInferDrafter([d.fork() for d in self.drafters])

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        for d in self.drafters:
            d.begin(state, sampling)
        self.chains = []

    def propose(self, ctx: DraftContext) -> DraftTree:
        self.chains = [d.propose(ctx).tokens.tolist() for d in self.drafters]
        tokens, parents = merge_chains(self.chains)
        if not tokens:
            return DraftTree.empty(ctx.device)
        # No draft probabilities: "deterministic" siblings (see the module docstring).
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=ctx.device), tuple(parents))

    def accepted(self, feedback: Feedback) -> None:
        verdict = feedback.verdict
        for d, chain in zip(self.drafters, self.chains, strict=True):
            m = 0  # how much of this draft model's chain the accepted path follows
            while m < min(len(chain), len(verdict.tokens)) and chain[m] == verdict.tokens[m]:
                m += 1
            d.accepted(Feedback(
                feedback.tree, Verdict(verdict.path[:m], verdict.tokens[:m], verdict.token), feedback.logits,
            ))


class SpecInfer(SpeculativeMethod):
    """`method=specinfer`: the draft models of `method.drafts`, K tokens each, merged into a trie."""

    Settings = SpecInferSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        if not s.drafts or None in s.drafts:
            raise SpecbenchError("method specinfer needs draft models (model.parts names no built ones for this "
                                 "model); set method.drafts=[DRAFT1,DRAFT2]")
        loaded: dict[str, LoadedModel] = {}
        for spec in s.drafts:
            if spec not in loaded:  # the same model twice shares its weights (each drafter keeps its own cache)
                loaded[spec] = load_draft(self.target, spec, self.model_cfg, "specinfer")[0]
        vocab = logits_width(self.target)
        self.draft_models = list(loaded.values())
        return SpecInferDrafter([
            SpsDrafter(loaded[spec], num_tokens=s.num_speculative_tokens, vocab_size=vocab) for spec in s.drafts
        ])

    def extra_parameters(self) -> int:
        models = getattr(self, "draft_models", [])  # none when a test passed its own drafter
        return sum(p.numel() for m in models for p in m.model.parameters())
