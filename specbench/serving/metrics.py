"""vLLM's speculative-decoding counters, read from a server's Prometheus text (`GET /metrics`).

The counters (vLLM v1): `vllm:spec_decode_num_drafts` (steps that verified a draft),
`vllm:spec_decode_num_draft_tokens` (tokens drafted), `vllm:spec_decode_num_accepted_tokens`
(drafted tokens accepted) and `vllm:spec_decode_num_accepted_tokens_per_pos{position="k"}` (drafts
whose k-th token was accepted), besides `vllm:generation_tokens` (tokens generated). Each is
summed over its other labels (model, engine). A question's numbers are the difference of two
readings, one before it and one after it (`Counters.minus`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specbench.core.errors import SpecbenchError
from specbench.core.record import TurnStats

PREFIX = "vllm:"
DRAFTS = "spec_decode_num_drafts"
DRAFT_TOKENS = "spec_decode_num_draft_tokens"
ACCEPTED = "spec_decode_num_accepted_tokens"
PER_POS = "spec_decode_num_accepted_tokens_per_pos"
GENERATED = "generation_tokens"


@dataclass(frozen=True)
class Counters:
    """One reading of the counters (or the difference of two)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: tuple[int, ...] = field(default_factory=tuple)  # drafts whose k-th token was accepted, k = 0, 1, ...
    generated: int = 0

    def minus(self, before: Counters) -> Counters:
        width = max(len(self.per_pos), len(before.per_pos))
        pad = lambda p: list(p) + [0] * (width - len(p))  # noqa: E731
        return Counters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                        self.accepted - before.accepted,
                        tuple(a - b for a, b in zip(pad(self.per_pos), pad(before.per_pos), strict=True)),
                        self.generated - before.generated)

    def stats(self, steps_exact: bool) -> TurnStats:
        """A turn's counters (after minus before) as the answer record's statistics."""
        return TurnStats(drafts=self.drafts, drafted_tokens=self.draft_tokens, accepted_tokens=self.accepted,
                         position_accepted=list(self.per_pos), generation_tokens=self.generated,
                         steps_exact=steps_exact)


def parse(text: str) -> Counters:
    """The counters in a Prometheus text exposition (absent ones are 0: a server without speculation)."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if not name.startswith(PREFIX) or not name.endswith("_total"):
                    continue
                base = name[len(PREFIX):-len("_total")]
                if base == PER_POS:
                    pos = int(sample.labels.get("position", "-1"))
                    if pos >= 0:
                        per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
                elif base in (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATED):
                    sums[base] = sums.get(base, 0.0) + sample.value
    except (ValueError, TypeError) as exc:
        raise SpecbenchError(f"the server's /metrics is not Prometheus text ({exc})") from None
    values = [*sums.values(), *per_pos.values()]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise SpecbenchError("the server's /metrics holds a negative or non-finite counter")
    width = max(per_pos) + 1 if per_pos else 0
    return Counters(int(sums.get(DRAFTS, 0)), int(sums.get(DRAFT_TOKENS, 0)), int(sums.get(ACCEPTED, 0)),
                    tuple(int(per_pos.get(k, 0)) for k in range(width)), int(sums.get(GENERATED, 0)))


def step_lengths(chunk_sizes: list[int], delta: Counters) -> tuple[list[int], bool]:
    """A turn's tokens per decoding step, as our engine records them (`1 + sum == new_tokens`: the
    first token comes from the prefill), and whether they are exact.

    vLLM streams one chunk per engine step, so the chunks' sizes after the first are the steps'
    tokens, in order: exact, and what the counters cannot give (they count drafted and accepted
    tokens, the last step's accepted tokens included even where max_tokens cut the answer inside it,
    and do not count the steps without a draft). A server that merged steps into one chunk shows
    fewer chunks than the counters' drafts, or more tokens beyond one per chunk than the counters
    accepted: then the steps are not known (False)."""
    steps = list(chunk_sizes[1:]) if chunk_sizes else []
    if chunk_sizes and chunk_sizes[0] != 1:  # the prefill's chunk held more than its one token: merged
        return steps, False
    return steps, len(steps) >= delta.drafts and sum(n - 1 for n in steps) <= delta.accepted
