"""Command-line parsing whose mistakes are one-line errors, like every other bad input."""

from __future__ import annotations

import argparse
from typing import NoReturn

from specbench.core.errors import SpecbenchError


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a bad argument raises SpecbenchError (printed as one `error:`
    line, exit 2) instead of printing the usage block."""

    def error(self, message: str) -> NoReturn:
        raise SpecbenchError(f"{self.prog}: {message}; see `{self.prog} --help`")
