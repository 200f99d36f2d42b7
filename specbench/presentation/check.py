"""`python -m specbench check`: fail CI when speedup or acceptance regresses.

`check --quick` (what CI runs) measures a regression as a change between two commits on one
machine: the base commit (`results/reference/base.json`, or `--base REV`) is checked out in a git
worktree, and the quick suite runs twice, the base's code and then the change's, each as one job
in which the baseline and the methods answer every question in turn. Per method, the paired
per-(question, turn) ratio of its time per token over the baseline's is compared between the two
jobs with a one-sided sign-flip test (`specbench.analysis.paired`); #mean accepted tokens must be
equal where the target's weights are. No speed measured on another machine is used.

`check` without --quick compares existing results with a stored reference
(`results/reference/<dataset>-<model>.json`, written by `--update`): acceptance exactly where the
reference was made with the same weights (its fingerprint), speedup with a noise-widened tolerance.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from specbench.analysis import paired, report
from specbench.analysis.audit import is_bug
from specbench.analysis.runs import BASELINE, Run, group_runs, load_runs
from specbench.core.args import ArgumentParser
from specbench.core.compose import compose
from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.core.questions import SUBTASKS
from specbench.core.table import markdown

ORDER = [*SUBTASKS, "overall"]


def load_check_config(overrides: list[str] | None = None) -> DictConfig:
    """check.yaml composed by Hydra with `key=value` overrides: unknown keys, values of another kind
    and negative or non-finite tolerances are errors."""
    cfg = compose("check", overrides, "check", "tolerance.speedup_rel_min=0.2")
    for tolerances, where in ((cfg.tolerance, "tolerance"), (cfg.quick.gate, "quick.gate")):
        for key, value in tolerances.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SpecbenchError(f"{where}.{key} must be a number >= 0, got {value!r}")
    return cfg


def relative_noise(row: dict[str, float]) -> float:
    """One-sigma relative noise of a speedup: the larger of run-to-run std and a quarter of
    the 95% bootstrap interval's width."""
    width = row.get("ci_high", math.nan) - row.get("ci_low", math.nan)
    sigma = max(row.get("speedup_std", 0.0), width / 4 if width == width else 0.0)
    return sigma / row["speedup"] if row["speedup"] else 0.0


def snapshot(group: report.Group, limit: int | None) -> dict[str, Any]:
    """The reference record of one analysed group."""
    methods = {}
    for r in group.results:
        methods[r.method] = {
            subtask: {"speedup": row["speedup"], "noise": relative_noise(row), "mean_accepted": row["mean_accepted"],
                      "questions": row["questions"]}
            for subtask, row in r.rows.items()
        }
    weights = next((run.meta.get("target_weights") for runs in group.methods.values() for run in runs
                    if run.meta and run.meta.get("target_weights")), None)
    zoo = next((fp for runs in group.methods.values() for run in runs if (fp := weights_of(run)[1])), None)
    return {"dataset": group.dataset, "model": group.model, "temperature": group.temperature, "batch": group.batch,
            "limit": limit,
            "environment": group.environment(), "target_weights": weights, "weights_fingerprint": zoo,
            "methods": methods}


def reference_path(ref_dir: Path, group: report.Group, quick: bool) -> Path:
    name = f"{group.dataset}-{group.model}" + ("" if group.temperature == 0 else f"-temp-{group.temperature:g}")
    name += f"-batch-{group.batch}" if group.batch > 1 else ""
    return ref_dir / f"{name}{'-quick' if quick else ''}.json"


