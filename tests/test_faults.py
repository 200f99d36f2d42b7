"""Faults: failing questions, Ctrl-C, unwritable results, shards, parallel launchers."""

import json
import signal
import subprocess

from test_cli import answers_file, base_args

from helpers import specbench, start_specbench, wait_for_answers, write_questions
from specbench.analysis import report
from specbench.core.answers import read_answers


def questions_with(path, extra_turns):
    write_questions(path, per_category=1)
    lines = path.read_text().splitlines()
    for i, turn in enumerate(extra_turns):
        lines.append(json.dumps({"question_id": 100 + i, "category": "qa", "turns": [turn]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_failing_questions_are_recorded_and_excluded(tiny_models, tmp_path):
    questions = questions_with(tmp_path / "q.jsonl", ["please BOOM now", "word " * 700])
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=qa")
    specbench(*args, cwd=tmp_path, check=True)  # baseline: only the over-long prompt fails
    proc = specbench(*args, "method.name=faulty", "method.impl=faulty_methods.FailOnMarker", cwd=tmp_path,
                     check=True)
    assert "question 100 failed: RuntimeError: simulated failure inside the method" in proc.stderr
    assert "question 101 failed: SpecbenchError: prompt of" in proc.stderr
    assert sorted(r["question_id"] for r in read_answers(answers_file(out, "faulty"))) == [5]
    errors = [json.loads(x) for x in (answers_file(out, "faulty").parent / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["question_id"] for e in errors) == [100, 101]
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(out))]
    assert all(r.rows["overall"]["questions"] == 1 for r in group.results)  # 100 and 101 left out for all
    assert any("question 100 failed" in p for p in group.problems)
    assert any("2 failed question(s) excluded" in p for p in group.problems)


def test_ctrl_c_keeps_answers_and_says_how_far(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=10)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "max_new_tokens=200")
    proc = start_specbench(args, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = answers_file(out)
    wait_for_answers(path, 1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "interrupted after" in stderr and "run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    kept = read_answers(path)
    assert kept and path.read_text().endswith("\n")


def test_unwritable_results_folder_fails_before_loading(tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = specbench(*base_args("/nonexistent/model", questions, blocker / "results"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "is not writable" in proc.stderr and "output_dir=" in proc.stderr and "cannot load model" not in proc.stderr


def test_shards_merge_and_missing_shard_is_named(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=2)
    out = tmp_path / "results"
    for i in (1, 2):
        specbench(*base_args(tiny_models["llama"], questions, out, f"shard={i}/3"), cwd=tmp_path, check=True)
    runs = report.load_runs(out)
    assert len(runs) == 1 and any("INCOMPLETE" in p for p in runs[0].problems)
    specbench(*base_args(tiny_models["llama"], questions, out, "shard=3/3"), cwd=tmp_path, check=True)
    (run,) = report.load_runs(out)
    assert sorted(r["question_id"] for r in run.records) == list(range(1, 15)) and not run.problems
    proc = specbench(*base_args(tiny_models["llama"], questions, out, "shard=4/3"), cwd=tmp_path)
    assert proc.returncode == 2 and "shard must look like i/n" in proc.stderr


def test_parallel_launcher_runs_every_job(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=[qa,rag]", "temperature=0,0.5,1.0",
                     "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'm'}")
    specbench("-m", *args, cwd=tmp_path, check=True)
    groups = report.group_runs(report.load_runs(out))
    assert sorted(g.temperature for g in groups) == [0.0, 0.5, 1.0]
    assert all(len(g.methods["baseline"][0].records) == 2 for g in groups)
