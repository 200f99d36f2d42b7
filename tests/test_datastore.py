"""REST's datastore: suffix array, longest-suffix lookup, the trie of continuations, the files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import specbench
from specbench import datastore as ds
from specbench.core.errors import SpecbenchError


def naive_suffix_array(tokens: np.ndarray) -> list[int]:
    seqs = [tokens[i:].tolist() for i in range(len(tokens))]
    return sorted(range(len(tokens)), key=lambda i: seqs[i])


def test_suffix_array_matches_a_naive_sort():
    rng = np.random.default_rng(0)
    for vocab in (3, 300, 5000):
        docs = [rng.integers(0, vocab, size=rng.integers(1, 40)).tolist() for _ in range(20)]
        tokens, _ = ds._concat(docs)
        assert ds.suffix_array(tokens).tolist() == naive_suffix_array(tokens)


class FakeTokenizer:
    """Enough of a tokenizer for the datastore: a vocabulary and a length."""

    def __init__(self, vocab: int = 100) -> None:
        self.vocab = {f"t{i}": i for i in range(vocab)}
        self.name_or_path = "fake"

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)


def test_build_and_lookup_round_trip(tmp_path):
    tok = FakeTokenizer()
    docs = [[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7, 8], [2, 3, 4, 5, 6, 1], [40, 41]]
    folder = ds.build(docs, tok, tmp_path / "store")
    manifest = json.loads((folder / ds.MANIFEST_FILE).read_text())
    assert manifest["format"] == ds.FORMAT and manifest["n_documents"] == 4 and manifest["n_tokens"] == 24
    store = ds.Datastore.load(folder, tok)
    # the longest suffix of the context that occurs: [2, 3, 4] (the 7 before it does not)
    match = store.longest_suffix([7, 2, 3, 4], max_len=8, min_len=1)
    assert match.length == 3 and match.count == 3
    conts = store.continuations(match, depth=3, max_matches=10)
    assert sorted(map(tuple, conts.tolist())) == [(5, 6, -1), (5, 6, 1), (7, 8, -1)]
    tokens, parents = ds.top_trie(conts, budget=10)
    # 5 (x2) and 7 (x1) under the root; 6 under 5; 1 under 6; 8 under 7
    assert tokens[0] == 5 and parents[0] == -1
    assert sorted(zip(tokens, parents)) == sorted([(5, -1), (7, -1), (6, 0), (8, 1), (1, 2)])
    assert ds.top_trie(conts, budget=2) == ([5, 6], [-1, 0])  # the most frequent prefixes first
    assert store.longest_suffix([99, 98], max_len=4, min_len=1) is None
    assert store.longest_suffix([6, 41], 4, 2) is None and store.longest_suffix([6, 40, 41], 4, 2).length == 2


def test_many_matches_are_sampled_evenly(tmp_path):
    tok = FakeTokenizer()
    docs = [[1, 2, i % 50 + 10] for i in range(1000)]
    store = ds.Datastore.load(ds.build(docs, tok, tmp_path / "s"), tok)
    match = store.longest_suffix([1, 2], 4, 1)
    assert match.count == 1000
    conts = store.continuations(match, depth=1, max_matches=50)
    assert len(set(conts[:, 0].tolist())) == 50  # spread over the range, not its first slice


def test_refuses_another_tokenizer_and_other_files(tmp_path):
    folder = ds.build([[1, 2, 3]], FakeTokenizer(100), tmp_path / "store")
    with pytest.raises(SpecbenchError, match="built with tokenizer"):
        ds.Datastore.load(folder, FakeTokenizer(120))
    with pytest.raises(SpecbenchError, match="not a datastore"):
        ds.Datastore.load(tmp_path, FakeTokenizer(100))
    with pytest.raises(SpecbenchError, match="outside the tokenizer"):
        ds.build([[1, 200]], FakeTokenizer(100), tmp_path / "bad")
    # rebuilding in place replaces the old one
    ds.build([[4, 5]], FakeTokenizer(100), folder)
    assert ds.Datastore.load(folder).n == 3


def test_cli_builds_from_jsonl_and_text(tiny_models, tmp_path):
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"text": "the quick brown fox jumps over the lazy dog"},
        {"messages": [{"role": "user", "content": "summarize the passage"},
                      {"role": "assistant", "content": "the fox jumps"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"turns": ["translate the sentence"], "reference": ["done"]},
    ]) + "\n")
    text = tmp_path / "notes.txt"
    text.write_text("the quick brown fox\n\nspeculative decoding drafts tokens\n")
    for source, n_docs in ((corpus, 4), (text, 2)):
        out = tmp_path / f"ds-{source.stem}"
        proc = specbench("datastore", "build", "--corpus", str(source), "--model", str(tiny_models["llama"]),
                         "--out", str(out), cwd=tmp_path, check=True)
        assert "wrote" in proc.stderr
        assert json.loads((out / ds.MANIFEST_FILE).read_text())["n_documents"] == n_docs
    proc = specbench("datastore", "build", "--corpus", str(tmp_path / "missing.jsonl"), "--model",
                     str(tiny_models["llama"]), "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_cli_builds_from_sharegpt_parquet(tiny_models, tmp_path):
    from transformers import AutoTokenizer

    chats = [[("human", "hi"), ("gpt", "hello")], [("human", "summarize the passage"), ("gpt", "the fox jumps")]]
    records = [{"id": str(i), "conversations": [{"from": f, "value": v} for f, v in chat]}
               for i, chat in enumerate(chats)]
    corpus = tmp_path / "sharegpt.parquet"
    pq.write_table(pa.Table.from_pylist(records), corpus)
    out = tmp_path / "ds"
    specbench("datastore", "build", "--corpus", str(corpus), "--model", str(tiny_models["llama"]), "--out", str(out),
              cwd=tmp_path, check=True)
    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    roles = {"human": "user", "gpt": "assistant"}
    want = []
    for chat in chats:
        text = tok.apply_chat_template([{"role": roles[f], "content": v} for f, v in chat], tokenize=False)
        want += tok.encode(text, add_special_tokens=False) + [ds.SEPARATOR]
    assert ds.Datastore.load(out, tok).tokens.tolist() == want
