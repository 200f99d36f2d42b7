"""The speculative engine's parts: tree layout and mask, the tree forward, KV compaction, verifiers."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, StaticCache

from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine import (
    AuxBlock,
    DraftContext,
    Drafter,
    DraftTree,
    Feedback,
    SpeculativeMethod,
    TargetScorer,
    keep_rows,
    layout_of,
    probe_tree_attention,
    tree_attention_inputs,
    verify_greedy,
    verify_sampled,
)
from specbench.engine.layers import probe_allowance
from specbench.engine.target import sliding_window, static_tree_problem, window_problem
from specbench.models import LoadedModel, load_model
from specbench.run.registry import build_method

CPU = torch.device("cpu")
GREEDY = SamplingParams()
EMPTY = OmegaConf.create({})
# A hand-made tree: two branches at the root, a fork under node 0, a grandchild under node 3.
#        root
#       /    \
#      0      1
#     / \      \
#    2   3      4
#        |
#        5
PARENTS = (-1, -1, 0, 0, 1, 3)


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`


def test_layout_of_a_hand_made_tree():
    layout = layout_of(PARENTS)
    assert layout.depth == (1, 1, 2, 2, 2, 3)
    assert layout.children == ((0, 1), (2, 3), (4,), (), (5,), (), ())
    assert layout.paths == ((0,), (1,), (0, 2), (0, 3), (1, 4), (0, 3, 5))
    assert not layout.is_chain and layout_of((-1, 0, 1)).is_chain
    expected = torch.tensor([
        # root 0  1  2  3  4  5
        [1, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0],  # node 0
        [1, 0, 1, 0, 0, 0, 0],  # node 1
        [1, 1, 0, 1, 0, 0, 0],  # node 2
        [1, 1, 0, 0, 1, 0, 0],  # node 3
        [1, 0, 1, 0, 0, 1, 0],  # node 4
        [1, 1, 0, 0, 1, 0, 1],  # node 5
    ], dtype=torch.bool)
    assert torch.equal(layout.attend, expected)


def test_tree_mask_and_positions_on_top_of_the_cache():
    tree = DraftTree(torch.arange(10, 16), PARENTS)
    mask, positions = tree_attention_inputs(tree, past=4, device=CPU, dtype=torch.float32)
    assert mask.shape == (1, 1, 7, 4 + 7)
    assert torch.equal(positions, torch.tensor([[4, 5, 5, 6, 6, 6, 7]]))
    assert (mask[0, 0, :, :4] == 0).all()  # the past is visible to every row
    block = mask[0, 0, :, 4:]
    assert torch.equal(block == 0, layout_of(PARENTS).attend)
    assert (block[~layout_of(PARENTS).attend] == torch.finfo(torch.float32).min).all()


def test_tree_mask_with_aux_positions():
    aux = AuxBlock(torch.tensor([20, 21]), torch.tensor([1, 2]),
                   torch.tensor([[1, 0, 0, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool))
    tree = DraftTree(torch.tensor([10, 11]), (-1, -1), aux=aux)
    mask, positions = tree_attention_inputs(tree, past=2, device=CPU, dtype=torch.float32)
    assert torch.equal(positions, torch.tensor([[2, 3, 3, 3, 4]]))
    visible = mask[0, 0, :, 2:] == 0
    assert torch.equal(visible[:3, 3:], torch.zeros(3, 2, dtype=torch.bool))  # tree rows never see aux rows
    assert torch.equal(visible[3:], aux.attend)


def test_truncate_select_and_first_branch():
    probs = torch.softmax(torch.randn(6, 9), -1)
    tree = DraftTree(torch.arange(10, 16), PARENTS, probs, "iid")
    cut = tree.truncate(2)
    assert cut.parents == (-1, -1, 0, 0, 1) and cut.tokens.tolist() == [10, 11, 12, 13, 14]
    assert tree.truncate(3) is tree
    assert tree.truncate(0).n == 0
    branch = tree.first_branch()
    assert branch.parents == (-1, 0) and branch.tokens.tolist() == [10, 12]
    assert torch.equal(branch.draft_probs, probs[[0, 2]])
    assert branch.kind == "iid"
    top_k = DraftTree(torch.arange(10, 16), PARENTS, probs, "deterministic")
    assert top_k.first_branch().kind == "deterministic"  # top-k candidates stay one-hot under sampling
    sub = tree.select([1, 4])
    assert sub.parents == (-1, 0) and sub.tokens.tolist() == [11, 14]
    with pytest.raises(ValueError, match="parent"):
        DraftTree(torch.arange(2), (-1, 1))
    with pytest.raises(ValueError, match="match"):
        DraftTree(torch.arange(3), (-1, 0))


# --- the target forward -------------------------------------------------------------------


def _model(arch: str, tiny_models) -> torch.nn.Module:
    """Llama and Qwen2 from the shared fixture; GPT-2 and Mistral (no sliding window) built here."""
    if arch in tiny_models:
        return load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32).model
    torch.manual_seed(3)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    else:
        config = MistralConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, sliding_window=None)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "mistral"])
@torch.inference_mode()
def test_tree_forward_equals_chain_forwards(tiny_models, arch):
    model = _model(arch, tiny_models)
    prompt = [5, 17, 42, 99, 7]
    root = 33
    tree = DraftTree(torch.tensor([60, 61, 62, 63, 64, 65]), PARENTS)
    scorer = TargetScorer(model, CPU, torch.float32)
    cache = LoadedModel(model, None, arch, CPU, torch.float32).new_cache()
    model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    assert scorer.tree_support(cache), scorer.tree_problem
    logits = scorer.score(cache, len(prompt), root, tree, tree_mode=True).logits[0]
    assert torch.allclose(logits[0], _full_logits(model, prompt + [root]), atol=1e-5)
    for node, path in enumerate(tree.layout.paths):
        want = _full_logits(model, prompt + [root] + [int(tree.tokens[i]) for i in path])
        assert torch.allclose(logits[node + 1], want, atol=1e-5), f"node {node} of {arch}"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("path", [(1, 4), (0, 3, 5), (0,), ()])
@torch.inference_mode()
def test_cache_keeps_exactly_the_accepted_path(tiny_models, arch, path):
    model = _model(arch, tiny_models)
    prompt, root, bonus = [5, 17, 42, 99, 7], 33, 77
    tree = DraftTree(torch.tensor([60, 61, 62, 63, 64, 65]), PARENTS)
    cache = LoadedModel(model, None, arch, CPU, torch.float32).new_cache()
    model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    scorer = TargetScorer(model, CPU, torch.float32)
    scorer.score(cache, len(prompt), root, tree, tree_mode=True)
    rows = [0, *(i + 1 for i in path)]
    keep_rows(cache, len(prompt), tree.n + 1, rows)
    assert cache.get_seq_length() == len(prompt) + len(rows)
    accepted = [int(tree.tokens[i]) for i in path]
    got = model(input_ids=torch.tensor([[bonus]]), cache=cache, use_cache=True).logits[0, -1]
    assert torch.allclose(got, _full_logits(model, prompt + [root] + accepted + [bonus]), atol=1e-5)


@torch.inference_mode()
def test_chain_step_is_cropped(tiny_models):
    model = _model("llama", tiny_models)
    prompt, root = [5, 17, 42], 33
    tree = DraftTree.chain(torch.tensor([60, 61, 62, 63]))
    cache = LoadedModel(model, None, "llama", CPU, torch.float32).new_cache()
    model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    logits = TargetScorer(model, CPU, torch.float32).score(cache, 3, root, tree, tree_mode=False).logits[0]
    assert torch.allclose(logits[-1], _full_logits(model, prompt + [root, 60, 61, 62, 63]), atol=1e-5)
    keep_rows(cache, 3, 5, [0, 1])
    got = model(input_ids=torch.tensor([[9]]), cache=cache, use_cache=True).logits[0, -1]
    assert torch.allclose(got, _full_logits(model, prompt + [root, 60, 9]), atol=1e-5)


# --- verifiers on hand-made logits ----------------------------------------------------------


def _logits_with_argmax(best: list[int], vocab: int = 70) -> torch.Tensor:
    logits = torch.randn(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 10.0
    return logits


def test_greedy_chain_verdict():
    tree = DraftTree.chain(torch.tensor([5, 7, 2]))
    verdict = verify_greedy(tree, _logits_with_argmax([5, 7, 9, 4]))
    assert (verdict.path, verdict.tokens, verdict.token, verdict.rows) == ([0, 1], [5, 7], 9, [0, 1, 2])
    all_in = verify_greedy(tree, _logits_with_argmax([5, 7, 2, 4]))
    assert (all_in.tokens, all_in.token) == ([5, 7, 2], 4)
    none = verify_greedy(tree, _logits_with_argmax([1, 7, 2, 4]))
    assert (none.path, none.token) == ([], 1)
    assert verify_greedy(DraftTree.empty(), _logits_with_argmax([3])).token == 3


def test_greedy_tree_verdict_takes_the_deepest_matching_path():
    tokens = torch.tensor([60, 61, 62, 63, 64, 65])
    tree = DraftTree(tokens, PARENTS)
    # rows: root, node0..node5; root wants 61 (node 1), node 1 wants 64 (node 4), node 4 wants 8
    verdict = verify_greedy(tree, _logits_with_argmax([61, 62, 64, 1, 2, 8, 3]))
    assert (verdict.path, verdict.tokens, verdict.token, verdict.rows) == ([1, 4], [61, 64], 8, [0, 2, 5])
    # the deeper branch 0 -> 3 -> 5 wins over 1 -> 4 when both match
    deep = verify_greedy(tree, _logits_with_argmax([60, 63, 64, 1, 65, 8, 3]))
    assert (deep.path, deep.token) == ([0, 3, 5], 3)
    # a node whose parent does not match is never accepted, however well it matches itself
    orphan = verify_greedy(tree, _logits_with_argmax([1, 62, 64, 1, 2, 8, 3]))
    assert (orphan.path, orphan.token) == ([], 1)
    # duplicate siblings: the lower index wins and the output is the same
    dup = DraftTree(torch.tensor([60, 60, 61]), (-1, -1, 1))
    verdict = verify_greedy(dup, _logits_with_argmax([60, 5, 61, 9]))
    assert (verdict.path, verdict.token) == ([1, 2], 9)


def test_sampled_verdict_never_accepts_what_the_target_cannot_emit():
    torch.manual_seed(0)
    vocab = 6
    q = torch.zeros(3, vocab)
    q[:, 1:] = 0.2  # token 0 is impossible for the target
    p = torch.zeros(2, vocab)
    p[:, 0] = 1.0  # and the drafter is sure of it
    for _ in range(200):
        chain = verify_sampled(DraftTree.chain(torch.tensor([0, 0]), p), q)
        assert chain.path == [] and chain.token != 0
        tree = verify_sampled(DraftTree(torch.tensor([0, 0]), (-1, -1), p, "iid"), q)
        assert tree.path == [] and tree.token != 0
        det = verify_sampled(DraftTree(torch.tensor([0, 3]), (-1, -1)), q)
        assert det.token != 0 and 0 not in det.tokens


def test_sampled_verdict_survives_wrong_draft_probabilities():
    torch.manual_seed(0)
    q = torch.softmax(torch.randn(4, 5), -1)
    zero = torch.zeros(3, 5)  # claims probability 0 for everything: every token is "under-drafted"
    verdict = verify_sampled(DraftTree.chain(torch.tensor([1, 2, 3]), zero), q)
    assert verdict.path == [0, 1, 2]  # q/p = inf: always accepted, never a division by zero
    huge = torch.full((3, 5), 7.0)  # not a distribution at all: the residual is empty, q is used
    for _ in range(50):
        verdict = verify_sampled(DraftTree.chain(torch.tensor([1, 2, 3]), huge), q)
        assert 0 <= verdict.token < 5
    one_hot_q = torch.nn.functional.one_hot(torch.tensor([1, 2, 3, 4]), 5).float()
    verdict = verify_sampled(DraftTree.chain(torch.tensor([1, 2, 3])), one_hot_q)
    assert (verdict.tokens, verdict.token) == ([1, 2, 3], 4)  # q(x) = 1: always accepted


# --- fallback to chains -----------------------------------------------------------------


class OracleTreeDrafter(Drafter):
    """A two-branch tree each step: a wrong token first, then the target's own continuation."""

    def __init__(self, continuation: list[int], depth: int = 3) -> None:
        self.continuation = continuation
        self.depth = depth

    def propose(self, ctx: DraftContext) -> DraftTree:
        i = len(ctx.tokens)
        good = self.continuation[i : i + self.depth]
        if not good:
            return DraftTree.empty()
        tokens = [(good[0] + 1) % 320] + good
        parents = (-1, -1, *range(1, len(good)))
        return DraftTree(torch.tensor(tokens), parents)


