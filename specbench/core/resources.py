"""Files specbench reads at run time, found the same way in a checkout and in an installed wheel.

The Hydra tree lives in the repository's top-level `configs/`; the wheel carries it as the
package data `specbench/configs/` (pyproject.toml maps `specbench.configs` to `configs`), read
through `importlib.resources`. Paths in the configs (`data/...`, `results/...`) stay relative to
the current folder.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

#: The folder holding the `specbench` package: the repository root in a checkout, site-packages
#: when installed.
_ABOVE_PACKAGE = Path(__file__).resolve().parents[2]


def source_checkout() -> Path | None:
    """The repository root when specbench runs from a source checkout (editable installs too), else None."""
    root = _ABOVE_PACKAGE
    project = root / "pyproject.toml"
    if not (project.is_file() and (root / "configs" / "config.yaml").is_file()):
        return None
    names_us = re.search(r'^name\s*=\s*"specbench"', project.read_text(encoding="utf-8"), re.MULTILINE)
    return root if names_us else None


def _config_dir() -> Path:
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "configs"  # edit configs/ in place
    # `specbench` is a regular package, so files() gives a real folder for a wheel installed on disk
    # (`specbench.configs` has no __init__.py: a namespace package whose files() is not a Path).
    installed = resources.files("specbench") / "configs"
    return Path(str(installed))


#: The Hydra config tree: config.yaml + groups model/ method/ task/ dataset/ sweep/, zoo and check settings.
CONFIG_DIR = _config_dir()
#: Moves every cache below but the zoo's and the cost curves' (those have their own variables).
CACHE_VAR = "SPECBENCH_CACHE_DIR"


def default_cache() -> Path:
    """~/.cache/specbench: where specbench keeps what it builds or measures once."""
    return Path.home() / ".cache" / "specbench"


def env_folder(var: str, default: Path) -> Path:
    """The folder the environment variable `var` names when it is set, else `default`."""
    value = os.environ.get(var)
    return Path(value).expanduser() if value else default


def checkout_folder(var: str, name: str) -> Path | None:
    """The folder the environment variable `var` names when it is set, else the checkout's folder
    `name` (the repository's committed data: `weights/`, `corpora/`); None in a wheel install."""
    value = os.environ.get(var)
    if value:
        return Path(value).expanduser()
    checkout = source_checkout()
    return checkout / name if checkout is not None else None


def cache_root() -> Path:
    """$SPECBENCH_CACHE_DIR if set, else ~/.cache/specbench (converted models, built kits, self_spec's searches)."""
    return env_folder(CACHE_VAR, default_cache())
