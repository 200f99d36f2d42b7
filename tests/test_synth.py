"""Tests for the synthetic Spec-Bench-style benchmark generator (specbench.synth)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import import_graph
from specbench import synth
from specbench.synth.benchmark import GENERATORS
from specbench.synth.mt_bench import GENERATORS as MT_BENCH_GENERATORS

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

EQUATION = re.compile(r"(\d+(?: [-+*/] \d+)+) = (\d+)")
WORD = re.compile(r"[A-Za-z]+")


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    return synth.make_questions(0)


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return list(synth.make_corpus(3000))


def _by_category(questions: list[dict], category: str) -> list[dict]:
    return [q for q in questions if q["category"] == category]


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def _copy_rate(prompt: str, answer: str, n: int = 4) -> float:
    """Fraction of the answer's word n-grams that also occur in the prompt."""
    have = set(_ngrams(prompt.split(), n))
    grams = _ngrams(answer.split(), n)
    return sum(g in have for g in grams) / len(grams)


def test_public_constants() -> None:
    assert synth.SUBTASKS == ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
    assert synth.MT_BENCH_CATEGORIES == (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
    )
    assert isinstance(synth.GENERATOR_VERSION, str) and synth.GENERATOR_VERSION
    assert [name for name in synth.__all__ if not hasattr(synth, name)] == []


def test_every_category_has_a_generator() -> None:
    assert list(GENERATORS) == list(synth.CATEGORIES)
    assert list(MT_BENCH_GENERATORS) == list(synth.MT_BENCH_CATEGORIES)


def test_package_imports_only_core_and_itself() -> None:
    """synth is a leaf: from the rest of specbench it may use the shared basics (core) only."""
    graph = import_graph()
    modules = [m for m in graph if m.split(".")[:2] == ["specbench", "synth"]]
    assert "specbench.synth.mt_bench.coding" in modules
    wrong = [f"{m} -> {t}" for m in modules for t in graph[m] if t.split(".")[1] not in ("core", "synth")]
    assert not wrong, wrong


def test_question_schema_and_counts(questions: list[dict]) -> None:
    assert len(questions) == 480
    ids = [q["question_id"] for q in questions]
    assert all(type(i) is int for i in ids)
    assert ids == sorted(set(ids))
    expected = list(synth.MT_BENCH_CATEGORIES) + list(synth.SUBTASKS[1:])
    # Categories come in blocks, in the official order.
    assert [k for k, _ in itertools.groupby(q["category"] for q in questions)] == expected
    counts = collections.Counter(q["category"] for q in questions)
    for category in synth.MT_BENCH_CATEGORIES:
        assert counts[category] == 10
    for subtask in synth.SUBTASKS[1:]:
        assert counts[subtask] == 80
    for q in questions:
        assert list(q) == ["question_id", "category", "turns", "reference"]
        n = 2 if q["category"] in synth.MT_BENCH_CATEGORIES else 1
        assert len(q["turns"]) == n and len(q["reference"]) == n
        for text in q["turns"] + q["reference"]:
            assert isinstance(text, str) and text.strip()
    first_turns = [q["turns"][0] for q in questions]
    assert len(set(first_turns)) == len(first_turns)


def test_make_questions_is_deterministic_and_seed_dependent(questions: list[dict]) -> None:
    assert synth.make_questions(0) == questions
    other = synth.make_questions(1)
    assert len(other) == 480
    assert [q["category"] for q in other] == [q["category"] for q in questions]
    same = sum(a["turns"] == b["turns"] for a, b in zip(questions, other))
    assert same < 10, f"{same} of 480 questions identical across seeds"


def test_make_questions_returns_fresh_objects() -> None:
    first = synth.make_questions(0)
    first[0]["turns"].append("mutated")
    assert synth.make_questions(0)[0]["turns"] != first[0]["turns"]


def test_write_questions_byte_identical(tmp_path: pathlib.Path, questions: list[dict]) -> None:
    a = synth.write_questions(tmp_path / "one" / "nested" / "question.jsonl")
    b = synth.write_questions(str(tmp_path / "two" / "question.jsonl"))
    assert isinstance(a, pathlib.Path) and a.exists()
    data = a.read_bytes()
    assert data == b.read_bytes()
    assert data.endswith(b"\n") and b"\r" not in data
    lines = data.decode("utf-8").split("\n")[:-1]
    assert [json.loads(line) for line in lines] == questions
    assert lines[0] == json.dumps(questions[0], ensure_ascii=False)
    assert not [p for p in a.parent.iterdir() if p.name != "question.jsonl"], "temp file left behind"
    # Overwriting an existing file works and gives the same bytes.
    synth.write_questions(a)
    assert a.read_bytes() == data


