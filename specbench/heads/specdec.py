"""SpecDec's non-autoregressive drafter (Xia et al. 2023, "Speculative Decoding: Exploiting
Speculative Execution for Accelerating Seq2seq Generation"), for decoder-only targets.

The paper's drafter reads the source with a deep encoder and predicts a block of k target tokens
at once from k [MASK] queries with a shallow decoder. Here the drafter is a small causal LM (on
the zoo: fine-tuned from the distilled draft) plus k - 1 learned mask embeddings: one forward
feeds the real tokens the drafter has not seen (the pending token last) followed by the k - 1
mask embeddings at the next k - 1 positions. The pending token's row predicts draft token 1 and
mask slot i's row draft token i + 2; causal attention lets a slot see the context and the slots
before it, never a drafted token. So all k tokens come from one forward, whatever k is.

Training (heads.train.train_specdec) distils the target: at many cut points c of a row at once
(one forward with a 4D mask, `training_layout`), the real row c and the k - 1 slots placed after
it learn the target's next-token distributions at positions c + 1 ... c + k.

Format (ours; the paper published fairseq checkpoints of encoder-decoder models, which do not
apply to decoder-only targets): a folder that is a Hugging Face causal LM (config.json,
model.safetensors, the tokenizer) plus `specdec.json` (`specbench_head: specdec`, `block`,
`vocab_size`, `base_model_name_or_path`) and `mask_queries.safetensors` (`embeddings`,
(block - 1, hidden)). Nothing is pickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.heads.checkpoint import check_keys, read_state_dict

HEAD_CONFIG = "specdec.json"
QUERY_FILE = "mask_queries.safetensors"


class MaskQueries(nn.Module):
    """The k - 1 learned query embeddings (the NAR drafter's [MASK] slots)."""

    def __init__(self, block: int, hidden_size: int) -> None:
        super().__init__()
        if block < 2:
            raise SpecbenchError(f"SpecDec's block (tokens drafted per forward) must be at least 2, got {block}")
        self.embeddings = nn.Parameter(torch.zeros(block - 1, hidden_size))

    @property
    def block(self) -> int:
        return int(self.embeddings.shape[0]) + 1


def training_layout(n_real: int, cuts: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which position sees which in one training row: `n_real` real tokens, then for each cut c the
    block - 1 mask slots that follow it. Returns (allow (N, N) bool, positions (N,) long) with
    N = n_real + len(cuts) * (block - 1): real tokens attend causally; slot i of cut c sits at
    position c + 1 + i and sees the real tokens up to c and the slots of its own cut up to itself,
    exactly what it sees when drafting."""
    slots = block - 1
    m = int(cuts.shape[0])
    n = n_real + m * slots
    allow = torch.zeros(n, n, dtype=torch.bool)
    allow[:n_real, :n_real] = torch.ones(n_real, n_real, dtype=torch.bool).tril()
    cut_of = cuts.repeat_interleave(slots)  # (m * slots,)
    slot_of = torch.arange(slots).repeat(m)
    allow[n_real:, :n_real] = torch.arange(n_real)[None, :] <= cut_of[:, None]
    same_cut = torch.arange(m).repeat_interleave(slots)
    allow[n_real:, n_real:] = (same_cut[:, None] == same_cut[None, :]) & (slot_of[None, :] <= slot_of[:, None])
    positions = torch.cat([torch.arange(n_real), cut_of + 1 + slot_of])
    return allow, positions


def save_specdec(draft: nn.Module, queries: MaskQueries, tokenizer: Any, folder: Path, vocab_size: int,
                 base_model: str = "") -> Path:
    """The drafter as a Hugging Face model folder (safetensors) plus its mask queries and head config."""
    folder.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    config = {"specbench_head": "specdec", "block": queries.block, "vocab_size": vocab_size,
              "hidden_size": int(queries.embeddings.shape[1]), "base_model_name_or_path": base_model}
    (folder / HEAD_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    plain = {"embeddings": queries.embeddings.detach().to("cpu").contiguous().clone()}
    save_file(plain, str(folder / QUERY_FILE), metadata={"format": "pt"})
    return folder


def read_specdec_config(folder: Path, vocab_size: int) -> dict[str, Any]:
    """specdec.json of a SpecDec drafter folder, checked against the target's vocabulary."""
    path = folder / HEAD_CONFIG
    if not path.is_file():
        raise SpecbenchError(f"folder {folder} is not a SpecDec drafter (it has no {HEAD_CONFIG}); give "
                             "method.head= a folder written by `train-head method=specdec`")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecbenchError(f"SpecDec config {path} is not valid JSON ({exc}); write it again with "
                             "`train-head method=specdec`") from None
    if not isinstance(config, dict) or config.get("specbench_head") != "specdec":
        raise SpecbenchError(f"{path} does not describe a SpecDec drafter (no \"specbench_head\": \"specdec\")")
    for key in ("block", "vocab_size", "hidden_size"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool):
            raise SpecbenchError(f"SpecDec config {path} has no integer '{key}'")
    if config["vocab_size"] != vocab_size:
        raise SpecbenchError(f"SpecDec drafter {folder} was trained for a target with {config['vocab_size']} logits, "
                             f"the target has {vocab_size}: it was trained for another model")
    return config


def load_mask_queries(folder: Path, config: dict[str, Any], hidden_size: int, device: torch.device,
                      dtype: torch.dtype) -> MaskQueries:
    """The mask queries of a SpecDec folder, checked against its config and the drafter's width."""
    if config["hidden_size"] != hidden_size:
        raise SpecbenchError(f"SpecDec folder {folder}: specdec.json says hidden_size={config['hidden_size']} but its "
                             f"model has {hidden_size}; the files belong to different drafters")
    queries = MaskQueries(config["block"], hidden_size)
    path = folder / QUERY_FILE
    if not path.is_file():
        raise SpecbenchError(f"SpecDec folder {folder} has no {QUERY_FILE}")
    state = read_state_dict(path)
    check_keys(state, {"embeddings": tuple(queries.embeddings.shape)}, path, "SpecDec",
               f"mask queries (embeddings: block - 1 = {config['block'] - 1} rows of {hidden_size})")
    queries.load_state_dict(state, strict=True)
    return queries.to(device=device, dtype=dtype).eval()
