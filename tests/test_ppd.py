"""PPD (`method=ppd`): the early exit's guesses verified losslessly (greedy on three architectures,
sampled through the engine's chi-square test), its exit head format and `train-head method=ppd`."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import (
    EMPTY,
    PROMPTS,
    THREE_ARCHS,
    assert_matches_baseline,
    assert_one_line_error,
    chi_square_p,
    cli,
    exact_first_three,
    method_cfg,
    prompt_of,
    sample_end_to_end,
    tiny_vocab_model,
)
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import SpeculativeMethod
from specbench.heads.exit import ExitHead
from specbench.heads.train import collect_exit_states
from specbench.methods.ppd import PpdDrafter
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = THREE_ARCHS  # conftest's `targets` and `ppd_heads` (exit heads after block 1 of 2, trained once per session)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_baseline(targets, ppd_heads, arch):
    target = targets[arch]
    # budget=fixed: every step verifies the preset's k siblings (a measured budget could keep fewer)
    method = build_method(method_cfg("ppd", head=str(ppd_heads[arch]), budget="fixed"), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0  # some early guesses were right
    assert all(a <= 2 for r in results for a in r.accept_lengths)  # one guessed token at most, + the bonus
    assert max(n for r in results for n in r.stats["draft_lengths"]) == 3  # k = 3 siblings
    one = build_method(method_cfg("ppd", head=str(ppd_heads[arch]), candidates=1), target, EMPTY)
    assert_matches_baseline(one, target, lengths=(2, 30))


def test_the_exit_state_matches_a_narrowed_forward(targets):
    """The drafter's cached early-exit state is the same as the training features' (one forward of
    the first block over the whole sequence), and drafting leaves the target's cache as it was."""
    target = targets["llama"]
    head = ExitHead(target.model.config.hidden_size, 1, 2)
    drafter = PpdDrafter(target.model, head, target.model.get_output_embeddings(), 3)
    ids = prompt_of(target, PROMPTS[0])
    full = collect_exit_states(target.model, ids, torch.ones_like(ids, dtype=torch.bool), exit_layer=1)
    cache = target.new_cache()
    with torch.no_grad():
        target.model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
        before = [layer.keys.clone() for layer in cache.layers]
        state = drafter.skipper.state(ids[0, -1], ids.shape[1] - 1, cache)
        drafter.skipper.rollback(cache, ids.shape[1] - 1)
    assert torch.allclose(state, full[0, -1], atol=1e-4)
    assert all(torch.equal(a, layer.keys) for a, layer in zip(before, cache.layers))


def test_sampled_generation_follows_the_target():
    target = tiny_vocab_model(0, layers=2)
    head = ExitHead(16, 1, 2)
    with torch.no_grad():
        head.linear.weight.normal_(0, 0.5)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=PpdDrafter(target.model, head,
                                                                          target.model.lm_head, 2))
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1500)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3


def test_bad_heads_get_clear_errors(targets, ppd_heads, tmp_path):
    target = targets["llama"]
    medusa = tmp_path / "medusa"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(SpecbenchError, match="not a PPD exit head.*medusa"):
        build_method(method_cfg("ppd", head=str(medusa)), target, EMPTY)
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((ppd_heads["llama"] / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "exit_layer": 2}))
    (broken / "exit_head.safetensors").write_bytes((ppd_heads["llama"] / "exit_head.safetensors").read_bytes())
    with pytest.raises(SpecbenchError, match="exit layer must be in 1..1"):
        build_method(method_cfg("ppd", head=str(broken)), target, EMPTY)
    (broken / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    with pytest.raises(SpecbenchError, match="hidden_size=32, the target has 64: it was trained for another model"):
        build_method(method_cfg("ppd", head=str(broken)), target, EMPTY)
    with pytest.raises(SpecbenchError, match="candidates"):
        build_method(method_cfg("ppd", head=str(ppd_heads["llama"]), candidates=0), target, EMPTY)


def test_train_head_command_writes_a_loadable_head(targets, tiny_models, tmp_path):
    out = tmp_path / "ppd"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(["the quick brown fox jumps over the lazy dog"] * 6) for _ in range(20)))
    done = cli("train-head", "method=ppd", "model=local", f"model.path={tiny_models['llama']}", f"corpus={corpus}",
               f"out={out}", "tokens=2000", "steps=5", cwd=tmp_path)
    assert done.code == 0, done
    assert json.loads((out / "config.json").read_text())["exit_layer"] == 1
    method = build_method(method_cfg("ppd", head=str(out)), targets["llama"], EMPTY)
    assert_matches_baseline(method, targets["llama"], lengths=(12,))
    bad = cli("train-head", "method=eagle", "model=local", f"model.path={tiny_models['llama']}",
              "method.train.exit_layer=1", cwd=tmp_path)
    assert_one_line_error(bad, r"Could not override 'method\.train\.exit_layer'.*method\.train\.KEY")
