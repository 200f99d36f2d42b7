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
`grounded_heads` (true) and `hidden_state_offset` (0: the last layer). The prefix-attention
variant (Hydra++'s "prefix-mlp") and ungrounded heads (which are Medusa heads) are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.heads.checkpoint import check_keys, read_config, read_state_dict, weights_file, write_state_dict

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


class HydraHeads(nn.Module):
    """The head module, named like the published state dict."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise SpecbenchError(f"Hydra needs >= 1 head and >= 1 layer, got {num_heads} and {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.hydra_mlp = nn.ModuleList([
            nn.Sequential(HydraBlock(hidden_size, k + 1), *(HydraBlock(hidden_size) for _ in range(num_layers - 1)))
            for k in range(num_heads)
        ])
        self.hydra_lm_head = nn.ModuleList([nn.Linear(hidden_size, vocab_size) for _ in range(num_heads)])

    def init_from_lm_head(self, lm_head: nn.Module) -> None:
        """Every projection starts as the target's LM head (bias 0), as Hydra's training does."""
        for proj in self.hydra_lm_head:
            proj.weight.data.copy_(lm_head.weight.data[: self.vocab_size])
            nn.init.zeros_(proj.bias)

    def head(self, k: int, inputs: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of head k for inputs (..., d * (k + 2)): [h, e(x_{t+1}), ..., e(x_{t+k+1})]."""
        return self.hydra_lm_head[k](self.hydra_mlp[k](inputs))


def save_hydra(heads: HydraHeads, folder: Path, base_model: str = "") -> Path:
    """config.json, hydra_lm_head.pt (published) and hydra_lm_head.safetensors (read first)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"hydra_num_heads": heads.num_heads, "hydra_num_layers": heads.num_layers, "hydra_head_arch": "mlp",
              "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": base_model,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "specbench_head": "hydra"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_state_dict(dict(heads.state_dict()), folder, WEIGHT_FILES[0], WEIGHT_FILES[1])
    return folder


def _int_setting(config: dict, key: str, folder: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecbenchError(f"Hydra head config {folder / 'config.json'} has no integer '{key}'")
    return value


def load_hydra(folder: Path, hidden_size: int, vocab_size: int, device: torch.device,
               dtype: torch.dtype) -> HydraHeads:
    """Hydra heads from a folder, checked against the target's hidden size and vocabulary."""
    config = read_config(folder, "Hydra")
    if "hydra_num_heads" not in config:
        other = config.get("specbench_head") or ("medusa" if "medusa_num_heads" in config else "")
        hint = f" (it holds a {other} head)" if other else ""
        raise SpecbenchError(f"head folder {folder} is not a Hydra head{hint}; give method.head= a folder with "
                             "hydra_num_heads in its config.json")
    num_heads, num_layers = _int_setting(config, "hydra_num_heads", folder), _int_setting(config, "hydra_num_layers",
                                                                                           folder)
    arch = config.get("hydra_head_arch", "mlp")
    if arch != "mlp":
        raise SpecbenchError(f"Hydra head {folder}: hydra_head_arch={arch!r} is not supported (only the MLP heads; "
                             "the prefix-attention variant needs a decoder layer over the target's states)")
    if not config.get("grounded_heads", False):
        raise SpecbenchError(f"Hydra head {folder}: grounded_heads is false, so these are Medusa heads (no "
                             "sequential dependence); load them with method=medusa after converting, or train "
                             "grounded ones")
    if config.get("hidden_state_offset", 0) not in (0, None):
        raise SpecbenchError(f"Hydra head {folder}: hidden_state_offset={config['hidden_state_offset']} (a "
                             "hidden state other than the last layer's) is not supported")
    if num_heads < 1 or num_layers < 1:
        raise SpecbenchError(f"Hydra head config {folder / 'config.json'}: hydra_num_heads={num_heads} and "
                             f"hydra_num_layers={num_layers}; a head folder needs >= 1 head and >= 1 layer")
    path = weights_file(folder, WEIGHT_FILES, "Hydra")
    state = read_state_dict(path)
    width = state.get("hydra_mlp.0.0.linear.weight")
    if width is not None and width.ndim == 2 and width.shape[0] != hidden_size:
        raise SpecbenchError(f"Hydra head {folder} has hidden size {width.shape[0]} but the target has "
                             f"{hidden_size}: it was trained for another model")
    proj = state.get("hydra_lm_head.0.weight")
    if proj is not None and proj.ndim == 2 and proj.shape[0] != vocab_size:
        raise SpecbenchError(f"Hydra head {folder} predicts {proj.shape[0]} tokens, the target's LM head "
                             f"{vocab_size}: it was trained for another model")
    heads = HydraHeads(num_heads, num_layers, hidden_size, vocab_size)
    expected = {k: tuple(v.shape) for k, v in heads.state_dict().items()}
    check_keys(state, expected, path, "Hydra", "Hydra MLP (hydra_mlp.{k}.{j}.*, hydra_lm_head.{k}.*)")
    heads.load_state_dict(state, strict=True)
    return heads.to(device=device, dtype=dtype).eval()
