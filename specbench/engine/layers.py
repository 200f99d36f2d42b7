"""Running a decoder with some of its blocks left out, on its own KV cache: the draft of
self-speculative decoding (methods.self_spec), PPD's early exit (methods.ppd) and the early-exit
states its head trains on (heads.train).

Any decoder stack that keeps its blocks in one ModuleList is supported (Llama-like `model.layers`,
GPT-2-like `transformer.h`, OPT's `model.decoder.layers`, ...): the model's own forward runs with
that list narrowed to the kept blocks, so embeddings, positions, masks, the final norm and the LM
head are the model's. A stack that fails the probe on construction is refused with an error.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache

from specbench.core.errors import SpecbenchError

#: the way out every refusal below names: its callers (self_spec's draft, PPD's early exit, the
#: training of PPD's head) all need layers left out, so the fix is another method or model
FIX = "use a method that runs every layer (self_spec and ppd skip some) or a model of a supported stack"


def decoder_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The dotted name and the ModuleList of a decoder's blocks: the shallowest ModuleList as
    long as the config's layer count (`model.layers` in Llama-like stacks, `transformer.h` in
    GPT-2-like ones, whatever the stack calls it), or an error naming the model."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(text, "num_hidden_layers", None)
    kind = type(model).__name__
    if not isinstance(n, int) or n < 1:
        raise SpecbenchError(f"cannot skip layers of {kind}: its config has no num_hidden_layers; {FIX}")
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == n and name
             and len({type(block) for block in module}) == 1]
    if not found:
        raise SpecbenchError(f"cannot skip layers of {kind}: it has no ModuleList of {n} decoder blocks of one class "
                             "(supported: stacks that keep their blocks in one list, such as Llama-like model.layers "
                             f"and GPT-2-like transformer.h; hybrid stacks are not); {FIX}")
    depth = min(name.count(".") for name, _ in found)
    shallowest = [(name, module) for name, module in found if name.count(".") == depth]
    if len(shallowest) > 1:
        names = ", ".join(name for name, _ in shallowest)
        raise SpecbenchError(f"cannot tell the decoder blocks of {kind} apart: {names} all hold {n} blocks; {FIX}")
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
            raise SpecbenchError(f"cannot skip layers {sorted(skip)} of a {n}-block model: they must be distinct "
                                 f"indices in 0..{n - 1} and keep at least one (self_spec: method.skip_layers; ppd: "
                                 "its head's exit layer)")
        self.kept_index = [i for i in range(n) if i not in set(skip)]
        self.skipped_index = sorted(set(skip))
        self.kept_fraction = len(self.kept_index) / n
        self.only_kept = OnlyBlocks(model, self.blocks_name, self.kept_index)
        self._redirects: tuple[Any, int, dict[int, int]] | None = None  # (weakref to cache, layers, redirect)
        if skip:
            problem = self._probe()
            if problem:
                raise SpecbenchError(f"cannot skip layers of {type(model).__name__} ({self.blocks_name}): "
                                     f"{problem}; {FIX}")

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
        verdict = probe_verdict(next(self.model.parameters()).dtype, error, lambda: self._stepping_floor(ids),
                                "every block stepped the same way")
        return None if verdict is None else \
            f"its cached layer-skipped steps differ from one forward over the same tokens ({verdict})"

    @torch.no_grad()
    def _stepping_floor(self, ids: torch.Tensor) -> float:
        """The same comparison through every block (nothing skipped, nothing lags): how far one-token
        steps and a two-token forward part in this dtype on this model, its arithmetic alone."""
        stepped, chunked = DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
        for cache in (stepped, chunked):
            self.model(input_ids=ids[:, :4], cache=cache, use_cache=True)

        def logits(cache: Any, start: int, stop: int) -> torch.Tensor:
            positions = torch.arange(start, stop, device=ids.device)[None]
            return self.model(input_ids=ids[:, start:stop], cache=cache, use_cache=True,
                              position_ids=positions).logits[0].float()

        first, got, want = logits(stepped, 4, 5)[-1], logits(stepped, 5, 6)[-1], logits(chunked, 4, 6)
        scale = float(want.abs().max()) + 1.0
        return float(max((first - want[0]).abs().max(), (got - want[1]).abs().max())) / scale


#: the relative logit error under which a probe's comparison passes outright, per dtype (HALF_TOLERANCE
#: for bfloat16 / float16)
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}
HALF_TOLERANCE = 5e-2
#: in half precision a larger error passes when it is at most this many times the same comparison made
#: through the model's unmodified path (its own arithmetic on this device); a structural fault (a lagging
#: cache, siblings that see each other) moves the logits by far more
FLOOR_FACTOR = 4.0


def probe_verdict(dtype: torch.dtype, error: float, floor: Callable[[], float], floor_name: str) -> str | None:
    """None when a structural probe's relative `error` passes in `dtype`; else the numbers in words.
    Only in half precision, and only above HALF_TOLERANCE, is `floor()` (the same comparison through
    the unmodified path, `floor_name`) computed and the error judged against it (`probe_allowance`)."""
    if error <= PROBE_TOLERANCE.get(dtype, HALF_TOLERANCE):
        return None
    if dtype in PROBE_TOLERANCE:
        return f"{error:.2g}"
    base = floor()
    return None if error <= probe_allowance(dtype, base) else f"{error:.2g}; {floor_name}: {base:.2g}"


def probe_allowance(dtype: torch.dtype, floor: float) -> float:
    """The largest relative error a structural probe accepts in `dtype`, given `floor`: the same
    comparison through the unmodified path. float32 and float64 accept only their fixed tolerance."""
    if dtype in PROBE_TOLERANCE:
        return PROBE_TOLERANCE[dtype]
    return max(HALF_TOLERANCE, FLOOR_FACTOR * floor)


#: why methods that draft through the target's own cache (self_spec, ppd) cannot run batched
SHARED_CACHE_BATCH_PROBLEM = ("it drafts through the target's own KV cache with layers skipped, and the batched "
                              "engine's one padded cache for all rows has no per-row view for that")
