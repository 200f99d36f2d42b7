"""When generation stops: EOS, the template's stop strings, or max_new_tokens.

Shared by every method, so each one cuts its output at exactly the same place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class StopCriteria:
    """Stop rules for one generate call.

    `cut(tokens, start)` looks at the generated tokens from index `start` on (the ones
    appended since the last check) and returns the length the output must be truncated to
    when a rule fired there, else None. EOS tokens are kept in the output (as
    `model.generate` keeps them); a stop string keeps the token that completed it.
    """

    eos_ids: frozenset[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[Sequence[int]], str] | None = None
    _window: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.stop_strings and self.decode is None:
            raise ValueError("stop strings need a decode function")
        # A stop string can span at most this many tokens (one char per token worst case).
        self._window = max((len(s) for s in self.stop_strings), default=0) + 2

    @classmethod
    def build(
        cls,
        eos_ids: Iterable[int],
        max_new_tokens: int,
        stop_strings: Iterable[str] = (),
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> StopCriteria:
        return cls(frozenset(eos_ids), max_new_tokens, tuple(s for s in stop_strings if s), decode)

    def cut(self, tokens: Sequence[int], start: int = 0) -> int | None:
        for i in range(start, len(tokens)):
            if tokens[i] in self.eos_ids or i + 1 >= self.max_new_tokens:
                return i + 1
            if self.stop_strings and self._has_stop_string(tokens, i):
                return i + 1
        return None

    def _has_stop_string(self, tokens: Sequence[int], i: int) -> bool:
        text = self.decode(tokens[max(0, i + 1 - self._window) : i + 1])  # type: ignore[misc]
        return any(s in text for s in self.stop_strings)


def eos_token_ids(*sources: object) -> set[int]:
    """The EOS ids named by `sources`: each an id, a list of ids (a generation config may give several,
    e.g. Llama-3) or None."""
    ids: set[int] = set()
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)  # type: ignore[union-attr]
    return ids


def answer_text(tokens: Iterable[int], decode: Callable[..., str], eos_ids: Iterable[int],
                stop_strings: Iterable[str]) -> str:
    """An answer's text as upstream files it: EOS tokens dropped, special tokens skipped, cut before the
    first stop string, stripped. `decode` is a tokenizer's decode."""
    eos = set(eos_ids)
    text = decode([t for t in tokens if t not in eos], skip_special_tokens=True)
    for stop in stop_strings:
        if stop in text:
            text = text[: text.index(stop)]
    return text.strip()
