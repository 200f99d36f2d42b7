"""PPD, predictive pipelined decoding (Yang et al. 2023): an early exit guesses the next token
while the rest of the network is still running; verified by the full model.

In the paper, while the target computes the pending token's forward, an exit head after an
intermediate layer predicts the token after it; its top-k candidates start their own forwards on
other devices at once, and the one the full model confirms continues (the others are dropped),
so a correct guess hides the latency of the remaining layers.

On one device the pipeline is emulated, not overlapped: each step first runs the pending token
through the target's first `exit_layer` blocks only (writing those blocks' KV entries, cut back
afterwards, as self_spec's layer-skipped drafts), the trained exit head (heads.exit) gives the
top-k candidates for the next token, and the shared engine verifies the pending token with the
k candidates as its children in one target forward. The tokens are exactly the target's; a step
emits 2 tokens when a candidate was right. What this shows: the early exit's hit rate (the share
of steps in which the pipeline's guess would have been confirmed) and the tokens per step; what it
cannot show: the overlap itself. The time measured here is the sequential cost (the early pass
plus a wider verify forward), not what k + 1 devices working in parallel would take.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.engine.layers import SHARED_CACHE_BATCH_PROBLEM, LayerSkipper, decoder_blocks
from specbench.heads.checkpoint import head_folder, target_dims
from specbench.heads.exit import ExitHead, load_exit_head, save_exit_head
from specbench.heads.recipe import HeadData, TrainingBase
from specbench.heads.train import train_exit_head


@dataclass
class PpdSettings:
    """`method=ppd`."""

    head: str | None  # exit head folder (a path or zoo:NAME); its config names the exit layer
    candidates: int  # k: the early exit's top-k candidates verified per step (the pipeline's parallel forwards)


@dataclass
class PpdTraining(TrainingBase):
    """`method.train` of method=ppd: the exit head distilled from the full target's next-token distribution."""

    exit_layer: int | None = None  # blocks run before the early exit; None: half the target's
    batch_positions: int = 1024  # training positions per step


class PpdDrafter(Drafter):
    """The early exit's top-k guesses for the token after the pending one, as k sibling nodes."""

    def __init__(self, model: torch.nn.Module, head: ExitHead, lm_head: torch.nn.Module, candidates: int) -> None:
        n = len(decoder_blocks(model)[1])
        self.skipper = LayerSkipper(model, list(range(head.exit_layer, n)))
        self.head = head
        self.lm_head = lm_head
        self.k = candidates
        self.cache: Any = None
        self.prompt_len = 0

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.cache = state.cache
        self.prompt_len = int(state.input_ids.shape[1])

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.max_depth < 1:
            return DraftTree.empty(ctx.device)
        past = self.prompt_len + len(ctx.tokens) - 1  # the pending token is not in the cache yet
        token = torch.tensor(ctx.tokens[-1], device=ctx.device)
        state = self.skipper.state(token, past, self.cache)
        self.skipper.rollback(self.cache, past)
        logits = self.head(state.to(self.lm_head.weight.dtype), self.lm_head)
        top = logits.topk(min(self.k, logits.shape[-1]), dim=-1).indices
        return DraftTree(top.to(ctx.device), (-1,) * int(top.shape[0]))


class Ppd(SpeculativeMethod):
    """`method=ppd`: the exit head of `method.head` (default the zoo's, for model=tiny)."""

    Settings = PpdSettings
    Training = PpdTraining
    batch_problem = SHARED_CACHE_BATCH_PROBLEM

    @staticmethod
    def heldout_score(head: Any, row: Any) -> Iterator[tuple[int, torch.Tensor]]:
        """The exit head's top-1 on the exit layer's states against the target's own next token, at a
        held-out row's drafting positions (specbench.kit.heads.heldout_agreement)."""
        yield 0, head(row.exits()[row.t], row.lm_head).argmax(-1) == row.choice[row.t]

    @classmethod
    def train_head(cls, data: HeadData, settings: PpdTraining, out: Path) -> dict:
        """The exit head on the target's state after `exit_layer` blocks (through its final norm), learning
        the full target's next-token distribution at the same position."""
        target = data.target
        n_layers = int(target.config.get_text_config().num_hidden_layers)
        exit_layer = int(settings.exit_layer or n_layers // 2)
        features = data.features(settings.tokens)
        lm_head = target.get_output_embeddings()
        head, stats = train_exit_head(features, data.exit_states(settings.tokens, exit_layer), lm_head,
                                      exit_layer=exit_layer, num_layers=n_layers, steps=data.steps(settings),
                                      batch_positions=settings.batch_positions, lr=settings.lr,
                                      seed=data.seed_of(settings), compute_dtype=data.compute(settings),
                                      ckpt=data.ckpt, desc=data.desc("ppd"))
        save_exit_head(head, out, int(lm_head.weight.shape[0]), data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in head.parameters()),
                "exit_layer": exit_layer, **stats.as_dict(), **data.heldout("ppd", head)}

    def build_drafter(self) -> Drafter:
        s = self.settings
        hidden, vocab, lm_head = target_dims(self.target.model)
        n = len(decoder_blocks(self.target.model)[1])
        folder = head_folder(s.head, self.model_cfg, "ppd", "PPD exit")
        self.head = load_exit_head(folder, hidden, vocab, n, self.target.device, self.target.dtype)
        return PpdDrafter(self.target.model, self.head, lm_head, s.candidates)

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.head.parameters())
