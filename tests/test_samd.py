"""SAM-Decoding (`method=samd`): the suffix automaton against brute force, its drafts, greedy
losslessness on Llama, Qwen2 and GPT-2, the optional static datastore, and sampling that still
follows the target (chi-square, as the engine's own test)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from helpers import (
    ARCHS,
    CPU,
    EMPTY,
    PROMPTS,
    assert_matches_baseline,
    baseline_tokens,
    chi_square_p,
    exact_first_three,
    gpt2_config,
    method_cfg,
    prompt_of,
    run,
    sample_end_to_end,
    save_tiny,
    tiny_vocab_model,
)
from specbench import datastore as ds
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.engine import DraftContext, SpeculativeMethod
from specbench.engine.api import Prefilled
from specbench.methods.samd import SamdDrafter, SuffixAutomaton, most_frequent_chain
from specbench.models import LoadedModel, load_model
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_match(text: list[int]) -> tuple[int, int]:
    """(length, first end) of the longest suffix of `text` that also ends at an earlier position."""
    n = len(text)
    for length in range(n - 1, 0, -1):
        suffix = text[n - length :]
        for end in range(length - 1, n - 1):
            if text[end - length + 1 : end + 1] == suffix:
                return length, end
    return 0, -1


def random_texts(count: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        vocab = rng.randint(1, 6)
        yield [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]


# --- the automaton ----------------------------------------------------------------------------


def test_longest_earlier_match_equals_brute_force():
    for text in random_texts(300):
        sam = SuffixAutomaton()
        for i, token in enumerate(text):
            sam.extend(token)
            assert (sam.match_len, sam.match_end) == brute_match(text[: i + 1]), text[: i + 1]
            length, end = sam.match_len, sam.match_end
            assert sam.continuation(4) == (text[end + 1 : min(end + 5, i + 1)] if length else [])


def test_automaton_recognises_exactly_the_substrings():
    rng = random.Random(1)
    for text in random_texts(100, seed=2):
        sam = SuffixAutomaton()
        sam.extend_all(text)
        n = len(text)
        assert len(sam.length) <= max(2 * n - 1, 2)  # a suffix automaton's size bound
        substrings = {tuple(text[i:j]) for i in range(n) for j in range(i + 1, n + 1)}
        for sub in substrings:
            assert sam.longest_earlier_match(list(sub))[0] == len(sub)
            first = min(j for j in range(len(sub) - 1, n) if tuple(text[j - len(sub) + 1 : j + 1]) == sub)
            assert sam.longest_earlier_match(list(sub))[1] == first
        for _ in range(30):
            probe = [rng.randrange(7) for _ in range(rng.randint(1, 8))]
            assert (sam.longest_earlier_match(probe)[0] == len(probe)) == (tuple(probe) in substrings)


def test_incremental_extension_equals_building_from_scratch():
    """The drafter grows its automaton by the engine's tokens in uneven chunks: the same automaton
    (states, links, first ends, match) as one built over the whole text at once."""
    rng = random.Random(3)
    for text in random_texts(60, seed=4):
        if len(text) < 3:
            continue
        cut = rng.randint(1, len(text) - 1)
        drafter = SamdDrafter(max_draft=5, min_match=1)
        drafter.begin(Prefilled(torch.tensor([text[:cut]]), [text[cut]]), SamplingParams())
        generated = text[cut:]
        i = 1
        while True:
            tree = drafter.propose(DraftContext(torch.tensor([text[:cut]]), generated[:i], SamplingParams(), CPU, 5))
            length, end = brute_match(text[: cut + i])
            expected = text[end + 1 : min(end + 6, cut + i)] if length else []
            assert tree.tokens.tolist() == expected
            if i == len(generated):
                break
            i = min(len(generated), i + rng.randint(1, 4))
        whole = SuffixAutomaton()
        whole.extend_all(text)
        sam = drafter.sam
        assert (sam.next, sam.link, sam.length, sam.first_end) == (whole.next, whole.link, whole.length,
                                                                   whole.first_end)
        assert (sam.match_state, sam.match_len) == (whole.match_state, whole.match_len)


def test_min_match_and_depth_limit():
    drafter = SamdDrafter(max_draft=10, min_match=3)
    prompt = [5, 6, 7, 8, 9, 5, 6]
    drafter.begin(Prefilled(torch.tensor([prompt]), [1]), SamplingParams())
    ctx = DraftContext(torch.tensor([prompt]), [7], SamplingParams(), CPU, max_depth=10)
    assert drafter.propose(ctx).tokens.tolist() == [8, 9, 5, 6, 7]  # "5 6 7" matched: 3 tokens
    drafter = SamdDrafter(max_draft=10, min_match=3)
    drafter.begin(Prefilled(torch.tensor([prompt]), [9]), SamplingParams())
    ctx = DraftContext(torch.tensor([prompt]), [9], SamplingParams(), CPU, max_depth=10)
    assert drafter.propose(ctx).n == 0  # "6 9" never occurred; "9" alone is shorter than min_match
    drafter = SamdDrafter(max_draft=10, min_match=1)
    drafter.begin(Prefilled(torch.tensor([prompt]), [7]), SamplingParams())
    ctx = DraftContext(torch.tensor([prompt]), [7], SamplingParams(), CPU, max_depth=2)
    assert drafter.propose(ctx).tokens.tolist() == [8, 9]  # cut at the engine's depth


def test_most_frequent_chain():
    conts = np.array([[1, 2, 3], [1, 2, 4], [1, 5, 6], [7, 8, -1], [1, 2, 4]])
    assert most_frequent_chain(conts) == [1, 2, 4]
    assert most_frequent_chain(np.array([[3, -1, 5]])) == [3]


def test_bad_settings_are_refused(tiny_models, tmp_path):
    target = load_model(str(tiny_models["llama"]), device=CPU, dtype=torch.float32)
    with pytest.raises(SpecbenchError, match="'min_match' must be >= 1"):
        build_method(method_cfg("samd", min_match=0), target, EMPTY)
    with pytest.raises(SpecbenchError, match="is not a datastore"):
        build_method(method_cfg("samd", datastore=str(tmp_path)), target, EMPTY)


# --- greedy losslessness and acceptance -------------------------------------------------------


@pytest.fixture(scope="module")
def targets(tiny_models, tmp_path_factory) -> dict[str, LoadedModel]:
    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    gpt2 = save_tiny(tmp_path_factory.mktemp("samd") / "gpt2", gpt2_config(tok), tok)
    folders = {**tiny_models, "gpt2": gpt2}
    return {arch: load_model(str(path), device=CPU, dtype=torch.float32) for arch, path in folders.items()}


@pytest.mark.parametrize("arch", [*ARCHS, "gpt2"])
def test_greedy_equals_baseline(targets, arch):
    target = targets[arch]
    results = assert_matches_baseline(build_method(method_cfg("samd"), target, EMPTY), target)
    assert sum(r.stats["accepted_tokens"] for r in results) > 0
    short = build_method(method_cfg("samd", max_draft=2, min_match=2), target, EMPTY)
    assert_matches_baseline(short, target, lengths=(40,))


def oracle_accept_lengths(prompt: list[int], tokens: list[int], max_draft: int, min_match: int,
                          max_new: int) -> list[int]:
    """Accepted tokens per step (bonus included) that samd's rule must give on greedy output
    `tokens`: draft what followed the longest earlier match (brute force) of prompt + output, cut
    to the stop rule's budget; keep the draft's prefix that equals the output, plus one token."""
    lengths, done = [], 1
    while done < len(tokens):
        text = prompt + tokens[:done]
        length, end = brute_match(text)
        limit = min(max_draft, max_new - done - 1)
        draft = text[end + 1 : end + 1 + limit] if length >= min_match and limit > 0 else []
        accepted = 0
        while accepted < len(draft) and done + accepted < len(tokens) and draft[accepted] == tokens[done + accepted]:
            accepted += 1
        step = min(accepted + 1, len(tokens) - done)
        lengths.append(step)
        done += step
    return lengths


@pytest.mark.parametrize("arch", [*ARCHS, "gpt2"])
def test_repetitive_text_accepts_drafts(targets, arch):
    """On a repetitive prompt samd accepts exactly what its rule predicts from the target's own
    output (how repetitive a random target's output is depends on the machine's arithmetic, so the
    count is derived, not fixed), and it accepts drafts at all."""
    target = targets[arch]
    ids = prompt_of(target, ["the quick brown fox jumps over the lazy dog. " * 6])
    stop = StopCriteria.build((), 60)
    cfg = method_cfg("samd", budget="fixed")  # the preset's draft length at every step
    result = run(build_method(cfg, target, EMPTY), ids, stop)
    assert result.tokens == baseline_tokens(target, ids, stop)
    expected = oracle_accept_lengths(ids[0].tolist(), result.tokens, cfg.max_draft, cfg.min_match, 60)
    assert result.accept_lengths == expected
    assert max(result.accept_lengths) > 1, result.accept_lengths


def test_static_datastore_joins_the_automaton(targets, tmp_path):
    """A datastore holding the target's own answers: the static part drafts them (long accepted
    runs), the output still equals the baseline's; an unrelated datastore changes nothing."""
    target = targets["llama"]
    docs = []
    for turns in PROMPTS:
        ids = prompt_of(target, turns)
        docs.append(ids[0].tolist()[-6:] + baseline_tokens(target, ids, StopCriteria.build((), 60)))
    store = str(ds.build(docs, target.tokenizer, tmp_path / "store"))
    dynamic = assert_matches_baseline(build_method(method_cfg("samd"), target, EMPTY), target, lengths=(40,))
    static = assert_matches_baseline(build_method(method_cfg("samd", datastore=store), target, EMPTY), target,
                                     lengths=(40,))
    accepted = [sum(r.stats["accepted_tokens"] for r in results) for results in (dynamic, static)]
    assert accepted[1] > accepted[0]
    assert max(a for r in static for a in r.accept_lengths) >= 8
    other = str(ds.build([target.tokenizer.encode("unrelated words only", add_special_tokens=False)],
                         target.tokenizer, tmp_path / "other"))
    assert_matches_baseline(build_method(method_cfg("samd", datastore=other), target, EMPTY), target, lengths=(40,))


# --- sampling ---------------------------------------------------------------------------------


def test_sampled_generation_follows_the_target():
    """The engine's chi-square test with the automaton's (deterministic) drafts: the first three
    tokens follow the target's exact distribution, and drafts were proposed and accepted."""
    target = tiny_vocab_model(0)
    drafter = SamdDrafter(max_draft=3, min_match=1)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter)
    params = SamplingParams(temperature=1.0)
    prompt = [0, 1, 2, 3, 4, 0, 2, 1]  # every token occurs: every step has a match to draft from
    counts = sample_end_to_end(method, prompt, params, draws=1000)
    assert chi_square_p(counts, exact_first_three(target, prompt, params)) > 1e-3
    torch.manual_seed(1)
    results = [run(method, torch.tensor([prompt]), StopCriteria.build((), 4), params) for _ in range(50)]
    assert sum(r.stats["drafted_tokens"] for r in results) > 0 and sum(r.stats["accepted_tokens"] for r in results) > 0
