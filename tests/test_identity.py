"""A resume never mixes answers of two identities (issue 46's catalogue, resume class): each case
starts from a folder holding one answer, changes what could change an answer, runs again with more
questions to answer, and asserts the exit code, the one error line and that no answer was lost or
mixed. A resume of the same run (meta.json or not) goes on; `report` marks answers without a meta.json
and leaves out a folder whose answers come from two runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import assert_one_line_error, cli, snapshot, write_questions


@pytest.fixture
def first(tiny_models, tmp_path):
    """(results folder, arguments, model folder, question file), all of this test's own: the baseline's
    answer to the first of two qa questions (limit=1); a resume with the arguments (limit=2) has one to go."""
    model = shutil.copytree(tiny_models["llama"], tmp_path / "model")
    questions = write_questions(tmp_path / "q.jsonl", per_category=2)
    out = tmp_path / "results"
    args = ["run", "model=local", f"model.path={model}", "dataset=spec_bench", f"dataset.path={questions}",
            "max_new_tokens=8", "warmup=0", "progress=false", "task=qa", f"output_dir={out}"]
    done = cli(*args, "limit=1", cwd=tmp_path)
    assert done.code == 0, done
    return out, [*args, "limit=2"], model, questions


def folder_of(results) -> object:
    (meta,) = results.rglob("meta.json")
    return meta.parent


def edit_question(questions, *_):
    rows = [json.loads(x) for x in questions.read_text().splitlines()]
    first_qa = next(r for r in rows if r["category"] == "qa")
    first_qa["turns"] = ["what is the capital of the kingdom of somewhere else"]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))


def another_file(questions, *_):
    rows = [json.loads(x) for x in questions.read_text().splitlines()]
    for r in rows:
        r["turns"] = [t + " today" for t in r["turns"]]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))


def other_weights(_, model):
    weights = load_file(str(model / "model.safetensors"))
    torch.manual_seed(1)
    save_file({k: v + 0.01 * torch.randn_like(v) for k, v in weights.items()}, str(model / "model.safetensors"),
              metadata={"format": "pt"})


#: (id, what changes before the resume, extra overrides, pattern of the one error line)
CHANGES = [
    ("question-edited", edit_question, [], r"holds an answer to question \d+ as it was asked before"),
    ("question-file-replaced", another_file, [], r"holds an answer to question \d+ as it was asked before"),
    ("weights-replaced", other_weights, [], r"holds answers made with a different config \(parts differ\)"),
    ("stop-strings", None, ["model.stop_strings=[zz]"], r"different config \(stop_strings differ\)"),
    ("max-new-tokens", None, ["max_new_tokens=9"], r"different config \(max_new_tokens differ\)"),
    ("template", None, ["model.template=plain"], r"different config \(template differ\)"),
    ("dtype", None, ["dtype=bfloat16"], r"different config \(dtype differ\)"),
]


@pytest.mark.parametrize(("change", "extra", "pattern"), [pytest.param(*c[1:], id=c[0]) for c in CHANGES])
def test_a_resume_of_another_identity_is_refused(first, tmp_path, change, extra, pattern):
    results, args, model, questions = first
    if change is not None:
        change(questions, model)
    before = snapshot(results)
    assert_one_line_error(cli(*args, *extra, cwd=tmp_path), pattern)
    assert snapshot(results) == before  # nothing lost, nothing added


@pytest.mark.parametrize("extra", [["max_new_tokens=9"], ["model.stop_strings=[zz]"]], ids=["max-new", "stops"])
def test_without_meta_the_records_still_refuse_another_identity(first, tmp_path, extra):
    results, args, _, _ = first
    (folder_of(results) / "meta.json").unlink()
    before = snapshot(results)
    assert_one_line_error(cli(*args, *extra, cwd=tmp_path),
                          r"holds answers of another run \(question \d+: identity \w+, this run \w+\); its meta.json "
                          r"is missing; use overwrite=true")
    assert snapshot(results) == before


def test_an_edited_meta_cannot_make_a_resume_mix(first, tmp_path):
    """meta.json rewritten to the new settings' identity: the records still carry the old one."""
    results, args, _, _ = first
    probe = tmp_path / "probe"
    assert cli(*args[:-2], f"output_dir={probe}", "limit=1", "max_new_tokens=9", cwd=tmp_path).code == 0
    assert args[-2] == f"output_dir={results}"
    (folder_of(results) / "meta.json").write_text((folder_of(probe) / "meta.json").read_text())
    before = snapshot(results)
    assert_one_line_error(cli(*args, "max_new_tokens=9", cwd=tmp_path), r"holds answers of another run")
    assert snapshot(results) == before


@pytest.mark.parametrize("drop_meta", [False, True], ids=["meta", "no-meta"])
def test_the_same_run_resumes_with_or_without_its_meta(first, tmp_path, drop_meta):
    results, args, _, _ = first
    folder = folder_of(results)
    kept = (folder / "answers.jsonl").read_text()
    if drop_meta:
        (folder / "meta.json").unlink()
    done = cli(*args, cwd=tmp_path)
    assert done.code == 0 and "resuming, 1 answers kept, 1 to go" in done.err, done
    lines = (folder / "answers.jsonl").read_text()
    assert lines.startswith(kept) and len(lines.splitlines()) == 2
    records = [json.loads(x)["specbench"] for x in lines.splitlines()]
    assert len({r["identity"] for r in records}) == 1 and all(len(r["question"]) == 16 for r in records)


def test_report_marks_answers_without_meta_and_leaves_out_mixed_ones(first, tmp_path):
    results, args, _, _ = first
    assert cli(*args, cwd=tmp_path).code == 0
    folder = folder_of(results)
    (folder / "meta.json").unlink()
    done = cli("report", str(results), "--out", str(tmp_path / "board"), "--no-figures", cwd=tmp_path)
    assert done.code == 0, done
    assert "UNVERIFIED" in done.err and "answers without a meta.json" in done.err
    lines = (folder / "answers.jsonl").read_text().splitlines()
    mixed = json.loads(lines[1])
    mixed["specbench"]["identity"] = "0" * 16
    (folder / "answers.jsonl").write_text("\n".join([lines[0], json.dumps(mixed)]) + "\n")
    done = cli("report", str(results), "--out", str(tmp_path / "board2"), "--no-figures", cwd=tmp_path)
    assert done.code != 0 or "answers of 2 different runs are mixed" in done.err, done
    assert "answers of 2 different runs are mixed" in done.err
