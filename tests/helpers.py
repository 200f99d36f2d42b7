"""Small helpers shared by tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = REPO.parent / "shared" / "spec_bench" / "question.jsonl"
CATEGORIES = ["writing", "roleplay", "translation", "summarization", "qa", "math_reasoning", "rag"]


def write_questions(path: Path, per_category: int = 2) -> Path:
    """A small question file in the official schema: every subtask, mt_bench with two turns."""
    lines = []
    qid = 1
    for category in CATEGORIES:
        for i in range(per_category):
            turns = [f"please {category} item number {i} for the quick brown fox"]
            if category in ("writing", "roleplay"):
                turns.append("now summarize the passage in two sentences")
            lines.append(json.dumps({"question_id": qid, "category": category, "turns": turns}))
            qid += 1
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def specbench(*args: str, cwd: Path, check: bool = False, timeout: float = 600,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m specbench ARGS` in `cwd` (with `env` added to the environment), capturing output."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"specbench {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class CliResult:
    """What one in-process `specbench` command left: its exit code, stdout and stderr."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, err={self.err[-2000:]!r})"


def cli(*args: str, cwd: Path) -> CliResult:
    """Run `specbench ARGS` in this process (about 10x quicker than a subprocess once torch is
    imported): the exit code, what it printed; an exception escaping `main` propagates."""
    import contextlib
    import io

    from specbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv[:], os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv[:] = argv
        os.chdir(here)
    return CliResult(code, out.getvalue(), err.getvalue())


def error_lines(text: str) -> list[str]:
    """The `error: ...` lines of a command's stderr."""
    return [line for line in text.splitlines() if line.startswith("error:")]


def assert_one_line_error(result: CliResult | subprocess.CompletedProcess, pattern: str, code: int = 2) -> str:
    """The command failed with `code`, printed exactly one `error:` line matching `pattern`
    (a regular expression) and no traceback. Returns that line."""
    import re

    err = result.err if isinstance(result, CliResult) else result.stderr
    rc = result.code if isinstance(result, CliResult) else result.returncode
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert rc == code and len(lines) == 1 and re.search(pattern, lines[0]), (rc, err[-3000:])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: to show that a failed command left them alone."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
