"""Speculative methods are lossless.

Greedy: every method's tokens equal the baseline's exactly (fp32, CPU), also with drafters
built to break things. Sampling: samples of the first tokens follow the target's own
distribution (chi-square against the exact distribution computed by enumeration), and a
deliberately biased verifier fails the same test.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from helpers import REPO, specbench, write_questions
from specbench.core.answers import read_answers
from specbench.core.errors import SpecbenchError
from specbench.core.prompts import prompt_ids
from specbench.core.sampling import SamplingParams, probs_from_logits, sample
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod, Verdict, verify_sampled
from specbench.engine import loop as engine_loop
from specbench.methods.sps import SpsDrafter
from specbench.models import LoadedModel, load_model
from specbench.run.registry import build_method

CPU = torch.device("cpu")
GREEDY = SamplingParams()
EMPTY = OmegaConf.create({})
ARCHS = ["llama", "qwen2"]
PROMPTS = [["the quick brown fox jumps over the lazy dog, the quick brown fox"], ["tom has 3 boxes"],
           ["summarize the passage", "now translate it"]]
LENGTHS = (1, 6, 40)


pytestmark = pytest.mark.usefixtures("one_thread")


def method_cfg(name: str, **overrides) -> OmegaConf:
    cfg = OmegaConf.load(REPO / "configs" / "method" / f"{name}.yaml")
    return OmegaConf.merge(cfg, overrides)


@pytest.fixture(scope="module")
def targets(tiny_models) -> dict[str, LoadedModel]:
    return {arch: load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32) for arch in ARCHS}


@pytest.fixture(scope="module")
def drafts(tiny_models, targets, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Per target: itself (all accepted), a noisy copy (some accepted), the other architecture."""
    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for arch in ARCHS:
        noisy = root / f"{arch}-noisy"
        model = load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.005)
        model.model.save_pretrained(noisy)
        model.tokenizer.save_pretrained(noisy)
        other = "qwen2" if arch == "llama" else "llama"
        out[arch] = {"self": tiny_models[arch], "noisy": noisy, "cross": tiny_models[other]}
    return out


def prompt_of(target: LoadedModel, turns: list[str]) -> torch.Tensor:
    return torch.tensor([prompt_ids("chat_template", target.tokenizer, turns, ["an answer"] * (len(turns) - 1))])


def run(method, input_ids: torch.Tensor, stop: StopCriteria, sampling: SamplingParams = GREEDY):
    result = method.decode(method.prefill(input_ids, sampling), sampling, stop, CpuTimer())
    assert len(result.tokens) == 1 + sum(result.accept_lengths)
    assert all(a >= 1 for a in result.accept_lengths) or not method.splits_prefill
    return result


_BASELINE: dict = {}


def baseline_tokens(target: LoadedModel, input_ids: torch.Tensor, stop: StopCriteria) -> list[int]:
    key = (target.path, tuple(input_ids[0].tolist()), stop.max_new_tokens, stop.eos_ids, stop.stop_strings)
    if key not in _BASELINE:
        base = build_method(method_cfg("baseline"), target, EMPTY)
        _BASELINE[key] = run(base, input_ids, stop).tokens
    return _BASELINE[key]


def assert_matches_baseline(method, target: LoadedModel, lengths=LENGTHS) -> list:
    results = []
    for turns in PROMPTS:
        input_ids = prompt_of(target, turns)
        for max_new in lengths:
            stop = StopCriteria.build(target.eos_ids, max_new)
            result = run(method, input_ids, stop)
            assert result.tokens == baseline_tokens(target, input_ids, stop), (turns, max_new)
            results.append(result)
    return results


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


class RandomChainDrafter(Drafter):
    """Random tokens, nonsense 'probabilities', lengths that ignore the budget."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.rng = random.Random(seed)

    def propose(self, ctx: DraftContext) -> DraftTree:
        n = self.rng.randint(0, 12)
        tokens = torch.tensor([self.rng.randrange(self.vocab) for _ in range(n)], dtype=torch.long)
        probs = torch.rand(n, self.vocab) * 3  # not distributions at all
        return DraftTree.chain(tokens, probs)


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


class RandomTreeDrafter(Drafter):
    """Multi-branch deterministic trees with the target's continuation on a random branch."""

    def __init__(self, continuation: list[int], seed: int = 0) -> None:
        self.continuation = continuation
        self.rng = random.Random(seed)
        self.non_prefix_paths = 0

    def propose(self, ctx: DraftContext) -> DraftTree:
        good = self.continuation[len(ctx.tokens) : len(ctx.tokens) + self.rng.randint(0, 5)]
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(-1, True)]  # (node, on the good path)
        for depth in range(len(good) + 1):
            nxt = []
            for node, on_path in frontier:
                width = self.rng.randint(1, 3)
                slot = self.rng.randrange(width) if on_path and depth < len(good) else -1
                for k in range(width):
                    token = good[depth] if k == slot else self.rng.randrange(320)
                    parents.append(node)
                    tokens.append(token)
                    nxt.append((len(tokens) - 1, k == slot))
            frontier = [f for f in nxt if self.rng.random() < 0.6 or f[1]]
        return DraftTree(torch.tensor(tokens, dtype=torch.long), tuple(parents))

    def accepted(self, feedback: Feedback) -> None:
        path = feedback.verdict.path
        self.non_prefix_paths += path != list(range(len(path)))


def long_continuation(target: LoadedModel, input_ids: torch.Tensor, n: int = 80) -> list[int]:
    return baseline_tokens(target, input_ids, StopCriteria.build((), n))


