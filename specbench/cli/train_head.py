"""`python -m specbench train-head method=NAME model=NAME [key=value ...]`.

Trains a method's head with the target frozen on a corpus (by default `zoo:corpus`, the zoo's training
conversations, rendered with the target's chat template) and writes it in the method's published
layout, ready for `method.head=OUT`. Every method that trains a head (Medusa, EAGLE, EAGLE-3, Hydra,
PPD, SpecDec, a methods/ folder's) does so through its own recipe (specbench.heads.recipe): its settings
are its YAML's `train:` section, changed as method.train.KEY=VALUE, with the flat tokens / seed / steps /
lr over them. The arguments are Hydra overrides of configs/train_head.yaml, composed as a run's config
is: `model=` (a configs/model name; `model.path=...` etc. reach into it) and `method=` pick the groups;
out, corpus (anything `specbench.datastore.read_corpus` reads: a .json/.jsonl/.parquet/.csv file of text
/ messages / ShareGPT conversations / Spec-Bench turns records, a text file with blank lines between
documents, a hub dataset id, `zoo:corpus`; `zoo` is short for `zoo:corpus`), split and text_field (for
those), seq_len, threads, device and draft (SpecDec's starting point). Any decoder that transformers
loads will do (head sizes come from its config's generic names). Settings are checked before the model
loads, each bad one named in a one-line error; a pad id the model cannot embed falls back to EOS (said
on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core.args import stop_if_parse_only
from specbench.core.errors import SpecbenchError

USAGE = ("python -m specbench train-head method=NAME model=NAME [model.path=...] [out=DIR] [method.train.KEY=VALUE "
         "...]")
#: the flat keys every recipe takes over its `train:` section (TrainingBase's fields)
SHARED_KEYS = ("tokens", "seed", "steps", "lr")
#: flat keys of earlier versions, now each method's `train:` settings
MOVED_KEYS = {"heads": "num_heads", "layers": "num_layers", "train_projections": "train_projections",
              "exit_layer": "exit_layer", "draft_vocab": "draft_vocab", "ttt_steps": "ttt_steps",
              "feature_layers": "layers", "block": "block"}
SEQ_LEN = 512
ZOO_CORPUS = "zoo:corpus"
#: Integer keys and their least value.
INT_KEYS = {"threads": 1, "seq_len": 2}


def compose(args: list[str]) -> DictConfig:
    """configs/train_head.yaml composed by Hydra with the command line (`model=`, `method=` pick the
    groups, `model.path=...` and `method.train.steps=...` reach into them). Unknown keys, a missing or
    untrainable method, a missing model and Hydra's own complaints are one-line errors."""
    from hydra import compose as hydra_compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from specbench.core.compose import first_line, on_config_dir
    from specbench.core.resources import CONFIG_DIR
    from specbench.run.registry import discover, register_with_hydra

    parser, parsed = OverridesParser.create(), []
    for arg in args:
        try:
            parsed += parser.parse_overrides([arg])
        except HydraException as exc:
            raise SpecbenchError(f"train-head takes key=value arguments, got '{arg}' ({first_line(exc)}); usage: "
                                 f"{USAGE}") from None
    keys = sorted(k for k in OmegaConf.load(CONFIG_DIR / "train_head.yaml") if k != "defaults")
    given: dict[str, Any] = {}
    for override in parsed:
        key = override.key_or_group
        if override.is_sweep_override():
            raise SpecbenchError(f"train-head {key}: give one value (a list is written {key}=[a,b])")
        if key in MOVED_KEYS:
            raise SpecbenchError(f"train-head {key}= is a setting of the method's recipe now: give "
                                 f"method.train.{MOVED_KEYS[key]}=VALUE (its YAML's train: section)")
        if key.split(".", 1)[0] not in (*keys, "model", "method") or override.is_add() or override.is_delete():
            raise SpecbenchError(f"unknown train-head key '{key}'; keys: {', '.join(keys)}, method, model, model.*, "
                                 "method.train.*")
        given[key] = override.value()
    registry = register_with_hydra(discover())
    trained = registry.trained()
    choice = f"method={', '.join(trained)}"
    if "method" not in given:
        raise SpecbenchError(f"train-head needs {choice}; usage: {USAGE}")
    if given["method"] not in trained:
        drafts_on = ""
        if given["method"] in registry.names():
            head = str(OmegaConf.to_container(registry.config(given["method"])).get("head") or "")
            if head.startswith("${parts:") and head[8:-1] in trained:
                drafts_on = f" ({given['method']} drafts on {head[8:-1]}'s head: train method={head[8:-1]})"
        raise SpecbenchError(f"train-head needs {choice} (got method={given['method']}){drafts_on}; usage: {USAGE}")
    if "model" not in given:
        raise SpecbenchError(f"train-head needs model=NAME (a configs/model name, e.g. model=tiny, or model=local "
                             f"model.path=/path/to/model); usage: {USAGE}")
    if not (CONFIG_DIR / "model" / f"{given['model']}.yaml").is_file():
        raise SpecbenchError(f"unknown model '{given['model']}'; use a name from {CONFIG_DIR / 'model'}")
    with on_config_dir():
        try:
            return hydra_compose("train_head", overrides=args)
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            cause = f": {first_line(exc.__cause__)}" if exc.__cause__ else ""
            raise SpecbenchError(f"train-head: {first_line(exc)}{cause} (the keys of configs/train_head.yaml, the "
                                 "model's and the method's, as method.train.KEY for its training settings)") from None


