"""`report --recheck`: the float64 target judges greedy divergences on a real baseline run, and
the acceptance rate in vLLM's sense (accepted draft tokens / drafted tokens) in the tables."""

import json
import math
import shutil

import pytest
import torch

from helpers import cli, record, write_questions, write_run
from specbench.analysis import frame, report
from specbench.analysis.audit import is_bug
from specbench.analysis.recheck import recheck_device, recheck_groups
from specbench.analysis.runs import Run
from specbench.core.answers import read_answers
from specbench.core.errors import SpecbenchError
from specbench.presentation import leaderboard
from specbench.presentation.check import gate_problems

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`
TIE = 0.05  # the report's default --tie-margin


@pytest.fixture(scope="module")
def baseline_run(tiny_models, tmp_path_factory):
    """A real greedy baseline run of the tiny Llama on the two two-turn mt_bench questions, started
    in `root` with a relative question file and output folder (as users do)."""
    root = tmp_path_factory.mktemp("recheck")
    write_questions(root / "q.jsonl", per_category=1)
    done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
               "dataset.path=q.jsonl", "output_dir=results", "max_new_tokens=12", "warmup=0", "progress=false",
               "task=mt_bench", "contention_threshold=1000", cwd=root)  # other test processes may load the CPU
    assert done.code == 0, done
    return root


def strongest(rec, turn):
    """The position of `turn` where the baseline's top-2 margin is largest (far from any near-tie)."""
    margins = rec["specbench"]["stats"][turn]["top2_margin"]
    pos = max(range(len(margins)), key=margins.__getitem__)
    assert margins[pos] > TIE, margins  # else the tiny model has no clear choice to test against
    return pos


def fabricate(root, tmp_path):
    """A copy of the results with a method `fake`: on question 1 (turn 2) it leaves a token the
    baseline chose with a clear margin; on question 2 (turn 1) the baseline's record is made to
    carry a token the target did not pick, while `fake` keeps the target's."""
    shutil.copytree(root, tmp_path / "work")  # the folder the run started in: q.jsonl and results/
    results = tmp_path / "work" / "results"
    base_dir = results / "spec_bench" / "local" / "baseline" / "temp-0" / "run-1"
    fake_dir = base_dir.parents[2] / "fake" / "temp-0" / "run-1"
    fake_dir.mkdir(parents=True)
    shutil.copy(base_dir / "meta.json", fake_dir / "meta.json")
    base = read_answers(base_dir / "answers.jsonl")
    fake = json.loads(json.dumps(base))
    by_q = {r["question_id"]: r for r in base}
    fake_q = {r["question_id"]: r for r in fake}
    pos_a = strongest(by_q[1], 1)
    ids = fake_q[1]["specbench"]["output_ids"][1]
    ids[pos_a] = (ids[pos_a] + 1) % 300  # the tokenizer has ~320 ids; any other token than the baseline's
    pos_b = strongest(by_q[2], 0)
    ids = by_q[2]["specbench"]["output_ids"][0]
    ids[pos_b] = (ids[pos_b] + 1) % 300
    for folder, records in ((base_dir, base), (fake_dir, fake)):
        (folder / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return results, {1: (1, pos_a), 2: (0, pos_b)}


def fake_audit(groups):
    (group,) = groups
    return group, next(r for r in group.results if r.method == "fake").audit


def test_recheck_tells_bug_from_baseline_off(baseline_run, tmp_path):
    results, where = fabricate(baseline_run, tmp_path)
    groups = leaderboard.build(results, tmp_path / "lb", figures=False, recheck=True).groups
    group, audit = fake_audit(groups)
    found = {m["question_id"]: (m["turn"], m["position"]) for m in audit["mismatches"]}
    assert found == where
    verdicts = {m["question_id"]: m["recheck"] for m in audit["mismatches"]}
    assert verdicts == {1: "bug", 2: "baseline off"}, audit["mismatches"]
    assert not any(m["near_tie"] for m in audit["mismatches"])  # the near-tie rule alone calls both bugs
    assert [is_bug(m) for m in sorted(audit["mismatches"], key=lambda m: m["question_id"])] == [True, False]
    assert {m["recheck_device"] for m in audit["mismatches"]} == {"cpu"}  # the run decoded on the CPU
    (gate,) = gate_problems(group)
    assert "fake: 1 greedy answer(s) differ" in gate and "question 1" in gate
    md = (tmp_path / "lb" / "spec_bench-local.md").read_text(encoding="utf-8")
    assert "0/2 equal, 0 near-tie, 2 NOT near-tie; float64 recheck: 1 baseline off, 1 bug" in md
    assert "float64 recheck: bug; float64 gap" in md and "float64 recheck: baseline off; float64 gap" in md

    # The cli, from another folder (the question file is found relative to where the run started).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli("report", str(results), "--out", str(tmp_path / "lb2"), "--recheck", "--no-figures", cwd=elsewhere)
    assert done.code == 0, done
    assert "lossless audit, fake: 0/2 equal, 0 near-tie, 2 NOT near-tie; float64 recheck: 1 baseline off, 1 bug" \
        in done.out
    assert "warning" not in done.err, done.err

    # Bounded: --recheck-limit 1 rechecks one mismatch, the other says why not (one warning).
    done = cli("report", str(results), "--out", str(tmp_path / "lb3"), "--recheck-limit", "1", "--no-figures",
               cwd=elsewhere)
    assert done.code == 0, done
    assert "float64 recheck: 1 bug, 1 not rechecked" in done.out, done.out
    assert done.err.count("beyond --recheck-limit 1 (1 mismatch(es) not rechecked)") == 1, done.err


def test_recheck_without_the_question_file_says_so(baseline_run, tmp_path):
    results, _ = fabricate(baseline_run, tmp_path)
    (results.parent / "q.jsonl").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli("report", str(results), "--out", str(tmp_path / "lb"), "--recheck", "--no-figures", cwd=elsewhere)
    assert done.code == 0 and "Traceback" not in done.err, done
    warnings = [line for line in done.err.splitlines() if "float64 recheck" in line]
    assert len(warnings) == 1 and "question file q.jsonl not found" in warnings[0], done.err
    assert "float64 recheck: 2 not rechecked" in done.out
    md = (tmp_path / "lb" / "spec_bench-local.md").read_text(encoding="utf-8")
    assert "float64 recheck: not rechecked: question file q.jsonl not found" in md


def test_recheck_runs_where_the_run_decoded_when_this_machine_can(monkeypatch):
    def run(device):
        return Run("synthetic", "tiny", "baseline", 0.0, 1, [], meta={"environment": {"device": device}})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert recheck_device("auto", run("cuda:0")) == "cuda:0"
    assert recheck_device("auto", None, run("cuda")) == "cuda"
    assert recheck_device("auto", run("cuda:1")) == "cpu"  # this machine has no second GPU
    assert recheck_device("auto", run("cpu")) == "cpu"
    assert recheck_device("cpu", run("cuda:0")) == "cpu"  # asked for
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert recheck_device("auto", run("cuda:0")) == "cpu"  # a GPU run rechecked on a machine without one
    with pytest.raises(SpecbenchError, match="no CUDA device is visible; use --recheck-device cpu or auto"):
        recheck_groups([], device="cuda")
    with pytest.raises(SpecbenchError, match="unknown recheck device 'tpu'"):
        recheck_groups([], device="tpu")


def turn_stats(drafted, accepted):
    return {"drafted_tokens": drafted, "accepted_tokens": accepted}


def test_acceptance_rate_is_a_ratio_of_sums(tmp_path):
    """vLLM's draft acceptance rate over a subtask: all accepted draft tokens / all drafted ones."""
    base = [record(q, c, 10, 1.0, [1] * 9) for q, c in ((1, "qa"), (2, "qa"), (3, "rag"), (4, "rag"))]
    ours = [record(q, c, 10, 0.5, [2] * 4 + [1]) for q, c in ((1, "qa"), (2, "qa"), (3, "rag"), (4, "rag"))]
    # qa: 8/10 and 6/30 -> 14/40 = 0.35 (a mean of the two ratios would say 0.5); the second question's
    # count is split over two turns, as the engine records them per turn
    ours[0]["specbench"]["stats"] = [turn_stats(10, 8)]
    ours[1]["choices"][0].update(new_tokens=[5, 5], wall_time=[0.25, 0.25], decoding_steps=[2, 3], turns=["x", "y"])
    ours[1]["specbench"]["stats"] = [turn_stats(12, 2), turn_stats(18, 4)]
    ours[1]["specbench"]["output_ids"] = [list(range(5)), list(range(5, 10))]
    # rag: question 3 drafted nothing, question 4 has no draft counts at all: 0 / 0 -> no rate
    ours[2]["specbench"]["stats"] = [turn_stats(0, 0)]
    runs = [Run("synthetic", "tiny", "baseline", 0.0, 1, base), Run("synthetic", "tiny", "fast", 0.0, 1, ours)]
    table = frame.speedups(frame.tidy(runs))
    assert math.isclose(table.loc[("fast", "qa"), "acceptance_rate"], 14 / 40)
    assert math.isnan(table.loc[("fast", "rag"), "acceptance_rate"])
    assert math.isclose(table.loc[("fast", "overall"), "acceptance_rate"], 14 / 40)
    assert table.loc["baseline", "acceptance_rate"].isna().all()

    root = tmp_path / "answers"
    write_run(root, "baseline", base)
    write_run(root, "fast", ours)
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    headers, rows = leaderboard.main_table(group)
    col = headers.index("Acceptance Rate")
    assert headers[col - 1] == "#Mean Accepted Tokens" and headers[col + 1] == "Overall"
    assert {row[0]: row[col] for row in rows} == {"fast": "0.35", "baseline": "-"}
    md = leaderboard.render_markdown(group)
    assert "accepted draft tokens / drafted tokens" in md and "bonus token" in md and "ratio of sums" in md
    leaderboard.write_csv(group, tmp_path / "t.csv")
    head, *lines = (tmp_path / "t.csv").read_text(encoding="utf-8").splitlines()
    fast = dict(zip(head.split(","), next(line for line in lines if line.startswith("fast")).split(",")))
    assert fast["qa_acceptance_rate"] == "0.35" and fast["rag_acceptance_rate"] == "nan"
    assert "Acceptance Rate" in leaderboard.render_tex(group)
