"""One result whatever the path: every built-in method on the zoo, greedy, at batch size 1 through
the plain decode loop and through the batched loop with one slot, gives the same tokens, the same
accepted length at every step and the same number of steps (budget=fixed: the presets, whose
choices do not follow measured timings)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from specbench.core.prompts import prompt_ids
from specbench.core.resources import CONFIG_DIR
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine.api import Request, RequestList
from specbench.models import load_model
from specbench.run import registry
from specbench.run.config import compose_method

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams()
QUESTIONS = [["Summarize the passage: the river town kept its market open all winter."],
             ["What is 12 times 7? Explain step by step."],
             ["Translate into Velari: the quick brown fox jumps over the lazy dog."]]
BUILTINS = registry.discover().names(source=registry.BUILTIN)


@pytest.fixture(scope="module")
def zoo():
    model_cfg = OmegaConf.load(CONFIG_DIR / "model" / "tiny.yaml")
    target = load_model(model_cfg.path, device=torch.device("cpu"), dtype=torch.float32)
    prompts = [torch.tensor([prompt_ids(model_cfg.template, target.tokenizer, q, [])]) for q in QUESTIONS]
    return target, model_cfg, prompts


def fixed(name: str):
    cfg = compose_method(name)
    if "budget" in cfg:
        with open_dict(cfg):
            cfg.budget = "fixed"
    return cfg


@pytest.mark.parametrize("name", BUILTINS)
def test_batch_size_one_is_the_plain_loop(zoo, name):
    target, model_cfg, prompts = zoo
    method = registry.build_method(fixed(name), target, model_cfg)
    if method.batch_problem is not None:
        pytest.skip(f"{name} has no batched path: {method.batch_problem}")
    stop = StopCriteria.build(target.eos_ids, 40)
    method.reset()
    plain = [method.decode(method.prefill(p, GREEDY), GREEDY, stop, CpuTimer()) for p in prompts]
    method.reset()
    requests = RequestList([Request(i, p, stop) for i, p in enumerate(prompts)])
    method.generate_batch(requests, 1, GREEDY, CpuTimer())
    batched = [requests.results[i] for i in range(len(prompts))]
    for i, (one, other) in enumerate(zip(plain, batched, strict=True)):
        assert one.tokens == other.tokens, (name, i)
        assert one.accept_lengths == other.accept_lengths, (name, i, one.accept_lengths, other.accept_lengths)
