"""Build before the clock: every part a run names is built, fetched or restored before its model loads,
one line each; afterwards (specbench.core.files.find_only) resolving a path only finds."""

from __future__ import annotations

import sys
import time

from specbench.models import is_part, resolve_path

#: why a part cannot be built once the run has prepared its parts
FIND_ONLY = ("a run builds every part it names before its clock starts (model.path, model.draft, the methods' "
             "settings); build this one with `specbench zoo build` or `specbench kit build KIT --parts PART`")


def prepare_parts(specs: list[str]) -> None:
    """Build before the clock: every `prefix:NAME` part the run names (the zoo's, a kit's: specbench.models'
    resolvers) built, fetched or restored where this machine has not got it yet, one line each (a
    builder shows its own progress). Hub ids and folders are the model loader's."""
    for spec in dict.fromkeys(specs):
        if not is_part(spec):
            continue
        start = time.perf_counter()
        path = resolve_path(spec)
        print(f"part {spec}: {path} ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
