"""REST: retrieval-based speculative decoding (He et al. 2023).

Each step the longest suffix of the context (prompt + generated, up to `max_suffix` tokens,
at least `min_suffix`) that occurs in the datastore retrieves the tokens that followed its
occurrences; their most frequent `num_draft` prefixes form a trie, verified as a token tree
by the shared engine (deterministic candidates, lossless under sampling too).
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

import torch

from specbench import datastore as ds
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.errors import SpecbenchError
from specbench.methods.base import Prefilled
from specbench.sampling import SamplingParams

ZOO_DATASTORE = "zoo:datastore"


def zoo_datastore() -> Path:
    """The zoo's datastore: `<zoo>/datastore` when the zoo build made one, else built once
    from the zoo's training corpus into `<zoo>.datastore` next to it (a few seconds)."""
    from specbench import zoo
    from specbench.zoo import data as zoo_data
    from specbench.zoo.store import load_zoo_config

    folder = zoo.ensure_zoo()
    inside = folder / "datastore"
    if (inside / ds.MANIFEST_FILE).is_file():
        return inside
    beside = folder.with_name(folder.name + ".datastore")
    if (beside / ds.MANIFEST_FILE).is_file():
        return beside
    with open(folder.with_name(folder.name + ".datastore.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting at once build it once
        if not (beside / ds.MANIFEST_FILE).is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(folder / "target")
            build_corpus_datastore(tokenizer, zoo_data.conversations(load_zoo_config(), "train"), beside,
                                   f"zoo {folder.name} training corpus")
    return beside


def build_corpus_datastore(tokenizer: Any, items: list[dict], out: Path, source: str) -> Path:
    """A datastore of synthetic-corpus conversations rendered with the chat template (the zoo's stage)."""
    from specbench.zoo import data as zoo_data

    return ds.build(zoo_data.encode_items(tokenizer, items), tokenizer, out, source=source, progress=True)


def resolve_datastore(spec: str | None) -> Path:
    if not spec:
        raise SpecbenchError("method rest needs a datastore: build one with `python -m specbench datastore build "
                             "--corpus FILE --model MODEL --out DIR` and set method.datastore=DIR")
    if str(spec) == ZOO_DATASTORE:
        return zoo_datastore()
    return Path(str(spec)).expanduser()


class RestDrafter(Drafter):
    """Longest-suffix retrieval from a datastore, merged into a frequency-ranked trie."""

    def __init__(self, store: ds.Datastore, max_suffix: int = 16, min_suffix: int = 2, num_draft: int = 64,
                 draft_depth: int = 10, max_matches: int = 512) -> None:
        if not 1 <= min_suffix <= max_suffix or num_draft < 1 or draft_depth < 1 or max_matches < 1:
            raise SpecbenchError("rest needs 1 <= min_suffix <= max_suffix and positive num_draft, draft_depth, "
                                 "max_matches")
        self.store = store
        self.max_suffix, self.min_suffix = max_suffix, min_suffix
        self.num_draft, self.depth, self.max_matches = num_draft, draft_depth, max_matches
        self.prompt: list[int] = []

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.prompt = state.input_ids[0, -self.max_suffix :].tolist()

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.depth, ctx.max_depth)
        if depth <= 0:
            return DraftTree.empty(ctx.device)
        tail = ctx.tokens[-self.max_suffix :]
        if len(tail) < self.max_suffix:
            tail = self.prompt[max(0, len(self.prompt) - (self.max_suffix - len(tail))) :] + tail
        match = self.store.longest_suffix(tail, self.max_suffix, self.min_suffix)
        if match is None:
            return DraftTree.empty(ctx.device)
        conts = self.store.continuations(match, depth, self.max_matches)
        tokens, parents = ds.top_trie(conts, self.num_draft)
        if not tokens:
            return DraftTree.empty(ctx.device)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=ctx.device), tuple(parents))


class REST(SpeculativeMethod):
    """`method=rest`: `method.datastore` is a datastore folder or `zoo:datastore`."""

    def build_drafter(self) -> Drafter:
        store = ds.Datastore.load(resolve_datastore(self.cfg.get("datastore")), self.target.tokenizer)
        return RestDrafter(
            store,
            max_suffix=int(self.cfg.get("max_suffix", 16)),
            min_suffix=int(self.cfg.get("min_suffix", 2)),
            num_draft=int(self.cfg.get("num_draft", 64)),
            draft_depth=int(self.cfg.get("draft_depth", 10)),
            max_matches=int(self.cfg.get("max_matches", 512)),
        )
