"""Paired speeds: the default schedule (baseline and methods in turn, recorded in meta.json and said
under the table), the paired regression gate's test and verdicts, and memory per method run."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from omegaconf import OmegaConf

from helpers import cli, write_questions
from specbench.analysis import paired
from specbench.analysis.runs import Run
from specbench.core.errors import SpecbenchError
from specbench.presentation import check
from specbench.run.runner import turn_orders

pytestmark = pytest.mark.usefixtures("one_thread")
GATE = OmegaConf.create({"alpha": 0.05, "min_slowdown": 0.05})


def fake_run(method: str, seconds: dict[int, float], tokens: int = 20, accept: int = 1) -> Run:
    """A run whose question q took seconds[q] for `tokens` tokens in one turn."""
    records = [{"question_id": q, "category": "qa", "choices": [{
        "index": 0, "turns": ["x"], "decoding_steps": [tokens // accept], "new_tokens": [tokens],
        "wall_time": [s], "accept_lengths": [accept] * (tokens // accept)}]} for q, s in seconds.items()]
    return Run("synthetic", "tiny", method, 0.0, 1, records, {"target_weights": "w"})


def job(rng: np.random.Generator, slowdown: float, n: int = 24, noise: float = 0.06) -> dict[str, Run]:
    """One simulated job: per question a base time (questions differ 3x), a drift factor shared by
    the baseline and the method (paired), and each lane's own noise."""
    base_times = rng.uniform(1.0, 3.0, n)
    drift = rng.uniform(0.7, 1.3, n)  # the machine's speed at that question: cancels in the ratio
    own = lambda: np.exp(rng.normal(0, noise, n))  # noqa: E731
    baseline = base_times * drift * own()
    method = 0.6 * base_times * drift * own() * (1 + slowdown)
    return {"baseline": fake_run("baseline", dict(enumerate(baseline))),
            "sps": fake_run("sps", dict(enumerate(method)), accept=2)}


def test_paired_shift_sees_a_slowdown_and_not_the_drift():
    rng = np.random.default_rng(1)
    base, same, slower = job(rng, 0.0), job(rng, 0.0), job(rng, 0.15)
    ratios = {name: paired.log_ratios(j["sps"], j["baseline"]) for name, j in
              (("base", base), ("same", same), ("slower", slower))}
    unchanged = paired.paired_shift(ratios["base"], ratios["same"])
    shifted = paired.paired_shift(ratios["base"], ratios["slower"])
    assert unchanged.units == shifted.units == 24
    assert abs(unchanged.slowdown) < 0.06 and unchanged.p_value > 0.01, unchanged
    assert 0.08 < shifted.slowdown < 0.22 and shifted.p_value < 0.001, shifted
    assert shifted.low < shifted.slowdown < shifted.high
    assert paired.paired_shift({(1, 0): 0.1}, {(1, 0): 0.2}) is None  # too few units to test


def test_paired_verdicts_fail_a_slowdown_and_an_acceptance_drop():
    rng = np.random.default_rng(2)
    base = job(rng, 0.0)
    rows, regressed = check.paired_verdicts(base, job(rng, 0.0), GATE)
    assert not regressed and rows[0][-1] == "ok", rows
    rows, regressed = check.paired_verdicts(base, job(rng, 0.25), GATE)
    assert regressed and rows[0][0] == "sps" and rows[0][-1] == "REGRESSED", rows
    worse = job(rng, 0.0)
    worse["sps"] = fake_run("sps", {q: 1.0 for q in range(24)}, accept=1)  # same speed here, fewer accepted
    worse["baseline"] = fake_run("baseline", {q: 1.0 / 0.6 for q in range(24)})
    rows, regressed = check.paired_verdicts(base, worse, GATE)
    assert regressed and rows[0][-1].endswith("(acceptance)") and "2.000 -> 1.000" in rows[0][6], rows
    worse["sps"].meta = {"target_weights": "other"}  # other weights: acceptance is not comparable
    rows, regressed = check.paired_verdicts(base, worse, GATE)
    assert not regressed and "(other weights)" in rows[0][6], rows


