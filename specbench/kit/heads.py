"""A kit's heads trained on its whole corpus: the target's states per shard (specbench.kit.features),
every training row, losses on answer tokens only, steps from epochs.

The training loops are the zoo's (specbench.heads.train) given the corpus as `Features` whose
states are `Ragged` views of the shards' stored states and whose `loss` mask marks the positions
drafting starts from (the last prompt token and the answer's), so every loss is on answer tokens
and every window starts near an answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.heads.train import Features
from specbench.kit.features import StateSpec, ensure_states, ragged
from specbench.zoo.train import autocast_dtype


def padded_rows(rows: Sequence[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, valid, loss) of `rows` as (rows, L) tensors: the real tokens, and the positions
    drafting starts from (from the last prompt token to the last but one)."""
    width = max(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    loss = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        seq = r["prompt_ids"] + r["answer_ids"]
        ids[i, :len(seq)] = torch.tensor(seq)
        valid[i, :len(seq)] = True
        loss[i, len(r["prompt_ids"]) - 1:len(seq) - 1] = True
    return ids, valid, loss


@dataclass
class CorpusStates:
    """The states of `spec` over a kit's corpus rows `rows` (corpus.jsonl rows: shard and row index),
    each shard's computed once per machine into `cache` by `loader`'s target."""

    rows: Sequence[dict]
    shard_rows: dict[int, list[dict]]
    cache: Any
    spec: StateSpec
    loader: Callable[[], torch.nn.Module]
    pad_id: int
    _tensors: dict[str, Any] = field(default_factory=dict, repr=False)

    def ensure(self) -> None:
        for shard, rows in sorted(self.shard_rows.items()):
            ensure_states(self.cache, shard, rows, self.spec, self.loader)

    def view(self, name: str) -> Any:
        """The `Ragged` states `name` (final, fused, exit) of the rows, each shard's file mapped (not read
        into memory: specbench.kit.features.mapped)."""
        if name not in self._tensors:
            self.ensure()
            from specbench.kit.features import mapped, states_file

            parts = {shard: mapped(states_file(self.cache, shard, self.spec))[name]
                     for shard in sorted(self.shard_rows)}
            self._tensors[name] = ragged([(int(r["shard"]), int(r["row"])) for r in self.rows], self.shard_rows,
                                         parts)
        return self._tensors[name]

    def release(self, name: str) -> None:
        self._tensors.pop(name, None)

    def features(self, *, fused: bool = False) -> Features:
        ids, valid, loss = padded_rows(self.rows, self.pad_id)
        return Features(ids, valid, self.view("final"), self.view("fused") if fused else None, loss=loss)

    @property
    def drafting_positions(self) -> int:
        return sum(len(r["answer_ids"]) for r in self.rows)


def steps_for(section: dict, positions: int, per_step: int) -> dict:
    """The section with `epochs` turned into optimiser steps over `positions` drafting positions,
    `per_step` of them a step (a section without `epochs` keeps its `steps`)."""
    out = dict(section)
    epochs = out.pop("epochs", None)
    if epochs is not None:
        out["steps"] = max(1, math.ceil(float(epochs) * positions / per_step))
    return out


#: each head a kit trains itself (its own part: specbench.kit.build.HEAD_GROUPS) and its seed's offset
#: from the kit's seed; Hydra and a methods/ folder's heads train through their recipes (specbench.heads.recipe)
SEED_OFFSETS = {"medusa": 5, "eagle": 6, "ppd": 8, "eagle3": 9, "specdec": 10}


def train_head(part: str, cfg: dict, states: CorpusStates, held: CorpusStates, target: torch.nn.Module,
               tokenizer: Any, draft: Callable[[], torch.nn.Module], base: str, label: str, seed: int,
               out: Any, ckpt: Any = None) -> dict:
    """The head `part` (one of SEED_OFFSETS: EAGLE, EAGLE-3, Medusa, PPD's exit head, SpecDec's drafter from
    the kit's distilled draft, loaded by `draft`) trained on every training row of the corpus (`cfg`: the
    kit's `build.heads`, the section's `epochs` as steps), saved into `out/<part>`; its card: the
    settings and stats, with its agreement on the held-out rows `held`. `ckpt`: a TrainingState the
    training saves its progress in and resumes from (specbench.core.resume)."""
    import time

    from specbench.heads.eagle import save_eagle
    from specbench.heads.eagle3 import save_eagle3
    from specbench.heads.exit import save_exit_head
    from specbench.heads.medusa import save_medusa
    from specbench.heads.specdec import save_specdec
    from specbench.heads.train import (
        train_eagle,
        train_eagle3,
        train_exit_head,
        train_medusa,
        train_specdec,
    )

    positions = states.drafting_positions
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    seed += SEED_OFFSETS[part]
    desc = f"{label} {part} head"
    seconds: dict[str, float] = {}

    def timed(name: str, run: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = run()
        seconds[name] = round(time.perf_counter() - start, 1)
        return result

    def settings(per_step: int, *drop: str) -> dict:
        return {k: v for k, v in steps_for(cfg[part], positions, per_step).items() if k not in (*drop, "dtype")}

    timed("states", states.ensure)
    section = cfg[part]
    # the heads' products in bfloat16 where the CPU has bf16 units (`dtype: auto`), as the methods' recipes
    # train (mixed precision): the frozen 49,152-word LM head's product and loss are most of a step's cost
    compute = autocast_dtype(str(section.get("dtype", "float32")))
    extra: dict[str, Any] = {"compute_dtype": str(compute or torch.float32).removeprefix("torch.")}
    if part == "medusa":
        kw = settings(int(section.get("batch_positions", 1024)))
        head, stats = timed("train", lambda: train_medusa(states.features(), lm_head, **kw, seed=seed,
                                                         compute_dtype=compute, ckpt=ckpt, desc=desc))
        save_medusa(head, out / part, base)
    elif part == "eagle":
        kw = settings(int(section["batch_rows"]) * int(section["window"]))
        head, stats = timed("train", lambda: train_eagle(states.features(), embed, lm_head, target.config, **kw,
                                                         seed=seed, compute_dtype=compute, ckpt=ckpt, desc=desc))
        save_eagle(head, out / part, base)
    elif part == "ppd":
        kw = settings(int(section.get("batch_positions", 1024)), "exit_layer")
        extra["exit_layer"] = states.spec.exit_layer
        head, stats = timed("train", lambda: train_exit_head(
            states.features(), states.view("exit"), lm_head, exit_layer=states.spec.exit_layer,
            num_layers=int(target.config.num_hidden_layers), **kw, seed=seed, compute_dtype=compute, ckpt=ckpt,
            desc=desc))
        states.release("exit")
        save_exit_head(head, out / part, int(lm_head.weight.shape[0]), base)
    elif part == "eagle3":
        kw = settings(int(section["batch_rows"]) * int(section["window"]), "layers")
        head, stats = timed("train", lambda: train_eagle3(states.features(fused=True), embed, lm_head, target.config,
                                                          **kw, layers=list(states.spec.fused), seed=seed,
                                                          compute_dtype=compute, ckpt=ckpt, desc=desc))
        states.release("fused")
        save_eagle3(head, out / part, base)
        extra["draft_vocab"] = head.draft_vocab_size
    elif part == "specdec":
        kw = settings(int(section["batch_rows"]) * int(section["window"]))
        head, queries, stats = timed("train", lambda: train_specdec(states.features(), draft(), lm_head, **kw,
                                                                    seed=seed, compute_dtype=compute, ckpt=ckpt,
                                                                    desc=desc))
        save_specdec(head, queries, tokenizer, out / part, int(lm_head.weight.shape[0]), base)
        extra.update({"block": queries.block, "query_params": queries.embeddings.numel()})
    else:
        raise ValueError(f"no head part {part!r}; the kit's heads: {', '.join(SEED_OFFSETS)}")
    card: dict[str, Any] = {"rows": len(states.rows), "drafting_positions": positions,
                            "params": sum(p.numel() for p in head.parameters()), **extra, **kw, **stats.as_dict()}
    if part != "specdec" and held.rows:
        measured = timed("heldout", lambda: heldout_agreement({part: head}, held, target))
        card["heldout_top1"] = [round(v, 4) for v in measured[part]]
    if part == "eagle" and held.rows:  # EAGLE (and EAGLE-2's tree on it) drafting on its own states, as at run time
        chain = timed("heldout_chain", lambda: eagle_chain(head, held, target))
        card["heldout_chain"] = [round(v, 4) for v in chain]
        card["heldout_mean_accepted_chain"] = round(1 + sum(chain), 4)
    card["seconds"] = seconds
    return card


@torch.no_grad()
def heldout_agreement(heads: dict[str, Any], held: CorpusStates, target: torch.nn.Module,
                      max_positions: int = 40_000) -> dict[str, list[float]]:
    """Top-1 agreement with the target at held-out drafting positions (never a training row),
    teacher-forced: per head for Medusa and Hydra (head k: the token k + 2 ahead), the first
    drafted token for EAGLE (its predicted feature through the LM head), EAGLE-3 (its first step,
    on the fused states) and PPD (the exit head). Rows are read in order until `max_positions`."""
    if not held.rows:
        return {}
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    final = held.view("final")
    fused = held.view("fused") if "eagle3" in heads else None
    exits = held.view("exit") if "ppd" in heads else None
    hits: dict[str, torch.Tensor] = {}
    seen: dict[str, torch.Tensor] = {}

    def count(name: str, depth: int, agree: torch.Tensor) -> None:
        size = max(depth + 1, len(hits.get(name, ())))
        for store in (hits, seen):
            old = store.get(name, torch.zeros(0))
            store[name] = torch.cat([old, torch.zeros(size - len(old))])
        hits[name][depth] += float(agree.sum())
        seen[name][depth] += agree.numel()

    done = 0
    for r, row in enumerate(held.rows):
        if done >= max_positions:
            break
        p, n = len(row["prompt_ids"]), len(row["prompt_ids"]) + len(row["answer_ids"])
        if n - p < 2:
            continue
        ids = torch.tensor(row["prompt_ids"] + row["answer_ids"])
        first = max(0, p - 1 - 64)  # some prompt context for the heads that attend (kept states reach back further)
        span = torch.arange(first, n)
        f = final[torch.tensor(r), span]
        choice = lm_head(f).argmax(-1)  # the target's next token after each position
        t = torch.arange(p - 1 - first, n - 1 - first)  # drafting positions, relative to `first`
        done += len(t)
        if "medusa" in heads:
            logits = heads["medusa"](f[t], lm_head)
            for k in range(logits.shape[-2]):
                ok = t + k + 1 < len(span)
                count("medusa", k, logits[ok, k].argmax(-1) == choice[t[ok] + k + 1])
        if "hydra" in heads:
            hydra = heads["hydra"]
            x = f[t]
            for k in range(hydra.num_heads):
                ok = t + k + 1 < len(span)
                x = torch.cat([x, embed(ids[(span[0] + t + k + 1).clamp(max=n - 1)]).float()], -1)
                count("hydra", k, hydra.head(k, x)[ok].argmax(-1) == choice[t[ok] + k + 1])
        if "eagle" in heads:
            pred = heads["eagle"](embed(ids[span[1:]])[None].float(), f[:-1][None], span[:-1][None])[0]
            count("eagle", 0, lm_head(pred[t]).argmax(-1) == choice[t + 1])
        if "eagle3" in heads and fused is not None:
            head = heads["eagle3"]
            h = fused[torch.tensor(r), span[:-1]]
            out = head(embed(ids[span[1:]])[None].float(), h[None], span[:-1][None], head.new_cache())[0]
            drafted = head.target_ids()[head.draft_logits(out[t]).argmax(-1)]
            count("eagle3", 0, drafted == choice[t + 1])
        if "ppd" in heads and exits is not None:
            e = exits[torch.tensor(r), span]
            count("ppd", 0, heads["ppd"](e[t], lm_head).argmax(-1) == choice[t])
    return {name: (hits[name] / seen[name].clamp(min=1)).tolist() for name in hits}


@torch.no_grad()
def eagle_chain(head: torch.nn.Module, held: CorpusStates, target: torch.nn.Module, *, depth: int = 5,
                context: int = 64, max_positions: int = 1500) -> list[float]:
    """EAGLE's chain acceptance per depth on held-out rows the target answered greedily: from a
    drafting position t (the target's state f_t and its next token known), the head drafts `depth`
    tokens in a row on its own predicted states, as it does at run time; depth d counts when the
    first d drafted tokens all equal the target's (for a greedy row, the corpus's next tokens). The
    head sees `context` positions of teacher-forced states before t."""
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    final = held.view("final")
    runs = torch.zeros(depth)
    starts = 0
    for r, row in enumerate(held.rows):
        if starts >= max_positions or float(row.get("temperature", 0)) > 0:
            continue
        p, n = len(row["prompt_ids"]), len(row["prompt_ids"]) + len(row["answer_ids"])
        ids = torch.tensor(row["prompt_ids"] + row["answer_ids"])
        for t in range(p - 1, n - 1 - depth, 4):  # every fourth drafting position with `depth` tokens after it
            lo = max(0, t - context + 1)
            feats = final[torch.tensor(r), torch.arange(lo, t + 1)]  # f_lo .. f_t
            tokens = ids[lo + 1:t + 2]  # x_{lo+1} .. x_{t+1}
            accepted = 0
            for d in range(depth):
                pred = head(embed(tokens)[None].float(), feats[None], torch.arange(lo, lo + len(tokens))[None])[0, -1]
                drafted = lm_head(pred).argmax(-1)
                if int(drafted) != int(ids[t + 2 + d]):
                    break
                accepted += 1
                feats = torch.cat([feats, pred[None]])
                tokens = torch.cat([tokens, drafted[None]])
            runs[:accepted] += 1
            starts += 1
    return (runs / max(starts, 1)).tolist()
