"""The target's side of a step: score the root and every draft node in one forward on top of
the KV cache, then keep only the accepted path in the cache.

Chains go through the model's own causal mask and are rolled back with `cache.crop`, which
every croppable Hugging Face cache supports. Branching trees (and aux positions) need a
custom 4D additive mask with per-row position ids; `TargetScorer.tree_support` checks once
per model that the model honours one and falls back to chain verification otherwise.

Sliding-window layers: transformers hands a custom 4D mask to every layer as it is (the
sliding-window mask is never built), so a tree step is exact only while no position of the
block is past the smallest window: then the window cuts nothing and the sliding layers still
hold every entry. `window_problem` checks that per step; beyond the window the loop verifies
first branches as chains, which the model's own sliding mask and `crop` handle.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specbench.engine.layers import probe_verdict
from specbench.engine.tree import DraftTree
from specbench.models import PACKED_SDPA, GrowingLayer, new_cache

#: attention implementations that add a custom 4D float mask to the scores as given
TREE_ATTENTION_IMPLS = ("eager", "sdpa", PACKED_SDPA)
#: cache layers `keep_rows` can compact (exact types: subclasses keep other state)
COMPACTABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, GrowingLayer)


def model_context(config: Any) -> int | None:
    """Positions the model holds (prompt and answer together), when its config says."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def static_tree_problem(model: torch.nn.Module, cache: Any) -> str | None:
    """Why the model / cache cannot run a tree step (None when nothing is known against it)."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in TREE_ATTENTION_IMPLS:
        return f"attention implementation '{impl}' does not take a custom 4D mask"
    layers = getattr(cache, "layers", None)
    if layers is None:
        return f"cache {type(cache).__name__} has no per-layer tensors to compact"
    for layer in layers:
        if type(layer) not in COMPACTABLE_LAYERS:
            return (f"its cache has {type(layer).__name__} layers (static, linear, quantized, ...), "
                    "which a tree step cannot compact")
    return None


def sliding_window(cache: Any) -> int | None:
    """The smallest sliding window (or attention chunk) among the cache's layers; None if none slides."""
    layers = getattr(cache, "layers", ())
    windows = [int(layer.sliding_window) for layer in layers if type(layer) is DynamicSlidingWindowLayer]
    return min(windows, default=None)


def window_problem(cache: Any, past: int, tree: DraftTree) -> str | None:
    """Why a tree step of `tree` on `past` cached entries would not be exact on the cache's
    sliding layers (None when it is, and always without sliding layers).

    The 4D mask replaces the sliding mask, so every position of the block must be inside the
    window (past + span <= window): the window then cuts nothing the mask shows. The sliding
    layers must also return and keep every entry of the forward: they do while they record
    the past (`activate_past_recording`, as `decode` sets), otherwise only while past + rows
    stays under the window.
    """
    window = sliding_window(cache)
    if window is None:
        return None
    recording = all(getattr(layer, "record_past", False) for layer in cache.layers
                    if type(layer) is DynamicSlidingWindowLayer)
    if past + tree.span <= window and (recording or past + tree.rows < window):
        return None
    return (f"the context outgrew the smallest sliding window of its attention layers ({window} tokens), "
            "which a tree mask would bypass")


