"""Self-speculative decoding (Draft & Verify, Zhang et al. 2023): the target drafts for itself
with some of its decoder layers skipped.

The draft runs the target's own modules (shared weights) one token at a time, writing the
KV entries of the layers it runs into the target's cache; those entries are cut back after
drafting, so the verify forward sees exactly the cache it would without a draft. Drafting
stops after `max_draft` tokens or once the draft's confidence (its top probability) falls
below a threshold, which adapts to the measured acceptance as in the paper. Drafts are
argmax tokens without probabilities: verified losslessly under sampling too.

Any decoder stack that keeps its blocks in one ModuleList is supported (Llama-like
`model.layers`, GPT-2-like `transformer.h`, OPT's `model.decoder.layers`, ...): the draft is
the model's own forward with that list narrowed to the kept blocks (`LayerSkipper`), so
embeddings, learned or rotary positions, ALiBi, sliding windows, the final norm and the LM
head are the model's. A stack that fails a probe on load (hybrid recurrent / linear-attention
layers, shared KV) is refused with an error naming it.

The skip set is `method.skip_layers` (a list of layer indices), or `auto`: a small search
over candidate sets on a few calibration prompts, scored by measured tokens per step over
modelled cost (1 for the verify forward + the kept fraction of layers per draft forward),
cached per model in ~/.cache/specbench/self_spec/.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.core.resources import cache_root, env_folder
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.engine.layers import SHARED_CACHE_BATCH_PROBLEM, LayerSkipper, decoder_blocks
from specbench.models import LoadedModel, resolve_path

#: Moves the searched skip sets on their own (the tests keep theirs out of the user's cache with it).
CACHE_ENV = "SPECBENCH_SELF_SPEC_DIR"
SEARCH_VERSION = 1
#: Calibration conversations of the auto search: synthetic chats the zoo package writes (no zoo build needed).
DEFAULT_CALIBRATION = "zoo:calibration"
_EMPTY_CFG = OmegaConf.create({})


@dataclass
class SelfSpecSettings:
    """`method=self_spec` (Draft & Verify's drafting and its adaptive threshold)."""

    skip_layers: Any  # layer indices the draft skips, or "auto" (searched on calibration prompts; None = auto)
    search_prompts: int  # calibration prompts of the auto search
    search_max_new_tokens: int  # tokens generated per calibration prompt
    calibration: str  # JSONL of conversations (path or prefix:NAME) whose first turns calibrate the search
    max_draft: int  # longest chain
    threshold: float = field(metadata={"max": 1})  # initial confidence threshold: drafting stops below it
    adaptive: bool  # move the threshold towards target_acceptance after every step (D&V)
    target_acceptance: float = field(metadata={"max": 1})  # the acceptance rate the adaptive threshold aims at
    threshold_step: float  # how far one adaptive update nudges the threshold

    def __post_init__(self) -> None:
        skip = self.skip_layers
        if skip is None or skip == "auto":
            return
        if not isinstance(skip, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in skip):
            raise SpecbenchError(f"self_spec skip_layers must be 'auto' or a list of layer indices, got {skip!r}")


def cache_dir() -> Path:
    """$SPECBENCH_SELF_SPEC_DIR if set, else $SPECBENCH_CACHE_DIR/self_spec (~/.cache/specbench/self_spec)."""
    return env_folder(CACHE_ENV, cache_root() / "self_spec")


class SelfSpecDrafter(Drafter):
    """A chain from the layer-skipped target with Draft & Verify's adaptive confidence stop."""

    def __init__(self, model: torch.nn.Module, skip: list[int], max_draft: int, threshold: float, adaptive: bool,
                 target_acceptance: float, step: float) -> None:
        if max_draft < 1 or not 0.0 <= threshold <= 1.0:
            raise SpecbenchError("self_spec needs max_draft >= 1 and 0 <= threshold <= 1")
        self.skipper = LayerSkipper(model, skip)
        self.skip = sorted(skip)
        self.max_draft = max_draft
        self.threshold0 = threshold
        self.adaptive, self.target_acceptance, self.step_size = adaptive, target_acceptance, step
        self.threshold = threshold
        self.acceptance = target_acceptance
        self.cache: Any = None
        self.prompt_len = 0
        self.drafted = 0
        self.draft_forwards = 0

    def reset(self) -> None:
        self.threshold = self.threshold0
        self.acceptance = self.target_acceptance

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.cache = state.cache
        self.prompt_len = int(state.input_ids.shape[1])

    def propose(self, ctx: DraftContext) -> DraftTree:
        limit = min(self.max_draft, ctx.max_depth)
        self.drafted = 0
        if limit <= 0:
            return DraftTree.empty(ctx.device)
        past = self.prompt_len + len(ctx.tokens) - 1  # the root is not in the cache yet
        token = torch.tensor(ctx.tokens[-1], device=ctx.device)
        drafted: list[int] = []
        for i in range(limit):
            logits = self.skipper.step(token, past + i, self.cache)
            self.draft_forwards += 1
            probs = torch.softmax(logits.float(), -1)
            conf, token = probs.max(-1)
            drafted.append(int(token))
            if float(conf) < self.threshold:  # D&V: stop once the draft is unsure (this token is still verified)
                break
        self.skipper.rollback(self.cache, past)
        self.drafted = len(drafted)
        return DraftTree.chain(torch.tensor(drafted, dtype=torch.long, device=ctx.device))

    def accepted(self, feedback: Feedback) -> None:
        if not self.adaptive or not self.drafted:
            return
        # Draft & Verify's update: smoothed acceptance rate; raise the bar when it is below target.
        rate = len(feedback.verdict.path) / self.drafted
        self.acceptance = 0.5 * self.acceptance + 0.5 * rate
        nudged = self.threshold + (self.step_size if self.acceptance <= self.target_acceptance else -self.step_size)
        self.threshold = min(1.0, max(0.0, 0.9 * self.threshold + 0.1 * nudged))


def candidate_skip_sets(n_layers: int) -> list[list[int]]:
    """A handful of sets: 1/4, 3/8 and 1/2 of the layers, spread evenly or as one late block;
    the first and the last layer are always kept."""
    middle = list(range(1, n_layers - 1))
    if not middle:  # one or two layers: skipping either of two is all there is
        return [[1], [0]] if n_layers == 2 else []
    out: list[list[int]] = []
    for frac in (0.25, 0.375, 0.5):
        k = min(len(middle), max(1, round(frac * n_layers)))
        spread = sorted({middle[round(j * (len(middle) - 1) / max(k - 1, 1))] for j in range(k)}) if k > 1 \
            else [middle[len(middle) // 2]]
        late = middle[len(middle) - k :]
        for cand in (spread, late):
            if cand not in out:
                out.append(cand)
    return out


def calibration_prompts(target: LoadedModel, n: int, source: str = DEFAULT_CALIBRATION) -> list[torch.Tensor]:
    """First user turns of the first `n` conversations of a calibration file (JSONL with `turns`,
    a path or a registered `prefix:NAME`, by default a few synthetic conversations of a seed of
    their own), with the chat template."""
    from specbench.core.prompts import prompt_ids
    from specbench.core.questions import load_questions

    template = "chat_template" if getattr(target.tokenizer, "chat_template", None) else "plain"
    items = load_questions(resolve_path(source))[:n]
    return [torch.tensor([prompt_ids(template, target.tokenizer, it.turns[:1], [])], device=target.device)
            for it in items]


def search_skip_set(target: LoadedModel, n_prompts: int, max_new_tokens: int,
                    candidates: list[list[int]] | None = None, calibration: str = DEFAULT_CALIBRATION,
                    **drafter_kwargs: Any) -> dict[str, Any]:
    """Score each candidate set on calibration prompts; returns {"best": [...], "scores": [...]}."""
    from specbench.core.stopping import StopCriteria
    from specbench.core.timing import CpuTimer

    n_layers = len(decoder_blocks(target.model)[1])
    candidates = candidates or candidate_skip_sets(n_layers)
    if not candidates:
        raise SpecbenchError(f"self_spec cannot skip layers of a {n_layers}-layer model")
    prompts = calibration_prompts(target, n_prompts, calibration)
    stop = StopCriteria.build(target.eos_ids, max_new_tokens)
    greedy = SamplingParams()
    scores = []
    for skip in candidates:
        drafter = SelfSpecDrafter(target.model, skip, **drafter_kwargs)
        method = SpeculativeMethod(target, _EMPTY_CFG, _EMPTY_CFG, drafter=drafter)
        tokens = steps = 0
        for ids in prompts:
            result = method.decode(method.prefill(ids, greedy), greedy, stop, CpuTimer())
            tokens += sum(result.accept_lengths)
            steps += len(result.accept_lengths)
        per_step = tokens / max(steps, 1)
        cost = 1.0 + drafter.skipper.kept_fraction * drafter.draft_forwards / max(steps, 1)
        scores.append({"skip": skip, "tokens_per_step": round(per_step, 3), "modelled_cost": round(cost, 3),
                       "score": round(per_step / cost, 4)})
    best = max(scores, key=lambda s: s["score"])
    return {"best": best["skip"], "scores": scores}


def _cache_key(target: LoadedModel, settings: dict[str, Any]) -> str:
    config_file = Path(target.path) / "config.json"
    weights = sorted(Path(target.path).glob("*.safetensors")) if Path(target.path).is_dir() else []
    ident = {
        "path": str(Path(target.path).resolve()) if Path(target.path).exists() else target.path,
        "config": config_file.read_text() if config_file.is_file() else "",
        "weights": [(w.name, w.stat().st_size, int(w.stat().st_mtime)) for w in weights],
        "dtype": str(target.dtype), "settings": settings, "version": SEARCH_VERSION,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def auto_skip_set(target: LoadedModel, drafter_kwargs: dict[str, Any], n_prompts: int, max_new_tokens: int,
                  calibration: str = DEFAULT_CALIBRATION) -> list[int]:
    """The searched skip set for this model, from the cache or searched now (and cached)."""
    settings = {"prompts": n_prompts, "max_new": max_new_tokens, **drafter_kwargs}
    if calibration != DEFAULT_CALIBRATION:
        settings["calibration"] = calibration
    key = _cache_key(target, settings)
    path = cache_dir() / f"{key}.json"
    try:
        return [int(i) for i in json.loads(path.read_text())["best"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    start = time.perf_counter()
    found = search_skip_set(target, n_prompts, max_new_tokens, calibration=calibration, **drafter_kwargs)
    found.update(model=target.path, dtype=str(target.dtype).removeprefix("torch."),
                 seconds=round(time.perf_counter() - start, 2))
    print(f"self_spec: skip set for {target.path} ({found['dtype']}) searched in {found['seconds']} s over "
          f"{len(found['scores'])} candidates: layers {found['best']} skipped (cached in {path})",
          file=sys.stderr, flush=True)
    write_atomic(path, json.dumps(found, indent=2) + "\n")
    return [int(i) for i in found["best"]]


class SelfSpec(SpeculativeMethod):
    """`method=self_spec`."""

    Settings = SelfSpecSettings
    batch_problem = SHARED_CACHE_BATCH_PROBLEM

    def build_drafter(self) -> Drafter:
        s = self.settings
        # These keys and values also key the auto search's cache: keep them as they are.
        kwargs = {"max_draft": s.max_draft, "threshold": s.threshold, "adaptive": s.adaptive,
                  "target_acceptance": s.target_acceptance, "step": s.threshold_step}
        skip = s.skip_layers
        if skip is None or skip == "auto":
            with torch.inference_mode():
                skip = auto_skip_set(self.target, kwargs, s.search_prompts, s.search_max_new_tokens, s.calibration)
        self.skip_layers = [int(i) for i in skip]
        return SelfSpecDrafter(self.target.model, self.skip_layers, **kwargs)

