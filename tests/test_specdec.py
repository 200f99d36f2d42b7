"""SpecDec (`method=specdec`): the non-autoregressive drafter's block verified losslessly (greedy
on three architectures, sampled through the engine's chi-square test), its training layout, its
folder format, the labelled lossy option (`method=specdec_lossy`) and `train-head method=specdec`."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import (
    EMPTY,
    PROMPTS,
    THREE_ARCHS,
    VOCAB,
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
from specbench.core.stopping import StopCriteria
from specbench.engine import DraftTree, SpeculativeMethod
from specbench.heads.specdec import MaskQueries, training_layout
from specbench.methods.specdec import SpecDecDrafter, verify_top_beta
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = THREE_ARCHS  # conftest's `targets` and `specdec_drafters` (block 3, trained once per session)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_baseline(targets, specdec_drafters, arch):
    target = targets[arch]
    # budget=fixed: the preset's whole block is verified, which the mask-slot assertion below needs
    method = build_method(method_cfg("specdec", head=str(specdec_drafters[arch]), budget="fixed"), target, EMPTY)
    results = assert_matches_baseline(method, target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0  # the drafted blocks were used
    assert max(n for r in results for n in r.stats["draft_lengths"]) == 3  # one block of k = 3 per step
    assert max(a for r in results for a in r.accept_lengths) >= 3  # a mask slot's token was accepted
    shorter = build_method(method_cfg("specdec", head=str(specdec_drafters[arch]), block=2), target, EMPTY)
    assert_matches_baseline(shorter, target, lengths=(2, 30))


def test_the_training_layout_is_what_drafting_sees(targets):
    """A mask slot's logits in the training forward (many cuts, one 4D mask, later real tokens
    present but hidden) equal its logits when drafting (the context up to the cut, then the slots)."""
    target = targets["llama"]
    model = target.model
    torch.manual_seed(0)
    queries = MaskQueries(3, model.config.hidden_size)
    with torch.no_grad():
        queries.embeddings.normal_(0, 1)
    ids = prompt_of(target, PROMPTS[0])[0]
    n = int(ids.shape[0])
    cuts = torch.tensor([3, n // 2, n - 3])
    allow, positions = training_layout(n, cuts, 3)
    embed = model.get_input_embeddings()
    with torch.no_grad():
        slots = queries.embeddings.expand(len(cuts), -1, -1).reshape(1, -1, model.config.hidden_size)
        x = torch.cat([embed(ids[None]), slots], dim=1)
        mask = torch.zeros(allow.shape).masked_fill(~allow, torch.finfo(torch.float32).min)[None, None]
        train = model(inputs_embeds=x, attention_mask=mask, position_ids=positions[None]).logits[0]
        for j, c in enumerate(cuts.tolist()):
            y = torch.cat([embed(ids[None, : c + 1]), queries.embeddings[None]], dim=1)
            draft = model(inputs_embeds=y).logits[0, -2:]
            rows = n + 2 * j + torch.arange(2)
            assert torch.allclose(train[rows], draft, atol=1e-4)
            assert torch.allclose(train[c], model(input_ids=ids[None, : c + 1]).logits[0, -1], atol=1e-4)


def test_sampled_generation_follows_the_target():
    """Each slot's token is drawn independently from its own distribution q_i; verifying it against
    that q_i keeps the output distribution the target's."""
    target = tiny_vocab_model(0, layers=2)
    draft = tiny_vocab_model(1, layers=2)
    queries = MaskQueries(3, 16)
    with torch.no_grad():
        queries.embeddings.normal_(0, 1)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=SpecDecDrafter(draft, queries, 3, VOCAB))
    params = SamplingParams(temperature=1.0)
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=1500)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3