class _MaskDropper(torch.nn.Module):
    """A causal LM that silently ignores custom masks and position ids (what the probe must catch)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        return self.inner(input_ids=input_ids, **kwargs)


def _run(method, target, prompt: list[int], max_new: int, sampling=GREEDY):
    ids = torch.tensor([prompt])
    stop = StopCriteria.build(target.eos_ids, max_new)
    return method.decode(method.prefill(ids, sampling), sampling, stop, CpuTimer())


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tree_probe_in_half_precision_still_catches_a_model_that_ignores_the_mask(tiny_models, dtype):
    """Half precision judges the probe's error against the same comparison through a plain cached
    chain (the dtype's own spread): the real model passes, a mask-dropper is still refused."""
    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=dtype)
    assert probe_tree_attention(target.model, dtype) is None
    refused = probe_tree_attention(_MaskDropper(target.model), dtype)
    assert refused is not None and "differ from chain forwards" in refused and "a cached chain" in refused


def test_probe_allowance_widens_only_in_half_precision():
    assert probe_allowance(torch.float32, 1.0) == 1e-3  # float32: the fixed tolerance, whatever the floor
    assert probe_allowance(torch.bfloat16, 0.001) == 5e-2
    assert probe_allowance(torch.bfloat16, 0.03) == pytest.approx(0.12)  # 4 x the unmodified path's error
    assert probe_allowance(torch.float16, 0.0) == 5e-2