def greedy_rows(target: LoadedModel, n: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    """Training rows for heads in tests: each of PROMPTS followed by the target's own greedy
    continuation, right-padded with 0; (ids, valid)."""
    rows = [prompt_of(target, turns)[0].tolist() + long_continuation(target, prompt_of(target, turns), n)
            for turns in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    valid = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return ids, valid


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


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells expected below `min_expected` are pooled."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = probs * counts.sum()
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def accept_everything(tree: DraftTree, target_probs: torch.Tensor) -> Verdict:
    """A broken verifier: takes the first branch whole and samples the bonus token after it."""
    layout = tree.layout
    path: list[int] = []
    row = 0
    while layout.children[row]:
        path.append(layout.children[row][0])
        row = path[-1] + 1
    tokens = [int(tree.tokens[i]) for i in path]
    return Verdict(path, tokens, int(sample(target_probs[row])))


VOCAB = 5
START = VOCAB  # the context "before the first token" gets its own row in the bigram tables


def bigram_tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits, (VOCAB + 1, VOCAB): row = previous token (START for the first)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB + 1, VOCAB, generator=gen) * 1.5, torch.randn(VOCAB + 1, VOCAB, generator=gen) * 1.5


def draft_tree(kind: str, prev: int, draft_p: torch.Tensor, depth: int) -> DraftTree:
    """A sampled draft for a bigram draft model: chains, i.i.d. / without-replacement siblings,
    or deterministic top candidates."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[torch.Tensor] = []
    frontier = [(-1, prev)]
    widths = {"chain": 1, "iid": 3, "without_replacement": 3, "deterministic": 2}
    for _ in range(depth):
        nxt = []
        for node, token in frontier:
            p = draft_p[token]
            width = widths[kind]
            if kind == "deterministic":
                picks = p.topk(width).indices.tolist()
            else:
                picks = torch.multinomial(p, width, replacement=kind != "without_replacement").tolist()
            for x in picks:
                parents.append(node)
                tokens.append(x)
                rows.append(p)
                nxt.append((len(tokens) - 1, x))
        frontier = nxt
    if kind == "deterministic":
        return DraftTree(torch.tensor(tokens), tuple(parents))
    return DraftTree(torch.tensor(tokens), tuple(parents), torch.stack(rows), "iid" if kind == "chain" else kind)


def sample_first_tokens(kind: str, params: SamplingParams, verifier, draws: int, n_tokens: int = 3, seed: int = 0,
                        depth: int = 2, shape=None, dtype: torch.dtype = torch.float32):
    """Counts of the first `n_tokens` tokens of `draws` simulated generations with a bigram target
    whose logits (target and draft) are held in `dtype`.
    `shape(tree, prev, p_table)`, when given, changes each draft before verification (what a draft
    budget keeps of it) and `shape.observe(tree, verdict)` hears each verdict."""
    target_logits, draft_logits = (t.to(dtype) for t in bigram_tables(seed))
    q_table, p_table = probs_from_logits(target_logits, params), probs_from_logits(draft_logits, params)
    torch.manual_seed(seed)
    counts = torch.zeros((VOCAB,) * n_tokens)
    for _ in range(draws):
        out: list[int] = []
        prev = START
        while len(out) < n_tokens:
            tree = draft_tree(kind, prev, p_table, depth=depth)
            if shape is not None:
                tree = shape(tree, prev, p_table)
            rows = [prev, *tree.tokens.tolist()]  # bigram: a row's distribution depends on its own token
            verdict = verifier(tree, q_table[rows])
            if shape is not None:
                shape.observe(tree, verdict)
            out += [*verdict.tokens, verdict.token]
            prev = out[-1]
        counts[tuple(out[:n_tokens])] += 1
    return counts, exact_distribution(q_table, n_tokens)


def exact_distribution(q_table: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """P(t1, ..., tn) of the bigram target."""
    dist = q_table[START]
    for _ in range(n_tokens - 1):
        dist = dist[..., None] * q_table[:VOCAB].reshape((1,) * (dist.dim() - 1) + (VOCAB, VOCAB))
    return dist


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


def tiny_vocab_model(seed: int, vocab: int = VOCAB, layers: int = 1, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A Llama of `layers` blocks (one by default) over `vocab` tokens with a sharpened head
    (distinct, peaked distributions), in `dtype`."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)
    tokenizer = SimpleNamespace(eos_token_id=None)
    return LoadedModel(model.to(dtype), tokenizer, f"tiny-vocab-{seed}", CPU, dtype)


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


def exact_first_three(target: LoadedModel, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """P(t1, t2, t3) by enumeration: one batched forward over every two-token continuation."""
    v = VOCAB
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
    ids = torch.cat([torch.tensor(prompt).expand(v * v, -1), pairs], dim=1)
    with torch.no_grad():
        logits = target.model(input_ids=ids).logits
    probs = probs_from_logits(logits, params).double()
    n = len(prompt)
    p1 = probs[0, n - 1]
    p2 = probs[:, n].reshape(v, v, v)[:, 0]  # row (t1, any t2) -> P(t2 | t1)
    p3 = probs[:, n + 1].reshape(v, v, v)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_end_to_end(method: SpeculativeMethod, prompt: list[int], params: SamplingParams, draws: int):
    counts = torch.zeros(VOCAB, VOCAB, VOCAB)
    stop = StopCriteria.build((), 4)  # depth-2 drafts in the first step; only 3 tokens are counted
    input_ids = torch.tensor([prompt])
    torch.manual_seed(0)
    for _ in range(draws):
        tokens = run(method, input_ids, stop, params).tokens
        counts[tuple(tokens[:3])] += 1
    return counts


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
