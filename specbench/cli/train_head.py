"""`python -m specbench train-head method=medusa|eagle|eagle3|hydra|ppd|specdec model=NAME [key=value ...]`.

Trains a head with the target frozen on a corpus (by default `zoo:corpus`, the zoo's training
conversations, rendered with the target's chat template) and writes it in the published layout,
ready for `method.head=OUT`. The arguments are Hydra overrides of configs/train_head.yaml, composed
as a run's config is: `model=` (a configs/model name; `model.path=...` etc. reach into it) and
`method=` pick the groups; out, corpus (anything `specbench.datastore.read_corpus` reads: a
.json/.jsonl/.parquet/.csv file of text / messages / ShareGPT conversations / Spec-Bench turns
records, a text file with blank lines between documents, a hub dataset id, `zoo:corpus`; `zoo`
is short for `zoo:corpus`), split and text_field (for those), seq_len, threads, device, and tokens,
seed, steps, lr for every head. Medusa, EAGLE, EAGLE-3, PPD and SpecDec train through
specbench.heads.train's loops with the flat keys heads / layers / train_projections (Medusa),
exit_layer (PPD; default half the model's blocks), draft_vocab, ttt_steps, feature_layers (EAGLE-3;
three hidden_states indices, e.g. [2,4,8]; default the published (2, L/2, L-3)), draft and block
(SpecDec). A method whose YAML has a `train:` section (Hydra, a methods/ folder's) trains through its
own recipe (specbench.heads.recipe): its settings are that section, changed as method.train.KEY=VALUE.
Any decoder that transformers loads will do (head sizes come from its config's generic names).
Settings are checked before the model loads, each bad one named in a one-line error; a pad id
the model cannot embed falls back to EOS (said on stderr).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.core.args import stop_if_parse_only
from specbench.core.errors import SpecbenchError

USAGE = ("python -m specbench train-head method=medusa|eagle|eagle3|hydra|ppd|specdec model=NAME [model.path=...] "
         "[out=DIR] [key=value ...]")
#: the heads trained by specbench.heads.train's loops, set by this command's flat keys; a method whose YAML
#: has a `train:` section (Hydra, a methods/ folder's) trains through its own recipe (method.train.KEY=VALUE)
LOOPS = ("medusa", "eagle", "eagle2", "eagle3", "ppd", "specdec")
#: flat keys of the loops only, and the flat keys every recipe also takes (TrainingBase's fields)
LOOP_KEYS = ("heads", "layers", "train_projections", "exit_layer", "draft_vocab", "ttt_steps", "feature_layers",
             "block")
SHARED_KEYS = ("tokens", "seed", "steps", "lr")
SEQ_LEN = 512
ZOO_CORPUS = "zoo:corpus"


MEDUSA_KEYS = ("heads", "layers", "train_projections")
#: Integer keys and their least value.
INT_KEYS = {"tokens": 1, "steps": 1, "seed": 0, "threads": 1, "seq_len": 2, "heads": 1, "layers": 0, "exit_layer": 1,
            "draft_vocab": 1, "ttt_steps": 1, "block": 2}
BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def compose(args: list[str]) -> tuple[DictConfig, list[str]]:
    """configs/train_head.yaml composed by Hydra with the command line (`model=`, `method=` pick the
    groups, `model.path=...` and `method.train.steps=...` reach into them); (config, the methods that
    train through their own recipe). Unknown keys, a missing or untrainable method, a missing model and
    Hydra's own complaints are one-line errors."""
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
        if key.split(".", 1)[0] not in (*keys, "model", "method") or override.is_add() or override.is_delete():
            raise SpecbenchError(f"unknown train-head key '{key}'; keys: {', '.join(keys)}, method, model, model.*, "
                                 "method.train.*")
        given[key] = override.value()
    registry = register_with_hydra(discover())
    trained = registry.trained()
    names = ["medusa", "eagle", "eagle3", *trained, "ppd"]
    choice = f"method={', '.join(names)} or specdec"
    if "method" not in given:
        raise SpecbenchError(f"train-head needs {choice}; usage: {USAGE}")
    if given["method"] not in (*LOOPS, *trained):
        raise SpecbenchError(f"train-head needs {choice} (got method={given['method']}); usage: {USAGE}")
    if "model" not in given:
        raise SpecbenchError(f"train-head needs model=NAME (a configs/model name, e.g. model=tiny, or model=local "
                             f"model.path=/path/to/model); usage: {USAGE}")
    if not (CONFIG_DIR / "model" / f"{given['model']}.yaml").is_file():
        raise SpecbenchError(f"unknown model '{given['model']}'; use a name from {CONFIG_DIR / 'model'}")
    with on_config_dir():
        try:
            cfg = hydra_compose("train_head", overrides=args)
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            cause = f": {first_line(exc.__cause__)}" if exc.__cause__ else ""
            raise SpecbenchError(f"train-head: {first_line(exc)}{cause} (the keys of configs/train_head.yaml, the "
                                 "model's and the method's, as method.train.KEY for its training settings)") from None
    return cfg, trained


