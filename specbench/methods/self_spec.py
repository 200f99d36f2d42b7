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
import os
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from transformers import DynamicCache

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.models import LoadedModel, resolve_path

CACHE_ENV = "SPECBENCH_CACHE_DIR"
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
    env = os.environ.get(CACHE_ENV)
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "specbench") / "self_spec"


def decoder_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The dotted name and the ModuleList of a decoder's blocks: the shallowest ModuleList as
    long as the config's layer count (`model.layers` in Llama-like stacks, `transformer.h` in
    GPT-2-like ones, whatever the stack calls it), or an error naming the model."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(text, "num_hidden_layers", None)
    kind = type(model).__name__
    if not isinstance(n, int) or n < 1:
        raise SpecbenchError(f"self_spec cannot skip layers of {kind}: its config has no num_hidden_layers")
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == n and name
             and len({type(block) for block in module}) == 1]
    if not found:
        raise SpecbenchError(f"self_spec cannot skip layers of {kind}: it has no ModuleList of {n} decoder blocks of "
                             "one class (supported: stacks that keep their blocks in one list, such as Llama-like "
                             "model.layers and GPT-2-like transformer.h; hybrid stacks are not)")
    depth = min(name.count(".") for name, _ in found)
    shallowest = [(name, module) for name, module in found if name.count(".") == depth]
    if len(shallowest) > 1:
        names = ", ".join(name for name, _ in shallowest)
        raise SpecbenchError(f"self_spec cannot tell the decoder blocks of {kind} apart: {names} all hold {n} blocks")
    return shallowest[0]


class OnlyBlocks:
    """A context in which `model` runs with only the blocks `kept` of its block list `name`
    (put back on exit; prepared once, entered per draft step).

    Per-layer settings of the stack's config (lists as long as the block list, such as
    `layer_types`, which decoders index by loop position to pick a block's mask) are narrowed
    to the kept blocks alike, so each kept block still gets its own.
    """

    def __init__(self, model: torch.nn.Module, name: str, kept: list[int]) -> None:
        owner_name, _, self.attr = name.rpartition(".")
        self.owner = model.get_submodule(owner_name) if owner_name else model
        self.full = self.owner._modules[self.attr]
        n = len(self.full)
        self.narrow = torch.nn.ModuleList([self.full[i] for i in kept])
        config = getattr(self.owner, "config", None) or model.config
        self.settings = vars(config) if hasattr(config, "__dict__") else {}
        self.per_layer = {key: value for key, value in self.settings.items()
                          if isinstance(value, (list, tuple)) and len(value) == n and key != "architectures"}
        self.per_layer_kept = {key: type(value)(value[i] for i in kept) for key, value in self.per_layer.items()}

    def __enter__(self) -> None:
        self.owner._modules[self.attr] = self.narrow
        self.settings.update(self.per_layer_kept)  # through __dict__: no validation against num_hidden_layers

    def __exit__(self, *exc: object) -> None:
        self.owner._modules[self.attr] = self.full
        self.settings.update(self.per_layer)


#: Cache methods that report a layer's length to the model (positions, mask sizes): (name, position
#: of `layer_idx` among the positional arguments).
_LENGTH_METHODS = (("get_seq_length", 0), ("get_mask_sizes", 1), ("get_query_offset", 0))


@contextmanager
def lengths_from(cache: Any, redirect: dict[int, int]) -> Iterator[None]:
    """While a layer-skipped forward runs, the cache answers length questions about a skipped
    layer (which lags behind by the tokens drafted so far) with those of a kept layer of the
    same kind: the model's own mask (causal, sliding window) and positions then fit the kept
    layers. The methods are shadowed on this one cache object and restored afterwards."""
    if not redirect or cache is None:
        yield
        return
    shadowed: dict[str, Any] = {}
    for name, pos in _LENGTH_METHODS:
        method = getattr(cache, name, None)
        if method is None:
            continue

        def call(*args: Any, _method: Any = method, _pos: int = pos, **kwargs: Any) -> Any:
            if "layer_idx" in kwargs:
                kwargs["layer_idx"] = redirect.get(kwargs["layer_idx"], kwargs["layer_idx"])
            elif len(args) > _pos:
                args = (*args[:_pos], redirect.get(args[_pos], args[_pos]), *args[_pos + 1 :])
            elif 0 in redirect:  # the default layer_idx is 0
                kwargs["layer_idx"] = redirect[0]
            return _method(*args, **kwargs)

        shadowed[name] = vars(cache).get(name)
        setattr(cache, name, call)
    try:
        yield
    finally:
        for name, before in shadowed.items():
            if before is None:
                delattr(cache, name)
            else:
                setattr(cache, name, before)


