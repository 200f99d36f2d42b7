"""End to end through `python -m specbench`: answer files, resuming, summary, bad input."""

import json
import signal

import pytest

from helpers import OFFICIAL, answers_file, base_args, specbench, write_questions
from specbench.core.answers import read_answers

UPSTREAM_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}


def check_record(record, n_turns):
    assert UPSTREAM_KEYS <= set(record)
    choice = record["choices"][0]
    assert set(choice) == CHOICE_KEYS
    assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == n_turns
    extra = record["specbench"]
    assert [len(ids) for ids in extra["output_ids"]] == choice["new_tokens"]
    assert sum(choice["accept_lengths"]) + n_turns == sum(choice["new_tokens"])
    assert all(t > 0 for t in choice["wall_time"])
    assert all(0 < p <= w for p, w in zip(extra["prefill_time"], choice["wall_time"]))


def test_run_writes_upstream_answers_and_summary(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "results"
    proc = specbench(*base_args(tiny_models["llama"], questions, out, "task=all", "limit=2"), cwd=tmp_path, check=True)
    records = read_answers(answers_file(out))
    assert len(records) == 12  # 2 per subtask; mt_bench = writing + roleplay, first 2 in file order
    by_id = {r["question_id"]: r for r in records}
    assert len(by_id) == 12
    for record in records:
        check_record(record, 2 if record["category"] in ("writing", "roleplay") else 1)
    meta = json.loads((answers_file(out).parent / "meta.json").read_text())
    assert meta["environment"]["torch"] and meta["identity"]["model"] == str(tiny_models["llama"])
    assert "Overall" in proc.stdout and "1.00x" in proc.stdout and "Retrieval-aug. Generation" in proc.stdout


@pytest.mark.skipif(not OFFICIAL.exists(), reason="official question file not present")
def test_run_on_official_questions(tiny_models, tmp_path):
    out = tmp_path / "results"
    specbench(*base_args(tiny_models["qwen2"], OFFICIAL, out, "task=[qa,mt_bench]", "limit=1"), cwd=tmp_path,
              check=True)
    records = read_answers(answers_file(out))
    assert sorted(r["category"] for r in records) == ["qa", "writing"]
    check_record(next(r for r in records if r["category"] == "writing"), 2)


def test_killed_run_resumes_without_duplicates(tiny_models, tmp_path):
    """`kill -9` at a chosen question (the method kills its own process there, once), then a torn
    last line as a kill mid-write leaves: the same command resumes, nothing lost or doubled."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=3)
    lines = questions.read_text().splitlines()
    doomed = json.loads(lines[9])  # the 10th question in file order
    doomed["turns"] = ["please KILL the process here"]
    lines[9] = json.dumps(doomed)
    questions.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "max_new_tokens=24", "method.impl=faulty_methods.KillOnce")
    flag = tmp_path / "kill-once"
    flag.touch()
    env = {"SPECBENCH_KILL_FLAG": str(flag)}
    proc = specbench(*args, cwd=tmp_path, env=env)
    assert proc.returncode == -signal.SIGKILL and not flag.exists()
    path = answers_file(out)
    kept = read_answers(path)
    order = [json.loads(x)["question_id"] for x in lines]
    answered = [r["question_id"] for r in kept]
    assert len(kept) == 9 and set(answered) < set(order) and doomed["question_id"] not in answered
    with path.open("a") as fh:  # and a torn last line, as a kill mid-write leaves
        fh.write('{"question_id": 999, "category": "qa", "cho')
    proc = specbench(*args, cwd=tmp_path, check=True, env=env)
    assert "resuming, 9 answers kept, 12 to go" in proc.stderr
    records = read_answers(path)
    ids = [r["question_id"] for r in records]
    assert sorted(ids) == list(range(1, 22)) and len(ids) == len(set(ids))
    assert [r["answer_id"] for r in records[:9]] == [r["answer_id"] for r in kept]
    again = specbench(*args, cwd=tmp_path, check=True)
    assert "already" in again.stderr and len(read_answers(path)) == 21
    specbench(*args, "overwrite=true", "task=qa", cwd=tmp_path, check=True)
    assert len(read_answers(path)) == 3


def test_resume_refuses_a_different_config(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    specbench(*base_args(tiny_models["llama"], questions, out, "task=qa"), cwd=tmp_path, check=True)
    proc = specbench(*base_args(tiny_models["llama"], questions, out, "task=qa", "max_new_tokens=9"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "different config (max_new_tokens differ)" in proc.stderr and "overwrite=true" in proc.stderr


def test_missing_inputs_say_how_to_fix(tmp_path):
    proc = specbench("run", "dataset=spec_bench", f"dataset.path={tmp_path}/none.jsonl", "model=local",
                     "model.path=/nonexistent/model", cwd=tmp_path)
    assert proc.returncode == 2 and "data fetch" in proc.stderr
    proc = specbench("run", "model=local", cwd=tmp_path)
    assert proc.returncode == 2 and "model.path is not set" in proc.stderr
    proc = specbench("frobnicate", cwd=tmp_path)
    assert proc.returncode == 2 and "commands: run" in proc.stderr


def test_hydra_cfg_job_and_multirun(tiny_models, tmp_path):
    proc = specbench("run", "--cfg", "job", "method=baseline", "temperature=0.7", cwd=tmp_path, check=True)
    assert "temperature: 0.7" in proc.stdout and "impl: specbench.methods.baseline.Baseline" in proc.stdout
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=qa", "temperature=0,0.5")
    specbench("-m", *args, "hydra.sweep.dir=" + str(tmp_path / "multirun"), cwd=tmp_path, check=True)
    assert len(read_answers(answers_file(out, temp="0"))) == 1
    assert len(read_answers(answers_file(out, temp="0.5"))) == 1
