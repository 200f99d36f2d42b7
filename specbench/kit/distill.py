"""Training a kit's drafts on its corpus, as DistillSpec trains a draft: the loss on answer tokens
only (the prompt is context, never a target), forward KL to the target's distribution there (its
top-k, cached with the corpus, plus the mass outside it as one bucket) mixed with cross-entropy on
the answer tokens, every row in every epoch, batches of similar lengths.

What the card reports is measured on held-out rows, never on training batches: top-1 agreement
with the target at every answer position, and, on rows the target answered greedily, the chain
acceptance per depth (the share of positions where the draft's next d greedy tokens all equal the
target's: a drafted chain whose first d - 1 tokens were accepted sees exactly the corpus prefix,
so teacher-forced matches give chain acceptance exactly), and from it the mean accepted tokens
per step of a chain of `chain` drafted tokens. Measured at several points of training: the curve
of acceptance against training tokens.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specbench.core import resume as progress
from specbench.core.errors import SpecbenchError
from specbench.core.resume import TrainingState


@dataclass
class Rows:
    """Corpus rows for training: ids (prompt + answer), where the answer starts, the target's top-k
    at each answer position, and whether the target answered greedily."""

    ids: list[torch.Tensor]
    prompt: list[int]
    soft_ids: list[torch.Tensor]
    soft_logp: list[torch.Tensor]
    greedy: list[bool]
    #: the target's final-norm state at each answer token's prediction (row i: (answer length, hidden)),
    #: for a draft trained to match them too (`feature_weight`); None when not loaded
    states: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def answer_tokens(self) -> int:
        return sum(len(x) - p for x, p in zip(self.ids, self.prompt, strict=True))

    @classmethod
    def of(cls, rows: Sequence[dict], soft: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Rows:
        return cls([torch.tensor(r["prompt_ids"] + r["answer_ids"], dtype=torch.long) for r in rows],
                   [len(r["prompt_ids"]) for r in rows], [s[0] for s in soft], [s[1] for s in soft],
                   [float(r.get("temperature", 0)) <= 0 for r in rows])

    def with_states(self, final: Any) -> Rows:
        """These rows with the target's final states, read from `final` (a (rows, length, hidden)
        indexable of the same rows in the same order: specbench.kit.features.Ragged), in bfloat16."""
        states = [final[torch.tensor(i), slice(p - 1, len(x) - 1)].to(torch.bfloat16)
                  for i, (x, p) in enumerate(zip(self.ids, self.prompt, strict=True))]
        return Rows(self.ids, self.prompt, self.soft_ids, self.soft_logp, self.greedy, states)


def kd_topk(logits: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Forward KL(target || model) per position, the target given as its top-k log-probabilities
    (`ids`, `logp`: (N, k)) and the rest of its mass as one bucket; (N,) float32."""
    s_logp = torch.log_softmax(logits.float(), -1)
    s_k = s_logp.gather(1, ids.long())
    t_k = logp.float()
    t_rest = (1 - t_k.exp().sum(1)).clamp_min(1e-6)
    s_rest = torch.log1p(-s_k.exp().sum(1).clamp(max=1 - 1e-6))
    return (t_k.exp() * (t_k - s_k)).sum(1) + t_rest * (t_rest.log() - s_rest)


