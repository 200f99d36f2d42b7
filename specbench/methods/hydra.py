"""Hydra (Ankner et al. 2024): Medusa's static tree with sequentially dependent heads.

Medusa's head k sees only the target's feature, so all candidates at a depth are the same
whatever their parents are. Hydra's head k also reads the embeddings of the pending token and
of the tokens drafted on the path above (heads.hydra), so each node's children are predicted for
that node's own prefix: the tree is filled depth by depth, one batched head call per depth over
the nodes that have children. Candidates are picked by rank (the tree's "choices"), so the tree is
"deterministic" for the verifier, as Medusa's; verification is the shared engine's, lossless.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.heads.checkpoint import head_folder, target_dims
from specbench.heads.eagle import HeadCache
from specbench.heads.hydra import WEIGHT_FILES as HYDRA_FILES
from specbench.heads.hydra import HydraHeads, load_hydra, save_hydra
from specbench.heads.recipe import HeadData, TrainingBase
from specbench.heads.train import train_hydra
from specbench.heads.trees import StaticTree, build_tree, check_choices


@dataclass
class HydraSettings:
    """`method=hydra`."""

    head: str | None  # head folder (a path or zoo:NAME); None is refused with a hint
    choices: Any  # the static tree: a published name (heads.trees) or a list of index paths
    num_nodes: int | None  # keep only the first N paths of the tree; None = all

    def __post_init__(self) -> None:
        check_choices(self.choices, "hydra")


@dataclass
class HydraTraining(TrainingBase):
    """`method.train` of method=hydra: its heads distilled from the frozen target (Hydra++)."""

    num_heads: int = 4  # head k drafts depth k + 1 of the tree
    num_layers: int = 1  # MLP blocks per head; the first reads the drafted prefix's embeddings
    batch_positions: int = 512  # training positions per step
    train_projections: bool = False  # the vocabulary projections start as the target's LM head; train them too?
    distill: bool = True  # learn the target's next-token distribution (Hydra++), not the corpus token


class HydraDrafter(Drafter):
    """Fills the static tree depth by depth, each parent's children from its own prefix."""

    needs_hidden_states = True

    def __init__(self, heads: HydraHeads, embed: torch.nn.Module, tree: StaticTree) -> None:
        if tree.max_depth > heads.num_heads:  # head k fills depth k + 1
            tree = build_tree([p for p in tree.paths if len(p) <= heads.num_heads])
        self.heads = heads
        self.embed = embed
        self.tree = tree
        # Per depth: its nodes, each node's parent slot (the row of its parent among the depth's
        # distinct parents, in order) and rank, and `expand`: which of its nodes (positions in
        # `nodes`) are the next depth's parents, in that depth's parent order.
        self.levels: list[tuple[list[int], int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        parents_at = [list(dict.fromkeys(tree.parents[i] for i in tree.nodes_at(d)))
                      for d in range(1, tree.max_depth + 2)]
        for depth in range(1, tree.max_depth + 1):
            nodes = tree.nodes_at(depth)
            parents = parents_at[depth - 1]
            slot = torch.tensor([parents.index(tree.parents[i]) for i in nodes], dtype=torch.long)
            rank = torch.tensor([tree.ranks[i] for i in nodes], dtype=torch.long)
            expand = torch.tensor([nodes.index(p) for p in parents_at[depth]], dtype=torch.long)
            parent_rows = torch.tensor([tree.parents[i] + 1 for i in nodes], dtype=torch.long)  # in `reach`
            self.levels.append((nodes, tree.width(depth), slot, rank, expand, parent_rows))
        self.feature: torch.Tensor | None = None  # (d,) the target's feature at the root's parent row

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        prefix = self.heads.prefix_embeding_layer
        if prefix is None:
            self.feature = state.extra["hidden_states"][-1][0, -1]
        else:  # prefix-mlp: its layer reads every prompt position's feature (its own cache from here on)
            self.cache = HeadCache(1)
            self.feature = prefix(state.extra["hidden_states"][-1][0], self.cache)[-1]
        device = self.feature.device
        if self.levels and self.levels[0][2].device != device:  # the index tensors live beside the feature
            self.levels = [(nodes, width, *(t.to(device) for t in rest)) for nodes, width, *rest in self.levels]

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.tree.max_depth, ctx.max_depth)
        if depth <= 0 or self.feature is None:
            return DraftTree.empty(ctx.device)
        root = torch.tensor([ctx.tokens[-1]], dtype=torch.long, device=self.feature.device)
        feature = self.feature.to(self.embed.weight.dtype)
        # Rows: the inputs of a depth's distinct parents, [h, e(root), e(tokens on the path)].
        x = torch.cat([feature, self.embed(root)[0]])[None]
        n = sum(len(level[0]) for level in self.levels[:depth])
        tokens = torch.empty(n, dtype=torch.long, device=feature.device)
        confidence = torch.empty(n, device=feature.device)  # the head's probability of each node's token
        budget = ctx.budget
        reach = torch.ones(n + 1, device=feature.device)  # per row: the calibrated chance of reaching it
        for k, (nodes, width, slot, rank, expand, parent_rows) in enumerate(self.levels[:depth]):
            top = torch.log_softmax(self.heads.head(k, x).float(), dim=-1).topk(width, dim=-1)  # (parents, width)
            chosen = top.indices[slot, rank]
            here = slice(nodes[0], nodes[-1] + 1)  # a depth's nodes are contiguous (breadth-first)
            tokens[here], confidence[here] = chosen, top.values[slot, rank].exp()
            if budget is not None and k + 1 < depth and not budget.fill(
                reach, slice(nodes[0] + 1, nodes[-1] + 2), parent_rows, confidence[here], k + 1
            ):
                n = nodes[-1] + 1  # deeper does not pay
                break
            if k + 1 < depth:
                x = torch.cat([x[slot[expand]], self.embed(chosen[expand]).to(x.dtype)], dim=-1)
        return DraftTree(tokens[:n], self.tree.parents[:n], confidence=confidence[:n], work=k + 1)

    def accepted(self, feedback: Feedback) -> None:
        prefix = self.heads.prefix_embeding_layer
        if prefix is None:
            self.feature = feedback.hidden_states[-1][0, feedback.verdict.rows[-1]]
        else:  # the accepted rows' features, in order, through the prefix layer
            self.feature = prefix(feedback.hidden_states[-1][0, feedback.verdict.rows], self.cache)[-1]


class Hydra(SpeculativeMethod):
    """`method=hydra`: heads from `method.head` (default the zoo's, for model=tiny)."""

    Settings = HydraSettings
    Training = HydraTraining

    @staticmethod
    def heldout_score(heads: Any, row: Any) -> Iterator[tuple[int, torch.Tensor]]:
        """Head k (reading the k + 1 tokens before its own, teacher-forced) against the target's token
        k + 2 ahead, at a held-out row's drafting positions (specbench.kit.heads.heldout_agreement)."""
        x, n = row.final[row.t], len(row.ids)
        for k in range(heads.num_heads):
            ok = row.t + k + 1 < len(row.span)
            x = torch.cat([x, row.embed(row.ids[(row.span[0] + row.t + k + 1).clamp(max=n - 1)]).float()], -1)
            yield k, heads.head(k, x)[ok].argmax(-1) == row.choice[row.t[ok] + k + 1]

    @classmethod
    def train_head(cls, data: HeadData, settings: HydraTraining, out: Path) -> dict:
        """Hydra heads trained on the frozen target's features; saved in the published layout."""
        target = data.target
        features = data.features(settings.tokens)
        heads, stats = train_hydra(features, target.get_input_embeddings(), target.get_output_embeddings(),
                                   num_heads=settings.num_heads, num_layers=settings.num_layers,
                                   steps=data.steps(settings), batch_positions=settings.batch_positions,
                                   lr=settings.lr, train_projections=settings.train_projections,
                                   distill=settings.distill, seed=data.seed_of(settings),
                                   compute_dtype=data.compute(settings), ckpt=data.ckpt, desc=data.desc("hydra"))
        save_hydra(heads, out, data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in heads.parameters()),
                **stats.as_dict(), **data.heldout("hydra", heads)}

    def build_drafter(self) -> Drafter:
        s = self.settings
        hidden, vocab, _ = target_dims(self.target.model)
        folder = head_folder(s.head, self.model_cfg, "hydra", "Hydra", HYDRA_FILES)
        self.heads = load_hydra(folder, hidden, vocab, self.target.device, self.target.dtype, self.target.model.config)
        return HydraDrafter(self.heads, self.target.model.get_input_embeddings(), build_tree(s.choices, s.num_nodes))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.heads.parameters())
