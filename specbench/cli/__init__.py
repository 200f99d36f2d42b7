"""`python -m specbench <command>`: run (Hydra), data, zoo."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from specbench.core.args import ArgumentParser, stop_if_parse_only
from specbench.core.errors import SpecbenchError

USAGE = """usage: python -m specbench [hydra flags] <command> [args]

commands:
  run [overrides]      benchmark a method, e.g. `run method=baseline task=all limit=2`
                       (Hydra: `--cfg job` prints the config, `-m run method=a,b` sweeps;
                       `run backend=vllm interleave=[ngram]`: vLLM servers, after `make vllm`)
  report [results]     leaderboard tables (md/csv/tex) and figures from answer files
  check --quick [--base REV]  the quick suite at the base commit and here, in turn, compared paired;
                       exit 1 on a regression (`check` alone: results against results/reference)
  methods [--names [--suite S]] [--markdown]
                       the methods of every source (built-in, methods/ folder, search path, entry points)
  recommend --memory-gb X --training yes|no [--temperature T]
                       the best measured method within those constraints, with its numbers
  data fetch           download the official Spec-Bench questions (SHA-256 checked)
  data synth           write the embedded synthetic benchmark to data/synthetic/
  zoo build|path|card  build the embedded tiny model zoo, show where it is, print its quality card
  kit fetch|build|show NAME
                       a real model (kits: {kits}): fetch it (checksum-checked), build its parts, show them
  train-head method=M model=NAME [out=DIR]
                       train method M's head or drafter with the target frozen (published checkpoint layout);
                       M: {heads}
  datastore build --corpus SPEC --model MODEL --out DIR
                       index a corpus (file, hub dataset, zoo:corpus) for REST (method=rest method.datastore=DIR)

Set SPECBENCH_VERBOSE=1 for full tracebacks."""


def usage() -> str:
    """The help text, its lists from what is installed: the kits' YAMLs and the methods that train a head."""
    from specbench.kit import kit_names
    from specbench.run.registry import discover

    return USAGE.format(kits=", ".join(kit_names()) or "none", heads="|".join(discover().trained()))


def first_job(args: list[str]) -> list[str]:
    """A sweep's first job: each plain `key=a,b,c` cut to `key=a` (lists and quoted values kept; a sweep
    function such as `range(1,4)` left out, its key then checked by Hydra alone)."""
    out = []
    for a in args:
        key, sep, value = a.partition("=")
        if sep and "(" in value:
            continue
        if sep and "," in value and not value.startswith(("[", "'", '"')):
            a = f"{key}={value.split(',')[0]}"
        out.append(a)
    return out


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 2


def _run(args: list[str]) -> int:
    from specbench.run.config import check_compose, check_overrides, prepare

    registry = prepare(args)  # methods and kit models registered once, for the checks and the run
    check_overrides(args, registry)
    if {"-m", "--multirun"} & set(args):
        composed = None
        check_compose(first_job(args), registry)  # every job's keys are the first job's
    else:
        composed = check_compose(args, registry)
    stop_if_parse_only(args)
    if composed is not None and not any(a.startswith("-") for a in args):
        return _run_job(composed)  # a plain run: its config composed once, by the check
    import hydra  # Hydra's own flags (`--cfg job`, `-m` sweeps, `--config-dir`): Hydra's app composes
    from omegaconf import DictConfig

    from specbench.core.resources import CONFIG_DIR

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
    def app(cfg: DictConfig) -> None:
        if code := _run_job(cfg):
            sys.exit(code)

    sys.argv = [f"{sys.argv[0]} run", *args]
    try:
        app()
    except KeyboardInterrupt:
        return 130
    return 0


def _run_job(cfg: object) -> int:
    """One run of a composed config: the backend of configs/backend/ answers, the runner files the
    answers; the summary table, read back from them, printed."""
    from specbench.analysis.summary import run_summary
    from specbench.run import runner

    try:
        done = runner.run(cfg)
    except SpecbenchError as exc:
        if os.environ.get("SPECBENCH_VERBOSE"):
            raise
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    print(run_summary(done))
    for outcome in done.failures():  # the last lines: what this run could not answer
        print(f"warning: {outcome.label}: {outcome.failed} of {outcome.todo} questions failed "
              f"(first: {outcome.first_error}); listed in {outcome.folder / 'errors.jsonl'}", file=sys.stderr)
    return 0


def _data(args: list[str]) -> int:
    parser = ArgumentParser(prog="python -m specbench data")
    parser.add_argument("action", choices=["fetch", "synth"])
    parser.add_argument("--dest", help="where to write (default: the dataset config's path)")
    parser.add_argument("--seed", type=int, default=None, help="synthetic set seed (default: config)")
    opts = parser.parse_args(args)
    from omegaconf import OmegaConf

    from specbench.core.resources import CONFIG_DIR

    if opts.action == "fetch":
        from specbench.core.questions import fetch

        ds = OmegaConf.load(CONFIG_DIR / "dataset" / "spec_bench.yaml")
        path = fetch(ds.url, opts.dest or ds.path, ds.sha256)
        print(f"{path}: official Spec-Bench questions, sha256 verified")
    else:
        from specbench import synth

        ds = OmegaConf.load(CONFIG_DIR / "dataset" / "synthetic.yaml")
        seed = ds.seed if opts.seed is None else opts.seed
        path = synth.write_questions(opts.dest or ds.path, seed=seed)
        print(f"{path}: synthetic benchmark, seed {seed}")
    return 0


