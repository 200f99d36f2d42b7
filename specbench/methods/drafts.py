"""Independent draft models, shared by the methods that draft with one (sps, specinfer,
online_spec, specdec, hf_assisted, recycling): loading a draft and checking its vocabulary against
the target's, fitting its logits to the target's width, and SpS's chain drafter.
"""

from __future__ import annotations

import copy

import torch
from omegaconf import DictConfig

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams, probs_from_logits, sample
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback
from specbench.engine.api import Prefilled
from specbench.models import LoadedModel, load_model

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
#: the longest chain the draft budget drafts when `max_speculative_tokens` sets no cap
AUTO_MAX_TOKENS = 16


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel, spec: str) -> None:
    """Refuse a draft whose tokenizer maps tokens to ids differently from the target's.

    Tokens both tokenizers have must have the same id; tokens only one has must be added
    (special) tokens whose ids the other leaves unused (e.g. Qwen2's tokenizer class adds
    `<|endoftext|>` to any vocabulary).
    """
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    added = set(target.tokenizer.get_added_vocab()) | set(draft.tokenizer.get_added_vocab())
    problems = [tok for tok in target_vocab.keys() & draft_vocab.keys() if target_vocab[tok] != draft_vocab[tok]]
    for mine, other in ((target_vocab, draft_vocab), (draft_vocab, target_vocab)):
        used = set(other.values())
        problems += [tok for tok in mine.keys() - other.keys() if tok not in added or mine[tok] in used]
    if problems:
        raise SpecbenchError(
            f"draft '{spec}' does not share the target's tokenizer ({len(draft_vocab)} vs {len(target_vocab)} tokens, "
            f"{len(problems)} differ); a draft must use the target's vocabulary"
        )


def load_draft(
    target: LoadedModel, draft: str | None, model_cfg: DictConfig, method: str
) -> tuple[LoadedModel, str]:
    """The draft named by the method's `draft` setting, else by the model config's `draft`,
    checked against the target."""
    spec = draft or model_cfg.get("draft")
    if not spec:
        raise SpecbenchError(f"method {method} needs a draft model; set model.draft=... or method.draft=...")
    draft = load_model(
        str(spec), device=target.device, dtype=target.dtype,
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
    )
    check_same_vocabulary(target, draft, str(spec))
    return draft, str(spec)


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits over the target's logit width (checkpoints pad their heads differently)."""
    width = logits.shape[-1]
    if width > vocab:
        return logits[..., :vocab]
    if width < vocab:
        return torch.nn.functional.pad(logits, (0, vocab - width), value=float("-inf"))
    return logits


def unseen_tokens(ctx: DraftContext, cached: int) -> torch.Tensor:
    """What a draft whose own cache holds `cached` tokens has not seen yet: (the rest of the prompt and)
    the tokens generated since its last crop, on the context's device."""
    prompt_len = int(ctx.input_ids.shape[1])
    new = torch.tensor(ctx.tokens[max(0, cached - prompt_len) :], dtype=torch.long, device=ctx.device)
    if cached < prompt_len:
        new = torch.cat([ctx.input_ids[0, cached:].to(ctx.device), new])
    return new


def logits_width(model: LoadedModel) -> int:
    """How many logits the model's head produces (may exceed len(tokenizer): padded heads)."""
    head = model.model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.model.config.get_text_config().vocab_size)


