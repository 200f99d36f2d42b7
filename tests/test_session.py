"""The session's contracts: what a resumed run must share with its folder, and generated data
sets that never write over somebody's own question file."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers import specbench, write_questions
from specbench.core.errors import SpecbenchError
from specbench.core.questions import load_questions
from specbench.run.dataset import load_dataset
from specbench.run.provenance import comparable_identity, identity

RUN_CFG = OmegaConf.create({
    "dataset": {"name": "synthetic"}, "model": {"path": "zoo:target", "template": "chat_template"},
    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, "seed": 0,
})


def method(**facts) -> OmegaConf:
    return OmegaConf.create({"name": "pld", "impl": "specbench.methods.pld.PLD", "max_ngram": 3,
                             "facts": facts, "suites": ["bench"]})


def test_labels_are_not_part_of_the_identity():
    one = identity(RUN_CFG, method(drafting="prompt lookup"), torch.float32)
    reworded = identity(RUN_CFG, method(drafting="prompt lookup, reworded", training=False), torch.float32)
    assert one == reworded and "facts" not in one["method"] and "suites" not in one["method"]
    changed = OmegaConf.merge(method(drafting="prompt lookup"), {"max_ngram": 2})
    assert identity(RUN_CFG, changed, torch.float32) != one


def test_identities_written_with_labels_still_compare_equal():
    stored = {**identity(RUN_CFG, method(), torch.float32)}
    stored["method"] = {**stored["method"], "facts": {"drafting": "old wording"}}
    assert comparable_identity(stored) == identity(RUN_CFG, method(drafting="new"), torch.float32)
    assert comparable_identity(None) is None


def synthetic(path) -> OmegaConf:
    return OmegaConf.create({"name": "synthetic", "path": str(path), "seed": 0,
                             "generator": "specbench.synth:make_questions"})


def test_generated_dataset_is_written_once_and_reused(tmp_path):
    path = tmp_path / "data" / "question.jsonl"
    first = load_dataset(synthetic(path))
    stamp = path.stat().st_mtime_ns
    assert len(first) == 480 and load_dataset(synthetic(path)) == first
    assert path.stat().st_mtime_ns == stamp  # identical content: not rewritten


def test_generated_dataset_never_overwrites_a_users_file(tmp_path):
    mine = write_questions(tmp_path / "mine.jsonl")
    before = mine.read_bytes()
    with pytest.raises(SpecbenchError, match="exists and is not the synthetic set") as info:
        load_dataset(synthetic(mine))
    assert "dataset=spec_bench" in str(info.value) and "\n" not in str(info.value)
    assert mine.read_bytes() == before
    assert len(load_questions(mine)) == len(before.splitlines())


def test_generator_that_cannot_be_imported_is_a_clear_error(tmp_path):
    cfg = OmegaConf.merge(synthetic(tmp_path / "q.jsonl"), {"generator": "specbench.nowhere:make"})
    with pytest.raises(SpecbenchError, match="cannot be imported; write it as module:function"):
        load_dataset(cfg)


def test_cli_refuses_to_overwrite_a_named_question_file(tmp_path):
    mine = write_questions(tmp_path / "mine.jsonl")
    before = mine.read_bytes()
    proc = specbench("run", f"dataset.path={mine}", "method=baseline", "limit=1", cwd=tmp_path)
    assert proc.returncode == 2 and mine.read_bytes() == before
    assert proc.stderr.strip().count("\n") == 0 and "exists and is not the synthetic set" in proc.stderr


def test_rewording_facts_resumes_instead_of_refusing(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    args = ["run", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
            f"dataset.path={questions}", f"output_dir={tmp_path / 'out'}", "max_new_tokens=4", "warmup=0",
            "progress=false", "task=qa", "method=pld"]
    specbench(*args, cwd=tmp_path, check=True)
    again = specbench(*args, "method.facts.drafting=reworded for people", cwd=tmp_path, check=True)
    assert "already in" in again.stderr and "different config" not in again.stderr
    refused = specbench(*args, "method.max_ngram=2", cwd=tmp_path)
    assert refused.returncode == 2 and "different config (method differ)" in refused.stderr
