"""Files specbench reads at run time, found the same way in a checkout and in an installed wheel.

The Hydra tree lives in the repository's top-level `configs/`; the wheel carries it as the
package data `specbench.configs` (see pyproject.toml), read through `importlib.resources`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _config_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if (checkout / "config.yaml").is_file():
        return checkout  # a source checkout (editable installs too): edit configs/ in place
    try:
        installed = Path(str(resources.files("specbench.configs")))
    except ModuleNotFoundError:
        installed = checkout
    return installed


#: The Hydra config tree: config.yaml + groups model/ method/ task/ dataset/ sweep/, zoo and check settings.
CONFIG_DIR = _config_dir()
