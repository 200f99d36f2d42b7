"""Batched draft-then-verify: B prompts decoded together, one target forward per step for all rows.

The cache layout: one Hugging Face cache whose batch dimension holds the live rows. Row b's
valid entries are the first `lengths[b]` positions of its tensors; what lies between
`lengths[b]` and the tensors' common length is padding or another row's leftovers, hidden
from row b by the mask. A step appends the rows' blocks (root, nodes, aux, padded to the
longest block) after the common length, with a 4D additive mask per row (its own past, its
tree pattern, nothing else) and per-row position ids; then each row's accepted entries are
gathered to its own length (`compact_rows`). A row that stops frees its slot: the next prompt
waiting is prefilled and copied into it (continuous batching, `place_row`); a slot nobody takes
leaves the batch (`Cache.batch_select_indices`), so finished rows cost nothing afterwards.

Every row is verified on its own logits by the same `verify` as batch 1: lossless per row.
Padding changes the shapes of the target's matmuls, so greedy answers can differ from batch
1 where two logits are nearly tied; the report's audit attributes such divergences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from specbench.core.sampling import SamplingParams, next_token
from specbench.core.timing import Timer
from specbench.engine.api import DraftContext, Drafter, Prefilled, Request, Requests
from specbench.engine.budget import BudgetPolicy
from specbench.engine.decode import Decoder, Forward, Row, Scored, Verify
from specbench.engine.target import probe_tree_attention, static_tree_problem, tree_attention_inputs
from specbench.engine.tree import DraftTree
from specbench.engine.verifier import Verdict
from specbench.models import GrowingLayer, LoadedModel

#: the id fed at padded positions (never seen by a real row: the mask hides it)
PAD_ID = 0
#: prompts admitted together are prefilled in groups of similar length (`prefill_groups`): padding adds at
#: most PREFILL_SLACK of a group's real positions, and a forward scores at most PREFILL_POSITIONS positions
#: (one longer prompt alone). Padded all at once, the 60 official questions on SmolLM2 at batch size 16 scored
#: 1.85 positions per real one (16 summarization prompts: 2.48), and the prefill was 63% of the baseline's time
PREFILL_SLACK = 0.25
PREFILL_POSITIONS = 8192


@torch.inference_mode()
def batch_problem(target: LoadedModel) -> str | None:
    """Why the target cannot decode batches (None when it can): the batched step needs a
    custom 4D mask that the model honours and a cache of plain full-attention layers."""
    cache = target.new_cache()
    problem = static_tree_problem(target.model, cache)
    if problem is None and any(type(layer) not in (DynamicLayer, GrowingLayer) for layer in cache.layers):
        problem = "its cache has sliding-window layers, which rows of different lengths cannot share"
    return problem or probe_tree_attention(target.model, target.dtype)


@dataclass
class Batch:
    """The prefilled batch: per-row state (prompt, first token, logits, hidden states) and the
    shared cache with each row's valid length."""

    rows: list[Prefilled]
    cache: Any
    lengths: list[int]


def prefill_groups(lengths: list[int], slack: float = PREFILL_SLACK,
                   positions: int = PREFILL_POSITIONS) -> list[list[int]]:
    """The prompts of `lengths` (their indices) in prefill groups, shortest group first, each group in
    index order: taken longest first, a prompt joins the group being built while the group's padded
    positions (its size times its longest prompt) stay within `1 + slack` times its real ones and within
    `positions`."""
    groups: list[list[int]] = []
    group: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if group:
            padded, real = (len(group) + 1) * lengths[group[0]], sum(lengths[j] for j in group) + lengths[i]
            if padded > (1 + slack) * real or padded > positions:
                groups.append(group)
                group = []
        group.append(i)
    if group:
        groups.append(group)
    return [sorted(g) for g in reversed(groups)]


