"""Files that are not what they claim: model folders, question files, answer files and check
references, each through the command line in this process.

A bad model or question file gets exit code 2, exactly one `error:` line naming the file and the
problem, no traceback, and the answers already on disk stay byte-identical. `report` leaves an
unreadable answer file (or meta.json, or errors.jsonl) out, names it in a `warning:` line and
reports the rest (exit 0); only when nothing readable is left is that one error line.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import (
    CATS,
    assert_one_line_error,
    base_records,
    cli,
    error_lines,
    record,
    snapshot,
    write_questions,
    write_run,
)
from specbench.analysis import report
from specbench.core.questions import load_questions

pytestmark = pytest.mark.usefixtures("one_thread")


# --- model folders: run model=local model.path=DIR -------------------------------------------

def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _tensors(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _cut(path: Path, keep: Callable[[int], int]) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: keep(len(data))])


def _swap_for_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _header_not_json(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    (folder / "model.safetensors").write_bytes(data[:8] + b"{" * size + data[8 + size:])


WEIGHTS = "model.safetensors"
#: (id, what to do to a copy of the tiny Llama folder, pattern of the one error line)
MODEL_CASES = [
    ("safetensors-truncated", lambda d: _cut(d / WEIGHTS, lambda n: n // 2),
     r"model.safetensors is not a complete safetensors file \(incomplete metadata.*download or copy it again"),
    ("safetensors-cut-in-header", lambda d: _cut(d / WEIGHTS, lambda n: 5),
     r"model.safetensors is not a complete safetensors file \(.*header"),
    ("safetensors-empty", lambda d: _cut(d / WEIGHTS, lambda n: 0), r"model.safetensors is not a complete safetensors"),
    ("safetensors-garbage", lambda d: (d / WEIGHTS).write_bytes(b"\x00\x13garbage" * 400),
     r"model.safetensors is not a complete safetensors file"),
    ("safetensors-html-page", lambda d: (d / WEIGHTS).write_text("<html><body>Not Found</body></html>\n" * 20),
     r"model.safetensors is not a complete safetensors file"),
    ("safetensors-header-not-json", _header_not_json, r"model.safetensors .*invalid JSON in header"),
    ("safetensors-is-a-folder", lambda d: _swap_for_folder(d / WEIGHTS), r"model.safetensors is a folder"),
    ("weights-absent", lambda d: (d / WEIGHTS).unlink(), r"cannot load model .*\(its weights\): .*no file named"),
    ("tensor-wrong-shape",
     lambda d: _tensors(d, lambda t: t.update({"model.embed_tokens.weight": torch.zeros(320, 32)})),
     r"do not have the shape config.json implies \(e.g. model.embed_tokens.weight: \[320, 32\] in the checkpoint, "
     r"\[320, 64\] expected\)"),
    ("tensor-missing", lambda d: _tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
     r"the checkpoint lacks 1 weight\(s\) .*model.layers.1.mlp.up_proj.weight.*would be random"),
    ("config-vocab-not-the-checkpoints", lambda d: _config(d, vocab_size=100),
     r"do not have the shape config.json implies"),
    ("vocab-smaller-than-tokenizer", lambda d: (_config(d, vocab_size=100), _tensors(d, lambda t: t.update(
        {k: t[k][:100].clone() for k in ("model.embed_tokens.weight", "lm_head.weight") if k in t}))),
     r"its tokenizer makes token ids up to \d+ but its embedding has only 100 rows .*pair the model with its own"),
    ("config-fewer-heads-than-layers-say", lambda d: _config(d, num_attention_heads=3),
     r"\(its config.json\): .*hidden size \(64\) is not a multiple of the number of attention heads \(3\)"),
    ("config-not-json", lambda d: (d / "config.json").write_text("{model_type: llama"),
     r"config.json is not valid JSON \(Expecting property name .* line 1 column 2\); restore it"),
    ("config-empty", lambda d: (d / "config.json").write_text(""), r"config.json is not valid JSON"),
    ("config-a-list", lambda d: (d / "config.json").write_text("[1, 2]"),
     r"config.json holds a JSON list, not an object"),
    ("config-not-utf8", lambda d: (d / "config.json").write_bytes(b"\xff\xfe{\x00}"), r"config.json is not UTF-8 text"),
    ("config-absent", lambda d: (d / "config.json").unlink(), r"has no config.json; point model.path at"),
    ("config-is-a-folder", lambda d: _swap_for_folder(d / "config.json"), r"has no config.json"),
    ("config-no-model-type", lambda d: (d / "config.json").write_text('{"hidden_size": 64}'),
     r"\(its config.json\): .*model_type"),
    ("config-unknown-model-type", lambda d: _config(d, model_type="llama9"),
     r"\(its config.json\): .*model type `llama9`"),
    ("config-value-of-wrong-type", lambda d: _config(d, hidden_size="big"),
     r"\(its config.json\): Validation error for field 'hidden_size': .*expected int"),
    ("tokenizer-absent", lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")],
     r"has no tokenizer \(tokenizer.json, .*copy the tokenizer files"),
    ("tokenizer-not-json", lambda d: (d / "tokenizer.json").write_text('{"model": '),
     r"tokenizer.json is not valid JSON"),
    ("tokenizer-config-a-string", lambda d: (d / "tokenizer_config.json").write_text('"x"'),
     r"tokenizer_config.json holds a JSON str, not an object"),
    ("generation-config-not-json", lambda d: (d / "generation_config.json").write_text("eos=2"),
     r"generation_config.json is not valid JSON"),
    ("index-not-json", lambda d: (d / "model.safetensors.index.json").write_text("{"),
     r"model.safetensors.index.json is not valid JSON"),
]


def _with(args: list[str], key: str, value: str) -> list[str]:
    return [f"{key}={value}" if a.startswith(f"{key}=") else a for a in args]


@pytest.mark.parametrize("change, pattern", [pytest.param(*c[1:], id=c[0]) for c in MODEL_CASES])
def test_bad_model_folder(earlier, tiny_models, tmp_path, change, pattern):
    root, out, args = earlier
    folder = shutil.copytree(tiny_models["llama"], tmp_path / "model")
    change(folder)
    before = snapshot(out)
    line = assert_one_line_error(cli(*_with(args, "model.path", str(folder)), cwd=root), pattern)
    assert str(folder) in line
    assert snapshot(out) == before


def test_model_path_that_is_a_file(earlier, tiny_models, tmp_path):
    root, out, args = earlier
    before = snapshot(out)
    weights = shutil.copy(tiny_models["llama"] / WEIGHTS, tmp_path / WEIGHTS)
    assert_one_line_error(cli(*_with(args, "model.path", str(weights)), cwd=root),
                          rf"model path '{weights}' is a file, not a model folder; give the folder that holds")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli(*_with(args, "model.path", str(empty)), cwd=root), r"has no config.json")
    assert snapshot(out) == before


# --- question files: run dataset=spec_bench dataset.path=FILE --------------------------------

def _q(**changes) -> str:
    return json.dumps({"question_id": 1, "category": "qa", "turns": ["what is the capital of nowhere"], **changes})


#: (id, file content (None: a folder), pattern of the one error line: `{path}` is the file)
QUESTION_CASES = [
    ("empty", "", r"{path}: no questions in the file"),
    ("only-blank-lines", "\n  \n\n", r"{path}: no questions in the file"),
    ("not-json", "what is the capital of nowhere\n", r"{path}:1: not valid JSON \(Expecting value\)"),
    ("torn-last-line", _q() + "\n" + _q(question_id=2)[:25], r"{path}:2: not valid JSON"),
    ("a-json-list", "[1, 2]\n", r"{path}:1: expected a JSON object, got list"),
    ("missing-turns", json.dumps({"question_id": 1, "category": "qa"}) + "\n", r"{path}:1: missing field 'turns'"),
    ("missing-question-id", json.dumps({"category": "qa", "turns": ["x"]}) + "\n",
     r"{path}:1: missing field 'question_id'"),
    ("turns-a-string", _q(turns="hello") + "\n", r"{path}:1: turns must be a list of 1 or 2 strings"),
    ("turns-empty-list", _q(turns=[]) + "\n", r"{path}:1: turns must be a list of 1 or 2 strings"),
    ("three-turns", _q(turns=["a", "b", "c"]) + "\n", r"{path}:1: turns must be a list of 1 or 2 strings"),
    ("empty-turn", _q(turns=["  "]) + "\n", r"{path}:1: turn 1 is empty or not a string"),
    ("turn-a-number", _q(turns=["a", 7]) + "\n", r"{path}:1: turn 2 is empty or not a string"),
    ("duplicate-question-id", _q() + "\n" + _q(turns=["again"]) + "\n",
     r"{path}:2: duplicate question_id 1 \(first on line 1\)"),
    ("unknown-category", _q(category="poetry") + "\n", r"{path}:1: unknown category 'poetry'; known: writing"),
    ("category-not-a-string", _q(category=["qa"]) + "\n", r"{path}:1: category must be a string"),
    ("question-id-a-string", _q(question_id="1") + "\n", r"{path}:1: question_id must be an integer, got '1'"),
    ("question-id-a-bool", _q(question_id=True) + "\n", r"{path}:1: question_id must be an integer, got True"),
    ("question-id-nan", '{"question_id": NaN, "category": "qa", "turns": ["x"]}\n',
     r"{path}:1: question_id must be an integer, got nan"),
    ("reference-not-a-list", _q(reference="Paris") + "\n", r"{path}:1: reference must be a list"),
    ("binary-garbage", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", r"{path}:1: not UTF-8 text"),
    ("a-folder", None, r"question file {path} "),
]


@pytest.mark.parametrize("content, pattern", [pytest.param(*c[1:], id=c[0]) for c in QUESTION_CASES])
def test_bad_question_file(earlier, tmp_path, content, pattern):
    root, out, args = earlier
    path = tmp_path / "questions.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(out)
    assert_one_line_error(cli(*_with(args, "dataset.path", str(path)), cwd=root),
                          pattern.replace("{path}", str(path)))
    assert snapshot(out) == before


def test_question_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\ufeff" + _q() + "\n" + _q(question_id=2) + "\n", encoding="utf-8")
    assert [q.question_id for q in load_questions(path)] == [1, 2]


# --- answer files: report --------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """Answers of baseline, fast (2x) and slow (0.5x) on the same six questions, one run each."""
    root = tmp_path_factory.mktemp("answers") / "answers"
    write_run(root, "baseline", base_records())
    write_run(root, "fast", base_records(0.5))
    write_run(root, "slow", base_records(2.0))
    return root


def _run_folder(root: Path, method: str) -> Path:
    return root / "synthetic" / "tiny" / method / "temp-0" / "run-1"


def _edit(field: Callable[[dict], None], record: int = 0) -> Callable[[Path], Path]:
    """Change one record of fast's answers; returns the file that report should name."""
    def change(root: Path) -> Path:
        path = _run_folder(root, "fast") / "answers.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        field(records[record])
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path
    return change