def compare(ref: dict[str, Any], now: dict[str, Any], tol: DictConfig) -> tuple[list[list[str]], bool]:
    """Rows of (method, subtask, metric, reference, now, delta, verdict) and whether any regressed."""
    rows, regressed = [], False
    same_weights = not any(ref.get(key) and now.get(key) and ref[key] != now[key]
                           for key in ("target_weights", "weights_fingerprint"))
    if not same_weights:
        # Another build of the model (e.g. the zoo trained on another CPU: bf16 units change its
        # weights): greedy acceptance is a property of the weights, so it is not compared at all.
        print(f"note: the reference was made with other weights of this model ({ref.get('target_weights')}, "
              f"{ref.get('weights_fingerprint')} vs {now.get('target_weights')}, {now.get('weights_fingerprint')}); "
              "#mean accepted tokens is not compared; `check --quick` compares two "
              "commits on this machine instead, or `check --update` here makes a reference for these weights")
    for method, subtasks in sorted(ref["methods"].items()):
        for subtask, old in sorted(subtasks.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 99):
            new = now["methods"].get(method, {}).get(subtask)
            if new is None:
                rows.append([method, subtask, "-", "-", "-", "-", "MISSING"])
                regressed = True
                continue
            acc_delta = new["mean_accepted"] - old["mean_accepted"]
            acc_bad = same_weights and acc_delta < -tol.mean_accepted_abs
            rows.append([method, subtask, "#mean accepted", f"{old['mean_accepted']:.3f}",
                         f"{new['mean_accepted']:.3f}", f"{acc_delta:+.3f}",
                         ("REGRESSED" if acc_bad else "ok") if same_weights else "other weights"])
            allowed = max(tol.speedup_rel_min, tol.noise_sigmas * math.hypot(old["noise"], new["noise"]))
            rel = new["speedup"] / old["speedup"] - 1 if old["speedup"] else 0.0
            speed_bad = method != report.BASELINE and rel < -allowed
            rows.append([method, subtask, "speedup", f"{old['speedup']:.2f}x", f"{new['speedup']:.2f}x",
                         f"{rel:+.1%} (allowed -{allowed:.0%})", "REGRESSED" if speed_bad else "ok"])
            regressed |= acc_bad or speed_bad
    return rows, regressed


def quick_methods(cfg: DictConfig) -> list[str]:
    """The methods of the quick suite (`suites: [..., quick]` in a method's YAML, any source)."""
    from specbench.run import registry

    methods = [m for m in registry.register_with_hydra(registry.discover()).names(suite=cfg.quick.suite)
               if m != BASELINE]
    if not methods:
        raise SpecbenchError(f"no method is in suite '{cfg.quick.suite}'; add it to a method's suites: [...]")
    return methods


def job_command(methods: list[str], out_dir: Path, overrides: list[str]) -> list[str]:
    """`specbench run`: the baseline and `methods` in turn, question by question, in one job."""
    return [sys.executable, "-m", "specbench", "run", "method=baseline", f"interleave=[{','.join(methods)}]",
            f"output_dir={out_dir}", *overrides, "overwrite=true"]  # measured now, never resumed from old answers


def run_job(command: list[str], cwd: Path, what: str) -> float:
    """Run one job of the gate (its output passed through); its seconds. A failing job is an error."""
    print(f"\n== {what}: {' '.join(command[3:])}", flush=True)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # this tree's specbench, not the installed one
    done = subprocess.run(command, cwd=cwd, env=env, check=False)
    if done.returncode != 0:
        raise SpecbenchError(f"the {what} job failed (exit {done.returncode}; its error is above); fix it and run "
                             "check again")
    return time.perf_counter() - started


def run_quick(cfg: DictConfig, out_dir: Path, cwd: Path | None = None, methods: list[str] | None = None,
              what: str = "quick suite", extra: list[str] | None = None) -> float:
    """Run the quick suite (or `methods` of it) on the embedded default into `out_dir`, as one
    interleaved job with the code of the tree `cwd` (`extra`: more run overrides, e.g. a shard); its seconds."""
    return run_job(job_command(methods or quick_methods(cfg), out_dir, [*cfg.quick.overrides, *(extra or [])]),
                   cwd or Path.cwd(), what)


