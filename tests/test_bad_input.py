"""Bad input gets a one-line error naming the problem and the fix; property tests of the
question loader and the metric code.

The catalogue below (`RUN_CASES`, `COMMAND_CASES`) runs each bad input through the command line
in this process and asserts: exit code 2, exactly one `error:` line matching the case's
pattern, no traceback, and the answers already on disk byte-identical afterwards. More cases
of the catalogue live in test_bad_files.py (model, question, answer and reference files) and
test_architectures.py (heads and train-head).
"""

import json
import math
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (
    assert_one_line_error,
    base_records,
    cli,
    record,
    snapshot,
    specbench,
    speedup_rows,
    write_questions,
    write_run,
)
from specbench.analysis import report
from specbench.core.answers import read_answers
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
    # a corrupt file is named and left out; the other runs (baseline and fast, one model) are still reported
    (other / "answers.jsonl").write_text('{"question_id": 1}\n{broken\n{"question_id": 2}\n')
    result = cli("report", str(root), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert result.code == 0 and "Traceback" not in result.err and "| fast " in result.out, result
    assert f"warning: {other / 'answers.jsonl'}:2: corrupt line" in result.err
    assert "left out of the report" in result.err and "different models" not in result.err


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


# --- the catalogue: settings and commands ---------------------------------------------------

#: (id, overrides added to a valid run, pattern of the one error line)
RUN_CASES = [
    ("no-equals", ["temperature"], r"override 'temperature' has no '='"),
    ("unknown-key", ["temprature=0.5"], r"unknown key 'temprature'; available keys:"),
    ("unknown-nested-key", ["model.pathh=x"],
     r"unknown key 'model.pathh' \(nothing reads it.*did you mean 'model.path'\?"),
    ("unknown-plus-key", ["+temprature=0.9"], r"unknown key 'temprature' .*did you mean 'temperature'\?"),
    ("unknown-plus-nested-key", ["+model.pth=x"], r"unknown key 'model.pth' .*did you mean 'model.path'\?"),
    ("unknown-plus-dataset-key", ["+dataset.shuffle=1"], r"unknown key 'dataset.shuffle' .*the keys under 'dataset'"),
    ("unknown-stop-string-key", ["model.stop_string=[a]"], r"did you mean 'model.stop_strings'\?"),
    ("unknown-method", ["method=nope"], r"unknown method 'nope'; available: .*baseline"),
    ("unknown-task", ["task=[qa,poetry]"], r"unknown task 'poetry'; available: all"),
    ("unknown-model", ["model=gpt9"], r"unknown model 'gpt9'; available:"),
    ("unknown-dataset", ["dataset=nope"], r"unknown dataset 'nope'; available:"),
    ("unknown-sweep", ["sweep=nope"], r"unknown sweep 'nope'"),
    ("temperature-negative", ["temperature=-1"], r"temperature must be a finite number >= 0"),
    ("temperature-nan", ["temperature=nan"], r"temperature must be a finite number >= 0 .*, got nan"),
    ("temperature-inf", ["temperature=inf"], r"temperature must be a finite number >= 0 .*, got inf"),
    ("temperature-text", ["temperature=hot"], r"temperature must be a finite number"),
    ("temperature-tiny", ["temperature=1e-45"], r"temperature=1e-45 is too small to sample with .* use temperature=0"),
    ("temperature-subnormal", ["temperature=5e-324", "top_k=3"], r"is too small to sample with"),
    ("temperature-bool", ["temperature=true"], r"temperature must be a finite number"),
    ("top-p-high", ["top_p=1.5"], r"top_p must be in \(0, 1\]"),
    ("top-p-zero", ["top_p=0"], r"top_p must be in \(0, 1\]"),
    ("top-p-nan", ["top_p=nan"], r"top_p must be in \(0, 1\]"),
    ("top-k-negative", ["top_k=-1"], r"top_k must be an integer >= 0"),
    ("top-k-float", ["top_k=1.5"], r"top_k must be an integer >= 0"),
    ("max-new-zero", ["max_new_tokens=0"], r"max_new_tokens must be a positive integer"),
    ("max-new-float", ["max_new_tokens=1e14"], r"max_new_tokens must be a positive integer"),
    ("max-new-text", ["max_new_tokens=lots"], r"max_new_tokens must be a positive integer"),
    ("max-new-beyond-context", ["max_new_tokens=100000000000000"],
     r"max_new_tokens=100000000000000 does not fit the context of .* \(512 positions"),
    ("max-new-at-context", ["max_new_tokens=512"], r"does not fit the context .*512 positions"),
    ("limit-zero", ["limit=0"], r"limit must be a positive integer or null"),
    ("limit-text", ["limit=all"], r"limit must be a positive integer or null"),
    ("runs-zero", ["runs=0"], r"runs must be a positive integer"),
    ("warmup-negative", ["warmup=-1"], r"warmup must be an integer >= 0"),
    ("seed-text", ["seed=abc"], r"seed must be an integer >= 0, got 'abc'"),
    ("seed-negative", ["seed=-1"], r"seed must be an integer >= 0"),
    ("seed-float", ["seed=1.5"], r"seed must be an integer >= 0"),
    ("threads-negative", ["threads=-2"], r"threads must be a positive integer or null"),
    ("threads-zero", ["threads=0"], r"threads must be a positive integer or null"),
    ("device-unknown", ["device=gpu"], r"device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("device-bad-index", ["device=cuda:x"], r"device must be auto, cpu, cuda or cuda:N"),
    pytest.param(["device=cuda"], r"no CUDA device is visible", id="device-cuda-absent",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")),
    ("dtype-unknown", ["dtype=float8"], r"dtype must be one of auto, float32, float16, bfloat16"),
    ("model-dtype-unknown", ["model.dtype=int8"], r"model.dtype must be one of .* or null"),
    ("template-unknown", ["model.template=foo"], r"model.template must be one of vicuna_v1.1, chat_template, plain"),
    ("stop-strings-number", ["model.stop_strings=[1]"], r"model.stop_strings must be non-empty strings, got 1"),
    ("stop-strings-empty", ["model.stop_strings=['']"], r"model.stop_strings must be non-empty strings"),
    ("stop-strings-table", ["model.stop_strings={a:1}"], r"model.stop_strings"),
    ("on-error-unknown", ["on_error=ignore"], r"on_error must be record or raise"),
    ("lane-order-unknown", ["lane_order=random"], r"lane_order must be one of shuffled, alternating, got 'random'"),
    ("overwrite-not-bool", ["overwrite=maybe"], r"overwrite must be true or false"),
    ("baseline-not-bool", ["baseline=2"], r"baseline must be true or false"),
    ("progress-not-bool", ["progress=yes"], r"progress must be true or false"),
    ("shard-reversed", ["shard=3/2"], r"shard must look like i/n with 1 <= i <= n"),
    ("shard-text", ["shard=half"], r"shard must look like i/n"),
    ("shard-zero", ["shard=0/4"], r"shard must look like i/n"),
    ("task-empty", ["task=[]"], r"no subtask selected|unknown task"),
    ("model-path-empty", ["model.path="], r"model.path is not set"),
    ("model-path-absent", ["model.path=/nonexistent/model"], r"/nonexistent/model.*does not exist"),
    ("model-name-parent", ["model.name=../x"], r"model.name must be a plain folder name"),
    ("method-name-slash", ["method.name=a/b"], r"method.name must be a plain folder name"),
    ("dataset-name-hidden", ["dataset.name=.x"], r"dataset.name must be a plain folder name"),
    ("dataset-path-absent", ["dataset.path=/nonexistent/q.jsonl"], r"question file /nonexistent/q.jsonl not found"),
    ("dataset-path-null", ["dataset.path=null"], r"dataset.path must be a path, got None; give a question file"),
    ("output-dir-null", ["output_dir=null"], r"output_dir must be a path, got None; give a folder"),
    ("output-dir-empty", ["output_dir="], r"output_dir must be a path, got ''"),
    ("output-dir-blank", ["output_dir=' '"], r"output_dir must be a path, got ' '"),
    ("length-text", ["length=long"], r"length must be a positive number of input tokens"),
    ("length-too-long", ["length=100000"], r"length=100000 does not fit the context of .* \(512 positions\)"),
    ("method-impl-absent", ["method.impl=nowhere.Method"], r"nowhere"),
    ("method-impl-not-method", ["method.impl=pathlib.Path"], r"pathlib.Path"),
    ("method-setting-unknown", ["method=pld", "+method.num_pred=3"], r"method 'pld' has no setting 'num_pred'"),
    ("method-setting-type", ["method=pld", "method.num_pred_tokens=many"], r"method 'pld': bad setting"),
    ("method-setting-negative", ["method=pld", "method.num_pred_tokens=-1"],
     r"method 'pld': setting 'num_pred_tokens' must be >= 1, got -1"),
    ("method-setting-zero-size", ["method=recycling", "method.tree_size=0"], r"setting 'tree_size' must be >= 1"),
    ("method-setting-probability", ["method=recycling", "method.decay=1.5"], r"setting 'decay' must be >= 0"),
    ("method-setting-choice", ["method=pld", "method.match=middle"], r"unknown pld match 'middle'"),
    ("sps-schedule", ["method=sps", "model.draft={qwen2}", "method.schedule=fast"], r"unknown schedule 'fast'"),
    ("sps-no-draft", ["method=sps"], r"draft"),
    ("sps-draft-absent", ["method=sps", "method.draft=/nonexistent/draft"], r"/nonexistent/draft.*does not exist"),
    ("lookahead-level", ["method=lookahead", "method.level=0"], r"setting 'level' must be >= 1|level"),
    ("rest-datastore-absent", ["method=rest", "method.datastore=/nonexistent/ds"], r"/nonexistent/ds"),
    ("eagle-head-absent", ["method=eagle", "method.head=/nonexistent/head"], r"/nonexistent/head"),
    ("medusa-no-head", ["method=medusa", "method.head=null"], r"head"),
]


def case_params(cases):
    return [pytest.param(*c[1:], id=c[0]) if type(c) is tuple else c for c in cases]


@pytest.mark.parametrize("overrides, pattern", case_params(RUN_CASES))
def test_bad_run_settings(earlier, tiny_models, overrides, pattern):
    root, out, args = earlier
    before = snapshot(out)
    result = cli(*args, *(o.replace("{qwen2}", str(tiny_models["qwen2"])) for o in overrides), cwd=root)
    assert_one_line_error(result, pattern)
    assert snapshot(out) == before


@pytest.mark.parametrize("typo", ["model.pathh=x", "+temprature=0.9", "+model.pth=x", "model.stop_string=[a]",
                                  "+max_new_token=4", "+limt=1"])
def test_each_suggested_key_is_one_that_works(earlier, typo):
    """The key an unknown-key error suggests is taken: the same override with it passes the key check."""
    import re

    root, out, args = earlier
    line = assert_one_line_error(cli(*args, typo, cwd=root), r"unknown key")
    suggested = re.search(r"did you mean '([^']+)'", line).group(1)
    fixed = f"{suggested}={typo.split('=', 1)[1]}"
    again = cli(*args, fixed, "baseline=false", f"output_dir={out.parent / 'suggested'}", cwd=root)
    assert "unknown key" not in again.err, again


#: (id, command line, pattern): commands other than run, and run's command-line shape
COMMAND_CASES = [
    ("unknown-command", ["frobnicate"], r"unknown command in 'frobnicate'; commands: run"),
    ("flags-before-report", ["-m", "report"], r"flags before 'report' only apply to run"),
    ("sweep-unknown-method", ["-m", "run", "method=pld,nope"], r"unknown method 'nope'"),
    ("sweep-unknown-key", ["-m", "run", "+temprature=0.1,0.2"],
     r"unknown key 'temprature' .*did you mean 'temperature'"),
    ("data-unknown-action", ["data", "frobnicate"], r"data: argument action: invalid choice"),
    ("data-seed-text", ["data", "synth", "--seed", "x"], r"argument --seed: invalid int value"),
    ("report-unknown-flag", ["report", "--colour"], r"unrecognized arguments: --colour"),
    ("report-tie-margin-text", ["report", "--tie-margin", "wide"], r"--tie-margin: invalid float value"),
    ("check-unknown-flag", ["check", "--fast"], r"unrecognized arguments: --fast"),
    ("check-unknown-setting", ["check", "tolerance.speed=1"], r"unknown check setting 'tolerance.speed'"),
    ("check-setting-text", ["check", "tolerance.speedup_rel_min=abc"], r"tolerance.speedup_rel_min must be a number"),
    ("check-setting-negative", ["check", "tolerance.noise_sigmas=-1"], r"tolerance.noise_sigmas must be a number >= 0"),
    ("check-no-results", ["check", "--results", "nowhere"], r"results folder nowhere does not exist"),
    ("methods-unknown-flag", ["methods", "--all"], r"unrecognized arguments: --all"),
    ("recommend-training", ["recommend", "--memory-gb", "1", "--training", "maybe"], r"--training: invalid choice"),
    ("recommend-memory-text", ["recommend", "--memory-gb", "lots", "--training", "no"], r"--memory-gb: invalid float"),
    ("recommend-memory-negative", ["recommend", "--memory-gb", "-1", "--training", "no"],
     r"--memory-gb must be a positive number"),
    ("zoo-unknown-action", ["zoo", "frobnicate"], r"invalid choice: 'frobnicate'"),
    ("datastore-missing-args", ["datastore", "build"], r"the following arguments are required: --corpus"),
]


@pytest.mark.parametrize("argv, pattern", case_params(COMMAND_CASES))
def test_bad_commands(earlier, argv, pattern):
    root, out, _ = earlier
    before = snapshot(out)
    assert_one_line_error(cli(*argv, cwd=root), pattern)
    assert snapshot(out) == before


def test_a_scalar_stop_string_is_one_string(earlier, tmp_path):
    """`model.stop_strings=abc` is the stop string "abc", not the three strings a, b, c (which
    cut every answer after a few tokens)."""
    root, out, args = earlier
    result = cli(*args, "model.stop_strings=ab", f"output_dir={tmp_path / 'r'}", cwd=root)
    assert result.code == 0, result
    (meta,) = (tmp_path / "r").rglob("meta.json")
    assert json.loads(meta.read_text())["config"]["model"]["stop_strings"] == ["ab"]
    (answers,) = (tmp_path / "r").rglob("answers.jsonl")
    (plain,) = out.rglob("answers.jsonl")
    cut, full = (json.loads(p.read_text().splitlines()[0])["choices"][0] for p in (answers, plain))
    assert "ab" not in " ".join(full["turns"]) and cut["new_tokens"] == full["new_tokens"]


@pytest.fixture(scope="module")
def short_gpt2(tiny_models, tmp_path_factory):
    """A tiny GPT-2 (learned positions: a position past the context is an IndexError) of 64 positions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config

    folder = tmp_path_factory.mktemp("gpt2")
    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_answers_are_cut_to_the_context_for_every_method_alike(short_gpt2, tmp_path):
    """max_new_tokens=60 on a 64-position model: each prompt gets what the context leaves (the
    same for every method), lookahead's window rows past the context are dropped, prompts
    longer than the context fail alone, and every answer equals the baseline's."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "r"
    args = ["run", "model=local", f"model.path={short_gpt2}", "dataset=spec_bench", f"dataset.path={questions}",
            f"output_dir={out}", "max_new_tokens=60", "warmup=0", "progress=false", "task=[qa,rag,translation]"]
    for method in ("lookahead", "jacobi", "pld"):
        result = cli(*args, f"method={method}", cwd=tmp_path)
        assert result.code == 0 and "failed" not in result.err, result
    base = {r["question_id"]: r for r in read_answers(next(out.rglob("baseline/**/answers.jsonl")))}
    assert len(base) == 3
    for answer in base.values():
        extra = answer["specbench"]
        budget = extra["max_new_tokens"][0]
        assert budget == 64 - extra["prompt_tokens"][0] < 60 and len(extra["output_ids"][0]) <= budget
    for method in ("lookahead", "jacobi", "pld"):
        records = read_answers(next(out.rglob(f"{method}/**/answers.jsonl")))
        assert {r["question_id"]: r["specbench"]["output_ids"] for r in records} == \
               {q: r["specbench"]["output_ids"] for q, r in base.items()}


@pytest.mark.parametrize("damage, pattern", [
    pytest.param('{"identity": ', r"meta.json cannot be read \(.*\); restore it, or start that run over with "
                                  r"overwrite=true", id="meta-torn"),
    pytest.param("[1]", r"meta.json is not a JSON object", id="meta-a-list"),
    pytest.param(b"\xff\xfe", r"meta.json cannot be read", id="meta-not-utf8"),
])
def test_resuming_over_a_damaged_meta_file(earlier, tmp_path, damage, pattern):
    import shutil

    root, out, args = earlier
    copy = shutil.copytree(out, tmp_path / "results")
    (meta,) = copy.rglob("meta.json")
    meta.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    before = snapshot(copy)
    assert_one_line_error(cli(*args, f"output_dir={copy}", cwd=root), pattern)
    assert snapshot(copy) == before


def test_a_full_disk_before_the_first_meta_is_one_line(earlier, tmp_path, monkeypatch):
    """The disk fills after the start's space check and before the first meta.json: one line, exit 2,
    nothing half-written (no meta, no answers)."""
    import errno

    from specbench.core import answers

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(answers, "write_atomic", full)
    root, _, args = earlier
    out = tmp_path / "r"
    assert_one_line_error(cli(*args, f"output_dir={out}", cwd=root),
                          r"cannot write .*meta.json \(No space left on device\); free some space")
    assert not [p for p in out.rglob("*") if p.is_file() and not p.name.endswith(".lock")]  # a folder's lock aside


def test_any_other_write_that_fails_is_one_line(earlier, tmp_path, monkeypatch):
    """A write no command names itself (here: the synthetic question file) on a read-only file system."""
    import errno

    from specbench.run import dataset

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(dataset, "write_atomic", read_only)
    root, _, _ = earlier
    assert_one_line_error(cli("run", f"dataset.path={tmp_path / 'q.jsonl'}", f"output_dir={tmp_path / 'r'}",
                              "progress=false", cwd=root),
                          r"cannot write .*q.jsonl \(Read-only file system\); free some space or make the folder")