def _choice(change: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda r: change(r["choices"][0])


def _append(name: str, text: str | bytes, method: str = "fast") -> Callable[[Path], Path]:
    def change(root: Path) -> Path:
        path = _run_folder(root, method) / name
        with path.open("ab") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode())
        return path
    return change


def _write(name: str, text: str | bytes, method: str = "fast") -> Callable[[Path], Path]:
    def change(root: Path) -> Path:
        path = _run_folder(root, method) / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path
    return change


def _shard_with_another_answer(root: Path) -> Path:
    """fast's folder holds a complete answers.jsonl and a shard that answered question 2 again, differently."""
    shard = _run_folder(root, "fast") / "shard-1-of-2"
    shard.mkdir()
    (shard / "answers.jsonl").write_text(json.dumps(record(2, "summarization", 10, 0.4, [1] * 9)) + "\n")
    return _run_folder(root, "fast")


#: (id, what to do to the `results` tree (returns the file or folder report must name), pattern of
#: the warning line). fast is left out, baseline and slow are still reported, exit code 0.
SKIPPED_CASES = [
    ("missing-wall-time", _edit(_choice(lambda c: c.pop("wall_time"))),
     r"record 1: question 0: choices\[0\] has no 'wall_time'"),
    ("missing-new-tokens", _edit(_choice(lambda c: c.pop("new_tokens"))), r"has no 'new_tokens'"),
    ("missing-choices", _edit(lambda r: r.pop("choices")), r"'choices' is missing or not a list of objects"),
    ("choices-empty", _edit(lambda r: r.update(choices=[])), r"'choices' is missing or not a list"),
    ("wall-time-zero", _edit(_choice(lambda c: c.update(wall_time=[0.0])), record=3),
     r"record 4: question 3: wall_time adds up to 0 seconds, so its tokens/s would be infinite"),
    ("wall-time-negative", _edit(_choice(lambda c: c.update(wall_time=[-0.5]))),
     r"wall_time must be seconds .*\[-0.5\]"),
    ("wall-time-nan", _edit(_choice(lambda c: c.update(wall_time=[float("nan")]))), r"wall_time must be seconds"),
    ("wall-time-text", _edit(_choice(lambda c: c.update(wall_time=["1.0"]))), r"wall_time must be seconds"),
    ("new-tokens-not-a-list", _edit(_choice(lambda c: c.update(new_tokens=10))),
     r"new_tokens must be a list with one entry per turn, got 10"),
    ("new-tokens-negative", _edit(_choice(lambda c: c.update(new_tokens=[-3]))), r"new_tokens must be token counts"),
    ("new-tokens-fraction", _edit(_choice(lambda c: c.update(new_tokens=[2.5]))), r"new_tokens must be token counts"),
    ("lengths-mismatched", _edit(_choice(lambda c: c.update(new_tokens=[10, 4]))),
     r"2 new_tokens but 1 wall_time entries"),
    ("accept-lengths-text", _edit(_choice(lambda c: c.update(accept_lengths="111"))),
     r"accept_lengths must be a list of tokens per step"),
    ("turns-mismatched", _edit(_choice(lambda c: c.update(turns=["a", "b"]))), r"turns must be a list of 1 answer"),
    ("question-id-missing", _edit(lambda r: r.pop("question_id")), r"record 1: no 'question_id'"),
    ("question-id-text", _edit(lambda r: r.update(question_id="zero")), r"question_id must be an integer, got 'zero'"),
    ("category-unknown", _edit(lambda r: r.update(category="poetry")), r"unknown category 'poetry'"),
    ("extras-not-an-object", _edit(lambda r: r.update(specbench=[1, 2])), r"question 0: specbench must be an object"),
    ("extras-sections-text", _edit(lambda r: r["specbench"].update(sections=[{"draft": "slow"}])),
     r"specbench.sections must map section names to seconds"),
    ("garbage-line", _append("answers.jsonl", "{garbage\n"), r":7: corrupt line"),
    ("binary-garbage", _write("answers.jsonl", b"\x00\xff\xfe\x89PNG\n"), r":1: corrupt line"),
    ("line-not-an-object", _append("answers.jsonl", "[1, 2]\n"), r":7: corrupt line"),
    ("meta-not-json", _write("meta.json", '{"identity": '), r"meta.json cannot be read \(.*\); restore it"),
    ("meta-a-list", _write("meta.json", "[]"), r"meta.json is not a JSON object; restore it"),
    ("meta-identity-a-string", _write("meta.json", '{"identity": "zoo:target"}'), r"meta.json: 'identity' must be"),
    ("two-different-answers", _shard_with_another_answer,
     r"question 2 has two different answers \(.*answers.jsonl and .*shard-1-of-2/answers.jsonl\)"),
]


