"""Command-line parsing whose mistakes are one-line errors, like every other bad input."""

from __future__ import annotations

import argparse
import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from specbench.core.errors import SpecbenchError

_PARSE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("specbench_parse_only", default=False)


class ParsedOnly(Exception):
    """Raised by a command instead of doing its work while `parse_only()` is on: its command line
    parsed (and, for `run`, composed). `parsed` is what the command parsed."""

    def __init__(self, parsed: Any) -> None:
        super().__init__("parsed")
        self.parsed = parsed


@contextmanager
def parse_only() -> Iterator[None]:
    """Within this block, `python -m specbench ...` (`specbench.cli.main`) checks a command line and
    stops with ParsedOnly before doing anything: how the docs' commands are tested."""
    token = _PARSE_ONLY.set(True)
    try:
        yield
    finally:
        _PARSE_ONLY.reset(token)


def stop_if_parse_only(parsed: Any) -> None:
    """Raise ParsedOnly(parsed) inside parse_only(); nothing otherwise."""
    if _PARSE_ONLY.get():
        raise ParsedOnly(parsed)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a bad argument raises SpecbenchError (printed as one `error:`
    line, exit 2) instead of printing the usage block, and that parsing ends the command inside
    `parse_only()`."""

    def error(self, message: str) -> NoReturn:
        raise SpecbenchError(f"{self.prog}: {message}; see `{self.prog} --help`")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        stop_if_parse_only(parsed)
        return parsed
