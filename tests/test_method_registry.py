"""The method registry's four sources (built-in, methods/ folder, Hydra search path, entry points),
its errors, and everything derived from it (suites, check --quick, figure colours, docs/methods.md's table)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from helpers import REPO, specbench, write_questions
from specbench.cli.methods import readme_block, readme_table
from specbench.core.answers import read_answers
from specbench.core.errors import SpecbenchError
from specbench.presentation import figures
from specbench.run import registry

BASELINE_IMPL = "specbench.methods.baseline.Baseline"
#: `check --quick`'s methods before suites existed (configs/check.yaml's quick.methods)
QUICK = {"baseline", "sps", "pld", "eagle", "eagle2", "medusa", "rest", "recycling", "lookahead", "self_spec"}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """An empty methods/ folder, made the plugin folder through SPECBENCH_METHODS_DIR."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.setenv(registry.METHODS_DIR_ENV, str(folder))
    return folder


def search_folder(root):
    """A Hydra search-path folder with one method whose module sits beside its YAML."""
    (root / "method").mkdir(parents=True)
    (root / "method" / "sp_greedy.yaml").write_text(
        "name: sp_greedy\nimpl: sp_greedy.Greedy\nfacts:\n  drafting: none (search path)\n")
    (root / "method" / "sp_greedy.py").write_text(
        "from specbench.methods.baseline import Baseline\n\n\nclass Greedy(Baseline):\n    pass\n")
    return root


def fake_distribution(site):
    """A fake installed package with three `specbench.methods` entry points (one per form)."""
    dist = site / "fake_specbench_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-specbench-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[specbench.methods]\nep_call = fake_specbench_plugin:ep_call\nep_dict = fake_specbench_plugin:EP_DICT\n"
        "ep_yaml = fake_specbench_plugin:EP_YAML\n")
    (site / "ep_yaml.yaml").write_text("defaults: [baseline, _self_]\nname: ep_yaml\nsuites: [bench, mine]\n")
    (site / "fake_specbench_plugin.py").write_text(
        "from pathlib import Path\n\n"
        f"EP_DICT = {{'impl': '{BASELINE_IMPL}', 'facts': {{'drafting': 'none (dict)'}}}}\n"
        "EP_YAML = str(Path(__file__).with_name('ep_yaml.yaml'))\n\n\n"
        f"def ep_call():\n    return {{'name': 'ep_call', 'impl': '{BASELINE_IMPL}', 'suites': ['mine']}}\n")
    return site


