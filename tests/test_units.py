"""Unit tests of the shared pieces: sampling, stopping, timing, prompts, answer files."""

import json

import pytest
import torch

from specbench.core.answers import AnswerWriter, read_answers
from specbench.core.errors import SpecbenchError
from specbench.core.hardware import cpu_info
from specbench.core.prompts import VICUNA_SYSTEM, plain_prompt, vicuna_prompt
from specbench.core.sampling import SamplingParams, probs_from_logits
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer, CudaTimer, timer_for
from specbench.presentation import leaderboard

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0]])
    probs = probs_from_logits(logits, SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_and_top_p_filter_the_tail():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    nucleus = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    nucleus = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert nucleus[0, 2] > 0 and nucleus[0, 3] == 0
    hot = probs_from_logits(logits, SamplingParams(temperature=0.5))
    assert hot[0, 0] > 0.5 and torch.isclose(hot.sum(), torch.tensor(1.0))


def test_stop_at_eos_max_tokens_and_stop_string():
    stop = StopCriteria.build({9}, max_new_tokens=5)
    assert stop.cut([1, 2, 9, 4]) == 3
    assert stop.cut([1, 2, 3]) is None
    assert stop.cut([1, 2, 3, 4, 5, 6]) == 5
    assert stop.cut([9, 1, 2], start=1) is None  # only tokens from `start` are checked
    words = {1: "a", 2: "b", 3: "US", 4: "ER:"}
    stop = StopCriteria.build(set(), 50, ["USER:"], decode=lambda ids: "".join(words[i] for i in ids))
    assert stop.cut([1, 2, 3, 4, 1]) == 4
    with pytest.raises(ValueError):
        StopCriteria.build(set(), 0)


def test_cpu_timer_measures_marks_and_sections():
    timer = CpuTimer()
    timer.start()
    with timer.section("draft"):
        sum(range(10000))
    timer.mark("prefill")
    with timer.section("draft"):
        sum(range(10000))
    timing = timer.stop()
    assert 0 < timing.sections["draft"] <= timing.total
    assert 0 < timing.marks["prefill"] <= timing.total
    assert isinstance(timer_for(torch.device("cpu")), CpuTimer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_uses_events():
    device = torch.device("cuda")
    timer = timer_for(device)
    assert isinstance(timer, CudaTimer)
    a = torch.randn(2048, 2048, device=device)
    timer.start()
    with timer.section("matmul"):
        for _ in range(10):
            a = a @ a / 2048
    timer.mark("half")
    timing = timer.stop()
    assert 0 < timing.sections["matmul"] <= timing.total
    assert 0 < timing.marks["half"] <= timing.total


def test_vicuna_template_matches_upstream():
    first = vicuna_prompt(["Hi?"], [])
    assert first == VICUNA_SYSTEM + " USER: Hi? ASSISTANT:"
    second = vicuna_prompt(["Hi?", "More?"], ["Hello."])
    assert second == VICUNA_SYSTEM + " USER: Hi? ASSISTANT: Hello.</s>USER: More? ASSISTANT:"
    assert plain_prompt(["a", "b"], ["x"]) == "a\n\nx\n\nb\n\n"


def test_answer_file_drops_torn_line_and_rejects_corruption(tmp_path):
    path = tmp_path / "answers.jsonl"
    with AnswerWriter(path) as writer:
        writer.write({"question_id": 1})
        writer.write({"question_id": 2})
    with path.open("a") as fh:
        fh.write('{"question_id": 3, "choi')  # killed mid-write
    assert [r["question_id"] for r in read_answers(path)] == [1, 2]
    assert path.read_text().endswith('"choi')  # reading alone changes nothing
    assert [r["question_id"] for r in read_answers(path, repair=True)] == [1, 2]
    assert path.read_text().endswith("}\n")
    with AnswerWriter(path) as writer:
        writer.write({"question_id": 3})
    assert [json.loads(x)["question_id"] for x in path.read_text().splitlines()] == [1, 2, 3]
    path.write_text('{"question_id": 1}\n{oops}\n{"question_id": 2}\n')
    with pytest.raises(SpecbenchError, match="answers.jsonl:2: corrupt"):
        read_answers(path)


def test_cpu_info_names_the_speed_relevant_extensions():
    """Two CPUs of one model name may differ in the extensions that set torch's speed (bf16 units above all):
    the environment of every run records which of them the CPU has."""
    x86 = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n"
           "physical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n"
           "physical id\t: 0\ncore id\t\t: 1\n")
    info = cpu_info(x86)
    assert info["model"] == "AMD EPYC" and info["physical_cores"] == 2
    assert info["features"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]  # the first CPU's, in a fixed order
    assert cpu_info("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2\n")["features"] == ["avx2"]
    assert cpu_info("processor\t: 0\nFeatures\t: fp asimd sve bf16\n")["features"] == ["asimd", "sve", "bf16"]
    assert cpu_info("processor\t: 0\n")["features"] is None  # no flags line: unknown, not "none"
    env = {"device_name": "AMD EPYC", "device": "cpu", "cpu": {"features": ["avx2", "avx512f"]}}
    line = _environment_line(env)
    assert line.startswith("Environment: device_name=AMD EPYC, cpu_features=avx2+avx512f, device=cpu"), line
    assert "cpu_features=none" in _environment_line({**env, "cpu": {"features": []}})
    assert "cpu_features" not in _environment_line({**env, "cpu": {}})


def _environment_line(env: dict) -> str:
    class Group:
        def environment(self) -> dict:
            return env
    return leaderboard.environment_line(Group())
