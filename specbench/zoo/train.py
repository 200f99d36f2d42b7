"""Training the zoo's Llamas: next-token cross-entropy, optionally distilled from a teacher.

One loop serves the target (hard labels), the distilled draft (forward KL to the target's
distribution mixed with cross-entropy, DistillSpec-style) and the plain draft (hard labels).
Full fp32 on CPU: bf16 autocast was measured slower on the 2-core machine.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from specbench.zoo.data import Packed


def make_model(arch: DictConfig, tokenizer: PreTrainedTokenizerBase, max_positions: int, seed: int,
               max_new_tokens: int) -> LlamaForCausalLM:
    """A freshly initialised Llama of the given shape whose special ids match the tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attention_dropout=0.0,
        **OmegaConf.to_container(arch, resolve=True),
    )
    model = LlamaForCausalLM(config)
    # generate() and the harness read EOS/pad from here: the end-of-turn token ends an answer.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=max_new_tokens,
    )
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, tcfg: DictConfig) -> float:
    """Linear warmup, then cosine decay from lr to lr * min_lr_ratio."""
    warmup = int(tcfg.warmup_steps)
    if step < warmup:
        return float(tcfg.lr) * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    floor = float(tcfg.min_lr_ratio)
    return float(tcfg.lr) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def adamw(model: torch.nn.Module, tcfg: DictConfig) -> torch.optim.Optimizer:
    # Norm gains stay out of weight decay: decaying them towards 0 only fights the RMSNorm.
    # Frozen parameters (a draft's embedding shared with its target) stay out of the optimizer.
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    keep = [p for p in trained if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": float(tcfg.weight_decay)}, {"params": keep, "weight_decay": 0.0}]
    # fused: one kernel per step instead of a dozen passes over the weights (~30 ms saved per
    # step on 2 cores, which matters at batch size 1).
    return torch.optim.AdamW(groups, lr=float(tcfg.lr), betas=(float(tcfg.beta1), float(tcfg.beta2)), fused=True)


def _batches(n_rows: int, batch_size: int, epochs: float, seed: int) -> list[torch.Tensor]:
    """Row indices per step: a fresh seeded permutation per epoch, `epochs` may be fractional."""
    total = max(1, math.ceil(epochs * n_rows / batch_size))
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(n_rows, generator=gen) for _ in range(math.ceil(epochs) + 1)])
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(total)]


@dataclass
class TrainStats:
    steps: int
    tokens: int
    seconds: float
    final_loss: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "seconds": round(self.seconds, 1),
                "tokens_per_s": round(self.tokens_per_s), "final_loss": round(self.final_loss, 4)}


def lm_loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor,
            teacher: torch.nn.Module | None, kd_alpha: float, temperature: float,
            compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Cross-entropy on the next token, mixed with forward KL(teacher || model) when distilling.
    Forwards run under CPU autocast when `compute_dtype` is given; losses are taken in float32."""
    with torch.autocast("cpu", dtype=compute_dtype or torch.bfloat16, enabled=compute_dtype is not None):
        logits = model(input_ids=input_ids).logits[:, :-1].float()
    targets = labels[:, 1:]
    keep = targets != -100
    logits, targets = logits[keep], targets[keep]
    ce = F.cross_entropy(logits, targets)
    if teacher is None or kd_alpha <= 0:
        return ce
    with torch.no_grad(), torch.autocast("cpu", dtype=compute_dtype or torch.bfloat16,
                                         enabled=compute_dtype is not None):
        t_logits = teacher(input_ids=input_ids).logits[:, :-1][keep].float()
        t_logp = F.log_softmax(t_logits / temperature, dim=-1)
    s_logp = F.log_softmax(logits / temperature, dim=-1)
    # T^2 keeps the gradient scale independent of the temperature (Hinton et al.).
    kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean") * temperature**2
    return kd_alpha * kl + (1 - kd_alpha) * ce


def train(model: torch.nn.Module, data: Packed, tcfg: DictConfig, *, seed: int, desc: str,
          teacher: torch.nn.Module | None = None, compute_dtype: torch.dtype | None = None) -> TrainStats:
    """AdamW over the packed rows with warmup + cosine decay; a tqdm bar shows loss and tokens/s."""
    torch.manual_seed(seed)
    model.train()
    if teacher is not None:
        teacher.eval()
    opt = adamw(model, tcfg)
    steps = _batches(len(data), int(tcfg.batch_size), float(tcfg.epochs), seed)
    kd_alpha, temperature = float(tcfg.kd_alpha), float(tcfg.temperature)
    tokens, ema = 0, None
    start = time.perf_counter()
    bar = tqdm(steps, desc=desc, file=sys.stderr, dynamic_ncols=True, mininterval=2.0)
    for step, rows in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, len(steps), tcfg)
        input_ids, labels = data.input_ids[rows], data.labels[rows]
        # Trim the all-padding tail of the batch: less compute for the same loss.
        width = int((labels != -100).any(0).nonzero().max()) + 1
        input_ids, labels = input_ids[:, :width], labels[:, :width]
        loss = lm_loss(model, input_ids, labels, teacher, kd_alpha, temperature, compute_dtype)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(tcfg.grad_clip))
        opt.step()
        tokens += int((labels != -100).sum())
        value = float(loss.detach())
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}", refresh=False)
    bar.close()
    model.eval()
    return TrainStats(len(steps), tokens, time.perf_counter() - start, float(ema or 0.0))
