"""Report, leaderboard and check on hand-made answer files whose numbers are known."""

import json
import math

import pytest

from helpers import CATS, assert_one_line_error, base_records, cli, record, speedup_rows, write_run
from specbench.analysis import report
from specbench.core.answers import AnswerWriter, read_answers
from specbench.core.errors import SpecbenchError
from specbench.presentation import leaderboard
from specbench.presentation.check import compare, load_check_config, snapshot

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds


def test_speedup_uses_upstream_definition():
    base = [record(1, "qa", 10, 1.0, [1] * 9), record(2, "qa", 10, 2.0, [1] * 9)]
    ours = [record(1, "qa", 10, 0.5, [3, 3, 3]), record(2, "qa", 10, 0.5, [5, 4])]
    rows = speedup_rows(ours, base)
    # mean tok/s: ours (20 + 20) / 2 = 20; baseline (10 + 5) / 2 = 7.5
    assert rows[0]["subtask"] == "qa" and math.isclose(rows[0]["speedup"], 20 / 7.5)
    assert math.isclose(rows[0]["mean_accepted"], 18 / 5)


def test_report_groups_runs_and_computes_noise(tmp_path):
    root = tmp_path / "answers"
    for run, secs in ((1, 1.0), (2, 1.0)):
        write_run(root, "baseline", base_records(secs), run=run)
    write_run(root, "fast", [record(i, c, 10, 0.5, [2] * 4 + [1], depths=[3] * 5) for i, c in enumerate(CATS)], run=1)
    write_run(root, "fast", [record(i, c, 10, 0.25, [2] * 4 + [1], depths=[3] * 5) for i, c in enumerate(CATS)], run=2)
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    fast = next(r for r in group.results if r.method == "fast")
    assert group.results[0].method == "fast"  # sorted by overall speedup
    assert math.isclose(fast.rows["overall"]["speedup"], (2 + 4) / 2)
    assert math.isclose(fast.rows["overall"]["speedup_std"], math.sqrt(2))
    assert fast.rows["overall"]["ci_low"] <= fast.rows["overall"]["ci_high"]
    assert math.isclose(fast.rows["qa"]["mean_accepted"], 9 / 5)
    # depth 1 reached 5 times per question, accepted 4 times; depth 2 never accepted
    assert fast.depth_acceptance[:2] == [0.8, 0.0]
    assert math.isclose(fast.time_split["draft"], 0.2) and math.isclose(fast.time_split["other"], 0.2)
    assert fast.audit["equal"] == fast.audit["compared"] == 12


def test_lossless_audit_tells_near_ties_from_bugs(tmp_path):
    root = tmp_path / "answers"
    base = base_records()
    base[0]["specbench"]["stats"][0]["top2_margin"] = [5.0, 0.01, 5.0] + [5.0] * 7
    base[2]["specbench"]["stats"][0]["top2_margin"] = [3.0] * 10
    write_run(root, "baseline", base)
    ours = base_records()
    ours[0]["specbench"]["output_ids"] = [[0, 99] + list(range(2, 10))]  # diverges at a near-tie
    ours[1]["specbench"]["output_ids"] = [[0, 1, 2, 99] + list(range(4, 10))]  # diverges where margin 0.01
    ours[2]["specbench"]["output_ids"] = [[77] + list(range(1, 10))]
    write_run(root, "buggy", ours)
    (group,) = [report.analyse(g, tie_margin=0.05) for g in report.group_runs(report.load_runs(root))]
    audit = next(r for r in group.results if r.method == "buggy").audit
    assert audit["compared"] == 6 and audit["equal"] == 3
    verdicts = {m["question_id"]: m["near_tie"] for m in audit["mismatches"]}
    assert verdicts == {0: True, 1: True, 2: False}
    text = leaderboard.render_markdown(group)
    assert "3/6 equal, 2 near-tie, 1 NOT near-tie" in text and "NOT a near-tie: a bug" in text


