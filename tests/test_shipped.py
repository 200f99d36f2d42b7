"""specbench.zoo.shipped: the reference weights shipped with the code, restored instead of trained.

Small fake folders (a target, a head that copies one of its tensors, a pickle that must not ship) go
through `ship` into a weights folder and come back through `fill`, `_built` and `ensure_zoo`, as a run
finds them in an empty cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specbench.analysis.report import weights_note
from specbench.analysis.runs import Group, Run
from specbench.core.errors import SpecbenchError
from specbench.core.origin import read_origin, summary
from specbench.presentation.check import job_order
from specbench.zoo import release, shipped, store
from specbench.zoo.parts import _built

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

ZOO = "abc123def456"
HEADS = f"{ZOO}.heads-0a1b2c3d"


def fake_zoo(root: Path, name: str = ZOO) -> dict[str, torch.Tensor]:
    """A zoo-like folder: target weights (float32), a config, a pickle copy, COMPLETE; returns the target's tensors."""
    torch.manual_seed(0)
    target = {"lm_head.weight": torch.randn(64, 16), "model.embed_tokens.weight": torch.randn(64, 16),
              "model.norm.weight": torch.ones(16)}
    folder = root / name
    (folder / "target").mkdir(parents=True)
    save_file(target, str(folder / "target" / "model.safetensors"), metadata={"format": "pt"})
    (folder / "target" / "config.json").write_text('{"hidden_size": 16}\n')
    (folder / "target" / "pytorch_model.bin").write_bytes(b"pickle")
    (folder / store.COMPLETE).write_text(json.dumps({"zoo_hash": name, "finished": "then"}) + "\n")
    return target