def _options(cfg: DictConfig) -> dict[str, str]:
    """The flat keys that are set, as text."""
    opts = {"method": str(cfg.method.name), "model": str(cfg.model.name)}
    for key, value in cfg.items():
        if key in ("defaults", "model", "method") or value is None:
            continue
        opts[key] = ",".join(map(str, value)) if OmegaConf.is_list(value) else str(value)
    return opts


def _int(opts: dict[str, str], key: str, default: int) -> int:
    """An integer option, at least INT_KEYS[key]."""
    if key not in opts:
        return default
    try:
        value = int(opts[key])
    except ValueError:
        raise SpecbenchError(f"train-head {key}={opts[key]!r} is not an integer; give e.g. {key}={default}") from None
    if value < INT_KEYS[key]:
        raise SpecbenchError(f"train-head {key}={value} must be at least {INT_KEYS[key]}")
    return value


def _out_folder(opts: dict[str, str], default: str) -> Path:
    """Where the head goes: a folder (new or existing), never an existing file or a path through one."""
    spec = opts.get("out", default)
    if not spec.strip():
        raise SpecbenchError("train-head out= is empty; give out=DIR for the head folder")
    out = Path(spec).expanduser()
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise SpecbenchError(f"train-head out={out}: {path} is a file, not a folder; give out= a new or "
                                 "existing folder")
    return out


def pad_id(tokenizer: Any, vocab: int) -> int:
    """The tokenizer's pad id when the model's embedding has it, else EOS, else 0 (said on stderr:
    padding never reaches a loss, but an id beyond the embedding would fail the target forward)."""
    pad = tokenizer.pad_token_id
    if pad is not None and 0 <= int(pad) < vocab:
        return int(pad)
    eos = tokenizer.eos_token_id
    fallback = int(eos) if isinstance(eos, int) and 0 <= eos < vocab else 0
    if pad is None:
        why = "the tokenizer has no pad token"
    else:
        why = f"the tokenizer's pad id {pad} is beyond the model's {vocab} embeddings"
    print(f"train-head: {why}; padding with id {fallback} ({'EOS' if fallback == eos else 'token 0'}) instead, "
          "which no loss reads", file=sys.stderr)
    return fallback


def corpus_documents(
    spec: str, tokenizer: Any, n_tokens: int, seq_len: int, *, split: str = "train", text_field: str | None = None
) -> list[list[int]]:
    """Token ids of whole documents of a corpus (each cut to `seq_len`) until about `n_tokens` tokens;
    `zoo` is short for `zoo:corpus`."""
    from specbench.datastore import read_corpus

    docs: list[list[int]] = []
    total = 0
    for ids in read_corpus(ZOO_CORPUS if spec == "zoo" else spec, tokenizer, split=split, text_field=text_field):
        if len(ids) > 1:  # one token teaches no next token
            docs.append(ids[:seq_len])
            total += len(docs[-1])
        if total >= n_tokens:
            break
    if not docs:
        raise SpecbenchError(f"corpus {spec} has no document of two or more tokens")
    return docs


