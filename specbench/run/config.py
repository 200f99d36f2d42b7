"""The Hydra config tree: where it lives, what its groups offer, and value checks.

Hydra composes the config; this module turns its failures into one-line messages that
list what is available, and checks values Hydra cannot (ranges, choices).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASKS
from specbench.core.resources import CONFIG_DIR
from specbench.run.registry import discover, register_with_hydra

GROUPS = ("model", "method", "task", "dataset", "sweep")
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def options(group: str) -> list[str]:
    """The names a config group offers (its yaml files)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def top_level_keys() -> list[str]:
    cfg = OmegaConf.load(CONFIG_DIR / "config.yaml")
    return sorted(k for k in cfg if k not in ("defaults", "hydra"))


def _values(text: str) -> list[str]:
    """The option names in an override value: `a`, `a,b` (sweep) or `[a,b]` (list)."""
    text = text.strip()
    if text.startswith(("[", "choice(")):
        text = text[text.index("[" if text.startswith("[") else "(") + 1 : -1]
    return [v.strip().strip("'\"") for v in text.split(",") if v.strip()]


def check_overrides(overrides: list[str]) -> None:
    """Reject unknown group options and unknown keys before Hydra sees them. Methods come from
    the registry (built-in, methods/ folder, the command line's search path, entry points)."""
    keys = top_level_keys()
    registry = register_with_hydra(discover(overrides))
    for before, item in zip([""] + overrides, overrides):
        if item.startswith("-") or before in HYDRA_VALUE_FLAGS:
            continue
        if "=" not in item:
            raise SpecbenchError(f"override '{item}' has no '='; write key=value, e.g. temperature=0.7")
        key, value = item.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra") or item.startswith(("+", "~")):
            continue
        root = key.split(".", 1)[0].split("@", 1)[0]
        if key == "method":
            for name in _values(value):
                if name not in registry:
                    raise registry.unknown(name)
        elif key in GROUPS:
            known = options(key)
            for name in _values(value):
                if name not in known:
                    raise SpecbenchError(f"unknown {key} '{name}'; available: {', '.join(known)}")
        elif root not in GROUPS and root not in keys:
            raise SpecbenchError(
                f"unknown key '{key}'; available keys: {', '.join(keys)} (and {', '.join(g + '.*' for g in GROUPS)})"
            )


def check_compose(overrides: list[str]) -> None:
    """Compose once with Hydra's API so nested-key mistakes become one-line errors too."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [o for o in overrides if "=" in o and not o.startswith(("-", "hydra"))]
    register_with_hydra(registry := discover(overrides))
    if registry.search:
        plain.append(f"hydra.searchpath=[{','.join('file://' + str(p) for p in registry.search)}]")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        try:
            compose("config", overrides=plain)
        except (HydraException, OmegaConfBaseException) as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            cause = str(exc.__cause__ or "").strip().splitlines()
            detail = ": ".join(x.rstrip(".") for x in lines[:1] + cause[:1]) or type(exc).__name__
            raise SpecbenchError(f"{detail} (prefix a new key with +)") from None


def selected_subtasks(task_cfg: DictConfig) -> list[str]:
    return [s for s in SUBTASKS if task_cfg.get(s)]


def check_values(cfg: DictConfig) -> None:
    """Ranges and choices of the plain keys, as one-line errors."""
    def fail(msg: str) -> None:
        raise SpecbenchError(msg)

    if not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        fail(f"max_new_tokens must be a positive integer, got {cfg.max_new_tokens!r}")
    if not isinstance(cfg.temperature, (int, float)) or cfg.temperature < 0:
        fail(f"temperature must be >= 0 (0 = greedy), got {cfg.temperature!r}")
    if not isinstance(cfg.top_p, (int, float)) or not 0 < cfg.top_p <= 1:
        fail(f"top_p must be in (0, 1], got {cfg.top_p!r}")
    if not isinstance(cfg.top_k, int) or cfg.top_k < 0:
        fail(f"top_k must be an integer >= 0 (0 = off), got {cfg.top_k!r}")
    if cfg.limit is not None and (not isinstance(cfg.limit, int) or cfg.limit < 1):
        fail(f"limit must be a positive integer or null, got {cfg.limit!r}")
    for key in ("runs",):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            fail(f"{key} must be a positive integer, got {cfg[key]!r}")
    if not isinstance(cfg.warmup, int) or cfg.warmup < 0:
        fail(f"warmup must be an integer >= 0, got {cfg.warmup!r}")
    if cfg.on_error not in ("record", "raise"):
        fail(f"on_error must be record or raise, got {cfg.on_error!r}")
    if not selected_subtasks(cfg.task):
        fail(f"no subtask selected; use task=all or task=[{','.join(SUBTASKS[:2])}]")
    if OmegaConf.is_missing(cfg.model, "path") or not cfg.model.path:
        fail("model.path is not set; use model=local model.path=/path/to/model (or a hub id)")
