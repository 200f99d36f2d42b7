"""A kit's parts, built on its target once per machine and cached: what `KIT:NAME` resolves to.

Every part is learned from the target's own answers (self-distillation, as Medusa-2 and EAGLE
regenerate their training data with the target): the `corpus` group holds the target's own kind of
text (specbench.kit.corpus: user turns it writes itself and prompts of the benchmark's six shapes,
never benchmark questions, answered greedily and sampled, in shards). The other groups read it:

- `datastore`: REST's suffix-array datastore over the rendered conversations;
- `drafts`: `draft` (a small Llama distilled from the target's next-token distribution) and
  `draft_plain` (the same shape on hard labels only), SpS / SpecInfer / Online Speculative
  Decoding's drafters;
- the head of every method that trains one (together: `heads`; Medusa, EAGLE, EAGLE-3, Hydra, PPD,
  SpecDec and a methods/ folder's): its method's recipe (specbench.heads.recipe) on the corpus's states
  with the target frozen (specbench.kit.heads), the kit's `build.heads.<method>` over the method's
  `train:` settings, one folder each, `<method>-<key of its settings, recipe and corpus>`, so that one
  head's training (hours on a CPU) is built, cached and shipped apart from the others.

A group lives in `<cache>/<kit>/<target id>/<group>-<hash of its settings>/`, built in a temporary
sibling, its card (`card.json`, with the build time) written last, renamed into place under a
file lock: a killed build leaves nothing that looks finished, two processes build a group once.
"""

from __future__ import annotations

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
#: part name -> the group that builds it (the heads are their methods': `trained_methods`)
PARTS = {"corpus": "corpus", "datastore": "datastore", "draft": "drafts", "draft_plain": "drafts"}
#: groups a group reads (their settings enter its hash)
NEEDS = {"corpus": (), "datastore": ("corpus",), "drafts": ("corpus",)}


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
    out = {g: build.get(g) for g in (group, *NEEDS[group])}
    out.update({"code": KIT_CODE_VERSION, "seed": build.get("seed"), "heldout_fraction": build.get("heldout_fraction")})
    return out


def group_dir(kit: DictConfig, group: str) -> Path:
    digest = hashlib.sha256(json.dumps(group_settings(kit, group), sort_keys=True).encode()).hexdigest()[:8]
    return kit_dir(kit) / target_id(kit) / f"{group}-{digest}"


def resolve_part(kit: DictConfig, part: str) -> Path:
    """The file or folder of part `part` of `kit`, its group (or, for a method that trains a head, that
    head) built first if needed."""
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
# the heads of the methods that train one (specbench.heads.recipe): one folder each


def trained_methods() -> list[str]:
    from specbench.run.registry import discover

    return discover().trained()


def kit_recipe(kit: DictConfig, method: str) -> tuple[type, Any]:
    """The method's class and training settings for this kit: its YAML's `train:`, then the kit's
    `build.heads.<method>` over it (settings sized for the kit's target: `epochs` over every training
    row's drafting positions rather than `steps`, `dtype`, ...)."""
    from specbench.run.registry import discover

    return discover().builder_recipe(method, kit.build.get("heads"), f"{kit.name}'s build.heads")


def trained_dir(kit: DictConfig, cls: type, settings: Any, method: str) -> Path:
    """`<kit dir>/<target>/<method>-<key>`: the key covers the method's settings and recipe (`kit_recipe`),
    the corpus it trains on (its group's settings), the states kept of it, and the draft for a recipe
    that starts from it."""
    from specbench.heads.recipe import part_key

    about = {"corpus": group_settings(kit, "corpus"), "target": target_id(kit), "states": state_settings(kit),
             **({"drafts": group_settings(kit, "drafts")} if cls.Training.starts_from_draft else {})}
    return kit_dir(kit) / target_id(kit) / f"{method}-{part_key(cls, settings, json.dumps(about, sort_keys=True))}"


def state_settings(kit: DictConfig) -> dict:
    """The kit's `build.states`: which of the target's states one pass per corpus shard keeps for every
    head (`fused`: EAGLE-3's hidden_states indices, null = the published (2, L/2, L-3); `exit_layer`:
    PPD's, null = half the target's blocks)."""
    states = OmegaConf.to_container(kit.build.get("states") or OmegaConf.create({}), resolve=True)
    unknown = sorted(set(states) - {"fused", "exit_layer"})
    if unknown:
        raise SpecbenchError(f"{kit.name}'s build.states has no setting {', '.join(unknown)}; its settings: fused, "
                             "exit_layer")
    return {"fused": states.get("fused"), "exit_layer": states.get("exit_layer")}


def ensure_trained(kit: DictConfig, method: str) -> Path:
    """The head of `method` for the kit's target, trained by its recipe on the kit's corpus the first time
    (every training row, losses on answer tokens, agreement measured on the held-out rows; progress saved
    every PROGRESS_EVERY_S beside the folder, so a stopped build resumes there)."""
    from specbench.heads.recipe import PART_CARD, train_part

    cls, settings = kit_recipe(kit, method)
    final = trained_dir(kit, cls, settings, method)

    def build(tmp: Path) -> None:
        corpus = ensure_group(kit, "corpus")
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(int(kit.build.threads))
            target = _load_target(kit, torch.float32)
            rows, held = split_rows(kit, read_corpus(corpus))
            ckpt = progress_state(final)
            data = head_data(kit, rows, held, target, ckpt)
            start = time.perf_counter()
            data.states.ensure()
            data.held.ensure()
            states_s = round(time.perf_counter() - start, 1)
            card = train_part(cls, settings, data, tmp, method)
            card.update({"train_rows": len(rows), "heldout_rows": len(held),
                         "drafting_positions": data.states.drafting_positions, "states_seconds": states_s,
                         "compute_dtype": str(data.compute(settings) or torch.float32).removeprefix("torch.")})
            (tmp / PART_CARD).write_text(json.dumps(card, indent=2) + "\n")
            ckpt.finish()
        finally:
            torch.set_num_threads(threads)

    return _cached(kit, final, PART_CARD, build,
                   f"specbench: training {kit.name}'s {method} head into {final} (once, then cached)")


