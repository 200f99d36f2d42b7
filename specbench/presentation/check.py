"""`python -m specbench check`: fail CI when speedup or acceptance regresses.

A reference (`results/reference/<dataset>-<model>[-quick].json`, written by `--update`)
holds each method's per-subtask #mean accepted tokens and speedup with its noise. Acceptance
is deterministic under greedy decoding, so it gets a tight absolute tolerance; speedup gets a
relative one that widens with the measured run-to-run / bootstrap noise.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.analysis import report
from specbench.analysis.audit import is_bug
from specbench.core.args import ArgumentParser
from specbench.core.errors import SpecbenchError
from specbench.core.questions import SUBTASKS
from specbench.core.resources import CONFIG_DIR
from specbench.core.table import markdown

ORDER = [*SUBTASKS, "overall"]


def load_check_config(overrides: list[str] | None = None) -> DictConfig:
    """check.yaml with `key=value` overrides: unknown keys and non-numeric tolerances are errors."""
    cfg = OmegaConf.load(CONFIG_DIR / "check.yaml")
    OmegaConf.set_struct(cfg, True)
    for item in overrides or []:
        if "=" not in item:
            raise SpecbenchError(f"check override '{item}' has no '='; write key=value, "
                                 "e.g. tolerance.speedup_rel_min=0.2")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException:
            raise SpecbenchError(f"unknown check setting '{item.split('=', 1)[0]}'; the settings are those of "
                                 f"{CONFIG_DIR / 'check.yaml'}") from None
    for tolerances, where in ((cfg.tolerance, "tolerance"), (cfg.quick.get("tolerance") or {}, "quick.tolerance")):
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
    return {"dataset": group.dataset, "model": group.model, "temperature": group.temperature, "batch": group.batch,
            "limit": limit,
            "environment": group.environment(), "target_weights": weights, "methods": methods}


def reference_path(ref_dir: Path, group: report.Group, quick: bool) -> Path:
    name = f"{group.dataset}-{group.model}" + ("" if group.temperature == 0 else f"-temp-{group.temperature:g}")
    name += f"-batch-{group.batch}" if group.batch > 1 else ""
    return ref_dir / f"{name}{'-quick' if quick else ''}.json"


def compare(ref: dict[str, Any], now: dict[str, Any], tol: DictConfig) -> tuple[list[list[str]], bool]:
    """Rows of (method, subtask, metric, reference, now, delta, verdict) and whether any regressed."""
    rows, regressed = [], False
    acc_tol = tol.mean_accepted_abs
    if ref.get("target_weights") and now.get("target_weights") and ref["target_weights"] != now["target_weights"]:
        # Another build of the same model (e.g. the zoo trained afresh on another machine): greedy
        # acceptance is only comparable loosely. Say so rather than fail on a non-regression.
        acc_tol = tol.mean_accepted_abs_other_weights
        print(f"note: the reference was made with other weights of this model ({ref['target_weights']} vs "
              f"{now['target_weights']}); #mean accepted tolerance widened to {acc_tol}; "
              "`check --update` on this machine makes it tight again")
    for method, subtasks in sorted(ref["methods"].items()):
        for subtask, old in sorted(subtasks.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 99):
            new = now["methods"].get(method, {}).get(subtask)
            if new is None:
                rows.append([method, subtask, "-", "-", "-", "-", "MISSING"])
                regressed = True
                continue
            acc_delta = new["mean_accepted"] - old["mean_accepted"]
            acc_bad = acc_delta < -acc_tol
            rows.append([method, subtask, "#mean accepted", f"{old['mean_accepted']:.3f}",
                         f"{new['mean_accepted']:.3f}", f"{acc_delta:+.3f}", "REGRESSED" if acc_bad else "ok"])
            allowed = max(tol.speedup_rel_min, tol.noise_sigmas * math.hypot(old["noise"], new["noise"]))
            rel = new["speedup"] / old["speedup"] - 1 if old["speedup"] else 0.0
            speed_bad = method != report.BASELINE and rel < -allowed
            rows.append([method, subtask, "speedup", f"{old['speedup']:.2f}x", f"{new['speedup']:.2f}x",
                         f"{rel:+.1%} (allowed -{allowed:.0%})", "REGRESSED" if speed_bad else "ok"])
            regressed |= acc_bad or speed_bad
    return rows, regressed


def run_quick(cfg: DictConfig, out_dir: Path) -> None:
    """Run the methods of the quick suite (`suites: [..., quick]` in a method's YAML, any source)
    on the embedded default into `out_dir`."""
    from hydra import compose, initialize_config_dir

    from specbench.run import registry
    from specbench.run import session as runner

    methods = registry.register_with_hydra(registry.discover()).names(suite=cfg.quick.suite)
    if not methods:
        raise SpecbenchError(f"no method is in suite '{cfg.quick.suite}'; add it to a method's suites: [...]")
    for method in methods:
        overrides = [f"method={method}", f"output_dir={out_dir}", *cfg.quick.overrides]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            run_cfg = compose("config", overrides=overrides)
        runner.run(run_cfg)


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
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n", encoding="utf-8")
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
    parser.add_argument("--update", action="store_true", help="write the reference from these results")
    parser.add_argument("--quick", action="store_true", help="run a small slice of the embedded default first")
    parser.add_argument("--allow-missing", action="store_true",
                        help="a group without a reference passes (by default it fails: a gate must not pass unset)")
    parser.add_argument("overrides", nargs="*", help="check.yaml overrides, e.g. tolerance.speedup_rel_min=0.2")
    opts = parser.parse_args(args)
    cfg = load_check_config(opts.overrides)
    ref_dir = Path(opts.reference or cfg.reference_dir)
    if opts.quick:
        cfg.tolerance = OmegaConf.merge(cfg.tolerance, cfg.quick.get("tolerance") or {})
        with tempfile.TemporaryDirectory(prefix="specbench-check-") as tmp:
            run_quick(cfg, Path(tmp))
            return check(Path(tmp), ref_dir, cfg, update=opts.update, quick=True, allow_missing=opts.allow_missing)
    return check(Path(opts.results or cfg.results_dir), ref_dir, cfg, update=opts.update, quick=False,
                 allow_missing=opts.allow_missing)
