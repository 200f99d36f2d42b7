"""A kit's heads trained on its whole corpus: the target's states per shard (specbench.kit.features),
every training row, losses on answer tokens only, steps from epochs.

Each head is its method's recipe (specbench.heads.recipe) given `CorpusHeadData`: the corpus as
`Features` whose states are `Ragged` views of the shards' stored states and whose `loss` mask marks
the positions drafting starts from (the last prompt token and the answer's), so every loss is on answer
tokens and every window starts near an answer; the card's agreement is measured on held-out rows.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.heads.recipe import HeadData
from specbench.heads.train import Features
from specbench.kit.features import StateSpec, ensure_states, ragged


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

    def respec(self, spec: StateSpec) -> CorpusStates:
        """The same rows with the states `spec` (their own files)."""
        return dataclasses.replace(self, spec=spec, _tensors={})

    def features(self, *, fused: bool = False) -> Features:
        ids, valid, loss = padded_rows(self.rows, self.pad_id)
        return Features(ids, valid, self.view("final"), self.view("fused") if fused else None, loss=loss)

    @property
    def drafting_positions(self) -> int:
        return sum(len(r["answer_ids"]) for r in self.rows)


@dataclass
class CorpusHeadData(HeadData):
    """A recipe's data on a kit's corpus (specbench.heads.recipe): every training row's states from the
    shards' files, whatever `tokens` the recipe asks for, losses on answer tokens (the drafting
    positions), `epochs` over those positions, and each card's agreement measured on the held-out rows.

    The states every head reads come from one teacher-forced pass per shard (`states.spec`: the final
    state, the kit's fused layers and exit layer); a recipe that asks for other fused layers or another
    exit layer gets a pass of its own (said on stderr). The held-out rows are read with the states the
    last request read."""

    states: CorpusStates | None = None  # the training rows
    held: CorpusStates | None = None  # the held-out rows (never trained on)
    _held_now: CorpusStates | None = field(default=None, repr=False)

    def _pick(self, fused: Sequence[int] | None = None, exit_layer: int | None = None) -> CorpusStates:
        shared = self.states.spec
        want = tuple(fused or ())
        if (not want or want == shared.fused) and (exit_layer is None or exit_layer == shared.exit_layer):
            self._held_now = self.held
            return self.states
        spec = StateSpec(final=True, fused=want, exit_layer=exit_layer)
        print(f"specbench: {self.label}: a head asks for states the shared pass does not keep (fused {list(want)}, "
              f"exit layer {exit_layer}; kept: fused {list(shared.fused)}, exit layer {shared.exit_layer}): a pass of "
              "its own over the corpus (set the kit's build.states to share it)", file=sys.stderr, flush=True)
        self._held_now = self.held.respec(spec)
        return self.states.respec(spec)

    def features(self, tokens: int, layers: Sequence[int] | None = None) -> Features:
        return self._pick(fused=layers).features(fused=bool(layers))

    def exit_states(self, tokens: int, exit_layer: int) -> Any:
        return self._pick(exit_layer=exit_layer).view("exit")

    def positions(self, tokens: int) -> int:
        return self.states.drafting_positions

    def heldout(self, kind: str, head: torch.nn.Module) -> dict:
        """Top-1 agreement per depth on the held-out rows (`heldout_agreement`, scored by the method's own
        `heldout_score`); where the method drafts a chain on its own states (`heldout_next_state`: EAGLE,
        whose head EAGLE-2's tree also runs on), that chain's acceptance per depth too."""
        from specbench.run.registry import discover

        held = self._held_now or self.held
        cls = discover().recipe(kind)[0]
        if getattr(cls, "heldout_score", None) is None or held is None or not held.rows:
            return {}
        start = time.perf_counter()
        agreement = heldout_agreement(lambda row: cls.heldout_score(head, row), held, self.target)
        out: dict[str, Any] = {"heldout_top1": [round(v, 4) for v in agreement]}
        if getattr(cls, "heldout_next_state", None) is not None:
            chain = chain_acceptance(lambda *a: cls.heldout_next_state(head, *a), held, self.target)
            out["heldout_chain"] = [round(v, 4) for v in chain]
            out["heldout_mean_accepted_chain"] = round(1 + sum(chain), 4)
        out["heldout_seconds"] = round(time.perf_counter() - start, 1)
        return out


@dataclass
class HeldRow:
    """One held-out row at its drafting positions, as a method's `heldout_score` reads it: the states
    over `span` (some prompt context, then the answer), the drafting positions `t` (indices into
    `span`), the target's next token after each position of `span` (`choice`), its tokens `ids`, and
    the target's embedding and LM head."""

    index: int
    ids: torch.Tensor
    span: torch.Tensor
    t: torch.Tensor
    final: torch.Tensor
    choice: torch.Tensor
    lm_head: torch.nn.Module
    embed: torch.nn.Module
    held: CorpusStates

    def fused(self) -> torch.Tensor:
        """EAGLE-3's fused states over `span` but its last position."""
        return self.held.view("fused")[torch.tensor(self.index), self.span[:-1]]

    def exits(self) -> torch.Tensor:
        """The exit layer's states over `span` (PPD)."""
        return self.held.view("exit")[torch.tensor(self.index), self.span]


@torch.no_grad()
def heldout_agreement(score: Callable[[HeldRow], Iterable[tuple[int, torch.Tensor]]], held: CorpusStates,
                      target: torch.nn.Module, max_positions: int = 40_000) -> list[float]:
    """Top-1 agreement with the target at held-out drafting positions (never a training row),
    teacher-forced, per depth: `score(row)` gives (depth, agreement at each position) pairs (a
    method's `heldout_score`). Rows are read in order until `max_positions`."""
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    final = held.view("final")
    hits, seen = torch.zeros(0), torch.zeros(0)
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
        t = torch.arange(p - 1 - first, n - 1 - first)  # drafting positions, relative to `first`
        done += len(t)
        for depth, agree in score(HeldRow(r, ids, span, t, f, lm_head(f).argmax(-1), lm_head, embed, held)):
            if depth >= len(hits):
                hits, seen = (torch.cat([x, torch.zeros(depth + 1 - len(x))]) for x in (hits, seen))
            hits[depth] += float(agree.sum())
            seen[depth] += agree.numel()
    return (hits / seen.clamp(min=1)).tolist()


@torch.no_grad()
def chain_acceptance(next_state: Callable[..., torch.Tensor], held: CorpusStates, target: torch.nn.Module, *,
                     depth: int = 5, context: int = 64, max_positions: int = 1500) -> list[float]:
    """A feature-level head's chain acceptance per depth on held-out rows the target answered greedily:
    from a drafting position t (the target's state f_t and its next token known), the head drafts
    `depth` tokens in a row on its own predicted states (`next_state(embedded tokens, states,
    positions)`: the state it drafts after them), as it does at run time; depth d counts when the
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
                pred = next_state(embed(tokens).float(), feats, torch.arange(lo, lo + len(tokens)))
                drafted = lm_head(pred).argmax(-1)
                if int(drafted) != int(ids[t + 2 + d]):
                    break
                accepted += 1
                feats = torch.cat([feats, pred[None]])
                tokens = torch.cat([tokens, drafted[None]])
            runs[:accepted] += 1
            starts += 1
    return (runs / max(starts, 1)).tolist()
