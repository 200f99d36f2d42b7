"""The training loops of the heads, the target frozen (each method's recipe calls its loop:
specbench.heads.recipe).

The target runs once over the token rows (no grad) and its features (last hidden state after
the final norm, what its LM head reads) are kept in memory; the heads then train on them:

- Medusa: cross-entropy of head k against the token k + 2 positions ahead, weighted
  `decay ** k` as in Medusa-1. The heads are position-wise, so each step takes a random
  batch of positions rather than whole rows.
- EAGLE: feature regression (smooth L1 to the next feature) plus `ce_weight` times the
  cross-entropy between the target's next-token distribution and the LM head on the predicted
  feature (the EAGLE paper's 1.0 / 0.1), with uniform noise on the input features (EAGLE's
  augmentation against its own drafting errors).
- Hydra: like Medusa, but head k also reads the embeddings of the k + 1 tokens before the one
  it predicts (teacher-forced with the corpus tokens), and learns the target's own distribution
  there (distillation) rather than the corpus token.
- EAGLE-3: token prediction from fused low / middle / high states with training-time test
  (`train_eagle3`).
- PPD's exit head: a residual block on the target's state after its first `exit_layer` blocks
  (through its final norm), learning the full target's next-token distribution there.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from specbench.core import resume as progress
from specbench.core.errors import SpecbenchError
from specbench.core.resume import TrainingState
from specbench.heads.eagle import EagleHead, head_config_for
from specbench.heads.eagle3 import Eagle3Head
from specbench.heads.exit import ExitHead
from specbench.heads.hydra import HydraHeads
from specbench.heads.medusa import MedusaHeads
from specbench.heads.specdec import MaskQueries, training_layout

#: Corpus tokens the frozen target is run over by default (each head's settings are its method's
#: `train:` section: specbench.heads.recipe).
DEFAULT_TOKENS = 120_000
@dataclass
class Features:
    """Token rows and the frozen target's features on them."""

    input_ids: torch.Tensor  # (rows, L) long
    valid: torch.Tensor  # (rows, L) bool: real tokens (not padding)
    features: torch.Tensor  # (rows, L, d) float32
    fused: torch.Tensor | None = None  # (rows, L, 3d) float32: EAGLE-3's low, middle, high states, when asked
    #: (rows, L) bool: the positions drafting starts from (a kit's corpus: the last prompt token and the
    #: answer's, so that every loss is on answer tokens); None: every real token (the zoo's packed rows)
    loss: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.valid.sum())

    def window_starts(self, rows: torch.Tensor, span: int, gen: torch.Generator) -> torch.Tensor:
        """Where windows of `span` positions start in `rows`: anywhere in the real tokens, or with a
        loss mask, from a little before the first drafting position (some prompt as context) on."""
        lengths = self.valid[rows].sum(1)
        if self.loss is None:
            top = (lengths - span).clamp(min=0)
            return (torch.rand(len(rows), generator=gen) * (top + 1)).long()
        first = self.loss[rows].float().argmax(1)
        room = max(0, self.input_ids.shape[1] - span)  # windows stay inside the padded rows
        lo = (first - span // 4).clamp(0, room)
        hi = torch.maximum(lo, lengths - span).clamp(max=room)
        return lo + (torch.rand(len(rows), generator=gen) * (hi - lo + 1)).long()


@torch.no_grad()  # not inference_mode: the features feed autograd later
def collect_features(model: nn.Module, input_ids: torch.Tensor, valid: torch.Tensor, batch_size: int = 8,
                     desc: str = "target features", layers: tuple[int, ...] | None = None) -> Features:
    """Run the frozen target over the rows and keep its final-norm hidden states (and, with
    `layers`, the hidden_states at those indices side by side: EAGLE-3's fused input)."""
    model.eval()
    out, fused = [], []
    for start in tqdm(range(0, input_ids.shape[0], batch_size), desc=desc, file=sys.stderr, mininterval=2.0):
        ids = input_ids[start : start + batch_size]
        width = int(valid[start : start + batch_size].any(0).nonzero().max()) + 1  # skip the all-padding tail
        states = model(input_ids=ids[:, :width], output_hidden_states=True).hidden_states
        out.append(F.pad(states[-1].float(), (0, 0, 0, ids.shape[1] - width)))
        if layers:
            fused.append(F.pad(torch.cat([states[i].float() for i in layers], dim=-1), (0, 0, 0, ids.shape[1] - width)))
    return Features(input_ids, valid, torch.cat(out), torch.cat(fused) if layers else None)


@contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """The target's modules stay out of autograd while a head trains through them."""
    params = [p for m in modules for p in m.parameters()]
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, before):
            p.requires_grad_(flag)


