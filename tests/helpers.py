"""Small helpers shared by tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


def specbench(*args: str, cwd: Path, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m specbench ARGS` in `cwd`, capturing output."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"specbench {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_specbench(args: list[str], cwd: Path, **popen: object) -> subprocess.Popen:
    """Start `python -m specbench ARGS` in the background (to kill or interrupt it mid-run)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, **popen)


def wait_for_answers(path: Path, n: int, timeout: float = 300) -> None:
    """Poll until the answer file holds at least `n` complete lines (or the timeout passes)."""
    deadline = time.time() + timeout
    while time.time() < deadline and (not path.exists() or path.read_text().count("\n") < n):
        time.sleep(0.05)
