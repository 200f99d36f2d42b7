"""`python -m specbench zoo build|path|card`."""

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
    """Wheels of the default zoo, its heads and the built-in methods' trained heads; all must be built."""
    from pathlib import Path

    from specbench.run.registry import BUILTIN, discover
    from specbench.zoo import release
    from specbench.zoo.parts import heads_dir, trained_part_dir

    zoo = store.zoo_root() / store.zoo_hash(store.load_zoo_config())
    if not store.is_complete(zoo):
        raise SpecbenchError(f"the zoo {zoo} is not built; run `python -m specbench zoo build` first")
    registry = discover()
    trained = [name for name in registry.trained() if registry.specs[name].source == BUILTIN]
    folders = [zoo, heads_dir(zoo)] + [trained_part_dir(zoo, name, registry) for name in trained]
    wheels = release.release(folders, opts.version, Path(opts.out), Path(opts.manifest) if opts.manifest else None)
    for wheel, made in wheels:
        where = f"{opts.out}/{wheel.wheel}" if made else f"{wheel.wheel} (published before, kept)"
        print(f"{wheel.folder}: {where}  {wheel.bytes / 1e6:.1f} MB  sha256 {wheel.sha256}")
    print(f"manifest: {opts.manifest or release.manifest_path()} (commit it once the new wheels are on the index: "
          f"`twine upload {opts.out}/*`)")
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


def _heads_line(card_path: os.PathLike) -> str:
    card = json.loads(open(card_path).read())
    names = [name for name in ("eagle", "eagle3", "medusa", "ppd", "specdec") if name in card]
    return ", ".join(f"{name} {card[name]['params'] / 1e6:.2f}M params" for name in names) + (
        f", trained in {card.get('build_seconds', 0):.0f}s")


def zoo_main(argv: list[str]) -> int:
    """The body of `python -m specbench zoo ...`; returns the exit status."""
    opts = _parser().parse_args(argv)
    try:
        if opts.action == "release":
            return _release(opts)
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
        print(f"zoo: {folder}")
        if not opts.overrides:  # the parts hang off the default zoo: heads and the REST datastore
            from specbench.heads.recipe import PART_CARD
            from specbench.run.registry import discover
            from specbench.zoo.parts import HEADS_CARD, ensure_heads, resolve, trained_part

            heads = ensure_heads()
            print(f"zoo heads: {heads} ({_heads_line(heads / HEADS_CARD)})")
            for method in discover().trained():  # the methods that train their own head (Hydra, methods/ folder's)
                part = trained_part(method)
                card = json.loads((part / PART_CARD).read_text())
                print(f"zoo {method} head: {part} ({card.get('params', 0) / 1e6:.2f}M params, trained in "
                      f"{card['build_seconds']:.0f}s)")
            print(f"zoo datastore: {resolve('datastore')}")
        return 0
    except SpecbenchError as exc:
        if os.environ.get("SPECBENCH_VERBOSE"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
