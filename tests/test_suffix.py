"""SuffixDecoding (`method=suffix`, `suffix_local`): the trie's counts against brute force, the
draft's size following the match and its nodes' probabilities, earlier answers joining the drafts,
greedy losslessness on Llama, Qwen2 and GPT-2, and sampling that still follows the target."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

import helpers
from helpers import ARCHS, EMPTY, assert_matches_baseline, baseline_tokens, method_cfg, prompt_of, run
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.engine import DraftContext, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.methods.suffix import SuffixDrafter, SuffixSettings, SuffixTrie
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")


def settings(**kw) -> SuffixSettings:
    base = {"max_depth": 8, "max_spec_tokens": 16, "spec_factor": 1.0, "min_token_prob": 0.1, "earlier_answers": True}
    return SuffixSettings(**{**base, **kw})


def node_of(trie: SuffixTrie, string: list[int]) -> int | None:
    node = 0
    for token in string:
        kids = trie.children[node]
        node = kids.get(token) if kids else None
        if node is None:
            return None
    return node


def test_counts_equal_brute_force():
    """Every substring up to the depth is counted as often as it occurs; `total` is how often it is
    followed by a token; nothing longer than the depth is indexed."""
    rng = random.Random(0)
    for _ in range(40):
        depth = rng.randint(1, 6)
        texts = [[rng.randrange(rng.randint(1, 4)) for _ in range(rng.randint(1, 30))]
                 for _ in range(rng.randint(1, 3))]
        trie = SuffixTrie(depth)
        for text in texts:
            trie.add_text(text)
        occurs, followed = Counter(), Counter()
        for text in texts:
            for i in range(len(text)):
                for n in range(1, min(depth, len(text) - i) + 1):
                    occurs[tuple(text[i : i + n])] += 1
                    if i + n < len(text) and n < depth:
                        followed[tuple(text[i : i + n])] += 1
        assert len(trie.count) - 1 == len(occurs)
        for string, count in occurs.items():
            node = node_of(trie, list(string))
            assert node is not None and trie.count[node] == count and trie.total[node] == followed[string]


def test_following_a_text_reaches_its_suffixes():
    trie = SuffixTrie(4)
    trie.add_text([1, 2, 3, 1, 2, 4])
    active = [0]
    for token in [9, 1, 2]:
        active = trie.follow(active, token)
    assert [trie.length[n] for n in active] == [0, 1, 2]  # "2" and "1 2" occur; "9 1 2" does not
    assert active[2] == node_of(trie, [1, 2])


def test_grown_trees_are_best_first_and_sized_by_the_match():
    """After "a b c" twice and "a b d" once, the match "a b" drafts c (2/3) before d (1/3); the tree
    holds at most spec_factor * match length nodes, and nodes under min_token_prob are left out."""
    trie = SuffixTrie(8)
    trie.add_text([1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 4, 6])
    node = node_of(trie, [1, 2])
    tokens, parents, confidence, score = trie.grow(node, 16, 0.0)
    assert tokens[:2] == [3, 5] and parents[:2] == [-1, 0] and confidence[0] == pytest.approx(2 / 3)
    assert 4 in tokens and confidence[tokens.index(4)] == pytest.approx(1 / 3)
    assert score == pytest.approx(sum(_path_probs(tokens, parents, confidence)))
    assert all(p < 0 or p < i for i, p in enumerate(parents))
    tokens, *_ = trie.grow(node, 16, 0.5)
    assert 4 not in tokens
    drafter = SuffixDrafter(settings(spec_factor=1.0, min_token_prob=0.0))
    drafter.begin(Prefilled(torch.tensor([[1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 4, 6]]), [9], None, None, {}),
                  SamplingParams())
    tree = drafter.propose(DraftContext(torch.tensor([[0]]), [1], SamplingParams(), torch.device("cpu"), max_depth=9))
    assert tree.n == 1  # a match of one token ("1") buys one node: the likeliest, "2"
    assert tree.tokens.tolist() == [2]


def _path_probs(tokens, parents, confidence):
    reach = []
    for p, c in zip(parents, confidence, strict=True):
        reach.append(c * (reach[p] if p >= 0 else 1.0))
    return reach


def test_earlier_answers_draft_and_the_local_variant_ignores_them():
    """An answer given earlier in the run drafts the same text in a later request whose prompt does
    not contain it; `earlier_answers=false` drafts nothing there; `reset` forgets the answers."""
    answer = [7, 8, 9, 10, 11, 12, 13, 14]
    for earlier, expect in ((True, True), (False, False)):
        drafter = SuffixDrafter(settings(earlier_answers=earlier))
        drafter.remember(answer)
        drafter.begin(Prefilled(torch.tensor([[1, 2, 3]]), [7], None, None, {}), SamplingParams())
        ctx = DraftContext(torch.tensor([[1, 2, 3]]), [7, 8, 9], SamplingParams(), torch.device("cpu"), max_depth=20)
        tree = drafter.propose(ctx)
        assert (tree.tokens[:3].tolist() == [10, 11, 12]) is expect, tree.tokens
        if earlier:
            drafter.reset()
            drafter.begin(Prefilled(torch.tensor([[1, 2, 3]]), [7], None, None, {}), SamplingParams())
            assert drafter.propose(ctx).n == 0


def test_bad_settings_are_refused():
    with pytest.raises(SpecbenchError, match="max_depth >= 1"):
        SuffixDrafter(settings(max_depth=0))
    with pytest.raises(SpecbenchError, match="spec_factor > 0"):
        SuffixDrafter(settings(spec_factor=0))


@pytest.mark.parametrize("name", ["suffix", "suffix_local"])
@pytest.mark.parametrize("arch", [*ARCHS, "gpt2"])
def test_greedy_equals_baseline(targets, arch, name):
    target = targets[arch]
    method = build_method(method_cfg(name), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0


def test_repetitive_text_accepts_long_drafts(targets):
    target = targets["llama"]
    ids = prompt_of(target, ["the quick brown fox jumps over the lazy dog. " * 6])
    stop = StopCriteria.build((), 60)
    result = run(build_method(method_cfg("suffix_local", budget="fixed"), target, EMPTY), ids, stop)
    assert result.tokens == baseline_tokens(target, ids, stop)
    assert sum(result.accept_lengths) / len(result.accept_lengths) > 1.5, result.accept_lengths


def test_sampled_generation_follows_the_target():
    """The engine's chi-square test with the suffix trees' (deterministic, multi-branch) drafts."""
    target = helpers.tiny_vocab_model(0)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=SuffixDrafter(settings(min_token_prob=0.0)))
    params = SamplingParams(temperature=1.0)
    prompt = [0, 1, 2, 3, 4, 0, 2, 1, 0, 1, 3]  # repeated pairs: several continuations to branch on
    counts = helpers.sample_end_to_end(method, prompt, params, draws=1000)
    assert helpers.chi_square_p(counts, helpers.exact_first_three(target, prompt, params)) > 1e-3
