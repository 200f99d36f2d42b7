"""backend=vllm with the real vLLM (`make vllm`: .venv-vllm), on the zoo's target and draft: the
servers start, answer every question, their counters give the acceptance, the report puts vLLM's
methods beside ours. Skipped, with the reason, where vLLM is not installed (CI does not install it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, cli

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
pytestmark = pytest.mark.skipif(not (REPO / ".venv-vllm" / ".installed").is_file(),
                                reason="vLLM is not installed here: `make vllm` installs it into .venv-vllm")


def test_real_vllm_runs_the_zoo_beside_ours(tmp_path: Path):
    common = ["model=tiny", "task=all", "limit=1", "max_new_tokens=32", "warmup=1", "progress=false",
              f"output_dir={tmp_path / 'answers'}", f"dataset.path={tmp_path / 'question.jsonl'}"]
    ours = cli("run", *common, "method=sps", "method.schedule=constant", "budget=fixed", cwd=REPO)
    assert ours.code == 0, ours.err
    done = cli("run", *common, "backend=vllm", f"backend.python={VLLM_PYTHON}", "backend.max_model_len=1024",
               "interleave=[draft_model]", cwd=REPO)
    assert done.code == 0, done.err
    records = [json.loads(line) for line in
               (tmp_path / "answers" / "synthetic" / "tiny-vllm" / "draft_model" / "temp-0" / "run-1" /
                "answers.jsonl").read_text().splitlines()]
    assert len(records) == 6
    stats = [s for r in records for s in r["specbench"]["stats"]]
    assert sum(s["drafts"] for s in stats) > 0 and sum(s["accepted_tokens"] for s in stats) > 0
    for r in records:  # every token accounted for by the counters' steps
        choice = r["choices"][0]
        assert len(choice["new_tokens"]) + sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
    report = cli("report", str(tmp_path / "answers"), "--out", str(tmp_path / "report"), "--no-figures", cwd=REPO)
    assert report.code == 0, report.err
    engines = (tmp_path / "report" / "engines.md").read_text()
    row = next(line for line in engines.splitlines() if "| draft_model" in line)
    assert "| sps-fixed |" in row and "equal" in row  # ours beside it; greedy answers compared with our baseline
