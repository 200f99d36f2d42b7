"""Plain-text tables for the terminal (Markdown pipe syntax, so they paste into a README)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbench.core.questions import SUBTASK_TITLES


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def speedup_table(rows: Sequence[dict[str, Any]], *, title: str, runs: int, first: str = "Subtask") -> str:
    """The run summary: per-subtask speedup and #mean accepted tokens (upstream definitions); a
    row's `label`, where it has one, names it instead of its subtask (`first`: that column's title)."""
    body = []
    for r in rows:
        speedup = f"{r['speedup']:.2f}x"
        if runs > 1:
            speedup += f" ± {r['speedup_std']:.2f}"
        body.append([
            r.get("label") or SUBTASK_TITLES.get(r["subtask"], "Overall"),
            r["questions"],
            f"{r['tokens_per_s']:.1f}",
            f"{r['baseline_tokens_per_s']:.1f}",
            speedup,
            f"{r['mean_accepted']:.2f}",
        ])
    headers = [first, "#Q", "tok/s", "baseline tok/s", "Speedup", "#Mean accepted tokens"]
    notes = (
        "speedup = mean per-question tok/s of the method / of the baseline on the same questions; "
        "#mean accepted tokens = mean tokens emitted per target forward, bonus token included "
        f"(1.00 for autoregressive decoding); mean over {runs} run(s)" + (" ± std" if runs > 1 else "")
    )
    return f"\n{title}\n\n{markdown(headers, body)}\n\n{notes}\n"
