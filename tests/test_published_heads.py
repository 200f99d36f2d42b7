"""Published heads as their authors' loaders read them: every layout and variant docs/methods.md lists
("Published heads"), written here from the documented key lists and shapes (random weights on the
tiny targets), loads and decodes greedy-equal to the baseline; a disagreement between config.json and
the weights is one warning line, never silent; the loaded head's provenance reaches meta.json and the
report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaModel

from helpers import EMPTY, assert_matches_baseline, method_cfg
from specbench.core.errors import SpecbenchError
from specbench.core.origin import head_line as record_line
from specbench.heads.eagle import head_config_for
from specbench.heads.hydra import PrefixLayer, load_hydra
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def dims(target) -> tuple[int, int, int, int, int]:
    c = target.model.config
    return (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            target.model.get_output_embeddings().weight.shape[0])


def rand(*shape: int, gen: torch.Generator, scale: float = 0.05) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def llama_layer(prefix: str, d: int, m: int, heads: int, kv: int, gen, q_in: int | None = None,
                input_norm: bool = True, qkv_bias: bool = False) -> dict[str, torch.Tensor]:
    hd = d // heads
    q_in = q_in or d
    state = {f"{prefix}self_attn.q_proj.weight": rand(heads * hd, q_in, gen=gen),
             f"{prefix}self_attn.k_proj.weight": rand(kv * hd, q_in, gen=gen),
             f"{prefix}self_attn.v_proj.weight": rand(kv * hd, q_in, gen=gen),
             f"{prefix}self_attn.o_proj.weight": rand(d, heads * hd, gen=gen),
             f"{prefix}mlp.gate_proj.weight": rand(m, d, gen=gen), f"{prefix}mlp.up_proj.weight": rand(m, d, gen=gen),
             f"{prefix}mlp.down_proj.weight": rand(d, m, gen=gen),
             f"{prefix}post_attention_layernorm.weight": 1 + rand(d, gen=gen)}
    if input_norm:
        state[f"{prefix}input_layernorm.weight"] = 1 + rand(d, gen=gen)
    if qkv_bias:
        for name in ("q", "k", "v"):
            rows = state[f"{prefix}self_attn.{name}_proj.weight"].shape[0]
            state[f"{prefix}self_attn.{name}_proj.bias"] = rand(rows, gen=gen)
    return state


def llama_config(target, **changes) -> dict:
    d, m, heads, kv, vocab = dims(target)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": d,
            "intermediate_size": m, "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "vocab_size": vocab, **changes}


def write(folder: Path, config: dict, state: dict, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / name))
    else:
        torch.save(state, folder / name)
    return folder


# --- EAGLE-1 (and EAGLE-2, which drafts on the same head) ----------------------------------------------


def eagle1(folder: Path, target, *, bias: bool = True, config_bias: object = "same", layers: int = 1,
           config_layers: int | None = None, embed: bool = True, lm_head: bool = False, qkv_bias: bool = False,
           file: str = "pytorch_model.bin") -> Path:
    """EAGLE's release: fc (d, 2d) [+ fc.bias], layers.N.* (layer 0 without input_layernorm), embed_tokens."""
    d, m, heads, kv, vocab = dims(target)
    gen = torch.Generator().manual_seed(1)
    state = {"fc.weight": rand(d, 2 * d, gen=gen)}
    if bias:
        state["fc.bias"] = rand(d, gen=gen)
    for i in range(layers):
        state.update(llama_layer(f"layers.{i}.", d, m, heads, kv, gen, input_norm=i > 0, qkv_bias=qkv_bias))
    if embed:
        state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    if lm_head:
        state["lm_head.weight"] = target.model.get_output_embeddings().weight.detach().clone()
    config = llama_config(target, num_hidden_layers=config_layers or layers,
                          bias=bias if config_bias == "same" else config_bias)
    if qkv_bias:
        config["qkv_bias"] = True
    return write(folder, config, state, file)


