"""Parts of the zoo built after it and cached beside it: the EAGLE and Medusa heads.

They depend on the trained target but are kept out of the zoo's own hash, so a change of a
head setting retrains the heads only. Built in a temporary folder and renamed into place
under a file lock, like the zoo itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.zoo.store import COMPLETE, CONFIG_PATH, ensure_zoo, load_zoo_config

HEADS_CONFIG = CONFIG_PATH.with_name("zoo_heads.yaml")
HEADS = ("eagle", "medusa")
HEADS_CODE_VERSION = "heads-1"
HEADS_CARD = "heads.json"


def heads_dir(zoo: Path) -> Path:
    """`<zoo root>/<zoo hash>.heads-<hash of zoo_heads.yaml>` (not necessarily built yet)."""
    # The zoo's COMPLETE marker carries its build time: a forced rebuild of the target (same
    # hash, new weights) gets new heads instead of reusing ones trained on the old target.
    payload = json.dumps({"config": OmegaConf.to_container(OmegaConf.load(HEADS_CONFIG), resolve=True),
                          "code": HEADS_CODE_VERSION, "zoo": (zoo / COMPLETE).read_text()}, sort_keys=True)
    return zoo.with_name(f"{zoo.name}.heads-{hashlib.sha256(payload.encode()).hexdigest()[:8]}")


def ensure_heads() -> Path:
    """The folder holding `eagle/` and `medusa/` for the zoo's target, trained first if needed."""
    zoo = ensure_zoo()
    final = heads_dir(zoo)
    if (final / HEADS_CARD).is_file():
        return final
    with open(final.with_name(final.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits, then reuses
        if (final / HEADS_CARD).is_file():
            return final
        print(f"specbench: training the zoo's EAGLE and Medusa heads into {final} (a few minutes on 2 CPU cores; "
              "done once, then cached)", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
        try:
            card = _train_heads(zoo, tmp)
            (tmp / HEADS_CARD).write_text(json.dumps(card, indent=2) + "\n")  # written last: marks it complete
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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
            items = data.conversations(zoo_cfg, "train")
            ctx.state["train_rows"] = data.pack(data.encode_items(tokenizer, items), int(cfg.seq_len), tokenizer,
                                                ctx.seed(0))
            zoo_stage(ctx)
        finally:
            torch.set_num_threads(threads)
    ctx.card["heads"]["build_seconds"] = round(time.perf_counter() - start, 1)
    return ctx.card["heads"]


def resolve(name: str) -> Path:
    """The folder a `zoo:NAME` spec names: a zoo model, a head, or the REST datastore."""
    if name in HEADS:
        return ensure_heads() / name
    if name == "datastore":
        from specbench.methods.rest import zoo_datastore

        return zoo_datastore()
    return ensure_zoo() / name
