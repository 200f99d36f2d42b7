"""The autoregressive baseline: greedy output equals transformers' generate."""

import pytest
import torch
from omegaconf import OmegaConf

from specbench.core.prompts import prompt_ids
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.models import load_model
from specbench.run.registry import build_method

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

PROMPTS = [["the quick brown fox"], ["summarize the passage", "now translate it"], ["tom has 3 boxes"]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_baseline_equals_generate(tiny_models, arch):
    target = load_model(str(tiny_models[arch]), device=torch.device("cpu"), dtype=torch.float32)
    method = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                          target, OmegaConf.create({}))
    greedy = SamplingParams()
    for turns in PROMPTS:
        ids = prompt_ids("chat_template", target.tokenizer, turns, ["an answer"] * (len(turns) - 1))
        input_ids = torch.tensor([ids])
        for max_new in (1, 7, 40):
            stop = StopCriteria.build(target.eos_ids, max_new)
            result = method.decode(method.prefill(input_ids, greedy), greedy, stop, CpuTimer())
            expected = target.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new,
                eos_token_id=sorted(target.eos_ids), pad_token_id=target.tokenizer.pad_token_id,
            )[0, len(ids):].tolist()
            assert result.tokens == expected
            assert result.accept_lengths == [1] * (len(result.tokens) - 1)


def test_sampling_is_reproducible_with_the_seed(tiny_models):
    target = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    method = build_method(OmegaConf.create({"name": "baseline", "impl": "specbench.methods.baseline.Baseline"}),
                          target, OmegaConf.create({}))
    params = SamplingParams(temperature=1.0, top_p=0.9)
    input_ids = torch.tensor([prompt_ids("plain", target.tokenizer, ["the quick brown fox"], [])])
    stop = StopCriteria.build(target.eos_ids, 30)

    def draw(seed):
        torch.manual_seed(seed)
        return method.decode(method.prefill(input_ids, params), params, stop, CpuTimer()).tokens

    assert draw(0) == draw(0)
    assert draw(0) != draw(1)