def _options(cfg: DictConfig, recipe: bool) -> dict[str, str]:
    """The flat keys that are set, as text (what the loops' checks read), checked against the method."""
    opts = {"method": str(cfg.method.name), "model": str(cfg.model.name)}
    for key, value in cfg.items():
        if key in ("defaults", "model", "method") or value is None:
            continue
        opts[key] = ",".join(map(str, value)) if OmegaConf.is_list(value) else str(value)
    method = opts["method"]
    if recipe:
        extra = [k for k in LOOP_KEYS if k in opts]
        if extra:
            raise SpecbenchError(f"train-head {', '.join(extra)}: method={method} trains through its own recipe and "
                                 "takes its settings as method.train.KEY=VALUE (its YAML's train: section)")
        return opts
    if method != "medusa":
        extra = [k for k in MEDUSA_KEYS if k in opts]
        if extra:
            raise SpecbenchError(f"train-head {', '.join(extra)} apply to method=medusa only; drop them for "
                                 f"method={method}")
    if "exit_layer" in opts and method != "ppd":
        raise SpecbenchError(f"train-head exit_layer applies to method=ppd only; drop it for method={method}")
    extra = [k for k in ("draft_vocab", "ttt_steps", "feature_layers") if k in opts]
    if extra and method != "eagle3":
        raise SpecbenchError(f"train-head {', '.join(extra)} apply to method=eagle3 only; drop them for "
                             f"method={method}")
    extra = [k for k in ("draft", "block") if k in opts]
    if extra and method != "specdec":
        raise SpecbenchError(f"train-head {', '.join(extra)} apply to method=specdec only; drop them for "
                             f"method={method}")
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


