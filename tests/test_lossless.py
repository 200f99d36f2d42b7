"""Speculative methods are lossless.

Greedy: every method's tokens equal the baseline's exactly (fp32, CPU), also with drafters
built to break things. Sampling: samples of the first tokens follow the target's own
distribution (chi-square against the exact distribution computed by enumeration), and a
deliberately biased verifier fails the same test.

The checks other methods' tests reuse (assert_matches_baseline, chi_square_p, sample_end_to_end, ...)
live in helpers.py; the `targets` and `drafts` fixtures in conftest.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from helpers import (
    ARCHS,
    EMPTY,
    PROMPTS,
    VOCAB,
    RandomChainDrafter,
    RandomTreeDrafter,
    accept_everything,
    assert_matches_baseline,
    baseline_tokens,
    chi_square_p,
    exact_first_three,
    long_continuation,
    method_cfg,
    prompt_of,
    run,
    sample_end_to_end,
    sample_first_tokens,
    specbench,
    tiny_vocab_model,
    write_questions,
)
from specbench.core.answers import read_answers
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams, probs_from_logits
from specbench.core.stopping import StopCriteria
from specbench.engine import DraftContext, Drafter, DraftTree, SpeculativeMethod, verify_sampled
from specbench.engine import loop as engine_loop
from specbench.methods.drafts import SpsDrafter
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")


# --- greedy: the methods ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("draft", ["self", "noisy", "cross"])
def test_sps_greedy_equals_baseline(targets, drafts, arch, draft):
    target = targets[arch]
    # budget=fixed: the preset's K and schedule, asserted below (tests/test_budget.py: budget=auto)
    method = build_method(method_cfg("sps", draft=str(drafts[arch][draft]), budget="fixed"), target, EMPTY)
    results = assert_matches_baseline(method, target)
    steps = [a for r in results for a in r.accept_lengths]
    if draft == "self":  # the target drafting for itself: every draft token is accepted
        assert all(r.stats["accepted_tokens"] == r.stats["drafted_tokens"] for r in results)
        assert max(steps) > 6  # the heuristic schedule grew K past its start of 5
    if draft == "noisy":
        assert 1 in steps and max(steps) > 2  # both rejections and acceptances happened


@pytest.mark.parametrize("schedule", ["constant", "heuristic_transient"])
def test_sps_schedules(targets, drafts, schedule):
    target = targets["llama"]
    cfg = method_cfg("sps", draft=str(drafts["llama"]["self"]), num_speculative_tokens=3, schedule=schedule,
                     budget="fixed")  # the schedules are what budget=fixed runs
    method = build_method(cfg, target, EMPTY)
    input_ids = prompt_of(target, PROMPTS[1])
    stop = StopCriteria.build(target.eos_ids, 30)
    for _ in range(2):  # the transient schedule starts over on every call
        result = run(method, input_ids, stop)
        assert result.tokens == baseline_tokens(target, input_ids, stop)
        lengths = result.stats["draft_lengths"]
        if schedule == "constant":
            assert set(lengths[:-1]) == {3}
        else:
            assert lengths[:3] == [3, 5, 7]


def test_sps_heuristic_k_restarts_with_every_question(targets, drafts, tiny_models, tmp_path):
    """K is carried across the calls (turns) of a question but restarts with the next question, so that a
    question's numbers never depend on which questions ran before it (a subset reproduces them)."""
    target = targets["llama"]
    cfg = method_cfg("sps", draft=str(drafts["llama"]["self"]), num_speculative_tokens=3, schedule="heuristic",
                     budget="fixed")
    method = build_method(cfg, target, EMPTY)
    input_ids = prompt_of(target, PROMPTS[1])
    stop = StopCriteria.build(target.eos_ids, 30)
    method.start_question()
    first = run(method, input_ids, stop).stats["draft_lengths"]
    second = run(method, input_ids, stop).stats["draft_lengths"]  # the same question's next turn: K goes on
    method.start_question()
    third = run(method, input_ids, stop).stats["draft_lengths"]
    assert first[:3] == [3, 5, 7] and second[0] > 7 and third == first
    # end to end: each question's steps are the same answered alone as after the others
    questions = write_questions(tmp_path / "q.jsonl")
    lines = questions.read_text().splitlines()
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(lines[len(lines) // 2:]) + "\n")
    stats = {}
    for name, path in (("all", questions), ("subset", subset)):
        out = tmp_path / name
        specbench("run", "method=sps", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
                  f"dataset.path={path}", "max_new_tokens=24", "warmup=0", "progress=false", "baseline=false",
                  "budget=fixed", f"model.draft={drafts['llama']['self']}", f"output_dir={out}", cwd=tmp_path,
                  check=True)
        records = read_answers(out / "spec_bench" / "local" / "sps-fixed" / "temp-0" / "run-1" / "answers.jsonl")
        stats[name] = {r["question_id"]: [s["draft_lengths"] for s in r["specbench"]["stats"]] for r in records}
    assert len(stats["subset"]) == len(lines) - len(lines) // 2
    assert all(stats["all"][q] == lengths for q, lengths in stats["subset"].items())
    assert max(max(t) for turns in stats["all"].values() for t in turns) > 7  # K did grow within questions


def test_sps_draft_from_the_model_config_and_errors(targets, drafts, tiny_models, tmp_path):
    target = targets["llama"]
    method = build_method(method_cfg("sps"), target, OmegaConf.create({"draft": str(drafts["llama"]["noisy"])}))
    assert_matches_baseline(method, target, lengths=(9,))
    with pytest.raises(SpecbenchError, match="needs a draft model"):
        build_method(method_cfg("sps"), target, OmegaConf.create({"draft": None}))
    other = other_vocabulary_model(tmp_path)
    for name in ("sps", "hf_assisted"):
        with pytest.raises(SpecbenchError, match="does not share the target's tokenizer"):
            build_method(method_cfg(name, draft=str(other)), target, EMPTY)


@pytest.mark.parametrize("arch", ARCHS)
def test_pld_greedy_equals_baseline(targets, arch):
    target = targets[arch]
    results = assert_matches_baseline(build_method(method_cfg("pld"), target, EMPTY), target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0  # lookups did get accepted
    last = build_method(method_cfg("pld", match="last", max_ngram=1, num_pred_tokens=3), target, EMPTY)
    assert_matches_baseline(last, target, lengths=(40,))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["hf_assisted", "hf_pld"])
def test_hf_peers_greedy_equal_baseline(targets, drafts, arch, name):
    target = targets[arch]
    cfg = method_cfg(name, draft=str(drafts[arch]["noisy"])) if name == "hf_assisted" else method_cfg(name)
    method = build_method(cfg, target, EMPTY)
    assert not method.splits_prefill
    results = assert_matches_baseline(method, target)
    for result in results:
        assert result.stats["target_forwards"] == len(result.accept_lengths)
        assert result.accept_lengths[0] == result.stats["first_forward_tokens"] - 1 or len(result.tokens) == 1
    assert any(a > 1 for r in results for a in r.accept_lengths)  # multi-token steps were recorded as such


def test_hf_assisted_takes_its_settings(targets, drafts):
    target = targets["llama"]
    cfg = method_cfg("hf_assisted", draft=str(drafts["llama"]["self"]), num_assistant_tokens=3,
                     num_assistant_tokens_schedule="constant")
    result = run(build_method(cfg, target, EMPTY), prompt_of(target, PROMPTS[1]), StopCriteria.build((), 30))
    assert result.accept_lengths[:-1] == [3] + [4] * (len(result.accept_lengths) - 2)  # 3 drafts + 1 each


def test_hf_peers_cut_at_stop_strings(targets, drafts):
    target = targets["llama"]
    input_ids = prompt_of(target, PROMPTS[0])
    text = target.tokenizer.decode(baseline_tokens(target, input_ids, StopCriteria.build(target.eos_ids, 40))[5:8])
    stop = StopCriteria.build(target.eos_ids, 40, [text], target.tokenizer.decode)
    expected = baseline_tokens(target, input_ids, stop)
    assert len(expected) < 40
    draft = str(drafts["llama"]["self"])
    for cfg in (method_cfg("hf_assisted", draft=draft), method_cfg("hf_pld"), method_cfg("sps", draft=draft)):
        assert run(build_method(cfg, target, EMPTY), input_ids, stop).tokens == expected


# --- greedy: adversarial drafters -----------------------------------------------------------------


class OracleDrafter(Drafter):
    """The target's own continuation (from a longer run), over-long and past any stop."""

    def __init__(self, continuation: list[int], extra: int = 8, mistakes: float = 0.0, seed: int = 0) -> None:
        self.continuation = continuation
        self.extra = extra
        self.mistakes = mistakes
        self.rng = random.Random(seed)

    def propose(self, ctx: DraftContext) -> DraftTree:
        i = len(ctx.tokens)
        draft = list(self.continuation[i : i + ctx.max_depth + self.extra])
        for j in range(len(draft)):
            if self.rng.random() < self.mistakes:
                draft[j] = (draft[j] + 1) % 320
        return DraftTree.chain(torch.tensor(draft, dtype=torch.long))


@pytest.mark.parametrize("arch", ARCHS)
def test_random_drafts_change_nothing(targets, arch):
    target = targets[arch]
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=RandomChainDrafter(int(target.model.config.vocab_size)))
    assert_matches_baseline(method, target)


@pytest.mark.parametrize("arch", ARCHS)
def test_oracle_drafts_past_max_new_tokens_and_eos(targets, arch):
    target = targets[arch]
    for turns in PROMPTS:
        input_ids = prompt_of(target, turns)
        continuation = long_continuation(target, input_ids)
        for mistakes in (0.0, 0.3):
            method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=OracleDrafter(continuation, mistakes=mistakes))
            for max_new in (1, 2, 7, 23):
                stop = StopCriteria.build((), max_new)
                result = run(method, input_ids, stop)
                assert result.tokens == continuation[:max_new]
            # an EOS in the middle of the drafts: generation stops there, the draft runs on past it
            eos = continuation[9]
            stop = StopCriteria.build({eos}, 60)
            expected = baseline_tokens(target, input_ids, stop)
            assert expected[-1] == eos and len(expected) <= 10
            assert run(method, input_ids, stop).tokens == expected
            # a stop string completed inside a draft
            text = target.tokenizer.decode(continuation[12:15])
            stop = StopCriteria.build((), 60, [text], target.tokenizer.decode)
            assert run(method, input_ids, stop).tokens == baseline_tokens(target, input_ids, stop)


