"""The interface every decoding method fills in.

A method is split the way the runner times it: `prefill` runs the target over the prompt
and picks the first new token (time to first token), `decode` produces the rest. Methods
never read clocks and never write files: the runner owns timing and I/O. They may open
named sections on the timer they are given (`with timer.section("draft"): ...`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.core.errors import SpecbenchError
from specbench.core.questions import Question
from specbench.core.record import TurnStats
from specbench.core.sampling import SamplingParams, next_token
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine.tree import DraftTree
from specbench.engine.verifier import Verdict
from specbench.models import LoadedModel, new_cache

#: the engine's decoding version: raised when a change makes any method emit other tokens for the same
#: inputs (never for speed alone), so a resumed run never mixes answers of two versions (a run's identity)
DECODING_VERSION = 1


@dataclass
class Prefilled:
    """State after the prompt: the prompt ids, the first new token, the target's KV cache."""

    input_ids: torch.Tensor  # (1, prompt_len)
    tokens: list[int]  # generated so far (the first token)
    cache: Any = None
    logits: torch.Tensor | None = None  # (1, vocab) logits that produced tokens[-1]
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific state (hidden states...)


@dataclass
class Request:
    """One prompt for batched decoding: the caller's `key`, the prompt ids (1, len), its stop rule."""

    key: Any
    input_ids: torch.Tensor
    stop: StopCriteria


class Requests:
    """The caller's side of `Method.generate_batch`: the prompts waiting, and where results go.

    The method takes prompts with `pop` while it has free rows (None: nothing waits now) and
    hands each finished one to `finished`, which may queue more (a conversation's next turn):
    the method keeps going until nothing is live and nothing waits.
    """

    def pop(self) -> Request | None:
        raise NotImplementedError

    def finished(self, request: Request, result: GenerationResult) -> None:
        raise NotImplementedError

    def started(self, request: Request) -> None:
        """The request's prompt is prefilled and its first token chosen (time to first token)."""


class RequestList(Requests):
    """Requests from a list, results collected by key (tests; a static batch)."""

    def __init__(self, requests: list[Request]) -> None:
        self.waiting = list(reversed(requests))
        self.results: dict[Any, GenerationResult] = {}

    def pop(self) -> Request | None:
        return self.waiting.pop() if self.waiting else None

    def finished(self, request: Request, result: GenerationResult) -> None:
        self.results[request.key] = result


@dataclass
class GenerationResult:
    """What decode returns.

    tokens: every new token id, the first one included, truncated at the stop rule (an EOS
    that stopped generation is kept). accept_lengths: one entry per target forward after the
    prefill, the tokens that step emitted (bonus token included): all 1 for autoregressive
    decoding. So `len(tokens) == 1 + sum(accept_lengths)`. stats: the turn's draft
    statistics for the answer file (specbench.core.record.TurnStats).
    """

    tokens: list[int]
    accept_lengths: list[int]
    stats: TurnStats = field(default_factory=TurnStats)


#: Keys every method config has besides its settings: they name, build and describe the method, and
#: `train` holds a trained-head method's training settings (specbench.heads.recipe).
COMMON_KEYS = ("name", "impl", "facts", "suites", "train")


@dataclass
class NoSettings:
    """A method without settings of its own."""


def parse_settings(schema: type, cfg: DictConfig | None, method: str = "", engine_keys: tuple[str, ...] = ()) -> Any:
    """The method config's settings (every key but COMMON_KEYS and the `engine_keys` the engine
    reads itself) as an instance of the `schema` dataclass: types checked, unknown and missing
    keys refused, each with a one-line error."""
    values = {k: v for k, v in (OmegaConf.to_container(cfg, resolve=True) if cfg is not None else {}).items()
              if k not in COMMON_KEYS and k not in engine_keys and k != "defaults"}
    known = [f.name for f in fields(schema)]
    label = f"method '{method}'" if method else schema.__name__
    for key in values:
        if key not in known:
            raise SpecbenchError(f"{label} has no setting '{key}'; its settings: {', '.join(known) or 'none'}")
    try:
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as exc:
        detail = str(exc).strip().splitlines()[0]
        key = f" '{exc.full_key}'" if getattr(exc, "full_key", None) else ""  # OmegaConf's first line omits it
        raise SpecbenchError(f"{label}: bad setting{key}: {detail} (fix it in the method's YAML or override)") from None
    check_ranges(settings, label)
    return settings