def quiet_lossless(name: str, folder, target, capsys) -> tuple:
    """(method, its one provenance record): `name` with the head in `folder` decodes as the baseline
    does and loads without a warning."""
    method = build_method(method_cfg(name, head=str(folder)), target, EMPTY)
    assert_matches_baseline(method, target, lengths=(12,))
    assert "warning" not in capsys.readouterr().err
    (record,) = method.provenance()
    return method, record


EAGLE1_VARIANTS = {
    "release": {},
    "safetensors, no fc bias": {"bias": False, "file": "model.safetensors"},
    "qwen2 q/k/v bias": {"qkv_bias": True},
    "two layers": {"layers": 2},
    "without embed_tokens, with the LM head (converted for vLLM)": {"embed": False, "lm_head": True},
}


@pytest.mark.parametrize("variant", list(EAGLE1_VARIANTS))
@pytest.mark.parametrize("name", ["eagle", "eagle2"])
def test_eagle1_layouts_decode_losslessly(targets, tmp_path, variant, name, capsys):
    target = targets["qwen2" if "qwen2" in variant else "llama"]
    folder = eagle1(tmp_path / "head", target, **EAGLE1_VARIANTS[variant])
    method, record = quiet_lossless(name, folder, target, capsys)
    assert record["format"] == "EAGLE-1" and len(record["sha256"]) == 64 and record["head"] == str(folder)
    assert ("fc without bias" in record["variant"]) == ("no fc bias" in variant)


def test_eagle1_config_and_weights_disagreeing_is_one_warning(targets, tmp_path, capsys):
    target = targets["llama"]
    # config.json without `bias` (EAGLE's default: true) and weights without fc.bias (an official head's case).
    folder = eagle1(tmp_path / "nobias", target, bias=False, config_bias=None)
    method = build_method(method_cfg("eagle", head=str(folder)), target, EMPTY)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: EAGLE head") and "no fc.bias" in err[0]
    assert "absent: EAGLE defaults to true" in err[0] and method.head.fc.bias is None
    assert_matches_baseline(method, target, lengths=(12,))
    # more layers in the file than num_hidden_layers: the config's count, the rest named.
    folder = eagle1(tmp_path / "layers", target, layers=2, config_layers=1)
    method = build_method(method_cfg("eagle", head=str(folder)), target, EMPTY)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "layers 1-1 beyond config.json's num_hidden_layers=1" in err[0]
    assert len(method.head.layers) == 1


# --- EAGLE-3 -------------------------------------------------------------------------------------------


def eagle3(folder: Path, target, *, draft_vocab: int | None = 40, architecture: str = "LlamaForCausalLMEagle3",
           config_vocab: object = "same", naming: str = "midlayer.", d2t: bool = True, t2d: bool = True,
           width: int | None = None, embed: bool = False, file: str = "model.safetensors") -> Path:
    """EAGLE-3's release: fc (d, 3 d_t), midlayer.* (q/k/v reading 2d), norm, lm_head (draft vocab, d), d2t
    offsets, t2d flags; `width`: a head of another width than its target (config target_hidden_size)."""
    dt, m, heads, kv, vocab = dims(target)
    d = width or dt
    draft = draft_vocab or vocab
    gen = torch.Generator().manual_seed(3)
    state = {"fc.weight": rand(d, 3 * dt, gen=gen), "norm.weight": 1 + rand(d, gen=gen),
             "lm_head.weight": rand(draft, d, gen=gen, scale=0.5)}
    layer = llama_layer(naming, d, m, heads, kv, gen, q_in=2 * d)
    layer[f"{naming}hidden_norm.weight"] = 1 + rand(d, gen=gen)
    state.update(layer)
    ids = torch.randperm(vocab, generator=gen)[:draft].sort().values
    if draft < vocab or d2t:
        state["d2t"] = ids - torch.arange(draft)
        flags = torch.zeros(vocab, dtype=torch.bool)
        flags[ids] = True
        state["t2d"] = flags
    if not d2t:
        state.pop("d2t", None)
    if not t2d:
        state.pop("t2d", None)
    if embed or width:
        state["embed_tokens.weight"] = rand(vocab, d, gen=gen, scale=1.0)
    config = llama_config(target, architectures=[architecture], hidden_size=d,
                          draft_vocab_size=draft if config_vocab == "same" else config_vocab)
    if width:
        config["target_hidden_size"] = dt
        config["num_attention_heads"] = heads  # head_dim = width // heads
    return write(folder, config, state, file)


