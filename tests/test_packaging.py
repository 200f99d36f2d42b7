"""specbench as users install it: pyproject declares what the code imports and ships the config
tree, the installed package finds its configs from any folder, and the study scripts print the
commands they would run. (scripts/wheel_smoke.sh builds and runs the real wheel: `make wheel-smoke`.)"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.core.resources import CONFIG_DIR
from specbench.run.config import check_compose, check_overrides

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specbench"
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))
#: import name -> distribution name, where the two differ
DISTRIBUTIONS = {"yaml": "pyyaml", "hydra": "hydra-core", "huggingface_hub": "huggingface-hub",
                 "sklearn": "scikit-learn", "PIL": "pillow", "markdown_it": "markdown-it-py"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def distribution(requirement: str) -> str:
    """`hydra-core>=1.3,<1.4` -> `hydra-core` (PEP 503 normalised)."""
    name = re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def third_party_imports() -> dict[str, Path]:
    """Top-level module name -> a file of specbench/ that imports it, stdlib and specbench left out."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "specbench" and top not in sys.stdlib_module_names:
                    found.setdefault(top, path.relative_to(ROOT))
    return found


def test_every_third_party_import_is_a_declared_dependency():
    declared = {distribution(r) for r in pyproject()["project"]["dependencies"]}
    imports = third_party_imports()
    assert {"torch", "transformers", "hydra", "numpy"} <= set(imports)  # the scan sees the code
    missing = {f"{name} ({where})": DISTRIBUTIONS.get(name, name) for name, where in imports.items()
               if distribution(DISTRIBUTIONS.get(name, name)) not in declared}
    assert not missing, f"imported but not in pyproject's dependencies: {missing}; add the distributions"


