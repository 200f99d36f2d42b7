"""Building the zoo as a list of stages.

Each stage reads what earlier ones left in `BuildContext.state` (or, for models, in the
output folder) and writes its own outputs (the heads' stage: every head trained on the same
target), so a stage is added without touching the others. The build writes into a
fresh folder that `ensure_zoo` moves into place only once the build finished.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM

from specbench import synth
from specbench.core.hardware import autocast_dtype
from specbench.zoo import card as cardlib
from specbench.zoo import data, train

CORPUS_MANIFEST = "corpus.json"
QUALITY_CARD = "quality.json"
MODEL_NAMES = ("target", "draft", "draft_plain")


@dataclass
class BuildContext:
    """What the stages share: the config, the output folder, in-memory state, the card."""

    cfg: DictConfig
    out: Path
    zoo_hash: str
    state: dict[str, Any] = field(default_factory=dict)
    card: dict[str, Any] = field(default_factory=dict)

    def model(self, name: str) -> torch.nn.Module:
        """A model built by an earlier stage: from memory, else from its saved folder."""
        if name not in self.state:
            self.state[name] = AutoModelForCausalLM.from_pretrained(self.out / name, dtype=torch.float32).eval()
        return self.state[name]

    def seed(self, offset: int) -> int:
        return int(self.cfg.seed) + offset


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[BuildContext], None]


def stage_corpus(ctx: BuildContext) -> None:
    """Training and held-out conversations from the synthetic generator (disjoint from the questions)."""
    ctx.state["train_items"] = data.conversations(ctx.cfg, "train")
    ctx.state["heldout_items"] = data.conversations(ctx.cfg, "heldout")


def stage_tokenizer(ctx: BuildContext) -> None:
    """Byte-level BPE with the chat template; the corpus rendered with it, tokenized and packed."""
    cfg = ctx.cfg
    tokenizer = data.train_tokenizer(cfg, ctx.state["train_items"])
    ctx.state["tokenizer"] = tokenizer
    seq_len = int(cfg.seq_len)
    train_rows = data.pack(data.encode_items(tokenizer, ctx.state["train_items"]), seq_len, tokenizer, ctx.seed(0))
    heldout_rows = data.pack(data.encode_items(tokenizer, ctx.state["heldout_items"]), seq_len, tokenizer,
                             ctx.seed(0))
    ctx.state["train_rows"], ctx.state["heldout_rows"] = train_rows, heldout_rows
    manifest = {
        "generator_version": synth.GENERATOR_VERSION,
        "train": {"n_conversations": len(ctx.state["train_items"]), "seed": int(cfg.corpus.train_seed),
                  "sha256": data.corpus_digest(ctx.state["train_items"]), "tokens": train_rows.n_tokens,
                  "rows": len(train_rows), "truncated": train_rows.n_truncated},
        "heldout": {"n_conversations": len(ctx.state["heldout_items"]), "seed": int(cfg.corpus.heldout_seed),
                    "sha256": data.corpus_digest(ctx.state["heldout_items"]), "tokens": heldout_rows.n_tokens,
                    "rows": len(heldout_rows), "truncated": heldout_rows.n_truncated},
        "question_seed": int(cfg.corpus.question_seed),
        "vocab_size": len(tokenizer),
        "seq_len": seq_len,
    }
    (ctx.out / CORPUS_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    ctx.card["corpus"] = manifest


def _train_stage(ctx: BuildContext, name: str, offset: int, teacher: str | None) -> None:
    cfg = ctx.cfg
    section = cfg[name]
    tokenizer = ctx.state["tokenizer"]
    model = train.make_model(section.arch, tokenizer, int(cfg.max_position_embeddings), ctx.seed(offset),
                             int(cfg.bench.max_new_tokens))
    stats = train.train(model, ctx.state["train_rows"], section.train, seed=ctx.seed(offset), desc=f"zoo {name}",
                        teacher=ctx.model(teacher) if teacher else None,
                        compute_dtype=autocast_dtype(str(cfg.train_dtype)))
    model.save_pretrained(ctx.out / name)
    # The chat template goes into tokenizer_config.json, where every transformers version reads it.
    tokenizer.save_pretrained(ctx.out / name, save_jinja_files=False)
    ctx.state[name] = model
    ctx.card.setdefault("models", {})[name] = {
        "params": train.n_params(model),
        "arch": OmegaConf.to_container(section.arch, resolve=True),
        "distilled_from": teacher,
        "train": stats.as_dict(),
    }


def stage_target(ctx: BuildContext) -> None:
    """The target Llama on hard labels."""
    _train_stage(ctx, "target", 1, teacher=None)


def stage_draft(ctx: BuildContext) -> None:
    """The draft, distilled from the target's next-token distribution."""
    _train_stage(ctx, "draft", 2, teacher="target")


