"""A kit's parts, built on its target once per machine and cached: what `KIT:NAME` resolves to.

Every part is learned from the target's own answers (self-distillation, as Medusa-2 and EAGLE
regenerate their training data with the target): the `corpus` group holds the target's own kind of
text (specbench.kit.corpus: user turns it writes itself and prompts of the benchmark's six shapes,
never benchmark questions, answered greedily and sampled, in shards). The other groups read it:

- `datastore`: REST's suffix-array datastore over the rendered conversations;
- `drafts`: `draft` (a small Llama distilled from the target's next-token distribution) and
  `draft_plain` (the same shape on hard labels only), SpS / SpecInfer / Online Speculative
  Decoding's drafters;
- `eagle`, `eagle3`, `medusa`, `ppd`, `specdec` (together: `heads`): EAGLE, EAGLE-3, Medusa and PPD
  heads and SpecDec's drafter (specbench.kit.heads, the target frozen), each a group of its own, so
  that one head's training (hours on a CPU) is built, cached and shipped apart from the others;
- the head of every method that trains its own (Hydra, a methods/ folder's; specbench.heads.recipe),
  one folder each, `<method>-<key of its settings, recipe and corpus>`.

A group lives in `<cache>/<kit>/<target id>/<group>-<hash of its settings>/`, built in a temporary
sibling, its card (`card.json`, with the build time) written last, renamed into place under a
file lock: a killed build leaves nothing that looks finished, two processes build a group once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core.errors import SpecbenchError
from specbench.core.files import build_once
from specbench.kit.source import ensure_target, kit_dir, recorded_target

CARD = "card.json"
#: how often a long training saves its progress (specbench.core.resume), seconds
PROGRESS_EVERY_S = 600.0
#: Bump when a change here changes what a build produces.
KIT_CODE_VERSION = "kit-2"
#: the heads a kit trains, each a group of its own (specbench.kit.heads.train_head)
HEAD_GROUPS = ("eagle", "eagle3", "medusa", "ppd", "specdec")
#: part name -> the group that builds it
PARTS = {"corpus": "corpus", "datastore": "datastore", "draft": "drafts", "draft_plain": "drafts",
         **{head: head for head in HEAD_GROUPS}}
#: groups a group reads (their settings enter its hash)
NEEDS = {"corpus": (), "datastore": ("corpus",), "drafts": ("corpus",),
         **{head: ("corpus", "drafts") if head == "specdec" else ("corpus",) for head in HEAD_GROUPS}}


def expand_groups(names: list[str]) -> list[str]:
    """Group names with `heads` standing for every head group (the build's and the cli's word for them)."""
    return [g for name in names for g in (HEAD_GROUPS if name == "heads" else (name,))]


def target_id(kit: DictConfig) -> str:
    """12 hex digits naming the target this machine fetched (source and checksum or hub commit)."""
    ensure_target(kit)
    record = recorded_target(kit) or {}
    key = {k: record.get(k) for k in ("source", "sha256", "repo", "revision")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def group_settings(kit: DictConfig, group: str) -> dict:
    """The settings a group's build depends on: its own section (a head's: `build.heads.<head>`) and
    those of the groups it reads."""
    build = OmegaConf.to_container(kit.build, resolve=True)

    def section(g: str) -> Any:
        return (build.get("heads") or {}).get(g) if g in HEAD_GROUPS else build.get(g)

    out = {g: section(g) for g in (group, *NEEDS[group])}
    out.update({"code": KIT_CODE_VERSION, "seed": build.get("seed"), "heldout_fraction": build.get("heldout_fraction")})
    return out


def group_dir(kit: DictConfig, group: str) -> Path:
    digest = hashlib.sha256(json.dumps(group_settings(kit, group), sort_keys=True).encode()).hexdigest()[:8]
    return kit_dir(kit) / target_id(kit) / f"{group}-{digest}"


def resolve_part(kit: DictConfig, part: str) -> Path:
    """The file or folder of part `part` of `kit`, its group (or, for a method that trains its own head,
    that head) built first if needed."""
    if part in PARTS:
        folder = ensure_group(kit, PARTS[part])
        return folder / (CORPUS_FILE if part == "corpus" else part)
    trained = trained_methods()
    if part not in trained:
        raise SpecbenchError(f"{kit.name} has no part '{part}'; its parts: target, {', '.join([*PARTS, *trained])}")
    return ensure_trained(kit, part)


def is_built(kit: DictConfig, part: str) -> bool:
    """Whether part `part` of `kit` is built on this machine (the target fetched counts as built)."""
    if part == "target":
        return recorded_target(kit) is not None
    if part in PARTS:
        return (group_dir(kit, PARTS[part]) / CARD).is_file()
    from specbench.heads.recipe import PART_CARD

    return part in trained_methods() and (trained_dir(kit, *kit_recipe(kit, part), part) / PART_CARD).is_file()


# ---------------------------------------------------------------------------------------------
# the heads of methods that train their own (specbench.heads.recipe): one folder each


def trained_methods() -> list[str]:
    from specbench.run.registry import discover

    return discover().trained()


def kit_recipe(kit: DictConfig, method: str) -> tuple[type, Any, float | None]:
    """The method's class and training settings for this kit: its YAML's `train:`, then the kit's
    `build.heads.tokens` and `build.heads.<method>` over it (settings sized for the kit's target), and
    the section's `epochs` (None without it): passes over every training row's drafting positions,
    turned into the recipe's `steps` by its `batch_positions` once the corpus is known (`ensure_trained`)."""
    from specbench.run.registry import discover

    heads = OmegaConf.to_container(kit.build.get("heads") or OmegaConf.create({}), resolve=True)
    section = dict(heads.get(method) or {})
    epochs = section.pop("epochs", None)
    changes = {**({"tokens": heads["tokens"]} if "tokens" in heads else {}), **section}
    cls, settings = discover().recipe(method, changes)
    if epochs is not None:
        if not hasattr(settings, "batch_positions"):
            raise SpecbenchError(f"{kit.name}'s build.heads.{method}.epochs needs a recipe that trains on "
                                 f"batch_positions positions a step, and {cls.__name__}'s has none: set "
                                 f"build.heads.{method}.steps instead")
        if not float(epochs) > 0:
            raise SpecbenchError(f"{kit.name}'s build.heads.{method}.epochs is {epochs}: give a positive number "
                                 "of passes over the corpus")
        epochs = float(epochs)
    return cls, settings, epochs


def trained_dir(kit: DictConfig, cls: type, settings: Any, epochs: float | None, method: str) -> Path:
    """`<kit dir>/<target>/<method>-<key>`: the key covers the method's settings and recipe (`kit_recipe`),
    the epochs asked for, and the corpus it trains on (its group's settings)."""
    from specbench.heads.recipe import part_key

    about = {"corpus": group_settings(kit, "corpus"), "target": target_id(kit),
             **({"epochs": epochs} if epochs is not None else {})}
    return kit_dir(kit) / target_id(kit) / f"{method}-{part_key(cls, settings, json.dumps(about, sort_keys=True))}"


def ensure_trained(kit: DictConfig, method: str) -> Path:
    """The head of `method` for the kit's target, trained on the kit's corpus the first time."""
    from specbench.heads.recipe import PART_CARD, train_part

    CorpusHeadData = _corpus_head_data()  # noqa: N806 - a class

    cls, settings, epochs = kit_recipe(kit, method)
    final = trained_dir(kit, cls, settings, epochs, method)

    def build(tmp: Path) -> None:
        corpus = ensure_group(kit, "corpus")
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(int(kit.build.threads))
            target = _load_target(kit, torch.float32)
            states = corpus_states(kit, split_rows(kit, read_corpus(corpus))[0], target)
            fitted = settings
            if epochs is not None:  # passes over every drafting position of the training rows
                from specbench.kit.heads import steps_for

                steps = steps_for({"epochs": epochs}, states.drafting_positions, int(settings.batch_positions))
                fitted = dataclasses.replace(settings, **steps)
            data = CorpusHeadData(target=target.model, tokenizer=target.tokenizer, input_ids=torch.zeros(0, 0),
                                  valid=torch.zeros(0, 0, dtype=torch.bool), base=f"{kit.name}:target",
                                  label=kit.name, seed=int(kit.build.seed), draft=lambda: _load_draft(kit),
                                  states=states)
            card = train_part(cls, fitted, data, tmp, method)
            if epochs is not None:
                card["epochs"] = epochs
                (tmp / PART_CARD).write_text(json.dumps(card, indent=2) + "\n")
        finally:
            torch.set_num_threads(threads)

    return _cached(kit, final, PART_CARD, build,
                   f"specbench: training {kit.name}'s {method} head into {final} (once, then cached)")


def shipped_key(final: Path) -> str:
    """The shipped weights' name (specbench.zoo.shipped) of a kit's cache folder `<cache>/<kit>/<target>/<folder>`."""
    from specbench.zoo.shipped import KITS_DIR

    return f"{KITS_DIR}/{final.parent.parent.name}/{final.parent.name}/{final.name}"


def _cached(kit: DictConfig, final: Path, card: str, build: Callable[[Path], None], announce: str) -> Path:
    """`final`: the cached folder, else restored from the weights shipped with the code (parts trained once,
    for the target this machine fetched: its id is in the path), else built here by `build(tmp)` and marked
    local (its own fingerprint; core.files.build_once: a second process waits, then reuses it)."""
    from specbench.zoo import shipped

    key = shipped_key(final)
    stale = (final / card).is_file() and shipped.stale(final, key)
    if (final / card).is_file() and not stale:
        return final

    def fill_or_build(tmp: Path) -> None:
        if shipped.fill(final, tmp, key, ensure_target(kit)):
            print(f"specbench: {kit.name}'s {final.name} restored from the shipped weights (nothing trained)",
                  file=sys.stderr, flush=True)
            return
        print(announce, file=sys.stderr, flush=True)
        build(tmp)
        shipped.mark_local(tmp)

    return build_once(final, card, fill_or_build, rebuild=stale)


def restored(kit: DictConfig, final: Path, card: str) -> bool:
    """Whether the cache folder `final` is there, restored from the shipped weights when they hold it
    (never built here): `kit ship` keeps the parts that another machine trained and shipped."""
    from specbench.zoo import shipped

    if (final / card).is_file():
        return True
    key = shipped_key(final)
    manifest = shipped.read_manifest(shipped.weights_root())
    if manifest is None or key not in manifest["folders"]:
        return False
    build_once(final, card, lambda tmp: shipped.fill(final, tmp, key, ensure_target(kit)))
    return True


def _corpus_head_data() -> type:
    from dataclasses import dataclass

    from specbench.heads.recipe import HeadData

    @dataclass
    class CorpusHeadData(HeadData):
        """A recipe's data on a kit's corpus: every training row's states (specbench.kit.heads),
        whatever `tokens` the recipe asks for; losses on answer tokens."""

        states: Any = None

        def features(self, tokens: int, layers: tuple[int, ...] | None = None) -> Any:
            return self.states.features(fused=bool(layers))

    return CorpusHeadData


def _load_draft(kit: DictConfig) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_group(kit, "drafts") / "draft", dtype=torch.float32).eval()