EAGLE3_VARIANTS = {
    "release": {"file": "pytorch_model.bin", "embed": True},
    "config names plain LlamaForCausalLM": {"architecture": "LlamaForCausalLM"},
    "midlayer named layers.0": {"naming": "layers.0."},
    "full vocabulary without d2t and t2d": {"draft_vocab": None, "d2t": False, "t2d": False},
    "without t2d": {"t2d": False},
    "no draft_vocab_size in config": {"config_vocab": None},
    "own embedding, head wider than its target (target_hidden_size)": {"width": 96},
}


@pytest.mark.parametrize("variant", list(EAGLE3_VARIANTS))
def test_eagle3_layouts_decode_losslessly(targets, tmp_path, variant, capsys):
    target = targets["llama"]
    folder = eagle3(tmp_path / "head", target, **EAGLE3_VARIANTS[variant])
    method, record = quiet_lossless("eagle3", folder, target, capsys)
    assert record["format"] == "EAGLE-3"
    if "plain" in variant:
        assert "config names LlamaForCausalLM (never read)" in record["variant"]
    drafter = method.drafter
    if "own embedding" in variant:
        assert drafter.embed is method.head.embed_tokens and method.head.fc.weight.shape == (96, 3 * 64)
    # the draft vocabulary maps where the file says
    state = (torch.load(folder / "pytorch_model.bin", weights_only=True) if (folder / "pytorch_model.bin").exists()
             else __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(folder / "model.safetensors")))
    if "d2t" in state and state["lm_head.weight"].shape[0] < dims(target)[4]:
        assert torch.equal(method.head.target_ids(), torch.arange(len(state["d2t"])) + state["d2t"])


def test_eagle3_disagreements_and_refusals(targets, tmp_path, capsys):
    target = targets["llama"]
    folder = eagle3(tmp_path / "vocab", target, config_vocab=32)
    method = build_method(method_cfg("eagle3", head=str(folder)), target, EMPTY)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "draft_vocab_size=32 but lm_head.weight has 40 rows; using the weights' 40" in err[0]
    assert method.head.draft_vocab_size == 40
    assert_matches_baseline(method, target, lengths=(12,))
    # t2d that contradicts d2t: d2t wins, named
    folder = eagle3(tmp_path / "t2d", target)
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    state["t2d"] = ~state["t2d"]
    save_file(state, str(folder / "model.safetensors"))
    build_method(method_cfg("eagle3", head=str(folder)), target, EMPTY)
    assert "t2d disagrees with d2t; using d2t" in capsys.readouterr().err
    state = load_file(str(folder / "model.safetensors"))
    state["d2t"][-1] += dims(target)[4]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(SpecbenchError, match="d2t maps draft tokens outside the target's 320 ids"):
        build_method(method_cfg("eagle3", head=str(folder)), target, EMPTY)
    with pytest.raises(SpecbenchError, match="missing d2t, the map of its 40-token draft vocabulary"):
        build_method(method_cfg("eagle3", head=str(eagle3(tmp_path / "nod2t", target, d2t=False))), target, EMPTY)
    with pytest.raises(SpecbenchError, match="holds an EAGLE-1 head .*method=eagle or eagle2"):
        build_method(method_cfg("eagle3", head=str(eagle1(tmp_path / "e1", target))), target, EMPTY)
    with pytest.raises(SpecbenchError, match="holds an EAGLE-3 head .*method=eagle3"):
        build_method(method_cfg("eagle", head=str(eagle3(tmp_path / "e3", target))), target, EMPTY)
    with pytest.raises(SpecbenchError, match="missing embed_tokens.weight"):
        folder = eagle3(tmp_path / "wide", target, width=96)
        state = load_file(str(folder / "model.safetensors"))
        del state["embed_tokens.weight"]
        save_file(state, str(folder / "model.safetensors"))
        build_method(method_cfg("eagle3", head=str(folder)), target, EMPTY)