@torch.inference_mode()
def prefill_batch(
    target: LoadedModel, prompts: list[torch.Tensor], sampling: SamplingParams, hidden_states: bool = False
) -> Batch:
    """Run the prompts (each (1, len)) right-padded in one forward; each row's first token is
    chosen from its own last prompt position. Padded positions see the row's prompt (never the
    other way round), so each row's logits are its own prompt's."""
    device = target.device
    lengths = [int(p.shape[1]) for p in prompts]
    width = max(lengths)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, : lengths[b]] = p[0].to(device)
    span = torch.arange(width, device=device)
    real = span[None, None, :] < torch.tensor(lengths, device=device)[:, None, None]  # (B, 1, W): not padding
    seen = (span[None, :] <= span[:, None])[None] & real
    seen |= torch.eye(width, dtype=torch.bool, device=device)[None]  # padded rows see themselves: no empty row
    mask = torch.zeros(seen.shape, dtype=target.dtype, device=device).masked_fill(~seen, torch.finfo(target.dtype).min)
    cache = target.new_cache()
    out = target.model(
        input_ids=ids, cache=cache, use_cache=True, attention_mask=mask[:, None],
        position_ids=span[None].expand_as(ids),
        logits_to_keep=torch.tensor([[n - 1] for n in lengths], device=device), output_hidden_states=hidden_states,
    )
    rows = []
    for b, p in enumerate(prompts):
        logits = out.logits[b : b + 1, 0]
        extra = {"hidden_states": tuple(h[b : b + 1, : lengths[b]] for h in out.hidden_states)} if hidden_states else {}
        rows.append(Prefilled(p, [int(next_token(logits, sampling)[0])], None, logits, extra))
    return Batch(rows, cache, lengths)


def step_inputs(
    trees: list[DraftTree], roots: list[int], lengths: list[int], cached: int, device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids (b, R), the additive mask (b, 1, R, cached + R) and position ids (b, R) of a
    step: row b's block is its root, nodes and aux rows, padded to the longest block R."""
    blocks = [tree_attention_inputs(tree, 0, device, dtype) for tree in trees]
    width = max(t.rows for t in trees)
    b = len(trees)
    ids = torch.full((b, width), PAD_ID, dtype=torch.long, device=device)
    low = torch.finfo(dtype).min
    mask = torch.full((b, 1, width, cached + width), low, dtype=dtype, device=device)
    positions = torch.tensor(lengths, dtype=torch.long, device=device)[:, None].repeat(1, width)
    pad = torch.arange(width, device=device)
    mask[:, 0, pad, cached + pad] = 0  # every row sees itself (padded rows see nothing else)
    for i, (tree, (block, pos)) in enumerate(zip(trees, blocks, strict=True)):
        rows = tree.rows
        parts = [torch.tensor([roots[i]], device=device), tree.tokens.to(device)]
        if tree.aux is not None:
            parts.append(tree.aux.tokens.to(device))
        ids[i, :rows] = torch.cat(parts)
        mask[i, 0, :rows, : lengths[i]] = 0
        mask[i, 0, :rows, cached : cached + rows] = block[0, 0]
        positions[i, :rows] += pos[0]
    return ids, mask, positions


def compact_rows(cache: Any, lengths: list[int], cached: int, kept: list[list[int]]) -> list[int]:
    """After a step appended blocks after `cached` entries, move row b's `kept[b]` block rows to
    its own length and cut the tensors to the longest row; returns the new lengths.

    One gather and one scatter per layer tensor, over the kept rows only: a row whose length is
    the common one and that keeps a prefix of its block moves onto itself. Padding slots (rows
    keeping fewer than the most) copy the row's first block entry to just past its new length,
    which is padding anyway."""
    new = [n + len(k) for n, k in zip(lengths, kept, strict=True)]
    end = max(new)
    width = max(len(k) for k in kept)
    src = [[cached + r for r in k] + [cached] * (width - len(k)) for k in kept]
    dst = [[n + j for j in range(width)] for n in lengths]
    if all(s == d for s, d in zip(src, dst, strict=True)):  # every row already in place
        moves = None
    else:
        device = cache.layers[0].keys.device
        moves = (torch.tensor(src, device=device)[:, None, :, None], torch.tensor(dst, device=device)[:, None, :, None])
    for layer in cache.layers:
        if moves is not None:
            shape = (*layer.keys.shape[:2], width, layer.keys.shape[3])
            source, target = moves[0].expand(shape), moves[1].expand(shape)
            layer.keys.scatter_(2, target, layer.keys.gather(2, source))
            layer.values.scatter_(2, target, layer.values.gather(2, source))
        layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]
    return new


