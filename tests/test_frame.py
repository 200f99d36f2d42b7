"""The tidy frame and its group-bys against the upstream definitions, computed here from the records."""

import math
import random
import statistics

import numpy as np
import pytest
from omegaconf import OmegaConf

from helpers import record, write_run
from specbench.analysis import frame, report
from specbench.analysis.audit import time_split
from specbench.analysis.runs import Run
from specbench.analysis.summary import run_summary
from specbench.run.runner import RunResult

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

SUBTASK = {"writing": "mt_bench", "roleplay": "mt_bench", "qa": "qa", "rag": "rag"}
QUESTIONS = [(1, "writing", 2), (2, "qa", 1), (3, "qa", 1), (4, "rag", 1), (5, "rag", 1), (6, "roleplay", 2)]


def answer(rng, qid, category, turns, speed, accept_mean):
    """A record with `turns` turns; accept_lengths cut into turns by decoding_steps."""
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [], "accept_lengths": []}
    extra = {"prefill_time": [], "sections": []}
    for t in range(turns):
        accepts = [rng.randint(1, 2 * accept_mean) for _ in range(rng.randint(3, 9))]
        seconds = sum(accepts) / speed * rng.uniform(0.5, 1.5)
        choice["turns"].append(f"turn {t}")
        choice["decoding_steps"].append(len(accepts))
        choice["new_tokens"].append(1 + sum(accepts))
        choice["wall_time"].append(seconds)
        choice["accept_lengths"] += accepts
        extra["prefill_time"].append(seconds / 8)
        extra["sections"].append({"draft": seconds / 4, "verify": seconds / 2})
    return {"question_id": qid, "category": category, "choices": [choice], "specbench": extra}


@pytest.fixture
def runs():
    """baseline runs 1-2 (run 2 lacks question 5); fast runs 1-3 (run 2 lacks question 3, run 3
    has no baseline partner and so pairs with baseline run 1)."""
    rng = random.Random(7)
    out = []
    for method, run, speed, skip in (("baseline", 1, 50, None), ("baseline", 2, 50, 5), ("fast", 1, 90, None),
                                     ("fast", 2, 110, 3), ("fast", 3, 100, None)):
        records = [answer(rng, q, c, t, speed, 1 if method == "baseline" else 3) for q, c, t in QUESTIONS if q != skip]
        out.append(Run("synthetic", "tiny", method, 0.0, run, records))
    return out


def tps(r):
    return sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"])


def expected_rows(runs, method):
    """The upstream definitions, spelled out over the records."""
    base = {r.run: {x["question_id"]: x for x in r.records} for r in runs if r.method == "baseline"}
    mine = [r for r in runs if r.method == method]
    per_run, ours_q, base_q = [], {}, {}
    for run in mine:
        partner = base.get(run.run, base[1])
        shared = [x for x in run.records if x["question_id"] in partner]
        ratios = {}
        for sub in [*{SUBTASK[x["category"]] for x in shared}, "overall"]:
            ids = [x for x in shared if sub in ("overall", SUBTASK[x["category"]])]
            ratios[sub] = statistics.mean(map(tps, ids)) / statistics.mean(tps(partner[x["question_id"]]) for x in ids)
            for x in ids:
                ours_q.setdefault((sub, x["question_id"]), []).append(tps(x))
                base_q.setdefault((sub, x["question_id"]), []).append(tps(partner[x["question_id"]]))
        per_run.append(ratios)
    rows = {}
    for sub in ("mt_bench", "qa", "rag", "overall"):
        speedups = [r[sub] for r in per_run if sub in r]
        ids = sorted(q for s, q in ours_q if s == sub)
        answered = [[x for x in run.records if x["question_id"] in ids] for run in mine]
        steps = [a for records in answered for x in records for a in x["choices"][0]["accept_lengths"]]
        run_tps = [statistics.mean(map(tps, records)) for records in answered if records]
        ours = np.array([statistics.mean(ours_q[sub, q]) for q in ids])
        ref = np.array([statistics.mean(base_q[sub, q]) for q in ids])
        draws = np.random.default_rng(0).integers(0, len(ids), size=(frame.BOOTSTRAP_SAMPLES, len(ids)))
        low, high = np.percentile(ours[draws].mean(axis=1) / ref[draws].mean(axis=1), [2.5, 97.5])
        rows[sub] = {"speedup": statistics.mean(speedups), "speedup_std": statistics.stdev(speedups),
                     "questions": len(ids), "mean_accepted": statistics.mean(steps), "runs": len(speedups),
                     "tokens_per_s": statistics.mean(run_tps), "tokens_per_s_std": statistics.stdev(run_tps),
                     "ci_low": low, "ci_high": high}
    return rows


