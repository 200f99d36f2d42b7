"""Lossless on a real model: SmolLM2-135M-Instruct (model=smollm2) on official Spec-Bench questions,
greedy, every built-in method emits exactly the baseline's tokens.

Runs where this machine has the model (`python -m specbench kit fetch smollm2`) and the official
question file (`../shared/spec_bench/question.jsonl` or data/spec_bench/question.jsonl); methods
whose parts are not built yet (`kit build smollm2 --parts ...`) skip with the command that builds
them: a test never fetches or trains anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from specbench.core.prompts import prompt_ids
from specbench.core.questions import load_questions
from specbench.core.resources import CONFIG_DIR
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.kit import load_kit
from specbench.kit.build import PARTS, is_built
from specbench.kit.source import recorded_target
from specbench.models import load_model
from specbench.run import registry
from specbench.run.config import compose_method, in_run

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
QUESTION_FILES = [REPO.parent / "shared" / "spec_bench" / "question.jsonl",
                  REPO / "data" / "spec_bench" / "question.jsonl"]
KIT = load_kit("smollm2")
BUILTINS = registry.discover().names(source=registry.BUILTIN)
GREEDY = SamplingParams()
TOKENS = 32
#: the method settings that name kit parts
PART_KEYS = ("head", "draft", "drafts", "datastore")


def question_file() -> Path | None:
    return next((p for p in QUESTION_FILES if p.is_file()), None)


@pytest.fixture(scope="module")
def smollm2():
    if recorded_target(KIT) is None:
        pytest.skip("SmolLM2 is not on this machine: `python -m specbench kit fetch smollm2`")
    if question_file() is None:
        pytest.skip("the official question file is absent (../shared/spec_bench/question.jsonl or "
                    "`python -m specbench data fetch`)")
    questions = load_questions(question_file())
    picked = [q for q in questions if q.question_id in (81, 161)]  # one translation, one summarization question
    model_cfg = OmegaConf.load(CONFIG_DIR / "model" / "smollm2.yaml")
    target = load_model(model_cfg.path, device=torch.device("cpu"), dtype=torch.float32)
    prompts = [torch.tensor([prompt_ids(model_cfg.template, target.tokenizer, q.turns[:1], [])]) for q in picked]
    return target, model_cfg, prompts


def missing_parts(method_cfg, model_cfg) -> list[str]:
    """The kit parts a method needs that this machine has not built, groups and trained heads alike (a
    `draft: null` method takes the model config's draft: hf_assisted's, for one)."""
    names = []
    for key in PART_KEYS:
        values = method_cfg.get(key)
        if key == "draft" and key in method_cfg and values is None:
            values = model_cfg.get("draft")
        for value in (values if OmegaConf.is_list(values) else [values]):
            prefix, _, part = str(value).partition(":")
            if prefix == KIT.name and part:
                names.append(part)
    return sorted({part for part in names if not is_built(KIT, part)})


def decode(method, target, prompt):
    stop = StopCriteria.build(target.eos_ids, TOKENS)
    method.reset()
    return method.decode(method.prefill(prompt, GREEDY), GREEDY, stop, CpuTimer()).tokens


@pytest.mark.parametrize("name", [n for n in BUILTINS if n != "baseline"])
def test_every_method_is_lossless_on_smollm2(smollm2, name):
    target, model_cfg, prompts = smollm2
    cfg = in_run(OmegaConf.create({"model": OmegaConf.to_container(model_cfg)}), compose_method(name))
    if str(cfg.facts.verification).startswith("LOSSY"):
        pytest.skip(f"{name} is lossy by design")
    if missing := missing_parts(cfg, model_cfg):
        groups = sorted({PARTS.get(part, "heads") for part in missing})  # a trained head comes with `heads`
        pytest.skip(f"{name} needs smollm2's {', '.join(missing)}: `python -m specbench kit build smollm2 "
                    f"--parts {','.join(groups)}`")
    if "budget" in cfg:
        with open_dict(cfg):
            cfg.budget = "fixed"
    baseline = registry.build_method(compose_method("baseline"), target, model_cfg)
    method = registry.build_method(cfg, target, model_cfg)
    for prompt in prompts:
        want = decode(baseline, target, prompt)
        assert len(want) == TOKENS or want[-1] in target.eos_ids
        assert decode(method, target, prompt) == want, json.dumps({"method": name, "prompt": prompt.shape[1]})
