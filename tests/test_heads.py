"""EAGLE-1, EAGLE-2 and Medusa: lossless decoding with trained heads, and the published checkpoint formats.

The heads are conftest's `medusa_heads` and `eagle_heads`, trained once per session in seconds on
the tiny random targets' own greedy text (so drafts get accepted and every path of the engine is
exercised); sampled losslessness runs the engine's chi-square test through these drafters on a
five-token target.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TEXT, single_thread
from omegaconf import OmegaConf

from helpers import (
    ARCHS,
    EMPTY,
    assert_matches_baseline,
    chi_square_p,
    exact_first_three,
    method_cfg,
    sample_end_to_end,
    specbench,
    tiny_vocab_model,
)
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import SpeculativeMethod
from specbench.heads.eagle import EagleHead, head_config_for, load_eagle
from specbench.heads.medusa import MedusaHeads, load_medusa
from specbench.heads.train import chain_masks
from specbench.heads.trees import EAGLE_MC_SIM_7B_63, build_tree
from specbench.methods.eagle import DynamicTreeDrafter, StaticTreeDrafter
from specbench.methods.medusa import MedusaDrafter
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


# --- greedy: outputs equal the baseline's -------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["eagle", "eagle2", "medusa"])
def test_greedy_equals_baseline(targets, medusa_heads, eagle_heads, arch, name):
    target = targets[arch]
    folder = (medusa_heads if name == "medusa" else eagle_heads)[arch]
    method = build_method(method_cfg(name, head=str(folder)), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert all("tree_fallback" not in r.stats for r in results)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0  # the trained head's drafts were accepted
    assert any(r.stats.get("tree_steps", 0) for r in results)
    assert method.extra_parameters() == sum(
        p.numel() for p in (method.heads if name == "medusa" else method.head).parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_other_trees_and_budgets(targets, medusa_heads, eagle_heads, arch):
    target = targets[arch]
    eagle = str(eagle_heads[arch])
    for name, overrides in [("eagle", {"choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}),
                            ("eagle", {"num_nodes": 4}), ("eagle2", {"depth": 0, "top_k": 3, "total_tokens": 3}),
                            ("eagle2", {"depth": 7, "top_k": 2, "total_tokens": 12}),
                            ("medusa", {"choices": [[0], [0, 0], [1], [0, 0, 0], [0, 0, 0, 0]]})]:
        head = str(medusa_heads[arch]) if name == "medusa" else eagle
        method = build_method(method_cfg(name, head=head, **overrides), target, EMPTY)
        assert_matches_baseline(method, target, lengths=(2, 30))


def test_eagle2_trees_respect_the_budget(targets, eagle_heads):
    target = targets["llama"]
    method = build_method(method_cfg("eagle2", head=str(eagle_heads["llama"]), depth=4, top_k=3,
                                      total_tokens=9, budget="fixed"), target, EMPTY)  # the preset's trees
    results = assert_matches_baseline(method, target, lengths=(40,))
    lengths = [n for r in results for n in r.stats["draft_lengths"]]
    depths = [d for r in results for d in r.stats["draft_depths"]]
    assert max(lengths) == 8 and max(depths) <= 5 and max(depths) >= 2


# --- sampling: the engine's statistical test through these drafters -----------------------------


def _random_eagle(target) -> EagleHead:
    torch.manual_seed(3)
    head = EagleHead(head_config_for(target.model.config))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head.eval()


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle2"])
def test_sampled_tree_verification_follows_the_target(kind):
    target = tiny_vocab_model(0)
    model = target.model
    lm_head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if kind == "medusa":
        torch.manual_seed(2)
        medusa = MedusaHeads(2, 1, 16, 5)
        with torch.no_grad():
            for p in medusa.parameters():
                p.normal_(0, 1.0)
        drafter = MedusaDrafter(medusa.eval(), lm_head, build_tree([[0], [1], [0, 0], [0, 1], [1, 0]]))
    elif kind == "eagle":
        drafter = StaticTreeDrafter(_random_eagle(target), embed, lm_head, build_tree([[0], [1], [0, 0], [1, 0],
                                                                                       [1, 1]]))
    else:
        drafter = DynamicTreeDrafter(_random_eagle(target), embed, lm_head, depth=2, top_k=2, total_tokens=6)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1500)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3


# --- checkpoints: the published layouts, round trips, clear errors ------------------------------


def published_eagle(folder: Path, target, with_input_norm: bool = False) -> Path:
    """An EAGLE-1 release as published: Llama config.json, pytorch_model.bin with fc.*, layers.0.*
    (no input_layernorm) and embed_tokens.weight; random weights."""
    config = target.model.config
    d, m = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.1

    state = {"fc.weight": rand(d, 2 * d), "fc.bias": rand(d), "embed_tokens.weight": rand(config.vocab_size, d),
             "layers.0.self_attn.q_proj.weight": rand(d, d), "layers.0.self_attn.k_proj.weight": rand(kv, d),
             "layers.0.self_attn.v_proj.weight": rand(kv, d), "layers.0.self_attn.o_proj.weight": rand(d, d),
             "layers.0.mlp.gate_proj.weight": rand(m, d), "layers.0.mlp.up_proj.weight": rand(m, d),
             "layers.0.mlp.down_proj.weight": rand(d, m), "layers.0.post_attention_layernorm.weight": torch.ones(d)}
    if with_input_norm:
        state["layers.0.input_layernorm.weight"] = torch.ones(d)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": d,
        "intermediate_size": m, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048, "vocab_size": config.vocab_size, "bias": True,
    }))
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def published_medusa(folder: Path, target, num_heads: int = 3) -> Path:
    """A Medusa-1 release: config.json and medusa_lm_head.pt (the head list's state dict)."""
    d = target.model.config.hidden_size
    vocab = target.model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    state = {}
    for k in range(num_heads):
        state[f"{k}.0.linear.weight"] = torch.randn(d, d, generator=gen) * 0.1
        state[f"{k}.0.linear.bias"] = torch.zeros(d)
        state[f"{k}.1.weight"] = torch.randn(vocab, d, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "medusa_num_heads": num_heads, "medusa_num_layers": 1, "base_model_name_or_path": "tiny-llama"}))
    torch.save(state, folder / "medusa_lm_head.pt")
    return folder