def _report(root: Path, tmp_path: Path):
    return cli("report", str(root), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)


def report_warning(results: Path, tmp_path: Path, change: Callable, pattern: str):
    """Damage a copy of `results` with `change` (which returns the file it damaged), report it:
    exit 0, one warning naming that file and matching `pattern`, the files left as they were
    (report never repairs or rewrites answer files). Returns (report's output, the warning)."""
    root = shutil.copytree(results, tmp_path / "answers")
    named = change(root)
    before = snapshot(root)
    result = _report(root, tmp_path)
    assert result.code == 0 and "Traceback" not in result.err and not error_lines(result.err), result
    warnings = [line for line in result.err.splitlines() if line.startswith("warning:") and str(named) in line]
    assert len(warnings) == 1 and re.search(pattern, warnings[0]), result.err
    assert snapshot(root) == before
    return result.out, warnings[0]


@pytest.mark.parametrize("change, pattern", [pytest.param(*c[1:], id=c[0]) for c in SKIPPED_CASES])
def test_report_leaves_out_a_bad_answer_file(results, tmp_path, change, pattern):
    out, warning = report_warning(results, tmp_path, change, pattern)
    assert "left out of the report" in warning
    assert "| slow " in out and "| fast " not in out  # the rest is still reported


#: (id, change, pattern of the warning line): the file is named, the answers still count
NOTED_CASES = [
    ("torn-last-line", _append("answers.jsonl", '{"question_id": 9, "category": "qa", "cho'),
     r"answers.jsonl: the last line is cut short .* left out"),
    ("errors-lines-glued", _write("errors.jsonl", '{"question_id": 1, "error": "x"}{"question_id": 2, "error": "y"}\n'),
     r"errors.jsonl:1: corrupt line \(not a JSON object\); .*not excluded from the other methods' numbers"),
    ("errors-not-json", _write("errors.jsonl", "Traceback (most recent call last)\n"), r"errors.jsonl:1: corrupt"),
]


