"""The one draft-verify-accept step that every decode in specbench runs.

A `Row` is one sequence being decoded: its tokens so far, its drafter, its stop rule and its
counters. `Decoder.step` takes the live rows through one step: each row's drafter proposes a
tree under its pending token (cut to the stop rule's depth, the model's context and, under
`budget=auto`, the draft budget); the target scores every row's block in one forward; each row
is verified on its own logits; each row's cache keeps its root and accepted path; each row
takes its accepted tokens and the target's own next token, records its counters, stops or
tells its drafter what was accepted.

Only the forward differs between callers (`Forward`): `OneRow` scores one row on its own cache
(any croppable cache; trees fall back to chains where the model or a sliding window cannot
take a tree mask), `engine.batch.Batched` scores a padded batch on one shared cache. A plain
run (batch size 1), a batched run, the baseline (an empty draft: one target forward per token)
and the zoo card's greedy answers (`autoregressive`) all go through `Decoder.step`, so their
tokens, accepted lengths and step counts cannot drift apart.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.record import TurnStats
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer, Timer
from specbench.engine.api import DraftContext, Drafter, Feedback, GenerationResult, Prefilled, Request, prefill_prompt
from specbench.engine.budget import BudgetPolicy, StepClock
from specbench.engine.target import TargetScorer, keep_rows
from specbench.engine.tree import DraftTree
from specbench.engine.verifier import Verdict, verify

Verify = Callable[[DraftTree, torch.Tensor, SamplingParams], Verdict]


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits: how close greedy decoding was to a tie."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return round(float(top[..., 0] - top[..., 1]), 5)


class NoStats:
    """Counters that record nothing (the baseline's answers record the top-2 margins instead)."""

    def record(self, tree: DraftTree, verdict: Verdict, tree_mode: bool, proposed: int | None = None,
               skipped: bool = False) -> None:
        pass

    def summary(self) -> TurnStats:
        return TurnStats()


class NoDraft(Drafter):
    """The baseline's drafter: nothing, so every step is one autoregressive forward per row."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.empty(ctx.device)


@dataclass
class Row:
    """One sequence in decode. `ctx.tokens` are its generated tokens (the last one is the pending
    root, not yet in the target's cache); `stats` its method's counters (loop.StepStats or
    NoStats); `margins` the baseline's top-2 margins (greedy), None otherwise."""

    ctx: DraftContext
    drafter: Drafter
    stop: StopCriteria
    stats: Any
    margins: list[float] | None = None
    request: Request | None = None
    accept_lengths: list[int] = field(default_factory=list)
    done: bool = False

    def result(self) -> GenerationResult:
        stats = self.stats.summary()
        if self.margins is not None:
            stats.top2_margin = self.margins
        return GenerationResult(self.ctx.tokens, self.accept_lengths, stats)


@dataclass
class Scored:
    """One forward's output for the rows of a step: row i's logits are `logits[i]` (its root,
    nodes and aux rows first; padding after them), its hidden states `hidden_states[k][i]`."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None


class Forward:
    """How a step's rows meet the target: their cached lengths, whether a tree can be scored with
    a tree mask (or must fall back to a chain), the forward, and keeping the accepted entries."""

    def past(self, i: int) -> int:
        raise NotImplementedError

    def prepare(self, i: int, row: Row, tree: DraftTree) -> tuple[DraftTree, bool]:
        """The tree this step verifies for row i and whether it needs the tree mask."""
        raise NotImplementedError

    def score(self, rows: list[Row], trees: list[DraftTree], tree_modes: list[bool]) -> Scored:
        raise NotImplementedError

    def keep(self, verdicts: list[Verdict]) -> None:
        raise NotImplementedError


class RowStates(Sequence):
    """One row's hidden states of a step, (1, rows, d) per layer, sliced when read: a drafter reads
    one layer or three, and a step that drafts nothing reads them for every row."""

    def __init__(self, states: tuple[torch.Tensor, ...], row: int, rows: int) -> None:
        self.states, self.row, self.rows = states, row, rows

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, k: Any) -> Any:  # an int: a tensor; a slice: a tuple, as a tuple does
        if isinstance(k, slice):
            return tuple(self[j] for j in range(*k.indices(len(self))))
        return self.states[k][self.row : self.row + 1, : self.rows]


class Decoder:
    """Runs `step` over rows: the step itself, its timing sections and the draft budget's clock.

    `policy` is the draft budget under `budget=auto` (None: every proposed node is verified),
    shared by the rows; `context` the model's positions (None: unbounded); `margins` the baseline's
    top-2 margin of each emitted token, when wanted.
    """

    def __init__(
        self, verify: Verify, sampling: SamplingParams, timer: Timer, device: torch.device,
        policy: BudgetPolicy | None = None, context: int | None = None,
        margins: Callable[[torch.Tensor], float] | None = None,
    ) -> None:
        self.verify, self.sampling, self.timer = verify, sampling, timer
        self.policy, self.context, self.margins = policy, context, margins
        self.clock = StepClock(device)
        #: when this step's drafting began (the previous step's feedback counts as drafting);
        #: None: at the next step's start (a caller that did other work in between clears it)
        self.drafting: Any = None

    def step(self, rows: list[Row], forward: Forward) -> None:
        """One draft-verify-accept step for `rows`; a row whose stop rule fired is marked done."""
        policy, timer, sampling = self.policy, self.timer, self.sampling
        if policy is not None and self.drafting is None:
            self.drafting = self.clock.now()
        pasts = [forward.past(i) for i in range(len(rows))]
        context = sum(pasts) / len(rows)
        plan = policy.plan(len(rows), context) if policy is not None else None
        trees, proposed, works = [], [], []
        with timer.section("draft"):
            for i, (row, past) in enumerate(zip(rows, pasts, strict=True)):
                ctx = row.ctx
                ctx.max_depth = row.stop.max_new_tokens - len(ctx.tokens) - 1
                if plan is not None and not plan.drafts(i):
                    ctx.max_depth = 0  # the budget's skip: the drafter proposes nothing and does no work
                ctx.budget = policy.budget() if policy is not None else None
                tree = row.drafter.propose(ctx)
                work = tree.n if tree.work is None else tree.work
                tree = tree.truncate(ctx.max_depth)
                if self.context is not None and tree.span > self.context - past:
                    # positions past the model's context (aux rows reach further than the nodes): drop them
                    tree = tree.select(list(range(tree.n))).truncate(self.context - past - 1)
                proposed.append(tree.n)
                works.append(work)
                trees.append(tree)
            if plan is not None:
                trees = policy.choose(trees, context, works, plan)
        if plan is not None:
            drafted = self.clock.now()
            drafting = [w for i, w in enumerate(works) if plan.drafts(i)]
            if drafting:  # a step without drafting tells nothing of the drafter's cost
                self.clock.span(self.drafting, drafted, policy.draft_seen(sum(drafting) / len(drafting),
                                                                          share=1 / len(drafting)))
        modes = []
        for i, row in enumerate(rows):
            trees[i], mode = forward.prepare(i, row, trees[i])
            modes.append(mode)
        with timer.section("verify"):
            scored = forward.score(rows, trees, modes)
            verdicts = [self.verify(tree, scored.logits[i, : tree.n + 1], sampling) for i, tree in enumerate(trees)]
        forward.keep(verdicts)
        if policy is not None:
            done = self.clock.now()
            self.clock.span(drafted, done, policy.verify_seen(max(t.rows for t in trees), context, len(rows)))
            self.clock.span(self.drafting, done, policy.outcome(len(rows), sum(len(v.path) + 1 for v in verdicts)))
            for i, (tree, verdict) in enumerate(zip(trees, verdicts, strict=True)):
                policy.observe(tree, verdict, i)
        self.drafting = None
        for i, (row, tree, verdict) in enumerate(zip(rows, trees, verdicts, strict=True)):
            logits = scored.logits[i]
            tokens = row.ctx.tokens
            start = len(tokens)
            tokens.extend(verdict.tokens)
            tokens.append(verdict.token)
            if row.margins is not None and self.margins is not None:
                row.margins.append(self.margins(logits[:1]))
            row.stats.record(tree, verdict, modes[i], proposed[i] if policy is not None else None,
                             skipped=plan is not None and not plan.drafts(i))
            cut = row.stop.cut(tokens, start)
            if cut is not None:
                del tokens[cut:]
                row.accept_lengths.append(cut - start)
                row.done = True
                continue
            row.accept_lengths.append(len(tokens) - start)
            row.ctx.step += 1
            if policy is not None and self.drafting is None:
                self.drafting = self.clock.now()
            n = tree.n
            with timer.section("draft"):
                row.drafter.accepted(Feedback(
                    tree, verdict, logits[: n + 1],
                    RowStates(scored.hidden_states, i, tree.rows) if scored.hidden_states is not None else None,
                    logits[n + 1 : tree.rows] if tree.aux is not None and modes[i] else None,
                ))


class OneRow(Forward):
    """One row on its own KV cache (any croppable Hugging Face cache). Chains go through the
    model's causal mask; trees take a 4D mask where the model honours one and no sliding window
    is passed, and fall back to their first branch as a chain otherwise (from that step on,
    recorded in the row's counters and warned about once)."""

    def __init__(self, scorer: TargetScorer, cache: Any, past: int, hidden_states: bool = False,
                 label: str = "", path: str = "", drafts: bool = True) -> None:
        if drafts:  # rows that never draft (the baseline) never roll back: any cache serves them
            if not getattr(cache, "is_croppable", True):
                raise SpecbenchError(f"the KV cache of {path or 'the target'} cannot be rolled back; "
                                     "speculative decoding needs a croppable cache")
            record_past = getattr(cache, "activate_past_recording", None)
            if record_past is not None:
                record_past()  # sliding-window layers then keep what a crop (or a tree step) may need
        self.scorer, self.cache, self._past, self.hidden_states = scorer, cache, past, hidden_states
        self.label, self.path = label, path
        self.total = 0

    def past(self, i: int) -> int:
        return self._past

    def prepare(self, i: int, row: Row, tree: DraftTree) -> tuple[DraftTree, bool]:
        if tree.layout.is_chain and tree.aux is None:
            return tree, False
        problem = self.scorer.step_problem(self.cache, self._past, tree)
        if problem is None:
            return tree, True
        stats = row.stats
        if getattr(stats, "fallback", "") is None:
            step = row.ctx.step
            stats.fallback = problem if step == 0 else f"{problem} (from step {step + 1} on)"
            warnings.warn(
                f"{self.label}: the target {self.path} cannot verify token trees ({problem}); "
                "verifying each tree's first branch as a chain instead",
                RuntimeWarning, stacklevel=4,
            )
        return tree.first_branch(), False

    def score(self, rows: list[Row], trees: list[DraftTree], tree_modes: list[bool]) -> Scored:
        tree = trees[0]
        out = self.scorer.score(self.cache, self._past, rows[0].ctx.tokens[-1], tree, tree_modes[0],
                                self.hidden_states)
        self.total = int(out.logits.shape[1])
        return Scored(out.logits, out.hidden_states if self.hidden_states else None)

    def keep(self, verdicts: list[Verdict]) -> None:
        rows = verdicts[0].rows
        keep_rows(self.cache, self._past, self.total, rows)
        self._past += len(rows)


def decode_one(
    decoder: Decoder, forward: OneRow, state: Prefilled, drafter: Drafter, stop: StopCriteria, stats: Any,
    margins: list[float] | None = None,
) -> GenerationResult:
    """Decode one prefilled prompt: `decoder.step` on its one row until its stop rule fires."""
    row = Row(DraftContext(state.input_ids, list(state.tokens), decoder.sampling, forward.scorer.device),
              drafter, stop, stats, margins)
    if stop.cut(row.ctx.tokens, 0) is not None:
        return row.result()
    with decoder.timer.section("draft"):
        drafter.begin(state, decoder.sampling)
    while not row.done:
        decoder.step([row], forward)
    return row.result()


@torch.inference_mode()
def autoregressive(model: torch.nn.Module, prompt: list[int], stop: StopCriteria,
                   sampling: SamplingParams | None = None) -> GenerationResult:
    """One prompt decoded by the target alone, through the shared step with an empty draft (what the
    baseline does, for callers that hold a bare model: the zoo card's greedy answers)."""
    sampling = sampling or SamplingParams()
    weight = next(model.parameters())
    state = prefill_prompt(model, torch.tensor([list(prompt)], dtype=torch.long, device=weight.device), sampling)
    decoder = Decoder(verify, sampling, CpuTimer(), weight.device)
    forward = OneRow(TargetScorer(model, weight.device, weight.dtype), state.cache, len(prompt), drafts=False)
    return decode_one(decoder, forward, state, NoDraft(), stop, NoStats())
