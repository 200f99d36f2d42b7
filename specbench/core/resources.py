"""Files specbench reads at run time, found the same way in a checkout and in an installed wheel.

The Hydra tree lives in the repository's top-level `configs/`; the wheel carries it as the
package data `specbench/configs/` (pyproject.toml maps `specbench.configs` to `configs`), read
through `importlib.resources`. Paths in the configs (`data/...`, `results/...`) stay relative to
the current folder.
"""

from __future__ import annotations

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