def job_order(blocks: int) -> list[tuple[str, int, int]]:
    """(side, block, blocks) in the order the jobs run: the questions split into `blocks` shards, each
    answered by the base and the change in turn, who goes first alternating from one block to the next
    (base, change, change, base, ...), so a drift of the machine's speed over the gate does not fall on
    one commit."""
    order = []
    for block in range(1, max(blocks, 1) + 1):
        pair = ["base", "change"] if block % 2 else ["change", "base"]
        order += [(side, block, max(blocks, 1)) for side in pair]
    return order


def git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SpecbenchError(f"git {' '.join(args)} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}; "
                             "check --quick needs a git checkout of specbench with the base commit in its history")
    return done.stdout.strip()


def base_commit(cfg: DictConfig, root: Path, given: str | None) -> tuple[str, str]:
    """The commit to compare with: `--base REV`, else the one `check --quick --update` recorded; and,
    for a recorded one, when and why it was chosen (`--why`), for the gate's header ("" for --base)."""
    if given:
        return git(["rev-parse", "--verify", f"{given}^{{commit}}"], root), ""
    path = root / cfg.quick.base_file
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        commit = recorded["commit"]
    except FileNotFoundError:
        raise SpecbenchError(f"no base commit recorded in {path}; run `check --quick --update` on a clean "
                             "checkout, or pass --base REV") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecbenchError(f"{path} does not name a base commit ({exc}); write it again with "
                             "`check --quick --update`") from None
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True,
                           check=False).returncode == 0
    if not known:  # a shallow clone: ask its origin for that one commit
        subprocess.run(["git", "fetch", "--quiet", "--depth=1", "origin", commit], cwd=root, capture_output=True,
                       check=False)
    when, why = recorded.get("recorded"), recorded.get("why")
    note = "".join([f"; recorded {when}" if when else "", f": {why}" if why else ""])
    return git(["rev-parse", "--verify", f"{commit}^{{commit}}"], root), note


def record_base(cfg: DictConfig, root: Path, why: str | None = None) -> int:
    """`check --quick --update`: the current commit becomes the base later changes are measured against
    (`why`: the reason, kept beside it and printed by every gate run against it)."""
    commit = git(["rev-parse", "HEAD"], root)
    if git(["status", "--porcelain", "--untracked-files=no"], root):
        raise SpecbenchError("the checkout has uncommitted changes; commit them first, since the base must be a "
                             "commit that a worktree can check out")
    path = root / cfg.quick.base_file
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"commit": commit, "recorded": time.strftime("%Y-%m-%d"), **({"why": why} if why else {})}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"base commit {commit[:12]} recorded in {path}; commit that file so CI measures changes against it")
    return 0


def job_runs(out_dir: Path) -> dict[str, Run]:
    """The first run of each method of a quick job (one dataset, model and temperature)."""
    runs: dict[str, Run] = {}
    for group in group_runs(load_runs(out_dir)):
        for name, method_runs in group.methods.items():
            runs.setdefault(name, method_runs[0])
    return runs


def mean_accepted(run: Run) -> float:
    steps = [a for r in run.records for a in r["choices"][0].get("accept_lengths") or []]
    return sum(steps) / len(steps) if steps else math.nan


def weights_of(run: Run) -> tuple[Any, Any]:
    """What a run's acceptance depends on: the target's fingerprint and that of every shipped or trained
    part it used (meta `weights_origin`)."""
    meta = run.meta or {}
    return meta.get("target_weights"), (meta.get("weights_origin") or {}).get("fingerprint")


