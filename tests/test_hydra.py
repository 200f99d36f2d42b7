"""Hydra (`method=hydra`): sequentially dependent heads on a static tree, lossless greedy on three
architectures and under sampling, the published MLP-head layout, bad checkpoints, `train-head`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import (
    CPU,
    EMPTY,
    PROMPTS,
    THREE_ARCHS,
    assert_matches_baseline,
    assert_one_line_error,
    chi_square_p,
    cli,
    exact_first_three,
    method_cfg,
    prompt_of,
    sample_end_to_end,
    tiny_vocab_model,
)
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftContext, SpeculativeMethod
from specbench.heads.hydra import HydraHeads, load_hydra
from specbench.heads.trees import build_tree
from specbench.methods.hydra import HydraDrafter
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = THREE_ARCHS  # conftest's `targets` and `hydra_heads` (trained once per session, distilled)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_baseline(targets, hydra_heads, arch):
    target = targets[arch]
    method = build_method(method_cfg("hydra", head=str(hydra_heads[arch])), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0
    assert any(r.stats.get("tree_steps", 0) for r in results)
    assert method.extra_parameters() == sum(p.numel() for p in method.heads.parameters())
    small = build_method(method_cfg("hydra", head=str(hydra_heads[arch]),
                                    choices=[[0], [1], [0, 0], [1, 0], [0, 0, 0]]), target, EMPTY)
    assert_matches_baseline(small, target, lengths=(2, 30))


def test_children_depend_on_their_parent(targets, hydra_heads):
    """Medusa would give every depth-1 node the same children; Hydra's depend on the parent token."""
    target = targets["llama"]
    method = build_method(method_cfg("hydra", head=str(hydra_heads["llama"]), choices=[[0], [1], [2], [0, 0], [1, 0],
                                                                                   [2, 0]]), target, EMPTY)
    input_ids = prompt_of(target, PROMPTS[1])
    state = method.prefill(input_ids, SamplingParams())
    method.drafter.begin(state, SamplingParams())
    tree = method.drafter.propose(DraftContext(input_ids, list(state.tokens), SamplingParams(), CPU, max_depth=5))
    first, second = tree.tokens[:3].tolist(), tree.tokens[3:].tolist()
    assert len(set(first)) == 3 and tree.parents == (-1, -1, -1, 0, 1, 2)
    heads_ = method.heads
    emb = target.model.get_input_embeddings()
    feature = state.extra["hidden_states"][-1][0, -1]
    root = emb(torch.tensor([state.tokens[-1]]))[0]
    with torch.no_grad():
        for token, child in zip(first, second):
            x = torch.cat([feature, root, emb(torch.tensor([token]))[0]])
            assert int(heads_.head(1, x).argmax()) == child  # each child from its own parent's prefix


def test_sampled_generation_follows_the_target():
    target = tiny_vocab_model(0)
    torch.manual_seed(3)
    hydra = HydraHeads(2, 1, 16, 5)
    with torch.no_grad():
        for p in hydra.parameters():
            p.normal_(0, 0.5)
    drafter = HydraDrafter(hydra, target.model.get_input_embeddings(), build_tree([[0], [1], [0, 0], [1, 0], [0, 1]]))
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1500)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3


def published_hydra(folder: Path, target, num_heads: int = 2, num_layers: int = 2, **config) -> Path:
    """A Hydra release: config.json and hydra_lm_head.pt, later blocks one shared module (as
    `[ResBlock(d)] * (n - 1)` saves them: the same tensors under each index)."""
    d = target.model.config.hidden_size
    vocab = target.model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    state = {}
    for k in range(num_heads):
        width = d * (k + 2)
        state[f"hydra_mlp.{k}.0.linear.weight"] = torch.randn(d, width, generator=gen) * 0.05
        state[f"hydra_mlp.{k}.0.linear.bias"] = torch.zeros(d)
        state[f"hydra_mlp.{k}.0.res_connection.weight"] = torch.randn(d, width, generator=gen) * 0.05
        state[f"hydra_mlp.{k}.0.res_connection.bias"] = torch.zeros(d)
        shared_w, shared_b = torch.randn(d, d, generator=gen) * 0.05, torch.zeros(d)
        for j in range(1, num_layers):
            state[f"hydra_mlp.{k}.{j}.linear.weight"] = shared_w
            state[f"hydra_mlp.{k}.{j}.linear.bias"] = shared_b
        state[f"hydra_lm_head.{k}.weight"] = torch.randn(vocab, d, generator=gen)
        state[f"hydra_lm_head.{k}.bias"] = torch.zeros(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "hydra_num_heads": num_heads, "hydra_num_layers": num_layers, "hydra_head_arch": "mlp",
        "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": "tiny-llama", **config}))
    torch.save(state, folder / "hydra_lm_head.pt")
    return folder


