"""The contention guard: a run measured while another process burns a CPU core is flagged in its
meta, warned about on screen and marked in the report; the arithmetic of the guard on known
counters; the threshold is checked like every other setting."""

import json
import subprocess
import sys
import time

import pytest
import torch

from helpers import assert_one_line_error, cli, write_questions
from specbench.run.monitor import CLK_TCK, ContentionGuard, Sample, margin, other_cores

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`


def run_args(model, questions, out, *extra):
    return ["run", "model=local", f"model.path={model}", "dataset=spec_bench", f"dataset.path={questions}",
            f"output_dir={out}", "max_new_tokens=16", "warmup=0", "progress=false", "task=[qa,rag]", "threads=1",
            *extra]


def metas(out):
    return {p.parts[-4]: json.loads(p.read_text()) for p in out.rglob("run-1/meta.json")}


def test_a_run_beside_a_cpu_burner_is_flagged_and_marked(tiny_models, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=2)
    out = tmp_path / "results"
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # past its start-up: burning
        done = cli(*run_args(tiny_models["llama"], questions, out, "method=pld"), cwd=tmp_path)
    finally:
        burner.kill()
        burner.wait()
    assert done.code == 0, done
    found = metas(out)
    assert set(found) == {"baseline", "pld"}
    for method, meta in found.items():
        contention = meta["contention"]
        print(method, json.dumps({k: contention[k] for k in ("before", "during", "busy_other_cores")}))
        assert contention["flagged"] and contention["threshold"] == 0.5, contention
        # the burner alone is about one core: what other processes used is at least most of it
        assert contention["busy_other_cores"] >= 0.6 and contention["during"]["seconds"] > 0
        # the probe before the timed run: at least 0.5 s in a session, then the time since the last run
        assert contention["before"]["seconds"] >= (0.5 if method == "baseline" else 0.1)
    warnings = [line for line in done.err.splitlines() if line.startswith("warning:") and "contention" in line]
    assert len(warnings) == 2 and "baseline run 1" in warnings[0] and "pld run 1" in warnings[1], done.err

    report = cli("report", str(out), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert report.code == 0, report
    md = (tmp_path / "lb" / "spec_bench-local.md").read_text()
    main = md.split("## Details")[0]
    rows = {line.split("|")[1].strip(): line for line in main.splitlines() if line.startswith("| ")}
    assert rows["pld"].rstrip(" |").endswith("†") and rows["baseline"].rstrip(" |").endswith("†"), md
    footnote = next(line for line in md.splitlines() if line.startswith("† "))
    assert "other processes used up to" in footnote and "baseline run 1" in footnote and "pld run 1" in footnote
    assert "skews every speedup" in footnote
    assert "† Measured under contention" in report.out  # on screen too
    assert r"$^\dagger$" in (tmp_path / "lb" / "spec_bench-local.tex").read_text()


def test_a_generous_threshold_flags_nothing_and_report_marks_nothing(tiny_models, tmp_path):
    """Whatever else this machine runs, other processes cannot use more cores than it has: with
    that as the threshold the run is not flagged, and the report marks no row."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    generous = f"contention_threshold={64 * 1024}"
    done = cli(*run_args(tiny_models["llama"], questions, out, "method=pld", generous), cwd=tmp_path)
    assert done.code == 0, done
    for meta in metas(out).values():
        assert meta["contention"]["flagged"] is False and meta["contention"]["reasons"] == []
        assert meta["contention"]["during"]["seconds"] > 0  # the guard measured during the run: not skipped
    assert "contention" not in done.err
    report = cli("report", str(out), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert report.code == 0 and "†" not in report.out
    assert "†" not in (tmp_path / "lb" / "spec_bench-local.md").read_text()


def test_guard_arithmetic_on_known_counters():
    # 2 s: the CPUs were busy 3.0 s, 1.0 s of it ours -> others used 1 core; 0.2 s stolen
    a, b = Sample(10.0, 100.0, 5.0, 1.0), Sample(12.0, 103.0, 5.2, 2.0)
    other, steal, ours = other_cores(a, b)
    assert (round(other, 6), round(steal, 6), round(ours, 6)) == (1.0, 0.1, 0.5)
    assert other_cores(a, Sample(12.0, 100.5, 5.0, 2.0))[0] == 0.0  # counter granularity: never negative
    guard = ContentionGuard(0.5, torch.device("cpu"))
    quiet, loaded = {"other_cores": 0.1, "seconds": 1}, {"other_cores": 0.8, "other_cores_max": 1.5, "seconds": 3}
    assert guard.summary(quiet, quiet)["flagged"] is False
    flagged = guard.summary(quiet, loaded)
    assert flagged["flagged"] and flagged["busy_other_cores"] == 0.8 and flagged["busy_other_cores_max"] == 1.5
    assert "0.80 CPU cores on average during" in flagged["reasons"][0]
    assert guard.summary(loaded | {"other_cores": 0.9}, quiet)["reasons"][0].endswith("before the timed run")
    # a short interval reads the counters coarsely: only use beyond their granularity flags
    assert margin(4, 0.5) == pytest.approx(2 / CLK_TCK / 0.5)
    assert guard.summary(quiet, {"other_cores": 0.7, "margin_cores": 0.3})["flagged"] is False
    assert guard.summary(quiet, {"other_cores": 0.9, "margin_cores": 0.3})["flagged"] is True
    gpu = guard.summary(quiet | {"gpu": {"others": 2}}, quiet)
    assert gpu["flagged"] and "2 other process(es) held the GPU" in gpu["reasons"]


def test_counters_are_cheap_and_live():
    """Sampling reads counters only (no waiting); our own busy loop shows as ours, whatever else runs:
    the loop spins until this process has used 0.3 s of CPU (on a busy machine that takes longer), so
    the guard must report that much of our use over the interval it measured."""
    guard = ContentionGuard(0.5, torch.device("cpu"))
    guard.start()
    used = time.process_time()
    while time.process_time() - used < 0.3:
        pass
    start = time.perf_counter()
    for _ in range(100):
        guard.tick()
    per_tick = (time.perf_counter() - start) / 100
    during = guard.stop()
    spent = time.process_time() - used
    print(f"tick: {per_tick * 1e6:.0f} us; during: {during}; our CPU seconds: {spent:.3f}")
    ours = during["our_cores"] * during["seconds"]  # CPU seconds the guard saw us use
    slack = 0.0005 * during["seconds"] + 0.005  # our_cores is rounded to 0.001 core
    assert 0.3 - slack <= ours <= spent + slack, (ours, spent)


@pytest.mark.parametrize("value", ["-1", "lots", "true"])
def test_threshold_is_checked(tiny_models, tmp_path, value):
    out = tmp_path / "results"
    done = cli(*run_args(tiny_models["llama"], tmp_path / "q.jsonl", out, f"contention_threshold={value}"),
               cwd=tmp_path)
    assert_one_line_error(done, r"contention_threshold must be a number of CPU cores >= 0")