def paired_verdicts(base: dict[str, Run], change: dict[str, Run], gate: DictConfig,
                    names: dict[str, str] | None = None, methods_gated: int | None = None,
                    ) -> tuple[list[list[str]], bool]:
    """Per method: the paired speed shift and #mean accepted, change against base. `names` maps a
    change method to the base method it stands for; `methods_gated` sets how many methods share the
    false-alarm rate (default: those compared here; the power benchmark gives CI's count)."""
    names = names or {m: m for m in change if m != BASELINE}
    gated = [m for m in names if m in change and names[m] in base]
    # Bonferroni: the chance that any of the methods is flagged on unchanged code is at most alpha
    alpha = float(gate.alpha) / max(methods_gated or len(gated), 1)
    rows, regressed = [], False
    for method in sorted(names):
        if method not in gated:
            rows.append([method, "-", "-", "-", "-", "-", "-", "-", "new: no base to compare" if method in change
                         else "MISSING"])
            regressed |= method not in change
            continue
        old_run, new_run = base[names[method]], change[method]
        shift = paired.paired_shift(paired.log_ratios(old_run, base[BASELINE]),
                                    paired.log_ratios(new_run, change[BASELINE]))
        same = weights_of(old_run) == weights_of(new_run)
        old_acc, new_acc = mean_accepted(old_run), mean_accepted(new_run)
        acc_bad = same and new_acc < old_acc - 1e-9
        acc = f"{old_acc:.3f} -> {new_acc:.3f}" + ("" if same else " (other weights)")
        own = own_change(old_run, new_run)
        if shift is None:
            rows.append([method, "0", "-", "-", "-", "-", acc, own, "REGRESSED (acceptance)" if acc_bad else "too few"])
            regressed |= acc_bad
            continue
        slow = paired.is_regression(shift, alpha, float(gate.min_slowdown))
        verdict = "REGRESSED" if slow or acc_bad else "ok"
        if acc_bad:
            verdict += " (acceptance)"
        rows.append([method, str(shift.units), f"{shift.slowdown:+.1%}", f"[{shift.low:+.1%}, {shift.high:+.1%}]",
                     f"{shift.p_value:.4f}", f"{shift.spread:.3f}", acc, own, verdict])
        regressed |= slow or acc_bad
    return rows, regressed


PAIRED_HEADER = ["Method", "Units", "Slowdown", "95% interval", "p (one-sided)", "sd(d)", "#mean accepted",
                 "Own time/token", "Verdict"]


def own_change(old_run: Run, new_run: Run) -> str:
    """A lane's own time per token, change over base, minus 1 (trimmed mean over units): what tells a
    method that got slower from a baseline that got faster. Not paired in time, so the machine's drift
    between the two jobs is in it; the verdict reads the paired ratio only."""
    own = paired.paired_shift(paired.log_costs(old_run), paired.log_costs(new_run))
    return "-" if own is None else f"{own.slowdown:+.1%}"


def paired_gate(cfg: DictConfig, base_rev: str | None, keep: Path | None) -> int:
    """`check --quick`: the quick suite at the base commit and at the change, in turn, compared paired."""
    root = Path(git(["rev-parse", "--show-toplevel"], Path.cwd()))
    commit, note = base_commit(cfg, root, base_rev)
    head = git(["rev-parse", "HEAD"], root)
    dirty = bool(git(["status", "--porcelain", "--untracked-files=no"], root))
    methods = quick_methods(cfg)
    with tempfile.TemporaryDirectory(prefix="specbench-check-") as tmp:
        work = keep or Path(tmp)
        tree = Path(tmp) / "base-tree"
        git(["worktree", "add", "--detach", "--force", str(tree), commit], root)
        try:
            base_methods = set(subprocess.run(
                [sys.executable, "-m", "specbench", "methods", "--names", "--suite", str(cfg.quick.suite)],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                check=False).stdout.strip().split(","))
            shared = [m for m in methods if m in base_methods] or methods
            sides = {"base": (tree, shared, f"base {commit[:12]}"),
                     "change": (root, methods, f"change {head[:12]}{' + uncommitted changes' if dirty else ''}")}
            seconds = 0.0
            for side, block, blocks in job_order(int(cfg.quick.blocks)):
                cwd, names, what = sides[side]
                extra = [f"shard={block}/{blocks}"] if blocks > 1 else []
                label = f"{what}, questions {block} of {blocks}" if blocks > 1 else what
                seconds += run_quick(cfg, work / side, cwd, names, label, extra)
        finally:
            git(["worktree", "remove", "--force", str(tree)], root)
        base, change = job_runs(work / "base"), job_runs(work / "change")
        status = 0
        for group in [report.analyse(g) for g in group_runs(load_runs(work / "change"))]:
            for problem in gate_problems(group):
                print(f"FAILED: {group.title}: {problem}")
                status = 1
        rows, regressed = paired_verdicts(base, change, cfg.quick.gate)
    print(f"\nchange {head[:12]}{' (+ uncommitted)' if dirty else ''} against base {commit[:12]}{note}, paired per "
          f"(question, turn) on this machine ({seconds / 60:.1f} min for both jobs)\n")
    print(markdown(PAIRED_HEADER, rows))
    baseline = own_change(base[BASELINE], change[BASELINE]) if BASELINE in base and BASELINE in change else "-"
    print(f"\nSlowdown: the trimmed mean over units of the change's (method / baseline) time per token over the "
          f"base's, minus 1; a regression when p < {cfg.quick.gate.alpha:g} / methods and the slowdown is at least "
          f"{cfg.quick.gate.min_slowdown:.0%}. #mean accepted must not drop where the weights are the same. Own "
          f"time/token: the method's own time per token, change over base, minus 1 (the baseline's: {baseline}); "
          f"not paired in time, so it carries the machine's drift between the jobs and only explains a verdict: "
          f"a speedup can fall because the baseline got faster.")
    print(f"\n{'REGRESSION' if regressed else 'no regression'}: change against base {commit[:12]}")
    return status | int(regressed)