@pytest.mark.parametrize("name", ["eagle", "eagle2", "medusa"])
def test_published_layouts_load_and_drive_generation(targets, tmp_path, name):
    target = targets["llama"]
    if name == "medusa":
        folder = published_medusa(tmp_path / "medusa", target)
    else:
        folder = published_eagle(tmp_path / "eagle", target, with_input_norm=name == "eagle2")
    method = build_method(method_cfg(name, head=str(folder)), target, EMPTY)
    assert_matches_baseline(method, target, lengths=(20,))
    assert method.extra_parameters() > 0


def test_saved_heads_round_trip_in_both_files(targets, medusa_heads, eagle_heads, tmp_path):
    target = targets["llama"]
    d = target.model.config.hidden_size
    vocab = target.model.get_output_embeddings().weight.shape[0]
    eagle_folder = eagle_heads["llama"]
    assert {"config.json", "model.safetensors", "pytorch_model.bin"} <= {p.name for p in eagle_folder.iterdir()}
    first = load_eagle(eagle_folder, d, vocab, CPU, torch.float32)
    published = shutil.copytree(eagle_folder, tmp_path / "published")  # the shared head's folder stays whole
    (published / "model.safetensors").unlink()  # the published file alone
    second = load_eagle(published, d, vocab, CPU, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert "layers.0.input_layernorm.weight" not in first.state_dict()  # EAGLE-1's layer 0 layout
    medusa_folder = medusa_heads["llama"]
    pt = torch.load(medusa_folder / "medusa_lm_head.pt", weights_only=True)
    assert {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight"} <= set(pt)
    loaded = load_medusa(medusa_folder, d, vocab, CPU, torch.float32)
    assert torch.equal(loaded.state_dict_published()["2.1.weight"], pt["2.1.weight"])


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_bad_checkpoints_get_clear_errors(targets, tmp_path):
    target = targets["llama"]

    def build(name: str, folder: Path):
        return build_method(method_cfg(name, head=str(folder)), target, EMPTY)

    folder = published_eagle(tmp_path / "missing", target)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["fc.weight"]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(SpecbenchError, match=r"missing fc\.weight.*EAGLE-1"):
        build("eagle", folder)
    folder = published_eagle(tmp_path / "wrong", target)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["layers.0.mlp.gate_weight"] = state.pop("layers.0.mlp.gate_proj.weight")
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(SpecbenchError, match=r"missing layers\.0\.mlp\.gate_proj\.weight; unexpected layers"):
        build("eagle2", folder)
    folder = published_medusa(tmp_path / "medusa-missing", target)
    state = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    del state["1.0.linear.bias"]
    torch.save(state, folder / "medusa_lm_head.pt")
    with pytest.raises(SpecbenchError, match=r"missing 1\.0\.linear\.bias.*Medusa-1"):
        build("medusa", folder)
    # A head for another model: one line naming the mismatch.
    other = targets["qwen2"]
    wide = published_eagle(tmp_path / "wide", target)
    config = json.loads((wide / "config.json").read_text())
    config["hidden_size"] = 128
    (wide / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecbenchError, match="hidden size 128 but the target has 64"):
        build_method(method_cfg("eagle", head=str(wide)), other, EMPTY)
    medusa = published_medusa(tmp_path / "medusa-vocab", target)
    state = torch.load(medusa / "medusa_lm_head.pt", weights_only=True)
    state = {k: (v[:100] if k.endswith(".1.weight") else v) for k, v in state.items()}
    torch.save(state, medusa / "medusa_lm_head.pt")
    with pytest.raises(SpecbenchError, match="predicts 100 tokens"):
        build("medusa", medusa)
    # Pickles that hold more than tensors are refused, never run.
    evil = published_medusa(tmp_path / "evil", target)
    with open(evil / "medusa_lm_head.pt", "wb") as fh:
        pickle.dump({"0.0.linear.weight": _Evil()}, fh, protocol=2)
    with pytest.raises(SpecbenchError, match="refused to load head weights"):
        build("medusa", evil)
    with pytest.raises(SpecbenchError, match="has no config.json"):
        build("eagle", tmp_path)
    with pytest.raises(SpecbenchError, match="needs a trained EAGLE head"):
        build_method(method_cfg("eagle", head=None), target, EMPTY)


def test_zoo_heads_are_refused_for_other_models_before_any_build(targets, monkeypatch):
    from specbench import zoo

    monkeypatch.setattr(zoo, "ensure_zoo", lambda *a, **k: pytest.fail("the zoo must not be built"))
    model_cfg = OmegaConf.create({"path": "/models/vicuna-7b", "parts": None})
    for name in ("eagle", "eagle2", "medusa"):
        # a hub model has no built parts: the default ${parts:...} head is null and asked for
        with pytest.raises(SpecbenchError, match="needs a trained .* head .*set method.head="):
            build_method(method_cfg(name), targets["llama"], model_cfg)
        # the zoo's head named outright is refused for another target
        with pytest.raises(SpecbenchError, match=r"built for zoo:target only; for /models/vicuna-7b set"):
            build_method(method_cfg(name, head=f"zoo:{'eagle' if name == 'eagle2' else name}"), targets["llama"],
                         model_cfg)


def test_static_trees_from_choices():
    tree = build_tree("eagle_mc_sim_7b_63")
    assert len(tree.parents) == len(EAGLE_MC_SIM_7B_63) == 25 and tree.max_depth == 5
    assert all(p < i for i, p in enumerate(tree.parents))
    assert len(build_tree("medusa_mc_sim_7b_63").parents) == 63
    assert len(build_tree("medusa_mc_sim_7b_63", num_nodes=10).parents) == 10
    with pytest.raises(SpecbenchError, match="has no parent"):
        build_tree([[0], [1, 0]])
    with pytest.raises(SpecbenchError, match="unknown tree"):
        build_tree("nope")


# --- training from the command line -------------------------------------------------------------


def sharegpt_corpus(path: Path) -> Path:
    """ShareGPT conversations from the tiny tokenizer's sentences, as .jsonl or .parquet."""
    records = [{"id": f"c{i}", "conversations": [{"from": "human", "value": TEXT[i % len(TEXT)]},
                                                 {"from": "gpt", "value": TEXT[(i + 1) % len(TEXT)]}]}
               for i in range(30)]
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "corpus"), [("medusa", "sharegpt.jsonl"), ("eagle", "sharegpt.parquet")])
def test_train_head_command_writes_a_loadable_head(targets, tiny_models, tmp_path, name, corpus):
    out = tmp_path / name
    proc = specbench("train-head", f"method={name}", "model=local", f"model.path={tiny_models['llama']}",
                     f"corpus={sharegpt_corpus(tmp_path / corpus)}", f"out={out}", "tokens=3000", "steps=5",
                     "threads=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.json").is_file()
    method = build_method(method_cfg(name, head=str(out)), targets["llama"], EMPTY)
    assert_matches_baseline(method, targets["llama"], lengths=(12,))


