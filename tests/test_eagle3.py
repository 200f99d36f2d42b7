"""EAGLE-3 (`method=eagle3`): lossless greedy on three architectures (full and reduced draft
vocabularies), sampled through the engine's chi-square test, the published checkpoint layout,
bad checkpoints, and training-time test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import (
    CPU,
    EMPTY,
    THREE_ARCHS,
    assert_matches_baseline,
    assert_one_line_error,
    chi_square_p,
    cli,
    exact_first_three,
    method_cfg,
    sample_end_to_end,
    tiny_vocab_model,
)
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import SpeculativeMethod
from specbench.heads.eagle import head_config_for
from specbench.heads.eagle3 import Eagle3Head, feature_layers, load_eagle3
from specbench.heads.train import train_eagle3
from specbench.methods.eagle import Eagle3Drafter
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = THREE_ARCHS  # conftest's `targets` and `eagle3_heads` (trained once per session; Qwen2's with 120 draft tokens)
#: the published EAGLE-3 key layout (one decoder layer)
PUBLISHED_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_baseline(targets, eagle3_heads, arch):
    target = targets[arch]
    method = build_method(method_cfg("eagle3", head=str(eagle3_heads[arch])), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0
    assert any(r.stats.get("tree_steps", 0) for r in results)
    assert method.extra_parameters() == sum(p.numel() for p in method.head.parameters())
    small = build_method(method_cfg("eagle3", head=str(eagle3_heads[arch]), depth=2, top_k=2, total_tokens=5), target,
                         EMPTY)
    assert_matches_baseline(small, target, lengths=(2, 30))


def test_reduced_vocabulary_drafts_only_its_tokens(targets, eagle3_heads):
    target = targets["qwen2"]
    method = build_method(method_cfg("eagle3", head=str(eagle3_heads["qwen2"])), target, EMPTY)
    head = method.head
    assert head.draft_vocab_size == 120 and int(head.t2d.sum()) == 120
    drafted = []
    original = method.drafter.propose

    def spy(ctx):
        tree = original(ctx)
        drafted.extend(tree.tokens.tolist())
        return tree

    method.drafter.propose = spy
    assert_matches_baseline(method, target, lengths=(30,))
    assert drafted and all(bool(head.t2d[t]) for t in drafted)


def test_training_time_test_teaches_the_later_steps(targets, greedy_features):
    """Unrolled training: step 1 (the head on its own outputs) agrees with the target far more
    often after training with ttt_steps=2 than with ttt_steps=1 (never trained on its outputs).
    (Its own trainings: ttt_steps is what it varies; the features are the session's.)"""
    model = targets["llama"].model
    data = greedy_features("llama", feature_layers(int(model.config.num_hidden_layers)))
    accuracy = {}
    for ttt in (1, 2):
        _, stats = train_eagle3(data, model.get_input_embeddings(), model.get_output_embeddings(), model.config,
                                steps=150, batch_rows=3, window=48, lr=5e-3, ttt_steps=ttt, seed=0)
        accuracy[ttt] = stats.accuracy
    assert len(accuracy[2]) == 2 and accuracy[2][1] > 0.3


def test_sampled_generation_follows_the_target():
    target = tiny_vocab_model(0)
    torch.manual_seed(2)
    head = Eagle3Head(head_config_for(target.model.config), 4, 5)  # token 4 is outside the draft vocabulary
    head.set_vocabulary(torch.tensor([0, 1, 2, 3]))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    head.eval()
    drafter = Eagle3Drafter(head, target.model.get_input_embeddings(), feature_layers(1), depth=1, top_k=2,
                            total_tokens=5)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1500)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3


def test_published_layout_loads(targets, eagle3_heads, tmp_path):
    """A release as published: pytorch_model.bin only, embed_tokens.weight beside the head's
    keys, the EAGLE-3 architecture in config.json."""
    target = targets["llama"]
    saved = eagle3_heads["llama"]
    state = torch.load(saved / "pytorch_model.bin", weights_only=True)
    assert set(state) == PUBLISHED_KEYS
    d = target.model.config.hidden_size
    assert state["fc.weight"].shape == (d, 3 * d) and state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * d
    release = tmp_path / "release"
    release.mkdir()
    config = json.loads((saved / "config.json").read_text())
    config.pop("specbench_head")
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    (release / "config.json").write_text(json.dumps(config))
    torch.save({**state, "embed_tokens.weight": torch.zeros(10, d)}, release / "pytorch_model.bin")
    method = build_method(method_cfg("eagle3", head=str(release)), target, EMPTY)
    assert_matches_baseline(method, target, lengths=(20,))
    vocab = target.model.get_output_embeddings().weight.shape[0]
    loaded = load_eagle3(release, d, vocab, CPU, torch.float32)
    assert torch.equal(loaded.d2t, state["d2t"])