@torch.inference_mode()
def test_models_without_tree_attention_fall_back_to_chains(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    baseline = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                            target, EMPTY)
    prompt = [0, 17, 42, 99, 7]
    expected = _run(baseline, target, prompt, 20).tokens
    # the probe notices a model that ignores the mask ...
    dropper = _MaskDropper(target.model)
    assert "differ from chain forwards" in probe_tree_attention(dropper, torch.float32)
    assert probe_tree_attention(target.model, torch.float32) is None
    broken = LoadedModel(dropper, target.tokenizer, "mask-dropper", CPU, torch.float32)
    method = SpeculativeMethod(broken, EMPTY, EMPTY, drafter=OracleTreeDrafter(expected))
    with pytest.warns(RuntimeWarning, match="cannot verify token trees"):
        result = _run(method, broken, prompt, 20)
    # ... and verifying first branches only is still lossless (here: every draft is rejected)
    assert result.tokens == expected
    assert "differ from chain forwards" in result.stats["tree_fallback"]
    assert all(a == 1 for a in result.accept_lengths)
    # the real model takes the tree and accepts the second branch
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=OracleTreeDrafter(expected))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = _run(method, target, prompt, 20)
    assert result.tokens == expected and "tree_fallback" not in result.stats
    assert max(result.accept_lengths) == 4 and result.stats["tree_steps"] == len(result.accept_lengths)


