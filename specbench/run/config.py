"""The Hydra config tree: where it lives, what its groups offer, and value checks.

Hydra composes the config; this module turns its failures into one-line messages that
list what is available, and checks values Hydra cannot (ranges, choices).
"""

from __future__ import annotations

import math
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from specbench.core.compose import on_config_dir
from specbench.core.errors import SpecbenchError
from specbench.core.longinput import parse_length
from specbench.core.prompts import TEMPLATES
from specbench.core.questions import SUBTASKS
from specbench.core.resources import CONFIG_DIR
from specbench.engine.budget import BUDGET_MODES
from specbench.run.registry import Registry, discover, in_scope, register_with_hydra

GROUPS = ("model", "method", "task", "dataset", "sweep", "backend")
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def options(group: str) -> list[str]:
    """The names a config group offers (its yaml files; for `model`, every kit's name too)."""
    names = {p.stem for p in (CONFIG_DIR / group).glob("*.yaml")}
    if group == "model":
        for finder in model_finders():
            names.update(finder.names())
    return sorted(names)


def model_finders() -> list:
    """The `specbench.resolver_finders` entry points (the kits: specbench.kit.KITS): each `names()`
    a model of its own, `model_config(name)` what `model=NAME` composes."""
    from importlib.metadata import entry_points

    from specbench.models import FINDER_GROUP

    return [e.load() for e in entry_points(group=FINDER_GROUP)]


def register_kit_models(overrides: list[str]) -> None:
    """`model=KIT` for every kit without a configs/model/KIT.yaml (`model_finders`: specbench.kit's
    model_config), stored in Hydra's ConfigStore: a kit YAML alone adds a real model. A kit the run
    names whose YAML is wrong is its one-line error; the others are only listed."""
    from hydra.core.config_store import ConfigStore

    files = {p.stem for p in (CONFIG_DIR / "model").glob("*.yaml")}
    named = {v for item in overrides if item.startswith("model=") for v in _values(item.split("=", 1)[1])}
    for finder in model_finders():
        for name in finder.names():
            if name in files:
                continue
            try:
                node = finder.model_config(name)
            except SpecbenchError:
                if name in named:
                    raise
                continue
            ConfigStore.instance().store(group="model", name=name, node=node, provider="specbench kit")


def top_level_keys() -> list[str]:
    cfg = OmegaConf.load(CONFIG_DIR / "config.yaml")
    return sorted(k for k in cfg if k not in ("defaults", "hydra"))


def _values(text: str) -> list[str]:
    """The option names in an override value: `a`, `a,b` (sweep) or `[a,b]` (list)."""
    text = text.strip()
    if text.startswith(("[", "choice(")):
        text = text[text.index("[" if text.startswith("[") else "(") + 1 : -1]
    return [v.strip().strip("'\"") for v in text.split(",") if v.strip()]


def prepare(overrides: list[str]) -> Registry:
    """Everything a run's config can name, registered once before it is checked and composed: the
    methods (built-in, methods/ folder, the command line's search path, entry points) in Hydra's
    ConfigStore and the registry build_method uses, and `model=KIT` for every kit YAML."""
    registry = register_with_hydra(discover(overrides))
    register_kit_models(overrides)
    return registry


def check_overrides(overrides: list[str], registry: Registry | None = None) -> None:
    """Reject unknown group options and unknown keys before Hydra sees them. Methods come from
    `registry` (`prepare`'s; prepared here when not given)."""
    keys = top_level_keys()
    registry = registry or prepare(overrides)
    presets = backend_presets(overrides)
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
        if key == "interleave" and presets is not None:  # an engine's presets (backend=vllm)
            for name in _values(value):
                if name not in presets:
                    raise SpecbenchError(f"the backend has no preset '{name}' (its presets: {', '.join(presets)}); "
                                         "pick some with interleave=[...]")
        elif key in ("method", "interleave"):
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


def backend_presets(overrides: list[str]) -> list[str] | None:
    """The method presets of the run's backend (an engine we did not write), None for the local one."""
    chosen = [item.split("=", 1)[1] for item in overrides if item.startswith("backend=")]
    name = chosen[-1].strip() if chosen else "local"
    if name not in options("backend"):
        return None  # check_overrides names the unknown option
    presets = OmegaConf.load(CONFIG_DIR / "backend" / f"{name}.yaml").get("presets")
    return list(presets) if presets is not None else None


