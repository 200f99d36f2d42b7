"""Static token trees as lists of index paths ("choices"), and the published ones.

A path (i0, i1, ..., id-1) is a node at depth d: its token is the i_{d-1}-th best candidate
for that depth (Medusa: of head d-1; EAGLE-1: of the head's distribution at the node's
parent), under the node (i0, ..., id-2). The root (the pending token) is implicit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specbench.core.errors import SpecbenchError

#: Medusa's `mc_sim_7b_63` (Medusa repository, medusa_choices.py): 63 nodes, depth 4, in the
#: order of their estimated acceptance, so every prefix of the list is itself a tree.
MEDUSA_MC_SIM_7B_63 = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
    (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
    (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
    (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

#: EAGLE-1's default tree (EAGLE repository, choices.py, also named `mc_sim_7b_63`): 25 nodes,
#: depth 5, the tree of the EAGLE paper.
EAGLE_MC_SIM_7B_63 = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)

NAMED = {"medusa_mc_sim_7b_63": MEDUSA_MC_SIM_7B_63, "eagle_mc_sim_7b_63": EAGLE_MC_SIM_7B_63}


@dataclass(frozen=True)
class StaticTree:
    """Nodes in breadth-first order (parents first): parent node (-1 = root), rank, depth."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...]

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def nodes_at(self, depth: int) -> list[int]:
        return [i for i, d in enumerate(self.depths) if d == depth]

    def width(self, depth: int) -> int:
        """How many candidates per parent depth `depth` needs (the top-k to compute)."""
        return 1 + max((r for r, d in zip(self.ranks, self.depths) if d == depth), default=-1)


def build_tree(choices: str | Sequence[Sequence[int]], num_nodes: int | None = None) -> StaticTree:
    """A StaticTree from a published name or a list of paths; `num_nodes` keeps the first N paths."""
    if isinstance(choices, str):
        if choices not in NAMED:
            raise SpecbenchError(f"unknown tree '{choices}'; use one of {', '.join(NAMED)} or a list of index paths")
        paths = list(NAMED[choices])
    else:
        paths = [tuple(int(i) for i in p) for p in choices]
    if num_nodes is not None:
        if num_nodes < 1:
            raise SpecbenchError(f"a tree needs at least one node, got num_nodes={num_nodes}")
        paths = paths[:num_nodes]
    if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
        raise SpecbenchError("tree paths must be non-empty lists of non-negative candidate indices")
    if len(set(paths)) != len(paths):
        raise SpecbenchError("tree paths must be distinct")
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise SpecbenchError(f"tree path {list(p)} has no parent {list(p[:-1])} in the list")
    # Breadth-first, then the given order within a depth: parents always precede children.
    order = sorted(range(len(paths)), key=lambda i: (len(paths[i]), i))
    ordered = tuple(paths[i] for i in order)
    index = {p: i for i, p in enumerate(ordered)}
    parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered)
    return StaticTree(ordered, parents, tuple(p[-1] for p in ordered), tuple(len(p) for p in ordered))


def check_choices(choices: Any, method: str) -> None:
    """A static tree's `choices` setting is a published tree's name or a list of index paths."""
    if isinstance(choices, str):
        return
    if isinstance(choices, list) and all(
        isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in p) for p in choices
    ):
        return
    raise SpecbenchError(f"method {method} choices must be a tree's name or a list of index paths like "
                         f"[[0], [1], [0, 0]], got {choices!r}")