def gate_problems(group: report.Group) -> list[str]:
    """What fails a gate whatever the reference says: a method with no answers, failed
    questions, and greedy answers that differ from the baseline's beyond a numerical near-tie."""
    problems = []
    reported = {r.method for r in group.results}
    for name, runs in sorted(group.methods.items()):
        skipped = [run.skipped for run in runs if run.skipped]
        if skipped:
            problems.append(f"{name}: unreadable answers ({skipped[0]})")
        elif name not in reported:
            problems.append(f"{name} has no answers to compare (every question failed or none ran)")
        failed = sorted({q for run in runs for q in run.failed})
        if failed:
            problems.append(f"{name}: {len(failed)} question(s) failed (e.g. {failed[0]}); see its errors.jsonl")
    for result in group.results:
        audit = result.audit or {}
        bugs = [m for m in audit.get("mismatches", []) if is_bug(m)]
        if bugs:
            m = bugs[0]
            problems.append(f"{result.method}: {len(bugs)} greedy answer(s) differ from the baseline's, not by a "
                            f"near-tie (first: question {m['question_id']}, turn {m['turn']}, token {m['position']})")
    return problems


def check(results_dir: Path, ref_dir: Path, cfg: DictConfig, *, update: bool, quick: bool,
          limit: int | None = None, allow_missing: bool = False) -> int:
    """0 when every group matches its reference; 1 on a regression, a failed gate, or a
    missing reference (unless `allow_missing`)."""
    groups = [report.analyse(g) for g in report.group_runs(report.load_runs(results_dir))]
    for group in groups:
        for problem in [*group.problems, *group.notes]:
            print(f"warning: {problem}", file=sys.stderr)
    groups = [g for g in groups if g.results]
    if not groups:
        raise SpecbenchError(f"no results with a baseline under {results_dir}; run the methods first")
    status = 0
    for group in groups:
        path = reference_path(ref_dir, group, quick)
        now = snapshot(group, limit)
        gates = gate_problems(group)
        for problem in gates:
            print(f"FAILED: {group.title}: {problem}")
        status |= int(bool(gates))
        if update:
            if gates:
                print(f"reference {path} not written: fix the failures above first")
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(now, indent=2, sort_keys=True) + "\n")
            except OSError as exc:
                raise SpecbenchError(f"cannot write reference {path} ({exc.strerror or exc}); make its folder "
                                     "writable or give another with --reference ...") from None
            print(f"wrote reference {path} ({len(now['methods'])} methods)")
            continue
        if not path.exists():
            hint = "write one with `check --update`"
            if allow_missing:
                print(f"{group.title}: no reference {path} (allowed by --allow-missing); {hint}")
            else:
                print(f"FAILED: {group.title}: no reference {path}; {hint}, or pass --allow-missing")
                status = 1
            continue
        rows, regressed = compare(read_reference(path), now, cfg.tolerance)
        print(f"\n{group.title} against {path}\n")
        print(markdown(["Method", "Subtask", "Metric", "Reference", "Now", "Delta", "Verdict"], rows))
        print(f"\n{'REGRESSION' if regressed else 'no regression'}: {group.title}")
        status |= int(regressed)
    return status


