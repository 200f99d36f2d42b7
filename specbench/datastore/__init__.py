"""REST's datastore: token sequences indexed by a suffix array, for longest-suffix retrieval.

On disk a datastore is a folder of three files, loaded without pickle:

- `tokens.npy`: int32 (N,), the documents' token ids, each document followed by -1;
- `suffix_array.npy`: int32 or int64 (N,), the start of every suffix of `tokens` in
  lexicographic order (the separator -1 sorts before every token, so no match crosses a
  document boundary); built by libdivsufsort (`pydivsufsort`);
- `manifest.json`: `format` ("specbench-datastore"), `version`, `tokenizer` (name and a
  SHA-256 fingerprint of its vocabulary), `vocab_size`, `n_tokens`, `n_documents`,
  `source` (free text), `build_seconds`.

Loading refuses a datastore made with another tokenizer (a different fingerprint): its ids
would mean other tokens. Corpora are read by `read_corpus` (specbench.datastore.corpus).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specbench.core.errors import SpecbenchError
from specbench.core.files import build_once
from specbench.datastore.corpus import read_corpus  # noqa: F401 - the corpus reader, re-exported

FORMAT = "specbench-datastore"
VERSION = 1
TOKENS_FILE = "tokens.npy"
SA_FILE = "suffix_array.npy"
MANIFEST_FILE = "manifest.json"
SEPARATOR = -1
MMAP_BYTES = 1 << 28  # suffix arrays above 256 MiB are memory-mapped, not read


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's token -> id map (added tokens included): equal iff ids mean the same."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array of an int array (libdivsufsort via pydivsufsort; ids shifted so the separator is 0)."""
    from pydivsufsort import divsufsort

    shifted = (tokens.astype(np.int64) - SEPARATOR).astype(np.uint32)
    return np.asarray(divsufsort(shifted))


def _concat(docs: Iterable[Sequence[int]]) -> tuple[np.ndarray, int]:
    parts: list[np.ndarray] = []
    sep = np.array([SEPARATOR], dtype=np.int32)
    for doc in docs:
        if len(doc):
            parts += [np.asarray(doc, dtype=np.int32), sep]
    if not parts:
        raise SpecbenchError("the corpus has no text to index")
    return np.concatenate(parts), len(parts) // 2


def build(
    docs: Iterable[Sequence[int]], tokenizer: Any, out: str | Path, source: str = "", progress: bool = False
) -> Path:
    """Index tokenized documents into the datastore folder `out` (built aside, then renamed into place
    under its lock: core.files.build_once)."""
    out = build_once(Path(out), MANIFEST_FILE, lambda tmp: fill(tmp, docs, tokenizer, source, progress), rebuild=True)
    if progress:
        print(f"specbench datastore: wrote {out}", file=sys.stderr, flush=True)
    return out