def ensure_group(kit: DictConfig, group: str) -> Path:
    final = group_dir(kit, group)

    def build(tmp: Path) -> None:
        inputs = {need: ensure_group(kit, need) for need in NEEDS[group]}  # not needed when restored
        threads = torch.get_num_threads()
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.set_num_threads(int(kit.build.threads))
            try:
                card = BUILDERS[group](kit, inputs, tmp)
            finally:
                torch.set_num_threads(threads)
        card = {"group": group, "kit": str(kit.name), "target": recorded_target(kit),
                "settings": group_settings(kit, group), **card,
                "build_seconds": round(time.perf_counter() - start, 1),
                "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / CARD).write_text(json.dumps(card, indent=2) + "\n")  # last: marks the group complete
        print(f"specbench: {kit.name}'s {group} built in {card['build_seconds']:.0f} s", file=sys.stderr, flush=True)

    return _cached(kit, final, CARD, build, f"specbench: building {kit.name}'s {group} into {final} "
                   f"({BUILD_NOTES[group]}; once, then cached)")


# ---------------------------------------------------------------------------------------------
# corpus: the target's own answers to synthetic instructions

CORPUS_FILE = "corpus.jsonl"


def _load_target(kit: DictConfig, dtype: torch.dtype) -> Any:
    from specbench.models import load_model

    return load_model(str(ensure_target(kit)), device=torch.device("cpu"), dtype=dtype)


def build_dtype(name: str) -> torch.dtype:
    from specbench.zoo.train import autocast_dtype

    return autocast_dtype(name) or torch.float32


def corpus_place(kit: DictConfig) -> tuple[Any, Any]:
    """The kit's corpus settings and where its shards are: the cache's
    `<kit>/<target>/corpus-shards-<key>/`, and the repository's committed copy
    `corpora/<kit>/<target>/corpus-shards-<key>/` ($SPECBENCH_CORPORA_DIR for another folder)."""
    from specbench.kit.corpus import CorpusSettings, ShardPlace

    settings = CorpusSettings.of(kit.build.corpus)
    name = f"corpus-shards-{settings.shard_key(target_id(kit))}"
    root = corpora_root()
    committed = root / str(kit.name) / target_id(kit) / name if root is not None else None
    return settings, ShardPlace(kit_dir(kit) / target_id(kit) / name, committed)


CORPORA_VAR = "SPECBENCH_CORPORA_DIR"


def corpora_root() -> Path | None:
    """$SPECBENCH_CORPORA_DIR if set, else the checkout's `corpora/` (None in a wheel install)."""
    from specbench.core.resources import checkout_folder

    return checkout_folder(CORPORA_VAR, "corpora")


def build_shards(kit: DictConfig, indices: list[int] | None = None) -> list[dict]:
    """Make the corpus shards `indices` (default: every missing one) that are not finished yet, one
    at a time, each kept as it finishes; returns their cards."""
    from specbench.kit.corpus import ShardMaker, build_shard, missing

    settings, place = corpus_place(kit)
    todo = [i for i in (indices if indices is not None else range(settings.shards)) if place.card(i) is None]
    if not todo:
        return []
    dtype = build_dtype(settings.dtype)
    threads = torch.get_num_threads()
    cards = []
    try:
        torch.set_num_threads(int(kit.build.threads))
        target = _load_target(kit, dtype)
        maker = ShardMaker(settings, target.model, target.tokenizer, set(target.eos_ids), progress=_progress)
        for i in todo:
            card = build_shard(maker, place, i, dtype)
            left = len(missing(place, settings.shards))
            print(f"specbench: {kit.name} corpus shard {i}: {card['rows']} rows, {card['answer_tokens']} answer "
                  f"tokens in {card['seconds']:.0f} s ({left} of {settings.shards} shards still to make)",
                  file=sys.stderr, flush=True)
            cards.append(card)
    finally:
        torch.set_num_threads(threads)
    return cards


def _progress(line: str) -> None:
    print(f"specbench: {line}", file=sys.stderr, flush=True)


def build_corpus(kit: DictConfig, inputs: dict, out: Path) -> dict:
    """Every shard of the kit's corpus (specbench.kit.corpus; the finished ones reused, from the
    cache or the repository), then the rows in one file (`corpus.jsonl`: prompt and answer ids, each
    row's shard, index and held-out mark) for the parts that read it."""
    from specbench.kit.corpus import heldout, iter_rows, missing

    settings, place = corpus_place(kit)
    build_shards(kit)
    left = missing(place, settings.shards)
    if left:
        raise SpecbenchError(f"{kit.name}'s corpus lacks shard(s) {left}")
    fraction = float(kit.build.heldout_fraction)
    totals = {"rows": 0, "answer_tokens": 0, "prompt_tokens": 0, "ended": 0, "sampled": 0, "heldout_rows": 0}
    kinds: dict[str, int] = {}
    with open(out / CORPUS_FILE, "w", encoding="utf-8") as fh:
        for shard, index, row in iter_rows(place, settings.shards):
            held = heldout(shard, index, fraction)
            fh.write(json.dumps({"question_id": f"{shard}-{index}", "category": row["kind"], "turns": row["turns"],
                                 "shard": shard, "row": index, "heldout": held,
                                 "temperature": row["temperature"], "ended": row["ended"],
                                 "prompt_ids": row["prompt_ids"], "answer_ids": row["answer_ids"]}) + "\n")
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
            totals["rows"] += 1
            totals["answer_tokens"] += len(row["answer_ids"])
            totals["prompt_tokens"] += len(row["prompt_ids"])
            totals["ended"] += bool(row["ended"])
            totals["sampled"] += row["temperature"] > 0
            totals["heldout_rows"] += held
    cards = [json.loads(place.card(i).read_text()) for i in range(settings.shards)]
    return {**totals, "kinds": kinds, "shards": settings.shards, "shard_folder": place.cache.name,
            "shard_seconds": round(sum(c["seconds"] for c in cards), 1),
            "from_repository": sum(place.card(i).parent == place.committed for i in range(settings.shards))}


def read_corpus(folder: Path) -> list[dict]:
    with open(folder / CORPUS_FILE, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------
# datastore: REST's index over the target's conversations


def build_datastore(kit: DictConfig, inputs: dict, out: Path) -> dict:
    from transformers import AutoTokenizer

    from specbench import datastore as ds

    rows = read_corpus(inputs["corpus"])
    tokenizer = AutoTokenizer.from_pretrained(ensure_target(kit))
    docs = [r["prompt_ids"] + r["answer_ids"] for r in rows]
    ds.fill(out / "datastore", docs, tokenizer, source=f"{kit.name} target's answers ({inputs['corpus'].name})",
            progress=True)
    return {"documents": len(docs), "tokens": sum(map(len, docs))}


def split_rows(kit: DictConfig, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Training rows and the held-out rows every card's agreement is measured on (each row's mark)."""
    return [r for r in rows if not r["heldout"]], [r for r in rows if r["heldout"]]


def _pca_embeddings(target: torch.nn.Module, width: int) -> torch.Tensor:
    """The target's input embeddings projected on their `width` main directions (the draft's start)."""
    emb = target.get_input_embeddings().weight.detach().float()
    _, vectors = torch.linalg.eigh(emb.T @ emb)  # ascending eigenvalues
    return emb @ vectors[:, -width:].flip(-1)  # the target's own scale along those directions


def soft_targets(kit: DictConfig, rows: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target's top-k (ids, log-probabilities) at each answer position of `rows` (rows of
    `corpus.jsonl`), from the shards' cached top-k (recomputed once where a shard came from the
    repository)."""
    from specbench.kit.corpus import ensure_topk, read_rows, read_topk

    settings, place = corpus_place(kit)
    wanted: dict[int, set[int]] = {}
    for r in rows:
        wanted.setdefault(int(r["shard"]), set()).add(int(r["row"]))
    found: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    target: list[Any] = []

    def loader() -> torch.nn.Module:
        if not target:
            target.append(_load_target(kit, build_dtype(settings.dtype)).model)
        return target[0]

    for shard, keep in sorted(wanted.items()):
        ensure_topk(place, shard, loader, settings.topk)
        ids, logp = read_topk(place, shard)
        offset = 0
        for index, row in enumerate(read_rows(place.rows_file(shard))):
            n = len(row["answer_ids"])
            if index in keep:
                found[shard, index] = (ids[offset:offset + n], logp[offset:offset + n])
            offset += n
        if offset != len(ids):
            raise SpecbenchError(f"{place.topk_file(shard)} holds {len(ids)} positions, its shard {offset}: "
                                 "delete it (it is recomputed)")
    return [found[int(r["shard"]), int(r["row"])] for r in rows]


def make_draft(kit: DictConfig, section: Any, target: Any, tok: Any, seed: int) -> torch.nn.Module:
    """A draft before training, as `section.init` says: `pca` (a new Llama of `build.drafts.arch`'s
    shape, its embedding the target's on its main directions) or `target_layers` (the target's own
    blocks `section.layers`: its first n, or a list of block indices, with its embedding and head, frozen
    unless `section.train_embeddings`)."""
    from specbench.kit.distill import draft_from_target
    from specbench.zoo import train as zoo_train

    cfg = kit.build.drafts
    if str(section.init) == "target_layers":
        layers = section.layers
        model = draft_from_target(target.model, layers if isinstance(layers, int) else list(layers))
        if not bool(section.get("train_embeddings", True)):
            # the target's embedding and head, frozen: a shipped draft stores them once, with the target
            for module in (model.get_input_embeddings(), model.get_output_embeddings()):
                module.weight.requires_grad_(False)
        return model
    if str(section.init) != "pca":
        raise SpecbenchError(f"build.drafts init must be pca or target_layers, got {section.init!r}")
    model = zoo_train.make_model(cfg.arch, tok, int(cfg.max_positions), seed, int(kit.build.corpus.max_new_tokens))
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(_pca_embeddings(target.model, int(cfg.arch.hidden_size)))
    return model


def build_drafts(kit: DictConfig, inputs: dict, out: Path) -> dict:
    """`draft`: distilled from the target (forward KL to its cached top-k + cross-entropy, on answer
    tokens), `draft_plain`: the same shape on the answers alone (hard labels); each started as its
    `init` says (`pca`: a new Llama of `arch`'s shape from the target's embedding's main directions;
    `target_layers`: the target's own first `layers` blocks with its embedding and head), trained on
    every training row (specbench.kit.distill), measured on the held-out rows."""
    from specbench.kit.distill import Rows, train_draft
    from specbench.zoo import train as zoo_train

    cfg = kit.build.drafts
    target = _load_target(kit, torch.float32)
    tok = target.tokenizer
    rows, held = split_rows(kit, read_corpus(inputs["corpus"]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train_rows, held_rows = Rows.of(rows, soft_targets(kit, rows)), Rows.of(held, soft_targets(kit, held))
    compute = zoo_train.autocast_dtype(str(cfg.dtype))
    card: dict[str, Any] = {"train_rows": len(rows), "heldout_rows": len(held),
                            "train_answer_tokens": train_rows.answer_tokens,
                            "heldout_answer_tokens": held_rows.answer_tokens}
    progress = {name: progress_state(kit, "drafts", name) for name in ("draft", "draft_plain")}
    for offset, name in enumerate(("draft", "draft_plain")):
        section = cfg[name]
        seed = int(kit.build.seed) + offset
        model = make_draft(kit, section, target, tok, seed)
        if float(section.get("feature_weight", 0.0)) > 0 and train_rows.states is None:
            # the target's final states (kept per shard for the heads) as a second target of the draft
            train_rows = train_rows.with_states(corpus_states(kit, rows, target).view("final"))
        stats = train_draft(model, train_rows, held_rows, section, pad_id=pad, seed=seed, desc=f"{kit.name} {name}",
                            compute_dtype=compute, ckpt=progress[name])
        model.eval()
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name, save_jinja_files=False)
        card[name] = {"params": zoo_train.n_params(model), "init": str(section.init),
                      "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                      "train": stats.as_dict(),
                      "heldout_agreement": round(stats.curve[-1].agreement, 4)}
    card["arch"] = OmegaConf.to_container(cfg.arch, resolve=True)
    for state in progress.values():
        state.finish()
    return card


def progress_state(kit: DictConfig, group: str, name: str) -> Any:
    """Where a group's training `name` keeps its progress while it builds (specbench.core.resume):
    beside the group's folder in the cache, under its settings' key, so a build stopped after hours
    resumes where it saved (on this machine; another machine starts the part over)."""
    from specbench.core.resume import TrainingState

    final = group_dir(kit, group)
    return TrainingState(final.with_name(f"{final.name}.{name}.progress.pt"), every_s=PROGRESS_EVERY_S)


def corpus_states(kit: DictConfig, rows: list[dict], target: Any) -> Any:
    """The target's states over `rows` of the kit's corpus for its heads (specbench.kit.heads):
    the final-norm state, EAGLE-3's fused layers and PPD's exit state, per shard, computed once per
    machine (in the corpus's dtype) beside the shards in the cache."""
    from specbench.heads.eagle3 import feature_layers
    from specbench.kit.corpus import read_rows
    from specbench.kit.features import StateSpec
    from specbench.kit.heads import CorpusStates

    settings, place = corpus_place(kit)
    heads = kit.build.heads
    n_layers = int(target.model.config.num_hidden_layers)
    exit_layer = heads.ppd.get("exit_layer") or n_layers // 2
    spec = StateSpec(final=True, fused=tuple(feature_layers(n_layers, heads.eagle3.get("layers"))),
                     exit_layer=int(exit_layer))
    shard_rows = {shard: read_rows(place.rows_file(shard)) for shard in sorted({int(r["shard"]) for r in rows})}
    loaded: list[Any] = []

    def loader() -> torch.nn.Module:
        if not loaded:
            loaded.append(_load_target(kit, build_dtype(settings.dtype)).model)
        return loaded[0]

    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return CorpusStates(rows, shard_rows, place.cache, spec, loader, pad)


def build_head(kit: DictConfig, inputs: dict, out: Path, part: str) -> dict:
    """The head `part` (EAGLE, EAGLE-3, Medusa, PPD, or SpecDec's drafter from the kit's draft), the
    target frozen, on every training row of the corpus with losses on answer tokens
    (specbench.kit.heads: the zoo's training loops over the shards' stored target states)."""
    from specbench.kit.heads import train_head

    target = _load_target(kit, torch.float32)
    rows, held = split_rows(kit, read_corpus(inputs["corpus"]))
    states, held_states = corpus_states(kit, rows, target), corpus_states(kit, held, target)
    progress = progress_state(kit, part, part)
    card = train_head(part, OmegaConf.to_container(kit.build.heads, resolve=True), states, held_states,
                      target.model, target.tokenizer, lambda: _load_draft(kit), f"{kit.name}:target", str(kit.name),
                      int(kit.build.seed), out, ckpt=progress)
    progress.finish()
    return {part: card, "train_rows": len(rows), "heldout_rows": len(held)}


def _head_builder(part: str) -> Callable[[DictConfig, dict, Path], dict]:
    return lambda kit, inputs, out: build_head(kit, inputs, out, part)


BUILDERS: dict[str, Callable[[DictConfig, dict, Path], dict]] = {
    "corpus": build_corpus, "datastore": build_datastore, "drafts": build_drafts,
    **{head: _head_builder(head) for head in HEAD_GROUPS},
}
BUILD_NOTES = {
    "corpus": "the target writes its own prompts and answers them, in shards: hours on 2 CPU cores",
    "datastore": "seconds",
    "drafts": "two small Llamas distilled from the corpus",
    **{head: f"the {head} head trained on the frozen target" for head in HEAD_GROUPS},
}