def test_the_package_list_names_every_package_and_maps_configs():
    setuptools = pyproject()["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    listed = set(setuptools["packages"])
    expected = on_disk | {"specbench.configs"}
    assert listed == expected, (
        f"pyproject's [tool.setuptools] packages: add {sorted(expected - listed)}, remove {sorted(listed - expected)}"
    )
    assert setuptools["package-dir"] == {"specbench.configs": "configs"}


def test_package_data_globs_cover_the_whole_config_tree():
    globs = pyproject()["tool"]["setuptools"]["package-data"]["specbench.configs"]
    shipped = {p for pattern in globs for p in (ROOT / "configs").glob(pattern)}
    files = {p for p in (ROOT / "configs").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert files and files <= shipped, f"not in the wheel: {sorted(str(p) for p in files - shipped)}"


def test_console_script_and_zoo_resolver_entry_points():
    from importlib import import_module

    from specbench.cli import main

    project = pyproject()["project"]
    module, _, name = project["scripts"]["specbench"].partition(":")
    assert getattr(import_module(module), name) is main  # the same function as `python -m specbench`
    resolver = project["entry-points"]["specbench.resolvers"]["zoo"]
    module, _, name = resolver.partition(":")
    from specbench.zoo import resolve

    assert getattr(import_module(module), name) is resolve


def test_a_checkout_reads_its_own_configs():
    assert CONFIG_DIR == ROOT / "configs"


def test_an_installed_package_reads_its_package_data_from_any_folder(tmp_path):
    """The wheel's layout inside some other git repository, with another project's top-level
    configs/ beside it: specbench reads specbench/configs/ and records no commit."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "a user's project"], check=True)
    site = tmp_path / "venv" / "site-packages"
    shutil.copytree(PACKAGE, site / "specbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", site / "specbench" / "configs")
    (site / "configs").mkdir()
    (site / "configs" / "config.yaml").write_text("someone: else\n")
    (site / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("from specbench.core.resources import CONFIG_DIR; from specbench.run.provenance import git_commit; "
            "print(CONFIG_DIR); print(git_commit())")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(site / "specbench" / "configs"), "None"]


def test_data_files_are_ignored_but_the_data_readme_is_not():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path]).returncode == 0

    assert (ROOT / "data" / "README.md").is_file()
    assert not ignored("data/README.md")
    for path in ("data/spec_bench/question.jsonl", "data/synthetic/question.jsonl", "data/my_questions.jsonl"):
        assert ignored(path), path


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_say_how_to_run_them(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lines = script.read_text(encoding="utf-8").splitlines()
    head = lines[1 : lines.index("set -euo pipefail")]
    assert head and all(line.startswith("#") for line in head), "start with a comment block"
    assert f"bash scripts/{script.name}" in "\n".join(head), "the comment block shows how to run it"


def dry_run(script: str, cwd: Path, **env: str) -> tuple[list[list[str]], Path]:
    """The commands `script --dry-run` prints, split into words, with a `specbench` on PATH that
    leaves a mark if anything calls it."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "specbench"
    fake.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(cwd / 'called'))}\n")
    fake.chmod(0o755)
    full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env}
    out = subprocess.run(["bash", str(ROOT / "scripts" / script), "--dry-run"], cwd=cwd, env=full_env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    commands = [shlex.split(line[2:]) for line in out.stdout.splitlines() if line.startswith("+ ")]
    return commands, cwd / "called"


def test_gpu_study_dry_run_prints_valid_commands_and_runs_nothing(tmp_path):
    commands, called = dry_run("gpu_study.sh", tmp_path, MODEL="vicuna-7b-v1.3", METHODS="sps,baseline,pld",
                               RUNS="3", DEVICE="cuda:1")
    assert not called.exists()
    assert commands[0] == ["specbench", "data", "fetch"]
    assert commands[-1][:2] == ["specbench", "report"]
    runs = commands[1:-1]
    assert [c[:3] for c in runs] == [["specbench", "run", f"method={m}"] for m in ("baseline", "sps", "pld")]
    for command in runs:
        assert {"runs=3", "device=cuda:1", "dataset=spec_bench", "task=all"} <= set(command)
        check_overrides(command[2:])
        check_compose(command[2:])


def test_gpu_study_dry_run_also_by_environment(tmp_path):
    flag, _ = dry_run("gpu_study.sh", tmp_path, METHODS="pld")
    env = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_study.sh")], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "DRY_RUN": "1", "METHODS": "pld"})
    assert env.returncode == 0, env.stderr
    assert [shlex.split(line[2:]) for line in env.stdout.splitlines()] == flag


def test_gpu_study_local_model_without_a_path_is_refused(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_study.sh"), "--dry-run"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "MODEL": "local"})
    assert out.returncode == 2
    assert out.stderr.strip() == "error: MODEL=local needs MODEL_PATH (a hub id or model folder)"


def test_cluster_study_dry_run_spreads_methods_with_the_launcher_preset(tmp_path):
    commands, called = dry_run("cluster_study.sh", tmp_path, METHODS="baseline,sps,pld", PARTITION="gpu")
    assert not called.exists()
    assert (CONFIG_DIR / "hydra" / "launcher" / "slurm.yaml").is_file()
    fetch, baseline, others, report = commands
    assert fetch[:3] == ["specbench", "data", "fetch"]
    assert baseline[:4] == ["specbench", "-m", "run", "method=baseline"]
    assert others[:4] == ["specbench", "-m", "run", "method=sps,pld"]
    assert report[:2] == ["specbench", "report"]
    for command in (baseline, others):
        assert {"hydra/launcher=slurm", "hydra.launcher.partition=gpu"} <= set(command)
        paths = [arg.partition("=")[2] for arg in command if arg.startswith(("dataset.path=", "output_dir="))]
        assert len(paths) == 2 and all(Path(p).is_absolute() for p in paths)
        check_overrides(command[3:])


def test_the_github_workflow_template_uses_real_commands(tmp_path, monkeypatch):
    """scripts/github/specbench-check.yml: every `specbench` command it runs exists and takes those
    flags, and its cache holds the folder the zoo is really built in."""
    import yaml

    from helpers import REPO, cli
    from specbench.cli import COMMANDS
    from specbench.zoo import store

    workflow = yaml.safe_load((REPO / "scripts" / "github" / "specbench-check.yml").read_text())
    steps = workflow["jobs"]["check"]["steps"]
    lines = [line for step in steps for line in step.get("run", "").splitlines()]
    found = [call for line in lines for call in re.findall(r"(?:^|\$\()\s*specbench (.*)", line)]
    calls = [shlex.split(call.split(")")[0]) for call in found]
    assert {words[0] for words in calls} == {"zoo", "check"}, calls
    for words in calls:
        assert words[0] in COMMANDS
        flags = [w for w in words[1:] if w.startswith("--")]
        command = words[:2] if words[0] == "zoo" else words[:1]  # zoo's flags belong to its actions
        helped = cli(*command, "--help", cwd=tmp_path).out
        assert all(f in helped for f in flags), (words, helped)
    monkeypatch.delenv(store.ENV_VAR, raising=False)
    cached = next(s for s in steps if s.get("uses", "").startswith("actions/cache"))["with"]["path"]
    assert Path(cached).expanduser() == store.zoo_root()