def test_tidy_has_a_row_per_turn_with_the_turns_steps(runs):
    table = frame.tidy(runs)
    assert len(table) == sum(len(r["choices"][0]["new_tokens"]) for run in runs for r in run.records)
    first = runs[0].records[0]["choices"][0]
    turns = table[(table["method"] == "baseline") & (table["run"] == 1) & (table["question_id"] == 1)]
    assert turns["steps"].tolist() == first["decoding_steps"]
    assert turns["accepted"].sum() == sum(first["accept_lengths"])
    assert turns["accepted"].iloc[0] == sum(first["accept_lengths"][: first["decoding_steps"][0]])
    assert turns["wall_time"].tolist() == first["wall_time"] and set(turns["subtask"]) == {"mt_bench"}
    assert {"section_draft", "section_verify"} <= set(table.columns)


def test_per_question_tokens_per_second_sums_turns(runs):
    table = frame.per_question(frame.tidy(runs)).set_index(["method", "run", "question_id"])
    for run in runs:
        for r in run.records:
            assert math.isclose(table.loc[(run.method, run.run, r["question_id"]), "tokens_per_s"], tps(r))


@pytest.mark.parametrize("method", ["fast", "baseline"])
def test_speedups_per_subtask_match_the_definitions(runs, method):
    table = frame.speedups(frame.tidy(runs))
    assert list(table.loc[method].index) == ["mt_bench", "qa", "rag", "overall"]
    for sub, want in expected_rows(runs, method).items():
        got = table.loc[(method, sub)]
        for key, value in want.items():
            assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), (sub, key, got[key], value)


def test_time_split_shares_the_method_wall_time(runs):
    table = frame.tidy(runs)
    split = time_split(table[table["method"] == "fast"])
    extras = [(r["specbench"], r["choices"][0]) for run in runs if run.method == "fast" for r in run.records]
    total = sum(sum(c["wall_time"]) for _, c in extras)
    assert math.isclose(split["prefill"], sum(sum(e["prefill_time"]) for e, _ in extras) / total)
    assert math.isclose(split["draft"], sum(s["draft"] for e, _ in extras for s in e["sections"]) / total)
    assert math.isclose(sum(split.values()), 1.0)


def test_run_summary_prints_the_reports_numbers(tmp_path):
    root = tmp_path / "answers"
    cats = ["writing", "translation", "qa", "rag"]
    for run, slow in ((1, 1.0), (2, 1.3)):
        base = [record(i, c, 10 + i, slow * (1 + i / 10), [1] * (9 + i)) for i, c in enumerate(cats)]
        write_run(root, "baseline", base, run=run)
        write_run(root, "fast", [record(i, c, 10 + i, slow / (2 + i), [2, 3, 1]) for i, c in enumerate(cats)], run=run)
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    cfg = OmegaConf.create({"method": {"name": "fast"}, "runs": 2, "temperature": 0.0, "model": {"name": "tiny"},
                            "dataset": {"name": "synthetic"}, "output_dir": str(root), "shard": None})
    text = run_summary(RunResult(cfg, 1, list(range(4)), labels=["baseline", "fast"]))  # read back from the files
    fast = next(r for r in group.results if r.method == "fast")
    for row in fast.rows.values():
        assert f"| {row['speedup']:.2f}x ± {row['speedup_std']:.2f} | {row['mean_accepted']:.2f} " in text