@pytest.mark.parametrize("change, pattern", [pytest.param(*c[1:], id=c[0]) for c in NOTED_CASES])
def test_report_names_a_damaged_file_and_keeps_the_answers(results, tmp_path, change, pattern):
    out, _ = report_warning(results, tmp_path, change, pattern)
    assert "| fast " in out and "2.00x" in out


def _upstream(root: Path, files: dict[str, Callable[[list[dict]], None] | None]) -> Path:
    """Upstream Spec-Bench answer files (no extras), one per name, each changed as given."""
    folder = root / "spec_bench" / "model_answer_temp0_run_1"
    folder.mkdir(parents=True)
    for name, change in files.items():
        records = base_records(1.0 if "vanilla" in name else 0.5)
        for r in records:
            r.pop("specbench")
        if change:
            change(records)
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


BASE, PLD = "vicuna-vanilla-float16-temp-0.0", "vicuna-pld-float16-temp-0.0"


def _no_wall_time(records: list[dict]) -> None:
    records[2]["choices"][0].pop("wall_time")


def _no_choices(records: list[dict]) -> None:
    records[0].pop("choices")


def _zero_time(records: list[dict]) -> None:
    records[0]["choices"][0]["wall_time"] = [0]


@pytest.mark.parametrize("files, named, pattern", [
    pytest.param({BASE: None, PLD: _no_wall_time}, PLD, r"record 3: question 2: choices\[0\] has no 'wall_time'",
                 id="upstream-missing-wall-time"),
    pytest.param({BASE: None, PLD: _no_choices, "vicuna-sps-float16-temp-0.0": None}, PLD,
                 r"record 1: question 0: 'choices' is missing", id="upstream-missing-choices"),
])
def test_report_leaves_out_a_bad_upstream_file(tmp_path, files, named, pattern):
    folder = _upstream(tmp_path / "upstream", files)
    result = _report(tmp_path / "upstream", tmp_path)
    assert result.code == 0 and "Traceback" not in result.err and not error_lines(result.err), result
    (warning,) = [line for line in result.err.splitlines() if f"{folder / named}.jsonl" in line]
    assert re.search(pattern, warning) and "left out of the report" in warning
    assert "| vicuna-pld-float16 " not in result.out and "| baseline " in result.out


