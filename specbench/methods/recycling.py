"""Token recycling (Luo et al. 2024): draft from the target's own discarded top-k candidates.

An adjacency matrix (vocab x k) holds, for every token, the target's top-k next tokens the
last time that token was scored; every verify pass rewrites the rows of all the tokens it
scored (root and draft nodes), so the candidates the verifier threw away are recycled. A
draft is a static tree template filled breadth first: a node of rank r under a parent
holding token t gets `adjacency[t, r]`. The matrix lives across the questions of a run and
is cleared at the start of every run, so runs are independent.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled


@dataclass
class RecyclingSettings:
    """`method=recycling`."""

    k: int  # candidates kept per token (the adjacency matrix is vocab x k)
    tree_size: int  # nodes of the static tree template
    max_depth: int  # depth of the template
    decay: float = field(metadata={"max": 1})  # the template's prior: rank r is right with probability 0.6 * decay**r


def tree_template(size: int, max_depth: int, k: int, decay: float = 0.5, first: float = 0.6
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A static tree of `size` nodes as (parents, ranks), in breadth-first order.

    Grown best first under a prior where the rank-r candidate is right with probability
    `first * decay**r`, independently per level: the nodes with the highest path
    probability, i.e. the tree maximising the expected accepted length under that prior
    (the heuristic behind Medusa's / Sequoia's static trees).
    """
    if size < 0 or max_depth < 1 or k < 1:
        raise SpecbenchError("recycling's tree needs size >= 0, max_depth >= 1 and k >= 1")
    prior = [first * decay**r for r in range(k)]
    # heap of (-probability, tie-break, parent node, rank, depth)
    heap = [(-prior[r], r, -1, r, 1) for r in range(k)]
    picked: list[tuple[int, int, int]] = []  # (parent, rank, depth)
    counter = k
    while heap and len(picked) < size:
        neg, _, parent, rank, depth = heapq.heappop(heap)
        picked.append((parent, rank, depth))
        node = len(picked) - 1
        if depth < max_depth:
            for r in range(k):
                counter += 1
                heapq.heappush(heap, (neg * prior[r], counter, node, r, depth + 1))
    # Breadth-first order (by depth, then parent, then rank), so parents always come first.
    new: dict[int, int] = {}
    order: list[int] = []
    for d in range(1, max_depth + 1):
        level = sorted((i for i, p in enumerate(picked) if p[2] == d), key=lambda i: (new.get(picked[i][0], -1),
                                                                                     picked[i][1]))
        for i in level:
            new[i] = len(order)
            order.append(i)
    parents = tuple(-1 if picked[i][0] < 0 else new[picked[i][0]] for i in order)
    ranks = tuple(picked[i][1] for i in order)
    return parents, ranks


class RecyclingDrafter(Drafter):
    """Fills the template from the adjacency matrix with one gather per depth."""

    def __init__(self, vocab: int, k: int, tree_size: int, max_depth: int, decay: float = 0.5) -> None:
        if vocab < 1:
            raise SpecbenchError("recycling needs the target's vocabulary size")
        self.vocab, self.k = vocab, k
        self.parents, self.ranks = tree_template(tree_size, max_depth, k, decay)
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        # Per depth: the nodes, their parents' rows in the token vector (0 = the root) and ranks.
        self.levels: list[tuple[slice, torch.Tensor, torch.Tensor]] = []
        start = 0
        for d in range(1, max(depth, default=0) + 1):
            end = start + depth.count(d)
            self.levels.append((slice(start, end), torch.tensor([p + 1 for p in self.parents[start:end]]),
                                torch.tensor(self.ranks[start:end])))
            start = end
        self.adjacency = torch.zeros(vocab, k, dtype=torch.long)
        self.seen = torch.zeros(vocab, dtype=torch.bool)
        self.root = 0

    def reset(self) -> None:
        self.adjacency.zero_()
        self.seen.zero_()

    def update(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Rows `tokens` of the adjacency become the top-k of their logits (later rows win on repeats)."""
        top = logits[:, : self.vocab].topk(self.k, dim=-1).indices.to("cpu")
        tokens = tokens.to("cpu")
        self.adjacency[tokens] = top
        self.seen[tokens] = True

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        if state.logits is not None:  # the prompt's last token: its row is fresh now
            self.update(state.input_ids[0, -1:], state.logits)

    def propose(self, ctx: DraftContext) -> DraftTree:
        self.root = ctx.tokens[-1]
        if ctx.max_depth <= 0 or not self.levels or not bool(self.seen[self.root]):
            return DraftTree.empty(ctx.device)
        n = len(self.parents)
        tokens = torch.empty(n + 1, dtype=torch.long)
        valid = torch.empty(n + 1, dtype=torch.bool)
        tokens[0], valid[0] = self.root, True
        for where, parent_rows, ranks in self.levels[: ctx.max_depth]:
            parent_tokens = tokens[parent_rows]
            tokens[where.start + 1 : where.stop + 1] = self.adjacency[parent_tokens, ranks]
            # A row never scored holds no candidates: nothing hangs under it.
            valid[where.start + 1 : where.stop + 1] = valid[parent_rows] & self.seen[parent_tokens]
        size = self.levels[min(ctx.max_depth, len(self.levels)) - 1][0].stop
        tree = DraftTree(tokens[1 : size + 1], self.parents[:size])
        keep = valid[1 : size + 1]
        if not bool(keep.all()):
            tree = tree.select(keep.nonzero().flatten().tolist())
        return DraftTree(tree.tokens.to(ctx.device), tree.parents) if ctx.device.type != "cpu" else tree

    def accepted(self, feedback: Feedback) -> None:
        rows = torch.cat([torch.tensor([self.root]), feedback.tree.tokens.to("cpu")])
        self.update(rows, feedback.logits)


class TokenRecycling(SpeculativeMethod):
    """`method=recycling`."""

    Settings = RecyclingSettings

    def build_drafter(self) -> Drafter:
        from specbench.methods.drafts import logits_width

        s = self.settings
        return RecyclingDrafter(logits_width(self.target), k=s.k, tree_size=s.tree_size, max_depth=s.max_depth,
                                decay=s.decay)
