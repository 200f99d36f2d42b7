"""`check` and `zoo` settings composed with Hydra's API (specbench.core.compose): Hydra's override
grammar, the fixed keys and kinds of the files, one-line errors, and a Hydra initialized before
(a `specbench run` job's) left as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.resources import CONFIG_DIR
from specbench.presentation.check import load_check_config
from specbench.zoo.cli import zoo_main
from specbench.zoo.store import CONFIG_PATH, load_zoo_config, zoo_hash

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds


def refused(load, overrides: list[str], pattern: str) -> str:
    """The one-line error of `load(overrides)`, which must match `pattern`."""
    with pytest.raises(SpecbenchError) as caught:
        load(overrides)
    message = str(caught.value)
    assert "\n" not in message, message
    assert re.search(pattern, message), message
    return message


def test_without_overrides_the_files_are_read_as_they_are():
    for load, path in ((load_check_config, CONFIG_DIR / "check.yaml"), (load_zoo_config, CONFIG_PATH)):
        cfg = load([])
        assert "hydra" not in cfg and "defaults" not in cfg and "model" not in cfg  # nothing of config.yaml
        assert OmegaConf.is_struct(cfg)
        assert OmegaConf.to_container(cfg) == OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    # the zoo's folder is named by the hash of its config: composing must not change it
    assert zoo_hash(load_zoo_config()) == zoo_hash(OmegaConf.load(CONFIG_PATH))
    assert zoo_hash(load_zoo_config(["seed=1"])) != zoo_hash(load_zoo_config())


def test_overrides_set_values():
    cfg = load_check_config(["tolerance.speedup_rel_min=0.3", "quick.base_file=/tmp/b.json"])
    assert cfg.tolerance.speedup_rel_min == 0.3 and cfg.quick.base_file == "/tmp/b.json"
    zoo = load_zoo_config(["draft.arch.hidden_size=96", "seed=${threads}"])
    assert zoo.draft_plain.arch.hidden_size == 96 and zoo.seed == zoo.threads == 2  # resolved
    # an integer where the file has a number is that number: the same zoo, the same hash
    assert zoo_hash(load_zoo_config(["target.train.lr=1"])) == zoo_hash(load_zoo_config(["target.train.lr=1.0"]))


def test_hydra_lists():
    cfg = load_check_config(["quick.overrides=['task=all','limit=2',\"runs=1\"]"])
    assert list(cfg.quick.overrides) == ["task=all", "limit=2", "runs=1"]
    assert list(load_check_config(["quick.overrides=[]"]).quick.overrides) == []
    refused(load_check_config, ["quick.overrides=[task=all]"], r"not key=value as Hydra reads it .*quote text")
    refused(load_zoo_config, ["card.floors=[0.5,0.5]"],
            r"^bad zoo override: .*card\.floors=\[0\.5,0\.5\]: Cannot merge")
    refused(load_check_config, ["quick.overrides=limit"], r"quick\.overrides must be a list like its default")


def test_unknown_keys_are_refused():
    check_file, zoo_file = re.escape(str(CONFIG_DIR / "check.yaml")), re.escape(str(CONFIG_PATH))
    refused(load_check_config, ["tolerance.speed=1"],
            rf"^unknown check setting 'tolerance\.speed'; the settings are those of {check_file}$")
    refused(load_zoo_config, ["no.such.key=1"],
            rf"^unknown zoo setting 'no\.such\.key'; the settings are those of {zoo_file}$")
    for item in ("hydra.run.dir=x", "model=tiny", "a/b=c", "quick.gate@x=1"):  # not settings of these files
        refused(load_check_config, [item], r"^unknown check setting")


def test_an_override_without_equals_is_refused():
    refused(load_check_config, ["tolerance"], r"^check override 'tolerance' has no '='; write key=value, e\.g\. "
                                              r"tolerance\.speedup_rel_min=0\.2$")
    refused(load_zoo_config, ["seed"], r"^zoo override 'seed' has no '='; write key=value, e\.g\. ")
    refused(load_check_config, ["=3"], r"^check override '=3' has no key")


def test_values_keep_their_kind():
    refused(load_check_config, ["tolerance.speedup_rel_min=abc"],
            r"^check setting tolerance\.speedup_rel_min must be a number like its default 0\.15, got 'abc'$")
    refused(load_check_config, ["tolerance.noise_sigmas=true"], r"must be a number .*got True")
    refused(load_zoo_config, ["seed=1.5"], r"^zoo setting seed must be an integer like its default 0, got 1\.5$")
    refused(load_zoo_config, ["train_dtype=1"], r"must be text like its default 'auto', got 1; quote text: "
                                                r"train_dtype='1'$")
    refused(load_zoo_config, ["target=5"], r"^zoo setting target is a table: set its keys, e\.g\. target\.arch=")
    refused(load_zoo_config, ["card.floors={eos_fraction:high}"], r"card\.floors\.eos_fraction must be a number")
    # the tolerance checks of `check` stay
    refused(load_check_config, ["tolerance.noise_sigmas=-1"], r"^tolerance\.noise_sigmas must be a number >= 0")
    refused(load_check_config, ["quick.gate.alpha=nan"], r"^quick\.gate\.alpha must be a number >= 0")


def test_adding_deleting_and_sweeping_are_refused():
    for item in ("+new=1", "+tolerance.new=1", "++new=1", "+seed=1"):
        refused(load_zoo_config, [item], rf"^zoo override '{re.escape(item)}' adds a setting; the zoo settings are "
                                         r"fixed .*write key=value, e\.g\. ")
    refused(load_check_config, ["~tolerance"], r"^check override '~tolerance' deletes a setting")
    refused(load_zoo_config, ["seed=1,2"], r"gives several values; give one: a list as key=\[a,b\]")
    refused(load_zoo_config, ["seed=range(1,3)"], r"gives several values")
    refused(load_zoo_config, ["seed=["], r"^zoo override 'seed=\[' is not key=value as Hydra reads it")


def test_interpolations():
    refused(load_zoo_config, ["seed=${nope}"], r"^zoo settings do not resolve \(.*'nope'.*seed=\$\{nope\}\)")
    # a key under an interpolation (`draft_plain.arch: ${draft.arch}`) is not set alone
    refused(load_zoo_config, ["draft_plain.arch.hidden_size=96"],
            r"draft_plain\.arch is \$\{draft\.arch\} .* set draft\.arch\.hidden_size \(changes both\)")
    refused(load_zoo_config, ["draft_plain.arch={hidden_size:96}"],
            r"^zoo setting draft_plain\.arch\.intermediate_size is missing: give draft_plain\.arch with every key")
    whole = load_zoo_config(["draft_plain.arch=${target.arch}"])
    assert whole.draft_plain.arch == whole.target.arch and whole.draft.arch.hidden_size == 128


def test_loading_twice_and_inside_an_initialized_hydra(tmp_path: Path):
    assert load_check_config(["tolerance.noise_sigmas=2"]) == load_check_config(["tolerance.noise_sigmas=2"])
    assert not GlobalHydra.instance().is_initialized()
    # a Hydra job of another config folder (a `specbench run` job has its own search path): it is
    # set aside while the settings compose, and back afterwards, errors or not
    (tmp_path / "config.yaml").write_text("mine: 1\n")
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        assert load_check_config().tolerance.noise_sigmas == 3.0
        assert zoo_hash(load_zoo_config()) == zoo_hash(OmegaConf.load(CONFIG_PATH))
        refused(load_zoo_config, ["seed=abc"], r"must be an integer")
        refused(load_zoo_config, ["+x=1"], r"adds a setting")
        assert GlobalHydra.instance().is_initialized()
        assert compose("config") == {"mine": 1}
    assert not GlobalHydra.instance().is_initialized()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):  # as `specbench run` composes
        run = compose("config", overrides=["method=pld"])
        assert load_check_config().quick.suite == "quick"
        assert compose("config", overrides=["method=pld"]) == run


def test_zoo_command_refuses_bad_overrides_in_one_line(capsys: pytest.CaptureFixture[str]):
    for item, pattern in (("+x=1", "adds a setting"), ("seed", "has no '='"), ("seed=abc", "must be an integer")):
        assert zoo_main(["path", item]) == 2  # `path` builds nothing
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: zoo") and pattern in err and "\n" not in err, err
