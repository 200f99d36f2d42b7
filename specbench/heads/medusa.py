"""Medusa-1 heads: K heads on the target's last hidden state, head k predicting the token k + 1
positions after the one the target's own LM head predicts.

Each head is `medusa_num_layers` residual blocks (x + SiLU(linear(x))) and a vocabulary
projection without bias. Published layout (`medusa_lm_head.pt`, the state dict of the head
list): `{k}.{j}.linear.weight`, `{k}.{j}.linear.bias` for block j of head k, and
`{k}.{L}.weight` for its projection (L = medusa_num_layers); `config.json` gives
`medusa_num_heads`, `medusa_num_layers` and `base_model_name_or_path`. Heads saved without
projections (the later "shared LM head" variant) use the target's LM head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

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

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class ResBlock(nn.Module):
    """x + SiLU(linear(x)); the linear starts at zero, so a fresh block is the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """The head list, indexed like the published state dict (`heads[k][j]`)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int,
                 projections: bool = True) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise SpecbenchError(f"Medusa needs >= 1 head and >= 0 layers, got {num_heads} and {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.has_projections = projections
        blocks = [[ResBlock(hidden_size) for _ in range(num_layers)] for _ in range(num_heads)]
        if projections:
            for b in blocks:
                b.append(nn.Linear(hidden_size, vocab_size, bias=False))
        self.heads = nn.ModuleList([nn.Sequential(*b) for b in blocks])

    def init_from_lm_head(self, lm_head: nn.Module) -> None:
        """Start every projection from the target's LM head (Medusa's initialisation)."""
        if self.has_projections:
            for head in self.heads:
                head[-1].weight.data.copy_(lm_head.weight.data[: self.vocab_size])

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | None = None, n: int | None = None) -> torch.Tensor:
        """Logits (..., K, V) of the first `n` heads (all by default) for hidden states (..., d)."""
        out = []
        for head in self.heads[: n or self.num_heads]:
            h = head(hidden)
            out.append(h if self.has_projections else lm_head(h))
        return torch.stack(out, dim=-2)

    def state_dict_published(self) -> dict[str, torch.Tensor]:
        """Keys as the published ModuleList: `heads.0.0.linear.weight` -> `0.0.linear.weight`."""
        return {k.removeprefix("heads."): v for k, v in self.state_dict().items()}


def save_medusa(heads: MedusaHeads, folder: Path, base_model: str = "") -> Path:
    """config.json, medusa_lm_head.pt (published) and medusa_lm_head.safetensors (read first)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": base_model, "hidden_size": heads.hidden_size,
              "vocab_size": heads.vocab_size, "specbench_head": "medusa"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_state_dict(heads.state_dict_published(), folder, WEIGHT_FILES[0], WEIGHT_FILES[1])
    return folder


def _medusa_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str | None]:
    """The head list's keys as Medusa's `medusa_lm_head.pt` names them (`{k}.{j}.linear.*`, `{k}.{L}.weight`),
    from that layout, from a Medusa-2 model's `medusa_head.` prefix, or from vLLM's (`blocks.{k}.layers.{j}.*`,
    `lm_heads.{k}.weight`; a block without a bias gets a zero one); and the variant's name."""
    if any(k.startswith("medusa_head.") for k in state):
        return {k.removeprefix("medusa_head."): v for k, v in state.items() if k.startswith("medusa_head.")}, \
            "keys under medusa_head. (Medusa-2)"
    if not any(k.startswith(("blocks.", "lm_heads.")) for k in state):
        return state, None
    out: dict[str, torch.Tensor] = {}
    layers = 1 + max((int(k.split(".")[3]) for k in state if k.startswith("blocks.") and k.count(".") >= 4), default=-1)
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "blocks" and len(parts) == 5:  # blocks.{k}.layers.{j}.weight|bias
            out[f"{parts[1]}.{parts[3]}.linear.{parts[4]}"] = value
            if parts[4] == "weight" and f"blocks.{parts[1]}.layers.{parts[3]}.bias" not in state:
                out[f"{parts[1]}.{parts[3]}.linear.bias"] = torch.zeros(value.shape[0], dtype=value.dtype)
        elif parts[0] == "lm_heads" and len(parts) == 3:
            out[f"{parts[1]}.{layers}.weight"] = value
        else:
            out[key] = value
    return out, "vLLM's layout (blocks.*, lm_heads.*)"