def test_published_layout_loads_and_round_trips(targets, hydra_heads, tmp_path):
    target = targets["llama"]
    folder = published_hydra(tmp_path / "published", target)
    method = build_method(method_cfg("hydra", head=str(folder)), target, EMPTY)
    assert_matches_baseline(method, target, lengths=(20,))
    d, vocab = target.model.config.hidden_size, target.model.get_output_embeddings().weight.shape[0]
    saved = hydra_heads["llama"]
    assert {"config.json", "hydra_lm_head.safetensors", "hydra_lm_head.pt"} <= {p.name for p in saved.iterdir()}
    first = load_hydra(saved, d, vocab, CPU, torch.float32)
    pt = torch.load(saved / "hydra_lm_head.pt", weights_only=True)
    assert torch.equal(first.state_dict()["hydra_mlp.1.0.res_connection.weight"],
                       pt["hydra_mlp.1.0.res_connection.weight"])
    assert pt["hydra_mlp.1.0.linear.weight"].shape == (d, 3 * d)  # head 1 reads [h, e(root), e(x1)]


def test_bad_checkpoints_get_clear_errors(targets, tmp_path):
    target = targets["llama"]

    def build(folder: Path):
        return build_method(method_cfg("hydra", head=str(folder)), target, EMPTY)

    with pytest.raises(SpecbenchError, match=r"missing hydra_mlp\.0\.3\.linear\.weight.*Hydra prefix-mlp"):
        build(published_hydra(tmp_path / "prefix", target, hydra_head_arch="prefix-mlp"))
    with pytest.raises(SpecbenchError, match="hydra_head_arch='cross-attn' is not supported"):
        build(published_hydra(tmp_path / "cross", target, hydra_head_arch="cross-attn"))
    with pytest.raises(SpecbenchError, match="hidden_state_offset=2"):
        build(published_hydra(tmp_path / "offset", target, hidden_state_offset=2))
    with pytest.raises(SpecbenchError, match="hydra_num_layers is 'two', expected an integer"):
        build(published_hydra(tmp_path / "layers", target, hydra_num_layers="two"))
    wrong = published_hydra(tmp_path / "missing", target)
    state = torch.load(wrong / "hydra_lm_head.pt", weights_only=True)
    del state["hydra_mlp.1.0.res_connection.weight"]
    torch.save(state, wrong / "hydra_lm_head.pt")
    with pytest.raises(SpecbenchError, match=r"missing hydra_mlp\.1\.0\.res_connection\.weight"):
        build(wrong)
    medusa = tmp_path / "medusa"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(SpecbenchError, match="not a Hydra head.*medusa"):
        build(medusa)
    d, vocab = target.model.config.hidden_size, target.model.get_output_embeddings().weight.shape[0]
    with pytest.raises(SpecbenchError, match="hidden size .* trained for another model"):
        load_hydra(published_hydra(tmp_path / "big", target), 2 * d, vocab, CPU, torch.float32)


def test_train_head_command_writes_a_loadable_head(targets, tiny_models, tmp_path):
    out = tmp_path / "hydra"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(["the quick brown fox jumps over the lazy dog"] * 6) for _ in range(20)))
    done = cli("train-head", "method=hydra", "model=local", f"model.path={tiny_models['llama']}", f"corpus={corpus}",
               f"out={out}", "tokens=2000", "steps=5", "method.train.num_heads=2", cwd=tmp_path)
    assert done.code == 0, done
    method = build_method(method_cfg("hydra", head=str(out)), targets["llama"], EMPTY)
    assert method.heads.num_heads == 2
    assert_matches_baseline(method, targets["llama"], lengths=(12,))
    bad = cli("train-head", "method=hydra", "model=local", f"model.path={tiny_models['llama']}",
              "method.train.num_layers=0", cwd=tmp_path)
    assert_one_line_error(bad, "setting 'num_layers' must be >= 1")
