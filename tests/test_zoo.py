"""The embedded model zoo: the built zoo (floors, loading, template, corpus) and build safety.

The `zoo_dir` fixture builds the real zoo once (minutes) and caches it in the default cache
folder, so later runs and CI reuse it. Speed numbers of the card are wall-clock: they are
printed and saved by the build, never asserted here.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from specbench import synth
from specbench.zoo import build as zoo_build
from specbench.zoo import data as zoo_data
from specbench.zoo import ensure_zoo, is_complete, load_zoo_config, zoo_hash, zoo_main, zoo_root
from specbench.zoo.store import ENV_VAR

MODELS = ("target", "draft", "draft_plain")
# The floors, written here rather than read from the config so that loosening the
# config cannot loosen the test.
#: The zoo trains under bf16 autocast where the CPU has bf16 units, so its weights differ from one CPU type to
#: another. Two builds of this config measured eos_fraction 1.000 (the machine behind the README's card) and
#: 0.875 (AMD EPYC with avx512_bf16, 2026-12-02: 10 of 80 card answers ran to 256 tokens); target accuracy
#: 0.727 / 0.724, draft agreement 0.675 / 0.683. The EOS floor sits below that measured spread (configs/zoo.yaml
#: still prints 0.9 in the card: changing it would change the zoo's hash and rebuild every cached zoo).
FLOORS = {"target_accuracy": 0.6, "draft_agreement": 0.5, "eos_fraction": 0.85}

# A throwaway zoo that builds in seconds: tiny corpus, tokenizer and models, short card.
TINY = [
    "corpus.n_train=120", "corpus.n_heldout=12", "tokenizer.vocab_size=300",
    "target.arch.hidden_size=32", "target.arch.intermediate_size=64", "target.arch.num_hidden_layers=1",
    "target.arch.num_attention_heads=1", "target.arch.num_key_value_heads=1",
    "draft.arch.hidden_size=16", "draft.arch.intermediate_size=32", "draft.arch.num_hidden_layers=1",
    "draft.arch.num_attention_heads=1", "draft.arch.num_key_value_heads=1",
    "target.train.epochs=0.3", "draft.train.epochs=0.3", "draft_plain.train.epochs=0.3",
    "target.train.warmup_steps=1", "draft.train.warmup_steps=1", "draft_plain.train.warmup_steps=1",
    "card.questions_per_subtask=1", "card.n_math=1", "card.max_new_tokens=4",
    "speed.reps=2", "speed.context=8",
]


@pytest.fixture(scope="session")
def zoo_dir() -> Path:
    """The real zoo: built on first use (about a quarter of an hour on 2 cores), then cached."""
    return ensure_zoo()


@pytest.fixture(scope="session")
def card(zoo_dir: Path) -> dict:
    return json.loads((zoo_dir / "quality.json").read_text())


# ----------------------------------------------------------------------------- the built zoo


def test_quality_floors(card: dict) -> None:
    assert card["heldout"]["target"]["accuracy_all"] >= FLOORS["target_accuracy"]
    assert card["heldout"]["draft"]["agreement_all"] >= FLOORS["draft_agreement"]
    assert card["generation"]["eos_fraction"] >= FLOORS["eos_fraction"]
    assert set(card["floors"]) == set(FLOORS)  # the card checks the same quantities (against configs/zoo.yaml)


def test_card_has_every_section(card: dict) -> None:
    for name in MODELS:
        row = card["heldout"][name]
        assert row["ppl_all"] > 1 and 0 <= row["accuracy_all"] <= 1
        assert card["models"][name]["params"] > 0
    assert card["models"]["draft"]["distilled_from"] == "target"
    assert card["models"]["draft_plain"]["distilled_from"] is None
    assert 0 <= card["generation"]["math_exact_match"] <= 1
    assert card["speed"]["target_decode1_ms"] > 0 and card["speed"]["draft_decode1_ms"] > 0
    assert set(card["build_seconds"]) >= {"corpus", "tokenizer", "target", "draft", "draft_plain", "card", "total"}
    assert card["recommended_max_new_tokens"] == load_zoo_config().bench.max_new_tokens


def test_zoo_folder_layout(zoo_dir: Path) -> None:
    assert is_complete(zoo_dir) and zoo_dir == zoo_root() / zoo_hash(load_zoo_config())
    for name in MODELS:
        for file in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json"):
            assert (zoo_dir / name / file).is_file(), f"{name}/{file}"
        assert "chat_template" in json.loads((zoo_dir / name / "tokenizer_config.json").read_text())
    tokenizer_files = {(zoo_dir / name / "tokenizer.json").read_text() for name in MODELS}
    assert len(tokenizer_files) == 1, "target and drafts must share one tokenizer"


@pytest.mark.parametrize("name", MODELS)
def test_models_load_like_hub_models(zoo_dir: Path, name: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / name)
    model = AutoModelForCausalLM.from_pretrained(zoo_dir / name)
    gen = GenerationConfig.from_pretrained(zoo_dir / name)
    end = tokenizer.convert_tokens_to_ids(zoo_data.EOS)
    assert gen.eos_token_id == end == tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert gen.pad_token_id == tokenizer.pad_token_id is not None
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tokenizer)


def test_chat_template_round_trips(zoo_dir: Path) -> None:
    """Prompt tokens + answer tokens + EOS are exactly the tokens of the rendered conversation,
    so what the model sees at inference matches what it was trained on."""
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "target")
    question = next(q for q in synth.make_questions() if len(q["turns"]) == 2)
    messages = synth.conversation_messages(question)
    full_text = tokenizer.apply_chat_template(messages, tokenize=False)
    full = tokenizer(full_text, add_special_tokens=False).input_ids
    assert tokenizer.decode(full) == full_text
    assert full[0] == tokenizer.bos_token_id and full.count(tokenizer.bos_token_id) == 1
    for turn in (0, 1):
        prompt_text = tokenizer.apply_chat_template(messages[: 2 * turn + 1], add_generation_prompt=True,
                                                    tokenize=False)
        prompt = tokenizer(prompt_text, add_special_tokens=False).input_ids
        answer = tokenizer(messages[2 * turn + 1]["content"], add_special_tokens=False).input_ids
        # The runner's path (render, then tokenize without special tokens) and the tokenizing
        # path of apply_chat_template agree.
        assert prompt == list(tokenizer.apply_chat_template(messages[: 2 * turn + 1],
                                                            add_generation_prompt=True)["input_ids"])
        assert full[: len(prompt) + len(answer) + 1] == prompt + answer + [tokenizer.eos_token_id]
        assert tokenizer.decode(answer + [tokenizer.eos_token_id], skip_special_tokens=True) == \
            messages[2 * turn + 1]["content"]


def test_training_corpus_is_disjoint_from_the_questions(zoo_dir: Path) -> None:
    manifest = json.loads((zoo_dir / zoo_build.CORPUS_MANIFEST).read_text())
    cfg = load_zoo_config()
    items = zoo_data.conversations(cfg, "train")
    # Regenerated the way the build made it: the very corpus the zoo was trained on.
    assert zoo_data.corpus_digest(items) == manifest["train"]["sha256"]
    assert manifest["generator_version"] == synth.GENERATOR_VERSION
    corpus = "\n".join(m["content"] for it in items for m in synth.conversation_messages(it))
    turns = {t for q in synth.make_questions(int(cfg.corpus.question_seed)) for t in q["turns"]}
    assert len(turns) >= 480
    leaked = [t for t in turns if t in corpus]
    assert not leaked, f"{len(leaked)} benchmark turns occur in the training corpus, e.g. {leaked[0]!r}"


# ----------------------------------------------------------------------------- build safety


@pytest.fixture()
def tiny_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "zoo"))
    return tmp_path / "zoo"


def test_half_written_zoo_is_rebuilt(tiny_root: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_zoo_config(TINY)
    digest = zoo_hash(cfg)
    final = tiny_root / digest
    # What a killed build can leave: a temporary folder, and a final folder without COMPLETE.
    leftover = tiny_root / f".{digest}.building-killed"
    (leftover / "target").mkdir(parents=True)
    (leftover / "quality.json").write_text("{}")
    (final / "target").mkdir(parents=True)
    (final / "quality.json").write_text("{}")
    assert not is_complete(final)

    assert ensure_zoo(cfg) == final
    assert is_complete(final) and not leftover.exists()
    assert json.loads((final / "quality.json").read_text())["zoo_hash"] == digest
    assert AutoModelForCausalLM.from_pretrained(final / "draft").config.num_hidden_layers == 1

    # A finished zoo is reused as it is: building again would fail here.
    def no_build(*args: object, **kwargs: object) -> dict:
        raise AssertionError("a complete zoo was rebuilt")

    monkeypatch.setattr(zoo_build, "build", no_build)
    assert ensure_zoo(cfg) == final
    assert zoo_main(["card", "--speed", *TINY]) == 0
    out = capsys.readouterr().out
    assert "floors:" in out and "now: speed" in out

    # A marker naming another hash does not count (e.g. a folder copied under a wrong name).
    (final / "COMPLETE").write_text(json.dumps({"zoo_hash": "0" * 12}))
    assert not is_complete(final)


def test_concurrent_callers_build_once(tiny_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    started = threading.Event()

    def slow_build(cfg: object, out: Path, digest: str, code_version: str) -> dict:
        calls.append(out)
        started.set()
        threading.Event().wait(0.5)  # hold the lock while the other caller arrives
        (out / "quality.json").write_text(json.dumps({"zoo_hash": digest}))
        return {"zoo_hash": digest}

    monkeypatch.setattr(zoo_build, "build", slow_build)
    cfg = load_zoo_config(TINY)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(ensure_zoo(cfg)))
    first.start()
    started.wait(10)
    second = threading.Thread(target=lambda: results.append(ensure_zoo(cfg)))
    second.start()
    first.join(30)
    second.join(30)
    assert len(calls) == 1
    assert results == [tiny_root / zoo_hash(cfg)] * 2 and is_complete(results[0])


def test_hash_follows_every_setting() -> None:
    base = zoo_hash(load_zoo_config())
    assert base == zoo_hash(load_zoo_config()) and len(base) == 12
    assert zoo_hash(load_zoo_config(["target.train.lr=0.001"])) != base
    assert zoo_hash(load_zoo_config(["corpus.n_train=100"])) != base
    assert zoo_hash(load_zoo_config(["card.n_math=3"])) != base
    # draft_plain copies the draft architecture, also when it is overridden
    assert load_zoo_config(["draft.arch.hidden_size=96"]).draft_plain.arch.hidden_size == 96


def test_zoo_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert zoo_root() == tmp_path
    monkeypatch.delenv(ENV_VAR)
    assert zoo_root() == Path.home() / ".cache" / "specbench" / "zoo"


def test_cli(tiny_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo_main(["path", *TINY]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_root / zoo_hash(load_zoo_config(TINY)))
    assert zoo_main(["card", *TINY]) == 2
    assert "not built" in capsys.readouterr().err
    assert zoo_main(["build", "no.such.key=1"]) == 2
    assert "unknown zoo setting 'no.such.key'" in capsys.readouterr().err


def test_a_forced_build_trains_here_and_says_its_weights_are_local(tiny_root: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`zoo build --force` trains (never restores or fetches) and marks the zoo local, with its own fingerprint."""
    from specbench.core.origin import read_origin

    assert zoo_main(["build", "--force", *TINY]) == 0
    folder = tiny_root / zoo_hash(load_zoo_config(TINY))
    origin = read_origin(folder)
    assert origin["source"] == "local" and origin["fingerprint"].startswith("local-")
    out, err = capsys.readouterr()
    assert "this zoo was trained here: its weights are local" in err
    assert f"trained here: local weights, fingerprint {origin['fingerprint']}" in out