def test_missing_baseline_is_named_and_others_still_reported(tmp_path):
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records())
    write_run(root, "fast", base_records(0.5))
    write_run(root, "orphan", base_records(), temperature=0.7)
    proc = cli("report", str(root), "--out", str(tmp_path / "lb"), cwd=tmp_path)
    assert proc.code == 0, proc
    assert "no baseline answers" in proc.err and "temperature 0.7" in proc.err
    assert "| fast " in proc.out and "2.00x" in proc.out
    md = (tmp_path / "lb" / "synthetic-tiny.md").read_text()
    assert "Multi-turn Conversation" in md and "#Mean Accepted Tokens" in md and "device=cpu" in md
    assert (tmp_path / "lb" / "synthetic-tiny.csv").read_text().startswith("method,runs,mt_bench_speedup")
    assert r"\begin{tabular}" in (tmp_path / "lb" / "synthetic-tiny.tex").read_text()
    for name in ("synthetic-tiny-fig5.png", "synthetic-tiny-fig5.svg", "synthetic-tiny-acceptance.png"):
        assert (tmp_path / "lb" / name).stat().st_size > 1000


def test_upstream_answer_files_are_read(tmp_path):
    folder = tmp_path / "spec_bench" / "model_answer_temp0_run_1"
    folder.mkdir(parents=True)
    for name, secs in (("vicuna-7b-v1.3-vanilla-float16-temp-0.0", 1.0), ("vicuna-7b-v1.3-pld-float16-temp-0.0", 0.5)):
        with (folder / f"{name}.jsonl").open("w") as fh:
            for r in base_records(secs):
                r.pop("specbench")
                fh.write(json.dumps(r) + "\n")
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(tmp_path, "vicuna"))]
    assert group.dataset == "spec_bench" and group.model == "vicuna"
    pld = next(r for r in group.results if r.method == "vicuna-7b-v1.3-pld-float16")
    assert math.isclose(pld.rows["overall"]["speedup"], 2.0)


def test_check_flags_a_regression_and_passes_unchanged(tmp_path):
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records())
    write_run(root, "fast", [record(i, c, 10, 0.5, [2] * 5) for i, c in enumerate(CATS)])
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    ref = snapshot(group, None)
    tol = load_check_config().tolerance
    assert compare(ref, ref, tol)[1] is False
    slower = json.loads(json.dumps(ref))
    slower["methods"]["fast"]["overall"]["speedup"] *= 0.5
    assert compare(ref, slower, tol)[1] is True
    worse = json.loads(json.dumps(ref))
    worse["methods"]["fast"]["qa"]["mean_accepted"] -= 0.2
    rows, regressed = compare(ref, worse, tol)
    assert regressed and ["fast", "qa", "#mean accepted"] == next(r for r in rows if r[-1] == "REGRESSED")[:3]
    noisy = json.loads(json.dumps(slower))
    noisy["methods"]["fast"]["overall"]["noise"] = 0.5  # a drop within the measured noise is not a regression
    assert compare(ref, noisy, tol)[1] is False


def test_check_command_exit_codes(tmp_path):
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records())
    folder = write_run(root, "fast", [record(i, c, 10, 0.5, [2] * 5) for i, c in enumerate(CATS)])
    args = ["check", "--results", str(root), "--reference", str(tmp_path / "ref")]
    assert cli(*args, "--update", cwd=tmp_path).code == 0
    assert cli(*args, cwd=tmp_path).code == 0
    # make it slower: the same answers take 4x longer
    (folder / "answers.jsonl").write_text("".join(
        json.dumps(record(i, c, 10, 2.0, [2] * 5)) + "\n" for i, c in enumerate(CATS)))
    proc = cli(*args, cwd=tmp_path)
    assert proc.code == 1 and "REGRESSED" in proc.out and "REGRESSION" in proc.out


def test_recommend_respects_constraints(tmp_path):
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records(), facts={"training": False})
    write_run(root, "trained", base_records(0.25), facts={"training": True})
    write_run(root, "free", base_records(0.5), facts={"training": False})
    proc = cli("recommend", "--memory-gb", "1", "--training", "no", "--results", str(root), cwd=tmp_path)
    assert proc.code == 0 and "Recommendation: free" in proc.out and "2.00x" in proc.out, proc
    proc = cli("recommend", "--memory-gb", "1", "--training", "yes", "--results", str(root), cwd=tmp_path)
    assert proc.code == 0 and "Recommendation: trained" in proc.out, proc
    proc = cli("recommend", "--memory-gb", "0.000001", "--training", "yes", "--results", str(root), cwd=tmp_path)
    assert proc.code == 1 and "too large" in proc.out


