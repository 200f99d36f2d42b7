"""The zoo's reference weights, shipped in the repository: every machine benchmarks the same models.

`weights/` (a checkout's top-level folder; SPECBENCH_WEIGHTS_DIR names another) holds the folders a
zoo build leaves in the cache (the zoo itself `<hash>`, each trained head `<hash>.NAME-<key>`), as they
would be built here, under `weights/zoo/`, and one manifest, `weights/MANIFEST.json`: each file's SHA-256
and size, the release's fingerprint, and how each part is stored. Safetensors files are stored smaller
than they are used:
- a tensor equal to one of the zoo target's (a head's frozen vocabulary projection, a copied
  embedding) is stored once, in the target, and named in the file's metadata;
- a part whose held-out agreement in bfloat16 stays within 1% of float32's is stored in bfloat16
  (the manifest's `storage`; the measurement in its `measured`).
A run that needs one of these folders and finds none in the cache restores it (`fill`): every
file's checksum verified first (a differing file is a one-line error that names it), the shared
tensors put back, float32 restored, the origin (`origin.json`: shipped, its release and
fingerprint) written. The restored folder is the same on every machine, byte for byte.

The order a folder comes from (specbench.zoo.store, specbench.zoo.parts): the cache, then these
weights, then a published wheel (specbench.zoo.release: installs without a checkout), then training
here (marked local, with its own fingerprint, in the folder and in every run's meta.json).
`python -m specbench zoo ship` writes a new release from the built cache folders (maintainers:
only when a part's recipe changes, with the leaderboard regenerated in the same change).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from functools import cache
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import safetensors_header, write_atomic
from specbench.core.origin import ORIGIN_FILE, read_origin
from specbench.core.questions import sha256_of
from specbench.core.resources import checkout_folder

#: another folder of shipped weights than the checkout's `weights/`
WEIGHTS_VAR = "SPECBENCH_WEIGHTS_DIR"
MANIFEST = "MANIFEST.json"
#: where the zoo's folders lie inside the weights folder
ZOO_DIR = "zoo"
#: where a kit's parts lie: `kits/<kit>/<target id>/<group or head folder>/` (specbench.kit.build)
KITS_DIR = "kits"
#: a stored tensor shared with a kit's target names it `target:<file>#<tensor>` (the target is not shipped)
TARGET_REF = "target:"
#: the key of a stored safetensors file's metadata that says how to restore it
META_KEY = "specbench"
STORAGE = ("bfloat16", "float32")
#: pickle formats: never shipped in weights/ or a wheel, never unpacked (the loaders read safetensors first)
PICKLED = ("*.pt", "*.pth", "*.bin", "*.pkl", "*.pickle")


def weights_root() -> Path | None:
    """$SPECBENCH_WEIGHTS_DIR if set, else the checkout's `weights/`; None when neither exists (a wheel install)."""
    return checkout_folder(WEIGHTS_VAR, "weights")


def weights_folder(given: str | None) -> Path:
    """Where `zoo ship` / `kit ship` write: `--out DIR`, else the checkout's weights folder."""
    out = Path(given) if given else weights_root()
    if out is None:
        raise SpecbenchError("no weights folder: run from a specbench checkout, or pass --out DIR")
    return out


def parse_storage(items: list[str]) -> dict[str, str]:
    """`--storage PART=DTYPE` options as {part: dtype}."""
    storage = {}
    for item in items:
        part, sep, dtype = item.partition("=")
        if not sep or dtype not in STORAGE:
            raise SpecbenchError(f"--storage takes PART=DTYPE with DTYPE one of {', '.join(STORAGE)}; got {item!r}")
        storage[part] = dtype
    return storage


def read_manifest(root: Path | None = None) -> dict[str, Any] | None:
    """The shipped weights' manifest, or None when there are none."""
    root = root if root is not None else weights_root()
    if root is None or not (root / MANIFEST).is_file():
        return None
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"the shipped weights' manifest {path} is unreadable ({exc}); restore it with "
                             f"`git checkout -- {path}`") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("folders"), dict) \
            or not isinstance(manifest.get("files"), dict):
        raise SpecbenchError(f"{path} lacks its 'folders' or 'files' table; restore it with `git checkout -- {path}`")
    return manifest


def folder_prefix(key: str) -> str:
    """Where the files of the manifest's folder `key` lie: a zoo folder's key is its name (under `zoo/`), a
    kit's is its path (`kits/<kit>/<target id>/<folder>`)."""
    return f"{key}/" if "/" in key else f"{ZOO_DIR}/{key}/"


def folder_fingerprint(manifest: dict[str, Any], folder: str) -> str:
    """12 hex digits over the checksums of one shipped folder's files."""
    prefix = folder_prefix(folder)
    return release_fingerprint({name: entry for name, entry in manifest["files"].items() if name.startswith(prefix)})


