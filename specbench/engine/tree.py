"""Draft trees: what a drafter proposes, and the attention layout the target scores it with.

A step's block is the root (the pending token: emitted last step, not yet in the target's
KV cache) followed by the tree's nodes in topological order. Row 0 of the block is the
root, row `i + 1` is node `i`; the target's logits at a row give the distribution of that
row's children. A chain is a tree whose node `i` has parent `i - 1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import torch

#: How the siblings of a node were chosen, which decides the lossless acceptance rule:
#: "iid": drawn independently from the node's draft distribution (SpecInfer multi-draft);
#: "without_replacement": drawn from it without replacement (recursive speculative decoding);
#: "deterministic": picked without a distribution (lookup, top-k, retrieval): p is one-hot.
SiblingKind = Literal["iid", "without_replacement", "deterministic"]
SIBLING_KINDS = ("iid", "without_replacement", "deterministic")


@dataclass(frozen=True)
class TreeLayout:
    """The shape of a tree, computed once per topology (see `layout_of`)."""

    parents: tuple[int, ...]
    depth: tuple[int, ...]  # per node; the root's children have depth 1
    children: tuple[tuple[int, ...], ...]  # per row: row 0 = root, row i + 1 = node i
    paths: tuple[tuple[int, ...], ...]  # per node: the nodes from depth 1 down to it
    is_chain: bool
    attend: torch.Tensor  # (n + 1, n + 1) bool, CPU: row r sees block column c (self included)
    _device_cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def n(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def on(self, key: str, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Device copies of the layout's tensors, built once per (device, dtype).

        `attend` (n + 1, n + 1) bool; `positions` (n + 1,) depth of each row (root 0);
        `mask` (n + 1, n + 1) additive float mask of the block (0 = attend, dtype min =
        masked); `parent_rows` (n,); `depth` (n,); `node_ancestors` (n, n) float, 1 where
        the column is the row's ancestor or itself.
        """
        slot = (key, device, dtype)
        cached = self._device_cache.get(slot)
        if cached is None:
            cached = self._build(key, dtype).to(device)
            self._device_cache[slot] = cached
        return cached

    def _build(self, key: str, dtype: torch.dtype | None) -> torch.Tensor:
        if key == "positions":
            return torch.tensor((0, *self.depth), dtype=torch.long)
        if key == "mask":
            assert dtype is not None
            return torch.zeros(self.attend.shape, dtype=dtype).masked_fill(~self.attend, torch.finfo(dtype).min)
        if key == "attend":
            return self.attend
        if key == "parent_rows":
            return torch.tensor(self.parents, dtype=torch.long) + 1
        if key == "depth":
            return torch.tensor(self.depth, dtype=torch.long)
        if key == "node_ancestors":
            return self.attend[1:, 1:].float()
        raise KeyError(key)


@lru_cache(maxsize=1024)
def layout_of(parents: tuple[int, ...]) -> TreeLayout:
    """Depths, children, paths and the attention pattern of a topology (cached: trees repeat)."""
    n = len(parents)
    depth: list[int] = []
    children: list[list[int]] = [[] for _ in range(n + 1)]
    paths: list[tuple[int, ...]] = []
    attend = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    attend[:, 0] = True  # everything sees the root
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}; parents must come first (-1 = the root)")
        depth.append(1 if p < 0 else depth[p] + 1)
        children[p + 1].append(i)
        paths.append((i,) if p < 0 else (*paths[p], i))
        attend[i + 1, 1:] = attend[p + 1, 1:]  # the parent's ancestors ...
        attend[i + 1, i + 1] = True  # ... and itself
    is_chain = all(p == i - 1 for i, p in enumerate(parents))
    return TreeLayout(
        parents=parents, depth=tuple(depth), children=tuple(tuple(c) for c in children),
        paths=tuple(paths), is_chain=is_chain, attend=attend,
    )


@lru_cache(maxsize=256)
def chain_parents(n: int) -> tuple[int, ...]:
    return tuple(range(-1, n - 1))


