"""A kit's parts end to end on a tiny random Llama standing in for a real target: the target's own
answers (corpus), REST's datastore, two distilled drafts and six heads (each its method's recipe), each cached once,
then every method that needs them built through `${parts:...}` for `model.parts=testkit`, lossless."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TINY_KIT as TINY
from helpers import assert_matches_baseline
from specbench import models
from specbench.core.origin import read_origin
from specbench.kit import build
from specbench.models import load_model
from specbench.run.config import compose_method
from specbench.run.registry import build_method
from specbench.zoo import shipped

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fast]  # fast: `make test-fast`

HEADS = ("medusa", "eagle", "eagle3", "hydra", "ppd", "specdec")


def head_dir(kit, name: str):
    """The cache folder of the kit's head of method `name` (built or not)."""
    return build.trained_dir(kit, *build.kit_recipe(kit, name), name)


def head_card(kit, name: str) -> dict:
    return json.loads((build.ensure_trained(kit, name) / "part.json").read_text())


@pytest.fixture(scope="module")
def kit(tiny_models, tmp_path_factory):
    """The test kit: tiny_models' Llama as its fetched target, its cache in a temporary folder."""
    cache = tmp_path_factory.mktemp("kit-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("SPECBENCH_CACHE_DIR", str(cache))
    patch.setenv(build.CORPORA_VAR, str(cache / "corpora"))  # no committed shards: every one made here
    target = tiny_models["llama"]
    patch.setattr(build, "ensure_target", lambda kit, source=None: target)
    patch.setattr(build, "recorded_target", lambda kit: {"source": "test", "folder": str(target), "sha256": "0"})
    cfg = OmegaConf.create(TINY)
    patch.setitem(models.RESOLVERS, "testkit",
                  lambda part: target if part == "target" else build.resolve_part(cfg, part))
    yield cfg
    patch.undo()


def test_a_kit_builds_every_part_once_from_the_targets_own_answers(kit):
    rows = build.read_corpus(build.ensure_group(kit, "corpus"))
    # a random target's user turns never end, so its rows are the math problems and foreign texts
    assert len(rows) >= 12 and all(r["turns"] and r["prompt_ids"] for r in rows)
    assert {r["shard"] for r in rows} == {0, 1} and {"math", "foreign"} <= {r["category"] for r in rows}
    assert all(0 < len(r["answer_ids"]) <= 12 for r in rows)
    for group in ("datastore", "drafts"):
        folder = build.ensure_group(kit, group)
        card = json.loads((folder / build.CARD).read_text())
        assert card["group"] == group and card["build_seconds"] >= 0 and card["settings"]["code"]
    assert set(HEADS) <= set(build.trained_methods())  # every trained built-in is its method's recipe
    heads = {name: head_card(kit, name) for name in HEADS}
    assert 0 < sum(r["heldout"] for r in rows) < len(rows)
    assert not list(build.kit_dir(kit).rglob("*.progress.pt"))  # saved progress is removed once a part is done
    assert {h["drafting_positions"] for h in heads.values()} == {
        sum(len(r["answer_ids"]) for r in rows if not r["heldout"])}
    assert heads["medusa"]["settings"]["num_heads"] == 2 and heads["medusa"]["steps"] == 3  # the kit's over the YAML's
    for name, depths in (("medusa", 2), ("hydra", 2), ("eagle", 1), ("eagle3", 1), ("ppd", 1)):  # held-out rows
        assert len(heads[name]["heldout_top1"]) == depths and all(0 <= v <= 1 for v in heads[name]["heldout_top1"])
    chain = heads["eagle"]["heldout_chain"]  # drafting on its own states: each depth at most the one before
    assert len(chain) == 5 and all(1 >= a >= b >= 0 for a, b in zip(chain, chain[1:]))
    drafts = json.loads((build.group_dir(kit, "drafts") / build.CARD).read_text())
    assert 0 <= drafts["draft"]["heldout_agreement"] <= 1
    assert drafts["heldout_rows"] == sum(r["heldout"] for r in rows) and drafts["train_rows"] == len(rows) - sum(
        r["heldout"] for r in rows)
    # built once: a second call reads the cache
    before = (head_dir(kit, "eagle") / "part.json").stat().st_mtime_ns
    build.ensure_trained(kit, "eagle")
    assert (head_dir(kit, "eagle") / "part.json").stat().st_mtime_ns == before
    # a change of a head's settings trains that head anew, not the groups it reads nor the other heads
    changed = OmegaConf.merge(kit, {"build": {"heads": {"eagle": {"steps": 4}}}})
    assert head_dir(changed, "eagle") != head_dir(kit, "eagle")
    assert build.group_dir(changed, "drafts") == build.group_dir(kit, "drafts")
    assert all(head_dir(changed, g) == head_dir(kit, g) for g in ("medusa", "specdec"))
    # a draft's change retrains SpecDec's drafter (fine-tuned from it), not the heads that never read it
    redrafted = OmegaConf.merge(kit, {"build": {"drafts": {"draft": {"lr": 2e-3}}}})
    assert head_dir(redrafted, "specdec") != head_dir(kit, "specdec")
    assert head_dir(redrafted, "eagle") == head_dir(kit, "eagle")
    # which states the shared pass keeps is part of every head's key
    restated = OmegaConf.merge(kit, {"build": {"states": {"exit_layer": 1}}})
    assert head_dir(restated, "medusa") != head_dir(kit, "medusa")


@pytest.mark.parametrize("name", ["eagle", "eagle3", "medusa", "hydra", "ppd", "specdec", "sps", "sps_plain",
                                  "specinfer", "rest"])
def test_every_part_serves_its_method_losslessly(kit, tiny_models, name):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    model_cfg = OmegaConf.create({"path": "testkit:target", "draft": "testkit:draft", "parts": "testkit"})
    method = build_method(compose_method(name), target, model_cfg)  # ${parts:...} -> testkit:...
    assert_matches_baseline(method, target, lengths=(6,))


def test_a_recipe_head_trains_the_epochs_a_kit_asks_for_over_every_drafting_position(kit):
    import math

    from specbench.core.errors import SpecbenchError

    rows = build.read_corpus(build.ensure_group(kit, "corpus"))
    positions = sum(len(r["answer_ids"]) for r in rows if not r["heldout"])
    by_epochs = OmegaConf.merge(kit, {"build": {"heads": {"medusa": {"epochs": 1.5, "batch_positions": 16}}}})
    _, settings = build.kit_recipe(by_epochs, "medusa")
    assert settings.epochs == 1.5
    folder = head_dir(by_epochs, "medusa")
    assert folder != head_dir(kit, "medusa")  # its own key
    card = head_card(by_epochs, "medusa")
    assert card["settings"]["epochs"] == 1.5 and card["steps"] == math.ceil(1.5 * positions / 16)
    twice = OmegaConf.merge(by_epochs, {"build": {"heads": {"medusa": {"epochs": 3}}}})
    assert head_dir(twice, "medusa") != folder
    with pytest.raises(SpecbenchError, match="build.heads.hydra: .*'epochs' must be a positive number"):
        build.kit_recipe(OmegaConf.merge(kit, {"build": {"heads": {"hydra": {"epochs": 0}}}}), "hydra")
    with pytest.raises(SpecbenchError, match="build.heads names rest, which train no head"):
        build.kit_recipe(OmegaConf.merge(kit, {"build": {"heads": {"rest": {"steps": 1}}}}), "hydra")


def test_an_unknown_part_is_named_with_the_known_ones(kit):
    from specbench.core.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match="testkit has no part 'eagle4'; its parts: target, corpus, datastore"):
        build.resolve_part(kit, "eagle4")