# --- Medusa-1 ------------------------------------------------------------------------------------------


def medusa(folder: Path, target, *, heads: int = 3, layers: int = 1, config: dict | None = None,
           layout: str = "medusa", projections: bool = True, file: str = "medusa_lm_head.pt") -> Path:
    """Medusa's release: the head list's state dict ({k}.{j}.linear.*, {k}.{L}.weight); `layout`
    "medusa2": the same under medusa_head.; "vllm": blocks.{k}.layers.{j}.weight, lm_heads.{k}.weight."""
    d, _, _, _, vocab = dims(target)
    gen = torch.Generator().manual_seed(5)
    state = {}
    for k in range(heads):
        for j in range(layers):
            if layout == "vllm":
                state[f"blocks.{k}.layers.{j}.weight"] = rand(d, d, gen=gen)
            else:
                state[f"{k}.{j}.linear.weight"] = rand(d, d, gen=gen)
                state[f"{k}.{j}.linear.bias"] = rand(d, gen=gen)
        if projections:
            key = f"lm_heads.{k}.weight" if layout == "vllm" else f"{k}.{layers}.weight"
            state[key] = rand(vocab, d, gen=gen, scale=0.5)
    if layout == "medusa2":
        state = {f"medusa_head.{k}": v for k, v in state.items()}
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny-llama"}
    return write(folder, {**cfg, **(config or {})}, state, file)


MEDUSA_VARIANTS = {
    "release": {},
    "safetensors": {"file": "medusa_lm_head.safetensors"},
    "two blocks per head": {"layers": 2},
    "no projections (the target's LM head)": {"projections": False},
    "Medusa-2 keys under medusa_head.": {"layout": "medusa2"},
    "vLLM's layout": {"layout": "vllm"},
    "config without head and block counts": {"config": {"medusa_num_heads": None, "medusa_num_layers": None}},
}


@pytest.mark.parametrize("variant", list(MEDUSA_VARIANTS))
def test_medusa_layouts_decode_losslessly(targets, tmp_path, variant, capsys):
    target = targets["llama"]
    folder = medusa(tmp_path / "head", target, **MEDUSA_VARIANTS[variant])
    method, record = quiet_lossless("medusa", folder, target, capsys)
    assert method.heads.num_heads == 3 and record["format"] == "Medusa-1"


def test_medusa_head_count_comes_from_the_weights_with_a_warning(targets, tmp_path, capsys):
    """medusa-vicuna-7b-v1.3's config.json says 2 heads for the 5 its file holds."""
    target = targets["llama"]
    folder = medusa(tmp_path / "five", target, heads=5, config={"medusa_num_heads": 2})
    method = build_method(method_cfg("medusa", head=str(folder)), target, EMPTY)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: Medusa head {folder / 'medusa_lm_head.pt'}: config.json says medusa_num_heads=2 but "
                   "the weights hold 5; using the weights' 5"]
    assert method.heads.num_heads == 5
    assert_matches_baseline(method, target, lengths=(12,))


# --- Hydra ---------------------------------------------------------------------------------------------