class LayerSkipper:
    """One-token forwards of the target with the blocks in `skip` left out, on the target's cache.

    The model's own forward runs (its embeddings, learned or rotary positions, attention masks,
    final norm and LM head) with its block list swapped for the kept blocks for the duration of
    the call. Kept blocks keep their layer indices, so they read and write their own cache
    entries; positions are given explicitly, and the cache answers the model's length questions
    about skipped layers with a kept layer's (`lengths_from`). A probe on construction checks
    that the stack honours this (a cached step equals the layer-skipped forward without a cache).
    """

    def __init__(self, model: torch.nn.Module, skip: list[int]) -> None:
        self.model = model
        self.blocks_name, layers = decoder_blocks(model)
        n = len(layers)
        bad = [i for i in skip if not 0 <= i < n]
        if bad or len(set(skip)) == n:
            raise SpecbenchError(f"self_spec skip_layers {sorted(skip)} must be distinct indices in 0..{n - 1} "
                                 "and keep at least one layer")
        self.kept_index = [i for i in range(n) if i not in set(skip)]
        self.skipped_index = sorted(set(skip))
        self.kept_fraction = len(self.kept_index) / n
        self.only_kept = OnlyBlocks(model, self.blocks_name, self.kept_index)
        self._redirects: tuple[Any, int, dict[int, int]] | None = None  # (weakref to cache, layers, redirect)
        if skip:
            problem = self._probe()
            if problem:
                raise SpecbenchError(f"self_spec cannot skip layers of {type(model).__name__} "
                                     f"({self.blocks_name}): {problem}")

    def _redirect(self, cache: Any) -> dict[int, int]:
        """Skipped layer -> the first kept layer whose cache layer is of the same kind (class and
        window); remembered for the cache it was worked out for."""
        layers = getattr(cache, "layers", None) or []
        known = self._redirects
        if known is not None and known[0]() is cache and known[1] == len(layers):
            return known[2]

        def kind(i: int) -> tuple[type, Any]:
            return type(layers[i]), getattr(layers[i], "sliding_window", None)

        out = {}
        for i in self.skipped_index:
            if i < len(layers):
                same = [j for j in self.kept_index if j < len(layers) and kind(j) == kind(i)]
                if same:
                    out[i] = same[0]
        self._redirects = (weakref.ref(cache), len(layers), out)
        return out

    def _forward(self, ids: torch.Tensor, start: int, cache: Any) -> torch.Tensor:
        """Logits (1, n, V) of the kept blocks over `ids` at positions start.. on `cache` (None: a new one)."""
        positions = torch.arange(start, start + int(ids.shape[1]), device=ids.device)[None]
        if cache is None:  # made here: one the model made would follow the narrowed per-layer settings
            cache = DynamicCache(config=self.model.config)
        with self.only_kept, lengths_from(cache, self._redirect(cache)):
            return self.model(input_ids=ids, cache=cache, use_cache=True, position_ids=positions).logits

    def step(self, token: torch.Tensor, position: int, cache: Any) -> torch.Tensor:
        """Logits (V,) after `token` at `position`; appends to the kept layers' cache entries."""
        return self._forward(token.view(1, 1), position, cache)[0, -1]

    def state(self, token: torch.Tensor, position: int, cache: Any) -> torch.Tensor:
        """The kept blocks' last state (d,) after `token` at `position`, through the model's final
        norm (what its LM head would read: an early exit); appends to the kept layers' cache entries."""
        positions = torch.tensor([[position]], device=token.device)
        with self.only_kept, lengths_from(cache, self._redirect(cache)):
            out = self.model(input_ids=token.view(1, 1), cache=cache, use_cache=True, position_ids=positions,
                             output_hidden_states=True, logits_to_keep=1)
        return out.hidden_states[-1][0, -1]

    def rollback(self, cache: Any, length: int) -> None:
        """Cut the kept layers' entries back to `length` tokens."""
        for i in self.kept_index:
            layer = cache.layers[i]
            extra = layer.get_seq_length() - length
            if extra > 0:
                layer.crop(-extra)

    @torch.no_grad()
    def _probe(self) -> str | None:
        """Why the skipped stack cannot be trusted with the target's cache (None when it can).

        On a prefix cached by the full model, two one-token steps (the skipped blocks' cache
        entries then lag behind the kept ones, as while drafting) must give the logits of one
        two-token forward of the kept blocks (nothing lags), and a rollback must undo them.
        """
        device = next(self.model.parameters()).device
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        ids = torch.tensor([[i % vocab for i in (1, 2, 3, 4, 5, 6)]], device=device)
        try:
            stepped, chunked = DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
            for cache in (stepped, chunked):
                self.model(input_ids=ids[:, :4], cache=cache, use_cache=True)
            first = self.step(ids[0, 4], 4, stepped).float()
            got = self.step(ids[0, 5], 5, stepped).float()
            want = self._forward(ids[:, 4:], 4, chunked)[0].float()
            self.rollback(stepped, 4)
            again = self.step(ids[0, 4], 4, stepped).float()
        except Exception as exc:  # noqa: BLE001 - any failure means "this stack is not supported"
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"a layer-skipped forward raised {type(exc).__name__}: {first_line}"
        scale = float(want.abs().max()) + 1.0
        error = float(max((first - want[0]).abs().max(), (got - want[1]).abs().max(),
                          (again - want[0]).abs().max())) / scale
        if error > (1e-3 if want.dtype == torch.float32 and next(self.model.parameters()).dtype == torch.float32
                    else 5e-2):
            return f"its cached layer-skipped steps differ from one forward over the same tokens ({error:.2g})"
        return None


#: why methods that draft through the target's own cache (self_spec, ppd) cannot run batched
SHARED_CACHE_BATCH_PROBLEM = ("it drafts through the target's own KV cache with layers skipped, and the batched "
                              "engine's one padded cache for all rows has no per-row view for that")


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
    return [torch.tensor([prompt_ids(template, target.tokenizer, it.turns[:1], [])]) for it in items]


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found, indent=2) + "\n")
    os.replace(tmp, path)
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

