"""Where the zoo lives and how a finished one is told from a half-written one.

A zoo is `zoo_root()/<hash>`. It is built in a temporary sibling folder, gets a `COMPLETE`
marker as its very last file, and is then renamed into place, all under an exclusive
`flock` on `<root>/<hash>.lock`; so a killed build leaves at most a temporary folder that the
next build deletes, and two processes never build the same zoo at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.core.compose import compose
from specbench.core.errors import SpecbenchError
from specbench.core.files import check_buildable, exclusive, replace_folder
from specbench.core.resources import CONFIG_DIR, default_cache, env_folder

#: Bump when a change of the zoo code changes what a build produces.
ZOO_CODE_VERSION = "zoo-2"
ENV_VAR = "SPECBENCH_ZOO_DIR"
#: "0": never build the zoo or its heads on demand (an error instead)
BUILD_VAR = "SPECBENCH_ZOO_BUILD"
CONFIG_PATH = CONFIG_DIR / "zoo.yaml"
COMPLETE = "COMPLETE"
#: Measured on the 2-core CPU machine the zoo is sized for.
BUILD_TIME = "about 10 minutes on 2 CPU cores with bf16 units, 28 without"


def zoo_root() -> Path:
    """$SPECBENCH_ZOO_DIR if set, else ~/.cache/specbench/zoo."""
    return env_folder(ENV_VAR, default_cache() / "zoo")


#: the zoo config's section of per-method head settings (over each method's `train:`), outside the zoo's hash
HEADS_KEY = "heads"


def load_zoo_config(overrides: list[str] | None = None) -> DictConfig:
    """configs/zoo.yaml composed by Hydra with `key=value` overrides (`target.train.lr=1e-3`),
    resolved; unknown keys and values of another kind are errors."""
    if not CONFIG_PATH.is_file():
        raise SpecbenchError(f"zoo config {CONFIG_PATH} is missing; run from a specbench checkout")
    return compose(CONFIG_PATH.stem, overrides, "zoo", "target.train.lr=1e-3")


def zoo_hash(cfg: DictConfig) -> str:
    """12 hex digits of SHA-256 over the resolved config (but its `heads:`, the settings of the heads trained
    after the zoo, each keyed on its own: specbench.zoo.parts), the generator version and the code version."""
    from specbench import synth

    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != HEADS_KEY}
    payload = json.dumps(
        {"config": config, "generator": synth.GENERATOR_VERSION,
         "code": ZOO_CODE_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]


def is_complete(path: Path) -> bool:
    """Whether `path` is a finished zoo: its COMPLETE marker exists and names this folder's hash."""
    try:
        marker = json.loads((path / COMPLETE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("zoo_hash") == path.name


def _clear_leftovers(root: Path, digest: str) -> None:
    """Delete what killed builds of this hash left (called under the lock, so none is running)."""
    # Only our own patterns: other tools may keep their own `.{digest}.<something>` folders here.
    for pattern in (f".{digest}.building-*", f".{digest}.old-*"):
        for leftover in root.glob(pattern):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
    final = root / digest
    if final.exists() and not is_complete(final):
        shutil.rmtree(final, ignore_errors=True)


def check_may_build(what: Path) -> None:
    """Refuse to build `what` where SPECBENCH_ZOO_BUILD=0 (`make test-fast`: a tier that must not need the zoo),
    and inside a run's timed part (specbench.core.files.find_only)."""
    check_buildable(what)
    if os.environ.get(BUILD_VAR) == "0":
        raise SpecbenchError(f"{what} is not built and {BUILD_VAR}=0 forbids building it here (make test-fast runs "
                             f"without the zoo); run `python -m specbench zoo build`, or unset {BUILD_VAR}")


def ensure_zoo(cfg: DictConfig | None = None, *, force: bool = False) -> Path:
    """The folder of the zoo for `cfg` (default: configs/zoo.yaml), built first if needed."""
    from specbench.zoo import shipped

    cfg = load_zoo_config() if cfg is None else cfg
    root, digest = zoo_root(), zoo_hash(cfg)
    final = root / digest
    if not force and is_complete(final) and not shipped.stale(final):
        return final
    check_may_build(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecbenchError(f"cannot create the zoo cache {root} ({exc.strerror}); set {ENV_VAR} to a writable "
                             "folder") from exc
    busy = f"specbench: another process is building the tiny model zoo {final}; waiting for it"
    with exclusive(root / f"{digest}.lock", waiting=busy) as waited:
        # Whoever held the lock may have just finished this very zoo: reuse it (even when
        # forced, since it is brand new).
        if is_complete(final) and (not force or waited) and not shipped.stale(final):
            return final
        _clear_leftovers(root, digest)
        _build_into(cfg, root, digest, fetch=not force)
    return final


def _build_into(cfg: DictConfig, root: Path, digest: str, fetch: bool = True) -> None:
    """The zoo into `root/digest`, when `fetch`: restored from the shipped weights (specbench.zoo.shipped),
    else its published copy when the release names it (specbench.zoo.release); else trained here
    (`zoo build --force` trains) and marked local."""
    from specbench.zoo import release, shipped
    from specbench.zoo.build import QUALITY_CARD, build
    from specbench.zoo.card import format_card

    def fill(tmp: Path) -> None:
        if fetch and shipped.fill(root / digest, tmp):
            origin = shipped.read_origin(tmp) or {}
            print(f"specbench: the zoo {digest} restored from the shipped weights (release {origin.get('release')}, "
                  f"fingerprint {origin.get('fingerprint')}; checksums verified)", file=sys.stderr, flush=True)
            return
        if fetch and release.fetch(root / digest, tmp):  # the published folder carries its card and COMPLETE marker
            marker = json.loads((tmp / COMPLETE).read_text())
            if marker.get("zoo_hash") != digest:
                raise SpecbenchError(f"the published zoo {digest} is marked as zoo {marker.get('zoo_hash')}; "
                                     f"the release manifest is wrong: set {release.FETCH_VAR}=0 to train it here")
            print(format_card(json.loads((tmp / QUALITY_CARD).read_text())), file=sys.stderr, flush=True)
            return
        print(f"specbench: building the tiny model zoo into {root / digest} ({BUILD_TIME}; done once, then cached; "
              f"`python -m specbench zoo build` builds it ahead of time)", file=sys.stderr, flush=True)
        card = build(cfg, tmp, digest, ZOO_CODE_VERSION)
        print(format_card(card), file=sys.stderr, flush=True)
        origin = shipped.mark_local(tmp)
        print(f"specbench: this zoo was trained here: its weights are local ({origin['fingerprint']}), not the "
              "shipped reference weights; runs and reports on it say so", file=sys.stderr, flush=True)
        marker = json.dumps({"zoo_hash": digest, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        with open(tmp / COMPLETE, "w") as fh:  # written last: its presence means everything else is there
            fh.write(marker + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    replace_folder(root / digest, COMPLETE, fill)  # under ensure_zoo's lock
