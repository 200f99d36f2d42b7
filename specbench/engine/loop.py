"""The speculative method every drafter plugs into: its settings, its draft budget, and its decode,
which is the engine's one draft-verify-accept step (engine.decode) at batch size 1 and in batches.

Per step: the drafter proposes a `DraftTree` under the pending token (the root); the target
scores root + nodes in one forward; a verifier picks the accepted path and the target's own
next token; the KV cache keeps exactly the root and the accepted path; the drafter is told
what was accepted. The next token becomes the new root, so each step emits the accepted
draft tokens plus one token of the target's own (the "bonus").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from specbench.core.errors import SpecbenchError
from specbench.core.record import TurnStats
from specbench.core.sampling import SamplingParams, next_token
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine.api import (
    Drafter,
    GenerationResult,
    Method,
    Prefilled,
    Request,
    Requests,
)
from specbench.engine.batch import BatchDecoder
from specbench.engine.budget import BUDGET_MODES, BudgetPolicy, policy_curves
from specbench.engine.decode import Decoder, OneRow, decode_one
from specbench.engine.target import TargetScorer, model_context
from specbench.engine.tree import DraftTree
from specbench.engine.verifier import Verdict, verify
from specbench.models import LoadedModel


@dataclass
class StepStats:
    """Per-call counters for the answer file: compact, JSON-ready."""

    draft_lengths: list[int] = field(default_factory=list)  # nodes verified per step
    draft_depths: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per step (before the stop cut)
    proposed: list[int] = field(default_factory=list)  # nodes the drafter proposed per step (budget=auto)
    tree_steps: int = 0
    fallback: str | None = None
    skipped: int = 0  # steps on which the draft budget drafted nothing for this row (budget=auto)

    def record(self, tree: DraftTree, verdict: Verdict, tree_mode: bool, proposed: int | None = None,
               skipped: bool = False) -> None:
        self.skipped += skipped
        self.draft_lengths.append(tree.n)
        self.draft_depths.append(tree.layout.max_depth)
        self.accepted.append(len(verdict.path))
        self.tree_steps += tree_mode
        if proposed is not None:
            self.proposed.append(proposed)

    def summary(self) -> TurnStats:
        """Totals, per-step draft lengths, and per-position acceptance: position_drafted[d] is
        the number of steps whose draft reached depth d + 1, position_accepted[d] how many of
        them had it accepted."""
        depth = max(self.draft_depths, default=0)
        tree = self.draft_depths != self.draft_lengths  # trees: depth and size differ
        return TurnStats(
            steps=len(self.draft_lengths), drafted_tokens=sum(self.draft_lengths), accepted_tokens=sum(self.accepted),
            draft_lengths=self.draft_lengths,
            position_drafted=[sum(d > i for d in self.draft_depths) for i in range(depth)],
            position_accepted=[sum(a > i for a in self.accepted) for i in range(depth)],
            draft_depths=self.draft_depths if tree else None,
            tree_steps=self.tree_steps if tree or self.tree_steps or self.fallback else None,  # aux rows need it
            tree_fallback=self.fallback or None,
            # the draft budget chose the verified nodes (draft_lengths) out of these
            budget="auto" if self.proposed else None, proposed_lengths=self.proposed or None,
            counters={"budget_skipped": self.skipped} if self.proposed else {})


class Annotated(Requests):
    """Requests whose results pass through a method's `annotate` on the way back."""

    def __init__(self, inner: Requests, annotate: Callable[[GenerationResult], GenerationResult]) -> None:
        self.inner, self.annotate = inner, annotate

    def pop(self) -> Request | None:
        return self.inner.pop()

    def finished(self, request: Request, result: GenerationResult) -> None:
        self.inner.finished(request, self.annotate(result))

    def started(self, request: Request) -> None:
        self.inner.started(request)


