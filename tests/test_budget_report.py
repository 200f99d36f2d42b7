"""The details table's step costs (nodes/step, efficiency, draft/step, verify/step) and the table of
draft budgets (auto against fixed), on hand-made answer files whose numbers are known."""

import math

import pytest

from helpers import cli
from specbench.analysis import report
from specbench.core.answers import AnswerWriter, run_dir, write_meta

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

CATS = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]


def record(qid, category, seconds, accept, prefill=None, sections=None, drafted=None):
    """One single-turn answer: `accept` per step, 10 tokens emitted in decoding plus any prefill token."""
    stats = {} if drafted is None else {"drafted_tokens": drafted, "accepted_tokens": sum(accept) - len(accept)}
    extra = {"output_ids": [list(range(sum(accept)))], "stats": [stats]}
    if prefill is not None:
        extra["prefill_time"] = [prefill]
    if sections is not None:
        extra["sections"] = [sections]
    return {
        "question_id": qid, "category": category, "answer_id": f"a{qid}", "model_id": "m", "tstamp": float(qid),
        "choices": [{"index": 0, "turns": ["x"], "decoding_steps": [len(accept)], "new_tokens": [sum(accept)],
                     "wall_time": [seconds], "accept_lengths": accept}],
        "specbench": extra,
    }


def write_run(root, method, records):
    folder = run_dir(root, "synthetic", "tiny", method, 0.0, 1)
    with AnswerWriter(folder / "answers.jsonl") as w:
        for r in records:
            w.write(r)
    write_meta(folder / "meta.json", {"identity": {"model": "zoo:target", "method": {"name": method}},
                                      "environment": {"device": "cpu"}, "config": {"method": {"name": method}}})


def write_baseline(root):
    """10 tokens in 10 steps, 1 s wall of which 0.2 s prefill: 10 tok/s, one decode step takes 0.08 s."""
    write_run(root, "baseline", [record(i, c, 1.0, [1] * 10, prefill=0.2, sections={"verify": 0.8})
                                 for i, c in enumerate(CATS)])


def table(md, heading):
    """The first table under `heading` in a Markdown leaderboard: {first cell: {header: cell}}."""
    lines = md.split(heading, 1)[1].split("\n## ", 1)[0].splitlines()
    header, *rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("| ")]
    return {row[0]: dict(zip(header, row)) for row in rows}


def analysed(root):
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    return group, {r.method: r for r in group.results}


@pytest.fixture
def step_answers(tmp_path):
    root = tmp_path / "answers"
    write_baseline(root)
    # half the questions 10 tokens in 4 steps with 12 nodes, half in 5 steps with 25: 111 nodes / 27 steps
    # (a mean of per-question ratios would give 4.00); drafting 0.054 s, verifying 0.108 s per question
    fast = [record(i, c, 0.5, [3, 3, 3, 1] if i % 2 else [2] * 5, prefill=0.2,
                   sections={"draft": 0.054, "verify": 0.108}, drafted=12 if i % 2 else 25)
            for i, c in enumerate(CATS)]
    # a question the baseline never answered: its speedup leaves it out, and so must the step costs
    fast.append(record(99, "qa", 0.5, [1] * 10, prefill=0.2, sections={"draft": 50.0, "verify": 50.0},
                       drafted=1000))
    write_run(root, "fast", fast)
    write_run(root, "plain", [record(i, c, 0.5, [2] * 5) for i, c in enumerate(CATS)])  # no counters, no sections
    return root


def test_step_costs_are_ratios_of_sums_in_baseline_steps(step_answers):
    _, results = analysed(step_answers)
    fast = results["fast"]
    assert math.isclose(fast.steps["nodes_per_step"], 111 / 27)
    # drafting 6 * 0.054 s over 27 steps, against a baseline step of (6 - 1.2) s / 60 steps = 0.08 s
    assert math.isclose(fast.steps["draft_per_step"], 6 * 0.054 / 27 / 0.08)
    assert math.isclose(fast.steps["verify_per_step"], 6 * 0.108 / 27 / 0.08)
    # speedup 2 (20 tok/s against 10), mean accepted 60 / 27
    assert math.isclose(fast.rows["overall"]["speedup"], 2.0)
    assert math.isclose(fast.efficiency, 2.0 / (60 / 27))
    base, plain = results["baseline"], results["plain"]
    assert base.efficiency is None and base.steps["nodes_per_step"] is None
    assert math.isclose(base.steps["verify_per_step"], 1.0)  # 0.8 s of verification over 10 steps of 0.08 s
    assert plain.steps == {"nodes_per_step": None, "draft_per_step": None, "verify_per_step": None}
    assert math.isclose(plain.efficiency, 2.0 / 2.0)