def pack_rows(docs: list[list[int]], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole documents packed greedily into rows of `seq_len`; (ids, valid) tensors."""
    rows: list[list[int]] = [[]]
    for ids in docs:
        if len(rows[-1]) + len(ids) > seq_len:
            rows.append([])
        rows[-1].extend(ids)
    rows = [r for r in rows if r]
    ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), seq_len), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        valid[i, : len(r)] = True
    return ids, valid


def train_head_main(args: list[str]) -> int:
    """The body of `python -m specbench train-head`: the method's `train:` settings (with the flat tokens /
    seed / steps / lr over them), the corpus packed into rows, its recipe into `out`; the exit status."""
    from specbench.heads.recipe import HeadData, train_part, training_settings
    from specbench.models import load_model, resolve_device
    from specbench.run.registry import load_impl

    cfg = compose(args)
    opts = _options(cfg)
    method, model_cfg = opts["method"], cfg.model
    values = {**OmegaConf.to_container(cfg.method.train, resolve=True),
              **{k: cfg[k] for k in SHARED_KEYS if cfg.get(k) is not None}}
    cls = load_impl(str(cfg.method.impl), method)
    settings = training_settings(cls, values, method)
    stop_if_parse_only(cfg)
    if OmegaConf.is_missing(model_cfg, "path") or not str(model_cfg.get("path") or "").strip():
        raise SpecbenchError(f"model={opts['model']} needs model.path=/path/to/model (a folder or hub id)")
    seq_len = _int(opts, "seq_len", SEQ_LEN)
    out = _out_folder(opts, f"results/heads/{model_cfg.name}-{method}")
    if "threads" in opts:
        torch.set_num_threads(_int(opts, "threads", 1))
    device = resolve_device(opts.get("device", "auto"))
    trust = bool(model_cfg.get("trust_remote_code", False))
    draft = opts.get("draft") or model_cfg.get("draft")
    if cls.Training.starts_from_draft and not draft:
        raise SpecbenchError(f"train-head method={method} starts from a small draft model; give draft=HUB_ID|FOLDER "
                             f"(model={opts['model']} names none)")
    target = load_model(str(model_cfg.path), device=device, dtype=torch.float32, trust_remote_code=trust)
    vocab = int(target.model.get_input_embeddings().weight.shape[0])
    docs = corpus_documents(opts.get("corpus", ZOO_CORPUS), target.tokenizer, settings.tokens, seq_len,
                            split=opts.get("split", "train"), text_field=opts.get("text_field"))
    if max(max(d) for d in docs) >= vocab:
        raise SpecbenchError(f"the tokenizer of {model_cfg.path} gives token id {max(max(d) for d in docs)} but the "
                             f"model embeds only {vocab} tokens: tokenizer and model do not belong together")
    ids, valid = pack_rows(docs, seq_len, pad_id(target.tokenizer, vocab))

    def load_draft() -> torch.nn.Module:
        from specbench.methods.drafts import check_same_vocabulary

        loaded = load_model(str(draft), device=device, dtype=torch.float32, trust_remote_code=trust)
        check_same_vocabulary(target, loaded, str(draft))
        return loaded.model

    data = HeadData(target=target.model, tokenizer=target.tokenizer, input_ids=ids.to(device), valid=valid.to(device),
                    base=str(model_cfg.path), label=method, draft=load_draft if draft else None)
    card = train_part(cls, settings, data, out, method)
    print(f"{method} head for {model_cfg.path}: {data.rows(settings.tokens)} rows of {seq_len}, {card.get('steps')} "
          f"steps, {card['build_seconds']:.0f}s, top-1 agreement with the target {card.get('top1')}; saved to {out} "
          f"(use method.head={out})", file=sys.stderr)
    return 0