@pytest.mark.parametrize("arch", ARCHS)
def test_multi_branch_trees_are_verified_end_to_end(targets, arch):
    target = targets[arch]
    paths = tree_steps = 0
    for seed, turns in enumerate(PROMPTS):
        input_ids = prompt_of(target, turns)
        continuation = long_continuation(target, input_ids, 60)
        drafter = RandomTreeDrafter(continuation, seed)
        method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
        for max_new in (3, 17, 60):
            result = run(method, input_ids, StopCriteria.build((), max_new))
            assert result.tokens == continuation[:max_new]
            assert "tree_fallback" not in result.stats
            tree_steps += result.stats.get("tree_steps", 0)
        paths += drafter.non_prefix_paths
    assert tree_steps > 10
    assert paths > 0  # some accepted paths needed the cache gathered, not just cropped


# --- sampling: the verifier on hand-made distributions ----------------------------------------


CASES = [
    ("chain", SamplingParams(temperature=1.0)),
    ("iid", SamplingParams(temperature=1.0)),
    ("without_replacement", SamplingParams(temperature=1.0)),
    ("deterministic", SamplingParams(temperature=1.0)),
    ("chain", SamplingParams(temperature=0.7, top_k=3, top_p=0.9)),
    ("iid", SamplingParams(temperature=1.3, top_p=0.8)),
]


