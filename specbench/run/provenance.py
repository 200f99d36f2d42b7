"""Provenance: what made a run's numbers (commit, versions, device, weights) and what a resumed
run must share with the answers already in its folder (its identity)."""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from specbench.core.questions import sha256_of
from specbench.core.resources import source_checkout
from specbench.models import LoadedModel

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


def environment(target: LoadedModel) -> dict[str, Any]:
    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "device_name": name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def weights_fingerprint(folder: str) -> str | None:
    """Short SHA-256 of a local model's safetensors files: answers (and check references) made
    with other weights under the same name are told apart."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(sha256_of(file).encode())
    return digest.hexdigest()[:16]


def identity(cfg: DictConfig, method_cfg: DictConfig, dtype: torch.dtype) -> dict[str, Any]:
    """What must not change between a run and its resumption (labels for people excluded)."""
    return {
        "dataset": cfg.dataset.name,
        "model": cfg.model.path,
        "template": cfg.model.template,
        "method": _without_labels(OmegaConf.to_container(method_cfg, resolve=True)),
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _without_labels(method: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in method.items() if k not in PRESENTATION_KEYS}


def comparable_identity(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored identity as `identity()` makes it today: folders written before labels left the
    identity (their method entry still has `facts`) resume all the same."""
    if not isinstance(stored, dict) or not isinstance(stored.get("method"), dict):
        return stored
    return {**stored, "method": _without_labels(stored["method"])}
