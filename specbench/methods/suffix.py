"""SuffixDecoding (Oliaro et al. 2024): draft trees from suffix trees of the request's own text and of
earlier answers, sized by how long the match is and scored by how often each continuation occurred.

Two indexes of token substrings up to `max_depth` tokens long, each a trie of counts (a suffix tree
cut at that depth): the request's (its prompt and the answer so far, grown token by token) and, with
`earlier_answers`, the run's (every answer this method gave before, added when it is finished; kept
across the questions of a run, cleared per run). At each step the context's suffixes of every length
p are followed in both tries (incrementally: one step per suffix and token). From each matched node
with continuations, a tree is grown best first: a node's score is the product of its path's empirical
probabilities (a child's count over its siblings' total), nodes below `min_token_prob` are not
drafted, and the tree holds at most `spec_factor * p` nodes (and `max_spec_tokens`): a longer match
buys a larger draft. The tree with the highest expected number of accepted tokens (the sum of its
scores) is the draft, each node's empirical probability its confidence (which the draft budget
calibrates). Deterministic drafts, verified by the shared engine as a token tree: lossless.
Training-free.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.engine.api import GenerationResult, Prefilled


@dataclass
class SuffixSettings:
    """`method=suffix` (and `suffix_local`, its variant without earlier answers)."""

    max_depth: int  # longest substring indexed: the tries' depth (matches and drafts share it)
    max_spec_tokens: int  # nodes of a draft, at most
    spec_factor: float  # nodes of a draft, at most, per matched token (the adaptive size)
    min_token_prob: float  # a node whose path probability falls below this is not drafted
    earlier_answers: bool  # index the run's earlier answers too (the paper's global tree)


class SuffixTrie:
    """Counts of every substring of at most `depth` tokens of the texts added. Nodes are parallel
    lists: `children` (token -> node; None for a node without any), `token` (the node's last
    token), `count` (occurrences of the node's string), `total` (occurrences followed by a token:
    the sum of the children's counts) and `length`. A text is added token by token through its
    active nodes (the nodes of its suffixes shorter than `depth`, root first)."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise SpecbenchError(f"suffix needs max_depth >= 1, got {depth}")
        self.depth = depth
        self.children: list[dict[int, int] | None] = [None]
        self.token = [-1]
        self.count = [0]
        self.total = [0]
        self.length = [0]

    def add(self, active: list[int], token: int) -> list[int]:
        """`token` appended to a text whose suffixes end at `active`: counts each extended suffix; the
        new text's active nodes."""
        out = [0]
        for node in active:
            kids = self.children[node]
            if kids is None:
                kids = self.children[node] = {}
            child = kids.get(token)
            if child is None:
                child = kids[token] = len(self.count)
                self.children.append(None)
                self.token.append(token)
                self.count.append(0)
                self.total.append(0)
                self.length.append(self.length[node] + 1)
            self.count[child] += 1
            self.total[node] += 1
            if self.length[child] < self.depth:
                out.append(child)
        return out

    def add_text(self, tokens: list[int]) -> list[int]:
        active = [0]
        for token in tokens:
            active = self.add(active, token)
        return active

    def follow(self, active: list[int], token: int) -> list[int]:
        """The nodes of a text's suffixes after `token`, in a trie the text is not added to (matches
        only: nothing is counted)."""
        out = [0]
        for node in active:
            kids = self.children[node]
            child = kids.get(token) if kids is not None else None
            if child is not None and self.length[child] < self.depth:
                out.append(child)
        return out

    def grow(self, start: int, limit: int, min_prob: float) -> tuple[list[int], list[int], list[float], float]:
        """The best-first tree under node `start`: (tokens, parents, confidences, score). A node's
        score is its path's probability (at least `min_prob`); nodes come out in order of score, so
        parents first; `score` is their sum, the expected number of tokens accepted."""
        tokens: list[int] = []
        parents: list[int] = []
        confidence: list[float] = []
        score = 0.0
        heap: list[tuple[float, int, int, float]] = []  # (-path probability, node, parent index, conditional)

        def push(node: int, parent: int, reach: float) -> None:
            total, kids = self.total[node], self.children[node]
            if total and kids:
                for child in kids.values():
                    p = self.count[child] / total
                    if reach * p >= min_prob:
                        heapq.heappush(heap, (-reach * p, child, parent, p))

        push(start, -1, 1.0)
        while heap and len(tokens) < limit:
            reach, node, parent, p = heapq.heappop(heap)
            index = len(tokens)
            tokens.append(self.token[node])
            parents.append(parent)
            confidence.append(p)
            score -= reach
            push(node, index, -reach)
        return tokens, parents, confidence, score


class SuffixDrafter(Drafter):
    """Draft trees from the request's trie and the run's trie of earlier answers (shared by forks)."""

    def __init__(self, settings: SuffixSettings) -> None:
        s = settings
        if s.max_spec_tokens < 1 or s.spec_factor <= 0 or not 0 <= s.min_token_prob <= 1:
            raise SpecbenchError("suffix needs max_spec_tokens >= 1, spec_factor > 0 and 0 <= min_token_prob <= 1")
        self.settings = s
        self.answers = SuffixTrie(s.max_depth) if s.earlier_answers else None  # the run's, shared by forks
        self.local = SuffixTrie(s.max_depth)
        self.active: list[int] = [0]  # the request's suffixes in its own trie
        self.matched: list[int] = [0]  # the request's suffixes in the answers' trie
        self.seen = 0  # generated tokens added so far

    def reset(self) -> None:
        if self.answers is not None:
            self.answers = SuffixTrie(self.settings.max_depth)

    def remember(self, tokens: list[int]) -> None:
        """A finished answer joins the earlier answers' trie."""
        if self.answers is not None and tokens:
            self.answers.add_text(tokens)

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.local = SuffixTrie(self.settings.max_depth)
        prompt = state.input_ids[0].tolist()
        self.active = self.local.add_text(prompt)
        self.matched = [0]
        if self.answers is not None:
            for token in prompt[-self.settings.max_depth :]:
                self.matched = self.answers.follow(self.matched, token)
        self.seen = 0

    def _catch_up(self, tokens: list[int]) -> None:
        for token in tokens[self.seen :]:
            self.active = self.local.add(self.active, token)
            if self.answers is not None:
                self.matched = self.answers.follow(self.matched, token)
        self.seen = len(tokens)

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._catch_up(ctx.tokens)
        s = self.settings
        if ctx.max_depth <= 0:
            return DraftTree.empty(ctx.device)
        best: tuple[list[int], list[int], list[float], float] | None = None
        for trie, nodes in ((self.local, self.active), (self.answers, self.matched)):
            if trie is None:
                continue
            for node in nodes[1:]:  # one per matched suffix length p = trie.length[node]
                limit = min(s.max_spec_tokens, math.ceil(s.spec_factor * trie.length[node]))
                if not trie.total[node]:
                    continue
                grown = trie.grow(node, limit, s.min_token_prob)
                if grown[0] and (best is None or grown[3] > best[3]):
                    best = grown
        if best is None:
            return DraftTree.empty(ctx.device)
        tokens, parents, confidence, _ = best
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=ctx.device), tuple(parents),
                         confidence=torch.tensor(confidence, device=ctx.device))


class Suffix(SpeculativeMethod):
    """`method=suffix`: SuffixDecoding; `method.earlier_answers=false` (`method=suffix_local`) indexes
    the request's own prompt and answer only (as vLLM's `suffix` preset with no cached requests)."""

    Settings = SuffixSettings

    def build_drafter(self) -> Drafter:
        return SuffixDrafter(self.settings)

    def start_stream(self) -> None:
        """The timed questions start: the warm-up's answers are not earlier answers of the run."""
        self.drafter.reset()

    def annotate(self, result: GenerationResult) -> GenerationResult:
        self.drafter.remember(list(result.tokens))
        return result