def tree_attention_inputs(
    tree: DraftTree, past: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1, 1, rows, past + rows) additive mask and (1, rows) position ids of a tree block.

    Rows are the root, the nodes and the aux positions if any. The past is fully visible;
    within the block a node sees the root, its ancestors and itself; position = past + depth.
    """
    layout = tree.layout
    block = layout.on("mask", device, dtype)
    positions = layout.on("positions", device)
    aux = tree.aux
    if aux is not None:
        n1 = tree.n + 1
        attend = torch.zeros(n1 + aux.k, n1 + aux.k, dtype=torch.bool, device=device)
        attend[:n1, :n1] = layout.on("attend", device)
        attend[n1:] = aux.attend.to(device)
        block = torch.zeros(attend.shape, dtype=dtype, device=device).masked_fill(~attend, torch.finfo(dtype).min)
        positions = torch.cat([positions, aux.offsets.to(device=device, dtype=torch.long)])
    rows = block.shape[0]
    mask = torch.cat([block.new_zeros(rows, past), block], dim=1)
    return mask[None, None], (positions + past)[None]


def keep_rows(cache: Any, past: int, total: int, rows: list[int]) -> None:
    """After a step of `total` block rows on top of `past` entries, keep only block `rows`.

    A prefix of the block (every chain, and trees accepted along their first branch) is a
    crop; otherwise each layer's accepted entries are gathered to the front of the block in
    place (`COMPACTABLE_LAYERS` only: `static_tree_problem` makes sure of that). A sliding
    layer's tensors may start later than position 0 (entries it dropped), its count of seen
    tokens becomes past + m, and past its window it keeps the last window - 1 entries, as its
    own `crop` does. `window_problem` makes sure the block itself is all there.
    """
    m = len(rows)
    if rows[-1] == m - 1:  # rows ascend, so this means rows == 0..m-1
        if total > m:
            cache.crop(m - total)
        return
    block = torch.tensor(rows, dtype=torch.long)
    indexes: dict[tuple[torch.device, int], torch.Tensor] = {}  # one copy per device and start
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        seen = getattr(layer, "cumulative_length", None)  # sliding layers: tokens seen, not entries held
        start = past if seen is None else past - (seen - keys.shape[-2])  # where the block starts in the tensors
        if start < 0:
            raise RuntimeError(f"keep_rows: a {type(layer).__name__} dropped entries of the block it must compact")
        index = indexes.get((keys.device, start))
        if index is None:
            index = indexes[keys.device, start] = block.to(keys.device) + start
        keys[:, :, start : start + m] = keys[:, :, index]
        values[:, :, start : start + m] = values[:, :, index]
        layer.keys, layer.values = keys[:, :, : start + m], values[:, :, : start + m]
        if seen is not None:
            layer.cumulative_length = past + m
            window = layer.sliding_window
            if past + m >= window:
                layer.keys, layer.values = layer.keys[:, :, -window + 1 :], layer.values[:, :, -window + 1 :]


def probe_tree_attention(model: torch.nn.Module, dtype: torch.dtype) -> str | None:
    """Run a two-sibling tree and compare with chain forwards; None when the logits agree.

    Catches models that ignore or reshape a custom 4D mask (they would let siblings see each
    other) and models that reject one (any exception).
    """
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else 8
    ids = [i % vocab for i in (1, 2, 3, 4, 5, 6)]
    prefix, root, first, second = ids[:3], ids[3], ids[4], ids[5]
    tree = DraftTree(torch.tensor([first, second], device=device), (-1, -1))
    try:
        cache = new_cache(model.config)
        model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True)
        mask, positions = tree_attention_inputs(tree, len(prefix), device, dtype)
        got = model(
            input_ids=torch.tensor([[root, first, second]], device=device), cache=cache, use_cache=True,
            attention_mask=mask, position_ids=positions,
        ).logits[0].float()
        want_first = model(input_ids=torch.tensor([[*prefix, root, first]], device=device)).logits[0, -2:].float()
        want_second = model(input_ids=torch.tensor([[*prefix, root, second]], device=device)).logits[0, -1].float()
    except Exception as exc:  # noqa: BLE001 - any failure means "no tree attention here"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"a tree forward raised {type(exc).__name__}: {first_line}"
    want = torch.stack([want_first[0], want_first[1], want_second])
    scale = float(want.abs().max()) + 1.0
    error = float((got - want).abs().max()) / scale
    def floor() -> float:  # a plain chain over the same cached prefix (no tree mask): the dtype's own spread
        with torch.no_grad():
            cache = new_cache(model.config)
            model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True)
            chain = model(input_ids=torch.tensor([[root, first]], device=device), cache=cache,
                          use_cache=True).logits[0].float()
        return float((chain - want_first).abs().max()) / scale

    verdict = probe_verdict(dtype, error, floor, "a cached chain")
    return None if verdict is None else \
        f"its logits under a tree mask differ from chain forwards (relative error {verdict})"


class TargetScorer:
    """Runs the target over a step's block and keeps its cache to the accepted path."""

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.tree_problem: str | None = None
        self._tree_checked = False

    def tree_support(self, cache: Any) -> bool:
        """Whether tree steps work with this model (checked on first use, then remembered)."""
        if not self._tree_checked:
            self._tree_checked = True
            self.tree_problem = static_tree_problem(self.model, cache) or probe_tree_attention(self.model, self.dtype)
        return self.tree_problem is None

    def step_problem(self, cache: Any, past: int, tree: DraftTree) -> str | None:
        """Why this step cannot run `tree` with the tree mask (None when it can): a model or cache
        that never can (`tree_support`), or a block that reaches past a sliding window."""
        if not self.tree_support(cache):
            return self.tree_problem
        return window_problem(cache, past, tree)

    def score(
        self, cache: Any, past: int, root: int, tree: DraftTree, tree_mode: bool, hidden_states: bool = False
    ) -> Any:
        """One forward over [root, nodes..., aux...]; returns the model output (logits (1, rows, V))."""
        device = self.device
        parts = [torch.tensor([root], dtype=torch.long, device=device), tree.tokens.to(device)]
        if tree.aux is not None:
            parts.append(tree.aux.tokens.to(device))
        input_ids = torch.cat(parts)[None]
        kwargs: dict[str, Any] = {}
        if tree_mode:
            kwargs["attention_mask"], kwargs["position_ids"] = tree_attention_inputs(tree, past, device, self.dtype)
        if hidden_states:
            kwargs["output_hidden_states"] = True
        return self.model(input_ids=input_ids, cache=cache, use_cache=True, **kwargs)
