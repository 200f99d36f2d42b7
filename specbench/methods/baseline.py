"""Autoregressive decoding with a KV cache: one target forward per new token.

The baseline is the engine's one draft-verify-accept step with an empty draft (`NoDraft`): each
step scores the pending token alone and emits the target's own next token, at batch size 1 on
its own cache and in batches on a shared one, exactly as every speculative method's steps do."""

from __future__ import annotations

import torch

from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine.api import GenerationResult, Method, Prefilled, Requests
from specbench.engine.batch import BatchDecoder
from specbench.engine.decode import Decoder, NoDraft, NoStats, OneRow, decode_one, top2_margin
from specbench.engine.target import TargetScorer, model_context
from specbench.engine.verifier import verify


class Baseline(Method):
    """The reference. In greedy mode it also records the top-2 logit margin of every token,
    so the report's lossless audit can tell numerical near-ties from real mismatches.

    Batched: right-padded prompts, one forward per step for the live rows, each row stopping on
    its own (and leaving the batch)."""

    batch_problem = None

    def generate_batch(self, requests: Requests, slots: int, sampling: SamplingParams, timer: Timer) -> None:
        margins = top2_margin if sampling.greedy else None
        BatchDecoder(self.target, NoDraft, verify, sampling, timer, NoStats, margins,
                     model_context(self.target.model.config)).run(requests, slots)

    @torch.inference_mode()
    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        greedy = sampling.greedy
        target = self.target
        decoder = Decoder(verify, sampling, timer, target.device, margins=top2_margin if greedy else None)
        forward = OneRow(TargetScorer(target.model, target.device, target.dtype), state.cache,
                         int(state.input_ids.shape[1]), drafts=False)
        margins = [top2_margin(state.logits)] if greedy and state.logits is not None else None
        return decode_one(decoder, forward, state, NoDraft(), stop, NoStats(), margins)
