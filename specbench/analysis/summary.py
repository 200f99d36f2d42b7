"""The table printed at the end of `specbench run`: the method against the baseline, per subtask."""

from __future__ import annotations

from specbench.analysis.frame import OVERALL, speedups, tidy
from specbench.analysis.runs import BASELINE, Run
from specbench.core.answers import ANSWERS, ERRORS, read_answers
from specbench.core.table import speedup_table
from specbench.run.runner import RunResult


def result_runs(result: RunResult, method: str) -> list[Run]:
    """The run's answers of `method` read back from its files (this shard's folder, this run's
    questions), per run."""
    cfg = result.cfg
    wanted = set(result.questions)
    runs = []
    for run in range(1, int(cfg.runs) + 1):
        folder = result.folder(method, run)
        records = [r for r in read_answers(folder / ANSWERS) if r["question_id"] in wanted]
        runs.append(Run(cfg.dataset.name, cfg.model.name, method, float(cfg.temperature), run, records,
                        source=folder))
    return runs


def run_summary(result: RunResult) -> str:
    """Speedup rows of each of the run's method runs (both under `budget=both`, filed as
    <name> and <name>-fixed) against the baseline (report's numbers, `frame.speedups`)."""
    cfg = result.cfg
    names = [n for n in dict.fromkeys(result.labels) if n != BASELINE] or [cfg.method.name]
    runs = [run for method in dict.fromkeys([BASELINE, *names]) for run in result_runs(result, method)]
    table = speedups(tidy(runs))
    lines = []
    where = f"{cfg.model.name} | {cfg.dataset.name} | temperature {cfg.temperature:g}"
    found = [n for n in names if n in table.index.get_level_values("method")]
    lines += [f"{n} vs baseline | {where}: no baseline answers to compare with (run with baseline=true)"
              for n in names if n not in found]
    if len(found) > 2:  # many method runs (interleave=[...]): their overall rows in one table
        rows = []
        for n in found:
            row = table.loc[(n, OVERALL)].to_dict()
            rows.append({**row, "questions": int(row["questions"]), "subtask": OVERALL, "label": n})
        lines.append(speedup_table(rows, title=f"all questions, against the baseline | {where}", runs=int(cfg.runs),
                                   first="Method"))
    else:
        for name in found:
            rows = table.loc[name].reset_index().to_dict("records")
            lines.append(speedup_table(rows, title=f"{name} vs baseline | {where}", runs=int(cfg.runs)))
    if found:
        lines.append("schedule=sequential: methods timed one after another; their speedups carry any drift of the "
                     "machine between them" if cfg.get("schedule") == "sequential" else
                     "schedule=interleaved: the baseline and the methods answered each question in turn, so the "
                     "speedups are paired (answers already there were timed by the job that made them: `report` "
                     "says how)")
    for outcome in result.failures():
        lines.append(f"{outcome.label}: {outcome.failed} failed question(s) not in these numbers "
                     f"(listed in {outcome.folder / ERRORS})")
    return "\n".join(lines)