def _report(args: list[str]) -> int:
    parser = ArgumentParser(prog="python -m specbench report",
                                     description="Tables and figures from answer files (ours or upstream's).")
    parser.add_argument("results", nargs="?", default="results/answers", help="folder of answer files")
    parser.add_argument("--out", default="results/leaderboard", help="where tables and figures go")
    parser.add_argument("--upstream-model", default="upstream", help="model name for upstream answer files")
    parser.add_argument("--tie-margin", type=float, default=0.05,
                        help="top-2 logit gap under which a greedy mismatch counts as a numerical near-tie")
    parser.add_argument("--upstream-count", metavar="TOKENIZER",
                        help="count the baseline's tokens as upstream speed.py does (re-tokenised text)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--recheck", action="store_true",
                        help="re-run the target alone in float64 at each greedy divergence from the baseline: "
                             "numerical, baseline off, or bug")
    parser.add_argument("--recheck-device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the recheck runs: auto = the device the run decoded on when this machine has "
                             "one (its dtype's local error then comes from the run's own kernels), else the CPU")
    parser.add_argument("--recheck-limit", type=int, metavar="N",
                        help="recheck at most N divergences (one float64 forward each; the rest say so)")
    parser.add_argument("--beside", metavar="DIR",
                        help="answers of a job that ran the methods with budget=auto and =fixed (make "
                             "leaderboard-budget): each <method>-fixed row of the main table gets its auto speedup "
                             "from there, beside it")
    opts = parser.parse_args(args)
    if opts.recheck_limit is not None and opts.recheck_limit < 0:
        raise SpecbenchError(f"--recheck-limit must be >= 0, got {opts.recheck_limit}")
    recheck = opts.recheck or opts.recheck_limit is not None
    from pathlib import Path

    from specbench.presentation import leaderboard

    tokenizer = None
    if opts.upstream_count:
        from transformers import AutoTokenizer

        from specbench.models import resolve_path

        tokenizer = AutoTokenizer.from_pretrained(resolve_path(opts.upstream_count))
    report = leaderboard.build(
        Path(opts.results), Path(opts.out), upstream_model=opts.upstream_model, tie_margin=opts.tie_margin,
        upstream_tokenizer=tokenizer, figures=not opts.no_figures,
        recheck=recheck, recheck_limit=opts.recheck_limit, recheck_device=opts.recheck_device,
        beside=Path(opts.beside) if opts.beside else None,
    )
    print(report.console())
    for problem in report.warnings():
        print(f"warning: {problem}", file=sys.stderr)
    return 0 if report.ok else 1


def _check(args: list[str]) -> int:
    from specbench.presentation.check import check_main

    return check_main(args)


def _methods(args: list[str]) -> int:
    from specbench.cli.methods import methods_main

    return methods_main(args)


def _recommend(args: list[str]) -> int:
    from specbench.presentation.recommend import recommend_main

    return recommend_main(args)


def _kit(args: list[str]) -> int:
    from specbench.kit.cli import kit_main

    return kit_main(args)


def _zoo(args: list[str]) -> int:
    from specbench.zoo import zoo_main

    return zoo_main(args)


def _datastore(args: list[str]) -> int:
    parser = ArgumentParser(prog="python -m specbench datastore",
                                     description="Build a REST datastore: a corpus tokenized and suffix-indexed.")
    parser.add_argument("action", choices=["build"])
    parser.add_argument("--corpus", required=True,
                        help=".json/.jsonl/.parquet/.csv (text / messages / conversations / turns records), "
                             "a text file (blank lines between documents), a hub dataset id or zoo:corpus")
    parser.add_argument("--model", required=True, help="tokenizer: hub id, folder or zoo:NAME (the target's)")
    parser.add_argument("--out", required=True, help="datastore folder to write")
    parser.add_argument("--split", default="train", help="split of a hub dataset (default: train)")
    parser.add_argument("--text-field", help="the records' text column, if not 'text'")
    parser.add_argument("--max-tokens", type=int, help="stop after about this many corpus tokens")
    opts = parser.parse_args(args)
    from transformers import AutoTokenizer

    from specbench import datastore
    from specbench.models import resolve_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_path(opts.model))
    docs = datastore.read_corpus(opts.corpus, tokenizer, split=opts.split, text_field=opts.text_field,
                                 max_tokens=opts.max_tokens)
    datastore.build(docs, tokenizer, opts.out, source=str(opts.corpus), progress=True)
    return 0


def _train_head(args: list[str]) -> int:
    from specbench.cli.train_head import train_head_main

    return train_head_main(args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run, "report": _report, "check": _check, "recommend": _recommend, "data": _data, "zoo": _zoo, "kit": _kit,
    "datastore": _datastore, "train-head": _train_head, "methods": _methods,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    # Hydra flags may come before the command (`-m run ...`): they belong to `run`.
    index = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if index is None:
        return _fail(SpecbenchError(f"unknown command in {' '.join(argv)!r}; commands: {', '.join(COMMANDS)}"))
    command = argv[index]
    rest = argv[:index] + argv[index + 1 :]
    if command != "run" and index:
        return _fail(SpecbenchError(f"flags before '{command}' only apply to run"))
    try:
        return COMMANDS[command](rest)
    except SpecbenchError as exc:
        if os.environ.get("SPECBENCH_VERBOSE"):
            raise
        return _fail(exc)
    except KeyboardInterrupt:  # outside a run's question loop (loading, report, ...): no traceback
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # any write path the commands did not name itself: a full disk, a read-only folder
        if exc.errno not in WRITE_ERRNOS or os.environ.get("SPECBENCH_VERBOSE"):
            raise
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(SpecbenchError(f"cannot write{where} ({exc.strerror}); free some space or make the folder "
                                    "writable, then run the same command again (files are written whole or not at "
                                    "all; answers already saved are kept)"))


#: errors of a write that the user can fix (full disk or quota, read-only file system, no permission)
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