def _settings(opts: dict[str, str], method: str) -> dict[str, Any]:
    """The trainer's keyword settings from the command line (checked)."""
    from specbench.heads import train as headtrain

    defaults = {"medusa": headtrain.MEDUSA_DEFAULTS, "ppd": headtrain.PPD_DEFAULTS,
                "eagle3": headtrain.EAGLE3_DEFAULTS, "specdec": headtrain.SPECDEC_DEFAULTS}.get(method,
                                                                                  headtrain.EAGLE_DEFAULTS)
    settings: dict[str, Any] = {"seed": _int(opts, "seed", 0)}
    if "steps" in opts:
        settings["steps"] = _int(opts, "steps", defaults["steps"])
    if "lr" in opts:
        try:
            lr = float(opts["lr"])
        except ValueError:
            lr = float("nan")
        if not lr > 0 or lr == float("inf"):
            raise SpecbenchError(f"train-head lr={opts['lr']!r} must be a positive number, e.g. lr={defaults['lr']}")
        settings["lr"] = lr
    if method == "medusa":
        for key, name in (("heads", "num_heads"), ("layers", "num_layers")):
            if key in opts:
                settings[name] = _int(opts, key, defaults[name])
        if "train_projections" in opts:
            flag = opts["train_projections"].strip().lower()
            if flag not in BOOLEANS:
                raise SpecbenchError(f"train-head train_projections={opts['train_projections']!r} must be true or "
                                     "false")
            settings["train_projections"] = BOOLEANS[flag]
    if method == "specdec" and "block" in opts:
        settings["block"] = _int(opts, "block", defaults["block"])
    if method == "eagle3":
        for key in ("draft_vocab", "ttt_steps"):
            if key in opts:
                settings[key] = _int(opts, key, 1)
        if "feature_layers" in opts:
            try:
                settings["layers"] = [int(x) for x in opts["feature_layers"].split(",")]
            except ValueError:
                settings["layers"] = []
            if len(settings["layers"]) != 3 or min(settings["layers"]) < 0:
                raise SpecbenchError(f"train-head feature_layers=[{opts['feature_layers']}]: give three "
                                     "hidden_states indices, e.g. feature_layers=[2,4,8]")
    return settings


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
    """The body of `python -m specbench train-head`; returns the exit status."""
    from specbench.heads import train as headtrain
    from specbench.heads.eagle import save_eagle
    from specbench.heads.eagle3 import save_eagle3
    from specbench.heads.exit import save_exit_head
    from specbench.heads.medusa import save_medusa
    from specbench.models import load_model, resolve_device

    cfg, trained = compose(args)
    recipe = str(cfg.method.name) in trained
    opts = _options(cfg, recipe)
    stop_if_parse_only(cfg)
    method = "eagle" if opts["method"] == "eagle2" else opts["method"]
    model_cfg = cfg.model
    if OmegaConf.is_missing(model_cfg, "path") or not str(model_cfg.get("path") or "").strip():
        raise SpecbenchError(f"model={opts['model']} needs model.path=/path/to/model (a folder or hub id)")
    if recipe:
        return _train_recipe(cfg, opts)
    settings = _settings(opts, method)
    seq_len = _int(opts, "seq_len", SEQ_LEN)
    n_tokens = _int(opts, "tokens", headtrain.DEFAULT_TOKENS)
    out = _out_folder(opts, f"results/heads/{model_cfg.name}-{method}")
    if "threads" in opts:
        torch.set_num_threads(_int(opts, "threads", 1))
    device = resolve_device(opts.get("device", "auto"))
    target = load_model(str(model_cfg.path), device=device, dtype=torch.float32,
                        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))
    tokenizer = target.tokenizer
    model = target.model
    vocab = int(model.get_input_embeddings().weight.shape[0])
    docs = corpus_documents(opts.get("corpus", ZOO_CORPUS), tokenizer, n_tokens, seq_len,
                            split=opts.get("split", "train"), text_field=opts.get("text_field"))
    top = max(max(d) for d in docs)
    if top >= vocab:
        raise SpecbenchError(f"the tokenizer of {model_cfg.path} gives token id {top} but the model embeds only "
                             f"{vocab} tokens: tokenizer and model do not belong together")
    ids, valid = pack_rows(docs, seq_len, pad_id(tokenizer, vocab))
    start = time.perf_counter()
    layers = None
    if method == "eagle3":
        from specbench.heads.eagle3 import feature_layers

        layers = feature_layers(int(model.config.get_text_config().num_hidden_layers), settings.get("layers"))
    data = headtrain.collect_features(model, ids.to(device), valid.to(device), layers=layers)
    if method == "medusa":
        heads, stats = headtrain.train_medusa(data, model.get_output_embeddings(),
                                              **{**headtrain.MEDUSA_DEFAULTS, **settings})
        save_medusa(heads, out, str(model_cfg.path))
    elif method == "ppd":
        n_layers = int(model.config.get_text_config().num_hidden_layers)
        exit_layer = _int(opts, "exit_layer", n_layers // 2)
        if exit_layer >= n_layers:
            raise SpecbenchError(f"train-head exit_layer={exit_layer} must be below the model's {n_layers} blocks")
        states = headtrain.collect_exit_states(model, ids.to(device), valid.to(device), exit_layer)
        heads, stats = headtrain.train_exit_head(data, states, model.get_output_embeddings(), exit_layer=exit_layer,
                                                 num_layers=n_layers, **{**headtrain.PPD_DEFAULTS, **settings})
        save_exit_head(heads, out, int(model.get_output_embeddings().weight.shape[0]), str(model_cfg.path))
    elif method == "specdec":
        from specbench.heads.specdec import save_specdec
        from specbench.methods.drafts import check_same_vocabulary

        spec = opts.get("draft") or model_cfg.get("draft")
        if not spec:
            raise SpecbenchError(f"train-head method=specdec starts from a small draft model; give draft=HUB_ID|FOLDER "
                                 f"(model={opts['model']} names none)")
        draft = load_model(str(spec), device=device, dtype=torch.float32,
                           trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))
        check_same_vocabulary(target, draft, str(spec))
        nar, queries, stats = headtrain.train_specdec(data, draft.model, model.get_output_embeddings(),
                                                      **{**headtrain.SPECDEC_DEFAULTS, **settings})
        save_specdec(nar, queries, draft.tokenizer, out, int(model.get_output_embeddings().weight.shape[0]),
                     str(model_cfg.path))
    elif method == "eagle3":
        heads, stats = headtrain.train_eagle3(data, model.get_input_embeddings(), model.get_output_embeddings(),
                                              model.config, **{**headtrain.EAGLE3_DEFAULTS, **settings})
        save_eagle3(heads, out, str(model_cfg.path))
    else:
        head, stats = headtrain.train_eagle(data, model.get_input_embeddings(), model.get_output_embeddings(),
                                            model.config, **{**headtrain.EAGLE_DEFAULTS, **settings})
        save_eagle(head, out, str(model_cfg.path))
    print(f"{method} head for {model_cfg.path}: {data.n_tokens} tokens, {stats.steps} steps, "
          f"{time.perf_counter() - start:.0f}s, top-1 agreement with the target {stats.accuracy}; "
          f"saved to {out} (use method.head={out})", file=sys.stderr)
    return 0


