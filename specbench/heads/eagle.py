"""The EAGLE-1 draft head: predicts the target's next feature from (next token, current feature).

Input at position t is `fc(cat(embed(token_{t+1}), feature_t))` (2d -> d), then Llama decoder
layers; the output approximates feature_{t+1}, and the target's own LM head turns it into the
distribution of token_{t+2}. "Feature" is the target's last hidden state after its final norm
(what its LM head reads), as in the published EAGLE code. The embedding is the target's.

Key layout (published EAGLE-1 `pytorch_model.bin`): `fc.weight`, `fc.bias`, and per layer i
`layers.i.self_attn.{q,k,v,o}_proj.weight`, `layers.i.mlp.{gate,up,down}_proj.weight`,
`layers.i.post_attention_layernorm.weight`; layer 0 has no `input_layernorm` (the fc output
goes in as is), later layers do. `embed_tokens.weight` may be present and is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

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

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: frozen copies of the target's own tensors that releases may hold: the target's are used (upstream's
#: loader overwrites its own embedding with the same values; a head converted for vLLM holds its LM head)
IGNORED_KEYS = ("embed_tokens.weight", "lm_head.weight")


class HeadCache:
    """The head's own KV cache: per layer (1, kv_heads, length, head_dim), cropped to what is real."""

    def __init__(self, n_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drops the draft tree's entries after a step)."""
        for i, k in enumerate(self.keys):
            if k is not None and k.shape[2] > length:
                self.keys[i] = k[:, :, :length]
                self.values[i] = self.values[i][:, :, :length]


class EagleAttention(nn.Module):
    """Llama attention on the head's own cache; `in_features` wider than the hidden size is
    EAGLE-3's layer, whose q/k/v read [embedding, feature] (2d)."""

    def __init__(self, config: LlamaConfig, in_features: int | None = None) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        h = in_features or config.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: HeadCache | None, layer: int,
                attend: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        if attend is None:  # a plain causal block with nothing before it (training, first feed)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class EagleMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, m, bias=False)
        self.up_proj = nn.Linear(h, m, bias=False)
        self.down_proj = nn.Linear(m, h, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """A Llama decoder layer; `input_norm=False` is EAGLE-1's layer 0 (its input is fc's output)."""

    def __init__(self, config: LlamaConfig, input_norm: bool) -> None:
        super().__init__()
        self.self_attn = EagleAttention(config)
        self.mlp = EagleMLP(config)
        if input_norm:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: HeadCache | None, layer: int,
                attend: torch.Tensor | None) -> torch.Tensor:
        h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = x + self.self_attn(h, cos, sin, cache, layer, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """fc (2d -> d) and Llama layers over (token embedding, feature) pairs; see the module docstring."""

    def __init__(self, config: LlamaConfig, bias: bool = True, input_norms: tuple[bool, ...] | None = None) -> None:
        super().__init__()
        n = int(config.num_hidden_layers)
        input_norms = input_norms if input_norms is not None else tuple(i != 0 for i in range(n))
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=bias)
        self.layers = nn.ModuleList([EagleLayer(config, input_norms[i]) for i in range(n)])
        self.rotary = LlamaRotaryEmbedding(config)  # inv_freq is a non-persistent buffer: not in the state dict

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None, attend: torch.Tensor | None = None) -> torch.Tensor:
        """embeds, features: (b, n, d); positions: (b, n); attend: (n, past + n) bool or None
        (causal). Returns the predicted next features (b, n, d)."""
        x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))
        cos, sin = self.rotary(x, positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, attend)
        return x

    def new_cache(self) -> HeadCache:
        return HeadCache(len(self.layers))

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}


