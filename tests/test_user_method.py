"""The worked example of a user method (`methods/bigram.py` + `methods/bigram.yaml`): it runs from a
working directory that holds a copy of the repository's `methods/` folder, is lossless, and shows
up in `report` (tables and figures), `check` and `specbench methods`."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from helpers import REPO, specbench, write_questions
from specbench.core.answers import read_answers
from specbench.core.errors import SpecbenchError
from specbench.engine import DraftContext, Prefilled
from specbench.engine.api import parse_settings
from specbench.run import registry

pytestmark = pytest.mark.usefixtures("one_thread")


def copy_methods(cwd):
    shutil.copytree(REPO / "methods", cwd / "methods", ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    return cwd / "methods"


def run_args(model_dir, questions, out, *extra):
    return ["run", "model=local", f"model.path={model_dir}", "dataset=spec_bench", f"dataset.path={questions}",
            f"output_dir={out}", "max_new_tokens=32", "warmup=0", "progress=false", *extra]


def output_ids(out, method):
    path = out / "spec_bench" / "local" / method / "temp-0" / "run-1" / "answers.jsonl"
    return {r["question_id"]: r["specbench"]["output_ids"] for r in read_answers(path)}, read_answers(path)


@pytest.fixture(scope="module")
def bigram_run(tiny_models, tmp_path_factory):
    """`specbench run method=bigram` (the baseline in turn with it) from a folder with methods/ in it."""
    cwd = tmp_path_factory.mktemp("user")
    copy_methods(cwd)
    questions = write_questions(cwd / "q.jsonl", per_category=1)
    out = cwd / "results"
    specbench(*run_args(tiny_models["llama"], questions, out, "method=bigram", "task=all"), cwd=cwd, check=True)
    return cwd, out


def test_bigram_is_lossless_and_drafts(bigram_run):
    _, out = bigram_run
    baseline, _ = output_ids(out, "baseline")
    bigram, records = output_ids(out, "bigram")
    assert bigram == baseline and len(bigram) == 7  # one question per category
    assert sum(stats["accepted_tokens"] for r in records for stats in r["specbench"]["stats"]) > 0


def test_report_lists_it_in_tables_and_figures(bigram_run):
    cwd, out = bigram_run
    proc = specbench("report", str(out), "--out", str(cwd / "board"), cwd=cwd, check=True)
    assert any(line.startswith("| bigram") for line in proc.stdout.splitlines()), proc.stdout
    table = (cwd / "board" / "spec_bench-local.md").read_text()
    assert "bigram cache of prompt + output" in table  # its facts in the taxonomy columns
    from specbench.presentation.figures import PALETTE

    builtins = len(registry.discover().names(source=registry.BUILTIN)) - 1  # the baseline has no colour
    svg = (cwd / "board" / "spec_bench-local-fig5.svg").read_text()
    assert f"fill: {PALETTE[builtins]}" in svg  # drawn in its own colour, the first after the built-ins'


def test_check_works_on_it(bigram_run):
    cwd, out = bigram_run
    check = ["check", "--results", str(out), "--reference", str(cwd / "reference")]
    specbench(*check, "--update", cwd=cwd, check=True)
    proc = specbench(*check, cwd=cwd)
    assert proc.returncode == 0, proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| bigram")]
    assert rows and all("| ok" in line for line in rows)


def test_it_is_listed_with_its_source(bigram_run):
    cwd, _ = bigram_run
    proc = specbench("methods", cwd=cwd, check=True)
    assert any(line.startswith("| bigram") and "methods/" in line and "bigram cache" in line
               for line in proc.stdout.splitlines()), proc.stdout
    names = specbench("methods", "--names", "--suite", "bench", cwd=cwd, check=True).stdout.strip().split(",")
    assert names[-1] == "bigram" and "pld" in names  # a user method without suites is in bench
    quick = specbench("methods", "--names", "--suite", "quick", cwd=cwd, check=True).stdout.strip()
    assert "bigram" not in quick.split(",")


def test_drafter_follows_the_most_recent_successor():
    module = registry.load_module_file(REPO / "methods" / "bigram.py")
    drafter = module.BigramDrafter(module.Settings(max_draft=6, from_prompt=True))
    prompt = [1, 2, 3, 1, 4]  # 1 -> 4 (the later successor wins), 2 -> 3, 3 -> 1
    import torch

    drafter.begin(Prefilled(input_ids=torch.tensor([prompt]), tokens=[2]), sampling=None)
    ctx = DraftContext(input_ids=torch.tensor([prompt]), tokens=[2], sampling=None, device=torch.device("cpu"),
                       max_depth=10)
    assert drafter.propose(ctx).tokens.tolist() == [3, 1, 4, 2, 3, 1]  # 4 -> 2 learned from the first token
    ctx.max_depth = 2
    assert drafter.propose(ctx).tokens.tolist() == [3, 1]


def test_settings_are_typed():
    module = registry.load_module_file(REPO / "methods" / "bigram.py")
    cfg = OmegaConf.load(REPO / "methods" / "bigram.yaml")
    assert parse_settings(module.BigramCache.Settings, cfg, "bigram") == module.Settings(max_draft=6, from_prompt=True)
    cfg.max_draft = "six"
    with pytest.raises(SpecbenchError, match="bad setting"):
        parse_settings(module.BigramCache.Settings, cfg, "bigram")


def test_plugin_inherits_a_builtin_through_defaults(tmp_path):
    folder = copy_methods(tmp_path)
    (folder / "small_lookahead.yaml").write_text("defaults: [lookahead, _self_]\nname: small_lookahead\nwindow: 3\n")
    proc = specbench("run", "--cfg", "job", "method=small_lookahead", cwd=tmp_path, check=True)
    method = OmegaConf.create(proc.stdout).method
    assert (method.name, method.impl, method.level, method.window) == (
        "small_lookahead", "specbench.methods.lookahead.Lookahead", 5, 3)