@pytest.mark.parametrize(("kind", "params"), CASES, ids=[f"{k}-{p.temperature}-{p.top_k}-{p.top_p}" for k, p in CASES])
def test_verifier_samples_follow_the_target(kind, params):
    counts, exact = sample_first_tokens(kind, params, verify_sampled, draws=3000)
    assert chi_square_p(counts, exact) > 1e-3


HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["chain", "iid", "without_replacement", "deterministic"])
def test_verifier_samples_follow_a_half_precision_target(kind, dtype):
    """Logits in bfloat16 / float16 (as a half-precision model gives them): the accept/reject arithmetic
    (in float32: probs_from_logits) keeps the target's distribution, that of its rounded logits."""
    counts, exact = sample_first_tokens(kind, SamplingParams(temperature=1.0), verify_sampled, draws=3000, dtype=dtype)
    assert chi_square_p(counts, exact) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["chain", "iid"])
def test_a_biased_verifier_fails_the_same_test(kind, dtype):
    counts, exact = sample_first_tokens(kind, SamplingParams(temperature=1.0), accept_everything, draws=3000,
                                        dtype=dtype)
    assert chi_square_p(counts, exact) < 1e-6


# --- sampling: end to end with tiny-vocabulary models -----------------------------------------


class FixedTreeDrafter(Drafter):
    """A sampled tree from a fixed (context-free) draft distribution: 3 i.i.d. children of the
    root, 2 of each of those. Any distribution is a valid draft if the tokens come from it."""

    def __init__(self, p: torch.Tensor) -> None:
        self.p = p

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.max_depth < 1:
            return DraftTree.empty()
        first = torch.multinomial(self.p, 3, replacement=True)
        tokens, parents = first.tolist(), [-1, -1, -1]
        if ctx.max_depth >= 2:
            for node in range(3):
                tokens += torch.multinomial(self.p, 2, replacement=True).tolist()
                parents += [node, node]
        return DraftTree(torch.tensor(tokens), tuple(parents), self.p.expand(len(tokens), -1), "iid")