def merge_caches(cache: Any, extra: Any) -> None:
    """Append `extra`'s rows to `cache`'s batch (each layer's tensors padded with zeros to the
    longer length; the mask hides padding)."""
    for layer, more in zip(cache.layers, extra.layers, strict=True):
        width = max(layer.keys.shape[2], more.keys.shape[2])

        def padded(x: torch.Tensor, width: int = width) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[2]))

        layer.keys = torch.cat([padded(layer.keys), padded(more.keys)])
        layer.values = torch.cat([padded(layer.values), padded(more.values)])


def keep_batch_rows(cache: Any, keep: list[int], lengths: list[int]) -> None:
    """Keep batch rows `keep` of the cache, its tensors cut to the longest of their `lengths`."""
    cache.batch_select_indices(torch.tensor(keep, device=cache.layers[0].keys.device))
    end = max(lengths)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]


def place_row(cache: Any, slot: int, extra: Any, row: int, length: int) -> None:
    """Copy row `row`'s first `length` entries of cache `extra` into batch row `slot` of `cache`
    (a finished row's slot taken by a new prompt: one row copied, not the whole cache)."""
    for layer, more in zip(cache.layers, extra.layers, strict=True):
        if layer.keys.shape[2] < length:
            layer.extend(length)
        layer.keys[slot, :, :length] = more.keys[row, :, :length]
        layer.values[slot, :, :length] = more.values[row, :, :length]