@pytest.mark.parametrize("hash_seed", ["1", "4242"])
def test_write_questions_independent_of_hash_seed(tmp_path: pathlib.Path, hash_seed: str) -> None:
    here = synth.write_questions(tmp_path / "here.jsonl").read_bytes()
    root = pathlib.Path(synth.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONHASHSEED=hash_seed,
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "there.jsonl"
    code = "import sys; from specbench.synth import write_questions; write_questions(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env, cwd=root)
    assert out.read_bytes() == here


def test_conversation_messages(questions: list[dict]) -> None:
    q = _by_category(questions, "writing")[0]
    msgs = synth.conversation_messages(q)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in msgs] == [q["turns"][0], q["reference"][0], q["turns"][1], q["reference"][1]]
    single = synth.conversation_messages(_by_category(questions, "qa")[0])
    assert len(single) == 2 and single[0]["role"] == "user"


def test_second_turns_refer_back(questions: list[dict]) -> None:
    """Each turn-2 message names something (a person, a town, a number...) from turn 1."""
    for q in questions:
        if q["category"] not in synth.MT_BENCH_CATEGORIES:
            continue
        first = set(WORD.findall(q["turns"][0]) + re.findall(r"\d+", q["turns"][0]))
        specific = [w for w in WORD.findall(q["turns"][1]) if w[0].isupper() and w in first]
        specific += [n for n in re.findall(r"\d+", q["turns"][1]) if n in first]
        specific += [w for w in re.findall(r"\w+", q["turns"][1]) if "_" in w and w in q["turns"][0]]
        assert specific, q["turns"]


def test_corpus_is_disjoint_from_questions(questions: list[dict], corpus: list[dict]) -> None:
    assert len(corpus) == 3000
    q_turns = sorted({t for q in questions for t in q["turns"]})
    for item in corpus:
        for turn in item["turns"]:
            for q in q_turns:
                assert q not in turn, (q, turn)


def test_corpus_schema_and_mixture(corpus: list[dict]) -> None:
    counts = collections.Counter(c["category"] for c in corpus)
    assert set(counts) == set(synth.CATEGORIES)
    for subtask in synth.SUBTASKS[1:]:
        assert counts[subtask] >= 0.08 * len(corpus), counts
    mt = sum(counts[c] for c in synth.MT_BENCH_CATEGORIES)
    assert 0.1 * len(corpus) <= mt <= 0.35 * len(corpus)
    for i, c in enumerate(corpus):
        assert list(c) == ["question_id", "category", "turns", "reference"]
        assert c["question_id"] == i
        assert len(c["turns"]) == len(c["reference"]) >= 1
        assert all(t.strip() for t in c["turns"] + c["reference"])


def test_corpus_is_deterministic_and_lazy(corpus: list[dict]) -> None:
    assert list(synth.make_corpus(200)) == corpus[:200]
    assert list(synth.make_corpus(0)) == []
    gen = synth.make_corpus(10**9)
    assert next(gen) == corpus[0]
    other = list(synth.make_corpus(200, seed=2))
    assert sum(a == b for a, b in zip(other, corpus)) < 50


def test_corpus_states_the_facts_asked_about(questions: list[dict], corpus: list[dict]) -> None:
    """The fact answering each qa question appears verbatim in some corpus answer."""
    text = "\n".join(r for c in corpus for r in c["reference"])
    for q in _by_category(questions, "qa"):
        fact = q["reference"][0].split(". ")[0].rstrip(".") + "."
        assert fact in text, (q["turns"][0], fact)


def test_qa_answers_restate_entities(questions: list[dict]) -> None:
    for q in _by_category(questions, "qa"):
        names = [w for w in WORD.findall(q["turns"][0])[1:] if w[0].isupper()]
        assert names, q["turns"][0]
        assert all(n in q["reference"][0] for n in names), q
        assert 10 <= len(q["reference"][0].split()) <= 60


