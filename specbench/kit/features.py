"""The frozen target's states over a kit's whole corpus, for training heads on every row.

A head learns from the target's hidden states (EAGLE, Medusa, Hydra: the final-norm state the LM
head reads; EAGLE-3: low, middle and high layers side by side; PPD: the state after its exit
layer, through the final norm). Over millions of corpus tokens those states do not fit in memory
as padded (rows, length, width) tensors, so each shard's are computed once per machine by one
teacher-forced pass (bfloat16), kept in the cache beside the shard (`shard-NNNNN.states-<key>.safetensors`),
and only where a head reads them: every answer position and the `context` prompt positions before it.

`Ragged` serves them to the heads' training loops as if they were a padded (rows, length, width)
tensor: `x[rows, positions]` with index tensors or a slice gives the stored states and zeros where
nothing is stored (padding, and prompt positions before the kept context, which no loss reads).
The shards' files are mapped from disk, never copied whole (`mapped`): EAGLE-3's fused states of a
whole SmolLM2 corpus are ~12 GB, and a copy of them beside the final states would not fit a 24 GiB
machine; mapped, the kernel's page cache holds what fits and reads the rest back as it is indexed.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.files import safetensors_header

#: prompt positions kept before each answer (a head's attention and windows read back that far)
CONTEXT = 128


@dataclass(frozen=True)
class StateSpec:
    """Which states to keep: the final-norm state, EAGLE-3's fused layers, PPD's exit state."""

    final: bool = True
    fused: tuple[int, ...] = ()
    exit_layer: int | None = None

    def names(self) -> list[str]:
        return (["final"] if self.final else []) + (["fused"] if self.fused else []) + (
            ["exit"] if self.exit_layer else [])

    def key(self) -> str:
        text = json.dumps({"final": self.final, "fused": list(self.fused), "exit": self.exit_layer,
                           "context": CONTEXT, "version": "states-1"}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


def kept_from(prompt: int) -> int:
    """The first position of a row whose states are kept."""
    return max(0, prompt - CONTEXT)


@torch.inference_mode()
def compute_states(model: torch.nn.Module, rows: Sequence[dict], spec: StateSpec,
                   batch_tokens: int = 8192, topk: int = 0) -> dict[str, torch.Tensor]:
    """The states of `spec` over `rows` (prompt + answer, teacher-forced, right-padded batches of
    similar length), flat: each row's kept positions one after another, in row order; bfloat16.
    With `topk`, from the same forward also the target's top-k log-probabilities at every answer
    position (`topk_ids` int32, `topk_logp` float16: what distillation reads; the LM head runs on
    the answer positions only)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["prompt_ids"]) + len(rows[i]["answer_ids"]))
    names = spec.names() + (["topk_ids", "topk_logp"] if topk else [])
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {name: [] for name in names}
    lo = 0
    while lo < len(order):
        hi = lo + 1
        while hi < len(order) and (hi - lo + 1) * _length(rows[order[hi]]) <= batch_tokens:
            hi += 1
        picked = order[lo:hi]
        width = max(_length(rows[i]) for i in picked)
        ids = torch.zeros((len(picked), width), dtype=torch.long)
        mask = torch.zeros((len(picked), width), dtype=torch.long)
        for b, i in enumerate(picked):
            seq = rows[i]["prompt_ids"] + rows[i]["answer_ids"]
            ids[b, :len(seq)] = torch.tensor(seq)
            mask[b, :len(seq)] = 1
        out = decoder(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        for b, i in enumerate(picked):
            keep = slice(kept_from(len(rows[i]["prompt_ids"])), _length(rows[i]))
            if spec.final:
                parts["final"].append((i, states[-1][b, keep].to(torch.bfloat16)))
            if spec.fused:
                parts["fused"].append((i, torch.cat([states[j][b, keep] for j in spec.fused], -1).to(torch.bfloat16)))
            if spec.exit_layer:
                parts["exit"].append((i, decoder.norm(states[spec.exit_layer][b, keep]).to(torch.bfloat16)))
            if topk:  # position t predicts token t + 1: the answer's tokens from the prompt's last position on
                p, a = len(rows[i]["prompt_ids"]), len(rows[i]["answer_ids"])
                top = torch.log_softmax(head(out.last_hidden_state[b, p - 1:p + a - 1]).float(), -1).topk(topk, -1)
                parts["topk_ids"].append((i, top.indices.to(torch.int32)))
                parts["topk_logp"].append((i, top.values.to(torch.float16)))
        lo = hi
    return {name: torch.cat([t for _, t in sorted(found, key=lambda x: x[0])]) for name, found in parts.items()}


def _length(row: dict) -> int:
    return len(row["prompt_ids"]) + len(row["answer_ids"])


def states_file(cache: Path, shard: int, spec: StateSpec) -> Path:
    return cache / f"shard-{shard:05d}.states-{spec.key()}.safetensors"


def ensure_states(cache: Path, shard: int, rows: Sequence[dict], spec: StateSpec,
                  loader: Callable[[], torch.nn.Module]) -> Path:
    """The shard's states file, computed once per machine (written whole, then renamed)."""
    path = states_file(cache, shard, spec)
    if path.is_file():
        return path
    start = time.perf_counter()
    save_states(path, compute_states(loader(), rows, spec))
    tokens = sum(_length(r) for r in rows)
    print(f"specbench: target states of corpus shard {shard}: {tokens} tokens in {time.perf_counter() - start:.0f} s",
          file=sys.stderr, flush=True)
    return path


def save_states(path: Path, states: dict[str, torch.Tensor]) -> None:
    """A states file written whole, then renamed into place."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in states.items()}, str(tmp))
    tmp.replace(path)


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64,
           "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def mapped(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file mapped from disk, not read: pages are read as the tensors are
    indexed and stay in the page cache (shared, evictable), so states larger than memory still train.
    The mapping is copy-on-write: the file is never written through these tensors."""
    with open(path, "rb") as fh:
        size, header = safetensors_header(fh)
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise RuntimeError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which states files never hold: "
                               "delete the file (it is recomputed)")
        dtype = _DTYPES[meta["dtype"]]
        lo, hi = meta["data_offsets"]
        count = (hi - lo) // dtype.itemsize
        flat = (torch.frombuffer(buf, dtype=dtype, count=count, offset=8 + size + lo) if count
                else torch.empty(0, dtype=dtype))
        out[name] = flat.view(meta["shape"])
    return out