def test_answer_line_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"question_id": 1}\n\n[1, 2]\n{"question_id": 2}\n')
    with pytest.raises(SpecbenchError, match=r"answers.jsonl:3: corrupt line") as err:
        read_answers(path)
    assert "\n" not in str(err.value)
    path.write_text('{"question_id": 1}\n  \n{"question_id": 2}\n')  # blank lines are skipped
    assert [r["question_id"] for r in read_answers(path)] == [1, 2]


def test_check_gates_that_cannot_pass_by_accident(tmp_path):
    """No reference fails unless allowed; a method without answers, with failed questions or
    with greedy answers that differ from the baseline's (not a near-tie) fails whatever the
    reference says, and `--update` refuses to bless such results."""
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records())
    write_run(root, "fast", [record(i, c, 10, 0.5, [2] * 5) for i, c in enumerate(CATS)])
    args = ["check", "--results", str(root), "--reference", str(tmp_path / "ref")]
    missing = cli(*args, cwd=tmp_path)
    assert missing.code == 1 and "FAILED" in missing.out and "no reference" in missing.out, missing
    assert cli(*args, "--allow-missing", cwd=tmp_path).code == 0
    assert cli(*args, "--update", cwd=tmp_path).code == 0
    assert cli(*args, cwd=tmp_path).code == 0
    empty = write_run(root, "empty", [])  # every question failed
    with AnswerWriter(empty / "errors.jsonl") as w:
        w.write({"question_id": 0, "category": "writing", "method": "empty", "run": 1, "error": "RuntimeError: x"})
    result = cli(*args, cwd=tmp_path)
    assert result.code == 1 and "FAILED: " in result.out and "empty has no answers to compare" in result.out, result
    assert "empty: 1 question(s) failed" in result.out
    refused = cli(*args, "--update", cwd=tmp_path)
    assert refused.code == 1 and "not written" in refused.out
    # greedy answers that differ where the baseline's top-2 margin was wide: a bug, not a near-tie
    (root / "synthetic").rename(tmp_path / "old")  # fresh folders (AnswerWriter appends)
    wrong = [record(i, c, 10, 0.5, [2] * 5, ids=[7] * 10) for i, c in enumerate(CATS)]
    write_run(root, "baseline", [record(i, c, 10, 1.0, [1] * 9, margins=[3.0] * 10) for i, c in enumerate(CATS)])
    write_run(root, "fast", wrong)
    result = cli(*args, cwd=tmp_path)
    assert result.code == 1 and "fast: 6 greedy answer(s) differ from the baseline's, not by a near-tie" in result.out
    # the same divergence at a near-tie is not a bug
    (root / "synthetic").rename(tmp_path / "old2")
    write_run(root, "baseline", base_records())  # margins 0.01 <= the default tie margin
    write_run(root, "fast", wrong)
    assert cli(*args, "--allow-missing", cwd=tmp_path).code == 0


def test_reference_that_is_not_one_is_named(tmp_path):
    root = tmp_path / "answers"
    write_run(root, "baseline", base_records())
    write_run(root, "fast", [record(i, c, 10, 0.5, [2] * 5) for i, c in enumerate(CATS)])
    args = ["check", "--results", str(root), "--reference", str(tmp_path / "ref")]
    assert cli(*args, "--update", cwd=tmp_path).code == 0
    (path,) = (tmp_path / "ref").glob("*.json")
    good = json.loads(path.read_text())
    for bad, pattern in (("{not json", r"cannot be read"), ("[]", r"has no 'methods' table"),
                         (json.dumps({**good, "methods": {"fast": {"qa": {"speedup": "fast"}}}}),
                          r"fast / qa lacks a finite speedup")):
        path.write_text(bad)
        assert_one_line_error(cli(*args, cwd=tmp_path), pattern)


def test_memory_reads_in_three_figures_of_the_unit_it_rounds_to():
    shown = {n: leaderboard._bytes(n) for n in (None, 0, 512, 805_000, 999_400_000, 999_600_000, 1_160_000_000)}
    assert shown == {None: "-", 0: "none", 512: "512 B", 805_000: "805 KB", 999_400_000: "999 MB",
                     999_600_000: "1 GB", 1_160_000_000: "1.16 GB"}
