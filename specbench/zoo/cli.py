"""`python -m specbench zoo build|path|card|show|ship|release`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from omegaconf import DictConfig

from specbench.core.args import ArgumentParser
from specbench.core.errors import SpecbenchError
from specbench.zoo import store


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m specbench zoo",
                                     description="The embedded tiny model zoo (model=tiny).")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build the zoo (or reuse the cached one) and print its quality card")
    build.add_argument("--force", action="store_true",
                       help="train the zoo here even when a finished one is cached (or published)")
    path = sub.add_parser("path", help="print the zoo's folder (built or not)")
    card = sub.add_parser("card", help="print the quality card of the built zoo")
    card.add_argument("--json", action="store_true", help="print quality.json as is")
    card.add_argument("--speed", action="store_true",
                      help="also time decoding now, on this machine (the card's numbers are from the build)")
    show = sub.add_parser("show", help="where the zoo's folders come from (shipped, published or trained here) and "
                          "the fingerprint of its weights")
    show.add_argument("--verify", action="store_true", help="check every shipped file against its checksum too")
    ship = sub.add_parser("ship", help="(maintainers) write the built zoo's folders into the shipped weights "
                          "(weights/, their manifest and checksums): a new release of the reference weights")
    ship.add_argument("--out", default=None, help="the weights folder (default: the checkout's weights/)")
    ship.add_argument("--storage", nargs="*", default=[], metavar="PART=DTYPE",
                      help="how a part is stored: bfloat16 (default) or float32, e.g. target=float32 medusa=float32")
    ship.add_argument("--release", default=time.strftime("%Y.%-m.%-d"), help="the release's name (default: today)")
    ship.add_argument("--measured", default=None, help="a JSON file of the storage measurement to keep in the manifest")
    for p in (build, path, card):
        p.add_argument("overrides", nargs="*", metavar="key=value", help="configs/zoo.yaml overrides")
    release = sub.add_parser("release", help="wheels of the built zoo's folders for a package index, and the "
                             "manifest (specbench/zoo/release.json) by which runs fetch them instead of training")
    release.add_argument("--out", default="dist/zoo", help="folder for the wheels (default: dist/zoo)")
    release.add_argument("--version", default=time.strftime("%Y.%-m.%-d"),
                         help="the wheels' version (default: today, YYYY.M.D)")
    release.add_argument("--manifest", default=None,
                         help="the manifest to write (default: the package's specbench/zoo/release.json)")
    return parser


def _release(opts: argparse.Namespace) -> int:
    """Wheels of the default zoo and the built-in methods' trained heads; all must be built."""
    from pathlib import Path

    from specbench.zoo import release

    folders = _folders()
    wheels = release.release(folders, opts.version, Path(opts.out), Path(opts.manifest) if opts.manifest else None)
    for wheel, made in wheels:
        where = f"{opts.out}/{wheel.wheel}" if made else f"{wheel.wheel} (published before, kept)"
        print(f"{wheel.folder}: {where}  {wheel.bytes / 1e6:.1f} MB  sha256 {wheel.sha256}")
    print(f"manifest: {opts.manifest or release.manifest_path()} (commit it once the new wheels are on the index: "
          f"`twine upload {opts.out}/*`)")
    return 0


def _folders(registry=None) -> list:
    """The default zoo's cache folders: the zoo and the built-in methods' trained heads."""
    from specbench.run.registry import BUILTIN, discover
    from specbench.zoo.parts import trained_part_dir

    zoo = store.zoo_root() / store.zoo_hash(store.load_zoo_config())
    if not store.is_complete(zoo):
        raise SpecbenchError(f"the zoo {zoo} is not built; run `python -m specbench zoo build` first")
    registry = registry or discover()
    trained = [name for name in registry.trained() if registry.specs[name].source == BUILTIN]
    return [zoo] + [trained_part_dir(zoo, name, registry) for name in trained]


def _origin_text(folder) -> str:
    from specbench.zoo import shipped

    origin = shipped.read_origin(folder) or {}
    if origin.get("source") in ("shipped", "published"):
        return f"{origin['source']} weights, release {origin.get('release')}, fingerprint {origin.get('fingerprint')}"
    if origin.get("source") == "local":
        return f"trained here: local weights, fingerprint {origin.get('fingerprint')}"
    return "origin not recorded"


