"""Parts of the zoo built after it and cached beside it: the head of every method that trains its own
(`zoo:medusa`, `zoo:eagle`, `zoo:eagle3`, `zoo:hydra`, `zoo:ppd`, `zoo:specdec` and a methods/ folder's:
specbench.heads.recipe; one folder each, keyed by the method's `train:` settings and recipe), and the
REST datastore.

They depend on the trained target but are kept out of the zoo's own hash, so a change of a
head setting retrains that head only. Built in a temporary folder and renamed into place
under a file lock, like the zoo itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from specbench.core.files import build_once
from specbench.zoo.store import COMPLETE, check_may_build, ensure_zoo, load_zoo_config


def _built(final: Path, card: str, what: str, build: Callable[[Path], None]) -> Path:
    """`final`, restored from the shipped weights (specbench.zoo.shipped) or fetched when the zoo's release
    names it (specbench.zoo.release), else built once by `build(tmp)` and marked local (core.files.build_once:
    a second process waits, then reuses it)."""
    from specbench.zoo import release, shipped

    stale = (final / card).is_file() and shipped.stale(final)
    if (final / card).is_file() and not stale:
        return final
    check_may_build(final)

    def fetch_or_build(tmp: Path) -> None:
        if shipped.fill(final, tmp):
            return
        if release.fetch(final, tmp):
            return
        print(f"specbench: training {what} into {final} (done once, then cached; local weights, not the shipped "
              "ones)", file=sys.stderr, flush=True)
        build(tmp)
        shipped.mark_local(tmp)

    return build_once(final, card, fetch_or_build, rebuild=stale)


def trained_part(name: str) -> Path | None:
    """`zoo:NAME` of a method that trains its own head (specbench.heads.recipe): its folder beside the
    zoo, `<zoo hash>.NAME-<key of its settings, its recipe's code and the zoo's build>`, trained on the
    zoo's corpus the first time; None when no method of that name trains a head."""
    from specbench.heads.recipe import PART_CARD, train_part
    from specbench.run.registry import discover

    registry = discover()
    if name not in registry.trained():
        return None
    cls, settings = zoo_recipe(name, registry)
    zoo = ensure_zoo()
    final = _part_dir(zoo, name, cls, settings)

    def build(tmp: Path) -> None:
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(int(load_zoo_config().threads))
            train_part(cls, settings, zoo_head_data(zoo), tmp, name)
        finally:
            torch.set_num_threads(threads)

    return _built(final, PART_CARD, f"the zoo's {name} head", build)


def trained_part_dir(zoo: Path, name: str, registry: Any = None) -> Path:
    """The folder of `zoo:NAME` for a method that trains its own head (not necessarily built yet)."""
    from specbench.run.registry import discover

    return _part_dir(zoo, name, *zoo_recipe(name, registry or discover()))


def _part_dir(zoo: Path, name: str, cls: type, settings: Any) -> Path:
    from specbench.heads.recipe import part_key

    return zoo.with_name(f"{zoo.name}.{name}-{part_key(cls, settings, (zoo / COMPLETE).read_text())}")


def zoo_recipe(name: str, registry: Any) -> tuple[type, Any]:
    """Method `name`'s class and training settings for the zoo: its `train:` section with configs/zoo.yaml's
    `heads.<name>` over it (as a kit's `build.heads`)."""
    from specbench.zoo.store import HEADS_KEY

    return registry.builder_recipe(name, load_zoo_config().get(HEADS_KEY), "configs/zoo.yaml's heads")


def zoo_head_data(zoo: Path) -> Any:
    """The zoo's target, its training rows and its draft, as a head recipe trains on them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.heads.recipe import HeadData
    from specbench.zoo import data

    cfg = load_zoo_config()
    tokenizer = AutoTokenizer.from_pretrained(zoo / "target")
    rows = data.pack(data.encode_items(tokenizer, data.conversations(cfg, "train")), int(cfg.seq_len), tokenizer,
                     int(cfg.seed))
    return HeadData(target=AutoModelForCausalLM.from_pretrained(zoo / "target", dtype=torch.float32).eval(),
                    tokenizer=tokenizer, input_ids=rows.input_ids, valid=rows.labels != -100, base="zoo:target",
                    label="zoo", seed=int(cfg.seed),
                    draft=lambda: AutoModelForCausalLM.from_pretrained(zoo / "draft", dtype=torch.float32).eval())


def resolve(name: str) -> Path:
    """The folder a `zoo:NAME` spec names: a zoo model, a head, the REST datastore, or a data file."""
    if name == "datastore":
        return zoo_datastore()
    if name == "calibration":
        return calibration_file()
    if name == "corpus":
        return corpus_file()
    zoo = ensure_zoo()
    if (zoo / name).exists():  # a zoo model: target, draft, draft_plain
        return zoo / name
    return trained_part(name) or zoo / name


def zoo_datastore() -> Path:
    """The zoo's datastore: `<zoo>/datastore` when the zoo build made one, else built once
    from the zoo's training corpus into `<zoo>.datastore` next to it (a few seconds)."""
    from specbench import datastore as ds
    from specbench.zoo import data as zoo_data

    folder = ensure_zoo()
    inside = folder / "datastore"
    if (inside / ds.MANIFEST_FILE).is_file():
        return inside
    beside = folder.with_name(folder.name + ".datastore")
    if (beside / ds.MANIFEST_FILE).is_file():
        return beside
    from transformers import AutoTokenizer

    def build(tmp: Path) -> None:
        build_corpus_datastore(AutoTokenizer.from_pretrained(folder / "target"), zoo_data.conversations(
            load_zoo_config(), "train"), tmp, f"zoo {folder.name} training corpus")

    return build_once(beside, ds.MANIFEST_FILE, build)  # two runs starting at once build it once


def build_corpus_datastore(tokenizer: Any, items: list[dict], out: Path, source: str) -> Path:
    """A datastore of synthetic-corpus conversations rendered with the chat template (the zoo's stage)."""
    from specbench import datastore as ds
    from specbench.zoo import data as zoo_data

    ds.fill(out, zoo_data.encode_items(tokenizer, items), tokenizer, source=source, progress=True)
    return out


def _questions_file(path: Path, items: Callable[[], Iterable[dict]]) -> Path:
    """`path`, written once (atomically) from `items()` as a question-format JSONL file."""
    from specbench.core.files import write_atomic
    from specbench.core.questions import questions_jsonl

    if not path.is_file():
        write_atomic(path, questions_jsonl(items()))
    return path


def calibration_file(n: int = 16, seed: int = 977) -> Path:
    """Synthetic conversations (a seed of their own, not benchmark questions) as a question file,
    for calibrating searches such as self_spec's skip set; written once, no zoo build needed."""
    from specbench import synth
    from specbench.zoo.store import zoo_root

    path = zoo_root() / f"calibration-{synth.GENERATOR_VERSION}-{seed}-{n}.jsonl"
    return _questions_file(path, lambda: synth.make_corpus(n, seed=seed))


def corpus_file() -> Path:
    """The zoo's training conversations as Spec-Bench shaped JSONL (`turns` + `reference`), the
    corpus of `zoo:corpus`: written once next to the zoo, `<zoo hash>.corpus.jsonl`, no zoo build needed."""
    from specbench.zoo import data as zoo_data
    from specbench.zoo.store import zoo_hash, zoo_root

    cfg = load_zoo_config()
    return _questions_file(zoo_root() / f"{zoo_hash(cfg)}.corpus.jsonl", lambda: zoo_data.conversations(cfg, "train"))