@dataclass
class AuxBlock:
    """Extra, unverified positions in the same target forward (a hook for Lookahead / Jacobi).

    They come after the tree's nodes in the block; tree rows never see them, so verification
    is unaffected, and their KV entries are dropped after the step. The drafter gets their
    logits back in `Feedback.aux_logits`.
    tokens: (k,) ids; offsets: (k,) position of each relative to the root's position;
    attend: (k, 1 + n + k) bool, what each aux row sees in the block (root, nodes, aux).
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    attend: torch.Tensor

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class DraftTree:
    """A drafter's proposal: token `tokens[i]` hangs under node `parents[i]` (-1 = the root).

    draft_probs: (n, V) or None. Row i is the distribution node i was drawn from (the
    drafter's distribution at its parent, after the same temperature / top-k / top-p as the
    target), so siblings share a row. None means deterministic candidates: under sampling
    each is then accepted with the target's probability of it. kind: how siblings were drawn
    (see SiblingKind); without probabilities it is always "deterministic".
    confidence: (n,) or None, the drafter's own estimate that node i is accepted once its
    parent is (e.g. its draft probability at the parent). The draft budget (engine.budget)
    calibrates it against what the target accepts; it never changes what is emitted. work: the
    drafter's units of work spent on it (draft forwards, head levels), which the budget times;
    None counts the nodes.
    """

    tokens: torch.Tensor
    parents: tuple[int, ...]
    draft_probs: torch.Tensor | None = None
    kind: SiblingKind = "deterministic"
    aux: AuxBlock | None = None
    confidence: torch.Tensor | None = None
    work: int | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.tokens.shape[0] != len(self.parents):
            raise ValueError(f"tokens {tuple(self.tokens.shape)} do not match {len(self.parents)} parents")
        if self.kind not in SIBLING_KINDS:
            raise ValueError(f"unknown sibling kind {self.kind!r}; use one of {SIBLING_KINDS}")
        if self.draft_probs is None:
            self.kind = "deterministic"
        elif self.draft_probs.shape[0] != len(self.parents):
            raise ValueError("draft_probs needs one row per node")
        if self.confidence is not None and self.confidence.shape != (len(self.parents),):
            raise ValueError("confidence needs one value per node")
        layout_of(self.parents)  # checks the topology (cached per shape)

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None,
              confidence: torch.Tensor | None = None) -> DraftTree:
        """A single branch: node i follows node i - 1."""
        kind: SiblingKind = "iid" if draft_probs is not None else "deterministic"
        return cls(tokens, chain_parents(int(tokens.shape[0])), draft_probs, kind, confidence=confidence)

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> DraftTree:
        """No proposal: the step is one autoregressive target forward."""
        return cls(torch.empty(0, dtype=torch.long, device=device), ())

    @property
    def n(self) -> int:
        return len(self.parents)

    @property
    def layout(self) -> TreeLayout:
        return layout_of(self.parents)

    @property
    def rows(self) -> int:
        """Rows of the step's block: the root, the nodes and the aux positions."""
        return 1 + self.n + (self.aux.k if self.aux is not None else 0)

    @property
    def span(self) -> int:
        """Positions the block reaches from the root's on: 1 + the deepest node or aux offset."""
        deepest = self.layout.max_depth
        if self.aux is not None and self.aux.k:
            deepest = max(deepest, int(self.aux.offsets.max()))
        return 1 + deepest

    def select(self, keep: list[int]) -> DraftTree:
        """The sub-tree of nodes `keep` (ascending, closed under taking parents); aux is dropped."""
        where = {old: new for new, old in enumerate(keep)}
        parents = tuple(-1 if self.parents[i] < 0 else where[self.parents[i]] for i in keep)
        if keep == list(range(len(keep))):  # a prefix: slicing keeps views, no gather

            def pick(x: torch.Tensor | None) -> torch.Tensor | None:
                return None if x is None else x[: len(keep)]
        else:
            index = torch.tensor(keep, dtype=torch.long)

            def pick(x: torch.Tensor | None) -> torch.Tensor | None:
                return None if x is None else x[index.to(x.device)]
        return DraftTree(pick(self.tokens), parents, pick(self.draft_probs), self.kind,
                         confidence=pick(self.confidence))

    def prune(self, keep: list[int]) -> DraftTree:
        """`select` that keeps the aux block (its columns of dropped nodes removed): what the
        draft budget verifies of a proposal."""
        tree = self.select(keep)
        if self.aux is not None:
            n = self.n
            columns = torch.tensor([0, *(i + 1 for i in keep), *range(n + 1, n + 1 + self.aux.k)], dtype=torch.long)
            attend = self.aux.attend[:, columns.to(self.aux.attend.device)]
            tree.aux = AuxBlock(self.aux.tokens, self.aux.offsets, attend)
        return tree

    def truncate(self, max_depth: int) -> DraftTree:
        """Drop nodes deeper than `max_depth` (they could only be accepted past the stop rule)."""
        layout = self.layout
        if layout.max_depth <= max_depth:
            return self
        return self.select([i for i, d in enumerate(layout.depth) if d <= max_depth])

    def first_branch(self) -> DraftTree:
        """The chain of first children from the root: what a model without tree attention verifies.

        Each first child was drawn from its parent's distribution, so the chain is a valid
        draft for chain verification under every sibling kind.
        """
        layout = self.layout
        keep: list[int] = []
        row = 0
        while layout.children[row]:
            child = layout.children[row][0]
            keep.append(child)
            row = child + 1
        return self.select(keep)  # same kind: deterministic candidates stay one-hot
