"""Parts of the zoo built after it and cached beside it: the EAGLE, EAGLE-3, Medusa and PPD heads
and SpecDec's drafter (one folder, configs/zoo_heads.yaml), the head of every method that trains
its own (`zoo:hydra` and a methods/ folder's: specbench.heads.recipe; one folder each), and the
REST datastore.

They depend on the trained target but are kept out of the zoo's own hash, so a change of a
head setting retrains that head only. Built in a temporary folder and renamed into place
under a file lock, like the zoo itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specbench.core.files import build_once
from specbench.zoo.store import COMPLETE, CONFIG_PATH, check_may_build, ensure_zoo, load_zoo_config

HEADS_CONFIG = CONFIG_PATH.with_name("zoo_heads.yaml")
HEADS = ("eagle", "medusa", "ppd", "eagle3", "specdec")
HEADS_CODE_VERSION = "heads-2"
HEADS_CARD = "heads.json"


def heads_dir(zoo: Path) -> Path:
    """`<zoo root>/<zoo hash>.heads-<hash of zoo_heads.yaml>` (not necessarily built yet)."""
    # The zoo's COMPLETE marker carries its build time: a forced rebuild of the target (same
    # hash, new weights) gets new heads instead of reusing ones trained on the old target.
    payload = json.dumps({"config": OmegaConf.to_container(OmegaConf.load(HEADS_CONFIG), resolve=True),
                          "code": HEADS_CODE_VERSION, "zoo": (zoo / COMPLETE).read_text()}, sort_keys=True)
    return zoo.with_name(f"{zoo.name}.heads-{hashlib.sha256(payload.encode()).hexdigest()[:8]}")


def ensure_heads() -> Path:
    """The folder holding `eagle/`, `eagle3/`, `medusa/`, `ppd/` and `specdec/` for the zoo's target,
    trained first if needed."""
    zoo = ensure_zoo()

    def build(tmp: Path) -> None:
        card = _train_heads(zoo, tmp)
        (tmp / HEADS_CARD).write_text(json.dumps(card, indent=2) + "\n")  # written last: marks it complete

    return _built(heads_dir(zoo), HEADS_CARD, "the zoo's EAGLE, EAGLE-3, Medusa and PPD heads and SpecDec's drafter "
                  "(about 10 minutes on 2 CPU cores with bf16 units, 16 without)", build)


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
    cls, settings = registry.recipe(name)
    zoo = ensure_zoo()
    final = trained_part_dir(zoo, name, registry)

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
    from specbench.heads.recipe import part_key
    from specbench.run.registry import discover

    cls, settings = (registry or discover()).recipe(name)
    return zoo.with_name(f"{zoo.name}.{name}-{part_key(cls, settings, (zoo / COMPLETE).read_text())}")


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


def _train_heads(zoo: Path, out: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.heads.train import zoo_stage
    from specbench.zoo import data
    from specbench.zoo.build import BuildContext

    zoo_cfg = load_zoo_config()
    cfg = OmegaConf.merge(OmegaConf.to_container(zoo_cfg), {"heads": OmegaConf.load(HEADS_CONFIG)})
    ctx = BuildContext(cfg=cfg, out=out, zoo_hash=zoo.name)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(int(cfg.threads))
        try:
            tokenizer = AutoTokenizer.from_pretrained(zoo / "target")
            ctx.state["target"] = AutoModelForCausalLM.from_pretrained(zoo / "target", dtype=torch.float32).eval()
            ctx.state["draft"] = AutoModelForCausalLM.from_pretrained(zoo / "draft", dtype=torch.float32).eval()
            ctx.state["tokenizer"] = tokenizer
            items = data.conversations(zoo_cfg, "train")
            ctx.state["train_rows"] = data.pack(data.encode_items(tokenizer, items), int(cfg.seq_len), tokenizer,
                                                ctx.seed(0))
            zoo_stage(ctx)
        finally:
            torch.set_num_threads(threads)
    ctx.card["heads"]["build_seconds"] = round(time.perf_counter() - start, 1)
    return ctx.card["heads"]


def resolve(name: str) -> Path:
    """The folder a `zoo:NAME` spec names: a zoo model, a head, the REST datastore, or a data file."""
    if name in HEADS:
        return ensure_heads() / name
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
