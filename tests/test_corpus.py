"""The corpus reader behind REST datastores and head training: every local format, every record
shape, the zoo's corpus, and one-line errors for what it cannot read."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_tokenizer

from specbench.core.errors import SpecbenchError
from specbench.datastore import read_corpus

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

TEXT = {"text": "the quick brown fox jumps over the lazy dog"}
MESSAGES = {"messages": [{"role": "user", "content": "summarize the passage"},
                         {"role": "assistant", "content": "the fox jumps"}]}
SHAREGPT = {"id": "x1", "conversations": [{"from": "human", "value": "translate the sentence"},
                                          {"from": "gpt", "value": "done"}]}
SPEC_BENCH = {"question_id": 7, "category": "qa", "turns": ["what is the capital", "and the kingdom"],
              "reference": ["nowhere", None]}
RECORDS = [TEXT, MESSAGES, SHAREGPT, SPEC_BENCH]
#: the same records as the chats a reader must make of them (None: plain text)
CHATS = [
    None,
    MESSAGES["messages"],
    [{"role": "user", "content": "translate the sentence"}, {"role": "assistant", "content": "done"}],
    [{"role": "user", "content": "what is the capital"}, {"role": "assistant", "content": "nowhere"},
     {"role": "user", "content": "and the kingdom"}],
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def plain_tok(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory.mktemp("plain"))
    tok.chat_template = None
    return tok


def expected(tok, records=RECORDS, chats=CHATS) -> list[list[int]]:
    out = []
    for record, chat in zip(records, chats):
        if chat is None:
            text = record["text"]
        elif tok.chat_template:
            text = tok.apply_chat_template(chat, tokenize=False)
        else:
            text = "\n".join(m["content"] for m in chat)
        out.append(tok.encode(text, add_special_tokens=False))
    return out


def write(path: Path, records: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_struct_array(pa.array(records)), path)  # columns of all records
    else:
        raise AssertionError(path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_every_record_shape_in_every_record_format(tok, tmp_path, suffix):
    path = write(tmp_path / f"corpus{suffix}", RECORDS)
    assert list(read_corpus(path, tok)) == expected(tok)


def test_chats_without_a_template_are_their_texts_joined_by_newlines(plain_tok, tmp_path):
    path = write(tmp_path / "corpus.jsonl", RECORDS)
    docs = list(read_corpus(path, plain_tok))
    assert docs == expected(plain_tok)
    assert plain_tok.decode(docs[1]) == "summarize the passage\nthe fox jumps"


def test_one_sharegpt_record_per_file(tok, tmp_path):
    # Mixed files unify their columns; files of one shape (the usual case) have only their own.
    for suffix in (".json", ".parquet"):
        path = write(tmp_path / f"sharegpt{suffix}", [SHAREGPT, SHAREGPT])
        assert list(read_corpus(path, tok)) == expected(tok, [SHAREGPT] * 2, [CHATS[2]] * 2)


def test_csv_and_text_field(tok, tmp_path):
    path = tmp_path / "corpus.csv"
    rows = [{"body": "hello, said the fox", "n": 1}, {"body": 'a "quoted" dog', "n": 2}]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["body", "n"])
        writer.writeheader()
        writer.writerows(rows)
    want = [tok.encode(r["body"], add_special_tokens=False) for r in rows]
    assert list(read_corpus(path, tok, text_field="body")) == want
    with pytest.raises(SpecbenchError, match=r"row 1: a record needs 'text'"):
        list(read_corpus(path, tok))
    jsonl = write(tmp_path / "content.jsonl", [{"content": r["body"]} for r in rows])
    assert list(read_corpus(jsonl, tok, text_field="content")) == want


@pytest.mark.parametrize("name", ["notes.txt", "notes.md"])
def test_plain_text_documents_are_separated_by_blank_lines(tok, tmp_path, name):
    path = tmp_path / name
    text = "the quick brown fox\njumps over\n\n\n  \nspeculative decoding drafts\n\nlast one"
    path.write_text(text, encoding="utf-8")
    docs = ["the quick brown fox\njumps over", "speculative decoding drafts", "last one"]
    assert list(read_corpus(path, tok)) == [tok.encode(d, add_special_tokens=False) for d in docs]


def test_max_tokens_stops_after_the_document_that_reaches_it(tok, tmp_path):
    path = write(tmp_path / "corpus.jsonl", RECORDS)
    want = expected(tok)
    assert list(read_corpus(path, tok, max_tokens=1)) == want[:1]
    assert list(read_corpus(path, tok, max_tokens=len(want[0]) + 1)) == want[:2]
    assert list(read_corpus(path, tok, max_tokens=10**9)) == want


def one_line_error(call) -> str:
    with pytest.raises(SpecbenchError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_bad_record_names_the_file_the_row_and_the_shapes(tok, tmp_path):
    path = write(tmp_path / "bad.jsonl", [TEXT, {"prompt": "hi", "id": 3}])
    message = one_line_error(lambda: list(read_corpus(path, tok)))
    assert str(path) in message and "row 2" in message
    for shape in ("'text'", "'messages'", "'conversations'", "'turns'", "prompt (str)"):
        assert shape in message
    wrong_type = write(tmp_path / "wrong.jsonl", [{"conversations": [{"from": "human", "value": 5}]}])
    assert "row 1" in one_line_error(lambda: list(read_corpus(wrong_type, tok)))


def test_unreadable_inputs_are_one_line_errors(tok, tmp_path):
    assert "does not exist" in one_line_error(lambda: list(read_corpus(tmp_path / "missing.jsonl", tok)))
    assert "does not exist" in one_line_error(lambda: list(read_corpus("./nowhere/corpus", tok)))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\nnot json\n', encoding="utf-8")
    assert f"cannot read corpus file {broken}" in one_line_error(lambda: list(read_corpus(broken, tok)))
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text("hello", encoding="utf-8")
    assert "cannot read corpus file" in one_line_error(lambda: list(read_corpus(not_parquet, tok)))
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(128, 256)))
    assert "is not UTF-8 text" in one_line_error(lambda: list(read_corpus(binary, tok)))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    assert "has no text" in one_line_error(lambda: list(read_corpus(empty, tok)))
    assert "no resolver" in one_line_error(lambda: list(read_corpus("nosuchprefix:corpus", tok)))


def test_a_hub_id_offline_is_a_one_line_error(tok, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    message = one_line_error(lambda: list(read_corpus("someone/no-such-corpus", tok)))
    assert "'someone/no-such-corpus'" in message and "hub dataset id while online" in message


def test_zoo_corpus_is_the_zoos_training_conversations(tok, tmp_path, monkeypatch):
    import specbench.zoo  # noqa: F401 - registers the zoo: resolver (an entry point once installed)
    from specbench import synth
    from specbench.cli.train_head import corpus_documents
    from specbench.zoo import data as zoo_data
    from specbench.zoo.store import load_zoo_config, zoo_hash

    monkeypatch.setenv("SPECBENCH_ZOO_DIR", str(tmp_path))
    docs = list(read_corpus("zoo:corpus", tok, max_tokens=400))
    cfg = load_zoo_config()
    assert (tmp_path / f"{zoo_hash(cfg)}.corpus.jsonl").is_file()
    assert not (tmp_path / zoo_hash(cfg)).exists()  # the zoo itself was not built
    items = zoo_data.conversations(cfg, "train")[: len(docs)]
    chats = [synth.conversation_messages(it) for it in items]
    assert docs == expected(tok, items, chats)
    assert sum(map(len, docs[:-1])) < 400 <= sum(map(len, docs))
    # train-head's `corpus=zoo` is short for zoo:corpus
    assert corpus_documents("zoo", tok, 400, 64) == corpus_documents("zoo:corpus", tok, 400, 64)


def test_train_head_keeps_documents_of_two_tokens_or_more_cut_to_seq_len(tok, tmp_path):
    from specbench.cli.train_head import corpus_documents

    path = write(tmp_path / "corpus.jsonl", RECORDS)
    want = expected(tok)
    assert corpus_documents(str(path), tok, 10**9, 4) == [ids[:4] for ids in want]
    assert corpus_documents(str(path), tok, 1, 512) == want[:1]
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a\n\nb\n", encoding="utf-8")
    assert all(len(tok.encode(d, add_special_tokens=False)) == 1 for d in "ab")
    with pytest.raises(SpecbenchError, match="no document of two or more tokens"):
        corpus_documents(str(tiny), tok, 100, 512)