def fill(
    folder: Path, docs: Iterable[Sequence[int]], tokenizer: Any, source: str = "", progress: bool = False
) -> None:
    """Index tokenized documents into `folder`, a folder being built (its manifest written last)."""
    start = time.perf_counter()
    tokens, n_docs = _concat(docs)
    vocab = len(tokenizer)
    if int(tokens.max()) >= vocab:
        raise SpecbenchError(f"token id {int(tokens.max())} is outside the tokenizer's {vocab} ids")
    if progress:
        print(f"specbench datastore: {n_docs} documents, {tokens.size} tokens; sorting suffixes", file=sys.stderr,
              flush=True)
    sa = suffix_array(tokens)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / TOKENS_FILE, tokens, allow_pickle=False)
    np.save(folder / SA_FILE, sa, allow_pickle=False)
    manifest = {
        "format": FORMAT, "version": VERSION,
        "tokenizer": {"name": str(getattr(tokenizer, "name_or_path", "")), "sha256": tokenizer_fingerprint(tokenizer)},
        "vocab_size": vocab, "n_tokens": int(tokens.size), "n_documents": n_docs, "source": source,
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")  # written last
    if progress:
        print(f"specbench datastore: indexed in {manifest['build_seconds']} s", file=sys.stderr, flush=True)


@dataclass
class Match:
    """A retrieved suffix: its length and the suffix-array range [lo, hi) of its occurrences."""

    length: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


class Datastore:
    """A loaded datastore (arrays in memory, or memory-mapped read-only when large)."""

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, manifest: dict[str, Any]) -> None:
        if tokens.shape != sa.shape:
            raise SpecbenchError("datastore tokens and suffix array differ in length")
        self.tokens = tokens
        self.sa = sa
        self.manifest = manifest
        self.n = int(tokens.shape[0])

    @classmethod
    def load(cls, folder: str | Path, tokenizer: Any = None) -> Datastore:
        """Open a datastore folder; with `tokenizer`, refuse one built with another tokenizer."""
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text())
        except (OSError, ValueError):
            raise SpecbenchError(f"{folder} is not a datastore (no readable {MANIFEST_FILE}); build one with "
                                 "`python -m specbench datastore build`") from None
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise SpecbenchError(f"{folder}: datastore format {manifest.get('format')} v{manifest.get('version')} "
                                 f"is not {FORMAT} v{VERSION}; rebuild it")
        if tokenizer is not None:
            want = tokenizer_fingerprint(tokenizer)
            if manifest.get("tokenizer", {}).get("sha256") != want:
                raise SpecbenchError(
                    f"datastore {folder} was built with tokenizer '{manifest.get('tokenizer', {}).get('name')}', "
                    "not the target's; rebuild it with --model <the target>")
        # In memory, lookups are ~2x faster than through a memory map; only huge stores stay on disk.
        mmap = "r" if (folder / SA_FILE).stat().st_size > MMAP_BYTES else None
        tokens = np.load(folder / TOKENS_FILE, mmap_mode=mmap, allow_pickle=False)
        sa = np.load(folder / SA_FILE, mmap_mode=mmap, allow_pickle=False)
        return cls(tokens, sa, manifest)

    def _bound(self, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
        """First suffix-array index in [lo, hi) whose suffix is >= pattern (upper: > every
        suffix starting with pattern). Python list comparison is lexicographic with shorter-is-smaller,
        exactly the suffix order."""
        length = len(pattern)
        tokens, sa = self.tokens, self.sa
        while lo < hi:
            mid = (lo + hi) // 2
            start = int(sa[mid])
            seg = tokens[start : start + length].tolist()
            if seg < pattern or (upper and seg == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find(self, pattern: Sequence[int], lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """The suffix-array range [lo, hi) of the occurrences of `pattern` (empty range if none)."""
        pattern = list(pattern)
        hi = self.n if hi is None else hi
        first = self._bound(pattern, lo, hi, upper=False)
        return first, self._bound(pattern, first, hi, upper=True)

    def longest_suffix(self, context: Sequence[int], max_len: int, min_len: int = 1) -> Match | None:
        """The longest suffix of `context` (between min_len and max_len tokens) found in the datastore.

        Occurrence is monotone in the length (a suffix occurs if a longer one does), so the
        length is found by binary search: ~log2(max_len) range searches.
        """
        context = list(context[-max_len:])
        best: Match | None = None
        lo_len, hi_len = min_len, min(max_len, len(context))
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            lo, hi = self.find(context[len(context) - mid :])
            if hi > lo:
                best = Match(mid, lo, hi)
                lo_len = mid + 1
            else:
                hi_len = mid - 1
        return best

    def continuations(self, match: Match, depth: int, max_matches: int) -> np.ndarray:
        """(m, depth) int array of the tokens after up to `max_matches` occurrences (evenly spread
        over the range, so that no lexicographic slice dominates); -1 past a document's end."""
        count = match.count
        if count > max_matches:
            index = match.lo + (np.arange(max_matches, dtype=np.int64) * count) // max_matches
            starts = np.asarray(self.sa[index], dtype=np.int64)
        else:
            starts = np.asarray(self.sa[match.lo : match.hi], dtype=np.int64)
        where = np.minimum(starts[:, None] + match.length + np.arange(depth), self.n - 1)
        conts = np.asarray(self.tokens[where.ravel()]).reshape(where.shape)
        ended = np.cumsum(conts < 0, axis=1) > 0  # everything from a separator on is not a continuation
        conts[ended] = SEPARATOR
        return conts


def top_trie(conts: np.ndarray, budget: int, with_counts: bool = False) -> tuple[list[int], ...]:
    """The `budget` most frequent prefixes of the continuations as a trie: (tokens, parents), and
    with `with_counts` each node's count (continuations that start with its prefix).

    Nodes are sorted by (count desc, depth asc); a parent is at least as frequent as its
    children and shallower, so the choice is closed under parents. Returned in topological
    order (by depth), parents as indices into the returned list (-1 = the root).
    """
    m, depth = conts.shape
    if m == 0 or depth == 0 or budget <= 0:
        return [], []
    order = np.lexsort(conts.T[::-1])
    rows = conts[order]
    # First column where each row differs from the one before (depth when identical).
    diff = rows[1:] != rows[:-1]
    first_diff = np.where(diff.any(1), diff.argmax(1), depth)
    starts = np.ones((m, depth), dtype=bool)
    starts[1:] = first_diff[:, None] <= np.arange(depth)
    col, row = np.nonzero(starts.T)  # column-major: by depth, then by row
    nxt = np.append(row[1:], m)
    same_col = np.append(col[1:] == col[:-1], False)
    counts = np.where(same_col, nxt, m) - row
    tok = rows[row, col]
    keep = tok >= 0
    col, row, counts, tok = col[keep], row[keep], counts[keep], tok[keep]
    chosen = np.lexsort((row, col, -counts))[:budget]
    chosen = chosen[np.lexsort((row[chosen], col[chosen]))]  # topological: by depth, then row
    tokens: list[int] = []
    parents: list[int] = []
    chosen_counts = counts[chosen].tolist()
    by_depth: dict[int, tuple[list[int], list[int]]] = {}  # depth -> (start rows, node indices)
    for i, (c, r, t) in enumerate(zip(col[chosen].tolist(), row[chosen].tolist(), tok[chosen].tolist())):
        parent = -1
        if c > 0:
            rows_above, nodes_above = by_depth[c - 1]
            # The parent is the chosen node one level up with the last start <= r (runs are contiguous).
            parent = nodes_above[int(np.searchsorted(rows_above, r, side="right")) - 1]
        entry = by_depth.setdefault(c, ([], []))
        entry[0].append(r)
        entry[1].append(i)
        tokens.append(t)
        parents.append(parent)
    return (tokens, parents, chosen_counts) if with_counts else (tokens, parents)