def release_fingerprint(files: dict[str, dict[str, Any]], prefix: str = f"{ZOO_DIR}/") -> str:
    """12 hex digits over the name and checksum of every shipped file under `prefix`: the zoo's release
    fingerprint (a kit's parts have their own, `kits/<kit>/`, so shipping them leaves the zoo's unchanged)."""
    rows = sorted((name, entry["sha256"]) for name, entry in files.items() if name.startswith(prefix))
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]


def verified(root: Path, name: str, manifest: dict[str, Any]) -> Path:
    """The shipped file `name` (relative to `root`), its checksum checked against the manifest (once a process)."""
    return _verified(str(root), name, json.dumps(manifest["files"].get(name), sort_keys=True))


@cache
def _verified(root: str, name: str, entry_json: str) -> Path:
    path = Path(root) / name
    entry = json.loads(entry_json)
    restore = f"restore it with `git checkout -- {path}`, or set {WEIGHTS_VAR} to an intact copy"
    if entry is None:
        raise SpecbenchError(f"{path} is not in {Path(root) / MANIFEST}; {restore}")
    if not path.is_file():
        raise SpecbenchError(f"shipped weights file {path} is missing; {restore}")
    actual = sha256_of(path)
    if actual != entry["sha256"]:
        raise SpecbenchError(f"shipped weights file {path} differs from its checksum in {MANIFEST} (sha256 "
                             f"{actual[:12]}..., expected {entry['sha256'][:12]}...); {restore}")
    return path


def fill(final: Path, tmp: Path, key: str | None = None, target: Path | None = None) -> bool:
    """Fill the empty folder `tmp` with the shipped copy of the cache folder `final` (the manifest's folder
    `key`: the zoo's by its name, a kit's by its path; `target`: the kit's target folder, which holds the
    tensors its parts share with it): True when it did, False when no shipped weights hold it."""
    key = key or final.name
    root = weights_root()
    manifest = read_manifest(root)
    if manifest is None or key not in manifest["folders"]:
        return False
    assert root is not None
    prefix = folder_prefix(key)
    names = sorted(name for name in manifest["files"] if name.startswith(prefix))
    for name in names:  # every checksum first: a bad file leaves nothing half restored
        verified(root, name, manifest)
    for name in names:
        source, out = root / name, tmp / name.removeprefix(prefix)
        out.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".safetensors"):
            restore_tensors(source, out, root, manifest, target)
        else:
            shutil.copyfile(source, out)
    kit = key.split("/")[1] if "/" in key else None
    write_origin(tmp, {"source": "shipped", "release": manifest.get("release"),
                       "fingerprint": (manifest.get("kits") or {}).get(kit, {}).get("fingerprint") if kit
                       else manifest.get("fingerprint"),
                       "folder_fingerprint": folder_fingerprint(manifest, key)})
    return True


def stale(folder: Path, key: str | None = None) -> bool:
    """Whether the cached `folder` (the manifest's folder `key`, default its name) came from shipped weights
    other than the ones here now (a new release under the same name): then it is restored again. A folder
    trained here is never replaced."""
    key = key or folder.name
    origin = read_origin(folder)
    if not origin or origin.get("source") not in ("shipped", "published"):
        return False
    manifest = read_manifest()
    if manifest is None or key not in manifest["folders"]:
        return False
    return origin.get("folder_fingerprint") != folder_fingerprint(manifest, key)


# ----------------------------------------------------------------------------- origins


