"""Where a run's questions come from and where its answers go: the dataset's question file (a
generated dataset written first) and the results folder checked before anything loads."""

from __future__ import annotations

import importlib
import shutil
import uuid
from pathlib import Path

from omegaconf import DictConfig

from specbench.core import questions as data
from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic


def load_dataset(dataset_cfg: DictConfig) -> list[data.Question]:
    """The dataset's questions. A generated dataset (`generator: module:function` in its config,
    called with the seed, returning question dicts) is written to its path first, but never over
    a different file already there: that is somebody's own question file."""
    path = Path(dataset_cfg.path)
    if dataset_cfg.get("generator"):
        write_generated(dataset_cfg, path)
    elif not path.exists():
        raise SpecbenchError(
            f"question file {path} not found; run `python -m specbench data fetch` (or `make data`) to download it"
        )
    return data.load_questions(path)


def write_generated(dataset_cfg: DictConfig, path: Path) -> None:
    module, _, function = str(dataset_cfg.generator).partition(":")
    try:
        generate = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise SpecbenchError(f"dataset {dataset_cfg.name}: generator '{dataset_cfg.generator}' cannot be imported; "
                             "write it as module:function") from None
    text = data.questions_jsonl(generate(int(dataset_cfg.seed)))
    if path.is_file():
        if path.read_bytes() == text.encode("utf-8"):
            return
        raise SpecbenchError(
            f"{path} exists and is not the {dataset_cfg.name} set of seed {dataset_cfg.seed}; to run that file use "
            f"dataset=spec_bench dataset.path={path}, to regenerate the {dataset_cfg.name} set remove it or choose "
            "another dataset.path=..."
        )
    write_atomic(path, text)


def check_writable(folder: Path, need_bytes: int = 50 << 20) -> None:
    """Fail before the model loads when answers could not be saved."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise SpecbenchError(
            f"results folder {folder} is not writable ({exc.strerror or exc}); choose another with output_dir=..."
        ) from None
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise SpecbenchError(
            f"only {free >> 20} MiB free under {folder}; free some space or choose another output_dir=..."
        )