def test_every_trained_method_s_recipe_writes_a_head_that_decodes_losslessly(targets, tmp_path):
    """Each method that trains a head does so through its own recipe (its `train:` settings, its
    `train_head`), on packed rows as the zoo and train-head give them: the folder it writes loads as
    the method's head and decodes exactly the baseline's tokens."""
    from specbench.heads.recipe import HeadData, train_part
    from specbench.run.registry import discover

    registry = discover()
    assert {"medusa", "eagle", "eagle3", "hydra", "ppd", "specdec"} <= set(registry.trained())
    target = targets["llama"]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (6, 64), generator=gen)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, 50:] = False
    data = HeadData(target=target.model, tokenizer=target.tokenizer, input_ids=ids, valid=valid, base="a-path",
                    draft=lambda: target.model)
    small = {"medusa": {"num_heads": 2, "batch_positions": 32}, "eagle": {"batch_rows": 2, "window": 32},
             "hydra": {"num_heads": 2, "batch_positions": 32}, "ppd": {"batch_positions": 32},
             "eagle3": {"layers": None, "batch_rows": 2, "window": 32, "draft_vocab": 200},
             "specdec": {"block": 3, "batch_rows": 2, "window": 32, "cuts": 4}}
    for name, folder in (("medusa", "medusa"), ("eagle2", "eagle"), ("hydra", "hydra"), ("ppd", "ppd"),
                         ("eagle3", "eagle3"), ("specdec", "specdec")):
        if not (tmp_path / folder).is_dir():
            cls, settings = registry.recipe(folder, {"tokens": 256, "steps": 3, **small[folder]})
            card = train_part(cls, settings, data, tmp_path / folder, folder)
            assert card["steps"] == 3 and card["tokens"] == 4 * 50 and card["base"] == "a-path", card
        method = build_method(method_cfg(name, head=str(tmp_path / folder)), target, EMPTY)
        assert_matches_baseline(method, target, lengths=(6,))