def test_top_beta_verification_is_the_papers_rule():
    logits = torch.tensor([[5.0, 4.5, 4.2, 0.0],   # draft 1 (token 1): rank 1, 0.5 below the best -> accepted
                           [0.0, 3.0, 2.5, 2.8],   # draft 2 (token 2): rank 2, 0.5 below -> accepted
                           [9.0, 0.0, 7.5, 0.0],   # draft 3 (token 2): rank 1 but 1.5 below -> rejected
                           [0.0, 0.0, 0.0, 1.0]])
    tree = DraftTree.chain(torch.tensor([1, 2, 2]))
    verdict = verify_top_beta(tree, logits, beta=3, tau=1.0)
    assert (verdict.path, verdict.tokens, verdict.token) == ([0, 1], [1, 2], 0)  # then the target's argmax
    assert verify_top_beta(tree, logits, beta=2, tau=1.0).path == [0]  # token 2 is third in row 1
    assert verify_top_beta(tree, logits, beta=3, tau=2.0).path == [0, 1, 2]
    exact = verify_top_beta(tree, logits, beta=1, tau=0.0)
    assert (exact.path, exact.token) == ([], 0)  # beta 1, tau 0: exact matching


def test_the_lossy_option_is_labelled_and_refused_where_it_does_not_apply(targets, specdec_drafters):
    target = targets["llama"]
    with pytest.raises(SpecbenchError, match="lossy; run method=specdec_lossy"):
        build_method(method_cfg("specdec", head=str(specdec_drafters["llama"]), top_beta=3), target, EMPTY)
    lossy = build_method(method_cfg("specdec_lossy", head=str(specdec_drafters["llama"])), target, EMPTY)
    input_ids = prompt_of(target, PROMPTS[0])
    state = lossy.prefill(input_ids, SamplingParams())
    from specbench.core.timing import CpuTimer

    result = lossy.decode(state, SamplingParams(), StopCriteria.build((), 30), CpuTimer())
    assert result.stats["verification"].startswith("top-beta tolerance (lossy)")
    state = lossy.prefill(input_ids, SamplingParams(temperature=1.0))
    with pytest.raises(SpecbenchError, match="defined for greedy decoding"):
        lossy.decode(state, SamplingParams(temperature=1.0), StopCriteria.build((), 30), CpuTimer())


def test_bad_drafters_get_clear_errors(targets, specdec_drafters, tmp_path):
    target = targets["llama"]
    with pytest.raises(SpecbenchError, match="not a SpecDec drafter"):
        build_method(method_cfg("specdec", head=str(tmp_path)), target, EMPTY)
    with pytest.raises(SpecbenchError, match="trained for blocks of up to 3 tokens"):
        build_method(method_cfg("specdec", head=str(specdec_drafters["llama"]), block=5), target, EMPTY)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in specdec_drafters["llama"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    config = json.loads((broken / "specdec.json").read_text())
    (broken / "specdec.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    with pytest.raises(SpecbenchError, match="trained for another model"):
        build_method(method_cfg("specdec", head=str(broken)), target, EMPTY)
    (broken / "specdec.json").write_text(json.dumps({**config, "block": 5}))
    with pytest.raises(SpecbenchError, match="mask_queries.safetensors"):
        build_method(method_cfg("specdec", head=str(broken)), target, EMPTY)


def test_train_head_command_writes_a_loadable_drafter(targets, tiny_models, tmp_path):
    out = tmp_path / "specdec"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(["the quick brown fox jumps over the lazy dog"] * 6) for _ in range(20)))
    done = cli("train-head", "method=specdec", "model=local", f"model.path={tiny_models['llama']}",
               f"draft={tiny_models['qwen2']}", f"corpus={corpus}", f"out={out}", "tokens=2000", "steps=5",
               "method.train.block=3", cwd=tmp_path)
    assert done.code == 0, done
    assert json.loads((out / "specdec.json").read_text())["block"] == 3
    method = build_method(method_cfg("specdec", head=str(out)), targets["llama"], EMPTY)
    assert_matches_baseline(method, targets["llama"], lengths=(12,))
    bad = cli("train-head", "method=specdec", "model=local", f"model.path={tiny_models['llama']}", cwd=tmp_path)
    assert_one_line_error(bad, "starts from a small draft model; give draft=")
    bad = cli("train-head", "method=eagle", "model=local", f"model.path={tiny_models['llama']}", "block=3",
              cwd=tmp_path)
    assert_one_line_error(bad, r"block= is a setting of the method's recipe now: give method\.train\.block=VALUE")
