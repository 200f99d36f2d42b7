"""A method that trains its own head is one module and one YAML (specbench.heads.recipe): Hydra's
recipe, the cache key of a trained part, and a user's trained-head method in a methods/ folder that
`train-head` trains and a run loads, with no other file touched."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import EMPTY, assert_matches_baseline, assert_one_line_error, cli, greedy_rows, method_cfg
from specbench.core.errors import SpecbenchError
from specbench.heads.recipe import PART_CARD, HeadData, part_key, train_part, training_settings
from specbench.methods.hydra import Hydra, HydraTraining
from specbench.run.registry import build_method, discover

pytestmark = pytest.mark.usefixtures("one_thread")

#: the user's method: its training (a successor table read off the frozen target), its drafter, its settings
SUCCESSOR_PY = '''
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod
from specbench.heads.recipe import HeadData, TrainingBase


@dataclass
class Settings:
    head: str | None
    max_draft: int


@dataclass
class Training(TrainingBase):
    min_count: int = 1  # successors seen fewer times are not drafted


class TableDrafter(Drafter):
    def __init__(self, table: torch.Tensor, max_draft: int) -> None:
        self.table, self.max_draft = table.tolist(), max_draft

    def propose(self, ctx: DraftContext) -> DraftTree:
        chain, token = [], ctx.tokens[-1]
        while len(chain) < min(self.max_draft, ctx.max_depth) and self.table[token] >= 0:
            token = self.table[token]
            chain.append(token)
        return DraftTree.chain(torch.tensor(chain, dtype=torch.long, device=ctx.device))


class Successor(SpeculativeMethod):
    Settings = Settings
    Training = Training

    @classmethod
    def train_head(cls, data: HeadData, settings: Training, out: Path) -> dict:
        feats = data.features(settings.tokens)
        lm_head = data.target.get_output_embeddings()
        with torch.no_grad():
            nxt = lm_head(feats.features[feats.valid]).argmax(-1)
        cur = feats.input_ids[feats.valid]
        vocab = int(lm_head.weight.shape[0])
        counts = torch.zeros(vocab, vocab).index_put_((cur, nxt), torch.ones(len(cur)), accumulate=True)
        best, table = counts.max(-1)
        table[best < settings.min_count] = -1
        save_file({"table": table.contiguous()}, str(out / "table.safetensors"))
        return {"known": int((table >= 0).sum())}

    def build_drafter(self) -> Drafter:
        table = load_file(str(Path(self.settings.head) / "table.safetensors"))["table"]
        return TableDrafter(table, self.settings.max_draft)
'''

SUCCESSOR_YAML = """
name: successor
impl: successor.Successor
head: ${parts:successor}
max_draft: 4
train:
  tokens: 4000
  steps: 1
  min_count: 1
facts:
  drafting: trained successor table
  verification: chain (lossless)
  training: true