def test_epochs_turn_into_steps_over_the_training_positions(targets):
    """`epochs` (a kit's way to size a head) becomes ceil(epochs x training positions / positions a step)
    steps; without it `steps` counts; a non-positive epochs or an unknown dtype is a one-line error."""
    from specbench.heads.recipe import HeadData
    from specbench.run.registry import discover

    target = targets["llama"]
    ids = torch.randint(5, 300, (4, 64), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, 40:] = False
    data = HeadData(target=target.model, tokenizer=target.tokenizer, input_ids=ids, valid=valid, base="x")
    registry = discover()
    _, medusa = registry.recipe("medusa", {"epochs": 2.5, "batch_positions": 32, "tokens": 128})
    assert data.positions(128) == 2 * 40 and data.steps(medusa) == 7  # ceil(2.5 * 80 / 32)
    _, eagle = registry.recipe("eagle", {"epochs": 1.0, "batch_rows": 2, "window": 16, "tokens": 10_000})
    assert data.steps(eagle) == 5  # ceil(160 / 32)
    _, fixed = registry.recipe("eagle", {"steps": 11})
    assert data.steps(fixed) == 11
    with pytest.raises(SpecbenchError, match="'epochs' must be a positive number"):
        registry.recipe("medusa", {"epochs": 0})
    with pytest.raises(SpecbenchError, match="'dtype' must be one of float32, bfloat16, auto"):
        registry.recipe("medusa", {"dtype": "half"})


TRAINED_HEADS = ["medusa", "hydra", "eagle", "ppd", "eagle3", "specdec"]