def write_origin(folder: Path, origin: dict[str, Any]) -> None:
    write_atomic(folder / ORIGIN_FILE, json.dumps({**origin, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                                             indent=2) + "\n")


def mark_local(folder: Path) -> dict[str, Any]:
    """Write (and return) the origin of a folder trained on this machine: its own fingerprint, over its
    safetensors files, and the machine."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        digest.update(str(path.relative_to(folder)).encode() + sha256_of(path).encode())
    origin = {"source": "local", "release": None, "fingerprint": "local-" + digest.hexdigest()[:12],
              "machine": _machine()}
    write_origin(folder, origin)
    return origin


def _machine() -> str:
    """The CPU a local build trained on, and whether it has bf16 units (training then runs in bf16 autocast)."""
    from specbench.core.hardware import autocast_dtype, cpu_info

    cpu = cpu_info()
    return f"{cpu.get('model')}, {cpu.get('logical_cores')} cores, bf16 units: " \
           f"{'yes' if autocast_dtype('auto') is not None else 'no'}"


# ----------------------------------------------------------------------------- tensors


def restore_tensors(source: Path, target: Path, root: Path, manifest: dict[str, Any],
                    kit_target: Path | None = None) -> None:
    """A stored safetensors file written back as it is used: shared tensors put back from the file that
    holds them (a shipped file, or a file of `kit_target`, the kit's target folder), each tensor in its own
    dtype, the original metadata."""
    import torch
    from safetensors import safe_open

    metadata, tensors = read_tensors(source)
    how = json.loads(metadata.pop(META_KEY, "{}"))
    for key, where in how.get("shared", {}).items():
        file, _, name = where.partition("#")
        if file.startswith(TARGET_REF):
            if kit_target is None:
                raise SpecbenchError(f"{source} shares {key} with its kit's target, but no target folder was given")
            path = kit_target / file.removeprefix(TARGET_REF)
        else:
            path = verified(root, file, manifest)
        with safe_open(str(path), framework="pt") as fh:
            tensors[key] = fh.get_tensor(name)
    for key, dtype in how.get("dtypes", {}).items():
        tensors[key] = tensors[key].to(getattr(torch, dtype)).contiguous()
    order = how.get("order") or sorted(tensors)
    save_sorted({key: tensors[key] for key in order}, target, metadata or None)


def store_tensors(source: Path, target: Path, storage: str, shared_pool: dict[str, Any]) -> None:
    """`source` (a safetensors file as used) written as stored: a tensor equal to one of `shared_pool`
    (`"file#tensor" -> tensor`, the target's as trained) named instead of stored (restored from the
    stored target, so a frozen copy stays equal to the target as used), float32 tensors in `storage`.
    Every tensor's dtype and the order are kept in the metadata."""
    import torch

    metadata, tensors = read_tensors(source)
    shared, kept = {}, {}
    for key, tensor in tensors.items():
        twin = next((ref for ref, other in shared_pool.items()
                     if other.shape == tensor.shape and other.dtype == tensor.dtype and torch.equal(other, tensor)),
                    None)
        if twin is not None:
            shared[key] = twin
        elif tensor.dtype == torch.float32 and storage != "float32":
            kept[key] = tensor.to(getattr(torch, storage)).contiguous()
        else:
            kept[key] = tensor.contiguous()
    dtypes = {key: str(tensor.dtype).removeprefix("torch.") for key, tensor in tensors.items()}
    metadata[META_KEY] = json.dumps({"shared": shared, "dtypes": dtypes, "order": list(tensors)}, sort_keys=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_sorted(kept, target, metadata)


def save_sorted(tensors: dict[str, Any], path: Path, metadata: dict[str, str] | None) -> None:
    """`save_file` with the header's metadata in sorted order: safetensors writes it from a hash map, in
    an order that changes from process to process, so the same tensors shipped twice would get new
    checksums (and git new blobs)."""
    from safetensors.torch import save

    data = save(tensors, metadata=metadata)
    size, header = safetensors_header(data)
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > size:  # never: the same keys and values, reordered
        raise SpecbenchError(f"{path}: the sorted safetensors header is longer than the written one")
    Path(path).write_bytes(data[:8] + text.ljust(size, b" ") + data[8 + size:])


def read_tensors(path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """A safetensors file's metadata and tensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata() or {}), {key: fh.get_tensor(key) for key in fh.keys()}


# ----------------------------------------------------------------------------- writing a release


def part_of(folder: str, relative: Path) -> str:
    """The part a file of the cache folder `folder` belongs to: its first folder (target, medusa, ...), else the
    folder's role (`<hash>.hydra-<key>` -> hydra)."""
    if len(relative.parts) > 1:
        return relative.parts[0]
    return folder.partition(".")[2].split("-", 1)[0] or "zoo"


def _store_folder(folder: Path, out: Path, prefix: str, storage: dict[str, str], pool: dict[str, Any],
                  files: dict[str, dict[str, Any]], pool_file: str | None = None) -> dict[str, str]:
    """Write the cache folder `folder`'s files as stored under `out/<prefix>` (safetensors as `storage[part]`
    says, tensors equal to one of `pool`'s named instead; pickles, locks and origins left out), adding them to
    `files`; returns each part's storage. `pool_file`: the file whose tensors join `pool` once written."""
    stored: dict[str, str] = {}
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    paths.sort(key=lambda p: p.relative_to(folder).as_posix() != pool_file)  # the shared tensors' file first
    for path in paths:
        relative = path.relative_to(folder)
        if any(relative.match(pattern) for pattern in (*PICKLED, "*.lock", ORIGIN_FILE)):
            continue
        name = f"{prefix}{relative.as_posix()}"
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            part = part_of(folder.name, relative)
            how = storage.get(part, "bfloat16")
            if how not in STORAGE:
                raise SpecbenchError(f"storage of {folder.name}/{part} must be one of {STORAGE}, got {how!r}")
            store_tensors(path, target, how, pool)
            stored[part] = how
            if relative.as_posix() == pool_file:  # the parts after it share its tensors
                pool.update({f"{name}#{key}": tensor for key, tensor in read_tensors(path)[1].items()})
        else:
            shutil.copyfile(path, target)
        files[name] = {"sha256": sha256_of(target), "bytes": target.stat().st_size}
    return stored


def _write_manifest(out: Path, files: dict[str, dict[str, Any]], folders: dict[str, Any], release: str,
                    measured: dict[str, Any], kits: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "about": "specbench's reference weights (python -m specbench zoo ship, kit ship); runs restore these "
                 "folders into the cache, checksums verified (specbench.zoo.shipped)",
        "release": release,
        "created": int(time.time()),
        "fingerprint": release_fingerprint(files),
        "bytes": sum(entry["bytes"] for entry in files.values()),
        "folders": folders,
        "measured": measured,
        "files": dict(sorted(files.items())),
    }
    if kits:
        manifest["kits"] = kits
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    _verified.cache_clear()
    return manifest


def _kept(old: dict[str, Any] | None, keep: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                          dict[str, Any]]:
    """What the manifest `old` has of the folders `keep(key)` accepts: (files, folders, measured, kits)."""
    if old is None:
        return {}, {}, {}, {}
    folders = {key: entry for key, entry in old["folders"].items() if keep(key)}
    files = {name: entry for name, entry in old["files"].items()
             if any(name.startswith(folder_prefix(key)) for key in folders)}
    measured = {key: value for key, value in (old.get("measured") or {}).items() if keep(key)}
    return files, folders, measured, dict(old.get("kits") or {})


def ship(folders: list[Path], out: Path, storage: dict[str, str], release: str,
         measured: dict[str, Any] | None = None, pool_file: str = "target/model.safetensors") -> dict[str, Any]:
    """Write the cache `folders` (the zoo first) into the weights folder `out` as a new release: each
    part stored as `storage[<part>]` says (default bfloat16), tensors equal to the zoo's
    `pool_file`'s stored once; pickles, locks and origins left out; the kits' parts already there kept;
    returns the manifest written to `out/MANIFEST.json`."""
    for folder in folders:
        if not folder.is_dir():
            raise SpecbenchError(f"{folder} is not built; run `python -m specbench zoo build` first")
    zoo_out = out / ZOO_DIR
    if zoo_out.exists():
        shutil.rmtree(zoo_out)  # a release replaces the last one at the same paths
    files, entries, kept_measured, kits = _kept(read_manifest(out), lambda key: key.startswith(f"{KITS_DIR}/"))
    pool: dict[str, Any] = {}
    for index, folder in enumerate(folders):
        stored = _store_folder(folder, out, folder_prefix(folder.name), storage, pool, files,
                               pool_file if index == 0 else None)
        entries[folder.name] = {"storage": stored, "origin": read_origin(folder) or {}}
    return _write_manifest(out, files, entries, release, {**kept_measured, **(measured or {})}, kits)


def ship_kit(kit: str, target_id: str, folders: list[Path], target: Path, out: Path, storage: dict[str, str],
             measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a kit's built part folders (cache folders of its target `target_id`) into the weights folder `out`
    under `kits/<kit>/<target_id>/`, replacing that kit's last ones (the zoo's and other kits' kept): tensors
    equal to one of the target's (the folder `target`, which is not shipped: a frozen embedding, a copied
    head) named instead of stored, each part in `storage[<part>]` (default bfloat16); the kit's fingerprint
    in the manifest's `kits`."""
    for folder in folders:
        if not folder.is_dir():
            raise SpecbenchError(f"{folder} is not built; run `python -m specbench kit build {kit}` first")
    kit_out = out / KITS_DIR / kit
    if kit_out.exists():
        shutil.rmtree(kit_out)
    mine = f"{KITS_DIR}/{kit}/"
    old = read_manifest(out)
    files, entries, kept_measured, kits = _kept(old, lambda key: not f"{key}/".startswith(mine))
    pool = {f"{TARGET_REF}{path.name}#{key}": tensor for path in sorted(target.glob("*.safetensors"))
            for key, tensor in read_tensors(path)[1].items()}
    for folder in folders:
        key = f"{mine}{target_id}/{folder.name}"
        stored = _store_folder(folder, out, folder_prefix(key), storage, pool, files)
        entries[key] = {"storage": stored, "origin": read_origin(folder) or {}}
    kits[kit] = {"target": target_id, "fingerprint": release_fingerprint(files, mine)}
    if measured:
        kept_measured[mine.rstrip("/")] = measured
    return _write_manifest(out, files, entries, (old or {}).get("release") or "unreleased", kept_measured, kits)