def _show(opts: argparse.Namespace) -> int:
    from specbench.zoo import shipped

    root = shipped.weights_root()
    manifest = shipped.read_manifest(root)
    if manifest is None:
        print(f"shipped weights: none ({root or 'not a checkout'}); the zoo comes from the package index or is "
              "trained here")
    else:
        stored = sorted({how for entry in manifest["folders"].values() for how in entry["storage"].values()})
        print(f"shipped weights: {root}  release {manifest.get('release')}  fingerprint {manifest['fingerprint']}  "
              f"{manifest['bytes'] / 1e6:.1f} MB in {len(manifest['files'])} files ({', '.join(stored)})")
        if opts.verify:
            for name in manifest["files"]:
                shipped.verified(root, name, manifest)
            print(f"checksums: all {len(manifest['files'])} files match {shipped.MANIFEST}")
    zoo = store.zoo_root() / store.zoo_hash(store.load_zoo_config())
    try:
        folders = _folders() if store.is_complete(zoo) else [zoo]
    except SpecbenchError:
        folders = [zoo]
    sources = set()
    for folder in folders:
        origin = shipped.read_origin(folder) if folder.is_dir() else None
        if origin is None:
            where = "shipped, not restored yet" if manifest and folder.name in manifest["folders"] else "not built"
            if folder.is_dir():
                where = "built before origins were recorded (unknown)"
        else:
            where = f"{origin['source']}, fingerprint {origin.get('fingerprint')}"
            sources.add((origin["source"], origin.get("fingerprint")))
        print(f"  {folder.name}: {where}")
    if len(sources) == 1:
        source, fingerprint = sources.pop()
        print(f"zoo fingerprint: {fingerprint} ({source})")
    elif sources:
        print("zoo fingerprint: mixed (" + ", ".join(f"{s} {f}" for s, f in sorted(sources)) + ")")
    return 0


def _ship(opts: argparse.Namespace) -> int:
    from pathlib import Path

    from specbench.zoo import shipped

    storage = shipped.parse_storage(opts.storage)
    out = shipped.weights_folder(opts.out)
    measured = json.loads(Path(opts.measured).read_text()) if opts.measured else None
    manifest = shipped.ship(_folders(), out, storage, opts.release, measured)
    for folder, entry in manifest["folders"].items():
        parts = ", ".join(f"{part} {how}" for part, how in sorted(entry["storage"].items()))
        print(f"{folder}: {parts}")
    print(f"wrote {out}: release {manifest['release']}, fingerprint {manifest['fingerprint']}, "
          f"{manifest['bytes'] / 1e6:.1f} MB in {len(manifest['files'])} files")
    return 0


def _card_text(folder: os.PathLike, as_json: bool = False) -> str:
    from specbench.zoo.build import QUALITY_CARD
    from specbench.zoo.card import format_card

    with open(os.path.join(folder, QUALITY_CARD)) as fh:
        card = json.load(fh)
    return json.dumps(card, indent=2) if as_json else format_card(card)


def _speed_now(folder: os.PathLike, cfg: DictConfig) -> str:
    """Target/draft decode timings measured now with the card's settings."""
    import torch
    from transformers import AutoModelForCausalLM

    from specbench.zoo.card import format_speed, measure_speed

    torch.set_num_threads(int(cfg.threads))
    target, draft = (AutoModelForCausalLM.from_pretrained(os.path.join(folder, name), dtype=torch.float32).eval()
                     for name in ("target", "draft"))
    speed = measure_speed(target, draft, int(cfg.speed.context), int(cfg.speed.verify_tokens), int(cfg.speed.reps),
                          int(cfg.seed))
    return "now: " + format_speed(speed)


def zoo_main(argv: list[str]) -> int:
    """The body of `python -m specbench zoo ...`; returns the exit status."""
    opts = _parser().parse_args(argv)
    try:
        if opts.action == "release":
            return _release(opts)
        if opts.action == "show":
            return _show(opts)
        if opts.action == "ship":
            return _ship(opts)
        cfg = store.load_zoo_config(opts.overrides)
        folder = store.zoo_root() / store.zoo_hash(cfg)
        if opts.action == "path":
            print(folder)
            if not store.is_complete(folder):
                print("(not built yet: `python -m specbench zoo build`)", file=sys.stderr)
            return 0
        if opts.action == "card":
            if not store.is_complete(folder):
                raise SpecbenchError(f"the zoo {folder} is not built; run `python -m specbench zoo build`")
            print(_card_text(folder, opts.json))
            if opts.speed:
                print(_speed_now(folder, cfg))
            return 0
        cached = store.is_complete(folder) and not opts.force
        folder = store.ensure_zoo(cfg, force=opts.force)
        if cached:  # a fresh build has already printed its card
            print(_card_text(folder))
        print(f"zoo: {folder} ({_origin_text(folder)})")
        if not opts.overrides:  # the parts hang off the default zoo: heads and the REST datastore
            from specbench.heads.recipe import PART_CARD
            from specbench.run.registry import discover
            from specbench.zoo.parts import resolve, trained_part

            for method in discover().trained():  # the methods that train their own head (specbench.heads.recipe)
                part = trained_part(method)
                card = json.loads((part / PART_CARD).read_text())
                print(f"zoo {method} head: {part} ({card.get('params', 0) / 1e6:.2f}M params, trained in "
                      f"{card['build_seconds']:.0f}s; {_origin_text(part)})")
            print(f"zoo datastore: {resolve('datastore')}")
        return 0
    except SpecbenchError as exc:
        if os.environ.get("SPECBENCH_VERBOSE"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
