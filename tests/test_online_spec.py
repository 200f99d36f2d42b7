"""Online Speculative Decoding (`method=online_spec`): greedy output equal to the baseline's while
the draft is updated between turns, the draft learning the target's outputs, sampling that follows
the target, the stream starting over after the warm-up, and the report's stream table."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config

from helpers import (
    CPU,
    EMPTY,
    PROMPTS,
    assert_matches_baseline,
    chi_square_p,
    cli,
    exact_first_three,
    gpt2_config,
    method_cfg,
    prompt_of,
    run,
    sample_end_to_end,
    save_tiny,
    tiny_vocab_model,
    write_questions,
)
from specbench.core.answers import EXTRA_KEY, read_answers
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.engine import SpeculativeMethod
from specbench.methods.online_spec import OnlineDrafter, OnlineSpecSettings
from specbench.models import load_model
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

#: an update after every turn, big enough steps to move a random draft
FAST = {"update_every": 1, "steps_per_update": 2, "batch_turns": 2, "lr": 1e-2}


@pytest.fixture(scope="module")
def pairs(tiny_models, tmp_path_factory) -> dict[str, tuple]:
    """(target folder, draft folder) per architecture; the draft always disagrees with the target."""
    root = tmp_path_factory.mktemp("online")
    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    gpt2 = save_tiny(root / "gpt2", gpt2_config(tok), tok)
    small = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=512,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    gpt2_small = save_tiny(root / "gpt2-small", small, tok)
    return {"llama": (tiny_models["llama"], tiny_models["qwen2"]),
            "qwen2": (tiny_models["qwen2"], tiny_models["llama"]), "gpt2": (gpt2, gpt2_small)}


def _state(method) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in method.drafter.draft.model.state_dict().items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_equals_baseline_while_the_draft_learns(pairs, arch):
    target_path, draft_path = pairs[arch]
    target = load_model(str(target_path), device=CPU, dtype=torch.float32)
    method = build_method(method_cfg("online_spec", draft=str(draft_path), **FAST), target, EMPTY)
    method.start_stream()
    initial = _state(method)
    results = assert_matches_baseline(method, target)
    # LENGTHS = (1, 6, 40) per prompt: a 1-token turn never drafts, so it is not in the stream and
    # runs no update; every later drafting turn updates first (the buffer holds the turns before).
    updates = [r.stats["online_updates"] for r in results]
    assert updates == [0, 0, 1, 0, 1, 1, 0, 1, 1]
    assert [r.stats.get("online_turn") for r in results] == [None, 1, 2, None, 3, 4, None, 5, 6]
    assert all((r.stats["online_update_seconds"] > 0) == (u == 1) for r, u in zip(results, updates))
    assert any(not torch.equal(initial[k], v) for k, v in _state(method).items())  # the draft did change
    method.start_stream()  # a new stream: the initial draft again, an empty buffer
    assert all(torch.equal(initial[k], v) for k, v in _state(method).items())
    assert method.drafter.buffer == [] and method.drafter.turns == 0


def test_the_draft_learns_the_targets_outputs(pairs):
    """The same question again and again: the online draft accepts more each time, the static
    draft (sps, the same model) the same every time."""
    target_path, draft_path = pairs["llama"]
    target = load_model(str(target_path), device=CPU, dtype=torch.float32)
    settings = {"draft": str(draft_path), "schedule": "constant", "num_speculative_tokens": 4, "budget": "fixed"}
    online = build_method(method_cfg("online_spec", **settings, update_every=1, steps_per_update=6, batch_turns=1,
                                     lr=3e-3), target, EMPTY)
    static = build_method(method_cfg("sps", **settings), target, EMPTY)
    input_ids = prompt_of(target, PROMPTS[0])
    stop = StopCriteria.build(target.eos_ids, 40)
    online.start_stream()
    learned = [run(online, input_ids, stop).stats["accepted_tokens"] for _ in range(5)]
    fixed = [run(static, input_ids, stop).stats["accepted_tokens"] for _ in range(5)]
    assert len(set(fixed)) == 1
    assert learned[0] == fixed[0]  # no update before the first turn
    assert learned[-1] > learned[0] + 5, learned


def test_sampled_generation_follows_the_target():
    target, draft = tiny_vocab_model(0), tiny_vocab_model(1)
    settings = OnlineSpecSettings(draft=None, num_speculative_tokens=3, schedule="constant", update_every=1,
                                  buffer_size=8, steps_per_update=1, batch_turns=1, lr=1e-2, top_k=5,
                                  max_tokens_per_turn=16, stream="interleaved")
    drafter = OnlineDrafter(draft, settings, vocab_size=5)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    drafter.start_stream()
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1200)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3
    assert drafter.total_updates >= 1000  # the draft changed between (almost) all draws


def test_bad_settings_are_refused(pairs):
    target = load_model(str(pairs["llama"][0]), device=CPU, dtype=torch.float32)
    for key, value in (("update_every", 0), ("lr", 2.0), ("top_k", 0), ("buffer_size", 0), ("stream", "random")):
        with pytest.raises(SpecbenchError, match=key):
            build_method(method_cfg("online_spec", draft=str(pairs["llama"][1]), **{key: value}), target, EMPTY)


def test_a_run_starts_the_stream_after_the_warm_up_and_report_shows_it(pairs, tmp_path):
    target_path, draft_path = pairs["llama"]
    questions = write_questions(tmp_path / "q.jsonl", per_category=3)  # 6: a fifth each
    out = tmp_path / "results"
    common = ["model=local", f"model.path={target_path}", f"model.draft={draft_path}", "dataset=spec_bench",
              f"dataset.path={questions}", f"output_dir={out}", "max_new_tokens=12", "warmup=2", "progress=false",
              "task=[qa,math_reasoning]"]
    for args in (["method=baseline"], ["method=sps"], ["method=online_spec", "method.update_every=1"]):
        done = cli("run", *args, *common, cwd=tmp_path)
        assert done.code == 0, done
    records = read_answers(out / "spec_bench" / "local" / "online_spec" / "temp-0" / "run-1" / "answers.jsonl")
    assert len(records) == 6
    assert [r[EXTRA_KEY]["subtask"] for r in records] == ["qa", "math_reasoning"] * 3  # round-robin
    turns = [s["online_turn"] for r in records for s in r[EXTRA_KEY]["stats"]]
    assert turns == [1, 2, 3, 4, 5, 6]  # the warm-up's two turns are not in the stream
    assert sum(s["online_updates"] for r in records for s in r[EXTRA_KEY]["stats"]) == 5
    report = cli("report", str(out), "--out", str(tmp_path / "board"), cwd=tmp_path)
    assert report.code == 0, report
    assert "Acceptance across the question stream" in report.out + report.err
    md = next((tmp_path / "board").glob("*.md")).read_text()
    stream = md.split("## Acceptance across the question stream")[1]
    line = next(x for x in stream.splitlines() if x.startswith("| online_spec"))
    assert line.split("|")[-2].strip().startswith("5 (")  # the updates cell: count (seconds)
    twin = next(x for x in stream.splitlines() if x.startswith("| sps, same questions")).split("|")[2:7]
    gain = next(x for x in stream.splitlines() if x.startswith("| online_spec / sps")).split("|")[2:7]
    parts = line.split("|")[2:7]
    for ours, theirs, ratio in zip(parts, twin, gain):
        assert float(ratio) == pytest.approx(float(ours) / float(theirs), abs=0.01)
    meta = out / "spec_bench" / "local" / "online_spec" / "temp-0" / "run-1" / "meta.json"
    assert json.loads(meta.read_text())["facts"]["training"] == "online"
