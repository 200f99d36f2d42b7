"""Sliding-window targets: token trees are verified as trees while the block stays inside the
window (the 4D tree mask then cuts nothing the sliding mask would show) and as first-branch
chains beyond it, losslessly across the boundary.

Three tiny random layouts: Mistral (every layer sliding), Qwen2 and Gemma-3 with alternating
sliding / full layers (`layer_types`). Prompts are shorter than the window; generation crosses it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, MistralConfig, Qwen2Config

from helpers import REPO
from specbench import datastore as ds
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod, TargetScorer, keep_rows
from specbench.engine.target import sliding_window, static_tree_problem, window_problem
from specbench.models import LoadedModel
from specbench.run.registry import build_method

CPU = torch.device("cpu")
GREEDY = SamplingParams()
EMPTY = OmegaConf.create({})
WINDOW = 32
ARCHS = ["mistral", "qwen2", "gemma3"]
PROMPTS = [[5, 17, 42, 99, 7, 3, 8, 9], [60, 61, 62, 60, 61, 62, 60, 61, 62, 60]]
MAX_NEW = 48  # prompt + 48 > WINDOW: every run crosses the window
# A tree with two branches at the root, a fork under node 0, a grandchild under node 3.
PARENTS = (-1, -1, 0, 0, 1, 3)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`


def make_config(arch: str, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    alternating = ["sliding_attention", "full_attention"]
    if arch == "mistral":
        return MistralConfig(**common, sliding_window=WINDOW)
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, layer_types=alternating)
    return Gemma3TextConfig(**common, head_dim=16, sliding_window=WINDOW, layer_types=alternating)


@pytest.fixture(scope="module")
def targets(tiny_models) -> dict[str, LoadedModel]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["llama"])
    out = {}
    for arch in ARCHS:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make_config(arch, len(tokenizer)), attn_implementation="sdpa")
        out[arch] = LoadedModel(model.eval(), tokenizer, f"tiny-{arch}-sliding", CPU, torch.float32)
    return out


def run(method, prompt: list[int], max_new: int = MAX_NEW):
    stop = StopCriteria.build((), max_new)
    return method.decode(method.prefill(torch.tensor([prompt]), GREEDY), GREEDY, stop, CpuTimer())


_BASELINE: dict = {}


def baseline(target: LoadedModel, prompt: list[int], max_new: int = MAX_NEW) -> list[int]:
    key = (target.path, tuple(prompt), max_new)
    if key not in _BASELINE:
        base = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                            target, EMPTY)
        _BASELINE[key] = run(base, prompt, max_new).tokens
    return _BASELINE[key]


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """The last position's logits of one uncached forward (the model's own sliding mask)."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_layouts_have_sliding_layers(targets):
    kinds = {arch: [type(layer).__name__ for layer in t.new_cache().layers] for arch, t in targets.items()}
    assert kinds["mistral"] == ["DynamicSlidingWindowLayer"] * 2
    assert kinds["qwen2"] == kinds["gemma3"] == ["DynamicSlidingWindowLayer", "GrowingLayer"]  # full attention
    for target in targets.values():
        cache = target.new_cache()
        assert static_tree_problem(target.model, cache) is None and sliding_window(cache) == WINDOW


# --- the tree forward and the compaction at the window's edge ---------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_tree_step_up_to_the_window_edge_is_exact(targets, arch):
    """A block whose deepest node sits on the window's last position: logits equal uncached
    forwards, and after keeping a non-first path (which fills the window, so the sliding layers
    drop their oldest entry) the next token's logits equal an uncached forward too."""
    model = targets[arch].model
    tree = DraftTree(torch.tensor([60, 61, 62, 63, 64, 65]), PARENTS)  # depth 3: the block spans 4 positions
    past = WINDOW - 4
    prompt = [(7 * i + 3) % 300 for i in range(past)]
    root, bonus, path = 33, 77, (0, 3, 5)
    cache = targets[arch].new_cache()
    assert window_problem(cache, past - 4, tree) is None  # past + 7 rows < window: fine without recording
    assert "sliding window" in window_problem(cache, past, tree)  # 7 rows would overflow what it keeps
    cache.activate_past_recording()
    assert window_problem(cache, past, tree) is None
    assert "sliding window" in window_problem(cache, past + 1, tree)  # node 5 would be past the window
    model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    scorer = TargetScorer(model, CPU, torch.float32)
    assert scorer.step_problem(cache, past, tree) is None, scorer.tree_problem
    logits = scorer.score(cache, past, root, tree, tree_mode=True).logits[0]
    assert torch.allclose(logits[0], full_logits(model, prompt + [root]), atol=1e-5)
    for node, nodes in enumerate(tree.layout.paths):
        want = full_logits(model, prompt + [root] + [int(tree.tokens[i]) for i in nodes])
        assert torch.allclose(logits[node + 1], want, atol=1e-5), f"node {node}"
    keep_rows(cache, past, tree.n + 1, [0, *(i + 1 for i in path)])
    assert cache.get_seq_length() == WINDOW
    sliding = cache.layers[0]
    assert sliding.cumulative_length == WINDOW and sliding.keys.shape[-2] == WINDOW - 1
    accepted = [int(tree.tokens[i]) for i in path]
    got = model(input_ids=torch.tensor([[bonus]]), cache=cache, use_cache=True).logits[0, -1]
    assert torch.allclose(got, full_logits(model, prompt + [root] + accepted + [bonus]), atol=1e-5)