def batches(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch of row batches: every row once, rows of similar length together (sorted within
    shuffled groups), each batch at most `batch_tokens` padded tokens, batches in random order."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(lengths), generator=gen).tolist()
    group = max(1, 64 * batch_tokens // max(1, int(sum(lengths) / max(len(lengths), 1))))
    out: list[list[int]] = []
    for lo in range(0, len(order), group):
        chunk = sorted(order[lo:lo + group], key=lambda i: lengths[i])
        batch: list[int] = []
        for i in chunk:
            if batch and (len(batch) + 1) * max(lengths[j] for j in (*batch, i)) > batch_tokens:
                out.append(batch)
                batch = []
            batch.append(i)
        if batch:
            out.append(batch)
    perm = torch.randperm(len(out), generator=gen).tolist()
    return [out[i] for i in perm]


def _padded(rows: Rows, picked: Sequence[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids (B, W), batch row and position of every answer token's prediction)."""
    width = max(len(rows.ids[i]) for i in picked)
    ids = torch.full((len(picked), width), pad_id, dtype=torch.long)
    where_b, where_t = [], []
    for b, i in enumerate(picked):
        seq = rows.ids[i]
        ids[b, :len(seq)] = seq
        p = rows.prompt[i]
        where_t.append(torch.arange(p - 1, len(seq) - 1))  # position t predicts token t + 1
        where_b.append(torch.full((len(seq) - p,), b))
    return ids, torch.cat(where_b), torch.cat(where_t)


def answer_logits(model: torch.nn.Module, ids: torch.Tensor, at_b: torch.Tensor, at_t: torch.Tensor) -> torch.Tensor:
    """The model's logits at the given positions only (the LM head skips the prompt positions)."""
    return model.get_output_embeddings()(answer_states(model, ids, at_b, at_t))


def answer_states(model: torch.nn.Module, ids: torch.Tensor, at_b: torch.Tensor, at_t: torch.Tensor) -> torch.Tensor:
    """The model's final-norm states at the given positions (what its LM head reads)."""
    return model.get_decoder()(input_ids=ids).last_hidden_state[at_b, at_t]


def draft_layers(layers: int | Sequence[int], total: int) -> list[int]:
    """The target's blocks a draft keeps: `n` (the first n) or a list of block indices (negative count
    from the end, as Python's), in order, each once."""
    picked = list(range(int(layers))) if isinstance(layers, int) else [int(i) % total if -total <= int(i) < total
                                                                       else int(i) for i in layers]
    if not picked or any(not 0 <= i < total for i in picked) or picked != sorted(set(picked)):
        raise SpecbenchError(f"a draft's layers must be a count in 1..{total} or increasing block indices in "
                             f"0..{total - 1} (negative from the end), got {layers!r}")
    return picked


def draft_from_target(target: torch.nn.Module, layers: int | Sequence[int]) -> torch.nn.Module:
    """A draft made of the target's own blocks `layers` (the first n, or a list of block indices: the
    first and last blocks make a draft that skips the middle ones) with its embedding, final norm and
    LM head (copies: the target is never changed), the config the target's with those blocks."""
    import copy

    from transformers import AutoModelForCausalLM

    total = int(target.config.num_hidden_layers)
    picked = draft_layers(layers, total)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(picked)
    for key in ("layer_types",):  # per-layer lists follow the blocks kept
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, [getattr(config, key)[i] for i in picked])
    draft = AutoModelForCausalLM.from_config(config).float()
    renumber = {f"model.layers.{i}.": f"model.layers.{j}." for j, i in enumerate(picked)}
    state = {}
    for k, v in target.state_dict().items():
        if not k.startswith("model.layers."):
            state[k] = v
            continue
        prefix = ".".join(k.split(".")[:3]) + "."
        if prefix in renumber:
            state[renumber[prefix] + k[len(prefix):]] = v
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise RuntimeError(f"draft from target: missing {missing}, unexpected {unexpected}")
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft


@dataclass
class Evaluation:
    tokens: int  # training answer tokens seen when measured
    agreement: float  # top-1 agreement with the target at held-out answer positions
    depth: list[float]  # chain acceptance at depth 1..D on greedy held-out rows
    mean_accepted: float  # 1 + the expected accepted tokens of a chain of len(depth) drafted tokens
    kd: float  # held-out forward KL to the target's top-k

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "agreement": round(self.agreement, 4),
                "depth": [round(d, 4) for d in self.depth], "mean_accepted": round(self.mean_accepted, 4),
                "kd": round(self.kd, 4)}


@torch.inference_mode()
def evaluate(model: torch.nn.Module, held: Rows, pad_id: int, *, chain: int, tokens: int,
             compute_dtype: torch.dtype | None, batch_tokens: int = 8192) -> Evaluation:
    was = model.training
    model.eval()
    hits = seen = 0
    kd_sum = 0.0
    runs = torch.zeros(chain)
    starts = 0
    for picked in batches([len(x) for x in held.ids], batch_tokens, 0, 0):
        ids, at_b, at_t = _padded(held, picked, pad_id)
        with torch.autocast("cpu", dtype=compute_dtype or torch.bfloat16, enabled=compute_dtype is not None):
            logits = answer_logits(model, ids, at_b, at_t).float()
        t_ids = torch.cat([held.soft_ids[i] for i in picked]).long()
        t_logp = torch.cat([held.soft_logp[i] for i in picked])
        match = logits.argmax(-1) == t_ids[:, 0]
        hits += int(match.sum())
        seen += len(match)
        kd_sum += float(kd_topk(logits, t_ids, t_logp).sum())
        offset = 0
        for i in picked:
            n = len(held.ids[i]) - held.prompt[i]
            m = match[offset:offset + n]
            offset += n
            if not held.greedy[i] or n == 0:
                continue
            # run[t]: consecutive matches from t on (capped at `chain`)
            run = torch.zeros(n + 1, dtype=torch.long)
            for t in range(n - 1, -1, -1):
                run[t] = run[t + 1] + 1 if m[t] else 0
            run = run[:n].clamp(max=chain)
            runs += torch.stack([(run >= d).float().sum() for d in range(1, chain + 1)])
            starts += n
    model.train(was)
    depth = (runs / max(starts, 1)).tolist()
    return Evaluation(tokens, hits / max(seen, 1), depth, 1 + sum(depth), kd_sum / max(seen, 1))


@dataclass
class DraftStats:
    epochs: float
    steps: int
    tokens: int
    seconds: float
    final_loss: float
    curve: list[Evaluation] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "steps": self.steps, "tokens": self.tokens, "seconds": round(self.seconds, 1),
                "tokens_per_s": round(self.tokens / max(self.seconds, 1e-9)), "final_loss": round(self.final_loss, 4),
                "heldout": self.curve[-1].as_dict() if self.curve else None,
                "curve": [e.as_dict() for e in self.curve]}


def train_draft(model: torch.nn.Module, train: Rows, held: Rows, cfg: Any, *, pad_id: int, seed: int, desc: str,
                compute_dtype: torch.dtype | None, ckpt: TrainingState | None = None) -> DraftStats:
    """AdamW over every training row for `cfg.epochs` epochs (warm-up, cosine decay), loss on
    answer tokens: `kd_alpha` x forward KL to the target's top-k + (1 - kd_alpha) x cross-entropy;
    held-out evaluation `cfg.evaluations` times, evenly spread (the last at the end). `ckpt`: the
    progress saved there every so often and resumed from (specbench.core.resume)."""
    from specbench.zoo.train import adamw, lr_at

    torch.manual_seed(seed)
    epochs = float(cfg.epochs)
    lengths = [len(x) for x in train.ids]
    plan = [b for e in range(math.ceil(epochs)) for b in batches(lengths, int(cfg.batch_tokens), seed, e)]
    plan = plan[:max(1, round(len(plan) * epochs / math.ceil(epochs)))]
    points = {round(len(plan) * (j + 1) / int(cfg.evaluations)) - 1 for j in range(int(cfg.evaluations))}
    opt = adamw(model, cfg)
    kd_alpha = float(cfg.kd_alpha)
    feature_weight = float(cfg.get("feature_weight", 0.0))
    if feature_weight > 0 and train.states is None:
        raise SpecbenchError("feature_weight > 0 needs the target's states of the training rows (Rows.with_states)")
    chain = int(cfg.chain)
    model.train()
    first, saved = progress.resume(ckpt, model, opt)
    if not saved:
        tokens, ema = 0, None
        curve = [evaluate(model, held, pad_id, chain=chain, tokens=0, compute_dtype=compute_dtype)]
    else:
        tokens, ema = int(saved["tokens"]), saved["ema"]
        curve = [Evaluation(**e) for e in saved["curve"]]
    start, before = time.perf_counter(), tokens
    bar = tqdm(plan[first:], initial=first, total=len(plan), desc=desc, file=sys.stderr, dynamic_ncols=True,
               mininterval=5.0)
    for step, picked in enumerate(bar, start=first):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, len(plan), cfg)
        ids, at_b, at_t = _padded(train, picked, pad_id)
        with torch.autocast("cpu", dtype=compute_dtype or torch.bfloat16, enabled=compute_dtype is not None):
            hidden = answer_states(model, ids, at_b, at_t)
            logits = model.get_output_embeddings()(hidden)
        labels = ids[at_b, at_t + 1]
        loss = F.cross_entropy(logits.float(), labels)
        if kd_alpha > 0:
            t_ids = torch.cat([train.soft_ids[i] for i in picked])
            t_logp = torch.cat([train.soft_logp[i] for i in picked])
            loss = kd_alpha * kd_topk(logits, t_ids, t_logp).mean() + (1 - kd_alpha) * loss
        if feature_weight > 0:  # the target's own state before its LM head: a dense signal at every position
            wanted = torch.cat([train.states[i] for i in picked]).float()
            loss = loss + feature_weight * F.smooth_l1_loss(hidden.float(), wanted)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg.grad_clip))
        opt.step()
        tokens += len(labels)
        value = float(loss.detach())
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{(tokens - before) / (time.perf_counter() - start):.0f}",
                        refresh=False)
        if step in points:
            curve.append(evaluate(model, held, pad_id, chain=chain, tokens=tokens, compute_dtype=compute_dtype))
            print(f"specbench: {desc}: {tokens} tokens: held-out agreement {curve[-1].agreement:.3f}, "
                  f"chain {[round(d, 3) for d in curve[-1].depth]}, mean accepted {curve[-1].mean_accepted:.2f}",
                  file=sys.stderr, flush=True)
        progress.keep(ckpt, step + 1, len(plan), model, opt,
                      {"tokens": tokens, "ema": ema, "curve": [dataclasses.asdict(e) for e in curve]}, last=True)
    bar.close()
    model.eval()
    return DraftStats(epochs, len(plan), tokens, time.perf_counter() - start, float(ema or 0.0), curve)
