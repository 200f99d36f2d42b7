"""Medusa-1 (Cai et al. 2024): extra decoding heads on the target's last hidden state.

At each step the heads read the target's feature at the row that produced the pending token
(the root); head k's top candidates fill depth k + 1 of a static token tree ("medusa
choices"), which the shared engine verifies in one target forward, greedy or by lossless
speculative sampling. The candidates are picked by rank, not sampled, so the tree is
"deterministic" for the verifier. Medusa's "typical acceptance" is lossy and not offered.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.heads.checkpoint import head_folder
from specbench.heads.medusa import MedusaHeads, load_medusa
from specbench.heads.trees import StaticTree, build_tree


def tree_from_cfg(cfg: DictConfig, default: str) -> StaticTree:
    """The static tree of `method.choices` (a published name or a list of paths) and `method.num_nodes`."""
    choices = cfg.get("choices", default)
    if isinstance(choices, ListConfig):
        choices = OmegaConf.to_container(choices)
    num_nodes = cfg.get("num_nodes")
    return build_tree(choices, None if num_nodes is None else int(num_nodes))


def target_dims(model: torch.nn.Module) -> tuple[int, int, torch.nn.Module]:
    """The target's hidden size, logit width and LM head."""
    lm_head = model.get_output_embeddings()
    if lm_head is None or getattr(lm_head, "weight", None) is None:
        raise SpecbenchError("the target has no output embedding (LM head) for the heads to use")
    vocab, hidden = lm_head.weight.shape
    return int(hidden), int(vocab), lm_head


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
        # One top-k for all depths (the widest), then each node picks (its depth, its rank).
        top = logits.topk(max(self.widths[:depth]), dim=-1).indices
        keep = [i for i, d in enumerate(self.tree.depths) if d <= depth]
        if len(keep) == len(self.tree.depths):
            tokens = top[self.depth_of.to(top.device), self.rank_of.to(top.device)]
            return DraftTree(tokens, self.tree.parents)
        index = torch.tensor(keep, dtype=torch.long)
        tokens = top[self.depth_of[index].to(top.device), self.rank_of[index].to(top.device)]
        return DraftTree(tokens, self.tree.parents[: len(keep)])  # breadth-first: a prefix

    def accepted(self, feedback: Feedback) -> None:
        self.feature = feedback.hidden_states[-1][0, feedback.verdict.rows[-1]]


class Medusa(SpeculativeMethod):
    """`method=medusa`: heads from `method.head` (default the zoo's, for model=tiny)."""

    def build_drafter(self) -> Drafter:
        hidden, vocab, lm_head = target_dims(self.target.model)
        folder = head_folder(self.cfg, self.model_cfg, "medusa", "Medusa")
        self.heads = load_medusa(folder, hidden, vocab, self.target.device, self.target.dtype)
        return MedusaDrafter(self.heads, lm_head, tree_from_cfg(self.cfg, "medusa_mc_sim_7b_63"))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.heads.parameters())