def check_ranges(settings: Any, label: str) -> None:
    """Counts and sizes are positive integers, other numbers finite and >= 0, unless a field's
    metadata gives its own `min` / `max` (e.g. `field(metadata={"min": 0})`)."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low = f.metadata.get("min", 1 if isinstance(value, int) else 0)
        high = f.metadata.get("max")
        if not math.isfinite(value) or value < low or (high is not None and value > high):
            bound = f">= {low}" + (f" and <= {high}" if high is not None else "")
            raise SpecbenchError(f"{label}: setting '{f.name}' must be {bound}, got {value!r} "
                                 "(fix it in the method's YAML or override)")


@torch.inference_mode()
def prefill_prompt(model: torch.nn.Module, input_ids: torch.Tensor, sampling: SamplingParams) -> Prefilled:
    """The target alone over the prompt (1, len) on a fresh cache; its first new token from the last position."""
    cache = new_cache(model.config)
    logits = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
    return Prefilled(input_ids=input_ids, tokens=[int(next_token(logits, sampling)[0])], cache=cache, logits=logits)


class Method:
    """Base class: holds the target, prefills with the target alone."""

    #: whether prefill and decode are separate calls (False for wrappers of model.generate)
    splits_prefill: bool = True
    #: the dataclass of the method's settings (types and meaning; the method's YAML gives the values)
    Settings: type = NoSettings
    #: why the method cannot decode batches (`run batch_size=B` refuses it at start), None when it
    #: can through `generate_batch`
    batch_problem: str | None = "it has no batched decoding"
    #: method-config keys the engine reads besides the method's Settings (`budget` for the shared loop)
    engine_keys: tuple[str, ...] = ()

    def __init__(self, target: LoadedModel, cfg: DictConfig, model_cfg: DictConfig) -> None:
        self.target = target
        self.cfg = cfg  # the method's config group
        self.model_cfg = model_cfg  # the model's config group (draft path, template, ...)
        self.settings = parse_settings(self.Settings, cfg, str(cfg.get("name", "")) if cfg is not None else "",
                                       self.engine_keys)

    def extra_parameters(self) -> int:
        """Parameters the method adds to the target (draft model, heads), counted from the
        loaded modules; 0 for training-free methods."""
        return 0

    def provenance(self) -> list[dict[str, str]]:
        """Where the method's loaded heads came from (specbench.heads.checkpoint.head_record: what
        `method.head` named, the format and variant recognised, the weight file's sha256), for meta.json."""
        loaded = (getattr(self, name, None) for name in ("head", "heads"))
        return [dict(m.provenance) for m in loaded if isinstance(getattr(m, "provenance", None), dict)]

    def reset(self) -> None:
        """Forget state carried across questions (called at the start of every run)."""

    def start_question(self) -> None:
        """A question (or, batched, a batch of questions) starts: state that only tunes decoding (SpS's
        heuristic K) starts over, so that a question's answer and statistics depend on it alone, never
        on which questions ran before it (a subset of the questions, or a resumed run, gives the same
        numbers as the whole uninterrupted run). What a method learns from the stream by design
        (Online Speculative Decoding's draft, Token Recycling's adjacency, the budget's acceptance)
        is kept."""

    def prepare(self, batch_size: int, longest: int | None = None) -> None:
        """Before a run's warm-up, untimed: measure what the method needs of the device at this
        batch size and for steps over up to `longest` cached positions (the draft budget's cost
        curve; None: not known)."""

    def start_stream(self) -> None:
        """The timed question stream of a run starts (after the warm-up): a method that learns
        from the questions it has answered (Online Speculative Decoding) starts over here."""

    def stream(self, questions: list[Question]) -> list[Question]:
        """The order in which a run answers its questions: the file's, unless the method learns
        from the stream and asks for another (answers are keyed by question id, so the order
        changes no per-question number)."""
        return questions

    def prefill(self, input_ids: torch.Tensor, sampling: SamplingParams) -> Prefilled:
        return prefill_prompt(self.target.model, input_ids, sampling)

    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        raise NotImplementedError

    def generate_batch(self, requests: Requests, slots: int, sampling: SamplingParams, timer: Timer) -> None:
        """Answer the requests with up to `slots` rows decoded together (one target forward per
        step for all of them), until none is live and none waits. The runner has started `timer`;
        the method times sections on it ("prefill", "draft", "verify")."""
        raise SpecbenchError(f"{type(self).__name__} cannot decode batches: {self.batch_problem}")