class SpsDrafter(Drafter):
    """Drafts a chain of K tokens with a small model that shares the target's tokenizer.

    schedule: "constant" keeps K; "heuristic" adds 2 after a fully accepted draft and
    subtracts 1 (down to 1) otherwise, carried across calls (the turns of a question) as
    transformers' assisted generation carries it, but restarted with every question
    (`start_question`: transformers would carry it on to the next question too, so a question's
    numbers would depend on the ones answered before it); "heuristic_transient" restarts every call.
    """

    def __init__(
        self, draft: LoadedModel, num_tokens: int, vocab_size: int, schedule: str = "constant",
        max_tokens: int | None = None,
    ) -> None:
        if num_tokens < 1:
            raise SpecbenchError(f"num_speculative_tokens must be >= 1, got {num_tokens}")
        if schedule not in SCHEDULES:
            raise SpecbenchError(f"unknown schedule '{schedule}'; use one of {', '.join(SCHEDULES)}")
        self.draft = draft
        self.k0 = num_tokens
        self.vocab_size = vocab_size
        self.schedule = schedule
        self.max_tokens = max_tokens
        self.schedule_state = {"k": num_tokens}  # K across calls: shared with the forks of a batch (see fork)
        self.cache = None
        self.cached = 0  # tokens (prompt + generated) the draft cache holds
        self.drafted = 0  # chain length of the last proposal
        self.sampling = SamplingParams()

    @property
    def k(self) -> int:
        return self.schedule_state["k"]

    @k.setter
    def k(self, value: int) -> None:
        self.schedule_state["k"] = value

    def reset(self) -> None:
        self.k = self.k0

    def start_question(self) -> None:
        self.k = self.k0

    def fork(self) -> SpsDrafter:
        """A row's drafter: under the heuristic schedule K is carried across calls, so the rows share
        it (at batch size 1 the batched loop then drafts exactly as the plain one); under
        heuristic_transient each call (row) starts its own."""
        twin = copy.copy(self)
        if self.schedule == "heuristic_transient":
            twin.schedule_state = dict(self.schedule_state)
        return twin

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        # The draft's prompt prefill happens in the first propose, merged with the first token.
        self.cache = self.draft.new_cache()
        record_past = getattr(self.cache, "activate_past_recording", None)
        if record_past is not None:
            record_past()  # a sliding-window draft can then be cropped too
        self.cached = 0
        self.sampling = sampling
        if self.schedule == "heuristic_transient":
            self.k = self.k0

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.draft.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
        return fit_vocab(out.logits[0, -1], self.vocab_size)

    def propose(self, ctx: DraftContext) -> DraftTree:
        budget = ctx.budget
        greedy = self.sampling.greedy
        if budget is None:
            k = min(self.k, ctx.max_depth)
        else:  # the draft budget: as long as the next token is still worth drafting (up to the cap)
            k = min(self.max_tokens or AUTO_MAX_TOKENS, ctx.max_depth)
            if not greedy:  # sampled: decided before drawing, from the running rates alone (lossless)
                k = min(k, budget.depth)
        self.drafted = max(k, 0)
        if k <= 0:
            return DraftTree.empty(ctx.device)
        new = unseen_tokens(ctx, self.cached)
        drafted: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        confidence: list[torch.Tensor] = []
        reach = 1.0
        logits = self._step(new[None])
        for i in range(k):
            # Tokens stay on the device: no host sync while drafting (but for the budget's stop).
            if greedy:
                token = logits.argmax(-1)
                if budget is not None:
                    confidence.append(torch.softmax(logits.float(), -1)[token])
                    reach *= float(budget.calibrate(confidence[-1].view(1))[0])
            else:
                p = probs_from_logits(logits, self.sampling)
                token = sample(p)
                probs.append(p)
            drafted.append(token)
            if i == k - 1 or (budget is not None and greedy and not budget.extend(torch.tensor([reach]), i + 2)):
                break
            logits = self._step(token.view(1, 1))
        self.drafted = len(drafted)
        # the draft's cache: the prompt, the tokens so far and every drafted token but the last (never fed)
        self.cached = int(ctx.input_ids.shape[1]) + len(ctx.tokens) + len(drafted) - 1
        tree = DraftTree.chain(torch.stack(drafted), torch.stack(probs) if probs else None,
                               torch.stack(confidence) if confidence else None)
        tree.work = len(drafted)  # draft forwards
        return tree

    def accepted(self, feedback: Feedback) -> None:
        m = len(feedback.verdict.path)
        if self.drafted > 0:
            # The cache holds the root and draft tokens 1..K-1; keep the root and the accepted ones.
            keep = self.cached - (self.drafted - 1) + min(m, self.drafted - 1)
            if keep < self.cached:
                self.cache.crop(keep - self.cached)
                self.cached = keep
        if self.schedule != "constant" and self.drafted > 0:
            self.k = self.k + 2 if m == self.drafted else max(1, self.k - 1)
            if self.max_tokens:
                self.k = min(self.k, int(self.max_tokens))