#: (id, how to make the results path, pattern of the one error line): nothing to report at all
def _only_a_corrupt_baseline(root: Path) -> None:
    write_run(root, "baseline", base_records())
    (_run_folder(root, "baseline") / "answers.jsonl").write_text("{half a rec\n")


REPORT_ERRORS = [
    ("results-empty", lambda root: root.mkdir(), r"no answer files under {root}"),
    ("results-absent", lambda root: None, r"results folder {root} does not exist; run `python -m specbench run"),
    ("results-a-file", lambda root: root.write_text("x"), r"results path {root} is a file; give the folder"),
    ("only-answers-corrupt", _only_a_corrupt_baseline,
     r"no readable answer files under {root}: {root}/synthetic/tiny/baseline/temp-0/run-1/answers.jsonl:1: corrupt"),
    ("only-upstream-zero-time", lambda root: _upstream(root, {BASE: _zero_time}),
     r"no readable answer files under {root}: .*vanilla.*record 1: question 0: wall_time adds up to 0 seconds"),
    ("only-question-files", lambda root: (root.mkdir(), write_questions(root / "question.jsonl")),
     r"no answer files under {root}"),
]


@pytest.mark.parametrize("make, pattern", [pytest.param(*c[1:], id=c[0]) for c in REPORT_ERRORS])
def test_report_with_nothing_readable(tmp_path, make, pattern):
    root = tmp_path / "answers"
    make(root)
    assert_one_line_error(_report(root, tmp_path), pattern.replace("{root}", str(root)))


def test_report_without_an_upstream_baseline_says_so(tmp_path):
    _upstream(tmp_path / "upstream", {PLD: None})
    result = _report(tmp_path / "upstream", tmp_path)
    assert result.code == 1 and "Traceback" not in result.err and not error_lines(result.err), result
    assert "warning: spec_bench / upstream / temperature 0: no baseline answers" in result.err


