"""Files from the Hugging Face hub, each checked against the checksum the hub lists for it before use:
an LFS file's sha256, a small file's git blob id. What a kit's target and a published head download.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.questions import sha256_of

#: `owner/name` or `owner/name@revision`: what a hub model id looks like (a path on this machine wins)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def offline() -> bool:
    """Whether the user switched the hub off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in flags)


def is_hub_id(spec: str) -> bool:
    """`owner/name[@revision]` that names no path on this machine."""
    return bool(HUB_ID.match(spec)) and not Path(spec.split("@", 1)[0]).expanduser().exists()


def git_blob_id(path: Path) -> str:
    """Git's object id of a small (non-LFS) file: sha1 over 'blob <size>\\0' + content."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def listing(repo: str, revision: str, names: list[str]) -> tuple[str, dict[str, Any]]:
    """The commit `revision` names and the hub's entries (size, checksum) of those of `names` the
    repository has; SpecbenchError when the hub does not answer."""
    if offline():
        raise SpecbenchError("the hub is switched off (HF_HUB_OFFLINE)")
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        commit = api.model_info(repo, revision=revision).sha or revision
        listed = {f.path: f for f in api.get_paths_info(repo, names, revision=commit)}
    except Exception as exc:  # noqa: BLE001 - the HTTP stack's errors vary (httpx, requests, hub wrappers)
        raise SpecbenchError(f"the hub did not answer for {repo} ({type(exc).__name__})") from None
    return commit, listed


def download_checked(repo: str, name: str, commit: str, info: Any) -> Path:
    """One listed file of `repo` at `commit`, in the hub's cache, after its checksum matched."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(repo, name, revision=commit))
    except Exception as exc:  # noqa: BLE001 - as above
        raise SpecbenchError(f"download of {repo}/{name} failed ({type(exc).__name__}); try again") from None
    if getattr(info, "lfs", None) is not None:
        expected, got = info.lfs.sha256, sha256_of(path)
    else:
        expected, got = info.blob_id, git_blob_id(path)
    if got != expected:
        raise SpecbenchError(f"checksum mismatch for {repo}/{name}: the hub lists {expected}, the download has "
                             f"{got}; it was not used")
    return path