def _setting(config: Any, names: tuple[str, ...], default: Any = None) -> Any:
    """The first of `names` that `config` sets (transformers' attribute_map aliases included)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _head_rope(text: Any) -> dict[str, Any]:
    """The target's RoPE settings for the head's (full-width) rotary embedding; targets without
    RoPE (learned positions, ALiBi) get the default."""
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict) and "rope_type" not in rope:  # per layer type (e.g. full / sliding attention)
        nested = [v for v in rope.values() if isinstance(v, dict)]
        rope = rope.get("full_attention", nested[0] if nested else None)
    if not isinstance(rope, dict) or "rope_type" not in rope:
        return {"rope_type": "default", "rope_theta": 10000.0}
    # The head rotates whole heads: a partial rotary factor (GPT-NeoX, Phi) would not fit its q/k.
    return {k: v for k, v in rope.items() if k != "partial_rotary_factor"}


def head_config_for(target_config: Any, num_layers: int = 1) -> LlamaConfig:
    """A Llama config for a head on any decoder's config: the target's width, heads, MLP size,
    norm epsilon and RoPE, read through the generic names (GPT-2's n_embd / n_head / n_inner /
    layer_norm_epsilon and the like included); what a target does not set gets a Llama default
    (MLP 4 x width, SiLU, eps 1e-6, RoPE theta 10000)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    hidden = _setting(text, ("hidden_size", "n_embd", "d_model"))
    heads = _setting(text, ("num_attention_heads", "n_head", "num_heads"))
    vocab = _setting(text, ("vocab_size",))
    if not hidden or not heads or not vocab:
        raise SpecbenchError(f"cannot size a head for {type(text).__name__}: its config names no hidden size, "
                             "attention head count or vocabulary size (hidden_size / num_attention_heads / vocab_size)")
    hidden, heads = int(hidden), int(heads)
    head_dim = int(_setting(text, ("head_dim",), 0) or hidden // heads)
    kv_heads = int(_setting(text, ("num_key_value_heads", "num_kv_heads"), heads))
    if kv_heads < 1 or heads % kv_heads:
        kv_heads = heads
    act = _setting(text, ("hidden_act", "activation_function"), "silu")
    act = act if isinstance(act, str) and act in ACT2FN else "silu"
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(_setting(text, ("intermediate_size", "n_inner", "ffn_dim"), 4 * hidden)),
        num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        hidden_act=act,
        rms_norm_eps=float(_setting(text, ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"), 1e-6)),
        max_position_embeddings=int(_setting(text, ("max_position_embeddings", "n_positions"), 2048)),
        rope_parameters=_head_rope(text), tie_word_embeddings=False,
    )


def save_eagle(head: EagleHead, folder: Path, base_model: str = "") -> Path:
    """Write a head in the published EAGLE-1 layout: Llama-style config.json, pytorch_model.bin,
    and model.safetensors with the same tensors (read first by `load_eagle`)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": head.fc.bias is not None,
                   "base_model_name_or_path": base_model, "specbench_head": "eagle"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_state_dict(head.state_dict(), folder, "model.safetensors", "pytorch_model.bin")
    return folder


def place_head(head: nn.Module, device: torch.device, dtype: torch.dtype, rotary: nn.Module | None = None
               ) -> nn.Module:
    """The head on the run's device and dtype, its RoPE inverse frequencies kept in float32 (as the
    target's and as trained): a bfloat16 / float16 copy would shift every angle by an error that
    grows with the position."""
    rotary = rotary if rotary is not None else head.rotary  # `rotary`: a layer's inside the head (Hydra's prefix)
    inv_freq = rotary.inv_freq.detach().clone()
    head = head.to(device=device, dtype=dtype).eval()
    rotary.inv_freq = inv_freq.to(device)
    rotary.original_inv_freq = inv_freq.clone().to(device)
    return head


def load_eagle(folder: Path, hidden_size: int, vocab_size: int, device: torch.device,
               dtype: torch.dtype) -> EagleHead:
    """An EAGLE-1 head from a folder, checked against the target's hidden size and vocabulary."""
    raw = read_config(folder, "EAGLE")
    path = folder / "config.json"
    if "medusa_num_heads" in raw or raw.get("specbench_head") == "medusa":
        raise SpecbenchError(f"head folder {folder} holds a Medusa head, not an EAGLE one; use it with method=medusa "
                             "or give method.head= an EAGLE head folder")
    if "draft_vocab_size" in raw or raw.get("specbench_head") == "eagle3":
        raise SpecbenchError(f"head folder {folder} holds an EAGLE-3 head (its config.json has draft_vocab_size); use "
                             "it with method=eagle3, or give method.head= an EAGLE-1 head folder")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
        if key not in raw:
            raise SpecbenchError(f"EAGLE head config {path} has no '{key}' (expected a Llama config)")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "num_key_value_heads",
                "num_hidden_layers", "head_dim", "vocab_size"):
        value = raw.get(key)
        if key in raw and value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecbenchError(f"EAGLE head config {path}: {key} is {value!r}, expected a positive integer")
    try:
        config = LlamaConfig.from_dict({k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype")})
    except Exception as exc:  # noqa: BLE001 - transformers' config validation raises several types
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecbenchError(f"EAGLE head config {path} is not a usable Llama config: {reason}") from None
    if config.hidden_act not in ACT2FN:
        raise SpecbenchError(f"EAGLE head config {path}: unknown hidden_act {config.hidden_act!r}")
    kv = int(config.num_key_value_heads or config.num_attention_heads)
    if config.num_attention_heads % kv:
        raise SpecbenchError(f"EAGLE head config {path}: {config.num_attention_heads} attention heads cannot share "
                             f"{kv} key/value heads")
    if "qkv_bias" in raw:  # EAGLE's own name for q/k/v biases (Qwen targets)
        config.attention_bias = bool(raw["qkv_bias"])
    if int(config.hidden_size) != hidden_size:
        raise SpecbenchError(f"EAGLE head {folder} has hidden size {config.hidden_size} but the target has "
                             f"{hidden_size}: it was trained for another model")
    if "vocab_size" in raw and int(raw["vocab_size"]) != vocab_size:
        raise SpecbenchError(f"EAGLE head {folder} was trained for a vocabulary of {raw['vocab_size']} tokens, "
                             f"the target has {vocab_size}")
    path = weights_file(folder, WEIGHT_FILES, "EAGLE")
    state = read_state_dict(path)
    n_layers = int(config.num_hidden_layers)
    variant = []
    # The number of layers is the config's (upstream builds num_hidden_layers of them); more in the file
    # are left out, named.
    beyond = tuple(k for k in state if k.startswith("layers.") and k.split(".")[1].isdigit()
                   and int(k.split(".")[1]) >= n_layers)
    extra = sorted({int(k.split(".")[1]) for k in beyond})
    if extra:
        warn(f"EAGLE head {path}: the weights hold layers {extra[0]}-{extra[-1]} beyond config.json's "
             f"num_hidden_layers={n_layers}; using the config's {n_layers} (as EAGLE's loader does)")
    # Support what the release has (no input_layernorm on layer 0) and heads trained with one.
    input_norms = tuple(f"layers.{i}.input_layernorm.weight" in state for i in range(n_layers))
    variant.append("layer 0 with input_layernorm" if input_norms and input_norms[0]
                   else "layer 0 without input_layernorm (the release's)")
    # fc's bias: the weights decide (they are what was trained); config.json's `bias` (EAGLE's default:
    # true) is only a cross-check.
    said = bool(raw.get("bias", True))
    bias = "fc.bias" in state if "fc.weight" in state else said
    if bias != said:
        warn(f"EAGLE head {path}: config.json says bias={'true' if said else 'false'}"
             f"{'' if 'bias' in raw else ' (absent: EAGLE defaults to true)'} but the weights "
             f"{'hold' if bias else 'have no'} fc.bias; using the weights (fc {'with' if bias else 'without'} bias)")
    variant.append("fc with bias" if bias else "fc without bias")
    if config.attention_bias:
        variant.append("q/k/v bias")
    try:
        head = EagleHead(config, bias=bias, input_norms=input_norms)
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:  # e.g. an unknown rope_type
        raise SpecbenchError(f"EAGLE head config {folder / 'config.json'} cannot build a head: "
                             f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}") from None
    check_keys(state, head.expected_shapes(), path, "EAGLE", "EAGLE-1 (fc.*, layers.N.*)",
               ignore=IGNORED_KEYS + beyond)
    for key, rows in (("embed_tokens.weight", None), ("lm_head.weight", vocab_size)):
        copy = state.get(key)
        if copy is None:
            continue
        if copy.ndim != 2 or copy.shape[-1] != hidden_size or (rows is not None and copy.shape[0] != rows):
            raise SpecbenchError(f"EAGLE head {path}: {key} is {tuple(copy.shape)}, the target's is "
                                 f"({rows or vocab_size}, {hidden_size}); it was made for another model")
        variant.append(f"{key.split('.')[0]} ignored (the target's)")
    head.load_state_dict({k: v for k, v in state.items() if k not in IGNORED_KEYS + beyond}, strict=True)
    head.provenance = head_record(folder, path, "EAGLE-1", ", ".join(variant))
    return place_head(head, device, dtype)
