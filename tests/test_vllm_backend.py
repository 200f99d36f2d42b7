"""backend=vllm without vLLM: the counters' parsing and arithmetic, and whole runs against a stand-in
server (tests/fake_vllm: vLLM's command line, endpoints and Prometheus counters) started by specbench
as it starts vLLM: answer files the report reads, acceptance from the counters, paired order, and
the faults (a server that does not start, dies mid-run, refuses a question, stays silent)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from helpers import answers_file, assert_one_line_error, cli, write_questions
from specbench.core.answers import EXTRA_KEY
from specbench.core.record import TurnStats
from specbench.serving.metrics import Counters, parse, step_lengths

pytestmark = pytest.mark.fast

FAKE = Path(__file__).parent / "fake_vllm"

VLLM_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 123.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 489.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 45.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 27.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 192.0
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="m"} 0.0
"""


def test_counters_are_read_from_vllm_prometheus_text():
    c = parse(VLLM_TEXT)
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_pos, c.generated) == (123, 489, 45, (27, 18, 0), 192)
    assert parse("") == Counters()  # a server without speculation: no spec-decode counters
    delta = parse(VLLM_TEXT).minus(Counters(100, 400, 40, (25, 15), 150))
    assert (delta.drafts, delta.draft_tokens, delta.accepted, delta.per_pos, delta.generated) == (23, 89, 5, (2, 3, 0),
                                                                                                 42)


def test_steps_are_the_streamed_chunks_and_merged_chunks_are_told():
    counters = Counters(drafts=3, draft_tokens=30, accepted=16)  # the last step accepted 6 more than max_tokens kept
    assert step_lengths([1, 1, 11, 1, 4], counters) == ([1, 11, 1, 4], True)
    assert step_lengths([1, 1, 1], Counters()) == ([1, 1], True)  # the baseline: one token per step
    assert step_lengths([1, 12, 5], counters)[1] is False  # fewer steps than drafts: the server merged steps
    assert step_lengths([2, 11], Counters())[1] is False  # the prefill's chunk holds a step's tokens too
    assert step_lengths([1, 1, 2, 1], Counters())[1] is False  # two tokens in a step that accepted none
    assert step_lengths([], Counters()) == ([], True)


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    return tiny_models["llama"], write_questions(root / "questions.jsonl", per_category=1)