def run_cli(*args, cwd, pythonpath=()):
    """`python -m specbench ARGS` with extra folders on PYTHONPATH (where a fake package lives)."""
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), *map(str, pythonpath)])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def one_line_error(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


def test_builtins_carry_suites(plugin_dir):
    reg = registry.discover()
    builtins = reg.names(source=registry.BUILTIN)
    assert builtins == sorted(p.stem for p in (REPO / "configs" / "method").glob("*.yaml"))
    lossy = [n for n in builtins if "LOSSY" in str(reg.facts(n).get("verification", ""))]
    assert lossy == ["specdec_lossy"] and not reg.suites("specdec_lossy")  # a lossy option joins no suite
    controls = [n for n in builtins if reg.facts(n).get("control")]
    assert controls == ["noise"] and reg.suites("noise") == ["audit"]  # the audit's noise floor: not a method to rank
    assert reg.names(suite="bench") == [n for n in builtins if n not in lossy + controls]
    assert set(reg.names(suite="quick")) == QUICK
    assert all(reg.facts(n).get("description") for n in builtins)  # the methods table's text


def test_readme_table_is_generated_from_the_registry(plugin_dir):
    path = REPO / "docs" / "methods.md"
    _, table, _ = readme_block(path.read_text(encoding="utf-8"), path)
    assert table == readme_table(registry.discover()), (
        "docs/methods.md's table is stale; run `python -m specbench methods --markdown --write docs/methods.md`")


def test_search_path_folder_methods(tmp_path, plugin_dir, monkeypatch):
    extra = search_folder(tmp_path / "extra")
    monkeypatch.chdir(tmp_path)
    for argv in (["--config-dir", str(extra)], ["-cd", "extra"], [f"hydra.searchpath=[file://{extra}]"]):
        reg = registry.discover(argv)
        assert reg.names(source=registry.SEARCH_PATH) == ["sp_greedy"] and reg.search == [extra]
        assert reg.facts("sp_greedy") == {"drafting": "none (search path)"} and reg.suites("sp_greedy") == ["bench"]
    assert registry.discover([]).names(source=registry.SEARCH_PATH) == []


def test_search_path_method_runs_from_the_command_line(tiny_models, tmp_path):
    extra = search_folder(tmp_path / "extra")
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "out"
    specbench("run", "--config-dir", str(extra), "method=sp_greedy", "model=local",
              f"model.path={tiny_models['llama']}", "dataset=spec_bench", f"dataset.path={questions}",
              f"output_dir={out}", "task=qa", "max_new_tokens=8", "warmup=0", "progress=false",
              cwd=tmp_path, check=True)
    answers = {m: read_answers(out / "spec_bench" / "local" / m / "temp-0" / "run-1" / "answers.jsonl")
               for m in ("baseline", "sp_greedy")}
    assert [r["specbench"]["output_ids"] for r in answers["sp_greedy"]] == [
        r["specbench"]["output_ids"] for r in answers["baseline"]]
    proc = specbench("run", "--cfg", "job", f"hydra.searchpath=[file://{extra}]", "method=sp_greedy", cwd=tmp_path,
                     check=True)
    assert OmegaConf.create(proc.stdout).method.impl == "sp_greedy.Greedy"
    listed = specbench("methods", "-cd", str(extra), cwd=tmp_path, check=True).stdout
    assert any(line.startswith("| sp_greedy") and "search path" in line for line in listed.splitlines())


def test_entry_points_in_all_three_forms(tmp_path, plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site")))
    reg = registry.discover()
    assert reg.names(source=registry.ENTRY_POINT) == ["ep_call", "ep_dict", "ep_yaml"]
    assert reg.config("ep_dict").name == "ep_dict" and reg.config("ep_dict").impl == BASELINE_IMPL
    assert reg.config("ep_yaml").impl == BASELINE_IMPL  # inherited from the built-in through defaults
    assert reg.names(suite="mine") == ["ep_call", "ep_yaml"]
    assert "fake-specbench-plugin" in reg.spec("ep_call").origin


def test_entry_point_method_runs_from_the_command_line(tiny_models, tmp_path):
    site = fake_distribution(tmp_path / "site")
    proc = run_cli("run", "--cfg", "job", "method=ep_yaml", cwd=tmp_path, pythonpath=[site])
    assert proc.returncode == 0, proc.stderr
    method = OmegaConf.create(proc.stdout).method
    assert (method.name, method.impl) == ("ep_yaml", BASELINE_IMPL)
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "out"
    proc = run_cli("run", "method=ep_call", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
                   f"dataset.path={questions}", f"output_dir={out}", "task=qa", "max_new_tokens=8", "warmup=0",
                   "progress=false", "baseline=false", cwd=tmp_path, pythonpath=[site])
    assert proc.returncode == 0, proc.stderr
    assert len(read_answers(out / "spec_bench" / "local" / "ep_call" / "temp-0" / "run-1" / "answers.jsonl")) == 1
    listed = run_cli("methods", "--names", "--suite", "mine", cwd=tmp_path, pythonpath=[site])
    assert listed.stdout.strip() == "ep_call,ep_yaml"


def test_a_name_defined_twice_names_both_sources(tmp_path):
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "pld.yaml").write_text(f"name: pld\nimpl: {BASELINE_IMPL}\n")
    line = one_line_error(specbench("run", "method=baseline", cwd=tmp_path))
    assert "method 'pld' is defined twice" in line
    assert str(REPO / "configs" / "method" / "pld.yaml") in line and str(tmp_path / "methods" / "pld.yaml") in line
    site = fake_distribution(tmp_path / "site")
    (tmp_path / "methods" / "pld.yaml").rename(tmp_path / "methods" / "ep_dict.yaml")
    (tmp_path / "methods" / "ep_dict.yaml").write_text(f"name: ep_dict\nimpl: {BASELINE_IMPL}\n")
    line = one_line_error(run_cli("methods", cwd=tmp_path, pythonpath=[site]))
    assert "method 'ep_dict' is defined twice: methods/" in line and "entry point ep_dict" in line


def test_unknown_method_lists_every_source_and_how_to_add_one(tmp_path):
    extra = search_folder(tmp_path / "extra")
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "mine.yaml").write_text(f"name: mine\nimpl: {BASELINE_IMPL}\n")
    line = one_line_error(specbench("run", "-cd", str(extra), "method=nope", cwd=tmp_path))
    assert line.startswith("error: unknown method 'nope'; available: baseline, eagle")
    assert f"mine (methods/ {tmp_path / 'methods'})" in line
    assert f"sp_greedy (search path {extra / 'method'})" in line
    assert "methods/<name>.yaml + methods/<name>.py" in line


