"""Bad input gets a one-line error naming the problem and the fix; property tests of the
question loader and the metric code."""

import json
import math
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import base_records, record, speedup_rows, write_run

from helpers import specbench, write_questions
from specbench.analysis import report
from specbench.core.errors import SpecbenchError
from specbench.core.questions import MT_BENCH_CATEGORIES, SUBTASKS, load_questions
from specbench.models import load_model


class Evil:
    """A pickle that would run a command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_bad_model_folders(tiny_models, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecbenchError, match="has no config.json"):
        load_model(str(empty), device=torch.device("cpu"), dtype=torch.float32)
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    for f in tiny_models["llama"].glob("*.json"):
        (unsafe / f.name).write_text(f.read_text())
    marker = tmp_path / "pwned"
    with open(unsafe / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"model.embed_tokens.weight": Evil(marker)}, fh)
    with pytest.raises(SpecbenchError, match="convert it to safetensors"):
        load_model(str(unsafe), device=torch.device("cpu"), dtype=torch.float32)
    assert not marker.exists()
    remote = tmp_path / "remote"
    remote.mkdir()
    for f in tiny_models["llama"].iterdir():
        (remote / f.name).write_bytes(f.read_bytes())
    config = json.loads((remote / "config.json").read_text())
    config.update(model_type="my_custom_lm", auto_map={"AutoModelForCausalLM": "modeling_custom.CustomLM"})
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecbenchError, match="set model.trust_remote_code=true"):
        load_model(str(remote), device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_model(str(tmp_path / "absent"), device=torch.device("cpu"), dtype=torch.float32)


def test_huge_line_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "q.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"question_id": 1, "category": "qa", "turns": ["x"]}\n')
        fh.write(b'{"question_id": 2, "category": "qa", "turns": ["' + b"a" * (100 << 20) + b'"]}\n')
    with pytest.raises(SpecbenchError, match=r"q.jsonl:2: line longer than 4 MiB"):
        load_questions(path)


def test_bad_model_folder_through_the_cli(tmp_path):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    (tmp_path / "m").mkdir()
    proc = specbench("run", "model=local", f"model.path={tmp_path / 'm'}", "dataset=spec_bench",
                     f"dataset.path={questions}", f"output_dir={tmp_path / 'r'}", cwd=tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "has no config.json" in lines[0]


def test_report_on_bad_answer_files(tmp_path):
    root = tmp_path / "answers"
    folder = write_run(root, "baseline", base_records())
    with (folder / "answers.jsonl").open("a") as fh:
        fh.write('{"question_id": 77, "categ')  # truncated by a kill
    write_run(root, "fast", base_records(0.5))
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    assert group.results and group.results[0].rows["overall"]["questions"] == 6
    other = write_run(root, "other", base_records(0.5))
    meta = json.loads((other / "meta.json").read_text())
    meta["identity"]["model"] = "another/model"
    (other / "meta.json").write_text(json.dumps(meta))
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    assert not group.results and any("different models" in p for p in group.problems)
    (folder / "answers.jsonl").write_text('{"question_id": 1}\n{broken\n{"question_id": 2}\n')
    proc = specbench("report", str(root), "--out", str(tmp_path / "lb"), cwd=tmp_path)
    assert proc.returncode == 2 and "answers.jsonl:2: corrupt answer line" in proc.stderr


CATEGORY = st.sampled_from(MT_BENCH_CATEGORIES + SUBTASKS[1:])
QUESTION = st.fixed_dictionaries({
    "question_id": st.integers(-10**9, 10**9), "category": CATEGORY,
    "turns": st.lists(st.text(min_size=1).filter(str.strip), min_size=1, max_size=2),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(QUESTION, min_size=1, max_size=8, unique_by=lambda q: q["question_id"]))
def test_loader_reads_back_any_well_formed_file(tmp_path, questions):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    loaded = load_questions(path)
    assert [q.question_id for q in loaded] == [q["question_id"] for q in questions]
    assert [list(q.turns) for q in loaded] == [q["turns"] for q in questions]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode)), min_size=1, max_size=5))
def test_loader_never_crashes_on_garbage(tmp_path, lines):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        loaded = load_questions(path)
    except SpecbenchError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
    else:
        assert all(q.turns for q in loaded)


POSITIVE = st.floats(0.01, 100, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 200), POSITIVE, POSITIVE, st.sampled_from(SUBTASKS[1:])),
                min_size=1, max_size=12))
def test_speedup_is_the_ratio_of_mean_throughputs(rows):
    ours = [record(i, c, n, t_ours, [1] * (n - 1)) for i, (n, t_ours, _, c) in enumerate(rows)]
    base = [record(i, c, n, t_base, [1] * (n - 1)) for i, (n, _, t_base, c) in enumerate(rows)]
    overall = speedup_rows(ours, base)[-1]
    expected = (sum(n / t for n, t, _, _ in rows) / len(rows)) / (sum(n / t for n, _, t, _ in rows) / len(rows))
    assert math.isclose(overall["speedup"], expected, rel_tol=1e-9)
    assert overall["questions"] == len(rows)
    same = speedup_rows(base, base)
    assert all(math.isclose(r["speedup"], 1.0) for r in same)
