"""Memory and provenance in every answer folder's meta: the phase's peak memory, the drafter's own
weights (counted from its modules), the machine and library versions; the leaderboard's memory
columns and `recommend --memory-gb` on the measured peak."""

import json
import time

import pytest
import torch

from helpers import CATS, base_records, cli, record, write_questions, write_run
from specbench.models import load_model
from specbench.run.provenance import environment

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`


@pytest.fixture(scope="module")
def sps_run(tiny_models, tmp_path_factory):
    """(results folder, draft folder): baseline and sps (tiny qwen2 drafting for tiny llama) on two questions."""
    root = tmp_path_factory.mktemp("memory")
    questions = write_questions(root / "q.jsonl", per_category=1)
    out = root / "results"
    done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "method=sps",
               f"method.draft={tiny_models['qwen2']}", "dataset=spec_bench", f"dataset.path={questions}",
               f"output_dir={out}", "max_new_tokens=8", "warmup=0", "progress=false", "task=[qa,rag]",
               "contention_threshold=1000", cwd=root)
    assert done.code == 0, done
    return out, tiny_models["qwen2"]


def meta_of(out, method):
    (path,) = out.rglob(f"{method}/temp-0/run-1/meta.json")
    return json.loads(path.read_text())


def test_meta_records_peak_memory_and_the_drafters_weights(sps_run):
    out, draft = sps_run
    for method in ("baseline", "sps"):
        memory = meta_of(out, method)["memory"]
        assert memory["peak_bytes"] > 0 and memory["measured_by"], memory
        assert memory["phase_peak_bytes"] >= memory["start_bytes"] > 0  # a peak over the phase, from its start
        assert memory["peak_bytes"] > 0
    draft_model = load_model(str(draft), device=torch.device("cpu"), dtype=torch.float32).model
    expected = sum(p.numel() * p.element_size() for p in draft_model.parameters())
    drafter = meta_of(out, "sps")["memory"]["drafter"]
    assert drafter["weights_bytes"] == expected and drafter["parameters"] == meta_of(out, "sps")["extra_parameters"]
    assert "own modules" in drafter["measured_by"] and "KV cache" in drafter["caches"]
    assert meta_of(out, "baseline")["memory"]["drafter"]["weights_bytes"] == 0


def test_meta_records_the_machine_and_versions(sps_run):
    env = meta_of(sps_run[0], "sps")["environment"]
    assert env["cpu"]["logical_cores"] >= 1 and env["memory_total_bytes"] > 0
    assert env["cpu"]["model"] and env["cpu"]["model"] != env["machine"]  # the model name, not just x86_64
    assert env["device_name"] == env["cpu"]["model"]
    versions = env["versions"]
    assert versions["torch"] == torch.__version__ and all(versions[k] for k in ("transformers", "tokenizers",
                                                                                 "safetensors", "numpy", "specbench"))
    assert "cuda" in env and "gpus" in env  # None on a machine without them, never missing
    config = meta_of(sps_run[0], "sps")["config"]
    assert config["method"]["name"] == "sps" and config["contention_threshold"] == 1000


def test_environment_is_cheap(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    environment(target)  # warm: the git binary and /proc files in the page cache
    start = time.perf_counter()
    env = environment(target)
    took = time.perf_counter() - start
    print(f"environment() took {took * 1000:.1f} ms")  # measured, not asserted (other jobs share the machine)
    assert env["versions"]["specbench"]


def test_report_shows_memory_columns(sps_run, tmp_path):
    out, _ = sps_run
    done = cli("report", str(out), "--out", str(tmp_path / "lb"), "--no-figures", cwd=tmp_path)
    assert done.code == 0, done
    md = next((tmp_path / "lb").glob("*.md")).read_text()
    details = md.split("## Details")[1]
    header, *rows = [[c.strip() for c in line.split("|")[1:-1]] for line in details.splitlines()
                        if line.startswith("| ")]
    cells = {row[0]: dict(zip(header, row)) for row in rows}
    peak = meta_of(out, "sps")["memory"]["peak_bytes"]
    shown = float(f"{peak:.3g}")  # rounded first, as the table does: 999.6 MB reads 1 GB
    unit, scale = ("GB", 1e9) if shown >= 1e9 else ("MB", 1e6)
    assert cells["sps"]["Peak memory"] == f"{shown / scale:.3g} {unit}", cells["sps"]
    assert cells["sps"]["Drafter memory"].endswith("KB") and cells["baseline"]["Drafter memory"] == "none"
    assert "Peak memory: peak resident set" in md or "Peak memory: torch.cuda" in md


def write_measured(root, method, records, peak_bytes, facts):
    folder = write_run(root, method, records, facts=facts)
    meta = json.loads((folder / "meta.json").read_text())
    meta["memory"] = {"peak_bytes": peak_bytes, "measured_by": "peak resident set of the process over the phase",
                      "drafter": {"weights_bytes": 40}}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_recommend_uses_the_measured_peak(tmp_path):
    """Parameters say 4 KB of weights for every method; the measured peaks say 1 GB for the
    baseline and `light`, 3 GB for `heavy` (the faster one): with 2 GB, only `light` fits."""
    root = tmp_path / "answers"
    write_measured(root, "baseline", base_records(), 1_000_000_000, {"training": False})
    write_measured(root, "heavy", [record(i, c, 10, 0.25, [2] * 5) for i, c in enumerate(CATS)], 3_000_000_000,
                   {"training": False})
    write_measured(root, "light", [record(i, c, 10, 0.5, [2] * 5) for i, c in enumerate(CATS)], 1_000_000_000,
                   {"training": False})
    done = cli("recommend", "--memory-gb", "2", "--training", "yes", "--results", str(root), cwd=tmp_path)
    assert done.code == 0, done
    assert "Recommendation: light" in done.out and "measured peak" in done.out
    heavy = next(line for line in done.out.splitlines() if "| heavy " in line)
    assert "3.00" in heavy and "too large" in heavy
    # without measured peaks the same folder is judged on the parameter estimate: heavy fits
    for meta in root.rglob("meta.json"):
        data = json.loads(meta.read_text())
        del data["memory"]
        meta.write_text(json.dumps(data))
    done = cli("recommend", "--memory-gb", "2", "--training", "yes", "--results", str(root), cwd=tmp_path)
    assert "Recommendation: heavy" in done.out and "parameter estimate" in done.out
