"""The method registry: every method specbench can run, where it came from, and how to build it.

A method is a config (`name`, `impl: module.Class`, its settings, and the presentation keys
`facts` and `suites`). Four sources provide them, listed in this order; a name defined by two
of them is an error that names both.

1. **built-in**: `configs/method/<name>.yaml`, specbench's own Hydra tree.
2. **methods/ folder**: `methods/` in the working directory (`SPECBENCH_METHODS_DIR` overrides):
   `methods/<name>.yaml` whose `impl` is `<module>.<Class>` with `methods/<module>.py` beside it.
   The module is loaded from that file under a private module name, so the folder needs no
   `__init__.py` and claims no import name.
3. **search path**: a folder given to Hydra on the command line (`--config-dir DIR`, `-cd DIR`,
   `hydra.searchpath=[file://DIR]`): its `method/<name>.yaml`. A dotless impl module may sit
   beside the YAML as in the methods/ folder; any other impl must be importable.
4. **entry point**: an installed package declares methods in the entry-point group
   `specbench.methods` (as lm-evaluation-harness does for its tasks)::

       [project.entry-points."specbench.methods"]
       my_method = "my_package.specbench_methods:my_method"

   The entry point's name is the method's name. It loads to the method config: a dict or
   DictConfig, a callable taking no arguments that returns one, or the path (str or
   os.PathLike) of a YAML file. The config's `impl` must be importable
   (`my_package.module.Class`); its `name`, when given, must equal the entry point's name.

Methods of the methods/ folder and of entry points are stored in Hydra's ConfigStore (group
`method`, see `register_with_hydra`), so `specbench run method=<name>` composes them like the
built-ins, `defaults: [<another method>, _self_]` inheritance included; Hydra reads search-path
folders itself.

Suites are named sets of methods: `bench` (what `make bench` runs) and `quick` (what
`check --quick` runs). A method without `suites` is in `bench`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from specbench.core.answers import FIXED_SUFFIX
from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR

if TYPE_CHECKING:  # the engine (and torch) load only when a method is built: listing methods needs neither
    from specbench.engine.api import Method
    from specbench.models import LoadedModel

__all__ = ["MethodSpec", "Registry", "build_method", "discover", "register_with_hydra", "search_dirs"]

BUILTIN, FOLDER, SEARCH_PATH, ENTRY_POINT = "built-in", "methods/", "search path", "entry point"
SOURCES = (BUILTIN, FOLDER, SEARCH_PATH, ENTRY_POINT)
ENTRY_POINT_GROUP = "specbench.methods"
METHODS_DIR_ENV = "SPECBENCH_METHODS_DIR"
DEFAULT_SUITES = ("bench",)
HOW_TO_ADD = "to add one, write methods/<name>.yaml + methods/<name>.py (docs/extending.md)"
#: the last registry handed to Hydra: build_method looks for dotless impl modules in its folders
_ACTIVE: Registry | None = None


@dataclass
class MethodSpec:
    """One method's config as its source wrote it (a `defaults` list not yet applied)."""

    name: str
    source: str  # one of SOURCES
    origin: str  # the YAML file, or the entry point as `name = module:attr (distribution)`
    load: Callable[[], DictConfig] = field(repr=False)
    _raw: DictConfig | None = field(default=None, repr=False)

    def raw(self) -> DictConfig:
        if self._raw is None:
            self._raw = self.load()
        return self._raw


def methods_dir() -> Path:
    """The user's plugin folder: `methods/` in the working directory, or $SPECBENCH_METHODS_DIR."""
    return Path(os.environ.get(METHODS_DIR_ENV) or Path.cwd() / "methods").resolve()


def _list_items(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip().strip("'\"") for v in value.split(",") if v.strip()]


def _search_entry(item: str) -> Path | None:
    """A Hydra search-path entry as a folder: file://DIR, pkg://package, or a plain path."""
    if item.startswith("pkg://"):
        try:
            spec = importlib.util.find_spec(item[len("pkg://"):].replace("/", "."))
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return Path(item.removeprefix("file://"))


