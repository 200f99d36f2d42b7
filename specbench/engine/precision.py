"""How far the target's own arithmetic moves its greedy choices when the rows of a forward change.

A speculative method's tokens come from forwards over several rows (the root and the draft
nodes), the baseline's from forwards over one row. In exact arithmetic both give the same
logits; in float32 they differ in the last bits, in bfloat16 and float16 by a good part of a
logit, so a greedy method that verifies correctly can still leave the baseline's answer where
its top two tokens lie that close. `measure_spread` measures this on the run's own device and
dtype: it decodes a few prompts greedily one row at a time (the baseline's steps), then scores
the same positions again in blocks of several rows (chains through the model's causal mask,
and one block size through the tree path's 4D mask), and records, per position and shape, how
much the logit gap between the one-row pass's top two tokens moved. Its largest value, the
*spread*, is the margin below which a greedy divergence is within the arithmetic of that
precision (the lossless audit's near-tie rule uses it: see analysis.audit).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from specbench.engine.target import TargetScorer
from specbench.engine.tree import DraftTree
from specbench.models import LoadedModel

#: rows per block the spread is measured with (the shapes of chain drafts and of small trees)
SPREAD_BLOCKS = (2, 4, 8, 16, 32)
#: greedy tokens decoded per prompt for the measurement
SPREAD_TOKENS = 32


def _gaps(logits: torch.Tensor, top2: torch.Tensor) -> torch.Tensor:
    """z[first] - z[second] per row, for the given (rows, 2) token pairs (float64)."""
    picked = logits.double().gather(1, top2)
    return picked[:, 0] - picked[:, 1]


@torch.inference_mode()
def one_row_pass(target: LoadedModel, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding as the baseline does it: the prompt in one forward, then one row per step.
    Returns the tokens (the first from the prefill) and the logits (new_tokens - 1, V) of the steps,
    row i being the distribution after tokens[i]."""
    model, cache = target.model, target.new_cache()
    logits = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    tokens, rows = [int(logits.argmax())], []
    for _ in range(new_tokens - 1):
        step = model(input_ids=torch.tensor([[tokens[-1]]], device=target.device), cache=cache,
                     use_cache=True).logits[0, -1]
        rows.append(step.float())
        tokens.append(int(step.argmax()))
    return tokens, torch.stack(rows)


@torch.inference_mode()
def block_pass(target: LoadedModel, prompt: torch.Tensor, tokens: list[int], block: int,
               scorer: TargetScorer | None = None) -> torch.Tensor:
    """`tokens` after the prompt, scored as the prompt in one forward and then the tokens in forwards of
    `block` rows on its cache (through the tree path's 4D mask when a scorer is given): logits
    (len(tokens), V), row i the distribution of tokens[i] (row 0 from the prompt's forward)."""
    model, cache = target.model, target.new_cache()
    first = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
    past, feed, rows = int(prompt.shape[1]), tokens[:-1], [first.float()]
    for start in range(0, len(feed), block):
        chunk = feed[start : start + block]
        if scorer is not None:
            tail = torch.tensor(chunk[1:], dtype=torch.long, device=target.device)
            out = scorer.score(cache, past, chunk[0], DraftTree.chain(tail), tree_mode=True)
        else:
            out = model(input_ids=torch.tensor([chunk], device=target.device), cache=cache, use_cache=True)
        rows.append(out.logits[0].float())
        past += len(chunk)
    return torch.cat(rows)


@torch.inference_mode()
def measure_spread(target: LoadedModel, prompts: list[torch.Tensor], new_tokens: int = SPREAD_TOKENS,
                   blocks: tuple[int, ...] = SPREAD_BLOCKS) -> dict[str, Any]:
    """The spread of the target's greedy logit gaps between one-row and multi-row forwards, on its
    device and dtype, over `prompts` ((1, len) ids each): {"dtype", "device", "spread" (the largest
    change of a top-2 gap, logits), "positions" (compared), "shapes" (block shapes), "flips" (positions
    where a block's argmax left the one-row pass's), "seconds"}."""
    started = time.perf_counter()
    scorer = TargetScorer(target.model, target.device, target.dtype)
    shapes: list[tuple[str, int]] = [("chain", b) for b in blocks]
    largest = max(blocks)
    spread, positions, flips = 0.0, 0, 0
    tree = bool(prompts) and scorer.tree_support(target.new_cache())
    for prompt in prompts:
        prompt = prompt.to(target.device)
        tokens, one = one_row_pass(target, prompt, new_tokens)
        if not len(one):
            continue
        top2 = one.topk(2, dim=-1).indices
        base = _gaps(one, top2)
        for kind, block in shapes + ([("tree", largest)] if tree else []):
            other = block_pass(target, prompt, tokens, block, scorer if kind == "tree" else None)[1:]
            spread = max(spread, float((_gaps(other, top2) - base).abs().max()))
            flips += int((other.argmax(-1) != top2[:, 0]).sum())
            positions += int(base.shape[0])
    return {
        "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device), "spread": spread,
        "positions": positions,
        "shapes": [f"{b} rows" for b in blocks] + ([f"{largest} rows, tree mask"] if tree else []),
        "flips": flips, "seconds": round(time.perf_counter() - started, 3),
    }
