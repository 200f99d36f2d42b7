"""Loading target and draft models: any Hugging Face causal LM, a local folder, a GGUF file, or a
`prefix:NAME` that a registered resolver turns into a folder (the zoo's `zoo:`, the kits')."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specbench.core.errors import SpecbenchError
from specbench.core.stopping import eos_token_ids
from specbench.gguf import gguf_folder, is_gguf

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values are views of buffers with spare room.

    Hugging Face's DynamicLayer appends a step with `torch.cat`, which copies the whole cache at
    every step (per layer, keys and values): on a CPU with long prompts that copy is a large part
    of a decode step, and it grows with the batch. Here a step writes into the spare room and
    the buffer grows by a quarter (plus GROWTH_SLACK entries) when full, so appending costs what
    the new entries cost. Everything that assigns `keys` / `values` keeps working: assigning a
    prefix view of the buffer (`crop`, the engine's compaction) just sets the length; any other
    tensor (`batch_select_indices`) becomes the content of a new buffer."""

    GROWTH_SLACK = 64
    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None
    _klen = _vlen = 0

    @classmethod
    def _room(cls, like: torch.Tensor, n: int) -> torch.Tensor:
        return like.new_empty(like.shape[0], like.shape[1], n + n // 4 + cls.GROWTH_SLACK, like.shape[3])

    @classmethod
    def _adopt(cls, buf: torch.Tensor | None, value: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
        if value is None or value.dim() != 4:
            return None, 0
        if (buf is not None and value.data_ptr() == buf.data_ptr() and value.stride() == buf.stride()
                and value.shape[:2] == buf.shape[:2] and value.shape[3] == buf.shape[3]):
            return buf, int(value.shape[2])  # a prefix of the buffer: a new length
        n = int(value.shape[2])
        new = cls._room(value, n)
        new[:, :, :n] = value
        return new, n

    @classmethod
    def _append(cls, buf: torch.Tensor | None, n: int, states: torch.Tensor) -> tuple[torch.Tensor, int]:
        k = int(states.shape[2])
        if buf is None or buf.shape[:2] != states.shape[:2] or n + k > buf.shape[2]:
            new = cls._room(states, n + k)
            if buf is not None and n:
                new[:, :, :n] = buf[:, :, :n]
            buf = new
        buf[:, :, n : n + k] = states
        return buf, n + k

    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return None if self._kbuf is None else self._kbuf[:, :, : self._klen]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._kbuf, self._klen = self._adopt(self._kbuf, value)

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return None if self._vbuf is None else self._vbuf[:, :, : self._vlen]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._vbuf, self._vlen = self._adopt(self._vbuf, value)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._kbuf, self._klen = self._append(self._kbuf, self._klen, key_states)
        self._vbuf, self._vlen = self._append(self._vbuf, self._vlen, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._klen if self.is_initialized else 0

    def extend(self, length: int) -> None:
        """Hold `length` entries per row (more than now); the new entries are zeros."""
        n = self._klen
        if length <= n or self._kbuf is None or self._vbuf is None:
            return
        for attr in ("_kbuf", "_vbuf"):
            buf = getattr(self, attr)
            if length > buf.shape[2]:
                new = self._room(buf, length)
                new[:, :, :n] = buf[:, :, :n]
                buf = new
                setattr(self, attr, buf)
            buf[:, :, n:length].zero_()
        self._klen = self._vlen = length


def new_cache(config: object) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers are GrowingLayers (sliding-window
    and other special layers stay as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


#: float32 CPU linears over at most this many rows run as W @ x^T (`RowsFirstLinear`) on two or more threads ...
ROWS_FIRST_MAX = 8
#: ... and over at most this many on one thread (5-8 rows ran slower that way on one thread)
ROWS_FIRST_MAX_ONE_THREAD = 4
#: a model whose float32 linear weights are smaller than this keeps PyTorch's linear: its weights stay in
#: the CPU's caches between steps, where PyTorch's matrix-vector product is the faster one
ROWS_FIRST_MIN_BYTES = 32 * 2**20
#: `SPECBENCH_LINEAR=torch` keeps PyTorch's own linear everywhere (`auto`, the default: `RowsFirstLinear`)
LINEAR_VAR = "SPECBENCH_LINEAR"


class RowsFirstLinear(torch.nn.Linear):
    """A linear layer that computes a float32 CPU step of a few rows as W @ x^T.

    PyTorch's linear computes x @ W^T; with MKL on a CPU, a float32 product of 2 or 3 rows runs as that
    many matrix-vector products and one row as one that reads the weight at a fraction of the memory
    bandwidth: SmolLM2's LM head (49,152 x 576, 2 cores) costs 7 ms for one row, 14-23 ms for 2-3 and 12 ms
    for 4, against 2.2-2.9 ms for 1-4 rows as W @ x^T (one row runs as two); a whole SmolLM2 step over a
    300-token cache took 39.5 / 63.6 / 79.6 / 61.3 ms for 1 / 2 / 3 / 4 rows and takes 23.8 / 34.6 / 39.5 / 36.5
    this way (docs/running.md, "Small steps on a CPU"; scripts/linear_kernel.py): verifying a draft of one or two
    tokens cost more than one of four. On one thread W @ x^T loses from 5 rows on (ROWS_FIRST_MAX_ONE_THREAD),
    and a model whose weights stay in the caches (under ROWS_FIRST_MIN_BYTES) is faster with PyTorch's, so
    `rows_first_linears` leaves it alone. The same weights and the same sums, in another order (float32
    rounding, as any change of batch shape); more rows, other dtypes and other devices go to PyTorch's linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1] if x.dim() else 0
        n = x.numel() // width if width else 0
        weight = self.weight
        limit = ROWS_FIRST_MAX if torch.get_num_threads() > 1 else ROWS_FIRST_MAX_ONE_THREAD
        if (not 1 <= n <= limit or x.dtype != torch.float32 or x.device.type != "cpu"
                or weight.dtype != torch.float32):
            return torch.nn.functional.linear(x, weight, self.bias)
        # rows laid out one after another: a row-major x^T (the transposed output of another of these layers,
        # through SmolLM2's gated MLP into down_proj) sends MKL down a path 3-4x slower for 2-8 rows
        flat = x.reshape(n, width).contiguous()
        if n == 1:
            flat = torch.cat([flat, flat])
        out = torch.mm(weight, flat.t()).t()[:n]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], weight.shape[0])


#: the attention a CPU model with grouped-query heads under SDPA runs, in any dtype (`packed_attention`)
PACKED_SDPA = "sdpa_packed"
#: blocks of at most this many query rows run packed; longer ones (a prefill) run as transformers' SDPA runs them
PACKED_ROWS_MAX = 64
#: `SPECBENCH_ATTENTION=sdpa` keeps transformers' SDPA (`auto`, the default: PACKED_SDPA where it applies)
ATTENTION_VAR = "SPECBENCH_ATTENTION"


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA with a block's query rows packed per key-value head: (batch, heads, rows, dim) runs as
    (batch, kv_heads, groups * rows, dim) against the cache's own keys and values, the mask repeated
    per group.

    transformers packs the queries so for a one-row step only; a masked step of several rows (every
    verification) copies the whole cache `groups` times per layer (`repeat_kv`) instead, and over a
    long cache that copy is most of the step: SmolLM2 (9 query heads on 3 key-value heads, 2 cores) took
    60 ms for one row and 166 ms for two over 4,096 cached positions (scripts/packed_attention.py). The
    same products and sums per row (float32 rounding may differ, as with any change of block shape); steps
    that are not a masked block of 2..PACKED_ROWS_MAX rows go to transformers' SDPA."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    rows = query.shape[2]
    if (groups > 1 and 1 < rows <= PACKED_ROWS_MAX and attention_mask is not None and attention_mask.dim() == 4
            and attention_mask.shape[1] == 1 and kwargs.get("position_bias") is None
            and kwargs.get("softcap") is None and not kwargs.get("output_attentions")):
        batch, heads, _, dim = query.shape
        packed = query.reshape(batch, heads // groups, groups * rows, dim)
        masks, seen = attention_mask.shape[0], attention_mask.shape[-1]
        mask = attention_mask[:, :, None].expand(masks, 1, groups, rows, seen).reshape(masks, 1, groups * rows, seen)
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                               scale=scaling)
        return out.reshape(batch, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def packed_attention(model: torch.nn.Module) -> bool:
    """Give a CPU model with grouped-query attention under SDPA `packed_sdpa` (its masks built as SDPA's),
    unless SPECBENCH_ATTENTION=sdpa; whether it did."""
    config = model.config
    if os.environ.get(ATTENTION_VAR, "auto").strip().lower() == "sdpa":
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.sub_configs:
        return False
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or kv_heads >= heads:
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    model.set_attn_implementation(PACKED_SDPA)
    return config._attn_implementation == PACKED_SDPA


def rows_first_linears(model: torch.nn.Module, min_bytes: int | None = None) -> int:
    """Make each plain `nn.Linear` of a float32 CPU model a `RowsFirstLinear` (same parameters, in place)
    when their weights hold at least `min_bytes` (default ROWS_FIRST_MIN_BYTES; a tied weight counted once),
    unless SPECBENCH_LINEAR=torch; returns how many."""
    if os.environ.get(LINEAR_VAR, "auto").strip().lower() == "torch":
        return 0
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
               and m.weight.device.type == "cpu"]
    floor = ROWS_FIRST_MIN_BYTES if min_bytes is None else min_bytes
    if sum({m.weight.data_ptr(): m.weight.numel() * 4 for m in linears}.values()) < floor:
        return 0
    for module in linears:
        module.__class__ = RowsFirstLinear
    return len(linears)


def linear_kernel(model: torch.nn.Module) -> str:
    """Which linear a model runs: `rows-first` (`RowsFirstLinear`, for steps of up to ROWS_FIRST_MAX rows,
    ROWS_FIRST_MAX_ONE_THREAD on one thread) or `torch`."""
    return "rows-first" if any(isinstance(m, RowsFirstLinear) for m in model.modules()) else "torch"


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, in eval mode on its device."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    path: str
    device: torch.device
    dtype: torch.dtype

    def new_cache(self) -> DynamicCache:
        return new_cache(self.model.config)

    @property
    def eos_ids(self) -> set[int]:
        """EOS ids from the generation config (may be several, e.g. Llama-3) and the tokenizer."""
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return eos_token_ids(gen_eos, self.tokenizer.eos_token_id)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SpecbenchError("device=cuda but no CUDA device is visible; use device=cpu or device=auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise SpecbenchError(f"unknown device '{name}'; use auto, cpu or cuda")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is float16 on GPU (the Spec-Bench setting) and float32 on CPU."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise SpecbenchError(f"unknown dtype '{name}'; use one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


#: `prefix:` -> function turning the rest of the spec into a local path. The zoo registers `zoo:`;
#: installed packages add theirs through the `specbench.resolvers` entry-point group (one prefix each)
#: or a `specbench.resolver_finders` entry point (an object with `find(prefix)`, a resolver or None, and
#: `names()`: the kits, one prefix per YAML), asked the first time an unknown prefix is.
RESOLVERS: dict[str, Callable[[str], os.PathLike | str]] = {}
RESOLVER_GROUP = "specbench.resolvers"
FINDER_GROUP = "specbench.resolver_finders"
#: every `prefix:NAME` this process resolved, with its folder: a run records where those weights came from
RESOLVED: dict[str, str] = {}


def register_resolver(prefix: str, resolve: Callable[[str], os.PathLike | str]) -> None:
    """Make `prefix:NAME` resolve through `resolve(NAME)` wherever a model or data path is read."""
    RESOLVERS[prefix] = resolve


def find_resolver(prefix: str) -> Callable[[str], os.PathLike | str] | None:
    """The resolver of `prefix:` (registered, or loaded from an installed package's entry point), or None."""
    if prefix not in RESOLVERS:
        for entry in entry_points(group=RESOLVER_GROUP):
            if entry.name == prefix:
                RESOLVERS[prefix] = entry.load()
    if prefix not in RESOLVERS:
        for entry in entry_points(group=FINDER_GROUP):
            found = entry.load().find(prefix)
            if found is not None:
                RESOLVERS[prefix] = found
                break
    return RESOLVERS.get(prefix)


def resolver_names() -> list[str]:
    """Every prefix that resolves: registered, entry points, and what the finders offer."""
    names = {*RESOLVERS, *(e.name for e in entry_points(group=RESOLVER_GROUP))}
    for entry in entry_points(group=FINDER_GROUP):
        names.update(entry.load().names())
    return sorted(names)


def is_part(spec: str) -> bool:
    """`spec` names a registered part (`prefix:NAME` with a resolver, not an existing path): what a run
    builds before its clock and fingerprints for its identity."""
    prefix, sep, _ = spec.partition(":")
    return bool(sep) and prefix.isidentifier() and not os.path.exists(spec) and find_resolver(prefix) is not None


def resolve_path(spec: str) -> str:
    """A hub id or folder as given; a GGUF file is the folder it converts to (once, cached);
    a registered `prefix:NAME` goes through its resolver (the zoo's `zoo:NAME` builds on demand)."""
    prefix, sep, name = spec.partition(":")
    if sep and prefix.isidentifier() and not os.path.exists(spec):
        resolve = find_resolver(prefix)
        if resolve is not None:
            RESOLVED[spec] = str(resolve(name))
            return RESOLVED[spec]
        known = resolver_names()
        raise SpecbenchError(f"'{spec}' names a '{prefix}:' model, but no resolver is registered for '{prefix}:' "
                             f"(known: {', '.join(known) or 'none'}); import the package that provides it, or "
                             "give a folder or hub id")
    expanded = os.path.expanduser(spec)
    if Path(expanded).exists() and not Path(expanded).is_dir():
        if is_gguf(expanded):
            return str(gguf_folder(expanded))
        raise SpecbenchError(f"model path '{spec}' is a file, not a model folder; give the folder that holds "
                             "config.json, the tokenizer and the weights (or a .gguf file)")
    if expanded.startswith((".", "/", "~")) and not Path(expanded).is_dir():
        raise SpecbenchError(f"model folder '{spec}' does not exist; give an existing folder or a hub id")
    return expanded


#: JSON files transformers reads from a model folder (others, e.g. trainer_state.json, are not checked).
JSON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "model.safetensors.index.json")
#: Any one of these makes a folder's tokenizer loadable (fast, sentencepiece, BPE or WordPiece files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model")


def read_json_file(spec: str, path: Path) -> object:
    """A model folder's JSON file, or a one-line error naming it (not JSON, not UTF-8, unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except UnicodeDecodeError:
        problem = "is not UTF-8 text"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    raise SpecbenchError(f"model folder '{spec}': {path.name} {problem}; restore it from the model's source")


def check_weights(spec: str, folder: Path) -> None:
    """Open the header of every safetensors file: a truncated download or a file of something else
    is named here, before transformers fails on it with a traceback."""
    for path in sorted(folder.glob("*.safetensors")):
        if path.is_dir():
            raise SpecbenchError(f"model folder '{spec}': {path.name} is a folder, not a safetensors file")
        try:
            with safe_open(path, framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            reason = str(exc).removeprefix("Error while deserializing header: ")
            raise SpecbenchError(
                f"model folder '{spec}': {path.name} is not a complete safetensors file ({reason}); "
                "it may be truncated or damaged: download or copy it again"
            ) from None


def check_folder(spec: str, path: str, trust_remote_code: bool) -> None:
    """Clear errors for a local folder that is not a loadable model, before transformers tries."""
    folder = Path(path)
    if not folder.is_dir():
        return  # a hub id
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise SpecbenchError(
            f"model folder '{spec}' has no config.json; point model.path at a Hugging Face model folder"
        )
    found = {name: read_json_file(spec, folder / name) for name in JSON_FILES if (folder / name).is_file()}
    for name, value in found.items():
        if not isinstance(value, dict):
            raise SpecbenchError(f"model folder '{spec}': {name} holds a JSON {type(value).__name__}, not an "
                                 "object; restore it from the model's source")
    config = found["config.json"]
    if config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING and not trust_remote_code:
        raise SpecbenchError(
            f"model '{spec}' needs its own code (auto_map in config.json); set model.trust_remote_code=true "
            "if you trust it"
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise SpecbenchError(
            f"model folder '{spec}' has no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...); copy the tokenizer "
            "files of the model into the folder"
        )
    check_weights(spec, folder)


#: What transformers raises on a config, tokenizer or checkpoint it cannot use.
LOAD_ERRORS = (OSError, ValueError, RuntimeError, TypeError, KeyError, pickle.UnpicklingError, SafetensorError,
               StrictDataclassError)


def first_line(exc: BaseException) -> str:
    """The gist of an exception in one line (two joined when the first only introduces the second)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def load_tokenizer(spec: str, *, trust_remote_code: bool = False) -> tuple[PreTrainedTokenizerBase, Any]:
    """A model's tokenizer and config (no weights): what a run needs to measure its inputs in tokens."""
    path = resolve_path(spec)
    check_folder(spec, path, trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code), config
    except LOAD_ERRORS as exc:
        raise SpecbenchError(f"cannot load the tokenizer of model '{spec}': {first_line(exc)}") from exc


def tokens_beyond(tokenizer: PreTrainedTokenizerBase, rows: int) -> int | None:
    """The largest token id a prompt can hold that an embedding of `rows` rows cannot read, else None: the
    tokenizer's regular vocabulary, and the ids its chat template and BOS put into every prompt (an added
    special token the prompts never hold, such as an unused unknown token, does no harm)."""
    ids = [int(tokenizer.vocab_size) - 1]
    if tokenizer.bos_token_id is not None:
        ids.append(int(tokenizer.bos_token_id))
    if getattr(tokenizer, "chat_template", None):
        try:
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
            ids += [int(i) for i in rendered]
        except Exception:  # noqa: BLE001 - a template that does not render is the run's own error, later
            pass
    largest = max(ids)
    return largest if largest >= rows else None


def load_model(
    spec: str, *, device: torch.device, dtype: torch.dtype, trust_remote_code: bool = False
) -> LoadedModel:
    """Load a causal LM and its tokenizer by hub id, folder, GGUF file or registered `prefix:NAME`.

    Weights load from safetensors, or from pickle files through torch's weights_only loader
    (transformers' default): a checkpoint that needs arbitrary unpickling is refused."""
    path = resolve_path(spec)
    check_folder(spec, path, trust_remote_code)
    stage = "config"
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        stage = "tokenizer"
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        stage = "weights"
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=None, output_loading_info=True,
            ignore_mismatched_sizes=True,  # refused below, with the tensor named
        )
    except LOAD_ERRORS as exc:
        if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
            raise SpecbenchError(
                f"refused to load '{spec}': its pickle checkpoint holds more than plain tensors "
                "(torch's weights_only loader rejected it); convert it to safetensors"
            ) from exc
        if "trust_remote_code" in str(exc):
            raise SpecbenchError(
                f"model '{spec}' needs custom code; set model.trust_remote_code=true if you trust it"
            ) from exc
        what = {"config": "its config.json", "tokenizer": "its tokenizer", "weights": "its weights"}[stage]
        raise SpecbenchError(f"cannot load model '{spec}' ({what}): {first_line(exc)}") from exc
    if mismatched := sorted(info.get("mismatched_keys") or [], key=str):
        key, stored, wanted = mismatched[0]
        raise SpecbenchError(
            f"model '{spec}': {len(mismatched)} weight(s) of the checkpoint do not have the shape config.json "
            f"implies (e.g. {key}: {list(stored)} in the checkpoint, {list(wanted)} expected); the checkpoint "
            "and config.json belong to different models"
        )
    if missing := sorted(info.get("missing_keys") or []):
        raise SpecbenchError(
            f"model '{spec}': the checkpoint lacks {len(missing)} weight(s) the model needs (e.g. {missing[0]}), "
            "which would be random; the checkpoint is incomplete or for another architecture than config.json says"
        )
    rows = model.get_input_embeddings().weight.shape[0] if model.get_input_embeddings() is not None else None
    if rows is not None and (beyond := tokens_beyond(tokenizer, rows)):
        raise SpecbenchError(
            f"model '{spec}': its tokenizer makes token ids up to {beyond} but its embedding has only {rows} rows "
            "(config.json vocab_size), so a prompt can hold a token the model cannot read; pair the model with its "
            "own tokenizer"
        )
    model.to(device).eval()
    rows_first_linears(model)
    packed_attention(model)
    return LoadedModel(model=model, tokenizer=tokenizer, path=path, device=device, dtype=dtype)