def stage_draft_plain(ctx: BuildContext) -> None:
    """The same draft architecture on hard labels only (the plain SpS drafter)."""
    _train_stage(ctx, "draft_plain", 3, teacher=None)


def stage_card(ctx: BuildContext) -> None:
    """Held-out metrics, greedy-answer checks and decode speed."""
    cfg = ctx.cfg
    models = {name: ctx.model(name) for name in MODEL_NAMES if (ctx.out / name).is_dir()}
    tokenizer = ctx.state["tokenizer"]
    ctx.card["heldout"] = cardlib.heldout_metrics(models, ctx.state["heldout_rows"], int(cfg.card.eval_batch_size))
    math_items = [it for it in ctx.state["heldout_items"] if it["category"] == "math_reasoning"]
    questions = cardlib.question_sample(int(cfg.card.questions_per_subtask), int(cfg.corpus.question_seed))
    ctx.card["generation"] = cardlib.generation_checks(
        models["target"], tokenizer, questions, math_items[: int(cfg.card.n_math)], int(cfg.card.max_new_tokens))
    ctx.card["speed"] = cardlib.measure_speed(models["target"], models["draft"], int(cfg.speed.context),
                                              int(cfg.speed.verify_tokens), int(cfg.speed.reps), ctx.seed(4))
    values = {
        "target_accuracy": ctx.card["heldout"]["target"]["accuracy_all"],
        "draft_agreement": ctx.card["heldout"]["draft"]["agreement_all"],
        "eos_fraction": ctx.card["generation"]["eos_fraction"],
    }
    ctx.card["floors"] = {k: {"value": v, "floor": float(cfg.card.floors[k]), "ok": v >= float(cfg.card.floors[k])}
                          for k, v in values.items()}


STAGES: list[Stage] = [
    Stage("corpus", stage_corpus),
    Stage("tokenizer", stage_tokenizer),
    Stage("target", stage_target),
    Stage("draft", stage_draft),
    Stage("draft_plain", stage_draft_plain),
    Stage("card", stage_card),
]


def build(cfg: DictConfig, out: Path, zoo_hash: str, code_version: str) -> dict:
    """Run every stage into `out` and write the quality card; returns the card."""
    ctx = BuildContext(cfg=cfg, out=out, zoo_hash=zoo_hash)
    ctx.card.update({"zoo_hash": zoo_hash, "generator_version": synth.GENERATOR_VERSION,
                     "code_version": code_version, "recommended_max_new_tokens": int(cfg.bench.max_new_tokens)})
    timings: dict[str, float] = {}
    threads = torch.get_num_threads()
    total = time.perf_counter()
    # The build is a guest in the caller's process: keep its RNG and thread settings intact.
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(int(cfg.threads))
        try:
            for stage in STAGES:
                start = time.perf_counter()
                stage.run(ctx)
                timings[stage.name] = round(time.perf_counter() - start, 1)
                print(f"specbench zoo: stage {stage.name} done in {timings[stage.name]:.0f}s", file=sys.stderr,
                      flush=True)
        finally:
            torch.set_num_threads(threads)
    timings["total"] = round(time.perf_counter() - total, 1)
    ctx.card["build_seconds"] = timings
    ctx.card["config"] = OmegaConf.to_container(cfg, resolve=True)
    (out / QUALITY_CARD).write_text(json.dumps(ctx.card, indent=2) + "\n")
    return ctx.card