class Ragged:
    """Rows of stored states, indexed as a padded (rows, length, width) float32 tensor would be. The
    states are one (N, width) tensor or several (each shard's, mapped), one after another."""

    def __init__(self, data: torch.Tensor | Sequence[torch.Tensor], base: torch.Tensor, first: torch.Tensor,
                 length: torch.Tensor) -> None:
        # row r's position t at flat index base[r] + t - first[r], for first[r] <= t < length[r]
        self.chunks = [data] if isinstance(data, torch.Tensor) else list(data)
        sizes = torch.tensor([len(c) for c in self.chunks], dtype=torch.long)
        self.ends = torch.cumsum(sizes, 0)
        self.starts = self.ends - sizes
        self.total = int(self.ends[-1]) if len(sizes) else 0
        self.base, self.first, self.length = base, first, length
        self.shape = (len(base), int(length.max()) if len(length) else 0, int(self.chunks[0].shape[1]))

    def _take(self, flat: torch.Tensor) -> torch.Tensor:
        if len(self.chunks) == 1:
            return self.chunks[0][flat].float()
        which = torch.bucketize(flat, self.ends, right=True)
        out = torch.empty((*flat.shape, self.shape[2]), dtype=torch.float32)
        for c in torch.unique(which).tolist():
            at = which == c
            out[at] = self.chunks[c][flat[at] - self.starts[c]].float()
        return out

    def __getitem__(self, index: Any) -> torch.Tensor:
        rows, cols = index
        rows = torch.as_tensor(rows)
        if isinstance(cols, slice):
            cols = torch.arange(cols.start or 0, cols.stop if cols.stop is not None else self.shape[1])
            if rows.dim() == 0:
                rows = rows.expand(len(cols))
        rows, cols = torch.broadcast_tensors(rows, torch.as_tensor(cols))
        ok = (cols >= self.first[rows]) & (cols < self.length[rows])
        flat = (self.base[rows] + cols - self.first[rows]).clamp(0, max(self.total - 1, 0))
        return self._take(flat) * ok[..., None]


def ragged(selected: Sequence[tuple[int, int]], shard_rows: dict[int, Sequence[dict]],
           shard_states: dict[int, torch.Tensor]) -> Ragged:
    """`Ragged` over the rows `selected` ((shard, row index) pairs, in the order wanted), the states
    of each shard's rows flat in `shard_states[shard]` (as `compute_states` wrote them)."""
    shards = sorted(shard_states)
    offset, starts = 0, {}
    for shard in shards:
        sizes = torch.tensor([_length(r) - kept_from(len(r["prompt_ids"])) for r in shard_rows[shard]])
        if int(sizes.sum()) != len(shard_states[shard]):
            raise RuntimeError(f"shard {shard}'s states hold {len(shard_states[shard])} positions, "
                               f"its rows {int(sizes.sum())}: delete the states file (it is recomputed)")
        starts[shard] = offset + torch.cumsum(sizes, 0) - sizes
        offset += len(shard_states[shard])
    rows = [shard_rows[s][i] for s, i in selected]
    first = torch.tensor([kept_from(len(r["prompt_ids"])) for r in rows])
    length = torch.tensor([_length(r) for r in rows])
    base = torch.stack([starts[s][i] for s, i in selected]) if selected else torch.zeros(0, dtype=torch.long)
    return Ragged([shard_states[s] for s in shards], base, first, length)