def hydra(folder: Path, target, *, heads: int = 2, layers: int = 2, arch: str = "mlp", grounded: bool = True,
          embed: bool = True, lm_head: bool = False, config: dict | None = None) -> Path:
    """Hydra's trainer's save: hydra_mlp.{k}.{j}.* (the first block reading [h, k + 1 embeddings] with a
    res_connection when grounded; later blocks one shared module), hydra_lm_head.{k}.* with bias, the
    base embedding as input_embed_fn.weight; "prefix-mlp": a dropout before each block and projection
    (indices 1, 3, ...) and prefix_embeding_layer.* (a 1-block LlamaModel, its embed_tokens unused)."""
    d, m, nh, kv, vocab = dims(target)
    gen = torch.Generator().manual_seed(7)
    off, step = (1, 2) if arch == "prefix-mlp" else (0, 1)
    state = {}
    for k in range(heads):
        width = d * (k + 2) if grounded else d
        state[f"hydra_mlp.{k}.{off}.linear.weight"] = rand(d, width, gen=gen)
        state[f"hydra_mlp.{k}.{off}.linear.bias"] = rand(d, gen=gen)
        if grounded:
            state[f"hydra_mlp.{k}.{off}.res_connection.weight"] = rand(d, width, gen=gen)
            state[f"hydra_mlp.{k}.{off}.res_connection.bias"] = rand(d, gen=gen)
        shared = rand(d, d, gen=gen), rand(d, gen=gen)
        for j in range(1, layers):
            block = f"hydra_mlp.{k}.{off + j * step}.linear."
            state[block + "weight"], state[block + "bias"] = shared
        head = f"hydra_lm_head.{k}.{'1.' if arch == 'prefix-mlp' else ''}"
        state[head + "weight"], state[head + "bias"] = rand(vocab, d, gen=gen, scale=0.5), rand(vocab, gen=gen)
    if embed:
        state["input_embed_fn.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    if lm_head:  # the attention variants' trainer registers the base LM head too
        state["lm_head.weight"] = target.model.get_output_embeddings().weight.detach().clone()
    if arch == "prefix-mlp":
        state.update(llama_layer("prefix_embeding_layer.layers.0.", d, m, nh, kv, gen))
        state["prefix_embeding_layer.norm.weight"] = 1 + rand(d, gen=gen)
        state["prefix_embeding_layer.embed_tokens.weight"] = torch.zeros(vocab, d)
    cfg = {"hydra_num_heads": heads, "hydra_num_layers": layers, "hydra_head_arch": arch, "grounded_heads": grounded,
           "hidden_state_offset": 0, "base_model_name_or_path": "tiny-llama"}
    return write(folder, {**cfg, **(config or {})}, state, "hydra_lm_head.pt")


HYDRA_VARIANTS = {
    "trainer's save with input_embed_fn.weight": {},
    "without input_embed_fn.weight": {"embed": False},
    "with the base LM head saved beside": {"lm_head": True},
    "ungrounded": {"grounded": False},
    "prefix-mlp (the Spec-Bench head's)": {"arch": "prefix-mlp"},
    "prefix-mlp, ungrounded, one block": {"arch": "prefix-mlp", "grounded": False, "layers": 1},
    "config with HydraConfig's defaults only": {"heads": 4, "layers": 1, "grounded": False,
                                                "config": {"hydra_num_heads": None, "hydra_num_layers": None,
                                                           "hydra_head_arch": None, "grounded_heads": None}},
}


@pytest.mark.parametrize("variant", list(HYDRA_VARIANTS))
def test_hydra_layouts_decode_losslessly(targets, tmp_path, variant, capsys):
    target = targets["llama"]
    folder = hydra(tmp_path / "head", target, **HYDRA_VARIANTS[variant])
    _, record = quiet_lossless("hydra", folder, target, capsys)
    assert record["format"] == "Hydra" and ("input_embed_fn.weight" in record["variant"]) == (
        HYDRA_VARIANTS[variant].get("embed", True))


def test_hydra_grounding_from_the_weights_with_a_warning(targets, tmp_path, capsys):
    """A config.json without grounded_heads (HydraConfig's default: false) over grounded weights."""
    target = targets["llama"]
    folder = hydra(tmp_path / "head", target, config={"grounded_heads": None})
    method = build_method(method_cfg("hydra", head=str(folder)), target, EMPTY)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grounded_heads=false (absent: Hydra's default False) but the weights hold true" in err[0]
    assert method.heads.grounded
    with pytest.raises(SpecbenchError, match="hidden_state_offset=2"):
        build_method(method_cfg("hydra", head=str(hydra(tmp_path / "off", target, config={"hidden_state_offset": 2}))),
                     target, EMPTY)
    with pytest.raises(SpecbenchError, match="hydra_head_arch='eagle-attn' is not supported"):
        build_method(method_cfg("hydra", head=str(hydra(tmp_path / "attn", target,
                                                        config={"hydra_head_arch": "eagle-attn"}))), target, EMPTY)


def test_prefix_layer_equals_a_one_block_llama_model(targets, tmp_path):
    """prefix-mlp's layer against transformers' LlamaModel with the same weights (upstream's module is a
    one-block LlamaModel): fed all at once, and fed in pieces through its own cache."""
    target = targets["llama"]
    folder = hydra(tmp_path / "head", target, arch="prefix-mlp")
    d, _, _, _, vocab = dims(target)
    heads = load_hydra(folder, d, vocab, CPU, torch.float32, target.model.config)
    state = torch.load(folder / "hydra_lm_head.pt", weights_only=True)
    config = LlamaConfig(**{**target.model.config.to_dict(), "num_hidden_layers": 1})
    reference = LlamaModel(config).eval()
    reference.load_state_dict({k.removeprefix("prefix_embeding_layer."): v for k, v in state.items()
                               if k.startswith("prefix_embeding_layer.")})
    x = torch.randn(1, 9, d, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(inputs_embeds=x).last_hidden_state[0]
        from specbench.heads.eagle import HeadCache

        whole = heads.prefix_embeding_layer(x[0], HeadCache(1))
        cache = HeadCache(1)
        pieces = torch.cat([heads.prefix_embeding_layer(x[0, a:b], cache) for a, b in ((0, 4), (4, 5), (5, 9))])
    assert (whole - want).abs().max() < 3e-6 and (pieces - want).abs().max() < 3e-6
    assert isinstance(heads.prefix_embeding_layer, PrefixLayer)
    assert head_config_for(target.model.config).hidden_size == d


# --- provenance ----------------------------------------------------------------------------------------


def test_provenance_line_names_the_head():
    record = {"head": "/x/head", "hub": "org/eagle@abc", "format": "EAGLE-1", "variant": "fc with bias",
              "file": "pytorch_model.bin", "sha256": "0" * 64}
    assert record_line(record) == "org/eagle@abc: EAGLE-1 (fc with bias), pytorch_model.bin sha256 " + "0" * 16


def test_a_run_records_the_head_s_provenance_and_the_report_names_it(tiny_models, tmp_path):
    from helpers import base_args, cli, write_questions
    from specbench.core.answers import read_meta
    from specbench.models import load_model

    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    folder = medusa(tmp_path / "medusa-release", target, heads=3)
    questions, out = write_questions(tmp_path / "q.jsonl", per_category=1), tmp_path / "answers"
    result = cli(*base_args(tiny_models["llama"], questions, out, "method=medusa", f"method.head={folder}", "limit=1",
                            "task=[qa]"), cwd=tmp_path)
    assert result.code == 0, result
    (meta_path,) = (out / "spec_bench" / "local" / "medusa").rglob("meta.json")
    (record,) = read_meta(meta_path)["heads"]
    assert record["head"] == str(folder) and record["format"] == "Medusa-1" and record["file"] == "medusa_lm_head.pt"
    import hashlib

    assert record["sha256"] == hashlib.sha256((folder / "medusa_lm_head.pt").read_bytes()).hexdigest()
    report = cli("report", str(out), cwd=tmp_path)
    assert report.code == 0, report
    line = f"Head of medusa: {folder}: Medusa-1 (3 heads of 1 block, own vocabulary projections), medusa_lm_head.pt " \
           f"sha256 {record['sha256'][:16]}"
    assert line in report.out


class FakeHub:
    """huggingface_hub's HfApi and hf_hub_download over a local folder standing for a hub repository:
    LFS checksums for weights, git blob ids for config.json; `corrupt` makes a download differ."""

    def __init__(self, repo_folder: Path, cache: Path, corrupt: str | None = None) -> None:
        self.repo_folder, self.cache, self.corrupt = repo_folder, cache, corrupt
        self.downloads: list[str] = []

    def api(self):
        import hashlib
        from types import SimpleNamespace

        hub = self

        class Api:
            def model_info(self, repo, revision=None):
                return SimpleNamespace(sha="feed" * 10)

            def get_paths_info(self, repo, paths, revision=None):
                out = []
                for name in paths:
                    path = hub.repo_folder / name
                    if not path.is_file():
                        continue
                    data = path.read_bytes()
                    lfs = None if name == "config.json" else SimpleNamespace(sha256=hashlib.sha256(data).hexdigest())
                    out.append(SimpleNamespace(path=name, lfs=lfs,
                                               blob_id=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()))
                return out
        return Api

    def download(self, repo, name, revision=None):
        self.downloads.append(name)
        dest = self.cache / repo.replace("/", "--") / revision / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = (self.repo_folder / name).read_bytes()
        dest.write_bytes(data + (b"x" if name == self.corrupt else b""))
        return str(dest)


def test_a_hub_id_downloads_the_head_checked_and_names_its_commit(targets, tmp_path, monkeypatch):
    import huggingface_hub

    target = targets["llama"]
    repo = eagle1(tmp_path / "repo", target, file="pytorch_model.bin")
    torch.save({}, repo / "unrelated.bin")
    hub = FakeHub(repo, tmp_path / "hub-cache")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", hub.api())
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.download)
    method = build_method(method_cfg("eagle", head="someone/EAGLE-tiny"), target, EMPTY)
    assert hub.downloads == ["config.json", "pytorch_model.bin"]  # the first weight file the repository has
    (record,) = method.provenance()
    assert record["hub"] == "someone/EAGLE-tiny@" + "feed" * 10 and record["head"] == "someone/EAGLE-tiny"
    assert record_line(record).startswith("someone/EAGLE-tiny@feedfeed")
    assert_matches_baseline(method, target, lengths=(12,))
    # a download that does not match the hub's checksum is never used
    bad = FakeHub(repo, tmp_path / "bad-cache", corrupt="pytorch_model.bin")
    monkeypatch.setattr(huggingface_hub, "HfApi", bad.api())
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", bad.download)
    with pytest.raises(SpecbenchError, match=r"checksum mismatch for someone/EAGLE-tiny/pytorch_model.bin"):
        build_method(method_cfg("eagle", head="someone/EAGLE-tiny"), target, EMPTY)


def test_an_unreachable_hub_says_how_to_use_a_local_copy(targets, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecbenchError) as info:
        build_method(method_cfg("medusa", head="FasterDecoding/medusa-vicuna-7b-v1.3"), targets["llama"], EMPTY)
    message = str(info.value)
    assert "\n" not in message and message == (
        "Medusa head FasterDecoding/medusa-vicuna-7b-v1.3: the hub is switched off (HF_HUB_OFFLINE); download it "
        "where the hub answers (huggingface-cli download FasterDecoding/medusa-vicuna-7b-v1.3 --local-dir DIR) and "
        "set method.head=DIR")


def test_the_spec_bench_set_names_the_published_heads():
    """`run sweep=spec_bench`: Vicuna-7B v1.3 with its published heads and draft, every method in one job."""
    from hydra import compose, initialize_config_dir

    from helpers import REPO
    from specbench.run.registry import in_scope

    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=["sweep=spec_bench"])
    assert cfg.model.name == "vicuna-7b-v1.3" and cfg.dataset.name == "spec_bench" and cfg.model.draft == \
        "double7/vicuna-68m"
    scope = {"model": cfg.model}
    heads = {name: in_scope(method_cfg(name), scope).get("head") for name in ("eagle", "eagle2", "medusa", "hydra")}
    assert heads == {"eagle": "yuhuili/EAGLE-Vicuna-7B-v1.3", "eagle2": "yuhuili/EAGLE-Vicuna-7B-v1.3",
                     "medusa": "FasterDecoding/medusa-vicuna-7b-v1.3", "hydra": "ankner/hydra-vicuna-7b-v1.3"}
    assert {"medusa", "eagle", "eagle2", "hydra"} <= set(cfg.interleave)
    assert in_scope(method_cfg("eagle3"), scope).get("head") is None  # none published for Vicuna-7B
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        big = compose("config", overrides=["sweep=spec_bench", "model=vicuna-13b-v1.3"])
    assert in_scope(method_cfg("eagle3"), {"model": big.model}).get("head") == "yuhuili/EAGLE3-Vicuna1.3-13B"
