"""Decoding methods: one adapter module each, chosen by `configs/method/<name>.yaml`'s `impl`."""

from __future__ import annotations

import importlib

from omegaconf import DictConfig

from specbench.core.errors import SpecbenchError
from specbench.engine.api import GenerationResult, Method, Prefilled
from specbench.models import LoadedModel

__all__ = ["GenerationResult", "Method", "Prefilled", "build_method"]


def build_method(method_cfg: DictConfig, target: LoadedModel, model_cfg: DictConfig) -> Method:
    """Instantiate the class named by the method config's `impl` (module.Class)."""
    impl = method_cfg.get("impl")
    module_name, _, class_name = str(impl).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        raise SpecbenchError(f"method '{method_cfg.name}' names impl '{impl}', which cannot be imported") from None
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise SpecbenchError(f"method impl '{impl}' is not a specbench Method")
    return cls(target, method_cfg, model_cfg)
