"""Early-exit heads for PPD (predictive pipelined decoding, Yang et al. 2023).

The head reads the target's state after its first `exit_layer` blocks, passed through the model's
own final norm (what a layer-skipped forward of the target gives: engine.layers.LayerSkipper),
applies one residual block x + SiLU(linear(x)) (zero-initialised: a fresh head is the plain early
exit) and the target's frozen LM head. It is trained to match the full target's next-token
distribution at the same position.

PPD published no checkpoint format; ours is a folder with `config.json` (`specbench_head: ppd`,
`exit_layer`, `num_hidden_layers`, `hidden_size`, `vocab_size`, `base_model_name_or_path`) and
`exit_head.safetensors` (`linear.weight`, `linear.bias`). Nothing is pickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.heads.checkpoint import check_keys, read_config, read_state_dict, weights_file

WEIGHT_FILE = "exit_head.safetensors"


class ExitHead(nn.Module):
    """One residual block on the normed early-exit state; the logits come from the target's LM head."""

    def __init__(self, hidden_size: int, exit_layer: int, num_layers: int) -> None:
        super().__init__()
        if not 1 <= exit_layer < num_layers:
            raise SpecbenchError(f"PPD's exit layer must be in 1..{num_layers - 1} (the blocks run before the exit, "
                                 f"fewer than the model's {num_layers}), got {exit_layer}")
        self.hidden_size, self.exit_layer, self.num_layers = hidden_size, exit_layer, num_layers
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        return lm_head(hidden + self.act(self.linear(hidden)))


def save_exit_head(head: ExitHead, folder: Path, vocab_size: int, base_model: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"specbench_head": "ppd", "exit_layer": head.exit_layer, "num_hidden_layers": head.num_layers,
              "hidden_size": head.hidden_size, "vocab_size": vocab_size, "base_model_name_or_path": base_model}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in head.state_dict().items()}
    save_file(plain, str(folder / WEIGHT_FILE), metadata={"format": "pt"})
    return folder


def load_exit_head(folder: Path, hidden_size: int, vocab_size: int, num_layers: int, device: torch.device,
                   dtype: torch.dtype) -> ExitHead:
    """An exit head from a folder, checked against the target's width, vocabulary and depth."""
    config = read_config(folder, "PPD exit")
    if config.get("specbench_head") != "ppd":
        other = config.get("specbench_head") or ("medusa" if "medusa_num_heads" in config else
                                                 "hydra" if "hydra_num_heads" in config else "another kind of")
        raise SpecbenchError(f"head folder {folder} is not a PPD exit head (it holds a {other} head); give "
                             "method.head= a folder written by `train-head method=ppd`")
    for key in ("exit_layer", "num_hidden_layers", "hidden_size", "vocab_size"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool):
            raise SpecbenchError(f"PPD exit head config {folder / 'config.json'} has no integer '{key}'")
    for key, ours in (("hidden_size", hidden_size), ("vocab_size", vocab_size), ("num_hidden_layers", num_layers)):
        if config[key] != ours:
            raise SpecbenchError(f"PPD exit head {folder} was trained for a model with {key}={config[key]}, the "
                                 f"target has {ours}: it was trained for another model")
    head = ExitHead(hidden_size, config["exit_layer"], num_layers)
    path = weights_file(folder, (WEIGHT_FILE,), "PPD exit")
    state = read_state_dict(path)
    check_keys(state, {k: tuple(v.shape) for k, v in head.state_dict().items()}, path, "PPD exit",
               "exit head (linear.weight, linear.bias)")
    head.load_state_dict(state, strict=True)
    return head.to(device=device, dtype=dtype).eval()