def test_translation_is_deterministic_and_not_copied(questions: list[dict]) -> None:
    overlap = total = 0
    for q in _by_category(questions, "translation"):
        prompt = q["turns"][0]
        assert "Velari" in prompt
        english = prompt.split(": ", 1)[1]
        assert synth.translate_to_velari(english) == q["reference"][0]
        prompt_words = {w.lower() for w in WORD.findall(prompt)}
        answer_words = [w.lower() for w in WORD.findall(q["reference"][0])]
        hits = sum(w in prompt_words for w in answer_words)
        assert hits / len(answer_words) < 0.35, q  # only names may be shared
        overlap += hits
        total += len(answer_words)
    assert overlap / total < 0.1


def test_translation_grammar() -> None:
    assert synth.translate_to_velari("The old baker carried three red baskets to the market yesterday.") == (
        synth.translate_to_velari("The old baker carried three red baskets to the market yesterday.")
    )
    past = synth.translate_to_velari("Mira carried a basket.").split()
    present = synth.translate_to_velari("Mira carries a basket.").split()
    assert past[0] == present[0] == "Mira"
    assert past[-1] != present[-1] and past[-1].rstrip(".").startswith(present[-1].rstrip("."))
    one = synth.translate_to_velari("Mira sold the basket.").split()
    many = synth.translate_to_velari("Mira sold the baskets.").split()
    assert many[1] != one[1] and many[1].startswith(one[1])
    # Articles are dropped, the verb comes last.
    assert len(synth.translate_to_velari("The baker found a key.").split()) == 3
    with pytest.raises((KeyError, ValueError, IndexError)):
        synth.translate_to_velari("The baker quantum the key.")


@pytest.mark.parametrize("category", ["summarization", "rag"])
def test_copy_heavy_answers(questions: list[dict], category: str) -> None:
    rates = [_copy_rate(q["turns"][0], q["reference"][0]) for q in _by_category(questions, category)]
    assert min(rates) >= 0.6, min(rates)
    assert sum(rates) / len(rates) >= 0.7


def test_copy_rates_differ_by_subtask(questions: list[dict]) -> None:
    def mean_rate(category: str) -> float:
        items = _by_category(questions, category)
        return sum(_copy_rate(q["turns"][0], q["reference"][0]) for q in items) / len(items)

    assert mean_rate("translation") == 0.0
    assert mean_rate("summarization") > mean_rate("qa")
    assert mean_rate("rag") > mean_rate("math_reasoning")


def test_prompt_and_answer_lengths(questions: list[dict]) -> None:
    for category in ("summarization", "rag"):
        for q in _by_category(questions, category):
            assert 100 <= len(q["turns"][0].split()) <= 300
    for q in _by_category(questions, "summarization"):
        passage = q["turns"][0].split("\n\n", 1)[1]
        assert 5 <= passage.count(". ") + 1 <= 12
    for q in _by_category(questions, "rag"):
        assert 3 <= len(re.findall(r"^Passage \d+: ", q["turns"][0], re.M)) <= 5
        assert q["reference"][0].startswith("According to passage ")
    answers = [len(r.split()) for q in questions if q["category"] != "translation" for r in q["reference"]]
    assert sum(20 <= n <= 120 for n in answers) / len(answers) > 0.8


def test_arithmetic_is_correct(questions: list[dict]) -> None:
    checked = 0
    for q in questions:
        for ref in q["reference"]:
            for lhs, rhs in EQUATION.findall(ref):
                a, op, b = lhs.split()  # one binary operation per equation
                a, b = int(a), int(b)
                value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
                assert value == int(rhs), (lhs, rhs, ref)
                checked += 1
    assert checked > 250
    for q in _by_category(questions, "math_reasoning"):
        ref = q["reference"][0]
        eqs = EQUATION.findall(ref)
        assert 2 <= len(eqs) <= 4, ref
        match = re.search(r"The answer is (\d+)\.$", ref)
        assert match and match.group(1) == eqs[-1][1], ref


def test_corpus_arithmetic_is_correct(corpus: list[dict]) -> None:
    for c in corpus:
        for ref in c["reference"]:
            for lhs, rhs in EQUATION.findall(ref):
                a, op, b = lhs.split()
                value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                         "/": int(a) / int(b)}[op]
                assert value == int(rhs), ref
