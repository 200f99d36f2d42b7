"""Long inputs (`length=N`): first turns of about N tokens built from the dataset's own documents,
the run's folders and identity per length, the context check, and the report's input-length table
and figure."""

from __future__ import annotations

import json

import pytest

from helpers import cli
from specbench.core.errors import SpecbenchError
from specbench.core.longinput import HEADER, documents, lengthen, lengthen_all, parse_length
from specbench.core.questions import Question
from specbench.synth import make_questions


def words(text: str) -> int:
    return len(text.split())


def doc(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


QUESTIONS = [
    Question(1, "summarization", (f"Summarize: {doc(40, 'alpha')}",)),
    Question(2, "rag", (f"Use the passages.\nPassage 1: {doc(30, 'beta')}\nPassage 2: {doc(25, 'gamma')}\n"
                        "Question: who?",)),
    Question(3, "qa", ("What is the length of the river?",)),
    Question(4, "writing", ("Write a note.", "Now shorten it.")),
    Question(5, "summarization", (f"Summarize the article below.\n\n{doc(60, 'delta')}",)),
]


@pytest.mark.fast
def test_documents_are_the_articles_and_passages_without_their_instructions():
    found = documents(QUESTIONS)
    assert [(d.source, d.text.split()[0]) for d in found] == [(1, "alpha0"), (2, "beta0"), (2, "gamma0"),
                                                               (5, "delta0")]
    synthetic = [Question(q["question_id"], q["category"], tuple(q["turns"])) for q in make_questions(0)]
    kinds = {q.question_id: q.subtask for q in synthetic}
    material = documents(synthetic)
    assert material and {kinds[d.source] for d in material} == {"summarization", "rag"}
    assert not any(d.text.startswith("Passage") for d in material)


@pytest.mark.fast
@pytest.mark.parametrize("tokens", [30, 64, 100])
def test_a_long_input_has_about_n_tokens_and_keeps_the_question(tokens):
    question = QUESTIONS[3]
    longer = lengthen(question, documents(QUESTIONS), tokens, words)
    first = longer.turns[0]
    assert tokens - 4 <= words(first) <= tokens  # the last document cut at a word
    assert first.startswith(HEADER) and first.endswith("\n\nWrite a note.")  # the question last, unchanged
    assert longer.turns[1:] == question.turns[1:] and longer.question_id == 4 and longer.category == "writing"
    assert lengthen(question, documents(QUESTIONS), tokens, words) == longer  # the same input every run


@pytest.mark.fast
def test_a_question_never_gets_its_own_documents_and_a_long_one_is_kept():
    for tokens in (50, 90):
        listed, own = lengthen(QUESTIONS[0], documents(QUESTIONS), tokens, words).turns[0].rsplit("\n\n", 1)
        assert "alpha" not in listed and own == QUESTIONS[0].turns[0]
    assert lengthen(QUESTIONS[4], documents(QUESTIONS), 30, words) == QUESTIONS[4]  # already 60+ words


@pytest.mark.fast
def test_too_little_material_is_a_one_line_error():
    with pytest.raises(SpecbenchError, match=r"length=500: the dataset's documents give question 3 only \d+ tokens; "
                                             r"choose a smaller length"):
        lengthen_all([QUESTIONS[2]], QUESTIONS, 500, words)
    with pytest.raises(SpecbenchError, match="the dataset has no documents to build long inputs from"):
        lengthen_all([QUESTIONS[2]], [QUESTIONS[2], QUESTIONS[3]], 50, words)


@pytest.mark.fast
@pytest.mark.parametrize(("value", "expected"), [(None, None), (2048, 2048), ("2k", 2048), ("300", 300)])
def test_length_values(value, expected):
    assert parse_length(value) == expected


@pytest.mark.fast
@pytest.mark.parametrize("value", [0, -5, "two", "1.5k", True, 3.5])
def test_bad_length_values_are_refused(value):
    with pytest.raises(SpecbenchError, match="length must be a positive number of input tokens"):
        parse_length(value)


# --- a run and its report -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_runs(tiny_models, tmp_path_factory):
    """Answers of the tiny Llama (512 positions) at lengths 200 and 300 and as is: baseline and pld."""
    root = tmp_path_factory.mktemp("long")
    short = [  # QUESTIONS with short words: the tiny byte-level tokenizer makes ~2 tokens of each
        Question(1, "summarization", (f"Summarize: {doc(30, 'a')}",)),
        Question(2, "rag", (f"Use the passages.\nPassage 1: {doc(25, 'b')}\nPassage 2: {doc(20, 'c')}\nWho?",)),
        *QUESTIONS[2:4],
        Question(5, "summarization", (f"Summarize the article below.\n\n{doc(45, 'd')}",)),
    ]
    rows = [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in short]
    (root / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = root / "results"
    common = ["model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
              f"dataset.path={root / 'q.jsonl'}", f"output_dir={out}", "max_new_tokens=12", "warmup=0",
              "progress=false", "task=all", "method=pld"]
    done = {}
    for length in ("length=200", "length=300", "length=null"):
        done[length] = cli("run", length, *common, cwd=root)
        assert done[length].code == 0, done[length]
    return root, out, common, done


def test_a_long_run_writes_its_own_folders_and_stays_lossless(long_runs):
    _, out, _, done = long_runs
    line = next(x for x in done["length=300"].err.splitlines() if x.startswith("long inputs:"))
    low, high = (int(n) for n in line.split("first turns of ")[1].split(" tokens")[0].split("-"))
    assert 280 <= low <= high <= 300, line  # about N tokens of the model's own tokenizer
    assert "5 of 5 questions" in line
    for length in (200, 300):
        folder = out / "spec_bench" / "local" / "pld" / "temp-0" / f"len-{length}" / "run-1"
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["identity"]["length"] == length
        base = folder.parent.parent.parent.parent / "baseline" / "temp-0" / f"len-{length}" / "run-1"
        ours = {json.loads(x)["question_id"]: json.loads(x)["choices"][0]["turns"]
                for x in (folder / "answers.jsonl").read_text().splitlines()}
        theirs = {json.loads(x)["question_id"]: json.loads(x)["choices"][0]["turns"]
                  for x in (base / "answers.jsonl").read_text().splitlines()}
        assert ours == theirs and len(ours) == len(QUESTIONS)
    plain = out / "spec_bench" / "local" / "pld" / "temp-0" / "run-1" / "meta.json"
    assert "length" not in json.loads(plain.read_text())["identity"]  # runs without length as before


def test_report_adds_the_input_length_table_and_figure(long_runs):
    root, out, _, _ = long_runs
    done = cli("report", str(out), "--out", str(root / "board"), cwd=root)
    assert done.code == 0, done
    assert "Input lengths: spec_bench / local / temperature 0" in done.out
    table = (root / "board" / "spec_bench-local-length.md").read_text()
    header = next(x for x in table.splitlines() if x.startswith("| Method"))
    assert [c.strip() for c in header.split("|")[2:5]] == ["as is", "200 tokens", "300 tokens"]
    assert next(x for x in table.splitlines() if x.startswith("| pld ")).count("x / ") == 3
    for name in ("spec_bench-local-length.csv", "spec_bench-local-length.png", "spec_bench-local-len-200.md",
                 "spec_bench-local-len-300.md"):
        assert (root / "board" / name).is_file(), name


@pytest.mark.parametrize(("extra", "message"), [
    (["length=450"], "length=450 does not fit the context of"),
    (["length=two"], "length must be a positive number of input tokens"),
])
def test_bad_lengths_get_one_line_errors(long_runs, extra, message):
    root, _, common, _ = long_runs
    done = cli("run", *common, *extra, cwd=root)
    assert done.code != 0 and message in done.err, done
    assert len([x for x in done.err.strip().splitlines() if x.startswith("error")]) == 1