END_TO_END = [("sps", SamplingParams(temperature=1.0), 1500, torch.float32),
              ("tree", SamplingParams(temperature=1.0), 1500, torch.float32),
              ("sps", SamplingParams(temperature=0.8, top_k=3, top_p=0.9), 1000, torch.float32),  # top-k 3: fewer cells
              ("sps", SamplingParams(temperature=1.0), 1500, torch.bfloat16),  # target and draft in half precision
              ("tree", SamplingParams(temperature=1.0), 1500, torch.bfloat16)]


@pytest.mark.parametrize(("drafter", "params", "draws", "dtype"), END_TO_END,
                         ids=["sps", "tree", "sps-topk-topp", "sps-bf16", "tree-bf16"])
def test_sampled_generation_follows_the_target(drafter, params, draws, dtype):
    """End to end: the exact distribution is the target's own in its dtype (one batched forward),
    which the engine's multi-row forwards match up to rounding far below what 1500 draws can see."""
    target, draft = tiny_vocab_model(0, dtype=dtype), tiny_vocab_model(1, dtype=dtype)
    if drafter == "sps":
        made = SpsDrafter(draft, num_tokens=3, vocab_size=VOCAB)
    else:
        made = FixedTreeDrafter(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=made)
    prompt = [1, 3, 2]
    exact = exact_first_three(target, prompt, params)
    counts = sample_end_to_end(method, prompt, params, draws)
    assert chi_square_p(counts, exact) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sampled_generation_with_a_biased_verifier_fails(monkeypatch, dtype):
    target, draft = tiny_vocab_model(0, dtype=dtype), tiny_vocab_model(1, dtype=dtype)
    params = SamplingParams(temperature=1.0)
    monkeypatch.setattr(engine_loop, "verify", lambda tree, logits, s: accept_everything(
        tree, probs_from_logits(logits, s)))
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=SpsDrafter(draft, num_tokens=3, vocab_size=VOCAB))
    prompt = [1, 3, 2]
    counts = sample_end_to_end(method, prompt, params, draws=600)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) < 1e-6


# --- the command line --------------------------------------------------------------------


def other_vocabulary_model(folder: Path) -> Path:
    """A tiny Llama whose tokenizer was trained on other text (different merges and ids)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["completely different words make other merges entirely"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|end|>", pad_token="<|end|>")
    path = folder / "other"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, eos_token_id=tok.eos_token_id)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        tok.save_pretrained(path)
    return path


def test_cli_runs_sps_end_to_end_and_refuses_another_vocabulary(tiny_models, drafts, tmp_path):
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "results"
    common = ["run", "method=sps", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
              f"dataset.path={questions}", "limit=1", "max_new_tokens=8", "warmup=0", "progress=false",
              f"output_dir={out}"]
    specbench(*common, f"model.draft={drafts['llama']['noisy']}", cwd=tmp_path, check=True)
    records = read_answers(out / "spec_bench" / "local" / "sps" / "temp-0" / "run-1" / "answers.jsonl")
    baseline = read_answers(out / "spec_bench" / "local" / "baseline" / "temp-0" / "run-1" / "answers.jsonl")
    assert len(records) == len(baseline) >= 6
    by_id = {r["question_id"]: r for r in baseline}
    for record in records:
        assert record["specbench"]["output_ids"] == by_id[record["question_id"]]["specbench"]["output_ids"]
        stats = record["specbench"]["stats"][0]
        assert stats["steps"] == len(stats["draft_lengths"]) and "position_accepted" in stats
        assert set(record["specbench"]["sections"][0]) >= {"draft", "verify"}
    other = other_vocabulary_model(tmp_path)
    proc = specbench(*common, "baseline=false", "output_dir=" + str(tmp_path / "other-results"),
                     f"method.draft={other}", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not share the target's tokenizer" in errors[0], proc.stderr
