"""SpecInfer (`method=specinfer`): the token trie of several drafts' chains, greedy output equal
to the baseline's, and sampling that follows the target (the engine's chi-square test)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model
from transformers import AutoTokenizer

from helpers import (
    CPU,
    EMPTY,
    assert_matches_baseline,
    chi_square_p,
    exact_first_three,
    method_cfg,
    prompt_of,
    run,
    sample_end_to_end,
    tiny_vocab_model,
)
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.engine import SpeculativeMethod
from specbench.methods.drafts import SpsDrafter
from specbench.methods.specinfer import SpecInferDrafter, merge_chains
from specbench.models import load_model
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tiny_models):
    return load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)


@pytest.fixture(scope="module")
def other_llama(tiny_models, tmp_path_factory):
    """A second random Llama (another seed) with the same tokenizer: a draft that disagrees."""
    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    return make_model(tmp_path_factory.mktemp("specinfer") / "llama-seed1", "llama", tok, seed=1)


def test_merge_chains_is_a_trie():
    tokens, parents = merge_chains([[5, 6, 7], [5, 6, 8], [9, 6], [5, 6, 7]])
    assert tokens == [5, 6, 7, 8, 9, 6] and parents == [-1, 0, 1, 1, -1, 4]
    assert merge_chains([[], []]) == ([], [])


def test_greedy_equals_baseline(tiny_models, target, other_llama):
    drafts = [str(tiny_models["qwen2"]), str(other_llama)]
    method = build_method(method_cfg("specinfer", drafts=drafts, budget="fixed"), target, EMPTY)
    results = assert_matches_baseline(method, target, lengths=(1, 30))
    assert method.extra_parameters() > 0
    stats = [r.stats for r in results if r.stats.get("steps")]
    # two disagreeing drafts make real trees: more nodes than the depth in some step
    assert any(n > d for s in stats for n, d in zip(s["draft_lengths"], s.get("draft_depths", s["draft_lengths"])))
    # the target drafting for itself plus another model: the target's own chain is always accepted whole
    selfish_cfg = method_cfg("specinfer", drafts=[str(other_llama), str(tiny_models["llama"])], budget="fixed")
    selfish = build_method(selfish_cfg, target, EMPTY)
    results = assert_matches_baseline(selfish, target, lengths=(30,))
    steps = [a for r in results for a in r.accept_lengths[:-1]]
    assert steps and all(a == 5 for a in steps)  # K = 4 accepted + the bonus token


def test_identical_drafts_merge_without_duplicate_siblings(tiny_models, target):
    spec = str(tiny_models["qwen2"])
    method = build_method(method_cfg("specinfer", drafts=[spec, spec], budget="fixed"), target, EMPTY)
    results = assert_matches_baseline(method, target, lengths=(30,))
    for r in results:  # greedy: the two chains are equal, so the trie is one chain of K nodes
        assert max(r.stats["draft_lengths"]) == 4 and "draft_depths" not in r.stats
    tree_nodes = []
    drafter = method.drafter
    input_ids = prompt_of(target, ["the quick brown fox"])
    sampling = SamplingParams(temperature=1.0)
    torch.manual_seed(0)
    original = drafter.propose

    def spy(ctx):
        tree = original(ctx)
        tree_nodes.append(tree)
        return tree

    drafter.propose = spy
    run(method, input_ids, StopCriteria.build((), 30), sampling)
    assert tree_nodes
    for tree in tree_nodes:
        layout = tree.layout
        for kids in layout.children:
            toks = [int(tree.tokens[k]) for k in kids]
            assert len(toks) == len(set(toks))


def test_sampled_generation_follows_the_target():
    target = tiny_vocab_model(0)
    drafter = SpecInferDrafter([SpsDrafter(tiny_vocab_model(s), num_tokens=3, vocab_size=5) for s in (1, 2)])
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1200)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3
    torch.manual_seed(1)
    results = [run(method, torch.tensor([prompt]), StopCriteria.build((), 4), params) for _ in range(50)]
    assert sum(r.stats["accepted_tokens"] for r in results) > 0
    assert any("draft_depths" in r.stats for r in results)  # the two drafts' chains branched


def test_bad_settings_are_refused(target):
    with pytest.raises(SpecbenchError, match="needs draft models"):
        build_method(method_cfg("specinfer", drafts=[]), target, EMPTY)
    with pytest.raises(SpecbenchError, match="num_speculative_tokens"):
        build_method(method_cfg("specinfer", num_speculative_tokens=0), target, EMPTY)
