"""Recipe trials on a kit's first corpus shards: drafts and heads trained with changed settings,
each measured on the held-out rows (top-1 agreement and chain acceptance per depth), to choose a
recipe before training on the whole corpus.

    python scripts/kit_trials.py --set build.corpus.shards=4 draft \\
        '[{"name": "tl2", "section": {"init": "target_layers", "layers": 2, "epochs": 1, "lr": 1e-3}}]'
    python scripts/kit_trials.py --set build.corpus.shards=4 eagle '[{"name": "e12", "cfg": {"epochs": 12}}]'
    python scripts/kit_trials.py --train-shards 7 eagle '[{"name": "s7"}]'   # less data, the same held-out rows

A draft variant changes `build.drafts.draft` (`section`: `feature_weight` > 0 also trains it to match
the target's final states, a draft as wide as the target) and may scale the final norm's weight at the
start (`norm_scale`: smaller starting logits); a head's variant changes `build.heads.<part>` (`cfg`);
an EAGLE variant may train with training-time test (`unroll`: steps fed the head's own predictions, `step_decay`:
their loss weights), and keep the head in a folder (`keep`: a path, for `method.head=FOLDER`).
Each variant prints one `RESULT {json}` line (its held-out measurements, the time it took).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import time

import torch


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from specbench.kit import build as kb
    from specbench.kit import load_kit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", default="smollm2")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a kit setting changed for every trial (e.g. build.corpus.shards=4); repeatable")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-shards", type=int, default=None, metavar="N",
                        help="train on the first N shards' training rows only, measured on every shard's held-out "
                             "rows (the acceptance-against-training-data curve)")
    parser.add_argument("part", choices=("draft", "eagle", "eagle3", "medusa", "hydra"))
    parser.add_argument("variants", help="a JSON list of variants, each with a `name`")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    kit = OmegaConf.merge(load_kit(opts.kit), OmegaConf.from_dotlist(opts.set))
    rows, held = kb.split_rows(kit, kb.read_corpus(kb.ensure_group(kit, "corpus")))
    if opts.train_shards is not None:
        rows = [r for r in rows if int(r["shard"]) < opts.train_shards]
    target = kb._load_target(kit, torch.float32)
    trial = draft_trial if opts.part == "draft" else functools.partial(head_trial, kind=opts.part)
    for variant in json.loads(opts.variants):
        start = time.perf_counter()
        result = trial(kit, rows, held, target, variant)
        print("RESULT", json.dumps({"name": variant["name"], "seconds": round(time.perf_counter() - start),
                                    **result}), flush=True)
    return 0


def draft_trial(kit, rows: list[dict], held: list[dict], target, variant: dict) -> dict:
    from omegaconf import OmegaConf

    from specbench.core.hardware import autocast_dtype
    from specbench.kit import build as kb
    from specbench.kit.distill import Rows, train_draft

    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train, held_rows = Rows.of(rows, kb.soft_targets(kit, rows)), Rows.of(held, kb.soft_targets(kit, held))
    section = OmegaConf.merge(kit.build.drafts.draft, OmegaConf.create(variant.get("section", {})))
    model = kb.make_draft(kit, section, target, tok, int(kit.build.seed))
    if variant.get("norm_scale"):
        with torch.no_grad():
            model.get_decoder().norm.weight.mul_(float(variant["norm_scale"]))
    if float(section.get("feature_weight", 0.0)) > 0:
        train = train.with_states(kb.corpus_states(kit, rows, target).view("final"))
    stats = train_draft(model, train, held_rows, section, pad_id=pad, seed=int(kit.build.seed), desc=variant["name"],
                        compute_dtype=autocast_dtype(str(kit.build.drafts.dtype)))
    return {"train_answer_tokens": train.answer_tokens, "steps": stats.steps,
            "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "curve": [c.as_dict() for c in stats.curve]}


def head_trial(kit, rows: list[dict], held: list[dict], target, variant: dict, kind: str = "eagle") -> dict:
    import tempfile
    from pathlib import Path

    from omegaconf import OmegaConf

    from specbench.heads import train as ht
    from specbench.heads.recipe import train_part
    from specbench.kit import build as kb
    from specbench.methods import eagle

    changed = OmegaConf.merge(kit, {"build": {"heads": {kind: variant.get("cfg", {})}}})
    cls, settings = kb.kit_recipe(changed, kind)  # the head's recipe with the kit's settings and the variant's
    data = kb.head_data(changed, rows, held, target)
    # Training-time test (heads.train.train_eagle's `unroll`, `step_decay`), which the recipe does not expose yet.
    unrolled = {k: variant[k] for k in ("unroll", "step_decay") if k in variant}
    if unrolled and kind != "eagle":
        raise SystemExit("unroll / step_decay: EAGLE trials only")
    if unrolled:
        eagle.train_eagle = functools.partial(ht.train_eagle, **unrolled)
    try:
        with tempfile.TemporaryDirectory() as out:
            card = train_part(cls, settings, data, Path(out), kind)
            if variant.get("keep"):  # the head itself, for a run (method.head=FOLDER)
                shutil.copytree(out, variant["keep"], dirs_exist_ok=True)
    finally:
        eagle.train_eagle = ht.train_eagle
    return {"positions": data.states.drafting_positions,
            "train": {k: card[k] for k in ("steps", "seconds", "final_loss", "top1")},
            **{k: v for k, v in card.items() if k.startswith("heldout_")}}


if __name__ == "__main__":
    raise SystemExit(main())
