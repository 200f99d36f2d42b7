"""EAGLE (Li et al. 2024): a one-layer head drafts the target's next features autoregressively.

The head reads (embedding of the next token, the target's feature at the current position)
and predicts the next feature; the target's LM head turns a feature into draft tokens
(`specbench.heads.eagle`). The head keeps its own KV cache of real (verified) positions across
steps; a step's draft tree is grown on top of it with one batched head forward per depth
under a tree mask, then those draft entries are dropped again.

- EAGLE-1 (`method=eagle`): a static tree of index paths (default: the EAGLE paper's 25-node
  tree), node (i0, .., ik) being the ik-th best token of the head at node (i0, .., ik-1).
- EAGLE-2 (`method=eagle2`): a context-aware dynamic tree. Expand: starting from the root's
  top-k, `depth` times run the head on the k frontier nodes with the highest cumulative
  draft log-probability and take each one's top-k children; rerank: keep the
  `total_tokens - 1` best nodes of everything drafted (scores fall along a path, so the kept
  set is a tree). Parameter meanings follow the published code (total_tokens counts the root).

Candidates are taken by rank, not sampled, so trees are "deterministic" for the verifier:
greedy and sampled verification stay lossless with nothing method-specific in the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod, layout_of
from specbench.engine.api import Prefilled
from specbench.engine.budget import Budget
from specbench.heads.checkpoint import head_folder, target_dims
from specbench.heads.eagle import WEIGHT_FILES as EAGLE_FILES
from specbench.heads.eagle import EagleHead, load_eagle, save_eagle
from specbench.heads.eagle3 import Eagle3Head, feature_layers, load_eagle3, save_eagle3
from specbench.heads.recipe import HeadData, TrainingBase
from specbench.heads.train import train_eagle, train_eagle3
from specbench.heads.trees import StaticTree, build_tree, check_choices


@dataclass
class EagleSettings:
    """`method=eagle` (EAGLE-1, static tree)."""

    head: str | None  # head folder (EAGLE-1 layout, a path or zoo:NAME); None is refused with a hint
    choices: Any  # the static tree: a published name (heads.trees) or a list of index paths [[0], [1], [0, 0]]
    num_nodes: int | None  # keep only the first N paths of the tree; None = all

    def __post_init__(self) -> None:
        check_choices(self.choices, "eagle")


@dataclass
class EagleTraining(TrainingBase):
    """`method.train` of method=eagle (EAGLE-2 drafts on the same head): one decoder layer that predicts
    the target's next feature from its feature and the next token's embedding."""

    batch_rows: int = 8  # windows per step
    window: int = 256  # positions per window (the head attends within it)
    ce_weight: float = 0.1  # smooth-L1 feature regression + ce_weight x cross-entropy through the frozen LM head
    ce_fraction: float = field(default=0.25, metadata={"max": 1})  # positions the costly cross-entropy is taken on
    noise: float = 0.1  # uniform noise on the input features (EAGLE's augmentation)


@dataclass
class Eagle3Training(TrainingBase):
    """`method.train` of method=eagle3: token prediction from fused low / middle / high states, with
    training-time test."""

    layers: list[int] | None = None  # the fused hidden_states indices; None: the published (2, L/2, L-3)
    batch_rows: int = 8
    window: int = 192
    ttt_steps: int = 3  # the head unrolled on its own outputs this many steps
    step_decay: float = 0.8  # weight of step j's loss: step_decay ** j
    draft_vocab: int | None = None  # the reduced draft vocabulary: the most frequent tokens; None: the target's


@dataclass
class Eagle2Settings:
    """`method=eagle2` (EAGLE-2, dynamic tree; meanings as in the published code)."""

    head: str | None  # head folder (the EAGLE-1 weights load as they are); None is refused with a hint
    depth: int = field(metadata={"min": 0})  # expansion steps after the root's top-k: the tree is up to depth + 1 deep
    top_k: int  # children per expanded node, and nodes expanded per depth
    total_tokens: int  # tokens verified per step, the root included (total_tokens - 1 draft nodes)


class EagleDrafter(Drafter):
    """Shared state of both EAGLE variants: the head's cache and the real pairs not yet fed."""

    needs_hidden_states = True

    def __init__(self, head: EagleHead, embed: nn.Module, lm_head: nn.Module) -> None:
        self.head = head
        self.embed = embed
        self.lm_head = lm_head
        self.cache = head.new_cache()
        # Real (token_{t+1}, feature_t) pairs the head has not seen yet, fed at the next propose.
        self.pending: list[tuple[list[int], torch.Tensor]] = []

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.cache = self.head.new_cache()
        tokens = [*state.input_ids[0, 1:].tolist(), state.tokens[0]]
        self.pending = [(tokens, self._features(state.extra["hidden_states"]))]

    def _features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """What the head reads of the target per row (rows, F): EAGLE-1's last state after the final norm."""
        return hidden_states[-1][0]

    def accepted(self, feedback: Feedback) -> None:
        """Noted for the next proposal (every step, drafted or not: kept cheap, no tensor built)."""
        verdict = feedback.verdict
        hidden = self._features(feedback.hidden_states)
        rows = verdict.rows
        if rows[-1] == len(rows) - 1:  # the root and a prefix of the block (a chain, or no draft): a view
            kept = hidden[: len(rows)]
        else:
            kept = hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]
        self.pending.append(([*verdict.tokens, verdict.token], kept))

    def _feed(self) -> torch.Tensor:
        """Run the head over the pending real pairs (cached); returns the last predicted feature (d,)."""
        tokens = torch.tensor([t for some, _ in self.pending for t in some], dtype=torch.long)
        features = torch.cat([f for _, f in self.pending]) if len(self.pending) > 1 else self.pending[0][1]
        self.pending = []
        past, n = self.cache.length, int(tokens.shape[0])
        device = features.device
        positions = torch.arange(past, past + n, device=device)[None]
        attend = None
        if past and n > 1:
            attend = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)
        out = self.head(self.embed(tokens.to(device))[None], features[None], positions, self.cache, attend)
        return out[0, -1]

    def _expand(self, tokens: torch.Tensor, features: torch.Tensor, depth: int, stable: int,
                ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward over draft nodes at `depth` (1 = the root's children).

        features: their parents' predicted features (m, d); ancestors: (m, drafted) bool, which
        draft entries already in the head cache are their ancestors. Returns the nodes'
        predicted features (m, d) and log-probabilities of their children (m, V).
        """
        m = int(tokens.shape[0])
        device = features.device
        attend = torch.cat([
            torch.ones(m, stable, dtype=torch.bool, device=device), ancestors,
            torch.eye(m, dtype=torch.bool, device=device),
        ], dim=1)
        positions = torch.full((1, m), stable + depth - 1, dtype=torch.long, device=device)
        out = self.head(self.embed(tokens)[None], features[None], positions, self.cache, attend)[0]
        return out, self._logp(out)

    def _logp(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.lm_head(features).float(), dim=-1)

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.max_depth <= 0 or not self.pending:
            return DraftTree.empty(ctx.device)
        root_feature = self._feed()
        stable = self.cache.length
        try:
            return self._grow(root_feature, self._logp(root_feature), stable, ctx.max_depth, ctx.budget)
        finally:
            self.cache.crop(stable)  # the tree's entries are guesses: only verified pairs stay

    def _grow(self, root_feature: torch.Tensor, root_logp: torch.Tensor, stable: int, max_depth: int,
              budget: Budget | None) -> DraftTree:
        """The tree; node confidence = the head's probability of the node's token at its parent.
        Under a draft budget, growing stops at the depth where no node is worth verifying."""
        raise NotImplementedError


class StaticTreeDrafter(EagleDrafter):
    """EAGLE-1: the same tree shape every step, filled with the head's top-k at each node."""

    def __init__(self, head: EagleHead, embed: nn.Module, lm_head: nn.Module, tree: StaticTree) -> None:
        super().__init__(head, embed, lm_head)
        self.tree = tree
        n = len(tree.parents)
        self.ancestors = layout_of(tree.parents).attend[1:, 1:]  # (n, n) ancestors-or-self
        has_children = [False] * n
        for p in tree.parents:
            if p >= 0:
                has_children[p] = True
        # Per depth: the nodes, their parents' rows in the logp table (0 = root), ranks, and
        # which of them get expanded (those with children).
        self.levels = []
        for d in range(1, tree.max_depth + 1):
            nodes = tree.nodes_at(d)
            rows = sorted({tree.parents[i] + 1 for i in nodes})
            slot = {r: j for j, r in enumerate(rows)}
            self.levels.append((
                torch.tensor(nodes), torch.tensor(rows), torch.tensor([slot[tree.parents[i] + 1] for i in nodes]),
                torch.tensor([tree.ranks[i] for i in nodes]), tree.width(d),
                [i for i in nodes if has_children[i]], torch.tensor([tree.parents[i] + 1 for i in nodes]),
            ))

    def _grow(self, root_feature: torch.Tensor, root_logp: torch.Tensor, stable: int, max_depth: int,
              budget: Budget | None) -> DraftTree:
        tree = self.tree
        depth = min(tree.max_depth, max_depth)
        n = sum(1 for d in tree.depths if d <= depth)  # breadth-first: these are a prefix
        device = root_feature.device
        tokens = torch.zeros(n, dtype=torch.long, device=device)
        confidence = torch.zeros(n, device=device)
        reach = torch.ones(n + 1, device=device)  # per row: the calibrated chance of reaching it
        levels = 1  # head forwards: the root's (in _feed), then one per expanded depth
        # Row 0 = the root, row i + 1 = node i: predicted feature and children's log-probabilities.
        outs = root_feature.new_zeros(n + 1, root_feature.shape[-1])
        logps = root_logp.new_zeros(n + 1, root_logp.shape[-1])
        outs[0], logps[0] = root_feature, root_logp
        drafted: list[int] = []  # nodes in the head cache, in cache order
        for d in range(1, depth + 1):
            nodes, rows, slots, ranks, width, expand, parent_rows = self.levels[d - 1]
            nodes = nodes.to(device)
            top = logps[rows.to(device)].topk(width, dim=-1)
            at = (slots.to(device), ranks.to(device))
            tokens[nodes] = top.indices[at]
            confidence[nodes] = top.values[at].exp()
            if budget is not None and d < depth and not budget.fill(reach, nodes + 1, parent_rows.to(device),
                                                                    confidence[nodes], d):
                n = sum(1 for x in tree.depths if x <= d)  # deeper does not pay
                break
            if d == depth or not expand:
                break
            index = torch.tensor(expand, dtype=torch.long)
            parents = torch.tensor([tree.parents[i] + 1 for i in expand], dtype=torch.long, device=device)
            ancestors = self.ancestors[index][:, drafted].to(device)
            out, logp = self._expand(tokens[index.to(device)], outs[parents], d, stable, ancestors)
            outs[index.to(device) + 1], logps[index.to(device) + 1] = out, logp
            drafted.extend(expand)
            levels += 1
        return DraftTree(tokens[:n], tree.parents[:n], confidence=confidence[:n], work=levels)


class DynamicTreeDrafter(EagleDrafter):
    """EAGLE-2: expand the top-k nodes by cumulative confidence per depth, then rerank."""

    def __init__(self, head: EagleHead, embed: nn.Module, lm_head: nn.Module, depth: int, top_k: int,
                 total_tokens: int) -> None:
        if depth < 0 or top_k < 1 or total_tokens < 2:
            raise SpecbenchError(f"eagle2 needs depth >= 0, top_k >= 1 and total_tokens >= 2, got depth={depth}, "
                                 f"top_k={top_k}, total_tokens={total_tokens}")
        super().__init__(head, embed, lm_head)
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens

    def _grow(self, root_feature: torch.Tensor, root_logp: torch.Tensor, stable: int, max_depth: int,
              budget: Budget | None) -> DraftTree:
        k = min(self.top_k, int(root_logp.shape[-1]))
        device = root_feature.device
        top = root_logp.topk(k)
        all_tokens, all_scores, all_parents = [top.indices], [top.values], [torch.full((k,), -1, device=device)]
        all_conf = [top.values.exp()]
        reach = budget.calibrate(all_conf[0]) if budget is not None else None  # per frontier node
        frontier = torch.arange(k, device=device)  # global candidate ids
        scores, tokens = top.values, top.indices
        features = root_feature.expand(k, -1)
        ancestors = torch.zeros(k, 0, dtype=torch.bool, device=device)
        offset = k
        levels = min(self.depth + 1, max_depth)  # the tree's depth
        for level in range(1, levels):
            if reach is not None and not budget.extend(reach, level + 1):  # a level more does not pay
                break
            m = int(frontier.shape[0])
            out, logp = self._expand(tokens, features, level, stable, ancestors)
            top = logp.topk(k, dim=-1)
            cumulative = (scores[:, None] + top.values).flatten()  # (m * k,)
            all_tokens.append(top.indices.flatten())
            all_scores.append(cumulative)
            all_parents.append(frontier.repeat_interleave(k))
            all_conf.append(top.values.exp().flatten())
            best = cumulative.topk(min(k, m * k)).indices
            if reach is not None:
                reach = (reach[:, None] * budget.calibrate(top.values.exp())).flatten()[best]
            owner = best // k
            ancestors = torch.cat([ancestors, torch.eye(m, dtype=torch.bool, device=device)], dim=1)[owner]
            features, scores = out[owner], cumulative[best]
            tokens = top.indices.flatten()[best]
            frontier = offset + best
            offset += m * k
        candidates = torch.cat(all_scores)
        # Stable sort: a parent scores at least as much as its child and comes first, so any
        # prefix of this order is closed under parents.
        order = torch.sort(-candidates, stable=True).indices[: self.total_tokens - 1]
        keep = torch.sort(order).values
        remap = torch.full((candidates.shape[0],), -1, dtype=torch.long, device=device)
        remap[keep] = torch.arange(keep.shape[0], device=device)
        parents = torch.cat(all_parents)[keep]
        parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], parents)
        return DraftTree(torch.cat(all_tokens)[keep], tuple(parents.tolist()), confidence=torch.cat(all_conf)[keep],
                         work=len(all_scores))  # head forwards: the root's, then one per level