class SpeculativeMethod(Method):
    """A Method whose decode is the shared speculative loop; subclasses supply `build_drafter`.

    Tests and experiments may pass a drafter directly instead.
    """

    engine_keys = ("budget",)

    def __init__(
        self, target: LoadedModel, cfg: DictConfig, model_cfg: DictConfig, drafter: Drafter | None = None
    ) -> None:
        super().__init__(target, cfg, model_cfg)
        self.budget_mode = str(cfg.get("budget", "fixed")) if cfg is not None else "fixed"
        if self.budget_mode not in BUDGET_MODES:
            raise SpecbenchError(f"method '{cfg.get('name', '')}': budget must be one of {', '.join(BUDGET_MODES)}, "
                                 f"got {self.budget_mode!r} (set method.budget=auto or method.budget=fixed)")
        self.drafter = drafter if drafter is not None else self.build_drafter()
        self.scorer = TargetScorer(target.model, target.device, target.dtype)
        self.context = model_context(target.model.config)
        self.policies: dict[int, BudgetPolicy] = {}
        self.longest: int | None = None  # the cached positions the run's steps reach (prepare)

    def prepare(self, batch_size: int, longest: int | None = None) -> None:
        self.longest = longest
        self.policy(batch_size)

    def policy(self, batch_size: int) -> BudgetPolicy | None:
        """The draft budget at this batch size under `budget=auto` (None under `fixed`): its cost
        curve measured on first use (or read from the cache; at the run's length bucket where `prepare`
        was told the positions its steps reach), its acceptance learned in the run."""
        if self.budget_mode != "auto":
            return None
        if batch_size not in self.policies:
            curves = policy_curves(self.target, batch_size, self.context, self.longest)
            self.policies[batch_size] = BudgetPolicy(curves[batch_size], curves)
        return self.policies[batch_size]

    #: batched decoding: every drafter that keeps its per-call state per fork (see Drafter.fork)
    batch_problem: str | None = None

    def build_drafter(self) -> Drafter:
        raise NotImplementedError

    def annotate(self, result: GenerationResult) -> GenerationResult:
        """A hook for what a method adds to every result's stats (batched or not)."""
        return result

    def generate_batch(self, requests: Requests, slots: int, sampling: SamplingParams, timer: Timer) -> None:
        if self.batch_problem is not None:
            return super().generate_batch(requests, slots, sampling, timer)
        decoder = BatchDecoder(self.target, self.drafter.fork, self.verify_step, sampling, timer, StepStats,
                               context=self.context, hidden_states=self.drafter.needs_hidden_states,
                               policy=self.policy(slots))
        decoder.run(Annotated(requests, self.annotate), slots)
        return None

    def reset(self) -> None:
        self.drafter.reset()
        # a run's policies start anew (acceptance, fits, outcomes); their curves are kept
        self.policies = {b: BudgetPolicy(p.curve, p.curves) for b, p in self.policies.items()}

    def start_question(self) -> None:
        self.drafter.start_question()

    def verify_step(self, tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams) -> Verdict:
        """Which path of `tree` the target accepts (logits: root row, then one row per node). The
        engine's exact, lossless verification; a method may override it only for a lossy option
        that is labelled as such (methods.specdec's top-beta)."""
        return verify(tree, logits, sampling)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, sampling: SamplingParams) -> Prefilled:
        if not self.drafter.needs_hidden_states:
            return super().prefill(input_ids, sampling)
        cache = self.target.new_cache()
        out = self.target.model(
            input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=True
        )
        logits = out.logits[:, -1, :]
        first = int(next_token(logits, sampling)[0])
        return Prefilled(input_ids, [first], cache, logits, {"hidden_states": out.hidden_states})

    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        return self.annotate(self._decode(state, sampling, stop, timer))

    @torch.inference_mode()
    def _decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        decoder = Decoder(self.verify_step, sampling, timer, self.target.device, self.policy(1), self.context)
        forward = OneRow(self.scorer, state.cache, int(state.input_ids.shape[1]), self.drafter.needs_hidden_states,
                         type(self).__name__, str(self.target.path))
        return decode_one(decoder, forward, state, self.drafter, stop, StepStats())
