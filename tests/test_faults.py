"""Faults: failing questions, Ctrl-C in every phase, a full disk, torn error rows, unwritable
results, shards, parallel launchers. Each fault is injected at a chosen question (no race
with real decoding), so every count below is exact."""

import errno
import io
import json
import os
import signal

import pytest

from helpers import answers_file, assert_one_line_error, base_args, cli, specbench, write_questions
from specbench.analysis import report
from specbench.core.answers import AnswerWriter, read_answers
from specbench.run.local import LocalBackend


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


def ctrl_c_at(monkeypatch, method: str, question_id: int, presses: int = 1):
    """Make the run press Ctrl-C (SIGINT to this process) while `method` answers `question_id`."""
    answer = LocalBackend.answer_one

    def pressing(self, method_obj, question):
        if question.question_id == question_id and type(method_obj).__name__ == method:
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)
        return answer(self, method_obj, question)

    monkeypatch.setattr(LocalBackend, "answer_one", pressing)


def interrupted_run(tiny_models, tmp_path, monkeypatch, method, question_id, presses=1, schedule="sequential"):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=[qa,rag,translation]", "method=pld",
                     f"schedule={schedule}")
    ctrl_c_at(monkeypatch, method, question_id, presses)
    return out, args, cli(*args, cwd=tmp_path)


@pytest.mark.parametrize("method, question_id, base_kept, pld_kept", [
    ("Baseline", 3, 1, None),  # the baseline's first question (qids 3, 5, 7: translation, qa, rag)
    ("Baseline", 7, 3, None),  # the baseline's last question: the method's phase must not start
    ("PLD", 3, 3, 1),  # the method's first question
    ("PLD", 7, 3, 3),  # the method's last question: no summary, exit 130
])
def test_ctrl_c_ends_the_run_in_every_phase(tiny_models, tmp_path, monkeypatch, method, question_id, base_kept,
                                            pld_kept):
    out, args, result = interrupted_run(tiny_models, tmp_path, monkeypatch, method, question_id)
    assert result.code == 130 and "Traceback" not in result.err, result
    label = "baseline" if method == "Baseline" else "pld"
    assert f"{label} run 1: interrupted after" in result.err and "run the same command again" in result.err
    assert "Overall" not in result.out  # no summary of a run that did not finish
    assert len(read_answers(answers_file(out))) == base_kept
    pld = answers_file(out, "pld")
    assert (len(read_answers(pld)) if pld.exists() else None) == pld_kept
    monkeypatch.undo()
    again = cli(*args, cwd=tmp_path)  # the same command finishes the job, nothing twice
    assert again.code == 0 and "Overall" in again.out, again
    for method_name in ("baseline", "pld"):
        ids = [r["question_id"] for r in read_answers(answers_file(out, method_name))]
        assert sorted(ids) == [3, 5, 7]


def test_ctrl_c_in_an_interleaved_job_stops_at_the_next_answer(tiny_models, tmp_path, monkeypatch):
    """The default schedule: the baseline and pld take turns (q3: baseline, pld; q5: pld, baseline);
    Ctrl-C while pld answers q5 keeps q3 of both and pld's q5, and the same command finishes both."""
    out, args, result = interrupted_run(tiny_models, tmp_path, monkeypatch, "PLD", 5, schedule="interleaved")
    assert result.code == 130 and "pld run 1: interrupted after 2 of 3" in result.err, result
    assert "baseline run 1: interrupted after 1 of 3" in result.err
    assert [r["question_id"] for r in read_answers(answers_file(out))] == [3]
    assert [r["question_id"] for r in read_answers(answers_file(out, "pld"))] == [3, 5]
    monkeypatch.undo()
    again = cli(*args, cwd=tmp_path)
    assert again.code == 0 and "Overall" in again.out, again
    for name in ("baseline", "pld"):
        assert sorted(r["question_id"] for r in read_answers(answers_file(out, name))) == [3, 5, 7]


def test_ctrl_c_during_warmup_stops_before_any_answer(tiny_models, tmp_path, monkeypatch):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    ctrl_c_at(monkeypatch, "Baseline", 5)  # qa's only question is the warm-up question
    result = cli(*base_args(tiny_models["llama"], questions, out, "task=qa", "warmup=1"), cwd=tmp_path)
    assert result.code == 130 and "interrupted after 0 of 1" in result.err, result
    assert read_answers(answers_file(out)) == []


