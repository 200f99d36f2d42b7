"""Hardware-aware draft budgets (`method.budget=auto`): each step verifies as much of a proposal
as this device verifies profitably.

Three parts, all outside the verifier, so what is emitted never changes:
- `CostCurve`: the target's forward time against the rows it scores at once (and the context
  length), measured at start-up on the device in use and cached per device, model, dtype, batch and
  contexts (`cost_curve`; a long run's length bucket is timed too: `curve_contexts`), at the run's batch
  size and at the powers of two below it (`curve_batches`):
  a batch drains as its rows finish, and a step is costed at the rows live then. While the run
  goes, `OnlineFit`s turn the curve into the step's measured verification time (offset and scale
  follow the machine) and fit the drafter's time against the nodes it proposes.
- `AcceptanceModel`: the chance that a node is accepted once its parent is: the drafter's own
  confidence (`DraftTree.confidence`), calibrated against what the target accepted so far, where
  the tree is deterministic; else the running acceptance at the node's (depth, sibling rank). Its
  sum over a draft is scaled by what verified drafts gave against what it expected of them
  (`BudgetPolicy.yield_`: a draft's nodes stand or fall together).
- `BudgetPolicy.choose`: orders each row's proposal by its nodes' chances of being accepted (a
  parent never after its child) and picks the step's width, the same for every row of a batch
  (the verification pads rows to the longest block): the one that maximises the step's expected
  tokens per second, sum over rows of (1 + expected accepted) / (drafting + verifying the batch at
  that width). Zero nodes is a valid choice. Before each proposal `BudgetPolicy.budget` tells the
  drafter the chance a node must have to be worth drafting and verifying, so drafters that build as
  they go (chains, EAGLE-2's levels) stop early.
- `BudgetPolicy.plan`: whether the rows draft at all this step. The policy keeps the gain of
  drafting (the best width's expected rate against the plain step's, every row drafting as the
  drafted rows did, times `bias`: drafted steps' measured rate over expected against plain steps',
  per live row count, from the step's own clock); once GAIN_EVIDENCE drafted steps are behind it and
  while it is below 1, drafters that cost more than `CHEAP` of a plain step do not draft, except one
  row per probe, probes spaced ever further apart (up to `PROBE_MAX` steps): speculation that does
  not pay on this device at this batch size costs almost nothing. While it pays, a step whose nodes
  do not pay verifies none, and a probe comes only after `PROBE_EVERY` such steps in a row.

Lossless under sampling: with draft probabilities (sampled drafts) only position-based rates are
used, never a drawn token's own confidence, so which nodes are kept does not depend on the drawn
values; siblings drawn without replacement are kept as a prefix.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.core.answers import write_meta
from specbench.core.hardware import device_name
from specbench.core.resources import default_cache, env_folder
from specbench.engine.target import tree_attention_inputs
from specbench.engine.tree import DraftTree, layout_of
from specbench.engine.verifier import Verdict
from specbench.models import linear_kernel

#: `method.budget`: auto (this module) | fixed (the method's preset, every node verified)
BUDGET_MODES = ("auto", "fixed")
#: rows at which start-up measures the target's forward (capped by the model's context)
CURVE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DENSE_ROWS = 513  # CostCurve's lookup table: rows 0..512 (beyond: interpolated)
COST_DIR_VAR = "SPECBENCH_COST_DIR"
CURVE_VERSION = 7  # 2: row counts timed in turn, pass by pass; 3: the linear kernel's rule by size and threads;
# 4: row counts capped at CURVE_POSITIONS positions a forward; 5: a run's length bucket timed as a context of its own;
# 6: RowsFirstLinear lays its rows out one after another (2-8 rows on SmolLM2 were timed 3-4x dear in down_proj);
# 7: a batch's forwards timed with the batched step's 4D mask (`curve_inputs`)
#: the most positions (rows per batch row times batch rows) a curve's forward scores; beyond, extrapolated
CURVE_POSITIONS = 512
#: a run whose steps reach past LONG_FROM cached positions has its curves timed at its length bucket too (the
#: next power of two, within the model's context): a verification's cost grows with the context at a rate
#: that two short contexts do not tell (their difference is mostly the machine's noise)
LONG_FROM = 1024
#: the most cached positions (batch rows times context) a curve's long context holds: a larger batch's bucket
#: is cut to fit (its prefill alone would take minutes on a CPU), and beyond it the curve extrapolates
LONG_POSITIONS = 16384


def curve_batches(batch: int) -> list[int]:
    """Batch sizes whose curves a policy at `batch` holds: the powers of two below it, and it. A
    batch drains (its last rows finish alone), and a forward over fewer rows costs less: the cost of
    a step is read at the rows still live, between the two nearest batch sizes."""
    sizes = {batch}
    size = 1
    while size < batch:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def curve_contexts(limit: int, batch: int = 1, longest: int | None = None) -> list[int]:
    """Cached positions a curve at `batch` is timed over, for a model of `limit` positions and a run whose
    steps reach `longest`: 64 and 512 (fewer for a short model), and the run's length bucket where it
    reaches past LONG_FROM (the next power of two above `longest`, at most LONG_POSITIONS over the batch
    rows and within the context)."""
    contexts = {max(8, min(64, limit // 8)), max(16, min(512, limit // 2))}
    if longest is not None and longest > LONG_FROM:
        fits = 1 << (max(LONG_POSITIONS // max(batch, 1), 1).bit_length() - 1)
        bucket = min(1 << (int(longest) - 1).bit_length(), fits, limit - CURVE_POSITIONS // 2)
        if bucket > 2 * max(contexts):
            contexts.add(bucket)
    return sorted(contexts)


def cost_dir() -> Path:
    """$SPECBENCH_COST_DIR if set, else ~/.cache/specbench/costs."""
    return env_folder(COST_DIR_VAR, default_cache() / "costs")


@dataclass
class CostCurve:
    """Seconds of one target forward scoring `rows` new positions per batch row, at each of
    `contexts` cached positions (seconds[c][r]); linear in between (in rows, and between the two nearest
    contexts), extended linearly beyond."""

    rows: list[int]
    contexts: list[int]
    seconds: list[list[float]]
    batch: int = 1
    _table: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _lists: list[list[float]] | None = field(default=None, init=False, repr=False, compare=False)

    def time(self, rows: int, context: float = 0.0) -> float:
        """`times` at one row count (plain floats: called every step)."""
        if self._lists is None:
            self._lists = self._dense().tolist()
        lists = self._lists
        if rows >= len(lists[0]):
            return float(self.times(np.array([rows]), context)[0])
        if len(lists) == 1:
            return lists[0][rows]
        i, w = self._segment(context)
        lo, hi = lists[i][rows], lists[i + 1][rows]
        return max(lo + w * (hi - lo), 0.0)

    def times(self, rows: np.ndarray, context: float = 0.0) -> np.ndarray:
        """Seconds at each of `rows` (whole numbers >= 0) at `context` cached positions."""
        tables = self._dense()
        index = np.asarray(rows, dtype=np.int64)
        if index.size and index.max() < tables.shape[1]:
            at = tables[:, index]  # per context: (len(rows),), read from the table
        else:
            at = np.stack([_interp(index.astype(float), self.rows, s) for s in self.seconds])
        if len(at) == 1:
            return at[0]
        i, w = self._segment(context)
        return np.maximum(at[i] + w * (at[i + 1] - at[i]), 0.0)

    def _segment(self, context: float) -> tuple[int, float]:
        """The two measured contexts `context` is read between (the first two below them, the last two
        beyond) and its weight on the second."""
        cs = self.contexts
        i = 0 if len(cs) == 2 else min(max(bisect.bisect_right(cs, context) - 1, 0), len(cs) - 2)
        return i, (context - cs[i]) / (cs[i + 1] - cs[i])

    def _dense(self) -> np.ndarray:
        """(contexts, DENSE_ROWS) the curve at every whole row count, built once: a step's lookups
        are then indexing, not interpolation."""
        if self._table is None:
            grid = np.arange(DENSE_ROWS, dtype=float)
            self._table = np.stack([_interp(grid, self.rows, s) for s in self.seconds])
        return self._table

    @classmethod
    def synthetic(cls, fn: Callable[[int], float], rows: tuple[int, ...] = CURVE_ROWS) -> CostCurve:
        """A curve from a formula (tests, and what-if studies)."""
        return cls(list(rows), [0], [[float(fn(r)) for r in rows]])


def _interp(x: np.ndarray, xs: list[int], ys: list[float]) -> np.ndarray:
    """np.interp, extended linearly past the last point."""
    if len(xs) == 1:
        return np.full(x.shape, float(ys[0]))
    out = np.interp(x, xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)


def monotone(ys: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): scoring more rows never
    costs less; timing noise does not get to say otherwise."""
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, c1), (m2, c2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    return [m for m, c in blocks for _ in range(int(c))]


def curve_key(model: Any, device: torch.device, dtype: torch.dtype, batch: int,
              contexts: list[int] | None = None) -> dict[str, Any]:
    """What a cached curve belongs to: the device, the model's architecture, the dtype, the batch, the
    contexts timed (`curve_contexts`: a run's length bucket has curves of its own)."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else ""
    return {
        "version": CURVE_VERSION, "device": device_name(device), "device_type": device.type,
        "threads": torch.get_num_threads() if device.type == "cpu" else None, "torch": torch.__version__,
        "model": hashlib.sha256(config.encode()).hexdigest()[:16], "dtype": str(dtype), "batch": batch,
        "attention": getattr(model.config, "_attn_implementation", None), "linear": linear_kernel(model),
        "contexts": contexts,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def curve_inputs(batch: int, rows: int, context: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The mask and positions of a curve's forward of `rows` new positions per batch row over `context` cached:
    for a batch, what a batched step of equal-length rows passes (engine.batch.step_inputs: a chain's block,
    its own past visible); one row, nothing (a chain's step: the model's own causal mask). Measured on
    SmolLM2 at batch size 8 over 512 cached positions: a one-row step without a mask takes SDPA's grouped
    path, 158 ms, and with the batch's mask 112 ms (transformers packs its queries), so a curve timed
    without the mask priced the plain step 40% above the run's and drafting as almost free."""
    if batch == 1:
        return {}
    mask, positions = tree_attention_inputs(DraftTree.chain(torch.zeros(rows - 1, dtype=torch.long)), context,
                                            device, dtype)
    return {"attention_mask": mask.expand(batch, 1, rows, context + rows).contiguous(),
            "position_ids": positions.expand(batch, rows)}


@torch.inference_mode()
def measure_curve(target: Any, batch: int = 1, repeats: int = 5, context_limit: int | None = None,
                  contexts: list[int] | None = None) -> CostCurve:
    """Time the target's forward on `rows` new positions over a cache of each context length
    (`contexts`, else `curve_contexts`' two short ones; random tokens; passes over every row count in
    turn, the first a warm-up, the median of the other `repeats` per row count; made non-decreasing in
    rows). A batch's forwards take the 4D additive mask and positions a batched step passes
    (`curve_inputs`), a single row's none, as a chain's step: the attention's code path follows the mask."""
    model, device = target.model, target.device
    limit = context_limit or 2048
    contexts = sorted(contexts or curve_contexts(limit, batch))
    rows = [r for r in CURVE_ROWS if r + contexts[-1] < limit and r * batch <= max(CURVE_POSITIONS, batch)] or [1]
    vocab = int(model.config.get_text_config().vocab_size)
    gen = torch.Generator().manual_seed(0)
    seconds = []
    for context in contexts:
        cache = target.new_cache()
        if (record_past := getattr(cache, "activate_past_recording", None)) is not None:
            record_past()  # sliding-window layers can then be cropped back after each timing
        ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        blocks = [torch.randint(0, vocab, (batch, n), generator=gen).to(device) for n in rows]
        extras = [curve_inputs(batch, n, context, device, target.dtype) for n in rows]
        times: list[list[float]] = [[] for _ in rows]
        for i in range(repeats + 1):  # every row count once per pass: a drift of the machine's speed hits all alike
            for n, block, extra, seen in zip(rows, blocks, extras, times, strict=True):
                _sync(device)
                t = time.perf_counter()
                model(input_ids=block, cache=cache, use_cache=True, **extra)
                _sync(device)
                if i:  # the first pass warms up
                    seen.append(time.perf_counter() - t)
                cache.crop(-n)
        seconds.append(monotone([float(np.median(seen)) for seen in times]))
    return CostCurve(rows, contexts, seconds, batch)


def cost_curve(target: Any, batch: int = 1, context_limit: int | None = None, longest: int | None = None) -> CostCurve:
    """The target's cost curve on this device at this batch size, for a run whose steps reach `longest`
    cached positions (`curve_contexts`): from the cache, else measured now and cached (one JSON file per
    device, model, dtype, batch and contexts)."""
    contexts = curve_contexts(context_limit or 2048, batch, longest)
    key = curve_key(target.model, target.device, target.dtype, batch, contexts)
    path = cost_dir() / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24] + ".json")
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            c = stored["curve"]
            return CostCurve(list(c["rows"]), list(c["contexts"]), [list(s) for s in c["seconds"]], batch)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    curve = measure_curve(target, batch, context_limit=context_limit, contexts=contexts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_meta(path, {"key": key, "curve": {"rows": curve.rows, "contexts": curve.contexts,
                                                "seconds": curve.seconds}})
    except OSError:
        pass  # a read-only home: measured again next run
    return curve


class OnlineFit:
    """y ~ a + b x by least squares with exponential forgetting (recent steps count most). While x
    barely varies the data cannot tell the slope: it is the prior `slope`, or with `slope=None`
    y / x (all of y proportional to x). A bounded fit keeps the slope within [b0 / 2, 2 b0]: a
    step's block varies little, so the data tell the level far better than the slope."""

    def __init__(self, slope: float | None = 1.0, decay: float = 0.97, bounded: bool = True) -> None:
        self.b0, self.decay, self.bounded = slope, decay, bounded
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.w, self.sx, self.sy = d * self.w + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y

    def coefficients(self) -> tuple[float, float]:
        if self.w == 0:
            return 0.0, self.b0 or 0.0
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        b = self.b0 if self.b0 is not None else (my / mx if mx > 0 else 0.0)
        if var > 1e-4 * max(mx * mx, 1e-12):
            fitted = (self.sxy / self.w - mx * my) / var
            b = min(max(fitted, b / 2), 2 * b) if self.bounded else max(fitted, 0.0)
        return my - b * mx, b

    def __call__(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * x


#: the longest run of steps without drafting where drafting does not pay: then one row probes
PROBE_MAX = 128
#: while drafting pays, a step whose nodes do not pay verifies none; after PROBE_EVERY such steps in a row the
#: next one verifies its likeliest node (what is never verified is never learnt). With a probe every step (until
#: e88e729), SuffixDecoding on SmolLM2 at 12-16 live rows paid a 2-wide step (1.32 plain steps) on 25 of 242
#: drafted steps where its own choice was the plain step
PROBE_EVERY = 4
#: a drafter whose expected seconds per row are below this share of a plain step's per row always
#: proposes (the width chosen decides what is verified: none where nothing pays); a dearer one stops
#: drafting where it does not pay. A retrieval drafter's opportunities come and go with the text (a
#: passage to copy): one that is seldom asked misses them (SuffixDecoding on the zoo at batch size 16,
#: at about 6% of a plain step per row, stopped at its answers' first tokens and missed the rest)
CHEAP = 0.1
GAIN_MEMORY = 0.5  # weight of the previous gain in the running gain (drafted steps only)
#: drafted steps behind the running gain before it may stop drafting: a batch's first steps are its answers'
#: first tokens, where a retrieval drafter has little to match yet
GAIN_EVIDENCE = 8
SWITCH_ON = 1.1  # where drafting had stopped, the gain a probe must show to start it again
#: the tokens a verified draft gave against those the acceptance model expected of it: a running ratio
#: over drafted rows (each row's weight decays by TOKENS_DECAY per row after it), PRIOR tokens at 1 behind it
TOKENS_DECAY = 0.99
#: per live row count, the step's measured tokens per second against the rate the policy expected of it, for
#: steps that drafted and for steps that did not: a running ratio each (a step's weight decays by
#: OUTCOME_DECAY per later step of its kind and live count), PRIOR steps at 1 behind it
OUTCOME_DECAY = 0.95
#: calibration bins of a drafter's confidence (equal width over [0, 1])
CONF_BINS = 20
PRIOR = 2.0  # pseudo-observations behind every prior
REFRESH = 4  # learned tables rebuilt every REFRESH verdicts (every one at first): one verdict barely moves them
MAX_DEPTH, MAX_RANK = 32, 16


class AcceptanceModel:
    """The chance a node is accepted once its parent is (conditional acceptance), learned from the
    verdicts of this run: per confidence bin (prior: the confidence itself) and per (depth,
    sibling rank) (prior: the rate one level up, else 0.5 / (rank + 1))."""

    def __init__(self) -> None:
        self.conf_hits = np.zeros(CONF_BINS)
        self.conf_seen = np.zeros(CONF_BINS)
        self.pos_hits = np.zeros((MAX_DEPTH + 1, MAX_RANK))
        self.pos_seen = np.zeros((MAX_DEPTH + 1, MAX_RANK))
        self.steps = 0
        self._changed()

    def _changed(self) -> None:
        self.tables: dict[torch.device, torch.Tensor] = {}  # calibration() per device, until the next refresh
        self._calibration: np.ndarray | None = None
        self._rates: np.ndarray | None = None

    def calibration(self) -> np.ndarray:
        """(CONF_BINS,) conditional acceptance per confidence bin."""
        if self._calibration is None:
            centers = (np.arange(CONF_BINS) + 0.5) / CONF_BINS
            self._calibration = (self.conf_hits + PRIOR * centers) / (self.conf_seen + PRIOR)
        return self._calibration

    def calibrate(self, confidence: torch.Tensor) -> torch.Tensor:
        """Conditional acceptance of nodes with these confidences (same shape, float)."""
        table = self.tables.get(confidence.device)
        if table is None:
            table = self.tables[confidence.device] = torch.as_tensor(
                self.calibration(), dtype=torch.float32, device=confidence.device)
        return table[_bins(confidence)]

    def rates(self) -> np.ndarray:
        """(MAX_DEPTH + 1, MAX_RANK) conditional acceptance per (depth, sibling rank)."""
        if self._rates is None:
            # prior at depth d: the observed rate at the nearest depth above with data (depth >= 1)
            seen = self.pos_seen > 0
            seen[0] = False
            level = np.where(seen, np.arange(MAX_DEPTH + 1)[:, None], 0)
            above = np.vstack([np.zeros((1, MAX_RANK), dtype=np.int64), np.maximum.accumulate(level, axis=0)[:-1]])
            observed = self.pos_hits / np.maximum(self.pos_seen, 1)
            default = np.broadcast_to(0.5 / (np.arange(MAX_RANK) + 1), above.shape)
            prior = np.where(above > 0, np.take_along_axis(observed, above, axis=0), default)
            self._rates = (self.pos_hits + PRIOR * prior) / (self.pos_seen + PRIOR)
        return self._rates

    def rate(self, depth: int, rank: int = 0) -> float:
        return float(self.rates()[min(depth, MAX_DEPTH), min(rank, MAX_RANK - 1)])

    def conditional(self, tree: DraftTree) -> np.ndarray:
        """(n,) each node's chance of acceptance once its parent is accepted."""
        if tree.confidence is not None and tree.draft_probs is None:
            return self.calibration()[_bins(tree.confidence.float()).cpu().numpy()]
        depth, rank, _ = _positions(tree.parents)
        return self.rates()[depth, rank]

    def node_probs(self, tree: DraftTree) -> np.ndarray:
        """(n,) each node's chance of being accepted: the product of conditionals along its path."""
        reach = np.clip(self.conditional(tree), 1e-6, 1.0).tolist()
        for i, parent in enumerate(tree.parents):  # parents come first; <= 1, so a child never passes its parent
            if parent >= 0:
                reach[i] *= reach[parent]
        if tree.kind == "without_replacement":  # keep such siblings as a prefix: never above an earlier one
            for kids in tree.layout.children:
                for a, b in zip(kids, kids[1:]):
                    reach[b] = min(reach[b], reach[a])
        return np.asarray(reach)

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        """Count every node whose parent was accepted: accepted or not."""
        if tree.n == 0:
            return
        depth, rank, parent_rows = _positions(tree.parents)
        accepted = np.zeros(tree.n + 1, dtype=bool)  # per row (0 = the root, always "accepted")
        accepted[0] = True
        accepted[np.asarray(verdict.path, dtype=np.int64) + 1] = True
        seen = accepted[parent_rows]
        hit = accepted[1:][seen].astype(float)
        np.add.at(self.pos_seen, (depth[seen], rank[seen]), 1.0)
        np.add.at(self.pos_hits, (depth[seen], rank[seen]), hit)
        if tree.confidence is not None and tree.draft_probs is None:
            bins = _bins(tree.confidence.float()).cpu().numpy()[seen]
            np.add.at(self.conf_seen, bins, 1.0)
            np.add.at(self.conf_hits, bins, hit)
        self.steps += 1
        if self.steps <= REFRESH or self.steps % REFRESH == 0:
            self._changed()


@lru_cache(maxsize=1024)
def _positions(parents: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node of a topology: its depth and sibling rank (capped to the model's table) and its
    parent's row (0 = the root)."""
    layout = layout_of(parents)
    rank = np.zeros(len(parents), dtype=np.int64)
    for kids in layout.children:
        rank[list(kids)] = np.arange(len(kids))
    depth = np.minimum(np.asarray(layout.depth, dtype=np.int64), MAX_DEPTH)
    return depth, np.minimum(rank, MAX_RANK - 1), np.asarray(parents, dtype=np.int64) + 1


def _bins(confidence: torch.Tensor) -> torch.Tensor:
    return (confidence.clamp(0.0, 1.0) * CONF_BINS).long().clamp(max=CONF_BINS - 1)


@dataclass
class Budget:
    """What a drafter is told before it proposes (`DraftContext.budget`; None under `fixed`).

    tokens_per_s: the expected tokens per second of the last step's choice; verify_cost: what
    one more verified row costs (seconds); unit_cost: what one unit of the drafter's work costs
    (a draft forward, a head level: seconds, `DraftTree.work`). worth: the chance of acceptance
    a chain's next token needs to be worth drafting and verifying. calibrate: a confidence
    tensor -> the calibrated chance of acceptance given the parent (deterministic drafts only: a
    sampled draft must not choose by a drawn token's confidence). rate(depth, rank): the running
    conditional acceptance at a position. depth: the chain length whose last token is still
    worth it under `rate` alone.
    """

    tokens_per_s: float
    verify_cost: float
    unit_cost: float
    calibrate: Callable[[torch.Tensor], torch.Tensor]
    rate: Callable[[int, int], float]

    @property
    def worth(self) -> float:
        return self.tokens_per_s * (self.verify_cost + self.unit_cost)

    @property
    def depth(self) -> int:
        depth, reach, worth = 0, 1.0, self.worth
        while depth < MAX_DEPTH:
            reach *= self.rate(depth + 1, 0)
            if reach < worth:
                break
            depth += 1
        return max(depth, 1)

    def fill(self, reach: torch.Tensor, rows: torch.Tensor | slice, parents: torch.Tensor, confidence: torch.Tensor,
             depth: int) -> bool:
        """A static tree's level at `depth` drafted: each node's chance of being reached (its `rows`
        of `reach`: its parent's row, `parents`, times its calibrated `confidence`), and whether one
        more level pays (`extend`)."""
        reach[rows] = reach[parents] * self.calibrate(confidence)
        return self.extend(reach[rows], depth + 1)

    def extend(self, reach: torch.Tensor, depth: int) -> bool:
        """Whether one more unit of work (a level at `depth` under nodes reached with chances
        `reach`, each adding its best child) is expected to pay: the tokens its children add
        beyond their verification cost, against the unit's cost."""
        child = reach * self.rate(depth, 0)
        gain = float((child - self.tokens_per_s * self.verify_cost).clamp(min=0).sum())
        return gain >= self.tokens_per_s * self.unit_cost


@dataclass(frozen=True)
class Plan:
    """Which rows draft this step (`rows`: every row, or the one row `probe_row`, or none) and
    whether at least one node must be verified (`probe`: what is never verified is never learnt)."""

    rows: str  # "all" | "one" | "none"
    probe: bool
    probe_row: int = 0

    def drafts(self, i: int) -> bool:
        return self.rows == "all" or (self.rows == "one" and i == self.probe_row)


def policy_curves(target: Any, batch: int, context_limit: int | None = None,
                  longest: int | None = None) -> dict[int, CostCurve]:
    """`cost_curve` at each of `curve_batches(batch)`: what a `BudgetPolicy` at `batch` reads."""
    return {b: cost_curve(target, b, context_limit, longest) for b in curve_batches(batch)}


@dataclass
class BudgetPolicy:
    """One per method run and batch size (all rows of a batch share it): the two models, whether
    to draft (`plan`) and what to verify (`choose`).

    `curve` is the cost at the run's batch size; `smaller` at smaller batch sizes (`curve_batches`):
    a step's verification is read at the rows live then, between the two nearest measured sizes
    (fewer rows than any measured size: the smallest size's curve)."""

    curve: CostCurve
    smaller: dict[int, CostCurve] = field(default_factory=dict)
    accept: AcceptanceModel = field(default_factory=AcceptanceModel)

    def __post_init__(self) -> None:
        self.curves = {b: c for b, c in self.smaller.items() if b < self.curve.batch} | {self.curve.batch: self.curve}
        self.sizes = sorted(self.curves)
        self.verify_fit = OnlineFit(slope=1.0)  # measured verify seconds ~ a + b * curve seconds
        self.draft_fit = OnlineFit(slope=None, bounded=False)  # measured draft seconds ~ a + b * drafter work
        self.rate_now = 0.0  # the chosen width's expected tokens per second (the batch's), last step
        self.marginal = 0.0  # seconds one more verified node costs there (a row's share of a wider step)
        self.gain: float | None = None  # running gain of drafting: best expected rate / the plain step's
        self.gains = 0  # drafted steps the running gain has seen
        self.interval = 1  # steps between probes while drafting does not pay (doubling to PROBE_MAX)
        self.wait = 0  # steps until the next probe
        self.turn = 0  # the row that probes next (round robin)
        self.idle = 0  # steps in a row whose nodes were offered and none verified (`PROBE_EVERY`)
        self.work = 0.0  # a drafting row's work at the last drafted step (its drafter's units)
        self.steps = self.skipped = 0  # steps planned, and steps on which no row drafted
        self.last = "all"  # the previous step's plan (its rows)
        self.timed = True  # this step's drafting is timed for the fit: the previous step drafted every row
        self.got = self.expected = PRIOR  # running accepted and expected tokens of verified drafts (`yield_`)
        #: per batch row, the tree `choose` kept last and the tokens its acceptance model expected of it
        self.chosen: dict[int, tuple[DraftTree, float]] = {}
        #: (drafted?, live rows) -> [measured tokens, expected tokens] of whole steps (`outcome`)
        self.outcomes: dict[tuple[bool, int], list[float]] = {}

    # -- the models -----------------------------------------------------------------------------

    def _around(self, live: int | None) -> tuple[CostCurve, CostCurve, float]:
        """The measured curves around `live` batch rows and the weight of the upper one (outside
        the measured sizes: the nearest)."""
        sizes = self.sizes
        if live is None or live >= sizes[-1]:
            return self.curve, self.curve, 1.0
        if live <= sizes[0]:
            return self.curves[sizes[0]], self.curves[sizes[0]], 1.0
        upper = next(b for b in sizes if b >= live)
        lower = max(b for b in sizes if b <= live)
        if upper == lower:
            return self.curves[lower], self.curves[lower], 1.0
        return self.curves[lower], self.curves[upper], (live - lower) / (upper - lower)

    def curve_times(self, widths: np.ndarray, context: float, live: int | None = None) -> np.ndarray:
        """The measured curve at each block width for `live` batch rows (None: the run's batch)."""
        low, high, w = self._around(live)
        if low is high:
            return low.times(widths, context)
        return (1 - w) * low.times(widths, context) + w * high.times(widths, context)

    def curve_time(self, rows: int, context: float, live: int | None = None) -> float:
        """`curve_times` at one width (plain floats: called every step)."""
        low, high, w = self._around(live)
        if low is high:
            return low.time(rows, context)
        return (1 - w) * low.time(rows, context) + w * high.time(rows, context)

    def step_time(self, widths: np.ndarray, context: float, live: int | None = None) -> np.ndarray:
        """Seconds of the batch's verification forward at each block width (rows per batch row)."""
        a, b = self.verify_fit.coefficients()
        return np.maximum(a + b * self.curve_times(widths, context, live), 1e-9)

    def plain_time(self, rows: int, context: float, live: int | None = None) -> float:
        """`step_time` at one width (plain floats: called every step)."""
        a, b = self.verify_fit.coefficients()
        return max(a + b * self.curve_time(rows, context, live), 1e-9)

    def draft_time(self, work: float) -> float:
        return max(self.draft_fit(float(work)), 0.0)

    def draft_seen(self, work: float, share: float = 1.0) -> Callable[[float], None]:
        """Where a step's measured drafting seconds go (`work` units of the drafter; a batch's
        drafting rows each count their `share` of the step's drafting). Not after a step on which a
        row did not draft: the drafter then catches up on the text it skipped, which is no cost of
        the proposal's size (the fit keeps what drafting cost while it drafted)."""
        if not self.timed:
            return lambda seconds: None
        return lambda seconds: self.draft_fit.add(float(work), seconds * share)

    def verify_seen(self, rows: int, context: float, live: int | None = None) -> Callable[[float], None]:
        """Where a step's measured verification seconds go (`rows` scored for each of `live` batch
        rows over `context` cached)."""
        return lambda seconds: self.verify_fit.add(self.curve_time(rows, context, live), seconds)

    # -- the choice -----------------------------------------------------------------------------

    def budget(self) -> Budget:
        """The thresholds for the next proposal, from the last step's rate and marginal cost."""
        unit = max(self.draft_fit.coefficients()[1], 0.0)
        return Budget(self.rate_now, self.marginal, unit, self.accept.calibrate, self.accept.rate)

    def plan(self, live: int, context: float) -> Plan:
        """Whether the `live` rows draft this step: all of them while drafting pays (or before
        anything is known); else only a drafter too cheap to matter, or one row at a probe."""
        plan = self._plan(live, context)
        self.timed, self.last = self.last == "all", plan.rows
        return plan

    def _plan(self, live: int, context: float) -> Plan:
        self.steps += 1
        if self.drafting:
            return Plan("all", self.idle >= PROBE_EVERY)
        probe = self.wait <= 0
        if probe:
            self.wait = self.interval
            self.interval = min(2 * self.interval, PROBE_MAX)
        else:
            self.wait -= 1
        plain = self.plain_time(1, context, live)
        if self.draft_time(self.work) <= CHEAP * plain / live:
            return Plan("all", probe)
        if probe:
            self.turn += 1
            return Plan("one", True, self.turn % live)
        self.skipped += 1
        self.rate_now = live / plain  # what a node must beat: the plain step
        self.marginal = (self.plain_time(2, context, live) - plain) / live
        return Plan("none", False)

    def choose(self, trees: list[DraftTree], context: float, works: list[float], plan: Plan) -> list[DraftTree]:
        """What each row verifies: per row the likeliest nodes first; one width for the batch, the
        one with the most expected tokens per second of the step (the drafting rows' drafting,
        `works` units each, counted in); aux blocks (Lookahead's window) always kept."""
        live = len(trees)
        drafting = [i for i in range(live) if plan.drafts(i)]
        self.chosen = {}
        if not drafting:
            return trees
        orders, values, sums = {}, [], {}
        for i in drafting:
            tree = trees[i]
            if tree.n:
                probs = self.accept.node_probs(tree)
                orders[i] = np.argsort(-probs, kind="stable")  # a parent's chance >= its child's: parents first
                sums[i] = np.cumsum(probs[orders[i]])  # the model's expected tokens of the first 1..n nodes
                expected = np.minimum(self.yield_ * sums[i], np.arange(1, tree.n + 1))
                values.append(np.concatenate([[1.0], 1.0 + expected]))
            else:
                values.append(np.ones(1))
        most = max(len(v) for v in values) - 1
        aux = max((t.aux.k for t in trees if t.aux is not None), default=0)
        verify = self.step_time(np.arange(most + 2) + 1 + aux, context, live)  # 0..most nodes, and one more
        drafted = np.zeros(most + 1)
        for v in values:  # a row's value at k nodes: its first min(k, n) nodes
            drafted[: len(v)] += v
            drafted[len(v):] += v[-1]
        draft = sum(self.draft_time(works[i]) for i in drafting)
        rates = (drafted + (live - len(drafting))) / np.maximum(draft + verify[:-1], 1e-9)
        k = int(np.argmax(rates))
        if plan.probe:
            k = max(k, min(most, 1))
        if most:
            self.idle = 0 if k else self.idle + 1
        self.rate_now = float(rates[k])
        self.marginal = max(float(verify[k + 1] - verify[k]), 0.0) / live
        # The gain of drafting as the drafters did (their work counted in full): every row drafting as
        # the drafting rows did, at the best width, against the plain step.
        each = len(drafting)
        plain = self.plain_time(1, context, live)
        if most:  # at least one node: what drafting buys (none verified is the plain step, less the drafting)
            best = float(np.max(drafted[1:] / (draft + verify[1:-1] * each / live)))
            self._learn_gain(best * plain / live * self.bias(live), sum(works[i] for i in drafting) / each)
        out = list(trees)
        for i in drafting:
            tree = trees[i]
            keep = min(k, tree.n)
            if keep < tree.n:
                kept = sorted(orders[i][:keep].tolist())
                out[i] = tree.prune(kept) if tree.aux is not None else tree.select(kept)
            if keep:  # the model's own expectation, before `yield_` scaled it and the cap at one a node
                self.chosen[i] = (out[i], float(sums[i][keep - 1]))
        return out

    def outcome(self, live: int, tokens: int) -> Callable[[float], None]:
        """Where a whole step's measured seconds go (from its drafting's start to its verdicts, `tokens`
        emitted by `live` rows): against the rate the policy expected of the step (`rate_now`)."""
        key, expected = (self.last != "none", live), self.rate_now

        def seen(seconds: float) -> None:
            sums = self.outcomes.setdefault(key, [0.0, 0.0])
            sums[0] = OUTCOME_DECAY * sums[0] + tokens
            sums[1] = OUTCOME_DECAY * sums[1] + expected * seconds
        return seen

    def bias(self, live: int) -> float:
        """What the models get wrong at `live` rows, measured: drafted steps' measured over expected
        rate, against plain steps' (each PRIOR steps at 1 behind it). The cost curves are timed on
        random tokens and fitted across widths, the acceptance model pools the run: the step's own
        clock says what drafting buys here, on this machine, at this batch size."""
        ratios = []
        for drafted in (True, False):
            got, expected = self.outcomes.get((drafted, live), (0.0, 0.0))
            ratios.append((got + PRIOR * live) / (expected + PRIOR * live))
        return ratios[0] / ratios[1]

    @property
    def drafting(self) -> bool:
        """Whether every row drafts: until GAIN_EVIDENCE drafted steps are known, and while the
        running gain is at least 1."""
        return self.gain is None or self.gains < GAIN_EVIDENCE or self.gain >= 1.0

    def _learn_gain(self, gain: float, work: float) -> None:
        """A drafted step's gain joins the running one; where drafting pays again, probes stop."""
        drafting = self.drafting
        self.gain = gain if self.gain is None else GAIN_MEMORY * self.gain + (1 - GAIN_MEMORY) * gain
        self.gains += 1
        self.work = work
        if not drafting and self.gain < SWITCH_ON:
            self.gain = min(self.gain, 1.0 - 1e-9)  # not drafting: back on only past SWITCH_ON (no flapping)
        if self.drafting:
            self.interval, self.wait = 1, 0

    def select(self, tree: DraftTree, context: float, work: int | None = None) -> DraftTree:
        """One row's choice (batch size 1): `choose` with that row drafting."""
        return self.choose([tree], context, [tree.n if work is None else work], Plan("all", True))[0]

    @property
    def yield_(self) -> float:
        """Accepted tokens of verified drafts over what the acceptance model expected of them. Its
        chances are each node's alone, calibrated over the run; a draft's nodes stand or fall together
        (a copied passage is accepted whole, a wrong guess ends a chain), and what runs of text the
        rows are in now moves the total: this ratio scales the expected tokens of every choice."""
        return self.got / self.expected

    def observe(self, tree: DraftTree, verdict: Verdict, row: int | None = None) -> None:
        """A verified tree's verdict: the acceptance model learns from it, and `yield_` sets what it
        gave against what was expected of it: the expectation `choose` made for batch row `row` when
        that is the tree verified (the one the choice was made on, before any refresh of the model
        between rows), else the model's now (a tree the forward reshaped, or no `choose`)."""
        if tree.n:
            chosen = self.chosen.get(row) if row is not None else None
            if chosen is not None and chosen[0] is tree:
                expected = chosen[1]
            else:
                expected = float(self.accept.node_probs(tree).sum())
            self.got = TOKENS_DECAY * self.got + len(verdict.path)
            self.expected = TOKENS_DECAY * self.expected + expected
        self.accept.observe(tree, verdict)


class StepClock:
    """Seconds of a step's phases for the budget, without stalling a GPU: CPU reads perf counters;
    CUDA records events and hands a span over once its end event has completed (a step or more
    later)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.waiting: list[tuple[Any, Any, Callable[[float], None]]] = []

    def now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def span(self, start: Any, end: Any, use: Callable[[float], None]) -> None:
        """Call `use(seconds)` with the time from `start` to `end` (now on CPU, later on CUDA)."""
        if not self.cuda:
            use(end - start)
            return
        self.waiting.append((start, end, use))
        waiting, self.waiting = self.waiting, []
        for a, b, fn in waiting:
            if b.query():  # asked once per event: it may complete between two asks
                fn(a.elapsed_time(b) / 1e3)
            else:
                self.waiting.append((a, b, fn))

