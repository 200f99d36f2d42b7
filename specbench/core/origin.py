"""Where a folder of weights came from: `origin.json` in the folders specbench restores, fetches or
trains (the zoo's: shipped with the code, published on the package index, or trained on this machine),
and the summary a run records of every such folder it used, so that tables never mix weights silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ORIGIN_FILE = "origin.json"


def read_origin(folder: str | Path) -> dict[str, Any] | None:
    """The origin recorded in `folder` (or, for a model folder inside a zoo, in the folder above it)."""
    for place in (Path(folder), Path(folder).parent):
        try:
            origin = json.loads((place / ORIGIN_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(origin, dict):
            return origin
    return None


def summary(paths: dict[str, str]) -> dict[str, Any] | None:
    """What a run records of the weights it used: per `prefix:NAME` spec with an origin, its source
    and fingerprint; `source` is theirs when all agree ("mixed" otherwise), `fingerprint` the release's
    when every part is shipped or published, else the parts' fingerprints joined. None without origins."""
    parts = {}
    for spec, path in sorted(paths.items()):
        origin = read_origin(path)
        if origin is not None:
            parts[spec] = {"source": origin.get("source"), "fingerprint": origin.get("fingerprint")}
    if not parts:
        return None
    sources = {part["source"] for part in parts.values()}
    prints = sorted({str(part["fingerprint"]) for part in parts.values()})
    return {"source": sources.pop() if len(sources) == 1 else "mixed", "fingerprint": "+".join(prints),
            "parts": parts}


def head_line(record: dict[str, Any]) -> str:
    """A loaded head's provenance (specbench.heads.checkpoint.head_record) in one line:
    `yuhuili/EAGLE-Vicuna-7B-v1.3@<commit>: EAGLE-1 (<variant>), pytorch_model.bin sha256 <16 hex>`."""
    where = record.get("hub") or record["head"]
    return f"{where}: {record['format']} ({record['variant']}), {record['file']} sha256 {str(record['sha256'])[:16]}"