def train_small_head(name: str, model: torch.nn.Module, data, steps: int = 80, **common) -> tuple:
    """(head, top-1 per depth): one of the heads of heads.train on `data`, small settings."""
    from specbench.heads import train as ht

    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    common = {"seed": 0, "lr": 1e-2, **common}
    if name == "medusa":
        head, stats = ht.train_medusa(data, lm_head, num_heads=2, steps=steps, batch_positions=128, **common)
    elif name == "hydra":
        head, stats = ht.train_hydra(data, embed, lm_head, num_heads=2, steps=steps, batch_positions=128, **common)
    elif name == "eagle":
        head, stats = ht.train_eagle(data, embed, lm_head, model.config, steps=steps, batch_rows=3, window=48,
                                     **common)
    elif name == "ppd":
        states = ht.collect_exit_states(model, data.input_ids, data.valid, exit_layer=1)
        head, stats = ht.train_exit_head(data, states, lm_head, exit_layer=1, num_layers=2, steps=steps,
                                         batch_positions=128, **common)
    elif name == "eagle3":
        head, stats = ht.train_eagle3(data, embed, lm_head, model.config, steps=steps, batch_rows=3, window=48,
                                      **common)
    else:
        head, _, stats = ht.train_specdec(data, model, lm_head, block=3, steps=max(1, steps * 3 // 4), batch_rows=4,
                                          window=48, cuts=12, **{**common, "lr": 3e-3})
    return head, stats.accuracy


def head_data(name: str, model: torch.nn.Module, greedy_features) -> object:
    from specbench.heads.eagle3 import feature_layers

    return greedy_features("llama", feature_layers(int(model.config.num_hidden_layers)) if name == "eagle3" else None)


@pytest.mark.parametrize("name", TRAINED_HEADS)
def test_heads_train_in_bfloat16_mixed_precision_as_well_as_in_float32(targets, greedy_features, name):
    """compute_dtype=bfloat16 (a kit's `dtype: auto` on a CPU with bf16 units): the products run in
    bfloat16 (the weights come out different), the weights stay float32, and the head learns the
    target's text about as well as in float32."""
    model = targets["llama"].model
    data = head_data(name, model, greedy_features)
    with single_thread():
        full, full_acc = train_small_head(name, model, data)
        mixed, mixed_acc = train_small_head(name, model, data, compute_dtype=torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    differ = [not torch.equal(a, b) for a, b in zip(full.state_dict().values(), mixed.state_dict().values())]
    assert any(differ), "bfloat16 training gave float32's weights: autocast did not reach the products"
    print(name, "top-1 float32", full_acc, "bfloat16", mixed_acc)
    assert mixed_acc[0] >= 0.8 * full_acc[0] - 0.05 and full_acc[0] > 0.2, (full_acc, mixed_acc)


@pytest.mark.parametrize("name", TRAINED_HEADS)
def test_a_stopped_head_training_resumes_to_the_same_weights(targets, greedy_features, tmp_path, monkeypatch, name):
    """A training stopped after its 5th of 8 steps, started again with the same TrainingState, ends
    with the weights and statistics of one that never stopped; the saved progress is removed by the
    caller when the part is done (TrainingState.finish)."""
    from specbench.core import resume
    from specbench.core.resume import TrainingState

    model = targets["llama"].model
    data = head_data(name, model, greedy_features)
    state = tmp_path / "progress.pt"
    keep = resume.keep

    def stop_after_five(ckpt, done, *rest) -> None:
        keep(ckpt, done, *rest)
        if done == 5:
            raise KeyboardInterrupt

    with single_thread():
        whole, whole_acc = train_small_head(name, model, data, steps=8)
        monkeypatch.setattr(resume, "keep", stop_after_five)
        with pytest.raises(KeyboardInterrupt):
            train_small_head(name, model, data, steps=8, ckpt=TrainingState(state, every_s=0))
        assert state.is_file()
        after: list[int] = []
        monkeypatch.setattr(resume, "keep", lambda ckpt, done, *rest: after.append(done) or keep(ckpt, done, *rest))
        resumed, resumed_acc = train_small_head(name, model, data, steps=8, ckpt=TrainingState(state, every_s=0))
    assert after == (list(range(6, 9)) if name != "specdec" else [6])  # only the steps not done before
    assert resumed_acc == whole_acc
    for (key, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), key


def chain_agreement(head: EagleHead, data, model: torch.nn.Module, depth: int, window: int = 48) -> float:
    """Top-1 agreement of the `depth`-th token a head drafts in a chain (fed its own predictions, as at
    run time, attending to the teacher-forced keys before them) with the target's, over `data`."""
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    masks = chain_masks(window, depth)
    hits = seen = 0
    with torch.no_grad():
        for r in range(data.input_ids.shape[0]):
            n = int(data.valid[r].sum())
            for s in range(0, n - window - depth, window):
                ids, f = data.input_ids[r, s : s + window + depth], data.features[r, s : s + window + depth]
                positions = torch.arange(s, s + window)[None]
                cache, pred = head.new_cache(), f[None, :window]
                for j in range(depth):
                    pred = head(embed(ids[None, 1 + j : 1 + j + window]), pred, positions + j, cache, masks[j])
                hits += int((lm_head(pred[0]).argmax(-1) == lm_head(f[depth : depth + window]).argmax(-1)).sum())
                seen += window
    return hits / max(seen, 1)


def test_eagle_training_time_test_learns_the_chain_it_drafts(targets, greedy_features):
    """train_eagle(unroll=3): steps fed the head's own earlier predictions (HASS / EAGLE-3's
    training-time test) report their own top-1, and the head drafts a chain's third token in
    agreement with the target more often than the one-step head, trained as long, does."""
    model = targets["llama"].model
    data = greedy_features("llama")
    with single_thread():
        one, one_acc = train_small_head("eagle", model, data, steps=160)
        three, three_acc = train_small_head("eagle", model, data, steps=160, unroll=3)
    assert len(one_acc) == 1 and len(three_acc) == 3, (one_acc, three_acc)
    chained = [[round(chain_agreement(head, data, model, d), 3) for d in (1, 2, 3)] for head in (one, three)]
    print("top-1 per step", one_acc, three_acc, "chain", chained)
    assert chained[1][2] > chained[0][2], chained