"""


@pytest.fixture()
def user_methods(tmp_path, monkeypatch):
    folder = tmp_path / "methods"
    folder.mkdir()
    (folder / "successor.py").write_text(textwrap.dedent(SUCCESSOR_PY))
    (folder / "successor.yaml").write_text(SUCCESSOR_YAML)
    monkeypatch.setenv("SPECBENCH_METHODS_DIR", str(folder))
    return folder


def head_data(target) -> HeadData:
    ids, valid = greedy_rows(target)
    return HeadData(target=target.model, tokenizer=target.tokenizer, input_ids=ids, valid=valid, base="test",
                    label="test")


def test_hydra_trains_through_its_recipe_and_decodes_losslessly(targets, tmp_path):
    target = targets["llama"]
    values = {**OmegaConf.to_container(method_cfg("hydra").train), "num_heads": 2, "steps": 60,
              "batch_positions": 128, "lr": 1e-2, "seed": 0}
    settings = training_settings(Hydra, values, "hydra")
    card = train_part(Hydra, settings, head_data(target), tmp_path / "hydra", "hydra")
    assert json.loads((tmp_path / "hydra" / PART_CARD).read_text()) == card
    assert card["settings"]["num_heads"] == 2 and card["top1"][0] > 0.5
    method = build_method(method_cfg("hydra", head=str(tmp_path / "hydra")), target, EMPTY)
    assert method.heads.num_heads == 2
    assert_matches_baseline(method, target, lengths=(2, 30))


def test_the_registry_knows_which_methods_train_a_head():
    registry = discover()
    # every trained built-in, and nothing that trains none (EAGLE-2 drafts on EAGLE's head, which EAGLE trains)
    assert {"medusa", "eagle", "eagle3", "hydra", "ppd", "specdec"} <= set(registry.trained())
    assert not {"pld", "eagle2", "specdec_lossy", "sps"} & set(registry.trained())
    cls, settings = registry.recipe("hydra", {"steps": 7})
    assert cls is Hydra and isinstance(settings, HydraTraining) and settings.steps == 7
    assert settings.num_heads == method_cfg("hydra").train.num_heads  # the YAML's values, not the dataclass's
    with pytest.raises(SpecbenchError, match="method 'pld' trains no head of its own.*methods that do: .*hydra"):
        registry.recipe("pld")
    with pytest.raises(SpecbenchError, match=r"hydra.train' has no setting 'colour'"):
        registry.recipe("hydra", {"colour": "red"})
    with pytest.raises(SpecbenchError, match="has a `train:` section but Successor trains no head"):
        training_settings(type("Successor", (), {}), {}, "x")


def test_the_part_key_follows_settings_target_and_recipe_code():
    settings = training_settings(Hydra, OmegaConf.to_container(method_cfg("hydra").train), "hydra")
    key = part_key(Hydra, settings, "zoo built at 1")
    assert key == part_key(Hydra, replace(settings), "zoo built at 1")
    assert key != part_key(Hydra, replace(settings, steps=settings.steps + 1), "zoo built at 1")
    assert key != part_key(Hydra, settings, "zoo built at 2")  # a retrained target gets a new head

    class Changed(Hydra):
        @classmethod
        def train_head(cls, data, settings, out):  # another recipe
            return {}

    assert key != part_key(Changed, settings, "zoo built at 1")


def test_a_user_method_with_a_trained_head_is_one_module_and_one_yaml(user_methods, tiny_models, targets, tmp_path):
    assert "successor" in discover().trained()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(["the quick brown fox jumps over the lazy dog"] * 6) for _ in range(20)))
    out = tmp_path / "head"
    done = cli("train-head", "method=successor", "model=local", f"model.path={tiny_models['llama']}",
               f"corpus={corpus}", f"out={out}", "tokens=2000", "method.train.min_count=2", cwd=tmp_path)
    assert done.code == 0, done
    card = json.loads((out / PART_CARD).read_text())
    assert card["settings"]["tokens"] == 2000 and card["settings"]["min_count"] == 2 and card["known"] > 0
    cfg = OmegaConf.merge(OmegaConf.load(user_methods / "successor.yaml"), {"head": str(out)})
    method = build_method(cfg, targets["llama"], EMPTY)
    results = assert_matches_baseline(method, targets["llama"], lengths=(6, 40))
    assert sum(r.stats["accepted_tokens"] for r in results) > 0  # the table drafts what the target says
    bad = cli("train-head", "method=successor", "model=local", f"model.path={tiny_models['llama']}",
              "method.train.min_count=0", cwd=tmp_path)
    assert_one_line_error(bad, r"successor.train': setting 'min_count' must be >= 1, got 0")


def test_a_kit_or_zoo_names_trained_heads_among_its_parts(user_methods):
    from specbench.kit import load_kit
    from specbench.kit.build import resolve_part

    with pytest.raises(SpecbenchError, match=r"smollm2 has no part 'nothing'; its parts: target, .*hydra, .*successor"):
        resolve_part(load_kit("smollm2"), "nothing")


def test_head_data_collects_features_once_per_size(targets):
    data = head_data(targets["llama"])
    calls = []
    first = data.features(10**9)
    hook = data.target.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert data.features(10**9) is first and not calls  # cached
    finally:
        hook.remove()
    assert data.rows(1) == 1 and data.rows(10**9) == data.input_ids.shape[0]
    assert torch.equal(first.input_ids, data.input_ids)