@pytest.mark.parametrize(("text", "pattern"), [
    ("name: mine\nimpl: mine.Mine\n", r"methods/mine.py does not exist"),
    ("name: yours\nimpl: mine.Mine\n", r"write name: mine"),
    ("name: mine\nimpl: mine.Mine\n  bad: [\n", r"cannot read method config .*mine.yaml: .* \(line 3\)"),
    ("- a\n- b\n", r"mine.yaml is not a mapping"),
    ("name: mine\n", r"mine.yaml has no impl"),
], ids=["module-absent", "name-differs", "yaml-does-not-parse", "a-list", "no-impl"])
def test_a_broken_plugin_is_left_out_in_one_line_and_named_when_asked_for(tmp_path, text, pattern):
    """Other methods go on (the listing, a run of another method); asking for the broken one is its
    one-line error, naming the file and the problem."""
    import re

    folder = tmp_path / "methods"
    folder.mkdir()
    (folder / "mine.yaml").write_text(text)
    listed = specbench("methods", "--names", cwd=tmp_path)
    warnings = [x for x in listed.stderr.splitlines() if x.strip()]
    assert listed.returncode == 0 and "pld" in listed.stdout.split(","), listed.stderr
    assert len(warnings) == 1 and warnings[0].startswith("warning: method 'mine' left out: ") and re.search(
        pattern, warnings[0]), warnings
    asked = specbench("run", "method=mine", cwd=tmp_path)
    errors = [x for x in asked.stderr.splitlines() if x.startswith("error")]
    assert asked.returncode == 2 and "Traceback" not in asked.stderr and len(errors) == 1, asked.stderr
    assert errors[0].startswith("error: method 'mine' cannot be used: ") and re.search(pattern, errors[0])


def test_a_plugin_module_that_does_not_parse_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "methods"
    folder.mkdir()
    (folder / "mine.yaml").write_text("name: mine\nimpl: mine.Mine\n")
    (folder / "mine.py").write_text("def broken(:\n")
    monkeypatch.setenv(registry.METHODS_DIR_ENV, str(folder))
    with pytest.raises(SpecbenchError, match=r"method 'mine': its module .*mine.py does not parse \(.*, line 1\)"):
        registry.load_impl("mine.Mine", "mine")
    (folder / "mine.py").write_text("class Mine:\n    pass\n")
    with pytest.raises(SpecbenchError, match="is not a specbench Method"):
        registry.load_impl("mine.Mine", "mine")


def test_check_quick_runs_the_quick_suite(plugin_dir, monkeypatch):
    from specbench.presentation import check

    (plugin_dir / "fast.yaml").write_text(f"name: fast\nimpl: {BASELINE_IMPL}\nsuites: [quick]\n")
    ran = []
    monkeypatch.setattr(check, "run_job", lambda command, cwd, what: ran.append(command) or 0.0)
    cfg = check.load_check_config()
    check.run_quick(cfg, plugin_dir / "out")
    (command,) = ran  # one job: the baseline and the suite in turn
    lanes = command[5].removeprefix("interleave=[").removesuffix("]").split(",")
    assert command[4] == "method=baseline" and set(lanes) == (QUICK | {"fast"}) - {"baseline"}
    with pytest.raises(SpecbenchError, match="no method is in suite 'none'"):
        check.run_quick(check.load_check_config(["quick.suite=none"]), plugin_dir / "out")


def test_figure_colours_follow_the_registry(plugin_dir):
    figures.known_methods.cache_clear()
    before = {m: figures.colour(m) for m in ("sps", "pld", "lookahead_cpu", "zzz_mine")}
    (plugin_dir / "zzz_mine.yaml").write_text(f"name: zzz_mine\nimpl: {BASELINE_IMPL}\n")
    figures.known_methods.cache_clear()
    try:
        after = {m: figures.colour(m) for m in before}
        builtins = registry.discover().names(source=registry.BUILTIN)
    finally:
        figures.known_methods.cache_clear()
    assert [after[m] for m in ("sps", "pld", "lookahead_cpu")] == [before[m] for m in ("sps", "pld", "lookahead_cpu")]
    assert after["zzz_mine"] == figures.PALETTE[len(builtins) - 1]  # after the built-ins but the baseline
    drawn = [m for m in builtins if m != "baseline"]
    assert len({figures.colour(m) for m in drawn}) == len(drawn)  # one colour each


def test_the_temperature_sweep_has_every_leaderboard_method_that_samples():
    """Figure 6 shows every method of the leaderboard that can sample (a greedy-only one says so in its facts)."""
    found = registry.discover()
    greedy_only = {n for n in found.names(source=registry.BUILTIN)
                   if "greedy only" in str(found.spec(n).raw().get("facts", {}).get("defaults", ""))}
    assert greedy_only == {"specdec_lossy"}, greedy_only
    assert set(found.names(suite="sweep", source=registry.BUILTIN)) == set(
        found.names(suite="leaderboard", source=registry.BUILTIN)) - greedy_only
