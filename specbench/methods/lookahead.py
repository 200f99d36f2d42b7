"""Lookahead decoding (Fu et al. 2024) and plain Jacobi decoding (Santilli et al. 2023).

Lookahead: every step's target forward carries two branches. The lookahead branch is a 2D
window of N - 1 levels x W columns of guessed tokens (aux positions of the engine, never
verified): the token at level j, column i sits j + i + 1 positions after the root and sees
the root, level 0's columns before i and its own column up to level j, i.e. one causal
sequence. The argmax at the last level gives the next level (a Jacobi iteration); the
oldest level is dropped, and each column's N tokens (its N - 1 levels plus the new token)
form an n-gram that goes into a pool keyed by its first token. The verification branch is
up to G pool n-grams that start with the pending token, merged into a trie. The window
starts from random prompt tokens and grows one level per step until it has N - 1.

Jacobi: the draft is the current guess of the next W tokens, verified as a chain; the
target's argmax at each row is the next guess (a Jacobi iteration whose fixed point is the
greedy continuation), shifted past what was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import AuxBlock, DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod
from specbench.engine.api import Prefilled


@dataclass
class LookaheadSettings:
    """`method=lookahead` (upstream's LEVEL, WINDOW_SIZE, GUESS_SET_SIZE, POOL_FROM_PROMPT)."""

    level: int  # N: n-gram size; the window has N - 1 levels
    window: int  # W: columns of the lookahead window
    guess: int  # G: pool n-grams verified per step (merged into a trie)
    pool_from_prompt: bool  # seed the pool with the prompt's n-grams


@dataclass
class JacobiSettings:
    """`method=jacobi`."""

    window: int  # tokens guessed (and verified) per step


@lru_cache(maxsize=64)
def window_layout(levels: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(attend (k, k) bool among the window's k = levels * window positions, offsets (k,) from the root)."""
    k = levels * window
    attend = torch.zeros(k, k, dtype=torch.bool)
    offsets = torch.empty(k, dtype=torch.long)
    for j in range(levels):
        for i in range(window):
            row = j * window + i
            attend[row, :i] = True  # level 0, the columns before this one
            attend[row, torch.arange(j + 1) * window + i] = True  # this column, levels 0..j
            offsets[row] = j + i + 1
    return attend, offsets


def random_prompt_tokens(prompt: torch.Tensor, n: int) -> torch.Tensor:
    """n tokens drawn from the prompt (as upstream initialises its window), seeded by the prompt
    so that runs repeat."""
    gen = torch.Generator().manual_seed(int(prompt.shape[0]) * 7919 + int(prompt[-1]))
    return prompt[torch.randint(int(prompt.shape[0]), (n,), generator=gen)]


class NgramPool:
    """n-grams keyed by their first token; at most `cap` continuations per key, most recent last."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def clear(self) -> None:
        self.table.clear()

    def add(self, key: int, continuation: tuple[int, ...]) -> None:
        entries = self.table.setdefault(key, [])
        if continuation in entries:
            entries.remove(continuation)  # refreshed: moves to the most recent end
        entries.append(continuation)
        if len(entries) > self.cap:
            del entries[0]

    def add_sequence(self, tokens: list[int], n: int) -> None:
        """Every n-gram of a token list (seeding the pool from the prompt)."""
        for i in range(len(tokens) - n + 1):
            self.add(tokens[i], tuple(tokens[i + 1 : i + n]))

    def candidates(self, key: int, limit: int) -> list[tuple[int, ...]]:
        return self.table.get(key, [])[::-1][:limit]


def merge_trie(candidates: list[tuple[int, ...]], max_depth: int) -> tuple[list[int], list[int]]:
    """Candidates (token tuples under the root) merged on shared prefixes: (tokens, parents) in
    topological order."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    for cand in candidates:
        node = -1
        for token in cand[:max_depth]:
            key = (node, token)
            child = children.get(key)
            if child is None:
                child = len(tokens)
                children[key] = child
                tokens.append(token)
                parents.append(node)
            node = child
    return tokens, parents


class LookaheadDrafter(Drafter):
    def __init__(self, window: int, level: int, guess: int, pool_from_prompt: bool) -> None:
        if window < 1 or level < 2 or guess < 0:
            raise SpecbenchError(f"lookahead needs window >= 1, level >= 2, guess >= 0; got {window}, {level}, "
                                 f"{guess}")
        self.window, self.level, self.guess = window, level, guess
        self.pool_from_prompt = pool_from_prompt
        self.pool = NgramPool(max(guess, 1))
        self.levels = torch.empty(0, window, dtype=torch.long)  # (levels so far, W)

    def fork(self) -> LookaheadDrafter:
        twin = super().fork()
        twin.pool = NgramPool(self.pool.cap)  # cleared and filled per call: one per row
        return twin

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        prompt = state.input_ids[0].to("cpu")
        self.pool.clear()
        if self.pool_from_prompt:
            self.pool.add_sequence([*prompt.tolist(), *state.tokens], self.level)
        self.levels = random_prompt_tokens(prompt, self.window)[None]

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.max_depth <= 0:
            return DraftTree.empty(ctx.device)
        cands = self.pool.candidates(ctx.tokens[-1], self.guess)
        tokens, parents = merge_trie(cands, min(ctx.max_depth, self.level - 1))
        n = len(tokens)
        attend_aux, offsets = window_layout(int(self.levels.shape[0]), self.window)
        k = attend_aux.shape[0]
        attend = torch.cat([torch.ones(k, 1, dtype=torch.bool), torch.zeros(k, n, dtype=torch.bool), attend_aux], 1)
        aux = AuxBlock(self.levels.flatten().to(ctx.device), offsets, attend)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=ctx.device), tuple(parents), aux=aux)

    def accepted(self, feedback: Feedback) -> None:
        if feedback.aux_logits is None:  # no tree attention on this model: the window cannot advance
            return
        new = feedback.aux_logits[-self.window :].argmax(-1).to("cpu")
        if self.levels.shape[0] < self.level - 1:  # still filling the window
            self.levels = torch.cat([self.levels, new[None]])
            return
        grams = torch.cat([self.levels, new[None]]).T.tolist()  # (W, N): one n-gram per column
        for gram in grams:
            self.pool.add(gram[0], tuple(gram[1:]))
        self.levels = torch.cat([self.levels[1:], new[None]])


class JacobiDrafter(Drafter):
    """Plain Jacobi iteration over a guess of the next `window` tokens."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise SpecbenchError(f"jacobi needs window >= 1, got {window}")
        self.window = window
        self.guess = torch.empty(0, dtype=torch.long)

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.guess = random_prompt_tokens(state.input_ids[0].to("cpu"), self.window)

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.chain(self.guess[: max(ctx.max_depth, 0)].to(ctx.device))

    def accepted(self, feedback: Feedback) -> None:
        preds = feedback.logits.argmax(-1).to("cpu")  # row r predicts the token r + 1 after the root
        m = len(feedback.verdict.path)
        nxt = preds[m + 1 :]  # guesses for the tokens after the new root
        if nxt.shape[0] < self.window:  # pad with the last guess; Jacobi fixes it up next step
            fill = nxt[-1:] if nxt.shape[0] else preds[-1:]
            nxt = torch.cat([nxt, fill.expand(self.window - nxt.shape[0])])
        self.guess = nxt[: self.window]


class Lookahead(SpeculativeMethod):
    """`method=lookahead`."""

    Settings = LookaheadSettings

    def build_drafter(self) -> Drafter:
        s = self.settings
        return LookaheadDrafter(window=s.window, level=s.level, guess=s.guess, pool_from_prompt=s.pool_from_prompt)


class Jacobi(SpeculativeMethod):
    """`method=jacobi`."""

    Settings = JacobiSettings

    def build_drafter(self) -> Drafter:
        return JacobiDrafter(window=self.settings.window)
