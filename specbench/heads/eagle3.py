"""The EAGLE-3 draft head (Li et al. 2025): fused low, middle and high target features, token
prediction with its own (reduced) vocabulary, trained with "training-time test".

- Input features: the target's hidden states at three depths, hidden_states[i] for i in
  (2, L // 2, L - 3) of an L-block target (the inputs of those blocks, as the published code
  captures them), concatenated (3d) and mapped to d by `fc` (no bias). A head we train may record
  other indices in config.json as `eagle3_layers` (our extension; published heads have none and
  use the rule): on a shallow target L - 3 leaves a large share of the blocks out.
- One decoder layer ("midlayer") whose attention reads [input_layernorm(embedding of the next
  token), hidden_norm(h)] (2d wide): h is fc(fused features) for real positions and the layer's own
  previous output while drafting deeper nodes; the residual is h.
- The output goes through `norm` and the head's own `lm_head` over a draft vocabulary of
  `draft_vocab_size` tokens; draft id i is target id i + d2t[i], and t2d marks the target ids
  that have a draft id.

Published layout (EAGLE-3 releases, e.g. "EAGLE3-LLaMA3.1-Instruct-8B"): `config.json` a Llama
config with `architectures: ["LlamaForCausalLMEagle3"]` and `draft_vocab_size`; weights
(`model.safetensors` or `pytorch_model.bin`) `fc.weight` (d, 3d), `midlayer.input_layernorm.weight`,
`midlayer.hidden_norm.weight`, `midlayer.self_attn.{q,k,v}_proj.weight` (., 2d),
`midlayer.self_attn.o_proj.weight`, `midlayer.post_attention_layernorm.weight`,
`midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight` (draft vocab, d), `d2t`
(draft vocab,) int and `t2d` (target vocab,) bool; `embed_tokens.weight` may be present and is
ignored (the target's embedding is used).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
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
from specbench.heads.eagle import EagleAttention, EagleMLP, HeadCache, place_head

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ARCHITECTURE = "LlamaForCausalLMEagle3"


def feature_layers(num_layers: int, layers: tuple[int, ...] | list[int] | None = None) -> tuple[int, int, int]:
    """The target's hidden_states indices EAGLE-3 fuses (low, middle, high): `layers` when given
    (checked: three indices in 0..L, hidden_states[L] being the final norm's output), else the
    published rule (2, L // 2, L - 3), kept inside 1..L."""
    if layers is None:
        return min(2, num_layers), max(1, num_layers // 2), max(1, num_layers - 3)
    picked = tuple(layers)
    if len(picked) != 3 or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= num_layers
                                   for i in picked):
        raise SpecbenchError(f"EAGLE-3 feature layers {list(picked)}: give three hidden_states indices in "
                             f"0..{num_layers} (low, middle, high) for this {num_layers}-block target")
    return picked  # type: ignore[return-value]


class Eagle3Layer(nn.Module):
    """The midlayer: attention over [norm(embedding), norm(h)], residual h, then the MLP."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn = EagleAttention(config, in_features=2 * d)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.mlp = EagleMLP(config)

    def forward(self, embeds: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: HeadCache | None, attend: torch.Tensor | None) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], dim=-1)
        h = h + self.self_attn(x, cos, sin, cache, 0, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """fc (3d -> d), the midlayer, norm and the draft LM head with its vocabulary map."""

    def __init__(self, config: LlamaConfig, draft_vocab_size: int, target_vocab_size: int,
                 layers: tuple[int, ...] | None = None, target_hidden: int | None = None) -> None:
        super().__init__()
        d = int(config.hidden_size)
        #: hidden_states indices the head was trained on when they are not the published rule's
        #: (config.json `eagle3_layers`, our extension); None = feature_layers(L)
        self.layers = tuple(int(i) for i in layers) if layers else None
        if not 1 <= draft_vocab_size <= target_vocab_size:
            raise SpecbenchError(f"EAGLE-3's draft vocabulary ({draft_vocab_size}) must hold 1 to "
                                 f"{target_vocab_size} (the target's) tokens")
        self.config = config
        self.draft_vocab_size, self.target_vocab_size = draft_vocab_size, target_vocab_size
        self.fc = nn.Linear(3 * (target_hidden or d), d, bias=False)
        #: a head narrower or wider than its target (config.json `target_hidden_size`) embeds the tokens
        #: itself, at its own width; None = the target's embedding
        self.embed_tokens = nn.Embedding(target_vocab_size, d) if target_hidden and target_hidden != d else None
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)  # inv_freq is a non-persistent buffer

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def set_vocabulary(self, target_ids: torch.Tensor) -> None:
        """The draft vocabulary as the sorted target ids it keeps (draft id i = target_ids[i])."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise SpecbenchError(f"EAGLE-3 needs {self.draft_vocab_size} distinct target ids for its vocabulary")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> torch.Tensor:
        """Draft id -> target id (draft vocab,)."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None, attend: torch.Tensor | None = None) -> torch.Tensor:
        """embeds (b, n, d); features (b, n, 3d) fused target states (fc applies) or (b, n, d) the
        head's own outputs; positions (b, n). Returns the layer's outputs (b, n, d), which are
        both the next step's `features` and what `draft_logits` reads."""
        h = self.fc(features.to(self.fc.weight.dtype)) if features.shape[-1] != self.hidden_size else features
        cos, sin = self.rotary(h, positions)
        return self.midlayer(embeds.to(h.dtype), h, cos, sin, cache, attend)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (..., draft vocab)."""
        return self.lm_head(self.norm(out))

    def target_logp(self, out: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the target's vocabulary (..., V): -inf where no draft id maps."""
        logp = torch.log_softmax(self.draft_logits(out).float(), dim=-1)
        full = logp.new_full((*logp.shape[:-1], self.target_vocab_size), float("-inf"))
        return full.index_copy_(-1, self.target_ids(), logp)

    def new_cache(self) -> HeadCache:
        return HeadCache(1)


def save_eagle3(head: Eagle3Head, folder: Path, base_model: str = "") -> Path:
    """The published EAGLE-3 layout: Llama config naming the EAGLE-3 architecture, and the
    weights as model.safetensors and pytorch_model.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
                   "draft_vocab_size": head.draft_vocab_size, "vocab_size": head.target_vocab_size,
                   "base_model_name_or_path": base_model, "specbench_head": "eagle3"})
    if head.layers is not None:
        config["eagle3_layers"] = list(head.layers)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_state_dict({k: v for k, v in head.state_dict().items()}, folder, "model.safetensors", "pytorch_model.bin")
    return folder


def _eagle3_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
    """The weights with vLLM's and SpecForge's `layers.0.` naming of the midlayer read as `midlayer.`
    (EAGLE's own), and whether they were so named."""
    renamed = "layers.0.hidden_norm.weight" in state and not any(k.startswith("midlayer.") for k in state)
    if not renamed:
        return state, False
    return {("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): v
            for k, v in state.items()}, True


def load_eagle3(folder: Path, hidden_size: int, vocab_size: int, device: torch.device,
                dtype: torch.dtype) -> Eagle3Head:
    """An EAGLE-3 head from a folder, checked against the target's width and vocabulary, read as
    EAGLE's own loader reads it (docs/methods.md, "Published heads"): `architectures` is never read
    (EAGLE's training config writes plain LlamaForCausalLM), the draft vocabulary's size comes from
    the weights when config.json has none or another one (warned), `d2t` is required only when that
    vocabulary is smaller than the target's (t2d follows from it), and a head whose draft is narrower or
    wider than the target (`target_hidden_size`) brings its own embedding."""
    raw = read_config(folder, "EAGLE-3")
    path = folder / "config.json"
    if "medusa_num_heads" in raw or "hydra_num_heads" in raw:
        raise SpecbenchError(f"head folder {folder} holds a {'Medusa' if 'medusa_num_heads' in raw else 'Hydra'} "
                             "head, not an EAGLE-3 one; give method.head= an EAGLE-3 folder")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecbenchError(f"EAGLE-3 head config {path}: {key} is {value!r}, expected a positive integer")
    weights = weights_file(folder, WEIGHT_FILES, "EAGLE-3")
    state, renamed = _eagle3_state(read_state_dict(weights))
    if "draft_vocab_size" not in raw and "midlayer.hidden_norm.weight" not in state:
        raise SpecbenchError(f"head folder {folder} holds an EAGLE-1 head (no draft_vocab_size in config.json, no "
                             "hidden_norm in its weights); use it with method=eagle or eagle2, or give method.head= an "
                             "EAGLE-3 folder")
    target_hidden = raw.get("target_hidden_size")
    own_embedding = target_hidden is not None and target_hidden != raw["hidden_size"]
    if int(target_hidden if target_hidden is not None else raw["hidden_size"]) != hidden_size:
        raise SpecbenchError(f"EAGLE-3 head {folder} reads a target of hidden size "
                             f"{target_hidden if target_hidden is not None else raw['hidden_size']} but the target "
                             f"has {hidden_size}: it was trained for another model")
    if "vocab_size" in raw and raw["vocab_size"] != vocab_size:
        raise SpecbenchError(f"EAGLE-3 head {folder} maps to a vocabulary of {raw['vocab_size']} tokens, the "
                             f"target has {vocab_size}: it was trained for another model")
    variant = ["midlayer named layers.0 (vLLM / SpecForge)"] if renamed else []
    # The draft vocabulary: the weights' lm_head rows decide; config.json's draft_vocab_size is a cross-check.
    rows = state.get("lm_head.weight")
    said = raw.get("draft_vocab_size")
    if said is not None and (isinstance(said, bool) or not isinstance(said, int) or said < 1):
        raise SpecbenchError(f"EAGLE-3 head config {path}: draft_vocab_size is {said!r}, expected a positive integer")
    draft_vocab = int(rows.shape[0]) if rows is not None and rows.ndim == 2 else int(said or vocab_size)
    if said is not None and said != draft_vocab:
        warn(f"EAGLE-3 head {weights}: config.json says draft_vocab_size={said} but lm_head.weight has {draft_vocab} "
             f"rows; using the weights' {draft_vocab}")
    elif said is None:
        variant.append("draft vocabulary size from lm_head.weight")
    try:
        config = LlamaConfig.from_dict({k: v for k, v in raw.items()
                                        if k not in ("architectures", "torch_dtype", "draft_vocab_size")})
        config.num_hidden_layers = 1
        config.head_dim = int(config.hidden_size) // int(config.num_attention_heads)  # EAGLE's: hidden // heads
        if config.hidden_act not in ACT2FN:
            raise ValueError(f"unknown hidden_act {config.hidden_act!r}")
        layers = raw.get("eagle3_layers")
        if layers is not None and (not isinstance(layers, list) or len(layers) != 3
                                   or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
            raise SpecbenchError(f"EAGLE-3 head config {path}: eagle3_layers is {layers!r}, expected three "
                                 "hidden_states indices")
        head = Eagle3Head(config, draft_vocab, vocab_size, layers, target_hidden=hidden_size if own_embedding else None)
    except SpecbenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' config validation raises several types
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecbenchError(f"EAGLE-3 head config {path} is not a usable Llama config: {reason}") from None
    arch = raw.get("architectures") or []
    if ARCHITECTURE not in arch:
        variant.append(f"config names {arch[0] if arch else 'no architecture'} (never read)")
    mapped = draft_vocab < vocab_size
    if not mapped:  # the whole vocabulary: EAGLE drops d2t / t2d and maps nothing
        head.set_vocabulary(torch.arange(vocab_size))
        variant.append("full vocabulary (d2t, t2d not used)")
    elif "d2t" not in state:
        raise SpecbenchError(f"EAGLE-3 head {weights}: missing d2t, the map of its {draft_vocab}-token draft "
                             f"vocabulary into the target's {vocab_size} (EAGLE's loader would map draft id i to "
                             "target id i)")
    elif "t2d" not in state:
        variant.append("t2d derived from d2t")
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    ignored = tuple(k for k in ("embed_tokens.weight",) if not own_embedding) + \
        (("d2t", "t2d") if not mapped else ("t2d",))
    check_keys({k: v for k, v in state.items() if k not in ignored}, {k: s for k, s in expected.items()
               if k not in ignored}, weights, "EAGLE-3", "EAGLE-3 (fc, midlayer.*, norm, lm_head, d2t, t2d)")
    if not own_embedding and "embed_tokens.weight" in state:
        variant.append("embed_tokens ignored (the target's)")
    if own_embedding:
        variant.append(f"own {raw['hidden_size']}-wide embedding for a {hidden_size}-wide target")
    head.load_state_dict({k: v for k, v in state.items() if k not in ignored}, strict=False)
    if mapped:
        ids = torch.arange(draft_vocab) + state["d2t"].long()
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
            raise SpecbenchError(f"EAGLE-3 head {weights}: d2t maps draft tokens outside the target's {vocab_size} ids "
                                 "or two draft tokens to one target token")
        t2d = state.get("t2d")
        head.d2t.copy_(state["d2t"].long())  # in the file's order: lm_head's rows follow it
        head.t2d.zero_()
        head.t2d[ids] = True
        if t2d is not None and not torch.equal(t2d.bool(), head.t2d):
            warn(f"EAGLE-3 head {weights}: t2d disagrees with d2t; using d2t (as vLLM does)")
    head.provenance = head_record(folder, weights, "EAGLE-3", ", ".join(variant) or "as released")
    return place_head(head, device, dtype)
