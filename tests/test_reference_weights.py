"""The reference weights committed in weights/: complete, within budget, intact, and the same models on
every machine.

The folders are the ones this code builds (a recipe that changes renames its folder: then a new release
must be shipped with it), every file matches its checksum, and greedy answers of the committed zoo equal
the token ids committed in tests/data/reference_answers.json, step for step (#mean accepted tokens
included), on whatever CPU runs the test. `SPECBENCH_UPDATE_REFERENCE=1` writes that file anew (a new
release of the weights only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

import pytest

from helpers import specbench
from specbench.run.registry import BUILTIN, discover
from specbench.zoo import ensure_zoo, release, shipped
from specbench.zoo.parts import trained_part_dir

REFERENCE = Path(__file__).parent / "data" / "reference_answers.json"
#: the target, the distilled draft, the EAGLE heads, Medusa's and Hydra's: every kind of shipped part
METHODS = ["sps", "eagle2", "medusa", "hydra"]
ARGS = ["task=all", "limit=1", "max_new_tokens=48", "budget=fixed", "warmup=0", "progress=false", "threads=1"]
BUDGET_BYTES = 150_000_000


@pytest.fixture(scope="module")
def manifest() -> dict:
    manifest = shipped.read_manifest()
    assert manifest is not None, f"no shipped weights in {shipped.weights_root()}"
    return manifest


def test_the_shipped_folders_are_the_ones_this_code_builds(manifest: dict) -> None:
    zoo = ensure_zoo()  # restored from the shipped weights (seconds), never trained: see the origin below
    registry = discover()
    wanted = [zoo] + [trained_part_dir(zoo, name, registry) for name in registry.trained()
                      if registry.specs[name].source == BUILTIN]
    missing = [folder.name for folder in wanted if folder.name not in manifest["folders"]]
    assert not missing, (f"the shipped weights lack {missing}: a recipe or setting changed; ship a new release "
                         "(docs/setup.md, 'The reference weights') or revert the change")
    assert shipped.read_origin(zoo)["source"] == "shipped"


def test_the_shipped_weights_are_within_budget_safetensors_and_intact(manifest: dict) -> None:
    root = shipped.weights_root()
    assert manifest["bytes"] == sum(entry["bytes"] for entry in manifest["files"].values()) <= BUDGET_BYTES
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {shipped.MANIFEST}
    assert on_disk == set(manifest["files"])  # nothing unlisted, nothing missing
    assert not [name for name in on_disk if any(PurePosixPath(name).match(p) for p in release.PICKLED)]
    for name in manifest["files"]:
        shipped.verified(root, name, manifest)
    assert manifest["fingerprint"] == shipped.release_fingerprint(manifest["files"])


def answers_of(out: Path) -> dict[str, dict[str, dict]]:
    found: dict[str, dict[str, dict]] = {}
    for path in sorted(out.rglob("answers.jsonl")):
        method = path.parts[-4].removesuffix("-fixed")
        for line in path.read_text().splitlines():
            record = json.loads(line)
            found.setdefault(method, {})[str(record["question_id"])] = {
                "output_ids": record["specbench"]["output_ids"],
                "accept_lengths": record["choices"][0]["accept_lengths"]}
    return found


def test_greedy_answers_and_acceptance_equal_the_committed_ones(manifest: dict, tmp_path: Path) -> None:
    done = specbench("run", "method=baseline", f"interleave=[{','.join(METHODS)}]", *ARGS,
                     f"output_dir={tmp_path / 'answers'}", cwd=tmp_path, check=True)
    now = answers_of(tmp_path / "answers")
    assert set(now) == {"baseline", *METHODS}, done.stderr[-2000:]
    if os.environ.get("SPECBENCH_UPDATE_REFERENCE") == "1":
        REFERENCE.parent.mkdir(exist_ok=True)
        REFERENCE.write_text(json.dumps({"fingerprint": manifest["fingerprint"], "methods": METHODS, "args": ARGS,
                                         "answers": now}, indent=1) + "\n")
        pytest.skip(f"wrote {REFERENCE}")
    reference = json.loads(REFERENCE.read_text())
    assert reference["fingerprint"] == manifest["fingerprint"], (
        "tests/data/reference_answers.json was made with other weights: a new release of the weights writes it "
        "anew (SPECBENCH_UPDATE_REFERENCE=1)")
    for method, answers in reference["answers"].items():
        for qid, answer in answers.items():
            assert now[method][qid]["output_ids"] == answer["output_ids"], f"{method}, question {qid}: other tokens"
            assert now[method][qid]["accept_lengths"] == answer["accept_lengths"], (
                f"{method}, question {qid}: other accepted lengths")
