"""SpS: speculative sampling with an independent draft model (Leviathan et al. 2023, Chen et al. 2023).

The draft proposes a chain of K tokens autoregressively with its own KV cache, which is
kept across steps and cropped to the accepted prefix; the shared engine verifies the chain
in one target forward. K may adapt as in transformers' "heuristic" schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.engine import Drafter, SpeculativeMethod
from specbench.methods.drafts import SpsDrafter, load_draft, logits_width


@dataclass
class SpsSettings:
    """`method=sps`, and `method=sps_plain` (the same settings, another draft)."""

    draft: str | None  # draft model: hub id, folder or zoo:NAME; None = the model config's `draft`
    num_speculative_tokens: int  # K, draft tokens per step (the starting K under a heuristic schedule)
    schedule: str  # how K adapts: constant | heuristic | heuristic_transient (see SpsDrafter); budget=fixed only
    max_speculative_tokens: int | None  # cap on K (heuristic schedule, or budget=auto); None = no cap (auto: 16)


class SpS(SpeculativeMethod):
    """`method=sps`: the draft from `method.draft` or the model config's `draft`."""

    Settings = SpsSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        draft, _ = load_draft(self.target, s.draft, self.model_cfg, "sps")
        return SpsDrafter(
            draft, num_tokens=s.num_speculative_tokens, vocab_size=logits_width(self.target), schedule=s.schedule,
            max_tokens=s.max_speculative_tokens,
        )

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.drafter.draft.model.parameters())
