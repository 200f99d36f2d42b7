"""Peers from transformers itself: `generate(assistant_model=...)` and `generate(prompt_lookup_num_tokens=...)`.

They run prefill and decoding inside one `generate` call, so `splits_prefill = False`:
`prefill` only hands the prompt on and `decode` calls generate (timed as a whole).

accept_lengths: transformers' assisted loop streams each target forward's output (the
accepted candidates plus the target's own token) in one `streamer.put`, so a streamer
records the tokens emitted per target forward, and a forward hook on the target counts the
forwards to cross-check. The first forward is generate's prefill, which also verifies the
first candidates; as our own methods count the prefill's token apart (the "1" in
`len(tokens) == 1 + sum(accept_lengths)`), that entry holds the tokens it emitted beyond
the first, so it may be 0. There is one entry per target forward; stats holds the number of
target forwards and what the first one emitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from specbench.core.errors import SpecbenchError
from specbench.core.record import TurnStats
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine.api import GenerationResult, Method, Prefilled
from specbench.methods.drafts import SCHEDULES, load_draft
from specbench.models import LoadedModel


class _StepRecorder(BaseStreamer):
    """Token counts per `put`: the first put is the prompt, then one per target forward."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.sizes: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


class _StopStrings(StoppingCriteria):
    """Our stop rule's stop strings inside generate (EOS and max_new_tokens are generate's own)."""

    def __init__(self, stop: StopCriteria, prompt_len: int) -> None:
        self.stop = stop
        self.prompt_len = prompt_len
        self.checked = 0

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        generated = input_ids[0, self.prompt_len :].tolist()
        done = self.stop.cut(generated, self.checked) is not None
        self.checked = len(generated)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """generate's settings for our sampling params; everything else neutral, whatever the
    model's generation_config says."""
    neutral = {"repetition_penalty": 1.0, "min_p": None, "typical_p": 1.0, "no_repeat_ngram_size": 0}
    if sampling.greedy:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, **neutral}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, **neutral}


class HfPeer(Method):
    """Common part: one generate call, per-forward token counts from a streamer."""

    splits_prefill = False
    batch_problem = "Hugging Face's assisted generation decodes one sequence at a time (batch size 1 only)"

    def generate_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def prefill(self, input_ids: torch.Tensor, sampling: SamplingParams) -> Prefilled:
        return Prefilled(input_ids=input_ids, tokens=[])

    @torch.inference_mode()
    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        model = self.target.model
        input_ids = state.input_ids
        prompt_len = int(input_ids.shape[1])
        recorder = _StepRecorder()
        forwards = 0

        def count(*_: Any) -> None:
            nonlocal forwards
            forwards += 1

        pad = self.target.tokenizer.pad_token_id
        kwargs: dict[str, Any] = {
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": stop.max_new_tokens,
            "eos_token_id": sorted(stop.eos_ids) or None,
            "pad_token_id": pad if pad is not None else (min(stop.eos_ids) if stop.eos_ids else None),
            "streamer": recorder,
            **sampling_kwargs(sampling),
            **self.generate_kwargs(),
        }
        if stop.stop_strings:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_StopStrings(stop, prompt_len)])
        hook = model.register_forward_hook(count)
        try:
            output = model.generate(input_ids, **kwargs)
        finally:
            hook.remove()
        tokens = output[0, prompt_len:].tolist()
        sizes = recorder.sizes
        if sum(sizes) != len(tokens) or len(sizes) != forwards:
            raise RuntimeError(
                f"{type(self).__name__}: generate streamed {sum(sizes)} tokens in {len(sizes)} puts for {len(tokens)} "
                f"tokens and {forwards} target forwards; this transformers version streams differently"
            )
        cut = stop.cut(tokens, 0)
        if cut is not None:
            del tokens[cut:]
        emitted, left = [], len(tokens)
        for size in sizes:  # the stop rule may end generation inside a forward's tokens
            if left <= 0:
                break
            emitted.append(min(size, left))
            left -= emitted[-1]
        accept_lengths = [emitted[0] - 1, *emitted[1:]] if emitted else []
        stats = TurnStats(counters={"target_forwards": forwards, "first_forward_tokens": sizes[0] if sizes else 0})
        return GenerationResult(tokens, accept_lengths, stats)


@dataclass
class HfAssistedSettings:
    """`method=hf_assisted`: generate's assisted-generation settings."""

    draft: str | None  # draft model: hub id, folder or zoo:NAME; None = the model config's `draft`
    num_assistant_tokens: int  # draft tokens per step (the starting value under a heuristic schedule)
    num_assistant_tokens_schedule: str  # constant | heuristic | heuristic_transient
    assistant_confidence_threshold: float  # stop drafting below this draft confidence; 0 = off


@dataclass
class HfPldSettings:
    """`method=hf_pld`: generate's prompt lookup settings."""

    prompt_lookup_num_tokens: int  # tokens proposed after a match
    max_matching_ngram_size: int  # longest n-gram matched


class HfAssisted(HfPeer):
    """`method=hf_assisted`: transformers' assisted generation with the same draft as sps."""

    Settings = HfAssistedSettings

    def __init__(self, target: LoadedModel, cfg: DictConfig, model_cfg: DictConfig) -> None:
        super().__init__(target, cfg, model_cfg)
        self.draft, _ = load_draft(target, self.settings.draft, model_cfg, "hf_assisted")
        self.num_tokens = self.settings.num_assistant_tokens
        self.schedule = self.settings.num_assistant_tokens_schedule
        if self.schedule not in SCHEDULES:
            raise SpecbenchError(
                f"unknown num_assistant_tokens_schedule '{self.schedule}'; use one of {', '.join(SCHEDULES)}"
            )
        self.reset()

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.draft.model.parameters())

    def reset(self) -> None:
        # transformers keeps the "heuristic" K on the assistant's generation config across calls (our turns of
        # a question; start_question restarts it for the next question).
        config = self.draft.model.generation_config
        config.num_assistant_tokens = self.num_tokens
        config.num_assistant_tokens_schedule = self.schedule
        config.assistant_confidence_threshold = self.settings.assistant_confidence_threshold

    def start_question(self) -> None:
        self.reset()  # K restarts with every question, as method=sps's (SpsDrafter)

    def generate_kwargs(self) -> dict[str, Any]:
        return {"assistant_model": self.draft.model}


class HfPld(HfPeer):
    """`method=hf_pld`: transformers' prompt lookup decoding."""

    Settings = HfPldSettings

    def generate_kwargs(self) -> dict[str, Any]:
        return {
            "prompt_lookup_num_tokens": self.settings.prompt_lookup_num_tokens,
            "max_matching_ngram_size": self.settings.max_matching_ngram_size,
        }