def vllm_args(model_dir, questions, out, *extra, mode=""):
    return ["run", "model=local", f"model.path={model_dir}", "dataset=spec_bench", f"dataset.path={questions}",
            f"output_dir={out}", "max_new_tokens=12", "warmup=1", "progress=false", "backend=vllm",
            f"backend.python={sys.executable}", f"+backend.env.PYTHONPATH={FAKE}",
            f"+backend.env.FAKE_VLLM_MODE='{mode}'", "backend.env.LD_PRELOAD=''", "backend.start_timeout=60",
            *extra]


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_vllm_run_files_answers_that_report_reads(setup, tmp_path):
    model_dir, questions = setup
    out = tmp_path / "answers"
    done = cli(*vllm_args(model_dir, questions, out, "interleave=[ngram]"), cwd=tmp_path)
    assert done.code == 0, done.err
    base = read(answers_file(out, "baseline", model="local-vllm"))
    ngram = read(answers_file(out, "ngram", model="local-vllm"))
    assert len(base) == len(ngram) == 7 and [r["question_id"] for r in base] == [r["question_id"] for r in ngram]
    for b, n in zip(base, ngram, strict=True):
        assert b[EXTRA_KEY]["output_ids"] == n[EXTRA_KEY]["output_ids"]  # the stand-in's rule, with or without drafts
        for record in (b, n):
            choice = record["choices"][0]
            assert 1 * len(choice["new_tokens"]) + sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
            assert choice["new_tokens"] == [len(ids) for ids in record[EXTRA_KEY]["output_ids"]]
        stats = n[EXTRA_KEY]["stats"][0]
        assert stats["drafts"] > 0 and stats["drafted_tokens"] == 10 * stats["drafts"]  # the preset's 10 tokens
        assert set(stats) <= {f.name for f in dataclasses.fields(TurnStats)}  # the one statistics type, ours too
        assert b[EXTRA_KEY]["stats"][0]["drafts"] == 0
    assert max(a for r in ngram for a in r["choices"][0]["accept_lengths"]) == 2
    meta = json.loads((answers_file(out, "ngram", model="local-vllm").parent / "meta.json").read_text())
    assert meta["identity"]["preset"]["speculative_config"]["method"] == "ngram"
    assert meta["memory"]["peak_bytes"] > 1 << 20  # the stand-in's process, measured
    assert meta["environment"]["vllm"] == "0.0-fake" and "--speculative-config" in meta["environment"]["server_command"]
    assert "ngram" in done.out and "baseline" in done.out  # the run's summary table
    ours = cli("run", "model=local", f"model.path={model_dir}", "dataset=spec_bench", f"dataset.path={questions}",
               f"output_dir={out}", "max_new_tokens=12", "warmup=0", "progress=false", "interleave=[pld]",
               cwd=tmp_path)
    assert ours.code == 0, ours.err
    local = read(answers_file(out, "pld", model="local"))[0]  # one runner, one record: the same keys both ways
    assert set(local) == set(ngram[0]) and set(local[EXTRA_KEY]) == set(ngram[0][EXTRA_KEY]) - {"finish_reason"}
    report = cli("report", str(out), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.code == 0, report.err
    engines = (tmp_path / "report" / "engines.md").read_text()
    assert "Engines: local-vllm beside" in engines and engines in report.out + "\n"
    row = next(line for line in engines.splitlines() if line.startswith("| vllm") and "| ngram" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[7] == "pld" and cells[2].endswith("]") and cells[8].endswith("]")  # both engines' speedups
    assert float(cells[3]) > 1.0  # the stand-in accepts one drafted token per step: its stream says so
    assert 1.0 < float(cells[4]) <= 2.0  # and its counters (1 + accepted / drafts)
    assert re.match(r"0/7 equal", cells[12])  # the stand-in's rule is not our tiny model's
    again = cli(*vllm_args(model_dir, questions, out, "interleave=[ngram]"), cwd=tmp_path)
    assert again.code == 0 and "all 7 answers already in" in again.err  # resumable: nothing redone


def test_an_unknown_preset_is_a_one_line_error(setup, tmp_path):
    model_dir, questions = setup
    done = cli(*vllm_args(model_dir, questions, tmp_path / "a", "interleave=[pld]"), cwd=tmp_path)
    assert_one_line_error(done, r"the backend has no preset 'pld' \(its presets: baseline, ngram, .*\)")


def test_a_server_that_does_not_start_is_a_one_line_error(setup, tmp_path):
    model_dir, questions = setup
    done = cli(*vllm_args(model_dir, questions, tmp_path / "a", mode="exit-at-start"), cwd=tmp_path)
    assert_one_line_error(done, r"vllm baseline: the server exited with code 3 while starting: RuntimeError: the "
                                r"fake engine refuses to start \(log: .*baseline.log\)")
    missing = cli(*vllm_args(model_dir, questions, tmp_path / "b", "backend.python=/nonexistent/python"),
                        cwd=tmp_path)
    assert_one_line_error(missing, r"the server command could not start .*; install vLLM with `make vllm`")


def test_a_server_that_dies_mid_run_keeps_the_answers_and_the_run_resumes(setup, tmp_path):
    model_dir, questions = setup
    out = tmp_path / "answers"
    died = cli(*vllm_args(model_dir, questions, out, "warmup=0", mode="die-after=5"), cwd=tmp_path)
    assert_one_line_error(died, r"vllm baseline: the server (died|at http://\S+ is gone).*run the same command "
                                r"again to resume")
    kept = read(answers_file(out, "baseline", model="local-vllm"))
    # five completions (two questions of two turns, one of one), then it died: the third question's counters
    # could not be read after its answer, so it is not filed
    assert len(kept) == 2
    resumed = cli(*vllm_args(model_dir, questions, out, "warmup=0"), cwd=tmp_path)
    assert resumed.code == 0, resumed.err
    final = read(answers_file(out, "baseline", model="local-vllm"))
    assert len(final) == 7 and final[:2] == kept


def test_a_refused_question_is_recorded_and_the_run_goes_on(setup, tmp_path):
    model_dir, questions = setup
    out = tmp_path / "answers"
    done = cli(*vllm_args(model_dir, questions, out, "warmup=0", mode="refuse-long=60"), cwd=tmp_path)
    errors = read(answers_file(out, "baseline", model="local-vllm").parent / "errors.jsonl")
    answered = read(answers_file(out, "baseline", model="local-vllm"))
    assert len(errors) == 2 and len(answered) == 5  # the two questions whose second turn's prompt is long
    assert "HTTP 400" in errors[0]["error"] and "too long" in errors[0]["error"]
    assert done.code == 0 and "failed" in done.err


def test_a_silent_server_times_out_with_a_one_line_error(setup, tmp_path):
    model_dir, questions = setup
    done = cli(*vllm_args(model_dir, questions, tmp_path / "a", "warmup=0", "backend.request_timeout=1",
                                mode="slow=5"), cwd=tmp_path)
    assert_one_line_error(done, r"the server at http://\S+ sent nothing for 1 s; raise backend.request_timeout")


def test_merged_chunks_leave_the_turns_out_of_mean_accepted_tokens(setup, tmp_path):
    model_dir, questions = setup
    out = tmp_path / "answers"
    done = cli(*vllm_args(model_dir, questions, out, "warmup=0", "interleave=[ngram]", mode="merge-chunks"),
               cwd=tmp_path)
    assert done.code == 0, done.err
    assert "merged engine steps into one streamed chunk" in done.err
    records = read(answers_file(out, "ngram", model="local-vllm"))
    assert all(not s["steps_exact"] for r in records for s in r[EXTRA_KEY]["stats"])
    assert all(r["choices"][0]["accept_lengths"] == [] for r in records)


def test_ctrl_c_stops_the_servers_and_keeps_the_answers(setup, tmp_path):
    import os
    import signal
    import subprocess
    import time

    from helpers import REPO

    model_dir, questions = setup
    out = tmp_path / "answers"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "HF_HUB_OFFLINE": "1"}
    # each completion waits 2 s: after the first answer, six more questions leave a window of over 10 s to
    # interrupt in, however busy the machine is
    run = subprocess.Popen([sys.executable, "-m", "specbench", *vllm_args(model_dir, questions, out, "warmup=0",
                                                                          mode="slow=2")],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           # a pytest-xdist worker ignores SIGINT and a child inherits that (Python then keeps
                           # it ignored): give the run the default disposition a terminal's command has
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    answers = answers_file(out, "baseline", model="local-vllm")
    deadline = time.time() + 180
    while time.time() < deadline and run.poll() is None and not (
            answers.is_file() and answers.read_text().count("\n") >= 1):
        time.sleep(0.05)
    assert run.poll() is None, (f"the run ended (exit {run.returncode}) before it could be interrupted; answer files "
                                f"under {out}: {sorted(str(p.relative_to(out)) for p in out.rglob('*.jsonl'))}; "
                                f"expected {answers.relative_to(out)}; stderr: {run.communicate()[1][-2000:]}")
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "interrupted after" in err and "run the same command again to resume" in err
    kept = read(answers)
    assert 1 <= len(kept) < 7
    assert "specbench starts" in (out / "logs" / "local-vllm" / "baseline.log").read_text()  # the run started it
    assert not subprocess.run(["pgrep", "-f", str(model_dir)], capture_output=True).stdout.strip()  # and stopped it