def test_report_on_odd_layouts_and_outputs(results, tmp_path):
    root = shutil.copytree(results, tmp_path / "answers")
    odd = shutil.copytree(_run_folder(root, "fast").parent, _run_folder(root, "fast").parent.with_name("temp-warm"))
    result = _report(root, tmp_path)
    assert result.code == 0 and "Traceback" not in result.err and "| fast " in result.out, result
    assert f"warning: {odd / 'run-1'}: 'temp-warm' is not temp-<number>" in result.err
    inside = cli("report", ".", "--out", str(tmp_path / "lb"), "--no-figures", cwd=root / "synthetic" / "tiny" / "fast")
    assert inside.code == 1 and "Traceback" not in inside.err and "no baseline answers" in inside.err, inside
    (tmp_path / "taken").write_text("a file where the leaderboard folder should go")
    assert_one_line_error(cli("report", str(root), "--out", str(tmp_path / "taken"), "--no-figures", cwd=tmp_path),
                          rf"cannot write the leaderboard to {tmp_path / 'taken'} \(File exists.*choose another --out")


def test_baseline_without_tokens_gives_no_speedup_rather_than_infinity(tmp_path):
    root = tmp_path / "answers"
    base = base_records()
    base[3]["choices"][0]["new_tokens"] = [0]  # the only qa question
    write_run(root, "baseline", base)
    write_run(root, "fast", base_records(0.5))
    result = _report(root, tmp_path)
    assert result.code == 0 and "Traceback" not in result.err, result
    assert "warning: synthetic / tiny / temperature 0: the baseline generated no tokens on qa" in result.err
    fast = next(line for line in result.out.splitlines() if line.startswith("| fast "))
    assert [cell.strip() for cell in fast.split("|")][4:6] == ["2.00x", "-"] and "inf" not in result.out


# --- shards beside a run folder's own answers (merged, not "incomplete") ----------------------

def _expect_all(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta["expected_questions"] = list(range(len(CATS)))
    (folder / "meta.json").write_text(json.dumps(meta))


def test_complete_answers_beside_shards_are_merged(results, tmp_path):
    root = shutil.copytree(results, tmp_path / "answers")
    folder = _run_folder(root, "fast")
    _expect_all(folder)
    shard = folder / "shard-1-of-2"
    shard.mkdir()
    shutil.copy(folder / "meta.json", shard / "meta.json")
    lines = (folder / "answers.jsonl").read_text().splitlines(keepends=True)
    (shard / "answers.jsonl").write_text("".join(lines[::2]))  # the shard's answers, copied into answers.jsonl
    (run,) = [r for r in report.load_runs(root) if r.method == "fast"]
    assert sorted(r["question_id"] for r in run.records) == list(range(6))
    assert not any("INCOMPLETE" in p for p in run.problems)
    assert any("3 answer(s) stored twice, identically" in p for p in run.problems)
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(root))]
    fast = next(r for r in group.results if r.method == "fast")
    assert fast.rows["overall"]["questions"] == 6 and fast.rows["overall"]["speedup"] == pytest.approx(2.0)


def test_half_the_answers_beside_a_shard_of_the_rest_are_merged(results, tmp_path):
    root = shutil.copytree(results, tmp_path / "answers")
    folder = _run_folder(root, "fast")
    _expect_all(folder)
    lines = (folder / "answers.jsonl").read_text().splitlines(keepends=True)
    (folder / "answers.jsonl").write_text("".join(lines[:3]))
    shard = folder / "shard-2-of-2"
    shard.mkdir()
    (shard / "answers.jsonl").write_text("".join(lines[3:]))
    (run,) = [r for r in report.load_runs(root) if r.method == "fast"]
    assert sorted(r["question_id"] for r in run.records) == list(range(6)) and not run.problems
    (folder / "answers.jsonl").write_text("".join(lines[:2]))
    (run,) = [r for r in report.load_runs(root) if r.method == "fast"]
    assert any("INCOMPLETE, 1 of 6" in p for p in run.problems)


# --- check references (presentation/check.py) ---------------------------------------------------