def search_dirs(argv: Sequence[str]) -> list[Path]:
    """The folders a command line adds to Hydra's search path (`--config-dir`, `-cd`,
    `hydra.searchpath=[...]`), absolute, each once, specbench's own config folder left out."""
    found: list[Path | None] = []
    for before, arg in zip(["", *argv], argv):
        if before in ("--config-dir", "-cd"):
            found.append(Path(arg))
        elif arg.startswith(("--config-dir=", "-cd=")):
            found.append(Path(arg.split("=", 1)[1]))
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            found.extend(_search_entry(item) for item in _list_items(arg.split("=", 1)[1]))
    out: list[Path] = []
    for folder in found:
        if folder is not None and folder.resolve() not in out and folder.resolve() != CONFIG_DIR.resolve():
            out.append(folder.resolve())
    return out


def _check_impl(cfg: DictConfig, label: str) -> None:
    if not cfg.get("impl") and not cfg.get("defaults"):
        raise SpecbenchError(f"{label} has no impl; write impl: <module>.<Class> (a specbench Method)")


def _yaml_loader(path: Path) -> Callable[[], DictConfig]:
    def load() -> DictConfig:
        try:
            cfg = OmegaConf.load(path)
        except Exception as exc:  # noqa: BLE001 - OSError, OmegaConf's errors, and PyYAML's, which it raises as they are
            if not isinstance(exc, (OSError, OmegaConfBaseException, ValueError)) and not type(
                    exc).__module__.startswith("yaml"):
                raise
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1})" if where is not None else ""
            raise SpecbenchError(f"cannot read method config {path}: {str(exc).strip().splitlines()[0]}{at}") from None
        if not isinstance(cfg, DictConfig):
            raise SpecbenchError(f"method config {path} is not a mapping; write name: ..., impl: module.Class")
        if cfg.get("name") != path.stem:
            raise SpecbenchError(f"{path} says name: {cfg.get('name')}; write name: {path.stem} (a method's name is "
                                 "its file name)")
        _check_impl(cfg, str(path))
        return cfg

    return load


def _plugin_loader(path: Path) -> Callable[[], DictConfig]:
    """A methods/ YAML: also checks that a dotless impl module sits beside it."""
    read = _yaml_loader(path)

    def load() -> DictConfig:
        cfg = read()
        module = str(cfg.get("impl", "")).rpartition(".")[0]
        if module and "." not in module and not (path.parent / f"{module}.py").is_file():
            raise SpecbenchError(f"{path} names impl '{cfg.impl}' but {path.parent / (module + '.py')} does not exist; "
                                 "put the method's module beside its YAML")
        return cfg

    return load


def _entry_point_loader(ep: metadata.EntryPoint) -> Callable[[], DictConfig]:
    def load() -> DictConfig:
        label = f"entry point '{ep.name} = {ep.value}' ({ENTRY_POINT_GROUP})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, (dict, DictConfig)):
                obj = obj()
            if isinstance(obj, (str, os.PathLike)):
                obj = OmegaConf.load(obj)
            cfg = OmegaConf.create(obj) if isinstance(obj, dict) else obj
        except Exception as exc:  # noqa: BLE001 - any failure of third-party code becomes one line
            raise SpecbenchError(f"{label} failed to load: {type(exc).__name__}: {exc}") from None
        if not isinstance(cfg, DictConfig):
            raise SpecbenchError(f"{label} gave {type(cfg).__name__}; it must give a method config (a dict, a "
                                 "callable returning one, or the path of a YAML file)")
        if cfg.get("name", ep.name) != ep.name:
            raise SpecbenchError(f"{label} gives a config named '{cfg.name}'; make it the entry point's name")
        with open_dict(cfg):
            cfg.name = ep.name
        _check_impl(cfg, label)
        return cfg

    return load


def _builtin_specs() -> list[MethodSpec]:
    paths = sorted((CONFIG_DIR / "method").glob("*.yaml"))
    return [MethodSpec(p.stem, BUILTIN, str(p), _yaml_loader(p)) for p in paths]