def test_details_table_shows_step_costs(step_answers, tmp_path):
    done = cli("report", str(step_answers), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert done.code == 0, done
    md = (tmp_path / "lb" / "synthetic-tiny.md").read_text()
    details = table(md, "## Details")
    header = list(details["fast"])
    assert header[header.index("Overall 95% CI") + 1:][:4] == ["Nodes/step", "Efficiency", "Draft/step", "Verify/step"]
    assert [details["fast"][h] for h in header[3:7]] == ["4.11", "0.90", "0.15x", "0.30x"]
    assert [details["plain"][h] for h in header[3:7]] == ["-", "1.00", "-", "-"]
    assert [details["baseline"][h] for h in header[3:7]] == ["-", "-", "-", "1.00x"]
    assert "efficiency" not in md.lower().split("## details")[0]  # the definitions stay under the details
    assert "Efficiency: speedup / #mean accepted tokens" in md and "Nodes/step: draft nodes verified" in md
    assert "speedup ≈ #mean accepted tokens / (draft/step + verify/step + other)" in md
    assert "Draft budgets" not in md and "Draft budgets" not in done.out  # no X-fixed here


def budget_run(root, method, tokens_per_s, nodes):
    """10 tokens per question in 5 steps at the given tokens/s (one per question), `nodes` per step."""
    write_run(root, method, [record(i, c, 10 / tps, [2] * 5, prefill=0.0, drafted=5 * nodes)
                             for (i, c), tps in zip(enumerate(CATS), tokens_per_s)])


@pytest.fixture
def budget_answers(tmp_path):
    root = tmp_path / "answers"
    write_baseline(root)  # 10 tok/s on every question
    varied = [15, 25] * 3  # speedup 2.00, its 95% interval's low end near 1.67
    for name in ("sps", "eagle", "pld"):
        budget_run(root, f"{name}-fixed", varied, nodes=4)
    budget_run(root, "sps", [21] * 6, nodes=3)  # 2.10: yes
    budget_run(root, "eagle", [19] * 6, nodes=3)  # 1.90: below 2.00, above the interval's low end
    budget_run(root, "pld", [15] * 6, nodes=3)  # 1.50: NO
    budget_run(root, "lonely-fixed", [20] * 6, nodes=3)  # no auto twin: no row
    return root


def test_budget_pairs_and_verdicts(budget_answers):
    group, results = analysed(budget_answers)
    pairs = report.budget_pairs(group)
    assert [(p.auto.method, p.fixed.method) for p in pairs] == [("sps", "sps-fixed"), ("eagle", "eagle-fixed"),
                                                          ("pld", "pld-fixed")]
    assert [p.ratio for p in pairs] == pytest.approx([1.05, 0.95, 0.75])
    eagle, pld = pairs[1], pairs[2]
    assert eagle.low < 0.95 < 1 < eagle.high  # paired bootstrap over the 6 questions: eagle's interval reaches 1
    assert pld.high < 1  # pld's does not
    assert [p.verdict for p in pairs] == ["yes", "within noise", "NO"]


def test_budget_table_in_markdown_and_console(budget_answers, tmp_path):
    done = cli("report", str(budget_answers), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert done.code == 0, done
    md = (tmp_path / "lb" / "synthetic-tiny.md").read_text()
    assert md.index("## Details") < md.index("## Draft budgets: auto against fixed")
    rows = table(md, "## Draft budgets: auto against fixed")
    assert list(rows) == ["sps", "eagle", "pld"]
    sps = rows["sps"]
    first = report.budget_pairs(analysed(budget_answers)[0])[0]
    fixed = first.fixed.rows["overall"]
    assert sps["Speedup fixed"] == f"2.00x [{fixed['ci_low']:.2f}, {fixed['ci_high']:.2f}]"
    assert sps["Speedup auto"] == "2.10x [2.10, 2.10]"
    assert sps["auto/fixed"] == f"1.050 [{first.low:.3f}, {first.high:.3f}]"
    assert sps["Mean accepted fixed -> auto"] == "2.00 -> 2.00"
    assert sps["Nodes/step fixed -> auto"] == "4.00 -> 3.00"
    assert sps["Efficiency fixed -> auto"] == "1.00 -> 1.05"
    assert [r["auto >= fixed"] for r in rows.values()] == ["yes", "within noise", "NO"]
    assert "Draft budgets, auto against fixed:" in done.out
    console = table(done.out, "Draft budgets, auto against fixed:")
    assert [r["auto >= fixed"] for r in console.values()] == ["yes", "within noise", "NO"]


def test_the_main_table_ranks_presets_with_auto_beside(budget_answers, tmp_path):
    """`report --beside`: a main folder of presets (X-fixed) gets each X's auto speedup from the budget job."""
    main = tmp_path / "main"
    write_baseline(main)
    budget_run(main, "sps-fixed", [30] * 6, nodes=4)  # 3.00x here; auto is 2.10x in the budget job
    budget_run(main, "pld-fixed", [12] * 6, nodes=4)
    budget_run(main, "medusa-fixed", [11] * 6, nodes=4)  # not in the budget job: "-"
    done = cli("report", str(main), "--out", str(tmp_path / "lb"), "--no-figures", "--beside", str(budget_answers),
               cwd=tmp_path)
    assert done.code == 0, done
    md = (tmp_path / "lb" / "synthetic-tiny.md").read_text()
    rows = table("\n" + md[md.index("| Method"):], "\n")  # the first table: the main one
    assert list(rows) == ["sps-fixed", "pld-fixed", "medusa-fixed", "baseline"]  # ranked on the presets
    assert rows["sps-fixed"]["Overall"] == "3.00x"
    assert rows["sps-fixed"]["Overall, budget=auto"] == "2.10x (2.00)"
    assert rows["pld-fixed"]["Overall, budget=auto"] == "1.50x (2.00)"
    assert rows["medusa-fixed"]["Overall, budget=auto"] == rows["baseline"]["Overall, budget=auto"] == "-"
    assert "Overall, budget=auto: the method with its draft budget on" in md and "(6 questions;" in md
    assert cli("report", str(main), "--out", str(tmp_path / "lb2"), "--no-figures", cwd=tmp_path).code == 0
    assert "budget=auto" not in (tmp_path / "lb2" / "synthetic-tiny.md").read_text().split("## Details")[0]
    empty = cli("report", str(main), "--out", str(tmp_path / "lb3"), "--beside", str(tmp_path / "none"), cwd=tmp_path)
    assert empty.code != 0 and "--beside" in empty.err and "no answer files" in empty.err, empty
