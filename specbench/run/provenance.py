"""Provenance: what made a run's numbers (commit, versions, device, weights) and what a resumed
run must share with the answers already in its folder (its identity)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from specbench.core.digests import file_digest
from specbench.core.errors import SpecbenchError
from specbench.core.hardware import cpu_info, device_name, run_command, total_memory
from specbench.core.resources import source_checkout
from specbench.engine.api import DECODING_VERSION
from specbench.models import LoadedModel, is_part, linear_kernel, resolve_path

#: Method config keys that only label a method for people (tables, figures, suites): changing them
#: must not make an answer folder refuse to resume.
PRESENTATION_KEYS = ("facts", "suites")


def git_commit() -> str | None:
    """The source checkout's commit (`-dirty` with local changes); None for an installed wheel, whose
    site-packages may sit inside some other git repository."""
    root = source_checkout()
    if root is None or not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


#: libraries whose version is recorded with every run (and specbench's own)
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "specbench")
#: what `nvidia-smi --query-gpu` is asked for (one entry per GPU); "[N/A]" and "[Not Supported]" become None
GPU_FIELDS = ("index", "name", "driver_version", "memory.total", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "power.limit", "pstate")
NVIDIA_SMI_TIMEOUT_S = 3.0


def environment(target: LoadedModel) -> dict[str, Any]:
    """What made a run's numbers, captured on every run: the machine (CPU model and cores, RAM, GPUs
    with driver, clocks and power limit where `nvidia-smi` reports them), the CUDA runtime, library
    versions and the commit. Cheap (no GPU query without an `nvidia-smi` binary) and never raising:
    a fact that cannot be read is None."""
    device = target.device
    cpu = _safe(cpu_info, {})
    gpus = _safe(gpu_info, None)
    name = _safe(lambda: device_name(device, cpu), None)
    versions = _safe(library_versions, {})
    return {
        "git_commit": _safe(git_commit, None),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "versions": versions,
        "device": str(device),
        "device_name": name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "linear": linear_kernel(target.model),
        "attention": getattr(target.model.config, "_attn_implementation", None),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "memory_total_bytes": _safe(total_memory, None),
        "cuda": torch.version.cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus,
    }


def _safe(read: Callable[[], Any], default: Any) -> Any:
    """`read()`, or `default` when it fails in any way: provenance never stops a run."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - a fact that cannot be read is recorded as missing
        return default


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version is None:
            version = _safe(lambda n=name: metadata.version(n), None)
        versions[name] = str(version) if version is not None else None
    return versions


def gpu_info() -> list[dict[str, Any]] | None:
    """One entry per GPU from `nvidia-smi --query-gpu` (name, driver, memory in MiB, current and
    maximum clocks in MHz, power limit in W, performance state); None without the binary."""
    out = nvidia_smi("--query-gpu=" + ",".join(GPU_FIELDS))
    if out is None:
        return None
    return [dict(zip(GPU_FIELDS, (_value(v) for v in line.split(",")))) for line in out.splitlines() if line.strip()]


def nvidia_smi(query: str) -> str | None:
    """`nvidia-smi QUERY --format=csv,noheader,nounits`'s output; None when the binary is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    return run_command(["nvidia-smi", query, "--format=csv,noheader,nounits"], NVIDIA_SMI_TIMEOUT_S)


def _value(text: str) -> Any:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


#: bookkeeping files of a part's folder that never change an answer (cards, origins, markers)
NOT_CONTENT = ("part.json", "origin.json", "quality.json", "COMPLETE")
#: what a folder holds at its top level to be a part (a model, a head, a datastore)
MODEL_FILES = ("*.safetensors", "*.bin", "*.gguf", "*.npy", "config.json", "manifest.json")
def content_fingerprint(path: str | os.PathLike) -> str | None:
    """Short SHA-256 over the content of a local file or folder (every file under it, by relative path,
    bookkeeping aside): what a run's answers depend on of a model, draft, head or datastore. None for a
    path that is not on this machine (a hub id: its id is the identity)."""
    root = Path(os.path.expanduser(str(path)))
    if not root.exists() or (root.is_dir() and not any(root.glob(p) for p in MODEL_FILES)):
        return None  # a folder that holds no model, head or datastore is no part (".", a results folder)
    files = [root] if root.is_file() else sorted(
        f for f in root.rglob("*") if f.is_file() and f.name not in NOT_CONTENT and not f.name.endswith(".lock"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.relative_to(root) if f != root else f.name}:{file_digest(f)}\n".encode())
    return digest.hexdigest()[:16]


def parts_identity(specs: list[str]) -> dict[str, str]:
    """Each local part a method reads (`prefix:NAME` resolved, folders, files) with its content
    fingerprint: answers made with other weights at the same name are another run."""
    out = {}
    for spec in dict.fromkeys(specs):
        if not spec or "\n" in spec:
            continue
        try:
            path = resolve_path(spec) if is_part(spec) else spec
        except SpecbenchError:
            continue
        if (found := content_fingerprint(path)) is not None:
            out[spec] = found
    return out


def question_fingerprint(question: Any) -> str:
    """Short SHA-256 of a question as a run asks it (its category and every turn's text, a long input's
    documents included): an answer to the question as it was before an edit is never resumed as its answer."""
    return hashlib.sha256(json.dumps([question.category, list(question.turns)], ensure_ascii=False).encode()
                          ).hexdigest()[:16]


def identity_hash(identity: dict[str, Any]) -> str:
    """What every answer record carries of its run's identity (`specbench.identity`): a meta.json that
    is missing or edited cannot make a resume mix answers."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_fingerprint(folder: str) -> str | None:
    """Short SHA-256 of a local model's safetensors files: answers (and check references) made
    with other weights under the same name are told apart."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file_digest(file).encode())
    return digest.hexdigest()[:16]


def identity(cfg: DictConfig, method_cfg: DictConfig, dtype: torch.dtype, parts: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """What must not change between a run and its resumption (labels for people excluded): the
    dataset and model, the method's resolved settings, the generation settings, the dtype, the
    engine's decoding version and `parts`, the content fingerprints of the weights it reads
    (`parts_identity`). Each answer record carries its hash and its question's fingerprint as well."""
    optional = {}  # batch size 1 and inputs as they are: as before batching and long inputs existed
    if int(cfg.get("batch_size", 1)) > 1:
        optional = {"batch_size": int(cfg.batch_size), "batch_mode": str(cfg.batch_mode)}
        if cfg.batch_mode == "continuous":
            optional["batch_queue"] = int(cfg.batch_queue)
    if cfg.get("length") is not None:  # long inputs: the first turns' length in tokens
        optional["length"] = cfg.length
    return {
        **optional,
        "dataset": cfg.dataset.name,
        "model": cfg.model.path,
        "template": cfg.model.template,
        "method": _without_labels(OmegaConf.to_container(method_cfg, resolve=True)),
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "stop_strings": list(cfg.model.get("stop_strings") or []),
        "dtype": str(dtype).removeprefix("torch."),
        "decoding": DECODING_VERSION,
        "parts": parts or {},
    }


def _without_labels(method: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in method.items() if k not in PRESENTATION_KEYS}


def comparable_identity(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored identity as `identity()` makes it today: folders written before labels left the
    identity (their method entry still has `facts`) resume all the same."""
    if not isinstance(stored, dict) or not isinstance(stored.get("method"), dict):
        return stored
    return {**stored, "method": _without_labels(stored["method"])}
