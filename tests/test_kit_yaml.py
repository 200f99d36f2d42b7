"""A kit is a YAML: a file in a folder of SPECBENCH_KIT_PATH (or configs/kit) is enough to run a real
model with its parts: `model=KIT` composes from it, `KIT:target` and `KIT:<part>` resolve through it,
and `kit show KIT` lists its parts. Here the target is a random tiny Llama in a temporary folder."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import TINY_KIT, assert_one_line_error, cli, write_questions
from specbench.kit import build

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]


@pytest.fixture
def kits(tmp_path, tiny_models, monkeypatch):
    folder = tmp_path / "kits"
    folder.mkdir()
    kit = {**TINY_KIT, "name": "mini", "title": "Mini kit", "source": "folder", "folder": str(tiny_models["llama"]),
           "model": {"template": "plain", "max_new_tokens": 8}}
    (folder / "mini.yaml").write_text(yaml.safe_dump(kit))
    (folder / "misnamed.yaml").write_text(yaml.safe_dump({**kit, "name": "other"}))
    monkeypatch.setenv("SPECBENCH_KIT_PATH", str(folder))
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(build.CORPORA_VAR, str(tmp_path / "corpora"))  # no committed shards: made here
    return folder


def test_a_kit_yaml_alone_runs_its_model_with_its_parts(kits, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    done = cli("run", "model=mini", "method=baseline", "interleave=[sps]", "dataset=spec_bench",
               f"dataset.path={questions}", f"output_dir={out}", "warmup=0", "progress=false", "task=qa",
               "threads=1", cwd=tmp_path)
    assert done.code == 0, done.err[-3000:]
    answers = {p.parts[-4]: [json.loads(line) for line in p.read_text().splitlines()]
               for p in out.rglob("answers.jsonl")}
    assert set(answers) == {"baseline", "sps"}, sorted(out.rglob("answers.jsonl"))
    turns = {m: [a["choices"][0]["turns"] for a in rows] for m, rows in answers.items()}
    assert turns["sps"] == turns["baseline"] and len(turns["sps"]) == 1  # lossless, as on any model
    meta = json.loads(next(out.rglob("sps/**/meta.json")).read_text())
    text = json.dumps(meta)
    assert "mini:target" in text and "mini:draft" in text  # the kit's target and its distilled draft
    # the target is this folder's weights, recorded by checksum like a fetched one
    record = json.loads((tmp_path / "cache" / "mini" / "target.json").read_text())
    assert record["source"] == "folder" and len(record["sha256"]) == 64
    shown = cli("kit", "show", "mini", cwd=tmp_path)
    said = shown.out.splitlines()
    assert shown.code == 0 and "(from folder" in said[0], shown.out
    assert any(line.strip().startswith(f"drafts: {tmp_path / 'cache' / 'mini'}") for line in said), shown.out


def test_a_kit_yaml_that_names_another_kit_is_one_line_error(kits, tmp_path):
    done = cli("run", "model=misnamed", "method=baseline", "progress=false", cwd=tmp_path)
    assert_one_line_error(done, r"misnamed.yaml: its `name` is 'other', but the file names kit 'misnamed'; "
                                r"set name: misnamed")
    assert_one_line_error(cli("run", "model=nosuchkit", cwd=tmp_path), r"unknown model 'nosuchkit'.*mini")


def test_the_help_lists_the_kits_and_the_methods_that_train_a_head(kits, tmp_path):
    from specbench.run.registry import discover

    said = cli("--help", cwd=tmp_path).out
    kits_line = next(line for line in said.splitlines() if "a real model (kits:" in line)
    assert "mini" in kits_line and "smollm2" in kits_line, kits_line
    heads_line = next(line for line in said.splitlines() if line.strip().startswith("M: "))
    assert set(discover().trained()) | {"medusa", "eagle", "eagle3", "ppd", "specdec"} <= set(
        heads_line.strip()[3:].split("|")), heads_line
