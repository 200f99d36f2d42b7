"""Medusa-1 (Cai et al. 2024): extra decoding heads on the target's last hidden state.

At each step the heads read the target's feature at the row that produced the pending token
(the root); head k's top candidates fill depth k + 1 of a static token tree ("medusa
choices"), which the shared engine verifies in one target forward, greedy or by lossless
speculative sampling. The candidates are picked by rank, not sampled, so the tree is
"deterministic" for the verifier. Medusa's "typical acceptance" is lossy and not offered.
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
from specbench.heads.medusa import WEIGHT_FILES as MEDUSA_FILES
from specbench.heads.medusa import MedusaHeads, load_medusa, save_medusa
from specbench.heads.recipe import HeadData, TrainingBase
from specbench.heads.train import train_medusa
from specbench.heads.trees import StaticTree, build_tree, check_choices


@dataclass
class MedusaSettings:
    """`method=medusa`."""

    head: str | None  # head folder (a path or zoo:NAME); None is refused with a hint
    choices: Any  # the static tree: a published name (heads.trees) or a list of index paths [[0], [1], [0, 0]]
    num_nodes: int | None  # keep only the first N paths of the tree; None = all

    def __post_init__(self) -> None:
        check_choices(self.choices, "medusa")


@dataclass
class MedusaTraining(TrainingBase):
    """`method.train` of method=medusa: Medusa-1's heads on the frozen target's features."""

    num_heads: int = 4  # head k predicts the token k + 2 positions ahead
    num_layers: int = 1  # residual blocks per head
    batch_positions: int = 1024  # training positions per step
    train_projections: bool = False  # the vocabulary projections start as the target's LM head; train them too?


class MedusaDrafter(Drafter):
    """Builds the static tree from the heads' top-k per depth."""

    needs_hidden_states = True

    def __init__(self, heads: MedusaHeads, lm_head: torch.nn.Module, tree: StaticTree) -> None:
        if tree.max_depth > heads.num_heads:  # head k fills depth k + 1: deeper paths have no head
            tree = build_tree([p for p in tree.paths if len(p) <= heads.num_heads])
        self.heads = heads
        self.lm_head = lm_head
        self.tree = tree
        self.widths = [tree.width(d) for d in range(1, tree.max_depth + 1)]
        self.depth_of = torch.tensor(tree.depths, dtype=torch.long) - 1
        self.rank_of = torch.tensor(tree.ranks, dtype=torch.long)
        self.feature: torch.Tensor | None = None  # (d,) the target's feature at the root's parent row

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.feature = state.extra["hidden_states"][-1][0, -1]

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.tree.max_depth, ctx.max_depth)
        if depth <= 0 or self.feature is None:
            return DraftTree.empty(ctx.device)
        logits = self.heads(self.feature, self.lm_head, n=depth)  # (depth, V)
        # One top-k for all depths (the widest), then each node picks (its depth, its rank); a
        # node's confidence is its head's probability of its token.
        top = torch.log_softmax(logits.float(), dim=-1).topk(max(self.widths[:depth]), dim=-1)
        n = sum(1 for d in self.tree.depths if d <= depth)  # breadth-first: a prefix
        at = (self.depth_of[:n].to(top.indices.device), self.rank_of[:n].to(top.indices.device))
        return DraftTree(top.indices[at], self.tree.parents[:n], confidence=top.values[at].exp(), work=1)

    def accepted(self, feedback: Feedback) -> None:
        self.feature = feedback.hidden_states[-1][0, feedback.verdict.rows[-1]]


class Medusa(SpeculativeMethod):
    """`method=medusa`: heads from `method.head` (default the zoo's, for model=tiny)."""

    Settings = MedusaSettings
    Training = MedusaTraining

    @staticmethod
    def heldout_score(heads: Any, row: Any) -> Iterator[tuple[int, torch.Tensor]]:
        """Head k's top-1 against the target's token k + 2 ahead, at a held-out row's drafting positions
        (a kit's card: specbench.kit.heads.heldout_agreement, `row` a HeldRow)."""
        logits = heads(row.final[row.t], row.lm_head)
        for k in range(logits.shape[-2]):
            ok = row.t + k + 1 < len(row.span)
            yield k, logits[ok, k].argmax(-1) == row.choice[row.t[ok] + k + 1]

    @classmethod
    def train_head(cls, data: HeadData, settings: MedusaTraining, out: Path) -> dict:
        """Medusa-1 heads (cross-entropy of head k to the token k + 2 ahead, weighted 0.8 ** k), saved in
        the published layout."""
        features = data.features(settings.tokens)
        heads, stats = train_medusa(features, data.target.get_output_embeddings(), num_heads=settings.num_heads,
                                    num_layers=settings.num_layers, steps=data.steps(settings),
                                    batch_positions=settings.batch_positions, lr=settings.lr,
                                    train_projections=settings.train_projections, seed=data.seed_of(settings),
                                    compute_dtype=data.compute(settings), ckpt=data.ckpt, desc=data.desc("medusa"))
        save_medusa(heads, out, data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in heads.parameters()),
                **stats.as_dict(), **data.heldout("medusa", heads)}

    def build_drafter(self) -> Drafter:
        s = self.settings
        hidden, vocab, lm_head = target_dims(self.target.model)
        folder = head_folder(s.head, self.model_cfg, "medusa", "Medusa", MEDUSA_FILES)
        self.heads = load_medusa(folder, hidden, vocab, self.target.device, self.target.dtype)
        return MedusaDrafter(self.heads, lm_head, build_tree(s.choices, s.num_nodes))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.heads.parameters())
