"""The table printed at the end of `specbench run`: the method against the baseline, per subtask."""

from __future__ import annotations

from specbench.analysis import metrics
from specbench.core.answers import ANSWERS, read_answers
from specbench.core.table import speedup_table
from specbench.run.session import Session


def run_summary(session: Session) -> str:
    """Speedup rows of the session's method against the baseline, averaged over runs."""
    cfg = session.cfg
    name = cfg.method.name
    wanted = {q.question_id for q in session.questions}
    per_run = []
    for run in range(1, int(cfg.runs) + 1):
        ours = [r for r in read_answers(session.run_dir(name, run) / ANSWERS) if r["question_id"] in wanted]
        base = [r for r in read_answers(session.run_dir("baseline", run) / ANSWERS) if r["question_id"] in wanted]
        if ours and base:
            per_run.append(metrics.speedup_rows(ours, base))
    header = f"{name} vs baseline | {cfg.model.name} | {cfg.dataset.name} | temperature {cfg.temperature:g}"
    if not per_run:
        return f"{header}: no baseline answers to compare with (run with baseline=true)"
    return speedup_table(metrics.average_runs(per_run), title=header, runs=int(cfg.runs))
