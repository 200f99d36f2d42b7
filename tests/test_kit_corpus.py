"""A kit's corpus (specbench.kit.corpus): generation that keeps the target's top-k, shards of every
prompt kind built on the target's own first answers, a build that resumes shard by shard, shards
committed to the repository and their top-k recomputed, and no prompt taken from the benchmark."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import OFFICIAL
from specbench.core.errors import SpecbenchError
from specbench.core.resources import CACHE_VAR
from specbench.kit import build as kit_build
from specbench.kit import corpus as kc
from specbench.kit import load_kit
from specbench.kit.generate import Generated, Sampling, generate
from specbench.models import load_model

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("one_thread")]

SMALL = {"shards": 3, "seed": 5, "max_new_tokens": 24, "turn_tokens": 12, "sampled": 0.5,
         "temperatures": [0.7, 1.0], "top_p": 0.95, "topk": 4, "batch_size": 4,
         "per_shard": {"instruct": 3, "hinted": 3, "math": 2, "foreign": 2, "summarize": 2, "rag": 2,
                       "translate": 2, "second": 2}}


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def test_batched_greedy_rows_equal_each_row_alone_and_keep_the_targets_topk(tiny):
    tok, model = tiny.tokenizer, tiny.model
    prompts = [ids_of(tok, t) for t in ("the quick brown", "tom has 3 boxes with 12 apples", "summarize")]
    end = {tok.eos_token_id}
    made = generate(model, prompts, [Sampling()] * 3, max_new_tokens=12, end_ids=end, pad_id=tok.pad_token_id,
                    topk=5, seed=0, batch_size=3)
    for prompt, res in zip(prompts, made, strict=True):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert res.ids == alone[:len(res.ids)]
        assert res.ended == (res.ids[-1] in end)
        assert res.topk_ids.shape == res.topk_logp.shape == (len(res.ids), 5)
        assert res.topk_ids[:, 0].tolist() == res.ids  # greedy: each token is the target's top-1
    # the same top-k as one teacher-forced forward over prompt + answer (what another machine recomputes)
    rows = [{"prompt_ids": p, "answer_ids": r.ids, "ended": r.ended} for p, r in zip(prompts, made, strict=True)]
    forced = kc.teacher_topk(model, rows, 5)
    for res, again in zip(made, forced, strict=True):
        assert torch.equal(res.topk_ids[:, 0], again.topk_ids[:, 0])
        assert torch.allclose(res.topk_logp.float(), again.topk_logp.float(), atol=2e-2)


def test_sampling_is_seeded_and_a_vanishing_top_p_is_greedy(tiny):
    tok, model = tiny.tokenizer, tiny.model
    prompts = [ids_of(tok, "the quick brown")] * 4
    kw = dict(max_new_tokens=16, end_ids={tok.eos_token_id}, pad_id=tok.pad_token_id, topk=0, batch_size=4)
    hot = [Sampling(1.5, 1.0)] * 4
    first = [r.ids for r in generate(tiny.model, prompts, hot, seed=3, **kw)]
    assert first == [r.ids for r in generate(model, prompts, hot, seed=3, **kw)]
    assert len({tuple(x) for x in first}) > 1  # four draws at temperature 1.5 on a random model differ
    greedy = [r.ids for r in generate(model, prompts, [Sampling()] * 4, seed=3, **kw)]
    assert [r.ids for r in generate(model, prompts, [Sampling(1.0, 1e-9)] * 4, seed=9, **kw)] == greedy


class Scripted:
    """Stands in for `generate`: user turns that end (questions every other one), long first answers
    (German for `foreign` rows), short second answers; records every prompt it is given."""

    def __init__(self, tok, fail_on: int | None = None):
        self.tok, self.fail_on, self.calls, self.prompts = tok, fail_on, 0, []

    def __call__(self, model, prompts, modes, *, max_new_tokens, end_ids, pad_id, topk, seed, batch_size,
                 desc="", progress=None):
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise KeyboardInterrupt
        out = []
        end = min(end_ids)
        for p in prompts:
            text = self.tok.decode(p)
            self.prompts.append(text)
            if "first" not in desc and "second answers" not in desc:  # a user turn
                body = f" turn {len(self.prompts)} about the fox" + ("?" if len(self.prompts) % 2 else ".")
            elif "English" not in text and any(language in text for language in kc.LANGUAGES):
                body = "Das ist der Fuchs. Er springt über den Hund. Der Hund schläft."
            else:
                body = f"answer {len(self.prompts)}: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
            ids = self.tok(body, add_special_tokens=False).input_ids[:max_new_tokens - 1] + [end]
            k = max(topk, 1)
            out.append(Generated(ids, True, torch.zeros(len(ids), k, dtype=torch.int32),
                                 torch.zeros(len(ids), k, dtype=torch.float16)))
        return out


def small_settings(**changes) -> kc.CorpusSettings:
    return kc.CorpusSettings.of({**SMALL, "max_new_tokens": 400, "turn_tokens": 60, **changes})


def test_a_shard_holds_every_kind_built_on_the_targets_first_answers(tiny, monkeypatch, tmp_path):
    script = Scripted(tiny.tokenizer)
    monkeypatch.setattr(kc, "generate", script)
    maker = kc.ShardMaker(small_settings(), tiny.model, tiny.tokenizer, {tiny.tokenizer.eos_token_id})
    place = kc.ShardPlace(tmp_path / "cache", None)
    card = kc.build_shard(maker, place, 0, torch.float32)
    rows = kc.read_rows(place.rows_file(0))
    assert card["kinds"] == SMALL["per_shard"] and card["rows"] == len(rows)
    by = {kind: [r for r in rows if r["kind"] == kind] for kind in kc.KINDS}
    first = {tiny.tokenizer.decode(r["answer_ids"], skip_special_tokens=True).strip()
             for r in by["instruct"] + by["hinted"] + by["math"]}
    assert all(any(a in r["turns"][0] for a in first) for r in by["summarize"])
    questions = [r["turns"][0] for r in by["instruct"] + by["hinted"] if r["turns"][0].endswith("?")]
    for r in by["rag"]:
        assert any(q in r["turns"][0] for q in questions) and "lazy dog" in r["turns"][0]
    assert all("Das ist der Fuchs." in r["turns"][0] and "English" in r["turns"][0] for r in by["translate"])
    assert all(any(m in r["turns"][0] for m in ("packs", "shop", "pages", "train", "spends", "farmer", "costs",
                                                 "years")) for r in by["math"])
    for r in by["second"]:  # a second turn sees the first exchange, as the benchmark's multi-turn rows do
        assert len(r["turns"]) == 2 and len(r["context"]) == 1 and r["context"][0] in first
        assert r["prompt_ids"] == ids_of(tiny.tokenizer, tiny.tokenizer.apply_chat_template(
            [{"role": "user", "content": r["turns"][0]}, {"role": "assistant", "content": r["context"][0]},
             {"role": "user", "content": r["turns"][1]}], add_generation_prompt=True, tokenize=False))
    hinted = [r["turns"][0] for r in by["hinted"]]
    assert all(any(t.startswith(o) for o in kc.OPENERS) for t in hinted)
    ids, logp = kc.read_topk(place, 0)
    assert ids.shape[0] == logp.shape[0] == card["answer_tokens"] == sum(len(r["answer_ids"]) for r in rows)
    # a shard is a function of the settings, its number and the target: made again, the same bytes
    again = kc.ShardPlace(tmp_path / "again", None)
    monkeypatch.setattr(kc, "generate", Scripted(tiny.tokenizer))
    kc.build_shard(kc.ShardMaker(small_settings(), tiny.model, tiny.tokenizer, {tiny.tokenizer.eos_token_id}),
                   again, 0, torch.float32)
    assert again.rows_file(0).read_bytes() == place.rows_file(0).read_bytes()


def test_foreign_answers_that_read_as_english_are_no_translation_source():
    assert not kc.looks_english("Das ist eine wichtige Stadt, die im Norden liegt.")
    assert not kc.looks_english("Le chat dort sur la table de la cuisine.")
    assert kc.looks_english('In German, "DW" is a term used to describe the profession of working from home.')


@pytest.fixture()
def kit(tiny, monkeypatch, tmp_path):
    """The smollm2 kit with a small corpus on the tiny target, its cache and corpora/ in tmp_path."""
    from omegaconf import OmegaConf

    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(kit_build.CORPORA_VAR, str(tmp_path / "corpora"))
    monkeypatch.setattr(kit_build, "target_id", lambda kit: "tinytarget00")
    monkeypatch.setattr(kit_build, "_load_target", lambda kit, dtype: tiny)
    import specbench.kit

    cfg = load_kit("smollm2")
    cfg.build.corpus = OmegaConf.create(SMALL)
    monkeypatch.setattr(specbench.kit, "load_kit", lambda name: cfg)  # what `kit corpus smollm2` reads
    return cfg


def test_an_interrupted_corpus_build_keeps_its_finished_shards_and_resumes_there(kit, tiny, monkeypatch):
    # four generate calls a shard (user turns, first answers, second turns, second answers): stopped
    # in the second shard's first answers
    script = Scripted(tiny.tokenizer, fail_on=6)
    monkeypatch.setattr(kc, "generate", script)
    with pytest.raises(KeyboardInterrupt):
        kit_build.build_shards(kit)
    settings, place = kit_build.corpus_place(kit)
    assert kc.missing(place, settings.shards) == [1, 2]
    assert not list(place.cache.glob("shard-00001*"))  # nothing of the stopped shard looks finished
    first = place.rows_file(0).read_bytes()
    monkeypatch.setattr(kc, "generate", Scripted(tiny.tokenizer))
    cards = kit_build.build_shards(kit)
    assert [c["shard"] for c in cards] == [1, 2] and place.rows_file(0).read_bytes() == first
    assert kit_build.build_shards(kit) == []  # nothing left to make


def test_committed_shards_are_used_and_their_topk_recomputed_once(kit, tiny, capsys):
    from specbench.kit.cli import kit_main

    assert kit_main(["corpus", "smollm2", "--shards", "0-1"]) == 0
    assert "2 of 3 shards made; missing 2-2" in capsys.readouterr().out
    assert kit_main(["corpus", "smollm2", "--commit"]) == 0  # copies, makes nothing
    out = capsys.readouterr().out
    assert "2 shard(s) copied" in out and "2 of 3 shards made; missing 2-2" in out
    settings, place = kit_build.corpus_place(kit)
    made = {i: kc.read_topk(place, i) for i in (0, 1)}
    rows = kc.read_rows(place.rows_file(0))
    for path in place.cache.iterdir():  # another machine: the repository's shards only
        path.unlink()
    assert place.card(0).parent == place.committed and kc.read_rows(place.rows_file(0)) == rows
    assert not (place.committed / "shard-00000.topk.safetensors").exists()  # top-k is never committed
    kc.ensure_topk(place, 0, lambda: tiny.model, settings.topk)
    ids, logp = kc.read_topk(place, 0)
    assert torch.equal(ids[:, 0], made[0][0][:, 0]) and torch.allclose(logp.float(), made[0][1].float(), atol=2e-2)
    # the whole corpus: the committed shards reused, the missing one made, one rows file with held-out marks
    folder = kit_build.ensure_group(kit, "corpus")
    card = json.loads((folder / kit_build.CARD).read_text())
    assert card["from_repository"] == 2 and card["shards"] == 3
    rows = kit_build.read_corpus(folder)
    assert len(rows) == card["rows"] and {r["shard"] for r in rows} == {0, 1, 2}
    train, held = kit_build.split_rows(kit, rows)
    assert len(train) + len(held) == len(rows)
    assert all(r["heldout"] == kc.heldout(r["shard"], r["row"], float(kit.build.heldout_fraction)) for r in rows)


def test_the_held_out_rows_stay_held_out_as_shards_are_added():
    marks = [kc.heldout(s, r, 0.05) for s in range(20) for r in range(300)]
    assert 0.04 < sum(marks) / len(marks) < 0.06
    assert marks == [kc.heldout(s, r, 0.05) for s in range(20) for r in range(300)]


def test_corpus_shard_ranges_are_checked_in_one_line(kit):
    from specbench.kit.cli import kit_main

    for bad, says in (("x-2", "takes A-B"), ("2-9", "has shards 0-2")):
        with pytest.raises(SpecbenchError, match=says):
            kit_main(["corpus", "smollm2", "--shards", bad])


def normalized(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def committed_rows() -> list[dict]:
    root = kit_build.corpora_root()
    files = sorted(root.rglob("shard-*.jsonl.gz")) if root is not None and root.is_dir() else []
    return [row for path in files for row in kc.read_rows(path)]


def test_no_committed_corpus_prompt_holds_a_benchmark_question():
    if not OFFICIAL.is_file():
        pytest.skip(f"the official question file is not here ({OFFICIAL})")
    rows = committed_rows()
    if not rows:
        pytest.skip("no corpus shards committed yet")
    questions = {normalized(t) for line in OFFICIAL.read_text().splitlines() if line.strip()
                 for t in json.loads(line)["turns"]}
    by_start: dict[tuple[str, ...], list[str]] = {}
    for q in questions:
        words = q.split()
        if len(words) >= 4:  # shorter turns ("translate ...") are no question of their own
            by_start.setdefault(tuple(words[:4]), []).append(q)
    hits = []
    for text in (normalized(t) for r in rows for t in r["turns"]):
        words = text.split()
        starts = {tuple(words[i:i + 4]) for i in range(len(words) - 3)} & by_start.keys()
        if any(q in text for key in starts for q in by_start[key]):
            hits.append(text)
    assert not hits, f"{len(hits)} corpus turn(s) hold a benchmark question, e.g. {hits[0][:120]!r}"