def _folder_specs(folder: Path) -> list[MethodSpec]:
    return [MethodSpec(p.stem, FOLDER, str(p), _plugin_loader(p)) for p in sorted(folder.glob("*.yaml"))]


def _search_specs(folders: list[Path]) -> list[MethodSpec]:
    return [MethodSpec(p.stem, SEARCH_PATH, str(p), _yaml_loader(p))
            for folder in folders for p in sorted((folder / "method").glob("*.yaml"))]


def _entry_point_specs() -> list[MethodSpec]:
    points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    out = []
    for ep in points:
        dist = getattr(ep, "dist", None)
        origin = f"{ep.name} = {ep.value}" + (f" ({dist.name})" if dist is not None else "")
        out.append(MethodSpec(ep.name, ENTRY_POINT, origin, _entry_point_loader(ep)))
    return out


class Registry:
    """The methods of every source, in a stable order: built-ins (by name), then the methods/
    folder, the search path and entry points."""

    def __init__(self, specs: list[MethodSpec], folder: Path, search: list[Path]) -> None:
        self.folder = folder
        self.search = search
        self.specs: dict[str, MethodSpec] = {}
        self.broken: dict[str, str] = {}  # method -> why its config cannot be read (left out: leave_out_broken)
        for spec in specs:
            if spec.name in self.specs:
                first = self.specs[spec.name]
                raise SpecbenchError(
                    f"method '{spec.name}' is defined twice: {first.source} {first.origin} and {spec.source} "
                    f"{spec.origin}; rename or remove one of them"
                )
            self.specs[spec.name] = spec
        self._composed: dict[str, DictConfig] = {}

    def names(self, suite: str | None = None, source: str | None = None) -> list[str]:
        return [n for n, s in self.specs.items()
                if (source is None or s.source == source) and (suite is None or suite in self.suites(n))]

    def leave_out_broken(self) -> None:
        """A plugin's config that cannot be read (a YAML that does not parse, a missing module, a bad
        entry point) leaves that method out with one warning line naming the file, so the other methods
        run; asking for it is its one-line error (`unknown`)."""
        for name, spec in list(self.specs.items()):
            if spec.source == BUILTIN:
                continue
            try:
                spec.raw()
            except SpecbenchError as exc:
                self.broken[name] = str(exc)
                del self.specs[name]
                print(f"warning: method '{name}' left out: {exc}", file=sys.stderr, flush=True)

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def spec(self, name: str) -> MethodSpec:
        if name not in self.specs:
            raise self.unknown(name)
        return self.specs[name]

    def location(self, source: str) -> str:
        """Where a source reads from."""
        if source == BUILTIN:
            return str(CONFIG_DIR / "method")
        if source == FOLDER:
            return str(self.folder)
        if source == SEARCH_PATH:
            return ", ".join(str(p / "method") for p in self.search)
        return f"entry-point group '{ENTRY_POINT_GROUP}'"

    def unknown(self, name: str) -> SpecbenchError:
        """The error for a name no source defines: what is available, by source, and how to add one."""
        if name in self.broken:
            return SpecbenchError(f"method '{name}' cannot be used: {self.broken[name]}")
        groups = [f"{', '.join(names)} ({s} {self.location(s)})" for s in SOURCES if (names := self.names(source=s))]
        return SpecbenchError(f"unknown method '{name}'; available: {'; '.join(groups)}; {HOW_TO_ADD}")

    def config(self, name: str) -> DictConfig:
        """The method's config with its `defaults` list applied the way Hydra applies a list of
        other methods (`_self_` last unless placed), for listing; runs compose through Hydra."""
        if name not in self._composed:
            self._composed[name] = self._compose(name, ())
        return self._composed[name]

    def _compose(self, name: str, seen: tuple[str, ...]) -> DictConfig:
        if name in seen:
            raise SpecbenchError(f"method defaults form a cycle: {' -> '.join((*seen, name))}")
        raw = self.spec(name).raw()
        own = OmegaConf.masked_copy(raw, [k for k in raw if k != "defaults"])
        entries = list(raw.get("defaults") or [])
        if "_self_" not in entries:
            entries.append("_self_")
        merged = OmegaConf.create()
        for entry in entries:
            if entry == "_self_":
                merged = OmegaConf.merge(merged, own)
            elif isinstance(entry, str) and entry in self.specs:
                merged = OmegaConf.merge(merged, self._compose(entry, (*seen, name)))
        return merged

    def suites(self, name: str) -> list[str]:
        suites = self.config(name).get("suites")
        return [str(s) for s in suites] if suites is not None else list(DEFAULT_SUITES)

    def facts(self, name: str) -> dict[str, Any]:
        facts = self.config(name).get("facts")
        return OmegaConf.to_container(facts, resolve=True) if facts is not None else {}

    def trained(self) -> list[str]:
        """The methods that train their own head (a `train:` section, specbench.heads.recipe), in order."""
        return [n for n in self.names() if self.config(n).get("train") is not None]

    def recipe(self, name: str, changes: dict | None = None) -> tuple[type, Any]:
        """Method `name`'s class and its training settings: its `train:` section with `changes` over
        it, checked (types, ranges, unknown keys). An error when `name` trains no head of its own."""
        from specbench.heads.recipe import TRAIN_KEY, training_settings

        cfg = self.config(name)
        if cfg.get(TRAIN_KEY) is None:
            raise SpecbenchError(f"method '{name}' trains no head of its own (its YAML has no `{TRAIN_KEY}:` "
                                 f"section); methods that do: {', '.join(self.trained()) or 'none'}")
        cls = load_impl(str(cfg.get("impl")), name)
        values = {**OmegaConf.to_container(cfg[TRAIN_KEY], resolve=True), **(changes or {})}
        return cls, training_settings(cls, values, name)

    def builder_recipe(self, name: str, heads: Any, where: str) -> tuple[type, Any]:
        """Method `name`'s recipe as a builder trains it: `heads` (configs/zoo.yaml's `heads:`, a kit's
        `build.heads:`; per method, settings over its `train:` section) over the method's own; `where` names
        that section in the one-line errors (a key that is no method training a head, a bad setting)."""
        section = OmegaConf.to_container(heads, resolve=True) if OmegaConf.is_config(heads) else dict(heads or {})
        if unknown := sorted(set(section) - set(self.trained())):
            raise SpecbenchError(f"{where} names {', '.join(unknown)}, which train no head; its keys are the methods "
                                 f"that do: {', '.join(self.trained())}")
        try:
            return self.recipe(name, dict(section.get(name) or {}))
        except SpecbenchError as exc:
            raise SpecbenchError(f"{where}.{name}: {exc}") from None

    def impl_folders(self) -> list[Path]:
        """Where a dotless impl module (`<module>.Class`) is looked for, in order."""
        return [self.folder, *(p / "method" for p in self.search)]


