"""Acceptance against training tokens: a kit's draft (SpS) and EAGLE head (EAGLE-2) trained on growing
shares of its corpus, each measured where it is used: greedy runs of the harness on benchmark questions.

    python scripts/acceptance_curve.py --kit smollm2 --budgets 0.125,0.25,0.5,1 \\
        --questions ../shared/spec_bench/question.jsonl --limit 5 --max-new-tokens 64 \\
        --out results/real/acceptance-curve

For each budget b, the first rows of the kit's training rows in a seeded order that hold a share b of
its answer tokens train a draft and an EAGLE head with the kit's own settings (`build.drafts.draft`,
`build.heads.eagle`, epochs as set there: the tokens seen grow with b); the held-out rows give their
agreement, and `specbench run` gives SpS's and EAGLE-2's #mean accepted tokens on the questions
(greedy, `budget=fixed`: the presets). Writes `<out>.md`, `<out>.json` and `<out>.png`; the parts of
each budget stay under `<out>-parts/<b>/`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def mean_accepted(folder: Path) -> tuple[float, int]:
    """#mean accepted tokens (mean over every decoding step of accept_lengths) of the answers under `folder`."""
    lengths = []
    for path in folder.rglob("answers.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                lengths += json.loads(line)["choices"][0].get("accept_lengths", [])
    return (sum(lengths) / len(lengths) if lengths else float("nan")), len(lengths)


def subset(rows: list[dict], share: float, seed: int) -> list[dict]:
    """The first rows of a seeded order holding `share` of the rows' answer tokens."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    total = sum(len(r["answer_ids"]) for r in rows)
    picked, seen = [], 0
    for i in order:
        if seen >= share * total:
            break
        picked.append(rows[i])
        seen += len(rows[i]["answer_ids"])
    return picked


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    import specbench.kit  # noqa: F401 - registers the kits' resolvers
    from specbench.core.hardware import autocast_dtype
    from specbench.heads.recipe import train_part
    from specbench.kit import build as kb
    from specbench.kit import load_kit
    from specbench.kit.distill import Rows, train_draft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", default="smollm2")
    parser.add_argument("--budgets", default="0.125,0.25,0.5,1")
    parser.add_argument("--questions", required=True, help="the question file the harness answers")
    parser.add_argument("--limit", type=int, default=5, help="questions per subtask")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/real/acceptance-curve")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a kit setting changed for this curve (e.g. build.corpus.shards=3); repeatable")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    kit = OmegaConf.merge(load_kit(opts.kit), OmegaConf.from_dotlist(opts.set))
    out = Path(opts.out)
    parts = out.with_name(out.name + "-parts")
    corpus = kb.ensure_group(kit, "corpus")
    rows, held = kb.split_rows(kit, kb.read_corpus(corpus))
    target = kb._load_target(kit, torch.float32)
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    held_rows = Rows.of(held, kb.soft_targets(kit, held))
    eagle_recipe = kb.kit_recipe(kit, "eagle")  # EAGLE's recipe with the kit's settings
    section = kit.build.drafts.draft
    compute = autocast_dtype(str(kit.build.drafts.dtype))
    results = []
    for budget in [float(b) for b in opts.budgets.split(",")]:
        start = time.perf_counter()
        picked = subset(rows, budget, int(kit.build.seed))
        folder = parts / f"{budget:g}"
        train = Rows.of(picked, kb.soft_targets(kit, picked))
        draft = kb.make_draft(kit, section, target, tok, int(kit.build.seed))
        stats = train_draft(draft, train, held_rows, section, pad_id=pad, seed=int(kit.build.seed),
                            desc=f"curve {budget:g} draft", compute_dtype=compute)
        draft.save_pretrained(folder / "draft")
        tok.save_pretrained(folder / "draft", save_jinja_files=False)
        data = kb.head_data(kit, picked, held, target)
        card = train_part(*eagle_recipe, data, folder / "eagle", "eagle")
        chain = card["heldout_chain"]
        measured = {}
        for method, override in (("sps", f"method.draft={folder / 'draft'}"),
                                 ("eagle2", f"method.head={folder / 'eagle'}")):
            answers = folder / "answers" / method
            subprocess.run([sys.executable, "-m", "specbench", "run", f"model={kit.name}", "dataset=spec_bench",
                            f"dataset.path={opts.questions}", f"method={method}", override, "budget=fixed",
                            f"limit={opts.limit}", f"max_new_tokens={opts.max_new_tokens}",
                            f"output_dir={answers}"], check=True)
            measured[method] = mean_accepted(answers)
        results.append({"budget": budget, "rows": len(picked), "answer_tokens": train.answer_tokens,
                        "draft_tokens_seen": stats.tokens, "draft_heldout": stats.curve[-1].as_dict(),
                        "eagle_positions": data.states.drafting_positions, "eagle_steps": card["steps"],
                        "eagle_heldout_chain": [round(v, 4) for v in chain],
                        "sps_mean_accepted": round(measured["sps"][0], 4),
                        "eagle2_mean_accepted": round(measured["eagle2"][0], 4),
                        "steps_measured": {m: v[1] for m, v in measured.items()},
                        "seconds": round(time.perf_counter() - start, 1)})
        print(json.dumps(results[-1]), flush=True)
        write(out, results, opts)
    return 0


def write(out: Path, results: list[dict], opts: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"settings": vars(opts), "results": results}, indent=2) + "\n")
    lines = ["| budget | answer tokens | SpS #mean accepted | draft held-out top-1 | draft chain (depth 1..5) | "
             "EAGLE-2 #mean accepted | EAGLE held-out chain (depth 1..5) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        draft_chain = " ".join(f"{d:.2f}" for d in r["draft_heldout"]["depth"])
        eagle_chain = " ".join(f"{d:.2f}" for d in r["eagle_heldout_chain"])
        lines.append(f"| {r['budget']:g} | {r['answer_tokens']:,} | {r['sps_mean_accepted']:.2f} | "
                     f"{r['draft_heldout']['agreement']:.3f} | {draft_chain} | {r['eagle2_mean_accepted']:.2f} | "
                     f"{eagle_chain} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    tokens = [r["answer_tokens"] for r in results]
    ax.plot(tokens, [r["sps_mean_accepted"] for r in results], "o-", label="SpS (draft)")
    ax.plot(tokens, [r["eagle2_mean_accepted"] for r in results], "s-", label="EAGLE-2 (EAGLE head)")
    ax.set_xscale("log")
    ax.set_xlabel("training answer tokens")
    ax.set_ylabel("#mean accepted tokens")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