@pytest.fixture(scope="module")
def reference(results, tmp_path_factory) -> tuple[Path, Path, str]:
    """A reference written by `check --update` from `results`, and its text."""
    ref = tmp_path_factory.mktemp("reference")
    done = cli("check", "--results", str(results), "--reference", str(ref), "--update", cwd=ref)
    assert done.code == 0, done
    path = ref / "synthetic-tiny.json"
    return ref, path, path.read_text()


def _ref_edit(change: Callable[[dict], None]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        ref = json.loads(text)
        change(ref)
        return json.dumps(ref)
    return edit


#: (id, the reference file's new text from the good one (None: a folder), pattern of the one error line)
CHECK_CASES = [
    ("not-json", lambda t: "{half", r"reference .*synthetic-tiny.json cannot be read \(Expecting"),
    ("empty", lambda t: "", r"reference .*synthetic-tiny.json cannot be read"),
    ("a-csv-table", lambda t: "method,speedup\nfast,2.0\n", r"synthetic-tiny.json cannot be read"),
    ("binary", lambda t: b"\xff\xfe\x00\x01", r"synthetic-tiny.json cannot be read"),
    ("a-json-list", lambda t: "[]", r"synthetic-tiny.json has no 'methods' table"),
    ("no-methods", _ref_edit(lambda r: r.pop("methods")), r"has no 'methods' table"),
    ("methods-a-list", _ref_edit(lambda r: r.update(methods=["fast"])), r"has no 'methods' table"),
    ("method-not-a-table", _ref_edit(lambda r: r["methods"].update(fast="2x")), r"method fast is not a table"),
    ("speedup-missing", _ref_edit(lambda r: r["methods"]["fast"]["overall"].pop("speedup")),
     r"fast / overall lacks a finite speedup"),
    ("speedup-text", _ref_edit(lambda r: r["methods"]["fast"]["qa"].update(speedup="2x")),
     r"fast / qa lacks a finite speedup"),
    ("noise-null", _ref_edit(lambda r: r["methods"]["fast"]["overall"].update(noise=None)), r"lacks a finite"),
    ("accepted-nan", _ref_edit(lambda r: r["methods"]["fast"]["rag"].update(mean_accepted=float("nan"))),
     r"fast / rag lacks a finite"),
    ("a-folder", None, r"synthetic-tiny.json cannot be read"),
    ("speedup-zero", _ref_edit(lambda r: r["methods"]["fast"]["overall"].update(speedup=0)),
     r"fast / overall lacks a finite speedup \(> 0\)"),
    ("methods-empty", _ref_edit(lambda r: r.update(methods={})), r"synthetic-tiny.json checks nothing"),
    ("baseline-only", _ref_edit(lambda r: r.update(methods={"baseline": r["methods"]["baseline"]})),
     r"checks nothing \(no method besides the baseline has a row\)"),
    ("method-without-rows", _ref_edit(lambda r: r.update(methods={"fast": {}})), r"checks nothing"),
]


@pytest.mark.parametrize("edit, pattern", [pytest.param(*c[1:], id=c[0]) if type(c) is tuple else c
                                           for c in CHECK_CASES])
def test_bad_check_reference(results, reference, tmp_path, edit, pattern):
    ref, path, good = reference
    folder = shutil.copytree(ref, tmp_path / "ref")
    target = folder / path.name
    if edit is None:
        target.unlink()
        target.mkdir()
    else:
        text = edit(good)
        target.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = snapshot(results)
    assert_one_line_error(cli("check", "--results", str(results), "--reference", str(folder), cwd=tmp_path), pattern)
    assert snapshot(results) == before


def test_check_update_where_it_cannot_write_is_one_line(results, tmp_path):
    """A reference folder that cannot be made (a file in its way; a read-only folder fails the same
    way for a user who is not root) is one line naming the file, and nothing is left half-written."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    line = assert_one_line_error(cli("check", "--results", str(results), "--reference", str(blocker / "ref"),
                                     "--update", cwd=tmp_path), r"cannot write reference .*synthetic-tiny.json")
    assert "--reference" in line and blocker.read_text() == "not a folder"


def test_check_names_an_unreadable_answer_file(results, reference, tmp_path):
    ref, _, _ = reference
    root = shutil.copytree(results, tmp_path / "answers")
    (_run_folder(root, "fast") / "answers.jsonl").write_text("{garbage\n")
    result = cli("check", "--results", str(root), "--reference", str(ref), cwd=tmp_path)
    assert result.code == 1 and "MISSING" in result.out
    assert str(_run_folder(root, "fast") / "answers.jsonl") in result.err