def discover(argv: Sequence[str] = ()) -> Registry:
    """Every method: built-ins, the methods/ folder, the search path of `argv`, entry points."""
    folder = methods_dir()
    search = search_dirs(argv)
    specs = _builtin_specs() + _folder_specs(folder) + _search_specs(search) + _entry_point_specs()
    registry = Registry(specs, folder, search)
    registry.leave_out_broken()
    return registry


def register_with_hydra(registry: Registry) -> Registry:
    """Store the methods/ folder's and the entry points' configs in Hydra's ConfigStore (group
    `method`) so that `method=<name>` composes them; remember the registry for build_method."""
    from hydra.core.config_store import ConfigStore

    global _ACTIVE
    store = ConfigStore.instance()
    for spec in registry.specs.values():
        if spec.source in (FOLDER, ENTRY_POINT):
            store.store(group="method", name=spec.name, node=spec.raw(), provider=f"specbench {spec.source}")
    _ACTIVE = registry
    return registry


def load_module_file(path: Path) -> Any:
    """Import a plugin's module from its file under a private name (one per file)."""
    private = f"_specbench_method_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    if private in sys.modules:
        return sys.modules[private]
    spec = importlib.util.spec_from_file_location(private, path)
    if spec is None or spec.loader is None:
        raise SpecbenchError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module  # dataclasses and typing resolve names through sys.modules
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[private]
        raise
    return module


