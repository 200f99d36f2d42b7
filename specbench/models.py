"""Loading target and draft models: any Hugging Face causal LM, a local folder or the zoo."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specbench.core.errors import SpecbenchError

ZOO_PREFIX = "zoo:"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, in eval mode on its device."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    path: str
    device: torch.device
    dtype: torch.dtype

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @property
    def eos_ids(self) -> set[int]:
        """EOS ids from the generation config (may be several, e.g. Llama-3) and the tokenizer."""
        ids: set[int] = set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for source in (gen_eos, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return ids


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


#: `prefix:` -> function turning the rest of the spec into a local path. The zoo registers
#: `zoo:` (specbench.zoo); installed packages add theirs through the `specbench.resolvers`
#: entry-point group, found the first time an unknown prefix is asked for.
RESOLVERS: dict[str, Callable[[str], os.PathLike | str]] = {}
RESOLVER_GROUP = "specbench.resolvers"


def register_resolver(prefix: str, resolve: Callable[[str], os.PathLike | str]) -> None:
    """Make `prefix:NAME` resolve through `resolve(NAME)` wherever a model or data path is read."""
    RESOLVERS[prefix] = resolve


def _resolver(prefix: str) -> Callable[[str], os.PathLike | str] | None:
    if prefix not in RESOLVERS:
        for entry in entry_points(group=RESOLVER_GROUP):
            if entry.name == prefix:
                RESOLVERS[prefix] = entry.load()
    return RESOLVERS.get(prefix)


def resolve_path(spec: str) -> str:
    """A hub id or folder as given; `zoo:NAME` is a model of the embedded zoo (built on demand),
    and any other registered `prefix:NAME` goes through its resolver."""
    prefix, sep, name = spec.partition(":")
    if sep and prefix.isidentifier() and not os.path.exists(spec):
        resolve = _resolver(prefix)
        if resolve is not None:
            return str(resolve(name))
        if prefix == ZOO_PREFIX.rstrip(":"):
            raise SpecbenchError(f"'{spec}' names the embedded zoo, but specbench.zoo is not installed")
    expanded = os.path.expanduser(spec)
    if expanded.startswith((".", "/", "~")) and not Path(expanded).is_dir():
        raise SpecbenchError(f"model folder '{spec}' does not exist; give an existing folder or a hub id")
    return expanded


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
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING and not trust_remote_code:
        raise SpecbenchError(
            f"model '{spec}' needs its own code (auto_map in config.json); set model.trust_remote_code=true "
            "if you trust it"
        )


def load_model(
    spec: str, *, device: torch.device, dtype: torch.dtype, trust_remote_code: bool = False
) -> LoadedModel:
    """Load a causal LM and its tokenizer by hub id, folder, or `zoo:` name.

    Weights load from safetensors, or from pickle files through torch's weights_only loader
    (transformers' default): a checkpoint that needs arbitrary unpickling is refused."""
    path = resolve_path(spec)
    check_folder(spec, path, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=None
        )
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
            raise SpecbenchError(
                f"refused to load '{spec}': its pickle checkpoint holds more than plain tensors "
                "(torch's weights_only loader rejected it); convert it to safetensors"
            ) from exc
        if "trust_remote_code" in str(exc):
            raise SpecbenchError(
                f"model '{spec}' needs custom code; set model.trust_remote_code=true if you trust it"
            ) from exc
        raise SpecbenchError(f"cannot load model '{spec}': {first}") from exc
    model.to(device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, path=path, device=device, dtype=dtype)
