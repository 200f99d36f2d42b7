"""Batched generation for building corpora: greedy or sampled per row, the target's top-k kept.

A corpus for distillation needs more than the tokens: the target's distribution at every answer
position (DistillSpec's forward KL, EAGLE's soft labels). Generation computes it anyway, so the
loop here keeps its top-k (ids and log-probabilities at temperature 1, before any sampling
transform) while it decodes, and distillation never runs the target again.

Rows are left-padded into batches of similar prompt length; a row leaves the batch (its cache
rows dropped) when it ends, so a long tail costs only the rows still running. Sampling draws from
one seeded generator per batch: the same prompts, settings and seed give the same tokens on the
same machine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specbench.models import new_cache


@dataclass
class Sampling:
    """How one row is answered: greedy (`temperature` 0) or sampled with temperature and top-p."""

    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class Generated:
    """One row's answer: its tokens (the ending token included when it ended), whether an end
    token ended it, and the target's top-k at each of its positions (empty when k is 0)."""

    ids: list[int]
    ended: bool
    topk_ids: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.int32))
    topk_logp: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.float16))


def _choose(logits: torch.Tensor, modes: Sequence[Sampling], gen: torch.Generator) -> torch.Tensor:
    """The next token of each row: argmax for greedy rows, one draw for the sampled ones (all of
    them at once: temperature, then the smallest set of tokens whose mass reaches top-p)."""
    out = logits.argmax(-1)
    hot = [r for r, mode in enumerate(modes) if not mode.greedy]
    if not hot:
        return out
    index = torch.tensor(hot)
    temps = torch.tensor([modes[r].temperature for r in hot], dtype=logits.dtype)[:, None]
    top_p = torch.tensor([modes[r].top_p for r in hot], dtype=logits.dtype)[:, None]
    probs = torch.softmax(logits[index] / temps, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the first token always stays
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
    out[index] = torch.multinomial(kept, 1, generator=gen)[:, 0]
    return out


@torch.inference_mode()
def generate_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], modes: Sequence[Sampling], *,
                   max_new_tokens: int, end_ids: set[int], pad_id: int, topk: int, seed: int) -> list[Generated]:
    """Answer `prompts` together (left-padded), each row by its mode, until an end token or
    `max_new_tokens`."""
    n = len(prompts)
    width = max(map(len, prompts))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[r, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model.config)
    gen = torch.Generator().manual_seed(seed)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                logits_to_keep=1)
    live = list(range(n))  # the prompt index of each batch row
    tokens: list[list[int]] = [[] for _ in range(n)]
    kept_ids: list[list[torch.Tensor]] = [[] for _ in range(n)]
    kept_logp: list[list[torch.Tensor]] = [[] for _ in range(n)]
    ended = [False] * n
    last_pos = positions[:, -1:]
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        if topk:
            logp = torch.log_softmax(logits, -1)
            top = logp.topk(topk, -1)
            for b, i in enumerate(live):
                kept_ids[i].append(top.indices[b].to(torch.int32))
                kept_logp[i].append(top.values[b].to(torch.float16))
        nxt = _choose(logits, [modes[i] for i in live], gen)
        stay = []
        for b, i in enumerate(live):
            token = int(nxt[b])
            tokens[i].append(token)
            if token in end_ids:
                ended[i] = True
            else:
                stay.append(b)
        if not stay or step == max_new_tokens - 1:
            break
        if len(stay) < len(live):
            index = torch.tensor(stay, dtype=torch.long)
            cache.batch_select_indices(index)
            mask, last_pos, nxt = mask[index], last_pos[index], nxt[index]
            live = [live[b] for b in stay]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], -1)
        last_pos = last_pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos, cache=cache,
                    use_cache=True)
    results = []
    for i in range(n):
        if topk:
            results.append(Generated(tokens[i], ended[i], torch.stack(kept_ids[i]), torch.stack(kept_logp[i])))
        else:
            results.append(Generated(tokens[i], ended[i]))
    return results


def generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], modes: Sequence[Sampling], *,
             max_new_tokens: int, end_ids: set[int], pad_id: int, topk: int, seed: int, batch_size: int,
             desc: str = "", progress: Callable[[str], None] | None = None) -> list[Generated]:
    """`generate_batch` over batches of similar prompt length (sorted), results in prompt order;
    batch j samples with seed `seed + j`. `progress` receives a line per batch."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    results: list[Generated | None] = [None] * len(prompts)
    start, made = time.perf_counter(), 0
    for j, lo in enumerate(range(0, len(order), batch_size)):
        rows = order[lo:lo + batch_size]
        batch = generate_batch(model, [prompts[i] for i in rows], [modes[i] for i in rows],
                               max_new_tokens=max_new_tokens, end_ids=end_ids, pad_id=pad_id, topk=topk,
                               seed=seed + j)
        for i, res in zip(rows, batch, strict=True):
            results[i] = res
            made += len(res.ids)
        if progress is not None:
            took = time.perf_counter() - start
            progress(f"{desc}: {min(lo + batch_size, len(order))}/{len(order)} rows, {made} tokens, "
                     f"{made / max(took, 1e-9):.0f} tokens/s")
    return [r for r in results if r is not None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
