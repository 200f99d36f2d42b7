"""Method settings: every built-in method YAML fills its method's typed Settings dataclass,
bad settings are refused with one line naming the key, and the values a method runs with are
the YAML's (the YAML declares them once; the dataclasses hold no defaults)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench import datastore as ds
from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR
from specbench.core.sampling import SamplingParams
from specbench.engine import SpeculativeMethod
from specbench.engine.api import COMMON_KEYS, Prefilled, parse_settings
from specbench.methods.rest import RestSettings
from specbench.models import load_model
from specbench.run.config import options
from specbench.run.registry import build_method

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

EMPTY = OmegaConf.create({})
ENGINE_KEYS = SpeculativeMethod.engine_keys
METHODS = options("method")


def composed(name: str, *overrides: str):
    """The method group as a run sees it (Hydra defaults such as sps_plain's applied)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"method={name}", *overrides]).method


def impl_class(cfg) -> type:
    module, _, name = str(cfg.impl).rpartition(".")
    return getattr(importlib.import_module(module), name)


def yaml_values(name: str) -> dict:
    """The settings a method YAML file itself writes (no Hydra)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "method" / f"{name}.yaml"))
    return {k: v for k, v in raw.items() if k not in (*COMMON_KEYS, *ENGINE_KEYS, "defaults")}


def parse(schema: type, cfg, method: str = ""):
    """parse_settings as the shared loop calls it: `budget` is the engine's key, not the method's."""
    return parse_settings(schema, cfg, method, ENGINE_KEYS)


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("name", METHODS)
def test_every_method_yaml_fills_its_settings(name):
    cfg = composed(name)
    cls = impl_class(cfg)
    settings = parse(cls.Settings, cfg, name)
    assert isinstance(settings, cls.Settings)
    values = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items()
              if k not in (*COMMON_KEYS, *ENGINE_KEYS)}
    fields = dataclasses.fields(cls.Settings)
    assert {f.name for f in fields} == set(values), "one settings field per YAML key"
    assert {f.name: getattr(settings, f.name) for f in fields} == values
    # Declared once: the YAML gives every value, the dataclass none.
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields)


def test_derived_yamls_inherit_their_parents_settings():
    plain, sps = (parse(impl_class(composed(n)).Settings, composed(n)) for n in ("sps_plain", "sps"))
    assert plain.draft == "zoo:draft_plain" and sps.draft is None
    assert dataclasses.replace(plain, draft=None) == sps
    cpu = parse(impl_class(composed("lookahead_cpu")).Settings, composed("lookahead_cpu"))
    assert (cpu.level, cpu.window, cpu.guess) == (4, 3, 3)
    assert cpu.pool_from_prompt == yaml_values("lookahead")["pool_from_prompt"]


def rest_cfg(**changes):
    cfg = OmegaConf.load(CONFIG_DIR / "method" / "rest.yaml")
    for key, value in changes.items():
        if value is dataclasses.MISSING:
            del cfg[key]
        else:
            cfg[key] = value
    return cfg


def test_unknown_setting_is_refused_with_the_known_ones():
    with pytest.raises(SpecbenchError) as excinfo:
        parse(RestSettings, rest_cfg(num_drafts=16), "rest")
    message = one_line_error(excinfo)
    assert "method 'rest' has no setting 'num_drafts'" in message and "num_draft" in message.split(";")[1]


def test_wrong_type_is_refused_naming_the_key():
    with pytest.raises(SpecbenchError) as excinfo:
        parse(RestSettings, rest_cfg(num_draft="abc"), "rest")
    message = one_line_error(excinfo)
    assert "'num_draft'" in message and "abc" in message and "YAML" in message


def test_missing_setting_is_refused_naming_the_key():
    with pytest.raises(SpecbenchError) as excinfo:
        parse(RestSettings, rest_cfg(draft_depth=dataclasses.MISSING), "rest")
    message = one_line_error(excinfo)
    assert "'draft_depth'" in message and "missing" in message


def test_null_where_a_value_is_needed_is_refused():
    with pytest.raises(SpecbenchError) as excinfo:
        parse(RestSettings, rest_cfg(max_suffix=None), "rest")
    assert "'max_suffix'" in one_line_error(excinfo)


def test_bad_settings_stop_construction_before_anything_loads():
    # The target is never touched: settings are parsed first.
    for cfg in (rest_cfg(num_draft="abc"), rest_cfg(bogus=1), OmegaConf.merge(composed("pld"), {"max_ngram": []})):
        with pytest.raises(SpecbenchError):
            build_method(cfg, None, EMPTY)


@pytest.mark.parametrize("name, key, bad", [("eagle", "choices", 5), ("medusa", "choices", [[0], ["a"]]),
                                            ("self_spec", "skip_layers", "some")])
def test_settings_of_several_forms_are_checked(name, key, bad):
    cfg = OmegaConf.merge(composed(name), {key: bad})
    with pytest.raises(SpecbenchError) as excinfo:
        parse(impl_class(cfg).Settings, cfg, name)
    assert key in one_line_error(excinfo)


def test_settings_of_several_forms_accept_each_form():
    paths = [[0], [1], [0, 0]]
    eagle = composed("eagle", f"method.choices={paths}")
    assert parse(impl_class(eagle).Settings, eagle).choices == paths
    skip = composed("self_spec", "method.skip_layers=[1]")
    assert parse(impl_class(skip).Settings, skip).skip_layers == [1]


@pytest.fixture(scope="module")
def target(tiny_models):
    return load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)


def test_rest_runs_with_the_yaml_values(target, tmp_path):
    docs = [target.tokenizer.encode("the quick brown fox jumps over the lazy dog", add_special_tokens=False)]
    store = ds.build(docs, target.tokenizer, tmp_path / "store")
    method = build_method(composed("rest", f"method.datastore={store}"), target, EMPTY)
    drafter, want = method.drafter, yaml_values("rest")
    got = {"max_suffix": drafter.max_suffix, "min_suffix": drafter.min_suffix, "num_draft": drafter.num_draft,
           "draft_depth": drafter.depth, "max_matches": drafter.max_matches}
    assert got == {k: v for k, v in want.items() if k != "datastore"}


def test_lookahead_runs_with_the_yaml_values(target):
    method = build_method(composed("lookahead"), target, EMPTY)
    drafter, want = method.drafter, yaml_values("lookahead")
    got = {"level": drafter.level, "window": drafter.window, "guess": drafter.guess,
           "pool_from_prompt": drafter.pool_from_prompt}
    assert got == want
    # pool_from_prompt as the YAML says: the prompt's n-grams are in the pool before the first step.
    prompt = torch.tensor([target.tokenizer.encode("the quick brown fox jumps over the lazy dog")])
    drafter.begin(Prefilled(input_ids=prompt, tokens=[int(prompt[0, 0])]), SamplingParams())
    assert bool(drafter.pool.table) == want["pool_from_prompt"]
