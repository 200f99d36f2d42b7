"""`python -m specbench train-head method=medusa|eagle model=NAME [key=value ...]`.

Trains a head with the target frozen on a corpus (by default `zoo:corpus`, the zoo's training
conversations, rendered with the target's chat template) and writes it in the published layout,
ready for `method.head=OUT`. Keys: method, model (a configs/model name; `model.path=...` etc.
override its fields), out, corpus (anything `specbench.datastore.read_corpus` reads: a
.json/.jsonl/.parquet/.csv file of text / messages / ShareGPT conversations / Spec-Bench turns
records, a text file with blank lines between documents, a hub dataset id, `zoo:corpus`; `zoo`
is short for `zoo:corpus`), split and text_field (for those), tokens (corpus tokens to use),
steps, lr, seed, threads, device, seq_len, and for Medusa heads / layers / train_projections.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specbench.core.errors import SpecbenchError

USAGE = "python -m specbench train-head method=medusa|eagle model=NAME [model.path=...] [out=DIR] [key=value ...]"
KEYS = {"method", "model", "out", "corpus", "split", "text_field", "tokens", "steps", "lr", "seed", "threads", "device",
        "heads", "layers", "train_projections", "seq_len"}
SEQ_LEN = 512
ZOO_CORPUS = "zoo:corpus"


def _parse(args: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    model_overrides: list[str] = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise SpecbenchError(f"train-head takes key=value arguments, got '{arg}'; usage: {USAGE}")
        if key.startswith("model."):
            model_overrides.append(f"{key[len('model.'):]}={value}")
        elif key in KEYS:
            opts[key] = value
        else:
            raise SpecbenchError(f"unknown train-head key '{key}'; keys: {', '.join(sorted(KEYS))}, model.*")
    if opts.get("method") not in ("medusa", "eagle", "eagle2"):
        raise SpecbenchError(f"train-head needs method=medusa or method=eagle; usage: {USAGE}")
    return opts, model_overrides


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
    from specbench.core.resources import CONFIG_DIR
    from specbench.heads import train as headtrain
    from specbench.heads.eagle import save_eagle
    from specbench.heads.medusa import save_medusa
    from specbench.models import load_model, resolve_device

    opts, overrides = _parse(args)
    method = "eagle" if opts["method"] == "eagle2" else opts["method"]
    model_name = opts.get("model", "tiny")
    model_file = CONFIG_DIR / "model" / f"{model_name}.yaml"
    if not model_file.is_file():
        raise SpecbenchError(f"unknown model '{model_name}'; use a name from {CONFIG_DIR / 'model'}")
    model_cfg = OmegaConf.merge(OmegaConf.load(model_file), OmegaConf.from_dotlist(overrides))
    if opts.get("threads"):
        torch.set_num_threads(int(opts["threads"]))
    seed = int(opts.get("seed", 0))
    device = resolve_device(opts.get("device", "auto"))
    target = load_model(str(model_cfg.path), device=device, dtype=torch.float32,
                        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))
    tokenizer = target.tokenizer
    seq_len = int(opts.get("seq_len", SEQ_LEN))
    n_tokens = int(opts.get("tokens", headtrain.DEFAULT_TOKENS))
    docs = corpus_documents(opts.get("corpus", ZOO_CORPUS), tokenizer, n_tokens, seq_len,
                            split=opts.get("split", "train"), text_field=opts.get("text_field"))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, valid = pack_rows(docs, seq_len, int(pad))
    start = time.perf_counter()
    data = headtrain.collect_features(target.model, ids.to(device), valid.to(device))
    out = Path(opts.get("out") or f"results/heads/{model_cfg.name}-{method}")
    settings: dict[str, Any] = {"seed": seed}
    if "steps" in opts:
        settings["steps"] = int(opts["steps"])
    if "lr" in opts:
        settings["lr"] = float(opts["lr"])
    model = target.model
    if method == "medusa":
        for key, name in (("heads", "num_heads"), ("layers", "num_layers")):
            if key in opts:
                settings[name] = int(opts[key])
        if "train_projections" in opts:
            settings["train_projections"] = opts["train_projections"].lower() in ("1", "true", "yes")
        heads, stats = headtrain.train_medusa(data, model.get_output_embeddings(),
                                              **{**headtrain.MEDUSA_DEFAULTS, **settings})
        save_medusa(heads, out, str(model_cfg.path))
    else:
        head, stats = headtrain.train_eagle(data, model.get_input_embeddings(), model.get_output_embeddings(),
                                            model.config, **{**headtrain.EAGLE_DEFAULTS, **settings})
        save_eagle(head, out, str(model_cfg.path))
    print(f"{method} head for {model_cfg.path}: {data.n_tokens} tokens, {stats.steps} steps, "
          f"{time.perf_counter() - start:.0f}s, top-1 agreement with the target {stats.accuracy}; "
          f"saved to {out} (use method.head={out})", file=sys.stderr)
    return 0