def _train_recipe(cfg: DictConfig, opts: dict[str, str]) -> int:
    """A method that trains its own head (specbench.heads.recipe): its `train:` settings (with the flat
    tokens / seed / steps / lr over them), the corpus packed into rows, its recipe into `out`."""
    from specbench.heads.recipe import HeadData, train_part, training_settings
    from specbench.models import load_model, resolve_device
    from specbench.run.registry import load_impl

    method, model_cfg = opts["method"], cfg.model
    values = {**OmegaConf.to_container(cfg.method.train, resolve=True),
              **{k: cfg[k] for k in SHARED_KEYS if cfg.get(k) is not None}}
    cls = load_impl(str(cfg.method.impl), method)
    settings = training_settings(cls, values, method)
    seq_len = _int(opts, "seq_len", SEQ_LEN)
    out = _out_folder(opts, f"results/heads/{model_cfg.name}-{method}")
    if "threads" in opts:
        torch.set_num_threads(_int(opts, "threads", 1))
    device = resolve_device(opts.get("device", "auto"))
    trust = bool(model_cfg.get("trust_remote_code", False))
    target = load_model(str(model_cfg.path), device=device, dtype=torch.float32, trust_remote_code=trust)
    vocab = int(target.model.get_input_embeddings().weight.shape[0])
    docs = corpus_documents(opts.get("corpus", ZOO_CORPUS), target.tokenizer, settings.tokens, seq_len,
                            split=opts.get("split", "train"), text_field=opts.get("text_field"))
    if max(max(d) for d in docs) >= vocab:
        raise SpecbenchError(f"the tokenizer of {model_cfg.path} gives token id {max(max(d) for d in docs)} but the "
                             f"model embeds only {vocab} tokens: tokenizer and model do not belong together")
    ids, valid = pack_rows(docs, seq_len, pad_id(target.tokenizer, vocab))
    draft = opts.get("draft") or model_cfg.get("draft")
    data = HeadData(target=target.model, tokenizer=target.tokenizer, input_ids=ids.to(device), valid=valid.to(device),
                    base=str(model_cfg.path), label=method,
                    draft=(lambda: load_model(str(draft), device=device, dtype=torch.float32,
                                              trust_remote_code=trust).model) if draft else None)
    card = train_part(cls, settings, data, out, method)
    print(f"{method} head for {model_cfg.path}: {data.rows(settings.tokens)} rows of {seq_len}, {settings.steps} "
          f"steps, {card['build_seconds']:.0f}s, top-1 agreement with the target {card.get('top1')}; saved to {out} "
          f"(use method.head={out})", file=sys.stderr)
    return 0
