"""Hydra's compose API for the settings files of `configs/` that are not a run's config:
`check.yaml` (`specbench check`) and `zoo.yaml` (`specbench zoo`).

Their overrides are Hydra overrides (`key=value`; a list is `key=[a,b]`, text with commas or
brackets is quoted, `key='a,b'`), but the files are fixed: an override sets a key the file has, to
a value of the kind the file gives it (an integer, a number, text, true/false, a table, a list);
adding (`+key=v`), deleting (`~key`), sweeping (`key=a,b`) and `hydra.*` keys are refused. Every
failure is a one-line SpecbenchError that names the override and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR

#: the Hydra behaviour specbench is written for (`specbench run` uses the same)
VERSION_BASE = "1.3"
_ABSENT = object()


@contextmanager
def on_config_dir() -> Iterator[None]:
    """Hydra initialized on CONFIG_DIR for the block. A Hydra initialized before (a `specbench run`
    job's, with its search path) is set aside and is back afterwards, also when the block fails."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    held = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base=VERSION_BASE):
            yield
    finally:
        GlobalHydra.instance().clear()
        if held is not None:
            GlobalHydra.instance().initialize(held)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Hydra's and OmegaConf's run over several)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else type(exc).__name__


def compose(config_name: str, overrides: Sequence[str] | None, what: str, example: str) -> DictConfig:
    """configs/<config_name>.yaml composed by Hydra with `overrides`, interpolations resolved, in
    struct mode, without a `hydra` key. `what` names the settings in errors ("check", "zoo");
    `example` is an override the errors show (e.g. `tolerance.speedup_rel_min=0.2`)."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException

    source = CONFIG_DIR / f"{config_name}.yaml"
    overrides = list(overrides or [])
    with on_config_dir():
        try:
            default = hydra_compose(config_name)
        except (HydraException, OmegaConfBaseException) as exc:
            raise SpecbenchError(f"cannot read the {what} settings {source}: {first_line(exc)}; restore it from "
                                 "git") from None
        for item in overrides:
            _check_override(item, default, what, example, source)
        if not overrides:
            cfg = default
        else:
            try:
                cfg = hydra_compose(config_name, overrides=overrides)
            except (HydraException, OmegaConfBaseException, ValueError) as exc:
                cause = f": {first_line(exc.__cause__)}" if exc.__cause__ else ""
                raise SpecbenchError(f"bad {what} override: {first_line(exc)}{cause}; the settings and the kinds of "
                                     f"their values are those of {source}") from None
    for node in (default, cfg):
        try:
            OmegaConf.resolve(node)
        except OmegaConfBaseException as exc:
            given = [item for item in overrides if "${" in item]
            raise SpecbenchError(f"{what} settings do not resolve ({first_line(exc)}{', in ' if given else ''}"
                                 f"{' '.join(given)}); an interpolation ${{key}} names a key of {source}") from None
    if cfg is not default:
        _match_kinds(default, cfg, "", what)
    return cfg


def _check_override(item: str, default: DictConfig, what: str, example: str, source: Path) -> None:
    """One override against the fixed settings `default`: the checks Hydra does not make, with
    one-line errors that name the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if "=" not in item and not item.startswith("~"):
        raise SpecbenchError(f"{what} override '{item}' has no '='; write key=value, e.g. {example}")
    try:
        (override,) = OverridesParser.create().parse_overrides([item])
    except OverrideParseException as exc:
        raise SpecbenchError(f"{what} override '{item}' is not key=value as Hydra reads it ({first_line(exc)}); "
                             "quote text that holds = , brackets or spaces: key='a,b', key=['x=1','y=2']") from None
    fixed = f"the {what} settings are fixed (those of {source}): write key=value, e.g. {example}"
    if override.is_delete():
        raise SpecbenchError(f"{what} override '{item}' deletes a setting; {fixed}")
    if override.is_add() or override.is_force_add():
        raise SpecbenchError(f"{what} override '{item}' adds a setting; {fixed}")
    key = override.get_key_element()
    if not key:
        raise SpecbenchError(f"{what} override '{item}' has no key; write key=value, e.g. {example}")
    try:
        known = override.package is None and OmegaConf.select(
            default, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT
    except OmegaConfBaseException:  # not a key at all, e.g. `a..b`
        known = False
    if not known:
        raise SpecbenchError(f"unknown {what} setting '{key}'; the settings are those of {source}")
    through = _interpolated_prefix(default, key)
    if through is not None:
        prefix, raw = through
        named = raw[2:-1] if raw.startswith("${") and raw.endswith("}") and "$" not in raw[2:] else "the key it names"
        raise SpecbenchError(f"{what} setting {prefix} is {raw} in {source}, so '{key}' cannot be set alone: set "
                             f"{named}{key[len(prefix):]} (changes both), or give {prefix} whole: "
                             f"{prefix}={{key:value,...}} with every key")
    if override.is_sweep_override():
        raise SpecbenchError(f"{what} override '{item}' gives several values; give one: a list as key=[a,b], "
                             "text with commas quoted as key='a,b'")


def _interpolated_prefix(default: DictConfig, key: str) -> tuple[str, str] | None:
    """(the table above `key` that is an interpolation in the file, its text), or None: Hydra sets a
    key through an interpolation on nothing (`draft_plain.arch.hidden_size` under `${draft.arch}`)."""
    node: Any = default
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        if OmegaConf.is_interpolation(node, part):
            return ".".join(parts[: i + 1]), str(OmegaConf.to_container(node, resolve=False)[part])
        node = node[part]
    return None


def _kind(value: Any) -> str | None:
    """The kind of a settings value, as errors name it; None for null (any value may replace it)."""
    if value is None:
        return None
    for kind, types in (("true or false", bool), ("an integer", int), ("a number", float), ("text", str),
                        ("a table", DictConfig), ("a list", ListConfig)):
        if isinstance(value, types):
            return kind
    return type(value).__name__


def _match_kinds(default: DictConfig, cfg: DictConfig, path: str, what: str) -> None:
    """Every value of `cfg` is of the kind the file gives it in `default` (a table's keys too; a
    list's items are free). An integer where the file has a number becomes that number as a float,
    so that `lr=1` and `lr=1.0` are the same settings."""
    for key in default:
        where = f"{path}{key}"
        if key not in cfg:  # a table given whole in place of an interpolation, without this key
            raise SpecbenchError(f"{what} setting {where} is missing: give {path.rstrip('.')} with every key it has "
                                 f"in the file, {', '.join(map(str, default))}")
        old, new = default[key], cfg[key]
        expected = _kind(old)
        if expected is None:
            continue
        if expected == "a number" and _kind(new) == "an integer":
            cfg[key] = float(new)
        elif _kind(new) != expected:
            if expected == "a table":
                raise SpecbenchError(f"{what} setting {where} is a table: set its keys, e.g. "
                                     f"{where}.{next(iter(old), 'key')}=..., got {new!r}")
            plain = _kind(new) in ("true or false", "an integer", "a number")
            quote = f"; quote text: {where}='{new}'" if expected == "text" and plain else ""
            raise SpecbenchError(f"{what} setting {where} must be {expected} like its default {old!r}, "
                                 f"got {new!r}{quote}")
        elif expected == "a table":
            _match_kinds(old, new, f"{where}.", what)