class Batched(Forward):
    """The rows of a batch on one shared cache: each row's block (root, nodes, aux) padded to the
    longest, with its own 4D mask and positions (`step_inputs`); the accepted entries gathered to
    each row's length afterwards (`compact_rows`). Every tree takes the mask (`batch_problem`
    refuses models that cannot)."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.owner = decoder
        self.cached = 0

    def past(self, i: int) -> int:
        return self.owner.lengths[i]

    def prepare(self, i: int, row: Row, tree: DraftTree) -> tuple[DraftTree, bool]:
        return tree, not tree.layout.is_chain or tree.aux is not None

    def score(self, rows: list[Row], trees: list[DraftTree], tree_modes: list[bool]) -> Scored:
        owner = self.owner
        target = owner.target
        self.cached = owner.cache.get_seq_length()
        ids, mask, positions = step_inputs(trees, [r.ctx.tokens[-1] for r in rows], owner.lengths, self.cached,
                                           target.device, target.dtype)
        out = target.model(input_ids=ids, cache=owner.cache, use_cache=True, attention_mask=mask,
                           position_ids=positions, output_hidden_states=owner.hidden_states)
        return Scored(out.logits, out.hidden_states if owner.hidden_states else None)

    def keep(self, verdicts: list[Verdict]) -> None:
        owner = self.owner
        owner.lengths = compact_rows(owner.cache, owner.lengths, self.cached, [v.rows for v in verdicts])


class BatchDecoder:
    """Batches around the shared step: up to `slots` rows in flight, each with its own drafter.

    Each step (`Decoder.step` with the `Batched` forward): every live row drafts, all rows are
    scored in one forward, each row is verified on its own logits and keeps its cache entries. A
    row that stops is handed to `requests.finished` and leaves the batch, and free slots take the
    next prompts waiting in `requests` (prefilled together, then merged into the batch's cache):
    continuous batching. A caller that queues every prompt at the start and no more gets a static
    batch.
    """

    def __init__(
        self, target: LoadedModel, new_drafter: Callable[[], Drafter], verify: Verify, sampling: SamplingParams,
        timer: Timer, new_stats: Callable[[], Any], margins: Callable[[torch.Tensor], float] | None = None,
        context: int | None = None, hidden_states: bool = False, policy: BudgetPolicy | None = None,
    ) -> None:
        self.target, self.new_drafter, self.sampling = target, new_drafter, sampling
        self.timer, self.new_stats = timer, new_stats
        self.hidden_states = hidden_states
        self.decoder = Decoder(verify, sampling, timer, target.device, policy, context, margins)
        self.forward = Batched(self)
        self.cache: Any = None
        self.lengths: list[int] = []  # per batch row of the cache: entries that count
        self.live: list[Row | None] = []  # per batch row: None once it finished (a free slot)

    @torch.inference_mode()
    def run(self, requests: Requests, slots: int) -> None:
        while True:
            taken = sum(row is not None for row in self.live)
            fresh: list[Request] = []
            while taken + len(fresh) < slots and (request := requests.pop()) is not None:
                fresh.append(request)
            if fresh:
                self.admit(fresh, requests)
            if self.drop_free() or fresh:
                self.decoder.drafting = None  # the prefill and the cache's cut are no drafter's time
            if self.live:
                self.step(requests)
            elif not fresh:
                self.cache, self.lengths = None, []
                return

    def admit(self, fresh: list[Request], requests: Requests) -> None:
        """Prefill the new prompts in groups of similar length (`prefill_groups`), each group joining
        as it is prefilled."""
        for group in prefill_groups([int(r.input_ids.shape[1]) for r in fresh]):
            self.join([fresh[i] for i in group], requests)

    def join(self, fresh: list[Request], requests: Requests) -> None:
        """Prefill the new prompts together; rows that are not done at their first token take the
        free slots (finished rows' places in the cache) first, the rest join the batch."""
        with self.timer.section("prefill"):
            batch = prefill_batch(self.target, [r.input_ids for r in fresh], self.sampling, self.hidden_states)
        margins = self.decoder.margins
        for request in fresh:
            requests.started(request)
        joining = []
        for b, (request, state) in enumerate(zip(fresh, batch.rows, strict=True)):
            row = Row(DraftContext(state.input_ids, list(state.tokens), self.sampling, self.target.device),
                      self.new_drafter(), request.stop, self.new_stats(),
                      [margins(state.logits)] if margins is not None and state.logits is not None else None,
                      request)
            if request.stop.cut(row.ctx.tokens, 0) is not None:
                self.finish(row, requests)
                continue
            with self.timer.section("draft"):
                row.drafter.begin(state, self.sampling)
            joining.append((b, row))
        free = [i for i, row in enumerate(self.live) if row is None]
        appended = []
        with self.timer.section("prefill"):
            for b, row in joining:
                if free:
                    slot = free.pop(0)
                    place_row(self.cache, slot, batch.cache, b, batch.lengths[b])
                    self.live[slot], self.lengths[slot] = row, batch.lengths[b]
                else:
                    appended.append((b, row))
            if not appended:
                return
            lengths = [batch.lengths[b] for b, _ in appended]
            if len(appended) < len(fresh):
                keep_batch_rows(batch.cache, [b for b, _ in appended], lengths)
            if self.cache is None:
                self.cache = batch.cache
            else:
                merge_caches(self.cache, batch.cache)
        self.lengths += lengths
        self.live += [row for _, row in appended]

    def drop_free(self) -> bool:
        """Slots nobody took (nothing was waiting) leave the batch, so they cost no compute (True:
        some left)."""
        keep = [i for i, row in enumerate(self.live) if row is not None]
        if len(keep) == len(self.live):
            return False
        if keep:
            self.lengths = [self.lengths[i] for i in keep]
            keep_batch_rows(self.cache, keep, self.lengths)
        else:
            self.cache, self.lengths = None, []
        self.live = [self.live[i] for i in keep]
        return True

    def step(self, requests: Requests) -> None:
        live = [row for row in self.live if row is not None]  # drop_free ran: none is None
        self.decoder.step(live, self.forward)
        for i, row in enumerate(live):
            if row.done:
                self.finish(row, requests)
                self.live[i] = None  # its slot waits for the next prompt (or leaves in drop_free)

    def finish(self, row: Row, requests: Requests) -> None:
        requests.finished(row.request, row.result())