def load_impl(impl: str, method: str) -> type:
    """The class an `impl` names: `<module>.Class` from a plugin folder's `<module>.py`,
    else an importable `package.module.Class`."""
    module_name, _, class_name = impl.rpartition(".")
    folders = (_ACTIVE.impl_folders() if _ACTIVE is not None else []) + [methods_dir()]
    local = next((f / f"{module_name}.py" for f in folders if module_name and "." not in module_name
                  and (f / f"{module_name}.py").is_file()), None)
    try:
        module = load_module_file(local) if local else importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except SyntaxError as exc:
        raise SpecbenchError(f"method '{method}': its module {exc.filename} does not parse ({exc.msg}, line "
                             f"{exc.lineno}); fix it") from None
    except (ImportError, AttributeError, ValueError):
        where = f"{methods_dir()}/<module>.py or an importable package.module"
        raise SpecbenchError(f"method '{method}' names impl '{impl}', which cannot be imported from {where}; "
                             "write impl as module.Class") from None
    from specbench.engine.api import Method

    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise SpecbenchError(f"method impl '{impl}' is not a specbench Method (subclass specbench.engine.Method)")
    return cls


def method_label(method_cfg: DictConfig) -> str:
    """The name a run's answers are filed and reported under: the method's name, with `-fixed`
    when `method.budget=fixed` turns the draft budget off (`auto` is the default), so both can
    be compared side by side in one answers folder."""
    name = str(method_cfg.get("name"))
    return name + FIXED_SUFFIX if str(method_cfg.get("budget", "")) == "fixed" else name


def _part(name: str, *, _root_: DictConfig) -> str | None:
    """`${parts:NAME}` in a method's YAML: the part NAME built for the model, `<model.parts>:NAME`
    (`zoo:eagle` for model=tiny, `smollm2:eagle` for model=smollm2), or null for a model without
    built parts (a hub model: the method then asks for its own head, draft or datastore). A method
    config read on its own, without a model (`build_method` always gives one), has no parts either."""
    model = _root_.get("model") if isinstance(_root_, DictConfig) else None
    kit = model.get("parts") if isinstance(model, DictConfig) else None
    if isinstance(kit, DictConfig):  # a hub model's published parts by name (configs/model/vicuna-7b-v1.3.yaml)
        found = kit.get(name)
        return str(found) if found else None
    return f"{kit}:{name}" if kit else None


OmegaConf.register_new_resolver("parts", _part, replace=True)


def in_scope(method_cfg: DictConfig, scope: dict) -> DictConfig:
    """`method_cfg` resolved as the `method` of the config `scope` (a plain dict holding at least
    `model`): `${parts:...}` and other interpolations become plain values."""
    root = OmegaConf.create({**scope, "method": OmegaConf.to_container(method_cfg, resolve=False)})
    try:
        return OmegaConf.create(OmegaConf.to_container(root.method, resolve=True))
    except OmegaConfBaseException as exc:
        raise SpecbenchError(f"method '{method_cfg.get('name', '?')}': {str(exc).strip().splitlines()[0]} (fix "
                             "its YAML or override)") from None


def build_method(method_cfg: DictConfig, target: LoadedModel, model_cfg: DictConfig, *,
                 resolved: bool = False) -> Method:
    """Instantiate the class named by the method config's `impl` (module.Class), its settings
    resolved for `model_cfg` (a method's `${parts:NAME}` names the part built for that model) unless
    they are already (`resolved`: a run's, resolved once against the run's config)."""
    if not resolved:
        model = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else {}
        method_cfg = in_scope(method_cfg, {"model": model})
    return load_impl(str(method_cfg.get("impl")), str(method_cfg.get("name")))(target, method_cfg, model_cfg)