# --- the loop: tree steps inside the window, first-branch chains beyond it ---------------------


class MixedDrafter(Drafter):
    """Three kinds of step in turn, each a two-branch tree of depth 3 under the root:
    0: a wrong first branch, the right continuation second (a tree accepts 3, a chain nothing);
    1: the right first branch but for its last token (both accept 2: a crop);
    2: the right first branch in full (both accept 3: nothing to crop)."""

    def __init__(self, continuation: list[int], vocab: int) -> None:
        self.continuation = continuation
        self.vocab = vocab

    def propose(self, ctx: DraftContext) -> DraftTree:
        i = len(ctx.tokens)
        good = self.continuation[i : i + 3]
        if len(good) < 3:
            return DraftTree.empty()
        wrong = [(t + 1) % self.vocab for t in good]
        kind = ctx.step % 3
        if kind == 0:
            first, second = wrong, good
        elif kind == 1:
            first, second = [*good[:2], wrong[2]], wrong
        else:
            first, second = good, wrong
        return DraftTree(torch.tensor([*first, *second]), (-1, 0, 1, -1, 3, 4))


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_steps_inside_the_window_and_chains_beyond(targets, arch):
    target = targets[arch]
    vocab = target.model.config.vocab_size
    for prompt in PROMPTS:
        expected = baseline(target, prompt)
        method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=MixedDrafter(expected, vocab))
        with pytest.warns(RuntimeWarning, match=r"cannot verify token trees \(the context outgrew .*sliding window"):
            result = run(method, prompt)
        assert result.tokens == expected
        # Tree mode exactly while the block (4 positions: root + depth 3) fits in the window.
        past, tree_steps = len(prompt), 0
        for accepted in result.accept_lengths:
            if past + 4 <= WINDOW:
                tree_steps += 1
            past += accepted
        stats = result.stats
        assert stats["tree_steps"] == tree_steps > 0
        assert f"from step {tree_steps + 1} on" in stats["tree_fallback"]
        inside, beyond = result.accept_lengths[:tree_steps], result.accept_lengths[tree_steps:-1]
        assert inside == [(4, 3, 4)[s % 3] for s in range(tree_steps)]  # the second branch is found in the tree
        assert beyond == [(1, 3, 4)[s % 3] for s in range(tree_steps, tree_steps + len(beyond))]
        assert len(beyond) >= 3  # chains past the window: rejected, cropped and fully accepted ones


# --- the real tree methods -------------------------------------------------------------------


def method_cfg(name: str, **overrides):
    """The method's YAML on its preset (`budget=fixed`: every step verifies the preset's tree, which is
    what the window's tests need), with `overrides`."""
    return OmegaConf.merge(OmegaConf.load(REPO / "configs" / "method" / f"{name}.yaml"), {"budget": "fixed"},
                           overrides)


@pytest.fixture(scope="module")
def datastores(targets, tmp_path_factory) -> dict[str, str]:
    """Per target: its own greedy continuations (right drafts) and a shifted copy (wrong branches)."""
    root = tmp_path_factory.mktemp("sliding-datastores")
    out = {}
    for arch, target in targets.items():
        docs = []
        for prompt in PROMPTS:
            doc = prompt[-4:] + baseline(target, prompt)
            docs += [doc, doc[:10] + [(t + 1) % 300 for t in doc[10:]]]
        out[arch] = str(ds.build(docs, target.tokenizer, root / arch))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_methods_equal_baseline_across_the_window(targets, datastores, arch):
    target = targets[arch]
    configs = {
        "lookahead": method_cfg("lookahead", level=4, window=3, guess=3),  # the lookahead_cpu preset
        "recycling": method_cfg("recycling", tree_size=16, max_depth=4),
        "rest": method_cfg("rest", datastore=datastores[arch]),
        "pld": method_cfg("pld"),
    }
    for name, cfg in configs.items():
        method = build_method(cfg, target, EMPTY)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the fallback beyond the window is expected
            results = [run(method, prompt) for prompt in PROMPTS]
        for prompt, result in zip(PROMPTS, results, strict=True):
            assert result.tokens == baseline(target, prompt), (name, prompt)
        if name == "pld":  # chains only: crops beyond the window
            continue
        fallbacks = [r.stats.get("tree_fallback") for r in results]
        assert all(f is None or "sliding window" in f for f in fallbacks), (name, fallbacks)
        tree_steps = [r.stats.get("tree_steps", 0) for r in results]
        assert sum(tree_steps) > 0, name
        if name != "rest":  # every step is a tree (trie or template, plus the lookahead window) until
            # the fallback, so the first tree_steps steps are the ones inside the window
            assert all(f is not None for f in fallbacks), name
            inside = [a - 1 for r, t in zip(results, tree_steps, strict=True) for a in r.accept_lengths[:t]]
            assert sum(inside) > 0, name
