"""Online Speculative Decoding: the draft model keeps being distilled on the target's outputs
while the benchmark runs (Liu et al. 2024).

Drafting and verification are SpS's (a chain of K tokens from the draft model, verified by the
shared engine, so the output stays the target's). What is added: every verified step hands the
drafter the target's logits at the positions it emitted, and the drafter keeps, per answered turn,
the prompt, the emitted tokens and the target's top-k distribution at each of them. The last
`buffer_size` turns form a replay buffer; every `update_every` turns the draft takes
`steps_per_update` AdamW steps on it, minimising the cross-entropy from the target's (renormalised
top-k) distribution to its own, i.e. forward KL distillation as in the paper's default.

The update runs at the start of the next turn's decode, inside the timed "draft" section, so its
cost is in the method's time and in its speedup; each answer records how many updates ran in it
and their seconds. The stream starts over (the draft's initial weights, an empty buffer) when the
timed question stream of a run starts, after the warm-up; a resumed run starts over too (the
adapted weights are not saved), which its answers' `online_updates` counts show.

The run answers the questions round-robin over the subtasks (`stream: interleaved`, the default),
so that every stretch of the stream mixes the subtasks alike and a rise of acceptance along it is
the updates' doing, not the next subtask's; `stream: file` keeps the file's order (subtask after
subtask, a domain shift at each boundary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specbench.core.errors import SpecbenchError
from specbench.core.questions import Question, interleave
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import Timer
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import GenerationResult, Prefilled
from specbench.methods.drafts import SpsDrafter, load_draft, logits_width


@dataclass
class OnlineSpecSettings:
    """`method=online_spec`."""

    draft: str | None  # draft model: hub id, folder or zoo:NAME; None = the model config's `draft`
    num_speculative_tokens: int  # K, draft tokens per step (the starting K under a heuristic schedule)
    schedule: str  # constant | heuristic | heuristic_transient, as SpS
    update_every: int  # answered turns between two updates of the draft
    buffer_size: int  # turns kept in the replay buffer (the newest)
    steps_per_update: int  # AdamW steps per update
    batch_turns: int  # turns per step (each its own forward; gradients summed)
    lr: float = field(metadata={"max": 1.0})  # AdamW learning rate of the updates
    top_k: int  # entries of the target's distribution kept per emitted token
    max_tokens_per_turn: int  # emitted tokens of a turn kept for training (its first ones)
    stream: str  # question order: interleaved (round-robin over subtasks) | file


@dataclass
class Turn:
    """One answered turn in the replay buffer: prompt + emitted tokens, and for the first
    `len(teacher_ids)` emitted tokens the target's top-k ids and probabilities before each."""

    ids: list[int]
    prompt_len: int
    teacher_ids: torch.Tensor  # (n, k) long
    teacher_probs: torch.Tensor  # (n, k) float, rows sum to 1