def head_data(kit: DictConfig, rows: list[dict], held: list[dict], target: Any, ckpt: Any = None) -> Any:
    """A head recipe's data on the kit's corpus rows `rows` (specbench.kit.heads.CorpusHeadData), its
    agreement measured on `held`; `target` the kit's loaded target; `ckpt` a TrainingState or None."""
    from specbench.kit.heads import CorpusHeadData

    return CorpusHeadData(target=target.model, tokenizer=target.tokenizer, input_ids=torch.zeros(0, 0),
                          valid=torch.zeros(0, 0, dtype=torch.bool), base=f"{kit.name}:target", label=str(kit.name),
                          seed=int(kit.build.seed), draft=lambda: _load_draft(kit), ckpt=ckpt,
                          states=corpus_states(kit, rows, target), held=corpus_states(kit, held, target))


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
    from specbench.core.hardware import autocast_dtype

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


def teacher_pass(kit: DictConfig, shards: list[int]) -> None:
    """A new machine's heavy step done once: where a shard has neither its top-k file (distillation)
    nor its states file (every head, `build.states`), both come from one teacher-forced forward of the
    target (specbench.kit.features.compute_states with topk). A shard with one of them gets the other
    by a pass of its own (`ensure_topk`, `ensure_states`), as a machine that made the shard has its top-k."""
    from specbench.kit.corpus import read_rows, save_topk
    from specbench.kit.features import compute_states, save_states, states_file

    settings, place = corpus_place(kit)
    spec = shared_spec(kit)
    loaded: list[Any] = []
    for shard in shards:
        if place.topk_file(shard).is_file() or states_file(place.cache, shard, spec).is_file():
            continue
        if not loaded:
            loaded.append(_load_target(kit, build_dtype(settings.dtype)).model)
        start = time.perf_counter()
        rows = read_rows(place.rows_file(shard))
        out = compute_states(loaded[0], rows, spec, topk=settings.topk)
        save_topk(place.topk_file(shard), out.pop("topk_ids"), out.pop("topk_logp"))
        save_states(states_file(place.cache, shard, spec), out)
        tokens = sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
        print(f"specbench: target top-k and states of corpus shard {shard} (one pass): {tokens} tokens in "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def shared_spec(kit: DictConfig) -> Any:
    """The states one pass per corpus shard keeps for every head (`build.states`): the final-norm
    state, EAGLE-3's fused layers and PPD's exit state, for the kit's target's depth."""
    from transformers import AutoConfig

    from specbench.heads.eagle3 import feature_layers
    from specbench.kit.features import StateSpec

    kept = state_settings(kit)
    n_layers = int(AutoConfig.from_pretrained(ensure_target(kit)).num_hidden_layers)
    return StateSpec(final=True, fused=tuple(feature_layers(n_layers, kept["fused"])),
                     exit_layer=int(kept["exit_layer"] or n_layers // 2))


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
    teacher_pass(kit, sorted(wanted))

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
    from specbench.core.hardware import autocast_dtype

    compute = autocast_dtype(str(cfg.dtype))
    card: dict[str, Any] = {"train_rows": len(rows), "heldout_rows": len(held),
                            "train_answer_tokens": train_rows.answer_tokens,
                            "heldout_answer_tokens": held_rows.answer_tokens}
    progress = {name: progress_state(group_dir(kit, "drafts"), name) for name in ("draft", "draft_plain")}
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


def progress_state(final: Path, name: str | None = None) -> Any:
    """Where the training of the cache folder `final` (a group's training `name`, or a head's) keeps its
    progress while it builds (specbench.core.resume): beside the folder, under its settings' key, so a build
    stopped after hours resumes where it saved (on this machine; another machine starts the part over)."""
    from specbench.core.resume import TrainingState

    stem = f"{final.name}.{name}" if name else final.name
    return TrainingState(final.with_name(f"{stem}.progress.pt"), every_s=PROGRESS_EVERY_S)


def corpus_states(kit: DictConfig, rows: list[dict], target: Any) -> Any:
    """The target's states over `rows` of the kit's corpus for its heads (specbench.kit.heads): the
    final-norm state, the fused layers and the exit state of `build.states` (`state_settings`), per shard,
    computed once per machine (in the corpus's dtype) beside the shards in the cache."""
    from specbench.kit.corpus import read_rows
    from specbench.kit.heads import CorpusStates

    settings, place = corpus_place(kit)
    spec = shared_spec(kit)
    shard_rows = {shard: read_rows(place.rows_file(shard)) for shard in sorted({int(r["shard"]) for r in rows})}
    teacher_pass(kit, sorted(shard_rows))  # a new machine's top-k from the same forward as these states
    loaded: list[Any] = []

    def loader() -> torch.nn.Module:
        if not loaded:
            loaded.append(_load_target(kit, build_dtype(settings.dtype)).model)
        return loaded[0]

    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return CorpusStates(rows, shard_rows, place.cache, spec, loader, pad)


BUILDERS: dict[str, Callable[[DictConfig, dict, Path], dict]] = {
    "corpus": build_corpus, "datastore": build_datastore, "drafts": build_drafts,
}
BUILD_NOTES = {
    "corpus": "the target writes its own prompts and answers them, in shards: hours on 2 CPU cores",
    "datastore": "seconds",
    "drafts": "two small Llamas distilled from the corpus",
}