def load_medusa(folder: Path, hidden_size: int, vocab_size: int, device: torch.device,
                dtype: torch.dtype) -> MedusaHeads:
    """Medusa-1 heads from a folder, checked against the target's hidden size and vocabulary.

    The weights decide how many heads and blocks there are (Medusa's own loaders read them
    non-strictly under a config that published releases got wrong: medusa-vicuna-7b-v1.3's says 2
    heads for the 5 it holds, and Medusa's newer loader forces 5); config.json's `medusa_num_heads`
    and `medusa_num_layers` are a cross-check, warned about in one line when they disagree."""
    config = read_config(folder, "Medusa")
    if "medusa_num_heads" not in config and (config.get("specbench_head") in ("eagle", "eagle3")
                                            or "intermediate_size" in config or "hydra_num_heads" in config):
        other = "a Hydra" if "hydra_num_heads" in config else "an EAGLE"
        raise SpecbenchError(f"head folder {folder} holds {other} head, not a Medusa one; give method.head= a Medusa "
                             "head folder")
    said = {}
    for key in ("medusa_num_heads", "medusa_num_layers"):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SpecbenchError(f"Medusa head config {folder / 'config.json'}: {key} is {value!r}, expected a "
                                 "non-negative integer")
        said[key] = value
    if said["medusa_num_heads"] == 0:
        raise SpecbenchError(f"Medusa head config {folder / 'config.json'}: medusa_num_heads=0 and medusa_num_layers="
                             f"{said['medusa_num_layers']}; a head folder needs >= 1 head and >= 0 layers")
    path = weights_file(folder, WEIGHT_FILES, "Medusa")
    state, variant = _medusa_state(read_state_dict(path))
    heads_in = sorted({int(k.split(".", 1)[0]) for k in state if k.split(".", 1)[0].isdigit()})
    if not heads_in:
        raise SpecbenchError(f"Medusa head {path} holds no heads (expected the Medusa-1 keys "
                             "{k}.{j}.linear.*, {k}.{L}.weight)")
    num_heads = heads_in[-1] + 1
    num_layers = len({k.split(".")[1] for k in state if k.startswith("0.") and ".linear." in k})
    for key, found in (("medusa_num_heads", num_heads), ("medusa_num_layers", num_layers)):
        if said[key] is not None and said[key] != found:
            warn(f"Medusa head {path}: config.json says {key}={said[key]} but the weights hold {found}; using the "
                 f"weights' {found}")
    width = state.get("0.0.linear.weight", state.get(f"0.{num_layers}.weight"))
    if width is not None and width.shape[-1] != hidden_size:
        raise SpecbenchError(f"Medusa head {folder} has hidden size {width.shape[-1]} but the target has "
                             f"{hidden_size}: it was trained for another model")
    projections = f"0.{num_layers}.weight" in state
    head_vocab = int(state[f"0.{num_layers}.weight"].shape[0]) if projections else vocab_size
    if projections and head_vocab != vocab_size:
        raise SpecbenchError(f"Medusa head {folder} predicts {head_vocab} tokens, the target's LM head "
                             f"{vocab_size}: it was trained for another model")
    heads = MedusaHeads(num_heads, num_layers, hidden_size, head_vocab, projections)
    expected = {k.removeprefix("heads."): tuple(v.shape) for k, v in heads.state_dict().items()}
    check_keys(state, expected, path, "Medusa", "Medusa-1 ({k}.{j}.linear.*, {k}.{L}.weight)")
    heads.load_state_dict({f"heads.{k}": v for k, v in state.items()}, strict=True)
    described = [variant] if variant else []
    described.append(f"{num_heads} heads of {num_layers} block{'s' if num_layers != 1 else ''}")
    described.append("own vocabulary projections" if projections else "the target's LM head (no projections)")
    heads.provenance = head_record(folder, path, "Medusa-1", ", ".join(described))
    return heads.to(device=device, dtype=dtype).eval()