def test_a_faster_baseline_fails_the_gate_and_the_own_column_says_why():
    """A speedup that falls because the baseline got faster is a regression of the speedup (what the gate
    guards); the method's own time per token, change over base, tells it from a method that got slower."""
    times = {q: 1.0 + q / 10 for q in range(24)}
    base = {"baseline": fake_run("baseline", times), "sps": fake_run("sps", {q: 0.6 * t for q, t in times.items()})}
    faster = {"baseline": fake_run("baseline", {q: 0.75 * t for q, t in times.items()}),
              "sps": fake_run("sps", {q: 0.6 * t for q, t in times.items()})}
    rows, regressed = check.paired_verdicts(base, faster, GATE)
    assert regressed and rows[0][-1] == "REGRESSED" and rows[0][2] == "+33.3%", rows
    assert rows[0][check.PAIRED_HEADER.index("Own time/token")] == "+0.0%", rows
    assert check.own_change(base["baseline"], faster["baseline"]) == "-25.0%"
    slower = {"baseline": fake_run("baseline", times), "sps": fake_run("sps", {q: 0.8 * t for q, t in times.items()})}
    rows, _ = check.paired_verdicts(base, slower, GATE)
    assert rows[0][check.PAIRED_HEADER.index("Own time/token")] == "+33.3%", rows
    assert all(len(row) == len(check.PAIRED_HEADER) for row in rows)


def test_the_gate_divides_its_false_alarm_rate_among_the_methods():
    rng = np.random.default_rng(3)
    base, change = job(rng, 0.0), job(rng, 0.07, noise=0.04)
    alone, _ = check.paired_verdicts(base, change, GATE)
    many, _ = check.paired_verdicts(base, change, GATE, methods_gated=10_000)
    assert alone[0][-1] == "REGRESSED" and many[0][-1] == "ok", (alone, many)
    small, _ = check.paired_verdicts(base, change, OmegaConf.create({"alpha": 0.05, "min_slowdown": 0.2}))
    assert small[0][-1] == "ok"  # significant but under the smallest slowdown that counts


def test_quick_suite_runs_as_one_interleaved_job(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(check, "run_job", lambda command, cwd, what: ran.append(command) or 0.0)
    check.run_quick(check.load_check_config(), tmp_path)
    (command,) = ran
    assert command[3:5] == ["run", "method=baseline"] and command[5].startswith("interleave=[") and "sps" in command[5]
    assert "baseline" not in command[5] and "budget=fixed" in command


def test_base_commit_errors_name_the_fix(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    cfg = check.load_check_config([f"quick.base_file={tmp_path / 'base.json'}"])
    with pytest.raises(SpecbenchError, match="no base commit recorded .*check --quick --update"):
        check.base_commit(cfg, tmp_path, None)
    (tmp_path / "base.json").write_text(json.dumps({"commit": "0" * 40}))
    with pytest.raises(SpecbenchError, match="base commit in its history"):
        check.base_commit(cfg, tmp_path, None)
    with pytest.raises(SpecbenchError, match="must be a number"):
        check.load_check_config(["quick.gate.alpha=-1"])


def test_a_moved_base_keeps_its_reason(tmp_path):
    """`check --quick --update --why TEXT` records HEAD with the reason; the gate's header prints both."""
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "f").write_text("x")
    git("add", "f")
    git("commit", "-qm", "one")
    cfg = check.load_check_config([f"quick.base_file={tmp_path / 'base.json'}"])
    assert check.record_base(cfg, tmp_path, "the baseline got faster") == 0
    recorded = json.loads((tmp_path / "base.json").read_text())
    assert recorded["why"] == "the baseline got faster" and len(recorded["commit"]) == 40
    commit, note = check.base_commit(cfg, tmp_path, None)
    assert commit == recorded["commit"] and note == f"; recorded {recorded['recorded']}: the baseline got faster"
    refused = cli("check", "--why", "x", cwd=tmp_path)
    assert refused.code != 0 and "--why goes with --quick --update" in refused.err


@pytest.fixture(scope="module")
def schedules(tiny_models, tmp_path_factory):
    """The baseline and sps on three questions: the default schedule and schedule=sequential."""
    root = tmp_path_factory.mktemp("schedules")
    questions = write_questions(root / "q.jsonl", per_category=1)
    outs = {}
    for schedule in ("interleaved", "sequential"):
        outs[schedule] = root / schedule
        done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "method=sps",
                   f"method.draft={tiny_models['qwen2']}", "dataset=spec_bench", f"dataset.path={questions}",
                   f"output_dir={outs[schedule]}", f"schedule={schedule}", "max_new_tokens=8", "warmup=0",
                   "progress=false", "task=[qa,rag,translation]", "contention_threshold=1000", cwd=root)
        assert done.code == 0, done
    return outs