class Eagle3Drafter(DynamicTreeDrafter):
    """EAGLE-3: EAGLE-2's dynamic tree from a head that reads the target's fused low, middle and
    high states and predicts tokens over its own vocabulary (heads.eagle3)."""

    def __init__(self, head: Eagle3Head, embed: nn.Module, layers: tuple[int, ...], depth: int, top_k: int,
                 total_tokens: int) -> None:
        super().__init__(head, embed, None, depth, top_k, total_tokens)
        self.layers = layers

    def _features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.cat([hidden_states[i][0] for i in self.layers], dim=-1)

    def _logp(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.target_logp(features)


def _load(method: SpeculativeMethod, name: str) -> tuple[EagleHead, nn.Module, nn.Module]:
    model = method.target.model
    hidden, _, lm_head = target_dims(model)
    vocab = int(model.config.get_text_config().vocab_size)
    folder = head_folder(method.settings.head, method.model_cfg, name, "EAGLE", EAGLE_FILES)
    head = load_eagle(folder, hidden, vocab, method.target.device, method.target.dtype)
    return head, model.get_input_embeddings(), lm_head


class Eagle(SpeculativeMethod):
    """`method=eagle`: EAGLE-1 with a static tree (`method.choices`, `method.num_nodes`)."""

    Settings = EagleSettings
    Training = EagleTraining

    @staticmethod
    def heldout_score(head: Any, row: Any) -> Iterator[tuple[int, torch.Tensor]]:
        """The first drafted token (the predicted state through the LM head) against the target's, at a
        held-out row's drafting positions (specbench.kit.heads.heldout_agreement)."""
        pred = head(row.embed(row.ids[row.span[1:]])[None].float(), row.final[:-1][None], row.span[:-1][None])[0]
        yield 0, row.lm_head(pred[row.t]).argmax(-1) == row.choice[row.t + 1]

    @staticmethod
    def heldout_next_state(head: Any, embedded: torch.Tensor, states: torch.Tensor,
                           positions: torch.Tensor) -> torch.Tensor:
        """The state the head drafts after `states` (the held-out chain: specbench.kit.heads.chain_acceptance)."""
        return head(embedded[None], states[None], positions[None])[0, -1]

    @classmethod
    def train_head(cls, data: HeadData, settings: EagleTraining, out: Path) -> dict:
        """An EAGLE-1 head (feature regression + cross-entropy, noisy inputs), saved in the published layout."""
        target = data.target
        features = data.features(settings.tokens)
        head, stats = train_eagle(features, target.get_input_embeddings(), target.get_output_embeddings(),
                                  target.config, steps=data.steps(settings), batch_rows=settings.batch_rows,
                                  window=settings.window, lr=settings.lr, ce_weight=settings.ce_weight,
                                  ce_fraction=settings.ce_fraction, noise=settings.noise, seed=data.seed_of(settings),
                                  compute_dtype=data.compute(settings), ckpt=data.ckpt, desc=data.desc("eagle"))
        save_eagle(head, out, data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in head.parameters()),
                **stats.as_dict(), **data.heldout("eagle", head)}

    def build_drafter(self) -> Drafter:
        self.head, embed, lm_head = _load(self, "eagle")
        return StaticTreeDrafter(self.head, embed, lm_head, build_tree(self.settings.choices, self.settings.num_nodes))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.head.parameters())