def test_shipped_parts_are_restored_for_their_target_and_never_trained(kit, tiny_models, tmp_path, monkeypatch):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from specbench.heads import recipe

    target = tiny_models["llama"]
    built = [build.ensure_group(kit, "drafts"), *(build.ensure_trained(kit, name) for name in HEADS)]
    draft_before = load_file(str(built[0] / "draft" / "model.safetensors"))
    target_tensors = load_file(str(target / "model.safetensors"))
    # the frozen embedding and head were not trained: equal to the target's
    assert torch.equal(draft_before["model.embed_tokens.weight"], target_tensors["model.embed_tokens.weight"])
    out = tmp_path / "weights"
    manifest = shipped.ship_kit("testkit", build.target_id(kit), built, target, out, {"draft": "float32"})
    key = build.shipped_key(built[0])
    assert key in manifest["folders"] and manifest["kits"]["testkit"]["fingerprint"]
    with safe_open(str(out / key / "draft" / "model.safetensors"), framework="pt") as fh:
        how = json.loads(fh.metadata()[shipped.META_KEY])
        assert "model.embed_tokens.weight" not in fh.keys()  # stored once: with the target, which is not shipped
    assert how["shared"]["model.embed_tokens.weight"] == "target:model.safetensors#model.embed_tokens.weight"
    # a machine with an empty cache restores both groups from them and trains nothing
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(shipped.WEIGHTS_VAR, str(out))
    for group in ("corpus", "drafts"):
        monkeypatch.setitem(build.BUILDERS, group, lambda *a: pytest.fail("built although shipped"))
    monkeypatch.setattr(recipe, "train_part", lambda *a: pytest.fail("trained although shipped"))
    restored = build.ensure_trained(kit, "eagle")
    assert restored != built[1] and read_origin(restored)["source"] == "shipped"
    draft = build.ensure_group(kit, "drafts")
    assert read_origin(draft)["fingerprint"] == manifest["kits"]["testkit"]["fingerprint"]
    draft_after = load_file(str(draft / "draft" / "model.safetensors"))
    assert draft_after.keys() == draft_before.keys()
    assert all(torch.equal(draft_after[k], draft_before[k]) for k in draft_before)  # float32: exact
    # a new release of the zoo keeps the kit's parts, and the zoo's fingerprint does not count them
    again = shipped.ship([], out, {}, "test-2")
    assert again["files"] == manifest["files"] and again["kits"] == manifest["kits"]
    assert again["fingerprint"] == shipped.release_fingerprint({}) == manifest["fingerprint"]


