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
from specbench.heads.checkpoint import check_keys, read_config, read_state_dict, weights_file, write_state_dict

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


def load_medusa(folder: Path, hidden_size: int, vocab_size: int, device: torch.device,
                dtype: torch.dtype) -> MedusaHeads:
    """Medusa-1 heads from a folder, checked against the target's hidden size and vocabulary."""
    config = read_config(folder, "Medusa")
    if "medusa_num_heads" not in config and (config.get("specbench_head") == "eagle" or "intermediate_size" in config):
        raise SpecbenchError(f"head folder {folder} holds an EAGLE head, not a Medusa one; use it with method=eagle "
                             "or eagle2, or give method.head= a Medusa head folder")
    for key in ("medusa_num_heads", "medusa_num_layers"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool):
            raise SpecbenchError(f"Medusa head config {folder / 'config.json'} has no integer '{key}'")
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
    if num_heads < 1 or num_layers < 0:
        raise SpecbenchError(f"Medusa head config {folder / 'config.json'}: medusa_num_heads={num_heads} and "
                             f"medusa_num_layers={num_layers}; a head folder needs >= 1 head and >= 0 layers")
    path = weights_file(folder, WEIGHT_FILES, "Medusa")
    state = read_state_dict(path)
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
    # Heads beyond medusa_num_heads may be present (the published loader reads non-strictly): ignore them.
    extra = tuple(k for k in state if k.split(".", 1)[0].isdigit() and int(k.split(".", 1)[0]) >= num_heads)
    check_keys(state, expected, path, "Medusa", "Medusa-1 ({k}.{j}.linear.*, {k}.{L}.weight)", ignore=extra)
    heads.load_state_dict({f"heads.{k}": v for k, v in state.items() if k not in extra}, strict=True)
    return heads.to(device=device, dtype=dtype).eval()