def lane(out, method):
    (folder,) = out.rglob(f"{method}/temp-0/run-1")
    answers = [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]
    return answers, json.loads((folder / "meta.json").read_text())


def test_the_default_schedule_pairs_every_method_with_the_baseline(schedules, tmp_path):
    base, base_meta = lane(schedules["interleaved"], "baseline")
    sps, sps_meta = lane(schedules["interleaved"], "sps")
    orders = turn_orders(2, 3, "shuffled", 0, 1)  # question by question, a drawn order then its reverse
    for i in range(3):
        first = "baseline" if base[i]["tstamp"] < sps[i]["tstamp"] else "sps"
        assert first == ["baseline", "sps"][orders[i][0]], i
    assert sps_meta["phase"] == base_meta["phase"] and sps_meta["phase"]["lanes"] == ["baseline", "sps"]
    assert sps_meta["phase"]["schedule"] == "interleaved" and sps_meta["phase"]["lane_order"] == "shuffled"
    done = cli("report", str(schedules["interleaved"]), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert done.code == 0 and "Speedups are paired" in done.out, done.out


def test_sequential_schedule_is_said_to_be_unpaired(schedules, tmp_path):
    base, _ = lane(schedules["sequential"], "baseline")
    sps, sps_meta = lane(schedules["sequential"], "sps")
    assert max(r["tstamp"] for r in base) < min(r["tstamp"] for r in sps)
    assert sps_meta["phase"]["lanes"] == ["sps"] and sps_meta["phase"]["schedule"] == "sequential"
    done = cli("report", str(schedules["sequential"]), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert done.code == 0 and "Not paired: sps timed apart from the baseline" in done.out, done.out


def test_memory_is_measured_per_method_run_in_one_job(schedules):
    """In one interleaved job, the method with a draft model holds more than the baseline."""
    _, base_meta = lane(schedules["interleaved"], "baseline")
    _, sps_meta = lane(schedules["interleaved"], "sps")
    base, sps = base_meta["memory"], sps_meta["memory"]
    assert base["phase_peak_bytes"] == sps["phase_peak_bytes"]  # one phase
    assert sps["resident_bytes"] >= sps["drafter"]["weights_bytes"] > 0 == base["drafter"]["weights_bytes"]
    # the baseline holds no weights of its own; what building it added to the resident set is a few
    # pages of Python objects at most (measured by RSS, so not exactly 0: CI once saw 12 KiB)
    assert base["resident_bytes"] < min(sps["drafter"]["weights_bytes"], 1 << 20), (base, sps)
    assert sps["peak_bytes"] > base["peak_bytes"], (sps, base)
    assert "per method run" in sps["measured_by"]
    assert not math.isnan(sps["working_bytes"])


def test_the_order_of_an_interleaved_job_changes_no_tokens(tiny_models, tmp_path):
    """The same methods in two orders: every method's tokens and accepted lengths are the same (each
    holds its own drafter state; budget=fixed, whose choices do not follow measured timings)."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    found = {}
    for order in ("pld,sps,samd", "samd,sps,pld"):
        out = tmp_path / order.replace(",", "-")
        done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "method=baseline",
                   f"interleave=[{order}]", "budget=fixed",
                   "dataset=spec_bench", f"dataset.path={questions}", f"output_dir={out}", "max_new_tokens=12",
                   "warmup=1", "progress=false", "task=[qa,rag,summarization]", "contention_threshold=1000",
                   f"model.draft={tiny_models['qwen2']}", cwd=tmp_path)
        assert done.code == 0, done
        found[order] = {m: [(r["question_id"], r["specbench"]["output_ids"], r["choices"][0]["accept_lengths"])
                            for r in sorted(lane(out, m)[0], key=lambda r: r["question_id"])]
                        for m in ("baseline", "pld-fixed", "sps-fixed", "samd-fixed")}
    first, second = found.values()
    assert first == second


def test_meta_records_what_the_budget_chose(schedules):
    _, sps = lane(schedules["interleaved"], "sps")
    _, base = lane(schedules["interleaved"], "baseline")
    budget = sps["budget"]
    assert budget["mode"] == "auto" and budget["steps"] > 0 and budget["mean_verified_nodes"] > 0, budget
    assert budget["mean_proposed_nodes"] >= budget["mean_verified_nodes"]
    assert "kept across questions" in budget["learned"]
    assert base["budget"]["mode"] is None and base["budget"]["steps"] == 0
