"""Hydra heads (Ankner et al. 2024): Medusa-style draft heads made sequentially dependent.

Head k (0-based) reads the target's feature h_t (the final-norm hidden state whose LM head gave
the pending token x_{t+1}) together with the input embeddings of x_{t+1} ... x_{t+k+1}, the
pending token and the k tokens drafted before it on the same path, and predicts x_{t+k+2}. Its
first block maps the concatenation (d * (k + 2) wide) to d with a residual projection; further
blocks are Medusa's x + SiLU(linear(x)); a vocabulary projection (with bias) ends it.

Published layout (the Hydra repository's MLP heads with `grounded_heads`): `hydra_lm_head.pt`,
the state dict of the head module: `hydra_mlp.{k}.0.linear.*` and `hydra_mlp.{k}.0.res_connection.*`
(input d * (k + 2)), `hydra_mlp.{k}.{j}.linear.*` for later blocks, `hydra_lm_head.{k}.weight` and
`.bias`; `config.json` gives `hydra_num_heads`, `hydra_num_layers`, `hydra_head_arch` ("mlp"),
`grounded_heads` (true) and `hidden_state_offset` (0: the last layer). Also read: ungrounded heads
(each reads the feature alone) and Hydra++'s `prefix-mlp` (a Llama decoder layer over the target's
features first: `PrefixLayer`); see `load_hydra` for what is tolerated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from specbench.core.errors import SpecbenchError
from specbench.heads.checkpoint import (
    check_keys,
    head_record,
    read_config,
    read_state_dict,
    warn,
    weights_file,
    write_state_dict,
)
from specbench.heads.eagle import EagleLayer, HeadCache, head_config_for, place_head

WEIGHT_FILES = ("hydra_lm_head.safetensors", "hydra_lm_head.pt")


class HydraBlock(nn.Module):
    """res(x) + SiLU(linear(x)); `conditions` extra d-wide inputs make the residual a projection.
    The linear starts at zero, so a fresh block is its residual path."""

    def __init__(self, hidden_size: int, conditions: int = 0) -> None:
        super().__init__()
        width = hidden_size * (conditions + 1)
        self.linear = nn.Linear(width, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.res_connection = nn.Linear(width, hidden_size) if conditions else nn.Identity()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res_connection(x) + self.act(self.linear(x))


class PrefixLayer(nn.Module):
    """Hydra++'s `prefix-mlp`: one Llama decoder layer and a final norm (a 1-block LlamaModel, its
    `embed_tokens` unused) over the target's features of every position so far, with its own KV cache;
    its output at the last position is what the heads read instead of the target's feature."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EagleLayer(config, input_norm=True)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, features: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """features (n, d) of the next n positions; returns the layer's normed outputs (n, d)."""
        past, n = cache.length, features.shape[0]
        positions = torch.arange(past, past + n, device=features.device)[None]
        x = features[None].to(self.norm.weight.dtype)
        cos, sin = self.rotary(x, positions)
        attend = torch.arange(past + n, device=x.device)[None] <= torch.arange(past, past + n, device=x.device)[:, None]
        return self.norm(self.layers[0](x, cos, sin, cache, 0, attend))[0]


class HydraHeads(nn.Module):
    """The head module, named like the published state dict. `grounded=False`: heads that read the
    feature alone (Hydra's ungrounded heads, Medusa-like); `prefix`: the target's Llama config, for
    `prefix-mlp` heads (their blocks and projections after a dropout each, so indexed 1, 3, ...)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int, grounded: bool = True,
                 prefix: Any = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise SpecbenchError(f"Hydra needs >= 1 head and >= 1 layer, got {num_heads} and {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.grounded = grounded

        def seq(*modules: nn.Module) -> nn.Sequential:  # prefix-mlp puts a dropout (identity here) before each
            return nn.Sequential(*(m for module in modules for m in ((nn.Dropout(0.0), module) if prefix else
                                                                        (module,))))

        self.hydra_mlp = nn.ModuleList([
            seq(HydraBlock(hidden_size, k + 1 if grounded else 0), *(HydraBlock(hidden_size)
                                                                      for _ in range(num_layers - 1)))
            for k in range(num_heads)
        ])
        self.hydra_lm_head = nn.ModuleList([seq(nn.Linear(hidden_size, vocab_size)) if prefix else
                                            nn.Linear(hidden_size, vocab_size) for _ in range(num_heads)])
        self.prefix_embeding_layer = PrefixLayer(prefix) if prefix is not None else None  # upstream's spelling

    def projection(self, k: int) -> nn.Linear:
        proj = self.hydra_lm_head[k]
        return proj[-1] if isinstance(proj, nn.Sequential) else proj

    def init_from_lm_head(self, lm_head: nn.Module) -> None:
        """Every projection starts as the target's LM head (bias 0), as Hydra's training does."""
        for k in range(self.num_heads):
            proj = self.projection(k)
            proj.weight.data.copy_(lm_head.weight.data[: self.vocab_size])
            nn.init.zeros_(proj.bias)

    def head(self, k: int, inputs: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of head k for inputs (..., d * (k + 2)): [h, e(x_{t+1}), ..., e(x_{t+k+1})]
        (an ungrounded head reads h alone)."""
        if not self.grounded:
            inputs = inputs[..., : self.hidden_size]
        return self.hydra_lm_head[k](self.hydra_mlp[k](inputs))


def save_hydra(heads: HydraHeads, folder: Path, base_model: str = "") -> Path:
    """config.json, hydra_lm_head.pt (published) and hydra_lm_head.safetensors (read first)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"hydra_num_heads": heads.num_heads, "hydra_num_layers": heads.num_layers,
              "hydra_head_arch": "prefix-mlp" if heads.prefix_embeding_layer is not None else "mlp",
              "grounded_heads": heads.grounded, "hidden_state_offset": 0, "base_model_name_or_path": base_model,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "specbench_head": "hydra"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_state_dict(dict(heads.state_dict()), folder, WEIGHT_FILES[0], WEIGHT_FILES[1])
    return folder


#: frozen copies of the target's own tensors that upstream's trainer saves with the heads (the base
#: model's embedding registered as `input_embed_fn`, the LM head of the attention variants, the unused
#: embedding of prefix-mlp's layer): upstream loads them non-strictly; the target's are used
IGNORED_KEYS = ("input_embed_fn.weight", "lm_head.weight", "prefix_embeding_layer.embed_tokens.weight")
#: config.json's settings as Hydra's HydraConfig defaults them
DEFAULTS = {"hydra_num_heads": 4, "hydra_num_layers": 1, "hydra_head_arch": "mlp", "grounded_heads": False,
            "hidden_state_offset": 0}


def _setting(config: dict, key: str, folder: Path) -> Any:
    value = config.get(key, DEFAULTS[key])
    kind = bool if key == "grounded_heads" else str if key == "hydra_head_arch" else int
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SpecbenchError(f"Hydra head config {folder / 'config.json'}: {key} is {value!r}, expected "
                             f"{'true or false' if kind is bool else 'a name' if kind is str else 'an integer'}")
    return value


def load_hydra(folder: Path, hidden_size: int, vocab_size: int, device: torch.device, dtype: torch.dtype,
               target_config: Any = None) -> HydraHeads:
    """Hydra heads from a folder, checked against the target's hidden size and vocabulary, read as
    Hydra's own loader reads them (docs/methods.md, "Published heads"): config.json's settings with
    HydraConfig's defaults; the weights decide the number of heads and blocks and whether the heads are
    grounded (a disagreement with config.json is one warning line); the frozen copies of the target's
    tensors the trainer saves are ignored; `prefix-mlp` heads need `target_config` (the layer's shape)."""
    config = read_config(folder, "Hydra")
    if "hydra_num_heads" not in config and ("medusa_num_heads" in config or "intermediate_size" in config
                                            or config.get("specbench_head") not in (None, "hydra")):
        other = config.get("specbench_head") or ("medusa" if "medusa_num_heads" in config else "EAGLE")
        raise SpecbenchError(f"head folder {folder} is not a Hydra head (it holds a {other} head); give method.head= "
                             "a folder with hydra_num_heads in its config.json")
    said = {key: _setting(config, key, folder) for key in DEFAULTS}
    arch = said["hydra_head_arch"]
    if arch not in ("mlp", "prefix-mlp"):
        raise SpecbenchError(f"Hydra head {folder}: hydra_head_arch={arch!r} is not supported (the MLP heads, "
                             "'mlp' and 'prefix-mlp', are; the attention variants need their own drafting)")
    if said["hidden_state_offset"] != 0:
        raise SpecbenchError(f"Hydra head {folder}: hidden_state_offset={said['hidden_state_offset']} (a hidden "
                             "state other than the last layer's) is not supported")
    path = weights_file(folder, WEIGHT_FILES, "Hydra")
    state = read_state_dict(path)
    prefix = arch == "prefix-mlp"
    step, first = (2, 1) if prefix else (1, 0)  # prefix-mlp: a dropout before every block and projection
    heads_in = {int(k.split(".")[1]) for k in state if k.startswith("hydra_lm_head.") and k.split(".")[1].isdigit()}
    if not heads_in:
        raise SpecbenchError(f"Hydra head {path} holds no heads (expected hydra_mlp.{{k}}.*, hydra_lm_head.{{k}}.* of "
                             f"Hydra's {arch} layout)")
    num_heads = max(heads_in) + 1
    blocks = {int(k.split(".")[2]) for k in state if k.startswith("hydra_mlp.0.") and ".linear." in k}
    num_layers = len(blocks)
    grounded = f"hydra_mlp.0.{first}.res_connection.weight" in state
    for key, found in (("hydra_num_heads", num_heads), ("hydra_num_layers", num_layers),
                       ("grounded_heads", grounded)):
        if said[key] != found:
            where = "" if key in config else f" (absent: Hydra's default {DEFAULTS[key]})"
            warn(f"Hydra head {path}: config.json says {key}={str(said[key]).lower()}{where} but the weights "
                 f"hold {str(found).lower()}; using the weights'")
    width = state.get(f"hydra_mlp.0.{first}.linear.weight")
    if width is not None and width.ndim == 2 and width.shape[0] != hidden_size:
        raise SpecbenchError(f"Hydra head {folder} has hidden size {width.shape[0]} but the target has "
                             f"{hidden_size}: it was trained for another model")
    proj = state.get(f"hydra_lm_head.0{'.1' if prefix else ''}.weight")
    if proj is not None and proj.ndim == 2 and proj.shape[0] != vocab_size:
        raise SpecbenchError(f"Hydra head {folder} predicts {proj.shape[0]} tokens, the target's LM head "
                             f"{vocab_size}: it was trained for another model")
    layer_config = None
    if prefix:
        if target_config is None:
            raise SpecbenchError(f"Hydra head {folder} is a prefix-mlp head: it needs the target's config")
        layer_config = head_config_for(target_config, 1)
    heads = HydraHeads(num_heads, max(1, num_layers), hidden_size, vocab_size, grounded, layer_config)
    expected = {k: tuple(v.shape) for k, v in heads.state_dict().items()}
    check_keys(state, expected, path, "Hydra", f"Hydra {arch} (hydra_mlp.{{k}}.{{j}}.*, hydra_lm_head.{{k}}.*"
               f"{', prefix_embeding_layer.*' if prefix else ''})", ignore=IGNORED_KEYS)
    ignored = [k for k in IGNORED_KEYS if k in state]
    for key in ignored:
        if state[key].ndim != 2 or state[key].shape[-1] != hidden_size:
            raise SpecbenchError(f"Hydra head {path}: {key} is {tuple(state[key].shape)}, the target's width is "
                                 f"{hidden_size}; it was made for another model")
    heads.load_state_dict({k: v for k, v in state.items() if k not in IGNORED_KEYS}, strict=True)
    variant = [arch, "grounded" if grounded else "ungrounded (each head reads the feature alone)",
               f"{num_heads} heads of {num_layers} block{'s' if num_layers != 1 else ''}"]
    if ignored:
        variant.append(f"{', '.join(ignored)} not read (copies of the target's, or unused upstream too)")
    heads.provenance = head_record(folder, path, "Hydra", ", ".join(variant))
    if heads.prefix_embeding_layer is not None:  # RoPE's inverse frequencies stay float32, as the target's
        return place_head(heads, device, dtype, heads.prefix_embeding_layer.rotary)
    return heads.to(device=device, dtype=dtype).eval()