class OnlineDrafter(SpsDrafter):
    """SpS's drafter whose draft model is updated on the target's outputs every few turns."""

    def __init__(self, draft, settings: OnlineSpecSettings, vocab_size: int) -> None:
        super().__init__(draft, num_tokens=settings.num_speculative_tokens, vocab_size=vocab_size,
                         schedule=settings.schedule)
        self.s = settings
        self.initial = {k: v.detach().clone() for k, v in draft.model.state_dict().items()}
        self.buffer: list[Turn] = []
        self.turns = 0  # turns finished since the stream started
        self.optimizer: torch.optim.Optimizer | None = None
        self.live: tuple[torch.Tensor, list[int]] | None = None  # the current turn's prompt and token list
        self.teacher: list[tuple[torch.Tensor, torch.Tensor]] = []  # per emitted token: top-k ids, probs
        self.updates = 0  # updates run in the current turn (the answer records them)
        self.update_seconds = 0.0
        self.began = False  # whether the current turn reached begin() (a 1-token turn does not)
        self.total_updates = 0

    # -- the stream -------------------------------------------------------------------------------

    def start_stream(self) -> None:
        """Back to the initial draft and an empty buffer."""
        with torch.no_grad():
            self.draft.model.load_state_dict(self.initial)
        self.buffer = []
        self.turns = 0
        self.optimizer = None
        self.live = None
        self.teacher = []
        self.total_updates = 0

    def reset(self) -> None:
        super().reset()
        self.start_stream()

    def _topk(self, logits: torch.Tensor) -> None:
        """Keep the target's top-k distribution for the next emitted token(s): logits (rows, V)."""
        k = min(int(self.s.top_k), logits.shape[-1])
        values, ids = logits.float().topk(k, dim=-1)
        probs = torch.softmax(values, dim=-1)
        for row in range(logits.shape[0]):
            self.teacher.append((ids[row].cpu(), probs[row].cpu()))

    def _finish_turn(self) -> None:
        """The previous turn ended: into the buffer with what the target said about its tokens."""
        if self.live is None:
            return
        prompt, tokens = self.live
        n = min(len(self.teacher), len(tokens), int(self.s.max_tokens_per_turn))
        if n > 0:
            self.buffer.append(Turn(
                ids=prompt.tolist() + tokens[:n], prompt_len=len(prompt),
                teacher_ids=torch.stack([t[0] for t in self.teacher[:n]]),
                teacher_probs=torch.stack([t[1] for t in self.teacher[:n]]),
            ))
            del self.buffer[: max(0, len(self.buffer) - int(self.s.buffer_size))]
        self.live = None
        self.teacher = []
        self.turns += 1

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self._finish_turn()
        self.began = True
        if self.buffer and self.turns > 0 and self.turns % int(self.s.update_every) == 0:
            self.update()
        super().begin(state, sampling)
        self.live = (state.input_ids[0].detach().cpu(), state.tokens)
        if state.logits is not None:
            self._topk(state.logits[-1:])

    def propose(self, ctx: DraftContext) -> DraftTree:
        if self.live is not None:
            self.live = (self.live[0], ctx.tokens)  # the engine's live list (the turn's tokens so far)
        return super().propose(ctx)

    def accepted(self, feedback: Feedback) -> None:
        # Rows of the root and the accepted nodes: the target's distribution of each emitted token.
        self._topk(feedback.logits[feedback.verdict.rows])
        super().accepted(feedback)

    # -- the update -------------------------------------------------------------------------------

    def update(self) -> None:
        """`steps_per_update` AdamW steps over turns drawn from the buffer (newest first, cycling)."""
        start = time.perf_counter()
        model = self.draft.model
        with torch.inference_mode(False), torch.enable_grad():
            params = [p for p in model.parameters()]
            for p in params:
                p.requires_grad_(True)
            if self.optimizer is None:
                # float16 rounds AdamW's default eps (1e-8) to 0: a parameter with a zero gradient would get
                # 0 / 0 = NaN (e.g. the embedding rows of tokens not in the turns); 1e-4 is representable
                eps = 1e-4 if params[0].dtype == torch.float16 else 1e-8
                self.optimizer = torch.optim.AdamW(params, lr=float(self.s.lr), weight_decay=0.0, eps=eps)
            model.train()
            order = list(range(len(self.buffer) - 1, -1, -1))
            at = 0
            try:
                for _ in range(int(self.s.steps_per_update)):
                    self.optimizer.zero_grad(set_to_none=True)
                    count = min(int(self.s.batch_turns), len(order))
                    for _ in range(count):
                        self._loss(self.buffer[order[at % len(order)]]).div(count).backward()
                        at += 1
                    self.optimizer.step()
            finally:
                model.eval()
                for p in params:
                    p.requires_grad_(False)
        self.updates += 1
        self.total_updates += 1
        self.update_seconds += time.perf_counter() - start

    def _loss(self, turn: Turn) -> torch.Tensor:
        """Cross-entropy from the target's top-k distribution to the draft's at each emitted token."""
        n = turn.teacher_ids.shape[0]
        ids = torch.tensor([turn.ids[: turn.prompt_len + n - 1]], dtype=torch.long, device=self.draft.device)
        logits = self.draft.model(input_ids=ids, use_cache=False).logits[0, turn.prompt_len - 1 :].float()
        logits = logits[:, : self.vocab_size]
        logp = F.log_softmax(logits, dim=-1)
        teacher_ids = turn.teacher_ids.clone().to(logp.device)
        teacher_ids = teacher_ids.clamp(max=logp.shape[-1] - 1)
        teacher_probs = turn.teacher_probs.clone().to(logp.device)
        return -(teacher_probs * logp.gather(-1, teacher_ids)).sum(-1).mean()


STREAMS = ("interleaved", "file")


class OnlineSpec(SpeculativeMethod):
    """`method=online_spec`: SpS whose draft keeps being distilled on the target's outputs."""

    Settings = OnlineSpecSettings
    batch_problem = ("it learns from the stream one turn at a time (each update trains the draft on the "
                     "answers before it), which a batch of simultaneous answers has no order for")

    def build_drafter(self) -> Drafter:
        s = self.settings
        if s.stream not in STREAMS:
            raise SpecbenchError(f"method 'online_spec': stream must be one of {', '.join(STREAMS)}, got "
                                 f"'{s.stream}' (fix it in the method's YAML or override)")
        draft, _ = load_draft(self.target, s.draft, self.model_cfg, "online_spec")
        return OnlineDrafter(draft, s, vocab_size=logits_width(self.target))

    def extra_parameters(self) -> int:
        return sum(p.numel() for p in self.drafter.draft.model.parameters())

    def start_stream(self) -> None:
        self.drafter.start_stream()

    def stream(self, questions: list[Question]) -> list[Question]:
        return interleave(questions) if self.settings.stream == "interleaved" else questions

    def decode(
        self, state: Prefilled, sampling: SamplingParams, stop: StopCriteria, timer: Timer
    ) -> GenerationResult:
        drafter = self.drafter
        drafter.updates, drafter.update_seconds, drafter.began = 0, 0.0, False
        result = super().decode(state, sampling, stop, timer)
        result.stats.counters["online_updates"] = drafter.updates
        result.stats.counters["online_update_seconds"] = round(drafter.update_seconds, 4)
        if drafter.began:  # a turn that ends at its first token never drafts: it is not in the stream
            result.stats.counters["online_turn"] = drafter.turns + 1  # this turn's place in the stream
        return result