def read_reference(path: Path) -> dict[str, Any]:
    """A reference file written by `check --update`, checked for the fields `compare` reads."""
    fix = "write it again with `check --update` (or restore it from git)"
    try:
        ref = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecbenchError(f"reference {path} cannot be read ({exc}); {fix}") from None
    methods = ref.get("methods") if isinstance(ref, dict) else None
    if not isinstance(methods, dict):
        raise SpecbenchError(f"reference {path} has no 'methods' table; {fix}")
    if not any(rows for method, rows in methods.items() if method != report.BASELINE):
        raise SpecbenchError(f"reference {path} checks nothing (no method besides the baseline has a row), so no "
                             f"regression could fail it; {fix} from a run with methods")
    for method, subtasks in methods.items():
        if not isinstance(subtasks, dict):
            raise SpecbenchError(f"reference {path}: method {method} is not a table of subtasks; {fix}")
        for subtask, row in subtasks.items():
            ok = isinstance(row, dict) and all(
                isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                and math.isfinite(row[k]) and row[k] >= 0 for k in ("speedup", "noise", "mean_accepted"))
            if not ok or not row["speedup"] > 0:
                raise SpecbenchError(f"reference {path}: {method} / {subtask} lacks a finite speedup (> 0), noise or "
                                     f"mean_accepted (>= 0); {fix}")
    return ref


def check_main(args: list[str]) -> int:

    parser = ArgumentParser(prog="python -m specbench check", description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="answer files to check (default: check.yaml's results_dir)")
    parser.add_argument("--reference", help="reference folder (default: check.yaml's reference_dir)")
    parser.add_argument("--update", action="store_true",
                        help="write the reference from these results (with --quick: record HEAD as the base commit)")
    parser.add_argument("--quick", action="store_true",
                        help="run the quick suite at the base commit and at this checkout, in turn, and compare them")
    parser.add_argument("--base", metavar="REV", help="with --quick: the commit to compare with (default: "
                        "the one recorded in check.yaml's quick.base_file)")
    parser.add_argument("--why", metavar="TEXT", help="with --quick --update: why the base moves (kept in the base "
                        "file and printed by every gate run against it)")
    parser.add_argument("--keep", metavar="DIR", help="with --quick: keep both jobs' answers under DIR")
    parser.add_argument("--allow-missing", action="store_true",
                        help="a group without a reference passes (by default it fails: a gate must not pass unset)")
    parser.add_argument("overrides", nargs="*", help="check.yaml overrides, e.g. quick.gate.min_slowdown=0.1")
    opts = parser.parse_args(args)
    cfg = load_check_config(opts.overrides)
    if opts.why and not (opts.quick and opts.update):
        raise SpecbenchError("--why goes with --quick --update (the reason a new base is recorded)")
    if opts.quick:
        if opts.update:
            return record_base(cfg, Path(git(["rev-parse", "--show-toplevel"], Path.cwd())), opts.why)
        return paired_gate(cfg, opts.base, Path(opts.keep).absolute() if opts.keep else None)
    ref_dir = Path(opts.reference or cfg.reference_dir)
    return check(Path(opts.results or cfg.results_dir), ref_dir, cfg, update=opts.update, quick=False,
                 allow_missing=opts.allow_missing)
