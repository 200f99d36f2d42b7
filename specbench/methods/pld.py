"""PLD: prompt lookup decoding (Saxena 2023).

The drafter matches the last n-gram of the text so far (n from `max_ngram` down to 1)
against earlier positions of the prompt and the generated tokens, and proposes the
`num_pred_tokens` tokens that followed the match: a deterministic chain without draft
probabilities, verified by the shared engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import Prefilled

MATCHES = ("first", "last")


@dataclass
class PldSettings:
    """`method=pld`."""

    max_ngram: int  # longest n-gram matched (tried from max_ngram down to 1)
    num_pred_tokens: int  # tokens proposed after a match
    match: str  # first | last: which earlier occurrence of the n-gram to follow


def lookup(context: torch.Tensor, max_ngram: int, num_pred: int, match: str = "first") -> torch.Tensor:
    """Tokens that followed an earlier occurrence of the context's last n-gram (empty if none).

    context: 1-D token ids. The longest n-gram with a match wins; among its matches the
    first (upstream's choice) or the most recent one. The continuation may be shorter than
    `num_pred` when the match is near the end.
    """
    length = int(context.shape[0])
    for n in range(min(max_ngram, length - 1), 0, -1):
        # Windows start at 0..length-1-n, so the suffix never matches itself and every
        # match has at least one token after it.
        windows = context[: length - 1].unfold(0, n, 1)
        hits = (windows == context[length - n :]).all(1).nonzero()
        if hits.numel():
            start = int(hits[0 if match == "first" else -1]) + n
            return context[start : start + num_pred]
    return context[:0]


class PldDrafter(Drafter):
    """Prompt lookup over a host-side buffer of prompt + generated ids (grown in place)."""

    def __init__(self, max_ngram: int, num_pred_tokens: int, match: str) -> None:
        if max_ngram < 1 or num_pred_tokens < 1:
            raise SpecbenchError(
                f"pld needs max_ngram >= 1 and num_pred_tokens >= 1, got {max_ngram} and {num_pred_tokens}"
            )
        if match not in MATCHES:
            raise SpecbenchError(f"unknown pld match '{match}'; use one of {', '.join(MATCHES)}")
        self.max_ngram = max_ngram
        self.num_pred = num_pred_tokens
        self.match = match
        self.buffer = torch.empty(0, dtype=torch.long)
        self.length = 0
        self.prompt_len = 0

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        prompt = state.input_ids[0].to("cpu", torch.long)
        self.prompt_len = int(prompt.shape[0])
        self.buffer = torch.empty(max(2 * self.prompt_len, 256), dtype=torch.long)
        self.buffer[: self.prompt_len] = prompt
        self.length = self.prompt_len

    def _sync(self, tokens: list[int]) -> None:
        """Append the generated tokens the buffer has not seen yet, doubling it when full."""
        total = self.prompt_len + len(tokens)
        if total > self.buffer.shape[0]:
            grown = torch.empty(2 * total, dtype=torch.long)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        if total > self.length:
            self.buffer[self.length : total] = torch.tensor(tokens[self.length - self.prompt_len :], dtype=torch.long)
            self.length = total

    def propose(self, ctx: DraftContext) -> DraftTree:
        limit = min(self.num_pred, ctx.max_depth)
        if limit <= 0:
            return DraftTree.empty(ctx.device)  # the buffer catches up at the next proposal
        self._sync(ctx.tokens)
        found = lookup(self.buffer[: self.length], self.max_ngram, limit, self.match)
        return DraftTree.chain(found.to(ctx.device, non_blocking=True))


class PLD(SpeculativeMethod):
    """`method=pld`."""

    Settings = PldSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        return PldDrafter(max_ngram=s.max_ngram, num_pred_tokens=s.num_pred_tokens, match=s.match)