def fake_heads(root: Path, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A heads folder whose medusa head holds a frozen copy of the target's vocabulary projection."""
    torch.manual_seed(1)
    head = {"0.linear.weight": torch.randn(16, 16), "0.proj.weight": target["lm_head.weight"].clone()}
    folder = root / HEADS
    (folder / "medusa").mkdir(parents=True)
    save_file(head, str(folder / "medusa" / "medusa_lm_head.safetensors"))
    (folder / "medusa" / "medusa_lm_head.pt").write_bytes(b"pickle")
    (folder / "heads.json").write_text('{"medusa": {}}\n')
    return head


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """A release of the fake zoo and heads (target in bfloat16, medusa in float32) in a weights folder that
    SPECBENCH_WEIGHTS_DIR names, the cache empty; returns (weights folder, target tensors, head tensors)."""
    for var in (store.BUILD_VAR, release.FETCH_VAR):
        monkeypatch.delenv(var, raising=False)
    target = fake_zoo(tmp_path / "built")
    head = fake_heads(tmp_path / "built", target)
    out = tmp_path / "weights"
    shipped.ship([tmp_path / "built" / ZOO, tmp_path / "built" / HEADS], out,
                 {"target": "bfloat16", "medusa": "float32"}, "test-1")
    monkeypatch.setenv(shipped.WEIGHTS_VAR, str(out))
    monkeypatch.setenv(store.ENV_VAR, str(tmp_path / "cache"))
    return out, target, head


def must_not_train(tmp: Path) -> None:
    raise AssertionError("trained although the weights are shipped")


def test_a_release_stores_each_tensor_once_in_its_storage_and_no_pickle(weights):
    out, target, head = weights
    manifest = shipped.read_manifest(out)
    assert not [name for name in manifest["files"] if name.endswith((".pt", ".bin"))]
    assert manifest["folders"][ZOO]["storage"] == {"target": "bfloat16"}
    assert manifest["folders"][HEADS]["storage"] == {"medusa": "float32"}
    stored = load_file(str(out / "zoo" / HEADS / "medusa" / "medusa_lm_head.safetensors"))
    assert set(stored) == {"0.linear.weight"}  # the frozen copy is the target's, stored there only
    assert load_file(str(out / "zoo" / ZOO / "target" / "model.safetensors"))["lm_head.weight"].dtype == torch.bfloat16
    for name, entry in manifest["files"].items():
        assert shipped.sha256_of(out / name) == entry["sha256"]
    assert manifest["fingerprint"] == shipped.release_fingerprint(manifest["files"])


def test_restored_as_used_float32_rounded_where_stored_in_bfloat16(weights, tmp_path):
    out, target, head = weights
    restored = tmp_path / "restored"
    restored.mkdir()
    assert shipped.fill(tmp_path / "cache" / HEADS, restored)
    tensors = load_file(str(restored / "medusa" / "medusa_lm_head.safetensors"))
    assert torch.equal(tensors["0.linear.weight"], head["0.linear.weight"])  # float32 storage: exact
    assert torch.equal(tensors["0.proj.weight"], target["lm_head.weight"].to(torch.bfloat16).float())
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert not (restored / "medusa" / "medusa_lm_head.pt").exists()
    origin = read_origin(restored)
    assert origin["source"] == "shipped" and origin["fingerprint"] == shipped.read_manifest(out)["fingerprint"]
    zoo = tmp_path / "zoo-restored"
    zoo.mkdir()
    assert shipped.fill(tmp_path / "cache" / ZOO, zoo)
    with safe_open(str(zoo / "target" / "model.safetensors"), framework="pt") as fh:
        assert fh.metadata() == {"format": "pt"}  # what transformers reads back, as saved
        assert list(fh.keys()) == sorted(target)
    assert torch.equal(load_file(str(zoo / "target" / "model.safetensors"))["lm_head.weight"],
                       tensors["0.proj.weight"])  # the head's frozen projection stays the target's
    assert (zoo / "target" / "config.json").read_text() == '{"hidden_size": 16}\n'


def test_two_restores_are_byte_identical(weights, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    for folder in (first, second):
        folder.mkdir()
        shipped.fill(tmp_path / "cache" / ZOO, folder)
    for path in first.rglob("*.safetensors"):
        assert path.read_bytes() == (second / path.relative_to(first)).read_bytes()


def test_a_file_that_differs_from_its_checksum_is_a_one_line_error_naming_it(weights, tmp_path):
    out, _, _ = weights
    stored = out / "zoo" / ZOO / "target" / "model.safetensors"
    data = bytearray(stored.read_bytes())
    data[-1] ^= 1
    stored.write_bytes(bytes(data))
    shipped._verified.cache_clear()
    restored = tmp_path / "restored"
    restored.mkdir()
    with pytest.raises(SpecbenchError) as caught:
        shipped.fill(tmp_path / "cache" / ZOO, restored)
    message = str(caught.value)
    assert "\n" not in message and str(stored) in message and "git checkout" in message
    assert not list(restored.iterdir())  # every checksum is checked before anything is written


def test_a_shipped_folder_is_restored_not_trained_or_fetched(weights, tmp_path, monkeypatch):
    monkeypatch.setattr(release, "fetch", lambda *a: pytest.fail("fetched although shipped"))
    final = _built(tmp_path / "cache" / HEADS, "heads.json", "the heads", must_not_train)
    assert read_origin(final)["source"] == "shipped"
    assert _built(final, "heads.json", "the heads", must_not_train) == final  # cached now


def test_the_zoo_itself_is_restored_by_ensure_zoo(tmp_path, monkeypatch, capsys):
    cfg = store.load_zoo_config()
    digest = store.zoo_hash(cfg)
    fake_zoo(tmp_path / "built", digest)
    shipped.ship([tmp_path / "built" / digest], tmp_path / "weights", {}, "test-2")
    monkeypatch.setenv(shipped.WEIGHTS_VAR, str(tmp_path / "weights"))
    monkeypatch.setenv(store.ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.delenv(store.BUILD_VAR, raising=False)
    monkeypatch.setattr("specbench.zoo.build.build", must_not_train)
    folder = store.ensure_zoo(cfg)
    assert store.is_complete(folder) and read_origin(folder)["source"] == "shipped"
    assert f"the zoo {digest} restored from the shipped weights (release test-2" in capsys.readouterr().err


def test_a_new_release_under_the_same_name_replaces_a_restored_folder_never_a_local_one(weights, tmp_path):
    out, target, _ = weights
    final = _built(tmp_path / "cache" / HEADS, "heads.json", "the heads", must_not_train)
    assert not shipped.stale(final)
    fake_heads(tmp_path / "built2", {"lm_head.weight": torch.zeros(64, 16)})  # retrained: other weights
    fake_zoo(tmp_path / "built2")
    shipped.ship([tmp_path / "built2" / ZOO, tmp_path / "built2" / HEADS], out, {}, "test-3")
    shipped._verified.cache_clear()
    assert shipped.stale(final)
    _built(final, "heads.json", "the heads", must_not_train)
    assert read_origin(final)["release"] == "test-3" and not shipped.stale(final)
    shipped.mark_local(final)  # trained here (zoo build --force): kept
    assert not shipped.stale(final)


def test_without_shipped_weights_a_part_is_trained_and_marked_local(tmp_path, monkeypatch):
    monkeypatch.setenv(shipped.WEIGHTS_VAR, str(tmp_path / "none"))
    monkeypatch.setenv(release.FETCH_VAR, "0")
    monkeypatch.delenv(store.BUILD_VAR, raising=False)

    def trains(tmp: Path) -> None:
        save_file({"w": torch.ones(2)}, str(tmp / "w.safetensors"))
        (tmp / "CARD").write_text("{}\n")

    final = _built(tmp_path / "cache" / "abc123def456.other-1234abcd", "CARD", "the part", trains)
    origin = read_origin(final)
    assert origin["source"] == "local" and origin["fingerprint"].startswith("local-")


def test_a_run_records_whose_weights_it_used(tmp_path):
    for name, source, fingerprint in (("zoo", "shipped", "f1"), ("heads", "local", "local-f2")):
        (tmp_path / name / "eagle").mkdir(parents=True)
        shipped.write_origin(tmp_path / name, {"source": source, "fingerprint": fingerprint})
    one = summary({"zoo:target": str(tmp_path / "zoo" / "eagle")})
    assert one["source"] == "shipped" and one["fingerprint"] == "f1"
    both = summary({"zoo:target": str(tmp_path / "zoo" / "eagle"), "zoo:eagle": str(tmp_path / "heads" / "eagle")})
    assert both["source"] == "mixed" and both["fingerprint"] == "f1+local-f2"
    assert summary({"gpt2": "gpt2"}) is None


def run_with(method: str, origin: dict | None) -> Run:
    return Run("synthetic", "tiny", method, 0.0, 1, [], meta={"weights_origin": origin},
               part_metas=[{"weights_origin": origin}])


def test_a_report_says_when_weights_are_local_or_mixed():
    shipped_ = {"source": "shipped", "fingerprint": "f1"}
    same = Group("synthetic", "tiny", 0.0, {"baseline": [run_with("baseline", shipped_)],
                                            "sps": [run_with("sps", shipped_)]})
    assert weights_note(same) is None
    local = {"source": "local", "fingerprint": "local-9"}
    alone = Group("synthetic", "tiny", 0.0, {"baseline": [run_with("baseline", local)]})
    assert "trained on this machine (local, fingerprint local-9)" in weights_note(alone)
    mixed = Group("synthetic", "tiny", 0.0, {"baseline": [run_with("baseline", shipped_)],
                                             "sps": [run_with("sps", local)]})
    assert "different weights" in weights_note(mixed) and "local local-9 (sps)" in weights_note(mixed)


def test_the_gate_alternates_which_commit_goes_first():
    assert job_order(1) == [("base", 1, 1), ("change", 1, 1)]
    order = job_order(4)
    assert [side for side, _, _ in order] == ["base", "change", "change", "base"] * 2
    firsts = [order[i][0] for i in range(0, len(order), 2)]
    assert firsts.count("base") == firsts.count("change")  # neither commit is always measured first
    assert sorted({(block, n) for _, block, n in order}) == [(b, 4) for b in range(1, 5)]


def test_a_run_records_only_the_weights_it_resolved_itself(tiny_models, tmp_path, monkeypatch):
    """Runs in one process (a multirun, library use) each record their own weights: a run of a plain
    folder after one of a `prefix:` part with an origin records none."""
    from helpers import cli, write_questions
    from specbench.models import RESOLVERS

    zoo = tmp_path / "zoo"
    shutil.copytree(tiny_models["llama"], zoo / "llama")
    shipped.write_origin(zoo, {"source": "local", "fingerprint": "local-f3"})
    monkeypatch.setitem(RESOLVERS, "originzoo", lambda name: zoo / name)
    write_questions(tmp_path / "q.jsonl", per_category=1)

    def run(path: str, out: str) -> dict:
        done = cli("run", "model=local", f"model.path={path}", "dataset=spec_bench", "dataset.path=q.jsonl",
                   f"output_dir={out}", "max_new_tokens=4", "warmup=0", "progress=false", "task=qa",
                   "contention_threshold=1000", cwd=tmp_path)
        assert done.code == 0, done
        (meta,) = (tmp_path / out).rglob("meta.json")
        return json.loads(meta.read_text())

    first = run("originzoo:llama", "a")
    assert first["weights_origin"]["fingerprint"] == "local-f3"
    assert run(str(tiny_models["llama"]), "b").get("weights_origin") is None
