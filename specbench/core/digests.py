"""SHA-256 of files, cached per machine: a 10 GB model (or a published head) is read once per machine,
not once per run, lane or load."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from specbench.core.files import write_atomic
from specbench.core.questions import sha256_of
from specbench.core.resources import cache_root

#: the file of cached fingerprints under the cache root: (path, size, mtime) -> sha256 of the content
FINGERPRINTS = "fingerprints.json"

#: the fingerprint files read in this process (cache file -> its digests), so each is read once
_DIGESTS: dict[Path, dict[str, str]] = {}


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content, cached by (path, size, modification time) under the cache root."""
    cache_file = cache_root() / FINGERPRINTS
    if cache_file not in _DIGESTS:
        try:
            _DIGESTS[cache_file] = json.loads(cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            _DIGESTS[cache_file] = {}
    cache = _DIGESTS[cache_file]
    st = Path(path).stat()
    key = f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if key not in cache:
        cache[key] = sha256_of(path)
        with contextlib.suppress(OSError):  # a cache that cannot be written costs time, never the run
            write_atomic(cache_file, json.dumps(cache, sort_keys=True))
    return cache[key]