class Eagle2(Eagle):
    """`method=eagle2`: the same head with EAGLE-2's dynamic tree (`depth`, `top_k`, `total_tokens`)."""

    Settings = Eagle2Settings

    def build_drafter(self) -> Drafter:
        s = self.settings
        self.head, embed, lm_head = _load(self, "eagle2")
        return DynamicTreeDrafter(self.head, embed, lm_head, s.depth, s.top_k, s.total_tokens)


class Eagle3(SpeculativeMethod):
    """`method=eagle3`: an EAGLE-3 head (`method.head`) with EAGLE-2's dynamic tree."""

    Settings = Eagle2Settings
    Training = Eagle3Training

    @staticmethod
    def heldout_score(head: Any, row: Any) -> Iterator[tuple[int, torch.Tensor]]:
        """The first step's top-1 (on the fused states, mapped from the draft vocabulary) against the
        target's token, at a held-out row's drafting positions (specbench.kit.heads.heldout_agreement)."""
        out = head(row.embed(row.ids[row.span[1:]])[None].float(), row.fused()[None], row.span[:-1][None],
                   head.new_cache())[0]
        yield 0, head.target_ids()[head.draft_logits(out[row.t]).argmax(-1)] == row.choice[row.t + 1]

    @classmethod
    def train_head(cls, data: HeadData, settings: Eagle3Training, out: Path) -> dict:
        """An EAGLE-3 head on the fused states with training-time test; its draft vocabulary the most
        frequent tokens of the training rows; saved in the published layout."""
        target = data.target
        layers = feature_layers(int(target.config.get_text_config().num_hidden_layers), settings.layers)
        features = data.features(settings.tokens, layers)
        head, stats = train_eagle3(features, target.get_input_embeddings(), target.get_output_embeddings(),
                                   target.config, steps=data.steps(settings), batch_rows=settings.batch_rows,
                                   window=settings.window, lr=settings.lr, ttt_steps=settings.ttt_steps,
                                   step_decay=settings.step_decay, draft_vocab=settings.draft_vocab,
                                   layers=settings.layers, seed=data.seed_of(settings),
                                   compute_dtype=data.compute(settings), ckpt=data.ckpt, desc=data.desc("eagle3"))
        save_eagle3(head, out, data.base)
        return {"tokens": features.n_tokens, "params": sum(p.numel() for p in head.parameters()),
                "draft_vocab": head.draft_vocab_size, **stats.as_dict(), **data.heldout("eagle3", head)}

    def build_drafter(self) -> Drafter:
        s = self.settings
        model = self.target.model
        hidden, _, _ = target_dims(model)
        text = model.config.get_text_config()
        folder = head_folder(s.head, self.model_cfg, "eagle3", "EAGLE-3", EAGLE_FILES)
        self.head = load_eagle3(folder, hidden, int(text.vocab_size), self.target.device, self.target.dtype)
        layers = feature_layers(int(text.num_hidden_layers), self.head.layers)
        embed = self.head.embed_tokens if self.head.embed_tokens is not None else model.get_input_embeddings()
        return Eagle3Drafter(self.head, embed, layers, s.depth, s.top_k, s.total_tokens)

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.head.parameters())