def _compute(dtype: torch.dtype | None) -> AbstractContextManager:
    """Mixed precision for a head's training forward (its heads' and the frozen LM head's products in
    `dtype`, bfloat16; the losses in float32, the weights and optimiser float32), as the methods' own
    recipes train; None: everything in float32 (the zoo's heads)."""
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext()


def _steps_bar(first: int, steps: int, desc: str) -> Any:
    return tqdm(range(first, steps), initial=first, total=steps, desc=desc, file=sys.stderr, mininterval=2.0)


def _lr(step: int, total: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to a tenth of `lr`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _optimizer(params: list[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    decay = [p for p in params if p.ndim >= 2]
    keep = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def _update(opt: torch.optim.Optimizer, loss: torch.Tensor, params: Any) -> None:
    """One optimiser step on `loss`, gradients clipped to norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def _smoothed(ema: float | None, loss: torch.Tensor, bar: Any) -> float:
    """The running loss shown on the progress bar (and reported as the final loss)."""
    value = float(loss.detach())
    ema = value if ema is None else 0.95 * ema + 0.05 * value
    bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
    return ema


def _freeze(*modules: nn.Module) -> None:
    """A trained head goes back to eval mode, out of autograd."""
    for module in modules:
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)


@dataclass
class HeadStats:
    steps: int
    seconds: float
    final_loss: float
    accuracy: list[float]  # top-1 agreement with the target per head / per step

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": round(self.seconds, 1), "final_loss": round(self.final_loss, 4),
                "top1": [round(a, 4) for a in self.accuracy]}


def train_medusa(data: Features, lm_head: nn.Module, *, num_heads: int = 4, num_layers: int = 1,
                 steps: int = 300, batch_positions: int = 2048, lr: float = 1e-3, weight_decay: float = 0.0,
                 decay: float = 0.8, train_projections: bool = False, seed: int = 0,
                 compute_dtype: torch.dtype | None = None, ckpt: TrainingState | None = None,
                 desc: str = "medusa head") -> tuple[MedusaHeads, HeadStats]:
    """Medusa-1 heads on the frozen features; projections start as copies of the LM head and are
    trained only with `train_projections` (they dominate the cost). `compute_dtype`: `_compute`;
    `ckpt`: progress saved there and resumed from (specbench.core.resume)."""
    torch.manual_seed(seed)
    vocab, hidden = lm_head.weight.shape
    heads = MedusaHeads(num_heads, num_layers, int(hidden), int(vocab))
    heads.init_from_lm_head(lm_head)
    for head in heads.heads:
        head[-1].weight.requires_grad_(train_projections)
    L = data.input_ids.shape[1]
    # Positions t whose target token t + k + 1 is real for every head k (packed rows pad only at the end).
    targets = torch.stack([torch.roll(data.input_ids, -(k + 2), dims=1) for k in range(num_heads)], dim=-1)
    ok = torch.stack([torch.roll(data.valid, -(k + 2), dims=1) for k in range(num_heads)], dim=-1).all(-1)
    ok[:, max(0, L - num_heads - 1) :] = False  # (rolled targets wrap around: never past the row)
    ok &= data.valid
    if data.loss is not None:
        ok &= data.loss
    where = ok.nonzero()
    if not len(where):
        raise SpecbenchError(f"Medusa training needs documents of at least {num_heads + 2} tokens (each head "
                             "learns a token further ahead); give longer documents, a larger seq_len or fewer heads")
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = _optimizer(params, lr, weight_decay)
    weights = torch.tensor([decay**k for k in range(num_heads)])
    start = time.perf_counter()
    first, saved = progress.resume(ckpt, heads, opt, gen)
    ema, hits, seen = saved.get("ema"), saved.get("hits", torch.zeros(num_heads)), saved.get("seen", 0)
    heads.train()
    bar = _steps_bar(first, steps, desc)
    for step in bar:  # (the LM head is only read when heads have no projections of their own)
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
        pick = where[torch.randint(len(where), (batch_positions,), generator=gen)]
        x = data.features[pick[:, 0], pick[:, 1]]
        y = targets[pick[:, 0], pick[:, 1]]  # (B, K)
        with _compute(compute_dtype):
            logits = heads(x)  # (B, K, V)
            losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(
                -1, num_heads).mean(0)
        loss = (losses * weights).sum()
        _update(opt, loss, params)
        if step >= steps * 3 // 4:  # accuracy over the last quarter of training
            hits += (logits.detach().argmax(-1) == y).float().sum(0)
            seen += y.shape[0]
        ema = _smoothed(ema, loss, bar)
        progress.keep(ckpt, step + 1, steps, heads, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    bar.close()
    _freeze(heads)
    return heads, HeadStats(steps, time.perf_counter() - start, float(ema or 0.0), (hits / max(seen, 1)).tolist())


def train_hydra(data: Features, embed: nn.Module, lm_head: nn.Module, *, num_heads: int = 4, num_layers: int = 1,
                steps: int = 300, batch_positions: int = 1024, lr: float = 1e-3, weight_decay: float = 0.0,
                decay: float = 0.8, train_projections: bool = False, distill: bool = True, seed: int = 0,
                compute_dtype: torch.dtype | None = None, ckpt: TrainingState | None = None,
                desc: str = "hydra head") -> tuple[HydraHeads, HeadStats]:
    """Hydra heads on the frozen features, teacher-forced: at position t head k reads h_t and the
    embeddings of tokens t+1 .. t+k+1 and learns token t+k+2 (weighted `decay ** k`): with
    `distill`, the cross-entropy to the target's own next-token distribution there (Hydra++'s
    teacher distillation), else to the corpus token. Projections start as the LM head and are
    trained only with `train_projections`. `compute_dtype`: `_compute`; `ckpt`: progress saved there and
    resumed from (specbench.core.resume)."""
    torch.manual_seed(seed)
    vocab, hidden = lm_head.weight.shape
    heads = HydraHeads(num_heads, num_layers, int(hidden), int(vocab))
    heads.init_from_lm_head(lm_head)
    for proj in heads.hydra_lm_head:
        proj.requires_grad_(train_projections)
    L = data.input_ids.shape[1]
    # Positions t whose tokens t+1 .. t+K+1 are all real (packed rows pad only at the end).
    ok = torch.stack([torch.roll(data.valid, -s, dims=1) for s in range(num_heads + 2)], dim=-1).all(-1)
    ok[:, max(0, L - num_heads - 1) :] = False  # (rolled values wrap around: never past the row)
    if data.loss is not None:
        ok &= data.loss
    where = ok.nonzero()
    if not len(where):
        raise SpecbenchError(f"Hydra training needs documents of at least {num_heads + 2} tokens (each head "
                             "learns a token further ahead); give longer documents, a larger seq_len or fewer heads")
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = _optimizer(params, lr, weight_decay)
    weights = [decay**k for k in range(num_heads)]
    ahead = torch.arange(1, num_heads + 2)  # t+1 .. t+K+1
    start = time.perf_counter()
    first, saved = progress.resume(ckpt, heads, opt, gen)
    ema, hits, seen = saved.get("ema"), saved.get("hits", torch.zeros(num_heads)), saved.get("seen", 0)
    heads.train()
    bar = _steps_bar(first, steps, desc)
    with frozen(embed, lm_head):
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
            pick = where[torch.randint(len(where), (batch_positions,), generator=gen)]
            r, t = pick[:, 0], pick[:, 1]
            with torch.no_grad(), _compute(compute_dtype):
                emb = embed(data.input_ids[r[:, None], t[:, None] + ahead]).float()  # (B, K+1, d)
                # The target's distribution of token t+k+2 is its LM head at position t+k+1.
                teacher = lm_head(data.features[r[:, None], t[:, None] + ahead[:-1]]).float()  # (B, K, V)
                labels = data.input_ids[r[:, None], t[:, None] + ahead[1:]] if not distill else teacher.argmax(-1)
                teacher_p = torch.softmax(teacher, dim=-1) if distill else None
            x = data.features[r, t]
            loss = torch.zeros(())
            for k in range(num_heads):
                x = torch.cat([x, emb[:, k]], dim=-1)
                with _compute(compute_dtype):
                    out = heads.head(k, x)
                logp = torch.log_softmax(out.float(), dim=-1)
                if distill:
                    loss_k = -(teacher_p[:, k] * logp).sum(-1).mean()
                else:
                    loss_k = F.nll_loss(logp, labels[:, k])
                loss = loss + weights[k] * loss_k
                if step >= steps * 3 // 4:  # agreement with the target's argmax over the last quarter
                    hits[k] += float((logp.detach().argmax(-1) == teacher[:, k].argmax(-1)).sum())
            if step >= steps * 3 // 4:
                seen += batch_positions
            _update(opt, loss, params)
            ema = _smoothed(ema, loss, bar)
            progress.keep(ckpt, step + 1, steps, heads, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    bar.close()
    _freeze(heads)
    return heads, HeadStats(steps, time.perf_counter() - start, float(ema or 0.0), (hits / max(seen, 1)).tolist())


@torch.no_grad()  # not inference_mode: the states feed autograd later
def collect_exit_states(model: nn.Module, input_ids: torch.Tensor, valid: torch.Tensor, exit_layer: int,
                        batch_size: int = 8, desc: str = "early-exit states") -> torch.Tensor:
    """The frozen target's state after its first `exit_layer` blocks, through its final norm (the
    forward PPD's drafter runs: the model's own, with the block list narrowed), (rows, L, d)."""
    from specbench.engine.layers import OnlyBlocks, decoder_blocks

    name, blocks = decoder_blocks(model)
    if not 1 <= exit_layer < len(blocks):
        raise SpecbenchError(f"the exit layer must be in 1..{len(blocks) - 1} for this {len(blocks)}-block model, "
                             f"got {exit_layer}")
    model.eval()
    out = []
    with OnlyBlocks(model, name, list(range(exit_layer))):
        for start in tqdm(range(0, input_ids.shape[0], batch_size), desc=desc, file=sys.stderr, mininterval=2.0):
            ids = input_ids[start : start + batch_size]
            width = int(valid[start : start + batch_size].any(0).nonzero().max()) + 1
            hidden = model(input_ids=ids[:, :width], use_cache=False, output_hidden_states=True).hidden_states[-1]
            out.append(F.pad(hidden.float(), (0, 0, 0, ids.shape[1] - width)))
    return torch.cat(out)


def train_exit_head(data: Features, exit_states: torch.Tensor, lm_head: nn.Module, *, exit_layer: int,
                    num_layers: int, steps: int = 150, batch_positions: int = 1024, lr: float = 3e-3,
                    weight_decay: float = 0.0, seed: int = 0, compute_dtype: torch.dtype | None = None,
                    ckpt: TrainingState | None = None, desc: str = "ppd exit head") -> tuple[ExitHead, HeadStats]:
    """PPD's exit head on the frozen early-exit states: cross-entropy to the full target's next-token
    distribution at the same position (distillation), through the frozen LM head. `compute_dtype`: `_compute`."""
    torch.manual_seed(seed)
    head = ExitHead(int(lm_head.weight.shape[1]), exit_layer, num_layers)
    where = (data.valid if data.loss is None else data.valid & data.loss).nonzero()
    if not len(where):
        raise SpecbenchError("PPD exit-head training needs at least one real token")
    gen = torch.Generator().manual_seed(seed)
    params = list(head.parameters())
    opt = _optimizer(params, lr, weight_decay)
    start = time.perf_counter()
    first, saved = progress.resume(ckpt, head, opt, gen)
    ema, hits, seen = saved.get("ema"), saved.get("hits", 0.0), saved.get("seen", 0.0)
    head.train()
    bar = _steps_bar(first, steps, desc)
    with frozen(lm_head):
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
            pick = where[torch.randint(len(where), (batch_positions,), generator=gen)]
            with torch.no_grad(), _compute(compute_dtype):
                teacher = lm_head(data.features[pick[:, 0], pick[:, 1]]).float()
            with _compute(compute_dtype):
                logits = head(exit_states[pick[:, 0], pick[:, 1]], lm_head)
            logp = torch.log_softmax(logits.float(), dim=-1)
            loss = -(torch.softmax(teacher, dim=-1) * logp).sum(-1).mean()
            _update(opt, loss, params)
            if step >= steps * 3 // 4:
                hits += float((logp.detach().argmax(-1) == teacher.argmax(-1)).sum())
                seen += batch_positions
            ema = _smoothed(ema, loss, bar)
            progress.keep(ckpt, step + 1, steps, head, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    bar.close()
    _freeze(head)
    return head, HeadStats(steps, time.perf_counter() - start, float(ema or 0.0), [hits / max(seen, 1.0)])


def train_specdec(data: Features, draft: nn.Module, lm_head: nn.Module, *, block: int = 4, steps: int = 300,
                  batch_rows: int = 8, window: int = 128, cuts: int = 24, lr: float = 1e-3, weight_decay: float = 0.0,
                  seed: int = 0, compute_dtype: torch.dtype | None = None, ckpt: TrainingState | None = None,
                  desc: str = "specdec drafter") -> tuple[nn.Module, MaskQueries, HeadStats]:
    """SpecDec's NAR drafter: `draft` (a copy of it, trained in place of the original) plus block - 1
    mask queries, distilled from the target's next-token distributions (the frozen `lm_head` on
    `data.features`). Each step takes `batch_rows` windows of `window` real tokens and `cuts` cut
    points per window, all in one forward (heads.specdec.training_layout): every real row learns
    the next token (the first draft token comes from the pending token's row) and slot i of cut c
    the token at c + 2 + i. Top-1 agreement is reported per drafted position (1..block).
    `compute_dtype`: `_compute`."""

    torch.manual_seed(seed)
    lengths = data.valid.sum(1)
    usable = (lengths >= block + 2).nonzero().flatten()
    if not len(usable):
        raise SpecbenchError(f"SpecDec training needs token rows of at least {block + 2} real tokens")
    window = max(block + 2, min(window, int(lengths[usable].min())))
    cuts = max(1, min(cuts, window - block + 1))
    draft = copy.deepcopy(draft).float().train()
    embed = draft.get_input_embeddings()
    hidden = int(embed.weight.shape[1])
    queries = MaskQueries(block, hidden)
    with torch.no_grad():  # every slot starts at the mean token embedding
        queries.embeddings.copy_(embed.weight.float().mean(0).expand(block - 1, -1))
    params = [p for p in draft.parameters() if p.requires_grad] + list(queries.parameters())
    opt = _optimizer(params, lr, weight_decay)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(lm_head.weight.shape[0])
    start = time.perf_counter()
    both = nn.ModuleDict({"draft": draft, "queries": queries})  # what is trained, as one module
    first, saved = progress.resume(ckpt, both, opt, gen)
    ema, hits, seen = saved.get("ema"), saved.get("hits", torch.zeros(block)), saved.get("seen", 0.0)
    bar = _steps_bar(first, steps, desc)
    with frozen(lm_head):
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
            picked = usable[torch.randint(len(usable), (batch_rows,), generator=gen)]
            ids, teachers, masks, positions, pred_rows, teach_rows, drafted = [], [], [], [], [], [], []
            for r in picked.tolist():
                if data.loss is None:
                    offset = int(torch.randint(int(lengths[r]) - window + 1, (1,), generator=gen))
                else:
                    offset = int(data.window_starts(torch.tensor([r]), window, gen)[0])
                ids.append(data.input_ids[r, offset : offset + window])
                with torch.no_grad(), _compute(compute_dtype):
                    teachers.append(lm_head(data.features[r, offset : offset + window]).float())
                at = torch.randperm(window - block + 1, generator=gen)[:cuts].sort().values
                allow, pos = training_layout(window, at, block)
                masks.append(allow)
                positions.append(pos)
                # real row c -> teacher row c (token c + 1); slot i of cut c -> teacher row c + 1 + i
                slots = window + torch.arange(len(at) * (block - 1)).view(len(at), block - 1)
                pred_rows.append(torch.cat([torch.arange(window - 1), slots.T.flatten()]))
                teach_rows.append(torch.cat([torch.arange(window - 1),
                                             (at[None, :] + 1 + torch.arange(block - 1)[:, None]).flatten()]))
                if data.loss is not None:  # each prediction's drafting position: its own row, a slot's cut
                    at_rows = torch.cat([torch.arange(window - 1), at.repeat(block - 1)])
                    drafted.append(data.loss[r, offset + at_rows].float())
            ids_t = torch.stack(ids)
            x = torch.cat([embed(ids_t), queries.embeddings[None, None].expand(len(ids), cuts, -1, -1)
                           .reshape(len(ids), cuts * (block - 1), hidden)], dim=1)
            allow = torch.stack(masks)[:, None]
            mask = torch.zeros(allow.shape, dtype=x.dtype).masked_fill(~allow, torch.finfo(x.dtype).min)
            with _compute(compute_dtype):
                logits = draft(inputs_embeds=x, attention_mask=mask, position_ids=torch.stack(positions),
                               use_cache=False).logits
            rows = torch.arange(len(ids))[:, None]
            pred = torch.stack(pred_rows)
            logp = torch.log_softmax(logits[rows, pred].float()[..., :vocab], dim=-1)
            teacher = torch.stack(teachers)[rows, torch.stack(teach_rows)]
            per = -(torch.softmax(teacher, dim=-1) * logp).sum(-1)
            if data.loss is None:
                loss = per.mean()
            else:
                weight = torch.stack(drafted)
                loss = (per * weight).sum() / weight.sum().clamp(min=1.0)
            _update(opt, loss, params)
            if step >= steps * 3 // 4:
                agree = (logp.detach().argmax(-1) == teacher.argmax(-1)).float()
                first_pos = agree[:, : window - 1].mean(1).sum()
                later = agree[:, window - 1 :].view(len(ids), block - 1, cuts).mean(2).sum(0)
                hits += torch.cat([first_pos.view(1), later])
                seen += len(ids)
            ema = _smoothed(ema, loss, bar)
            progress.keep(ckpt, step + 1, steps, both, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    bar.close()
    _freeze(draft, queries)
    return draft, queries, HeadStats(steps, time.perf_counter() - start, float(ema or 0.0),
                                     (hits / max(seen, 1.0)).tolist())


def chain_masks(window: int, steps: int) -> list[torch.Tensor | None]:
    """Training-time test's attention over `window` positions, per step: step 0 plain causal (None);
    step j attends to step 0's keys up to its position and to its own position's key at each of
    steps 1..j (a drafted chain's pattern: teacher-forced context, then the chain's own entries)."""
    causal = torch.ones(window, window, dtype=torch.bool).tril()
    own = torch.eye(window, dtype=torch.bool)
    return [None] + [torch.cat([causal, *([own] * j)], dim=1) for j in range(1, steps)]


def train_eagle3(data: Features, embed: nn.Module, lm_head: nn.Module, target_config: Any, *, steps: int = 200,
                 batch_rows: int = 8, window: int = 192, lr: float = 2e-3, weight_decay: float = 0.0,
                 ttt_steps: int = 3, step_decay: float = 0.8, draft_vocab: int | None = None,
                 train_lm_head: bool = True, layers: list[int] | None = None, seed: int = 0,
                 compute_dtype: torch.dtype | None = None, ckpt: TrainingState | None = None,
                 desc: str = "eagle3 head") -> tuple[Eagle3Head, HeadStats]:
    """An EAGLE-3 head on the frozen fused states (`data.fused`), with training-time test.

    The draft vocabulary is the `draft_vocab` most frequent tokens of the rows (all when None);
    its LM head starts as the target's rows for them. Each step takes random windows; the head
    runs `ttt_steps` times over each window: step 0 on the target's fused states (causal), step j
    on its own step j - 1 outputs with the next tokens' embeddings, attending to step 0's keys up
    to its position and to its own chain's earlier steps (the tree-drafting pattern), and learns
    at step j the target's distribution (renormalised over the draft vocabulary) of token t + 2 + j,
    weighted `step_decay ** j`. `compute_dtype`: `_compute`."""
    if data.fused is None:
        raise SpecbenchError("EAGLE-3 training needs the fused target states: collect_features(..., layers=...)")
    torch.manual_seed(seed)
    vocab = int(lm_head.weight.shape[0])
    size = vocab if not draft_vocab else min(int(draft_vocab), vocab)
    if data.fused.shape[-1] != 3 * int(lm_head.weight.shape[1]):
        raise SpecbenchError("EAGLE-3 training needs three fused target states per token "
                             "(collect_features(layers=...))")
    head = Eagle3Head(head_config_for(target_config, num_layers=1), size, vocab, tuple(layers) if layers else None)
    drafted = data.valid if data.loss is None else torch.roll(data.loss, 1, dims=1)  # the tokens drafts are of
    counts = torch.bincount(data.input_ids[drafted].flatten(), minlength=vocab)[:vocab]
    head.set_vocabulary(torch.sort(-counts.float(), stable=True).indices[:size])
    ids_map = head.target_ids()
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_head.weight[ids_map])
    gen = torch.Generator().manual_seed(seed)
    rows, L = data.input_ids.shape
    window = max(1, min(window, L - ttt_steps - 2))
    lengths = data.valid.sum(1)
    usable = (lengths >= ttt_steps + 8).nonzero().flatten()
    if not len(usable):
        raise SpecbenchError(f"EAGLE-3 training needs rows of at least {ttt_steps + 8} real tokens; give longer "
                             "documents or a larger seq_len")
    head.lm_head.weight.requires_grad_(train_lm_head)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = _optimizer(params, lr, weight_decay)
    start = time.perf_counter()
    first, saved = progress.resume(ckpt, head, opt, gen)
    ema, hits, seen = saved.get("ema"), saved.get("hits", torch.zeros(ttt_steps)), saved.get("seen",
                                                                                               torch.zeros(ttt_steps))
    head.train()
    bar = _steps_bar(first, steps, desc)
    masks = chain_masks(window, ttt_steps)
    with frozen(embed, lm_head):
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
            r = usable[torch.randint(len(usable), (batch_rows,), generator=gen)]
            s = data.window_starts(r, window + ttt_steps + 1, gen)
            idx = s[:, None] + torch.arange(window + ttt_steps + 1)[None]
            ids, valid = data.input_ids[r[:, None], idx], data.valid[r[:, None], idx]
            h = data.fused[r[:, None], idx[:, :window]]
            cache = head.new_cache()
            loss = torch.zeros(())
            for j in range(ttt_steps):
                with torch.no_grad(), _compute(compute_dtype):
                    emb = embed(ids[:, 1 + j : 1 + j + window]).float()
                    teacher = lm_head(data.features[r[:, None], idx[:, 1 + j : 1 + j + window]]).float()[..., ids_map]
                    teacher_p = torch.softmax(teacher, dim=-1)
                positions = s[:, None] + torch.arange(window)[None] + j
                with _compute(compute_dtype):
                    out = head(emb, h, positions, cache, masks[j])
                    logits = head.draft_logits(out)
                out = out.float()
                logp = torch.log_softmax(logits.float(), dim=-1)
                mask = valid[:, :window] & valid[:, 2 + j : 2 + j + window]
                if data.loss is not None:
                    mask &= data.loss[r[:, None], idx[:, :window]]
                if mask.any():
                    loss = loss + step_decay**j * (-(teacher_p * logp).sum(-1)[mask].mean())
                    if step >= steps * 3 // 4:
                        hits[j] += float((logp.detach().argmax(-1) == teacher_p.argmax(-1))[mask].sum())
                        seen[j] += float(mask.sum())
                h = out
            _update(opt, loss, params)
            ema = _smoothed(ema, loss, bar)
            progress.keep(ckpt, step + 1, steps, head, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    bar.close()
    _freeze(head)
    return head, HeadStats(steps, time.perf_counter() - start, float(ema or 0.0), (hits / seen.clamp(min=1)).tolist())


def train_eagle(data: Features, embed: nn.Module, lm_head: nn.Module, target_config: Any, *, steps: int = 300,
                batch_rows: int = 4, window: int = 256, lr: float = 1e-3, weight_decay: float = 0.0,
                ce_weight: float = 0.1, ce_fraction: float = 1.0, noise: float = 0.1, unroll: int = 1,
                step_decay: float = 0.8, seed: int = 0, compute_dtype: torch.dtype | None = None,
                ckpt: TrainingState | None = None, desc: str = "eagle head") -> tuple[EagleHead, HeadStats]:
    """An EAGLE-1 head (one layer) on the frozen features; each step takes random windows of
    `window` positions from `batch_rows` rows (the head attends within its window). The
    cross-entropy goes through the vocabulary projection, the costliest part on CPU, so it is
    computed on a random `ce_fraction` of the positions. `compute_dtype`: `_compute`.

    `unroll` > 1 is training-time test (HASS, EAGLE-3's recipe, on EAGLE-1's feature regression):
    step j feeds the head its own step j - 1 predictions with the next tokens' embeddings, attending
    to step 0's keys up to its position and to its own chain's earlier steps (as a drafted chain
    does at run time), and learns the target's feature t + 1 + j, weighted `step_decay ** j`."""
    torch.manual_seed(seed)
    head = EagleHead(head_config_for(target_config, num_layers=1))
    gen = torch.Generator().manual_seed(seed)
    rows, L = data.input_ids.shape
    window = min(window, L - unroll)
    lengths = data.valid.sum(1)
    usable = (lengths >= 8).nonzero().flatten()
    if not len(usable):
        raise SpecbenchError("EAGLE training needs rows of at least 8 real tokens; give longer documents or a "
                             "larger seq_len")
    opt = _optimizer(list(head.parameters()), lr, weight_decay)
    start = time.perf_counter()
    first, saved = progress.resume(ckpt, head, opt, gen)
    head.train()
    bar = _steps_bar(first, steps, desc)
    with frozen(embed, lm_head):
        stats = _eagle_loop(head, data, embed, lm_head, opt, bar, steps, batch_rows, window, lr, ce_weight,
                            ce_fraction, noise, gen, usable, compute_dtype, ckpt, saved, unroll, step_decay)
    bar.close()
    _freeze(head)
    return head, HeadStats(steps, time.perf_counter() - start, *stats)


def _eagle_loop(head: EagleHead, data: Features, embed: nn.Module, lm_head: nn.Module, opt: torch.optim.Optimizer,
                bar: Any, steps: int, batch_rows: int, window: int, lr: float, ce_weight: float, ce_fraction: float,
                noise: float, gen: torch.Generator, usable: torch.Tensor,
                compute_dtype: torch.dtype | None = None, ckpt: TrainingState | None = None,
                saved: dict | None = None, unroll: int = 1, step_decay: float = 0.8) -> tuple[float, list[float]]:
    saved = saved or {}
    ema = saved.get("ema")
    hits, seen = saved.get("hits", [0.0] * unroll), saved.get("seen", [0.0] * unroll)
    hits, seen = (list(x) if isinstance(x, list) else [x] for x in (hits, seen))  # (a one-step run's saved floats)
    masks = chain_masks(window, unroll)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, max(1, steps // 20))
        r = usable[torch.randint(len(usable), (batch_rows,), generator=gen)]
        # A window starting at a random position, inside the real tokens of each row where possible.
        s = data.window_starts(r, window + unroll, gen)
        idx = s[:, None] + torch.arange(window + unroll)[None]  # window + unroll positions: inputs and targets
        ids = data.input_ids[r[:, None], idx]
        feats = data.features[r[:, None], idx]
        valid = data.valid[r[:, None], idx]
        # Step 0, position t: (embedding of token t + 1, feature t) -> feature t + 1; step j: (embedding of
        # token t + 1 + j, the head's step j - 1 prediction) -> feature t + 1 + j.
        x_feat = feats[:, :window]
        if noise > 0:
            x_feat = x_feat + (torch.rand(x_feat.shape, generator=gen) * 2 - 1) * noise
        cache = head.new_cache() if unroll > 1 else None
        answer = data.loss[r[:, None], idx[:, :window]] if data.loss is not None else None
        loss = torch.zeros(())
        for j in range(unroll):
            y_feat = feats[:, 1 + j : 1 + j + window]
            with torch.no_grad():
                x_emb = embed(ids[:, 1 + j : 1 + j + window]).float()
            positions = s[:, None] + torch.arange(window)[None] + j
            with _compute(compute_dtype):
                pred = head(x_emb, x_feat, positions, cache, masks[j]).float()
            mask = valid[:, j : j + window] & valid[:, 1 + j : 1 + j + window]
            if answer is not None:
                mask &= answer
            if not mask.any():
                break
            reg = F.smooth_l1_loss(pred, y_feat, reduction="none").mean(-1)[mask].mean()
            # Cross-entropy to the target's next-token distribution on a random subset of positions.
            ce_mask = mask & (torch.rand(mask.shape, generator=gen) < ce_fraction)
            if not ce_mask.any():
                ce_mask = mask
            with torch.no_grad(), _compute(compute_dtype):
                target_logp = torch.log_softmax(lm_head(y_feat[ce_mask]).float(), dim=-1)
            with _compute(compute_dtype):
                logits = lm_head(pred[ce_mask])
            logp = torch.log_softmax(logits.float(), dim=-1)
            ce = -(target_logp.exp() * logp).sum(-1).mean()
            loss = loss + step_decay**j * (reg + ce_weight * ce)
            if step >= steps * 3 // 4:
                hits[j] += float((logp.detach().argmax(-1) == target_logp.argmax(-1)).sum())
                seen[j] += float(target_logp.shape[0])
            x_feat = pred
        if loss.requires_grad:  # (windows without an answer position teach nothing)
            _update(opt, loss, head.parameters())
            ema = _smoothed(ema, loss, bar)
        progress.keep(ckpt, step + 1, steps, head, opt, {"ema": ema, "hits": hits, "seen": seen}, gen)
    return float(ema or 0.0), [h / max(n, 1.0) for h, n in zip(hits, seen, strict=True)]