@dataclass
class DraftContext:
    """What a drafter sees when it proposes.

    tokens is the engine's live list of generated tokens (read it, don't change it);
    tokens[-1] is the root of the tree to propose, not yet in the target's cache. Nodes
    deeper than max_depth are cut by the engine: they could only be accepted past the stop
    rule's token budget, so a drafter saves work by not drafting them. max_depth <= 0: propose
    nothing (an empty tree) and do no drafting work, because the answer ends here or because the
    draft budget skips this step (`method.budget=auto` where drafting does not pay); a drafter that
    follows the text catches up at its next proposal (`ctx.tokens` holds every token).
    """

    input_ids: torch.Tensor  # (1, prompt_len)
    tokens: list[int]
    sampling: SamplingParams
    device: torch.device
    max_depth: int = 0
    step: int = 0
    budget: Any = None  # engine.budget.Budget under `method.budget=auto`, else None


@dataclass
class Feedback:
    """What the engine tells the drafter after a verified step.

    tree: the tree as verified (after depth cuts or the chain fallback); verdict: the
    accepted path, its tokens and the target's next token (the next root); logits: (n + 1, V)
    target logits of the root and the nodes (row 0 = root), e.g. for token recycling;
    hidden_states: the target's per-layer hidden states (1, rows, H) of the whole block when
    the drafter asked for them (keep `verdict.rows`), e.g. for EAGLE / Medusa heads;
    aux_logits: logits of the drafter's aux positions (Lookahead / Jacobi).
    """

    tree: DraftTree
    verdict: Verdict
    logits: torch.Tensor
    hidden_states: Sequence[torch.Tensor] | None = None  # indexed like a tuple (engine.decode.RowStates)
    aux_logits: torch.Tensor | None = None


class Drafter:
    """Proposes draft trees; one instance per method, reused across generate calls."""

    #: ask the engine for the target's hidden states (prefill: `state.extra["hidden_states"]`)
    needs_hidden_states: bool = False

    def reset(self) -> None:
        """Forget state carried across calls (start of every run)."""

    def start_question(self) -> None:
        """A question starts (Method.start_question): per-question tuning state starts over."""

    def fork(self) -> Drafter:
        """A drafter for one row of a batch. It shares the weights and whatever persists across
        calls; `begin` then gives it its own per-call state (caches, pools). The default is a
        shallow copy, right for drafters whose `begin` assigns fresh per-call objects; a drafter
        that changes per-call state in place (clears a pool, fills a buffer) overrides this."""
        return copy.copy(self)

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        """A generate call starts: the target has prefilled the prompt and chose state.tokens[0]."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        raise NotImplementedError

    def accepted(self, feedback: Feedback) -> None:
        """The step was verified (not called after the step that ends generation)."""