def test_second_ctrl_c_stops_at_once_with_130(tiny_models, tmp_path):
    questions = questions_with(tmp_path / "q.jsonl", ["please INTERRUPT now"])
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=qa", "method.impl=faulty_methods.CtrlCTwice")
    proc = specbench(*args, cwd=tmp_path)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)  # an exit code, not death by SIGINT (-2)
    assert "interrupted after 1 of 2" in proc.stderr and "Traceback" not in proc.stderr
    assert [r["question_id"] for r in read_answers(answers_file(out))] == [5]


class FullDisk(io.RawIOBase):
    """A file on a disk that fills up after `whole` writes: the next write puts half its bytes
    on disk, then every write fails with ENOSPC, as a real full disk does (the buffered rest
    then fails again when the file is closed)."""

    def __init__(self, path, whole):
        self.file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        self.whole = whole
        self.full = False

    def writable(self):
        return True

    def fileno(self):
        return self.file.fileno()

    def write(self, data):
        data = bytes(data)
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.whole == 0:
            self.full = True
            return self.file.write(data[: len(data) // 2])
        self.whole -= 1
        return self.file.write(data)

    def close(self):
        self.file.close()
        super().close()


def test_disk_full_mid_run_is_one_line_and_resumable(tiny_models, tmp_path, monkeypatch):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=[qa,rag,translation]")

    def full_after_one_answer(self):
        if self.path.name != "answers.jsonl":
            return self.path.open("a", encoding="utf-8")
        return io.TextIOWrapper(io.BufferedWriter(FullDisk(self.path, whole=1)), encoding="utf-8")

    monkeypatch.setattr(AnswerWriter, "_open", full_after_one_answer)
    result = cli(*args, cwd=tmp_path)
    assert_one_line_error(result, r"cannot write .*answers.jsonl \(No space left on device\); free space, then run "
                                  r"again to resume")
    path = answers_file(out)
    kept = read_answers(path)
    assert len(kept) == 1 and not path.read_bytes().endswith(b"\n")  # and a torn half of the second answer
    monkeypatch.undo()
    again = cli(*args, cwd=tmp_path)
    assert again.code == 0, again
    records = read_answers(path)
    assert sorted(r["question_id"] for r in records) == [3, 5, 7]
    assert records[0]["answer_id"] == kept[0]["answer_id"]


def test_torn_error_row_is_repaired_on_resume(tiny_models, tmp_path):
    questions = questions_with(tmp_path / "q.jsonl", ["please BOOM now"])
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=qa", "method.name=faulty",
                     "method.impl=faulty_methods.FailOnMarker", "baseline=false")
    assert cli(*args, cwd=tmp_path).code == 0
    errors = answers_file(out, "faulty").parent / "errors.jsonl"
    with errors.open("a") as fh:
        fh.write('{"question_id": 100, "category": "qa", "err')  # a kill mid-write
    result = cli(*args, cwd=tmp_path)
    assert result.code == 0, result
    rows = [json.loads(line) for line in errors.read_text().splitlines()]  # every line whole
    assert [r["question_id"] for r in rows] == [100, 100]


def test_every_question_failing_exits_non_zero_with_the_count(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=[qa,rag]", "method.name=broken",
                     "method.impl=faulty_methods.AlwaysFail")
    result = cli(*args, cwd=tmp_path)
    line = assert_one_line_error(result, r"broken run 1: all 2 questions failed \(first: question \d+: RuntimeError: "
                                         r"simulated failure of every question\)")
    assert "errors.jsonl" in line
    assert len(read_answers(answers_file(out))) == 2  # the baseline's answers stand


def test_some_failures_are_the_last_line(tiny_models, tmp_path):
    questions = questions_with(tmp_path / "q.jsonl", ["please BOOM now"])
    out = tmp_path / "results"
    args = base_args(tiny_models["llama"], questions, out, "task=qa", "method.name=faulty",
                     "method.impl=faulty_methods.FailOnMarker")
    result = cli(*args, cwd=tmp_path)
    assert result.code == 0, result
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("warning: faulty run 1: 1 of 2 questions failed (first: question 100: RuntimeError")
    assert "1 failed" in result.out  # and the summary table says so


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
