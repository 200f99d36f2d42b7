"""SpS with an injected slowdown, for measuring the regression gate's power (scripts/gate_power.py).

Every decoding step sleeps `slowdown` times the time of the step before it (drafting, verifying
and accepting, measured between two proposals), so the method's decoding takes about (1 +
slowdown) times as long while emitting the same tokens: a speed regression and nothing else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree
from specbench.engine.api import Prefilled
from specbench.methods.drafts import SpsDrafter, load_draft, logits_width
from specbench.methods.sps import SpS, SpsSettings


@dataclass
class Settings(SpsSettings):
    slowdown: float  # extra time per step, as a fraction of the step's own time


class SlowDrafter(SpsDrafter):
    """SpS's drafter that sleeps before each proposal in proportion to the step just finished."""

    def __init__(self, *args, slowdown: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if slowdown < 0:
            raise SpecbenchError(f"slowdown must be >= 0, got {slowdown}")
        self.slowdown = slowdown
        self.last: float | None = None

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        super().begin(state, sampling)
        self.last = None

    def propose(self, ctx: DraftContext) -> DraftTree:
        now = time.perf_counter()
        if self.last is not None and self.slowdown > 0:
            time.sleep(self.slowdown * (now - self.last))
        self.last = time.perf_counter()
        return super().propose(ctx)


class SlowSpS(SpS):
    """`method=slow_sps` (with SPECBENCH_METHODS_DIR=tests/methods)."""

    Settings = Settings

    def build_drafter(self) -> Drafter:
        s = self.settings
        draft, _ = load_draft(self.target, s.draft, self.model_cfg, "slow_sps")
        return SlowDrafter(draft, num_tokens=s.num_speculative_tokens, vocab_size=logits_width(self.target),
                           schedule=s.schedule, max_tokens=s.max_speculative_tokens, slowdown=s.slowdown)