def test_bad_checkpoints_get_clear_errors(targets, eagle3_heads, tmp_path):
    target = targets["llama"]
    d = target.model.config.hidden_size
    vocab = target.model.get_output_embeddings().weight.shape[0]

    def copy(name: str, config_changes: dict | None = None, state_changes: dict | None = None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        config = {**json.loads((eagle3_heads["llama"] / "config.json").read_text()), **(config_changes or {})}
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        state = torch.load(eagle3_heads["llama"] / "pytorch_model.bin", weights_only=True)
        for key, value in (state_changes or {}).items():
            if value is None:
                del state[key]
            else:
                state[key] = value
        torch.save(state, folder / "pytorch_model.bin")
        return folder

    # EAGLE's loader never reads `architectures`: a head whose config names plain Llama is still EAGLE-3
    plain = load_eagle3(copy("plain", {"architectures": ["LlamaForCausalLM"]}), d, vocab, CPU, torch.float32)
    assert "config names LlamaForCausalLM (never read)" in plain.provenance["variant"]
    with pytest.raises(SpecbenchError, match="hidden size .* trained for another model"):
        load_eagle3(eagle3_heads["llama"], d * 2, vocab, CPU, torch.float32)
    with pytest.raises(SpecbenchError, match="draft_vocab_size is 'many', expected a positive integer"):
        load_eagle3(copy("badvocab", {"draft_vocab_size": "many"}), d, vocab, CPU, torch.float32)
    with pytest.raises(SpecbenchError, match="missing midlayer.hidden_norm.weight"):
        load_eagle3(copy("nonorm", state_changes={"midlayer.hidden_norm.weight": None}), d, vocab, CPU, torch.float32)


def test_train_head_command_writes_a_loadable_head(targets, tiny_models, tmp_path):
    out = tmp_path / "eagle3"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(["the quick brown fox jumps over the lazy dog"] * 6) for _ in range(20)))
    done = cli("train-head", "method=eagle3", "model=local", f"model.path={tiny_models['llama']}", f"corpus={corpus}",
               f"out={out}", "tokens=2000", "steps=3", "method.train.draft_vocab=40",
               "method.train.ttt_steps=2", cwd=tmp_path)
    assert done.code == 0, done
    method = build_method(method_cfg("eagle3", head=str(out)), targets["llama"], EMPTY)
    assert method.head.draft_vocab_size == 40
    assert_matches_baseline(method, targets["llama"], lengths=(12,))
    bad = cli("train-head", "method=medusa", "model=local", f"model.path={tiny_models['llama']}",
              "method.train.ttt_steps=2", cwd=tmp_path)
    assert_one_line_error(bad, r"Could not override 'method\.train\.ttt_steps'.*method\.train\.KEY")
    # other fused layers than the published rule's: recorded in config.json, used when drafting
    top = tmp_path / "eagle3-top"
    done = cli("train-head", "method=eagle3", "model=local", f"model.path={tiny_models['llama']}", f"corpus={corpus}",
               f"out={top}", "tokens=2000", "steps=3", "method.train.layers=[0,1,2]", cwd=tmp_path)
    assert done.code == 0, done
    assert json.loads((top / "config.json").read_text())["eagle3_layers"] == [0, 1, 2]
    method = build_method(method_cfg("eagle3", head=str(top)), targets["llama"], EMPTY)
    assert method.drafter.layers == (0, 1, 2)
    assert_matches_baseline(method, targets["llama"], lengths=(12,))
    for spec, message in (("[1,2]", r"give three hidden_states indices"),
                          ("[0,1,5]", r"give three hidden_states indices in 0..2")):
        bad = cli("train-head", "method=eagle3", "model=local", f"model.path={tiny_models['llama']}",
                  f"corpus={corpus}", f"out={tmp_path / 'x'}", "tokens=2000", "steps=3", f"method.train.layers={spec}",
                  cwd=tmp_path)
        assert_one_line_error(bad, message)