def check_compose(overrides: list[str], registry: Registry | None = None) -> DictConfig:
    """The run's config composed with Hydra's API (what a plain run then runs: composed once), so
    nested-key mistakes become one-line errors too (`registry`: `prepare`'s; prepared here when not
    given)."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [o for o in overrides if "=" in o and not o.startswith(("-", "hydra"))]
    registry = registry or prepare(overrides)
    search = [f"hydra.searchpath=[{','.join('file://' + str(p) for p in registry.search)}]"] if registry.search else []
    with on_config_dir():
        if checked := [o for o in plain if key_to_check(o.split("=", 1)[0])]:
            groups = [o for o in plain if o.split("=", 1)[0].lstrip("+~") in GROUPS]
            try:
                base = compose("config", overrides=groups + search)  # the keys the chosen groups define
            except (HydraException, OmegaConfBaseException):
                base = None  # an unknown option: the full compose below names it
            if base is not None:
                check_keys(checked, base)
        try:
            return compose("config", overrides=plain + search)
        except (HydraException, OmegaConfBaseException) as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            cause = str(exc.__cause__ or "").strip().splitlines()
            detail = ": ".join(x.rstrip(".") for x in lines[:1] + cause[:1]) or type(exc).__name__
            raise SpecbenchError(detail) from None


#: keys that code reads when present though no config of the group defines them (`cfg.dataset.get("generator")`)
OPTIONAL_KEYS = ("dataset.generator", "dataset.seed", "dataset.sha256", "dataset.url")
#: settings whose keys are the user's own (a server's environment variables, an engine's presets)
FREE_MAPS = ("backend.env", "backend.presets")


def _under_a_value(base: DictConfig, key: str) -> bool:
    """`key` names a place inside a value the config holds as a whole (a dict or list setting, e.g.
    `backend.env.X`), which the code reading that setting takes as it is."""
    parent = key.rsplit(".", 1)[0]
    while "." in parent or parent:
        node = OmegaConf.select(base, parent, default=None, throw_on_missing=False)
        if node is not None:
            return isinstance(node, ListConfig) or (isinstance(node, DictConfig) and len(node) == 0)
        if "." not in parent:
            return False
        parent = parent.rsplit(".", 1)[0]
    return False


def key_to_check(raw: str) -> bool:
    """An override's key (`+`/`~` prefix kept) that `check_keys` must find: a nested or a `+` key, a
    method's settings and Hydra's own aside (plain top-level keys are `check_overrides`' and a `~` deletes)."""
    key = raw.lstrip("+~")
    if key.split(".", 1)[0] in ("method", "hydra") or raw.startswith("~"):
        return False
    return "." in key or raw.startswith("+")


def check_keys(overrides: list[str], base: DictConfig) -> None:
    """Every nested key and every `+` key of `overrides` is one the composed config defines (a method's
    settings aside: its own check names an unknown one), so a typo never does nothing: one line with the
    nearest known key."""
    import difflib

    known = set(flat_keys(OmegaConf.to_container(base, resolve=False)))
    for item in overrides:
        raw = item.split("=", 1)[0]
        if not key_to_check(raw):
            continue
        key = raw.lstrip("+~")
        root = key.split(".", 1)[0]
        if key in OPTIONAL_KEYS or key in known or _under_a_value(base, key) or key.startswith(
                tuple(m + "." for m in FREE_MAPS)):
            continue
        parent, _, leaf = key.rpartition(".")
        siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
        found = difflib.get_close_matches(leaf, sorted(siblings), n=1, cutoff=0.7)
        near = [siblings[found[0]]] if found else []
        under = ", ".join(k for k in sorted(known) if k.startswith(root + ".")) or "none"
        hint = f"did you mean '{near[0]}'?" if near else f"the keys under '{root}' are {under}"
        raise SpecbenchError(f"unknown key '{key}' (nothing reads it, so it would change nothing); {hint}")


def flat_keys(value: Any, prefix: str = "") -> list[str]:
    """Every key of a plain config, dotted (`model.path`), nested ones included."""
    if not isinstance(value, dict):
        return []
    out = []
    for k, v in value.items():
        if k == "hydra":
            continue
        out.append(f"{prefix}{k}")
        out += flat_keys(v, f"{prefix}{k}.")
    return out


def compose_method(name: str) -> DictConfig:
    """The config of method `name` as `method=<name>` composes it (inheritance included), from
    inside a Hydra job or outside one."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # the job's Hydra: its search path finds the job's methods
        return compose("config", overrides=[f"method={name}"]).method
    with on_config_dir():
        return compose("config", overrides=[f"method={name}"]).method


def in_run(cfg: DictConfig, method_cfg: DictConfig) -> DictConfig:
    """`method_cfg` with every interpolation resolved against the run's config `cfg` (its model's
    parts, its top-level keys): what a method of the run sees, plain values only."""
    return in_scope(method_cfg, OmegaConf.to_container(cfg, resolve=False))


def selected_subtasks(task_cfg: DictConfig | None) -> list[str]:
    return [s for s in SUBTASKS if task_cfg and task_cfg.get(s)]


#: `schedule`: how a job's method runs share the machine's time
INTERLEAVED, SEQUENTIAL = "interleaved", "sequential"
SCHEDULES = (INTERLEAVED, SEQUENTIAL)
#: `lane_order`: in what order an interleaved job's method runs take each turn (run.runner.turn_orders)
SHUFFLED, ALTERNATING = "shuffled", "alternating"
LANE_ORDERS = (SHUFFLED, ALTERNATING)
#: the run-wide `budget=both`: every method with a draft budget runs as `auto` and `fixed`, in turn
BOTH = "both"
DTYPES = ("auto", "float32", "float16", "bfloat16")
#: the smallest temperature above 0 that samples (below it logits / temperature overflow; 0 is greedy)
MIN_TEMPERATURE = 1e-4
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
#: folder names (model, method, dataset): one path component, no hidden or parent folder
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: `batch_mode` values (run.local.LocalBackend.answer_batch)
BATCH_MODES = ("continuous", "static")


def check_values(cfg: DictConfig) -> None:
    """Ranges and choices of the plain keys, as one-line errors, before anything loads.
    Normalises `model.stop_strings`: a single string means that one stop string."""
    def fail(msg: str) -> None:
        raise SpecbenchError(msg)

    if not _is_int(cfg.max_new_tokens) or cfg.max_new_tokens < 1:
        fail(f"max_new_tokens must be a positive integer, got {cfg.max_new_tokens!r}")
    if not _is_number(cfg.temperature) or cfg.temperature < 0:
        fail(f"temperature must be a finite number >= 0 (0 = greedy), got {cfg.temperature!r}")
    if 0 < cfg.temperature < MIN_TEMPERATURE:
        fail(f"temperature={cfg.temperature!r} is too small to sample with (logits / temperature overflow to inf); use "
             f"temperature=0 for greedy decoding or a value >= {MIN_TEMPERATURE:g}")
    if not _is_number(cfg.top_p) or not 0 < cfg.top_p <= 1:
        fail(f"top_p must be in (0, 1], got {cfg.top_p!r}")
    if not _is_int(cfg.top_k) or cfg.top_k < 0:
        fail(f"top_k must be an integer >= 0 (0 = off), got {cfg.top_k!r}")
    if cfg.limit is not None and (not _is_int(cfg.limit) or cfg.limit < 1):
        fail(f"limit must be a positive integer or null, got {cfg.limit!r}")
    parse_length(cfg.get("length"))
    if not _is_int(cfg.runs) or cfg.runs < 1:
        fail(f"runs must be a positive integer, got {cfg.runs!r}")
    if not _is_int(cfg.get("batch_size", 1)) or cfg.get("batch_size", 1) < 1:
        fail(f"batch_size must be a positive integer, got {cfg.batch_size!r}")
    if cfg.get("batch_mode", "continuous") not in BATCH_MODES:
        fail(f"batch_mode must be one of {', '.join(BATCH_MODES)}, got {cfg.batch_mode!r}")
    if not _is_int(cfg.get("batch_queue", 1)) or cfg.get("batch_queue", 1) < 1:
        fail(f"batch_queue must be a positive integer (questions per timed sequence, in batch sizes), "
             f"got {cfg.batch_queue!r}")
    if cfg.get("budget") not in (None, *BUDGET_MODES, BOTH):
        fail(f"budget must be one of {', '.join(BUDGET_MODES)}, {BOTH} (the two in turn, question by question) or "
             f"null (each method's own), got {cfg.budget!r}")
    if cfg.get("schedule", INTERLEAVED) not in SCHEDULES:
        fail(f"schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.get("lane_order", SHUFFLED) not in LANE_ORDERS:
        fail(f"lane_order must be one of {', '.join(LANE_ORDERS)}, got {cfg.lane_order!r}")
    lanes = cfg.get("interleave") or []
    if not isinstance(lanes, (list, ListConfig)) or not all(isinstance(x, str) and x for x in lanes):
        fail(f"interleave must be a list of method names, e.g. interleave=[sps,pld], got {lanes!r}")
    if not _is_int(cfg.get("precision_probe", 0)) or cfg.get("precision_probe", 0) < 0:
        fail(f"precision_probe must be an integer >= 0 (greedy tokens per prompt; 0 = off), "
             f"got {cfg.precision_probe!r}")
    if not _is_int(cfg.warmup) or cfg.warmup < 0:
        fail(f"warmup must be an integer >= 0, got {cfg.warmup!r}")
    if not _is_int(cfg.seed) or not 0 <= cfg.seed < 2**63:
        fail(f"seed must be an integer >= 0, got {cfg.seed!r}")
    if cfg.threads is not None and (not _is_int(cfg.threads) or cfg.threads < 1):
        fail(f"threads must be a positive integer or null (torch's default), got {cfg.threads!r}")
    if not isinstance(cfg.device, str) or not DEVICE.fullmatch(cfg.device):
        fail(f"device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.dtype not in DTYPES:
        fail(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.model.get("dtype") not in (*DTYPES, None):
        fail(f"model.dtype must be one of {', '.join(DTYPES)} or null, got {cfg.model.dtype!r}")
    for key in ("overwrite", "baseline", "progress"):
        if not isinstance(cfg[key], bool):
            fail(f"{key} must be true or false, got {cfg[key]!r}")
    if not _is_number(cfg.contention_threshold) or cfg.contention_threshold < 0:
        fail(f"contention_threshold must be a number of CPU cores >= 0, got {cfg.contention_threshold!r}")
    if cfg.on_error not in ("record", "raise"):
        fail(f"on_error must be record or raise, got {cfg.on_error!r}")
    if not selected_subtasks(cfg.get("task")):
        fail(f"no subtask selected; use task=all or task=[{','.join(SUBTASKS[:2])}]")
    if OmegaConf.is_missing(cfg.model, "path") or not cfg.model.path or not isinstance(cfg.model.path, str):
        fail("model.path is not set; use model=local model.path=/path/to/model (or a hub id)")
    for key, fix in (("dataset.path", "a question file, e.g. dataset.path=data/spec_bench/question.jsonl"),
                     ("output_dir", "a folder, e.g. output_dir=results/answers")):
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if not isinstance(value, str) or not value.strip() or value != value.strip():
            fail(f"{key} must be a path, got {value!r}; give {fix}")
    if cfg.model.template not in TEMPLATES:
        fail(f"model.template must be one of {', '.join(TEMPLATES)}, got {cfg.model.template!r}")
    for key, value in (("model.name", cfg.model.name), ("dataset.name", cfg.dataset.name),
                       ("method.name", cfg.method.name)):
        if not isinstance(value, str) or not NAME.fullmatch(value):
            fail(f"{key} must be a plain folder name (letters, digits, _ . + -), got {value!r}")
    check_stop_strings(cfg)


def check_stop_strings(cfg: DictConfig) -> None:
    """`model.stop_strings=abc` means the one stop string "abc" (not "a", "b", "c")."""
    value = cfg.model.get("stop_strings")
    if value is None:
        value = []
    elif isinstance(value, str):
        value = [value]
    elif isinstance(value, ListConfig):
        value = list(value)
    else:
        raise SpecbenchError("model.stop_strings must be a list of strings, e.g. "
                             f"'model.stop_strings=[\"</s>\",\"###\"]', got {value!r}")
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise SpecbenchError(f"model.stop_strings must be non-empty strings, got {bad[0]!r}; quote numbers: "
                             "'model.stop_strings=[\"1.\"]'")
    with open_dict(cfg):
        cfg.model.stop_strings = value