@torch.inference_mode()
def test_sliding_window_caches_are_reported():
    """Dynamic sliding-window layers can be compacted (tree steps inside the window, first
    branches beyond it: tests/test_sliding_window.py); static sliding layers cannot."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    model = AutoModelForCausalLM.from_config(config).eval()
    cache = LoadedModel(model, None, "mistral", CPU, torch.float32).new_cache()
    assert static_tree_problem(model, cache) is None and sliding_window(cache) == 16
    assert "StaticSlidingWindowLayer" in static_tree_problem(model, StaticCache(config=config, max_cache_len=32))
    tree = DraftTree(torch.arange(6), PARENTS)  # 7 rows, 4 positions
    assert window_problem(cache, 8, tree) is None
    assert "sliding window of its attention layers (16 tokens)" in window_problem(cache, 9, tree)
    eager = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        attn_implementation="eager")
    assert static_tree_problem(eager, DynamicCacheFor(eager)) is None
    assert sliding_window(DynamicCacheFor(eager)) is None and window_problem(DynamicCacheFor(eager), 999, tree) is None


def DynamicCacheFor(model):  # noqa: N802 - reads like a constructor
    return LoadedModel(model, None, "m", CPU, torch.float32).new_cache()


# --- aux positions (the Lookahead hook) ------------------------------------------------------


class AuxDrafter(Drafter):
    """Proposes the right next token with a sibling, plus an aux position the engine must not verify."""

    def __init__(self, continuation: list[int]) -> None:
        self.continuation = continuation
        self.aux_logits: list[torch.Tensor] = []

    def propose(self, ctx: DraftContext) -> DraftTree:
        i = len(ctx.tokens)
        good = self.continuation[i : i + 1]
        if not good or ctx.max_depth < 1:
            return DraftTree.empty()
        # aux token 3 at offset 1 sees only the root and itself: its logits are those of root, 3
        aux = AuxBlock(torch.tensor([3]), torch.tensor([1]), torch.tensor([[1, 0, 0, 1]], dtype=torch.bool))
        return DraftTree(torch.tensor([good[0], 5]), (-1, -1), aux=aux)

    def accepted(self, feedback: Feedback) -> None:
        self.aux_logits.append(feedback.aux_logits)


@torch.inference_mode()
def test_aux_positions_are_scored_but_not_verified(tiny_models):
    target = load_model(str(tiny_models["qwen2"]), device=CPU, dtype=torch.float32)
    baseline = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                            target, EMPTY)
    prompt = [0, 17, 42, 99, 7]
    expected = _run(baseline, target, prompt, 12).tokens
    drafter = AuxDrafter(expected)
    result = _run(SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter), target, prompt, 12)
    assert result.tokens == expected
    assert drafter.aux_logits and drafter.aux_logits[0].shape == (1, target.model.config.vocab_size)
    want = _full_logits(target.model, prompt + expected[:1] + [3])  # the first step's root is expected[0]
    assert torch.allclose(drafter.aux_logits[0][0], want, atol=1e-5)


def test_stats_record_per_position_acceptance(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    baseline = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                            target, EMPTY)
    prompt = [0, 17, 42, 99, 7]
    expected = _run(baseline, target, prompt, 9).tokens
    result = _run(SpeculativeMethod(target, EMPTY, EMPTY, drafter=OracleTreeDrafter(expected)), target, prompt, 9)
    stats = result.stats
    assert result.tokens == expected and result.accept_lengths == [4, 4]
    assert stats["draft_lengths"] == [4, 4] and stats["draft_depths"] == [3, 3]
    assert stats["position_drafted"] == [2, 2, 2] and stats["position_accepted"] == [2, 2, 2]
    assert stats["drafted_tokens"] == 8 and stats["accepted_tokens"] == 6 and stats["steps"] == 2


class HiddenStateDrafter(Drafter):
    """Asks for the target's hidden states and checks their shapes (what EAGLE / Medusa heads need)."""

    needs_hidden_states = True

    def __init__(self, continuation: list[int]) -> None:
        self.inner = OracleTreeDrafter(continuation, depth=2)
        self.seen: list[tuple[int, int]] = []

    def begin(self, state, sampling) -> None:
        hidden = state.extra["hidden_states"]
        assert hidden[-1].shape[:2] == state.input_ids.shape

    def propose(self, ctx: DraftContext) -> DraftTree:
        return self.inner.propose(ctx)

    def accepted(self, feedback: Feedback) -> None:
        rows = feedback.verdict.rows
        self.seen.append((feedback.hidden_states[-1].shape[1], len(rows)))
        assert feedback.hidden_states[-1].shape[1] == feedback.logits.shape[0] == feedback.tree.n + 1


def test_hidden_states_reach_the_drafter(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    baseline = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                            target, EMPTY)
    prompt = [0, 17, 42, 99, 7]
    expected = _run(baseline, target, prompt, 15).tokens
    drafter = HiddenStateDrafter(expected)
    assert _run(SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter), target, prompt, 15).tokens == expected
    assert drafter.seen and all(rows == 3 for _, rows in drafter.seen)  # root + 2 accepted nodes each step
