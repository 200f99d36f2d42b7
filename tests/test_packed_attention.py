"""Packed attention (specbench.models.packed_sdpa): a masked step of a few rows on a grouped-query model runs
with its query rows packed per key-value head, against the cache's own keys and values, not the cache copied
per group (transformers' repeat_kv); the same logits as transformers' SDPA (float32 rounding apart); a CPU
model with grouped-query heads under SDPA gets it from load_model, unless SPECBENCH_ATTENTION=sdpa."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
from transformers.integrations import sdpa_attention

from specbench import models
from specbench.engine.target import TargetScorer, keep_rows, tree_attention_inputs
from specbench.engine.tree import DraftTree
from specbench.models import PACKED_ROWS_MAX, PACKED_SDPA, load_model

pytestmark = pytest.mark.fast
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def llama(tiny_models):
    loaded = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    assert loaded.model.config.num_key_value_heads < loaded.model.config.num_attention_heads  # grouped
    return loaded


def _block(model, cache, context: int, tree: DraftTree, kind: str) -> torch.Tensor:
    """Logits of one tree step over `context` cached positions under attention `kind`; the cache cropped back."""
    model.config._attn_implementation = kind
    try:
        out = TargetScorer(model, CPU, torch.float32).score(cache, context, 7, tree, True)
    finally:
        model.config._attn_implementation = PACKED_SDPA
    cache.crop(-tree.rows)
    return out.logits


def test_load_model_packs_a_grouped_query_cpu_model(llama):
    assert llama.model.config._attn_implementation == PACKED_SDPA


@pytest.mark.parametrize("rows", [2, 3, 8, PACKED_ROWS_MAX])
def test_a_masked_block_matches_sdpa_without_copying_the_cache(llama, rows, monkeypatch):
    model = llama.model
    cache = llama.new_cache()
    with torch.inference_mode():
        model(input_ids=torch.randint(3, 200, (1, 40)), cache=cache, use_cache=True)
        # a tree: a chain with a branch at its root, so the mask is not causal
        parents = tuple([-1, -1] + list(range(1, rows - 2))) if rows > 2 else (-1,)
        tree = DraftTree(torch.randint(3, 200, (len(parents),)), parents)
        want = _block(model, cache, 40, tree, "sdpa")
        chain = _block(model, cache, 40, DraftTree.chain(tree.tokens), "sdpa")
        copied = []
        repeat = sdpa_attention.repeat_kv
        monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda h, n: copied.append(n) or repeat(h, n))
        got = _block(model, cache, 40, tree, PACKED_SDPA)
    assert copied == [], "the packed path copied the cache per group"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert rows < 3 or not torch.allclose(want, chain, rtol=1e-5, atol=1e-5), "sanity: the tree's mask matters"


def test_a_padded_batch_matches_sdpa(llama):
    """Rows of a batch under one (batch, 1, rows, seen) mask: each row its own mask."""
    model = llama.model
    ids = torch.randint(3, 200, (2, 12))
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[1, :5] = 0  # the second row left-padded
    with torch.inference_mode():
        outs = {}
        for kind in ("sdpa", PACKED_SDPA):
            model.config._attn_implementation = kind
            cache = llama.new_cache()
            model(input_ids=ids[:, :9], attention_mask=attention[:, :9], cache=cache, use_cache=True)
            outs[kind] = model(input_ids=ids[:, 9:], attention_mask=attention, cache=cache, use_cache=True).logits
        model.config._attn_implementation = PACKED_SDPA
    torch.testing.assert_close(outs[PACKED_SDPA], outs["sdpa"], rtol=1e-5, atol=1e-5)


def test_other_steps_are_transformers_sdpa(llama, monkeypatch):
    """One row (transformers packs it already), a prefill longer than PACKED_ROWS_MAX and unmasked blocks go
    to transformers' SDPA."""
    calls = []
    sdpa = models.sdpa_attention_forward
    monkeypatch.setattr(models, "sdpa_attention_forward", lambda m, q, *a, **k: calls.append(q.shape[2]) or sdpa(
        m, q, *a, **k))
    model = llama.model
    layers = model.config.num_hidden_layers
    with torch.inference_mode():
        cache = llama.new_cache()
        model(input_ids=torch.randint(3, 200, (1, PACKED_ROWS_MAX + 1)), cache=cache, use_cache=True)
        assert calls == [PACKED_ROWS_MAX + 1] * layers
        calls.clear()
        context = PACKED_ROWS_MAX + 1
        tree = DraftTree.chain(torch.tensor([5, 6]))
        _block(model, cache, context, tree, PACKED_SDPA)
        assert calls == []
        TargetScorer(model, CPU, torch.float32).score(cache, context, 7, DraftTree.empty(), False)
        assert calls == [1] * layers
        keep_rows(cache, context, 1, [0])


def test_only_grouped_query_sdpa_cpu_models_and_the_opt_out(tiny_models, tmp_path, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["llama"])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mha")
    tokenizer.save_pretrained(tmp_path / "mha")
    mha = load_model(str(tmp_path / "mha"), device=CPU, dtype=torch.float32)
    assert mha.model.config._attn_implementation == "sdpa", "every head has its own keys: nothing to pack"
    monkeypatch.setenv(models.ATTENTION_VAR, "sdpa")
    plain = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    assert plain.model.config._attn_implementation == "sdpa"


def test_a_tree_step_under_packed_attention_is_supported(llama):
    """The engine's tree steps (a custom 4D mask) take the packed attention as they take SDPA's."""
    scorer = TargetScorer(llama.model, CPU, torch.float32)
    assert scorer.tree_support(llama.new_cache()), scorer.tree_problem
    mask, positions = tree_attention_inputs(DraftTree.chain(torch.tensor([5, 6])), 4, CPU, torch.float32)
    assert mask.shape == (1, 1, 3, 7) and positions.tolist() == [[4, 5, 6]]