def test_ship_keeps_the_parts_another_machine_shipped_and_names_the_unbuilt(kit, tiny_models, tmp_path, monkeypatch,
                                                                           capsys):
    import argparse

    from specbench.kit import cli, source

    monkeypatch.setattr(source, "ensure_target", lambda kit, source=None: tiny_models["llama"])
    built = {"drafts": build.ensure_group(kit, "drafts"),
             **{name: build.ensure_trained(kit, name) for name in HEADS if name != "hydra"}}
    out = tmp_path / "weights"
    opts = argparse.Namespace(storage=[], measured=None, out=str(out))
    # the first machine: every part built, Hydra's head not (new settings: it would train on first use)
    kit = OmegaConf.merge(kit, {"build": {"heads": {"hydra": {"steps": 4}}}})
    assert build.group_dir(kit, "drafts") == built["drafts"]
    assert all(head_dir(kit, name) == folder for name, folder in built.items() if name != "drafts")
    hydra = head_dir(kit, "hydra")
    assert not (hydra / "part.json").is_file()
    assert cli.ship_main(kit, opts) == 0
    said = capsys.readouterr().out
    assert "not built here nor shipped before, so not shipped: hydra" in said
    first = shipped.read_manifest(out)
    assert {build.shipped_key(f) for f in built.values()} <= set(first["folders"])
    # the next machine, its cache empty, ships again: every part restored from the shipped weights, none trained
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(shipped.WEIGHTS_VAR, str(out))
    for group in build.BUILDERS:
        monkeypatch.setitem(build.BUILDERS, group, lambda *a: pytest.fail("built although shipped"))
    from specbench.heads import recipe

    monkeypatch.setattr(recipe, "train_part", lambda *a: pytest.fail("trained although shipped"))
    assert cli.ship_main(kit, opts) == 0
    again = shipped.read_manifest(out)
    # the same bytes: shipping twice makes no new files for git (the header's metadata in a fixed order)
    assert again["folders"].keys() == first["folders"].keys() and again["files"] == first["files"]
    assert (build.group_dir(kit, "drafts") / build.CARD).is_file()  # restored into the new cache
    assert all((head_dir(kit, name) / "part.json").is_file() for name in built if name != "drafts")


def test_a_new_machine_makes_the_top_k_and_the_states_in_one_pass(kit, monkeypatch):
    """Shards from elsewhere have neither the target's top-k nor its states here: one teacher-forced
    forward per shard writes both (what a new machine's drafts and heads read), the same top-k as a
    pass of its own gives."""
    from specbench.kit import corpus as kc
    from specbench.kit import features as kf

    build.ensure_group(kit, "corpus")
    restated = OmegaConf.merge(kit, {"build": {"states": {"fused": [0, 1, 2], "exit_layer": 2}}})
    settings, place = build.corpus_place(restated)
    assert not list(place.cache.glob(f"*.states-{build.shared_spec(restated).key()}.*"))  # not made here yet
    model = build._load_target(restated, build.build_dtype(settings.dtype)).model
    alone = {shard: kc.teacher_topk(model, kc.read_rows(place.rows_file(shard)), settings.topk) for shard in (0, 1)}
    for shard in (0, 1):
        place.topk_file(shard).unlink()
    passes = []
    real = kf.compute_states
    monkeypatch.setattr(kf, "compute_states", lambda *a, **k: passes.append(k.get("topk")) or real(*a, **k))
    monkeypatch.setattr(kc, "teacher_topk", lambda *a, **k: pytest.fail("a second pass for the top-k"))
    rows, held = build.split_rows(restated, build.read_corpus(build.ensure_group(restated, "corpus")))
    soft = build.soft_targets(restated, rows + held)
    assert passes == [settings.topk, settings.topk]  # one forward per shard: top-k and states together
    build.corpus_states(restated, rows, build._load_target(restated, torch.float32)).ensure()
    assert passes == [settings.topk, settings.topk]  # the states were written by those passes
    assert [len(ids) for ids, _ in soft] == [len(r["answer_ids"]) for r in rows + held]
    for shard in (0, 1):
        ids, logp = kc.read_topk(place, shard)
        want_ids = torch.cat([g.topk_ids for g in alone[shard]])
        want_logp = torch.cat([g.topk_logp for g in alone[shard]]).float()
        assert torch.allclose(logp.float(), want_logp, atol=2e-2)
        clear = want_logp[:, 0] - want_logp[:, 1] > 0.05  # the top-1 where no near-tie can flip it
        assert torch.equal(ids[clear, 0], want_ids[clear, 0])
