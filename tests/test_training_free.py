"""The training-free drafters (lookahead, jacobi, rest, recycling, samd, self_spec): greedy losslessness
on both test architectures, their state handling and the pieces they are built from."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import ARCHS, CPU, EMPTY, PROMPTS, assert_matches_baseline, baseline_tokens, method_cfg, prompt_of, run
from specbench import datastore as ds
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.engine import DraftContext, DraftTree, Feedback, SpeculativeMethod, Verdict
from specbench.engine.layers import LayerSkipper
from specbench.methods.lookahead import LookaheadDrafter, NgramPool, merge_trie, window_layout
from specbench.methods.recycling import RecyclingDrafter, tree_template
from specbench.methods.self_spec import candidate_skip_sets
from specbench.models import LoadedModel, load_model
from specbench.run.registry import build_method

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`


@pytest.fixture(scope="module")
def targets(tiny_models) -> dict[str, LoadedModel]:
    return {arch: load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32) for arch in ARCHS}


@pytest.fixture(scope="module")
def datastores(targets, tmp_path_factory) -> dict[str, str]:
    """Per target: a datastore of the target's own greedy continuations of the test prompts
    (so retrieval finds right drafts) plus unrelated text (so it also finds wrong ones)."""
    root = tmp_path_factory.mktemp("datastores")
    out = {}
    for arch in ARCHS:
        target = targets[arch]
        docs = []
        for turns in PROMPTS:
            ids = prompt_of(target, turns)
            doc = ids[0].tolist()[-6:] + baseline_tokens(target, ids, StopCriteria.build((), 60))
            docs.append(doc)
            docs.append(doc[:14] + [(t + 1) % 300 for t in doc[14:]])  # a wrong branch: trees, not chains
        docs += [target.tokenizer.encode(t, add_special_tokens=False) for t in
                 ("the quick brown fox jumps over the lazy dog", "summarize the passage in two sentences")]
        out[arch] = str(ds.build(docs, target.tokenizer, root / arch))
    return out


# --- greedy losslessness -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["lookahead", "jacobi", "recycling", "samd"])
def test_tuning_free_greedy_equals_baseline(targets, arch, name):
    target = targets[arch]
    method = build_method(method_cfg(name), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert all("tree_fallback" not in r.stats for r in results)
    if name == "recycling":  # the adjacency warms up within the run: drafts do get accepted
        assert sum(r.stats["accepted_tokens"] for r in results) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_lookahead_small_window_and_no_prompt_pool(targets, arch):
    target = targets[arch]
    cfg = method_cfg("lookahead", window=3, level=3, guess=2, pool_from_prompt=False)
    assert_matches_baseline(build_method(cfg, target, EMPTY), target, lengths=(40,))


@pytest.mark.parametrize("arch", ARCHS)
def test_rest_greedy_equals_baseline(targets, datastores, arch):
    target = targets[arch]
    method = build_method(method_cfg("rest", datastore=datastores[arch], num_draft=16), target, EMPTY)
    results = assert_matches_baseline(method, target)
    # The datastore holds the answers themselves: long drafts get accepted.
    assert max(a for r in results for a in r.accept_lengths) >= 5
    assert any(r.stats.get("tree_steps") for r in results)


@pytest.mark.parametrize("arch", ARCHS)
def test_self_spec_greedy_equals_baseline(targets, arch):
    target = targets[arch]
    for skip in ([1], [0]):  # skipping layer 0 changes what get_seq_length sees: must be rolled back
        method = build_method(method_cfg("self_spec", skip_layers=skip), target, EMPTY)
        results = assert_matches_baseline(method, target)
        assert sum(r.stats["drafted_tokens"] for r in results) > 0


def test_self_spec_auto_search_is_cached(targets, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SPECBENCH_SELF_SPEC_DIR", raising=False)  # conftest's: the default is under the cache root
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = targets["llama"]
    cfg = method_cfg("self_spec", search_prompts=1, search_max_new_tokens=8)
    first = build_method(cfg, target, EMPTY)
    files = list((tmp_path / "self_spec").glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["best"] == first.skip_layers and len(record["scores"]) >= 1
    assert record["seconds"] >= 0 and record["dtype"] == "float32" and record["model"] == target.path
    said = capsys.readouterr().err  # the search's time is printed once, when it runs
    assert f"self_spec: skip set for {target.path} (float32) searched in {record['seconds']} s" in said
    record["best"] = [0]  # a cached result is used as is
    files[0].write_text(json.dumps(record))
    assert build_method(cfg, target, EMPTY).skip_layers == [0]
    assert "searched in" not in capsys.readouterr().err
    with pytest.raises(SpecbenchError, match=r"must be distinct indices in 0\.\.1 and keep at least one"):
        build_method(method_cfg("self_spec", skip_layers=[0, 1]), target, EMPTY)


def test_sampling_runs_and_keeps_lengths(targets, datastores):
    """Under sampling the drafts are deterministic candidates: each method runs and stays consistent."""
    target = targets["llama"]
    params = SamplingParams(temperature=0.8, top_p=0.9)
    ids = prompt_of(target, PROMPTS[0])
    for name, extra in (("lookahead", {}), ("jacobi", {}), ("recycling", {}), ("samd", {}),
                        ("self_spec", {"skip_layers": [1]}),
                        ("rest", {"datastore": datastores["llama"]})):
        method = build_method(method_cfg(name, **extra), target, EMPTY)
        torch.manual_seed(0)
        result = run(method, ids, StopCriteria.build((), 30), params)
        assert len(result.tokens) == 30


# --- lookahead / jacobi pieces ----------------------------------------------------------------


def test_window_layout_is_one_causal_sequence_per_row():
    attend, offsets = window_layout(3, 4)
    # level 2, column 1: sees level 0 column 0, then column 1 at levels 0, 1, 2
    row = 2 * 4 + 1
    assert attend[row].nonzero().flatten().tolist() == [0, 1, 5, 9]
    assert offsets[row] == 2 + 1 + 1
    # every row's visible positions are 1..offset exactly once (with the root at 0)
    for r in range(12):
        seen = sorted(offsets[attend[r]].tolist())
        assert seen == list(range(1, int(offsets[r]) + 1))


def test_pool_and_trie():
    pool = NgramPool(cap=2)
    pool.add(5, (1, 2))
    pool.add(5, (1, 3))
    pool.add(5, (1, 2))  # refreshed, now the most recent
    pool.add(5, (4, 4))  # evicts the oldest, (1, 3)
    assert pool.candidates(5, 5) == [(4, 4), (1, 2)]
    tokens, parents = merge_trie([(1, 2, 3), (1, 2, 4), (7,)], max_depth=2)
    assert tokens == [1, 2, 7] and parents == [-1, 0, -1]


def test_lookahead_harvests_ngrams_from_the_window():
    drafter = LookaheadDrafter(window=2, level=3, guess=4, pool_from_prompt=False)
    drafter.levels = torch.tensor([[10, 11], [20, 21]])  # full: N - 1 = 2 levels
    ctx = DraftContext(torch.tensor([[1, 2]]), [3], SamplingParams(), CPU, max_depth=5)
    tree = drafter.propose(ctx)
    assert tree.n == 0 and tree.aux.k == 4
    aux_logits = torch.zeros(4, 50)
    aux_logits[2, 30] = aux_logits[3, 31] = 1.0  # the last level predicts 30 and 31
    drafter.accepted(Feedback(tree, Verdict([], [], 9), torch.zeros(1, 50), aux_logits=aux_logits))
    assert drafter.pool.candidates(10, 4) == [(20, 30)] and drafter.pool.candidates(11, 4) == [(21, 31)]
    assert drafter.levels.tolist() == [[20, 21], [30, 31]]


# --- token recycling pieces --------------------------------------------------------------------


def test_tree_template_is_breadth_first_and_greedy():
    parents, ranks = tree_template(10, 3, 4)
    assert len(parents) == 10 and parents[0] == -1 and ranks[0] == 0
    assert all(p < i for i, p in enumerate(parents))
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    assert depth == sorted(depth) and max(depth) <= 3
    assert tree_template(3, 1, 8) == ((-1, -1, -1), (0, 1, 2))


def test_adjacency_updates_and_breadth_first_drafts():
    drafter = RecyclingDrafter(vocab=10, k=2, tree_size=4, max_depth=2)
    # template: root children ranks 0, 1; then the best grandchildren under the rank-0 child
    assert drafter.parents == (-1, -1, 0, 0)
    ctx = DraftContext(torch.tensor([[0]]), [3], SamplingParams(), CPU, max_depth=5)
    assert drafter.propose(ctx).n == 0  # token 3 was never scored: no candidates yet
    logits = torch.zeros(3, 10)
    logits[0, [5, 6]] = torch.tensor([2.0, 1.0])  # after 3: 5 then 6
    logits[1, [7, 8]] = torch.tensor([2.0, 1.0])  # after the first node's token
    tree = DraftTree(torch.tensor([4, 9]), (-1, 0))
    drafter.root = 3
    drafter.accepted(Feedback(tree, Verdict([], [], 5), logits))
    assert drafter.adjacency[3].tolist() == [5, 6] and drafter.adjacency[4].tolist() == [7, 8]
    assert bool(drafter.seen[9]) and not bool(drafter.seen[5])
    tree = drafter.propose(ctx)
    # 5 and 6 under the root; 5 was never scored, so its children are pruned
    assert tree.tokens.tolist() == [5, 6] and tree.parents == (-1, -1)
    drafter.update(torch.tensor([5]), logits[1:2])
    tree = drafter.propose(ctx)
    assert tree.tokens.tolist() == [5, 6, 7, 8] and tree.parents == (-1, -1, 0, 0)
    drafter.reset()
    assert drafter.propose(ctx).n == 0


def test_recycling_state_persists_within_a_run_and_resets(targets):
    target = targets["llama"]
    method = build_method(method_cfg("recycling"), target, EMPTY)
    ids = prompt_of(target, PROMPTS[1])
    stop = StopCriteria.build((), 30)
    run(method, ids, stop)
    warm = method.drafter.seen.sum()
    assert warm > 0
    again = run(method, ids, stop)  # the second call starts with what the first one learned
    assert again.stats["accepted_tokens"] > 0
    method.reset()
    assert method.drafter.seen.sum() == 0


# --- self-speculative pieces ------------------------------------------------------------------


def test_layer_skipper_without_skips_matches_the_model(targets):
    target = targets["qwen2"]
    ids = prompt_of(target, PROMPTS[0])
    cache = target.new_cache()
    target.model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    past = ids.shape[1] - 1
    skipper = LayerSkipper(target.model, [])
    with torch.no_grad():
        got = skipper.step(ids[0, -1], past, cache)
        want = target.model(input_ids=ids).logits[0, -1]
    assert torch.allclose(got, want, atol=1e-4)
    skipper.rollback(cache, past)
    assert cache.get_seq_length() == past


def test_candidate_skip_sets_keep_the_ends():
    sets = candidate_skip_sets(8)
    assert sets and all(0 not in s and 7 not in s for s in sets)
    assert [2, 3, 4, 5, 6] not in sets and max(len(s) for s in sets) == 4


def test_method_without_datastore_explains(targets):
    with pytest.raises(SpecbenchError, match="needs a datastore"):
        build_method(method_cfg("rest", datastore=None), targets["llama"], EMPTY)


def test_speculative_method_class_is_shared():
    from specbench.methods import lookahead, recycling, rest, self_spec

    for cls in (lookahead.Lookahead, lookahead.Jacobi, rest.REST, recycling.TokenRecycling, self_spec.SelfSpec):
        assert issubclass(cls, SpeculativeMethod)
