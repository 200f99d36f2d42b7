"""Draft budgets (`method.budget=auto`, engine.budget): the policy's choice against synthetic cost
curves, the acceptance model, losslessness under sampling, and auto against fixed end to end."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import assert_matches_baseline, chi_square_p, cli, method_cfg, sample_first_tokens, write_questions
from specbench.core.errors import SpecbenchError
from specbench.core.sampling import SamplingParams
from specbench.engine import DraftTree, Verdict, verify_sampled
from specbench.engine.budget import (
    GAIN_EVIDENCE,
    LONG_POSITIONS,
    PROBE_EVERY,
    PROBE_MAX,
    TOKENS_DECAY,
    AcceptanceModel,
    BudgetPolicy,
    CostCurve,
    OnlineFit,
    Plan,
    cost_curve,
    curve_batches,
    curve_contexts,
    measure_curve,
    monotone,
)
from specbench.run.registry import build_method, method_label
from specbench.run.runner import turn_orders

pytestmark = pytest.mark.usefixtures("one_thread")
PARAMS = SamplingParams(temperature=1.0)


def confident_chain(n: int = 30, confidence: float = 0.8) -> DraftTree:
    return DraftTree(torch.arange(n), tuple(range(-1, n - 1)), confidence=torch.full((n,), confidence))


def test_cheaper_verification_buys_a_larger_budget():
    """The same proposal under three synthetic cost curves: the cheaper each extra verified row,
    the more nodes the policy keeps; free verification keeps them all."""
    tree = confident_chain()
    kept = {}
    for name, slope in (("steep", 0.01), ("gentle", 0.0005), ("free", 0.0)):
        policy = BudgetPolicy(CostCurve.synthetic(lambda rows, s=slope: 0.01 + s * rows))
        kept[name] = policy.select(tree, context=100).n
    assert kept["steep"] < kept["gentle"] < kept["free"] == tree.n
    assert kept["steep"] >= 1  # a node at 0.8 pays even there


def test_the_choice_keeps_the_likeliest_nodes_and_a_tree():
    """A tree whose second branch the drafter is sure of: the prefix kept is closed under parents
    and holds the confident nodes first."""
    parents = (-1, -1, 0, 1, 1, 3)
    confidence = torch.tensor([0.05, 0.95, 0.05, 0.9, 0.05, 0.9])
    tree = DraftTree(torch.arange(6), parents, confidence=confidence)
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.002 * rows))
    kept = policy.select(tree, context=10)
    assert kept.tokens.tolist() == [1, 3, 5]
    assert kept.parents == (-1, 0, 1)
    assert kept.confidence.tolist() == pytest.approx([0.95, 0.9, 0.9])


def test_every_choice_is_a_tree():
    """Random trees with near-certain nodes (where rounding could put a child above its parent):
    the prefix kept is always closed under parents, and its nodes are the likeliest."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        parents = tuple(int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n))
        confidence = 1 - torch.rand(n, generator=gen) ** 4 * (0.5 if trial % 2 else 1e-3)
        tree = DraftTree(torch.arange(n), parents, confidence=confidence if trial % 3 else None)
        slope = float(torch.rand(1, generator=gen)) * 0.01
        policy = BudgetPolicy(CostCurve.synthetic(lambda rows, s=slope: 0.01 + s * rows))
        policy.accept.pos_seen[:] = 1e4  # positional rates learnt at or near 1 (nodes without confidence)
        misses = (torch.rand(policy.accept.pos_hits.shape, generator=gen) < 0.5).numpy()  # else exactly 1
        policy.accept.pos_hits[:] = 1e4 - misses * torch.rand(misses.shape, generator=gen).numpy()
        kept = policy.select(tree, 10)
        assert 1 <= kept.n <= n  # DraftTree itself refuses a node whose parent was dropped


def test_lookahead_windows_survive_the_choice():
    """Pruning keeps the aux block and drops the pruned nodes' columns from its mask."""
    from specbench.engine import AuxBlock

    tree = DraftTree(torch.arange(4), (-1, 0, -1, 2), confidence=torch.tensor([0.9, 0.9, 0.01, 0.01]))
    attend = torch.ones(2, 1 + 4 + 2, dtype=torch.bool)
    attend[:, 3] = False  # the aux rows do not see node 2
    tree.aux = AuxBlock(torch.tensor([7, 8]), torch.tensor([1, 2]), attend)
    kept = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.004 * rows)).select(tree, context=10)
    assert kept.n == 2 and kept.aux is not None
    assert kept.aux.attend.shape == (2, 1 + 2 + 2)
    assert kept.aux.tokens.tolist() == [7, 8]


def test_the_acceptance_model_learns_from_verdicts():
    model = AcceptanceModel()
    tree = DraftTree(torch.arange(3), (-1, 0, 1), confidence=torch.tensor([0.3, 0.3, 0.3]))
    for _ in range(200):  # depth 1 always accepted, depth 2 never
        model.observe(tree, Verdict([0], [0], 5))
    assert model.rate(1) > 0.95 and model.rate(2) < 0.05
    assert model.rate(3) < 0.05  # unseen: the prior is the nearest level above's
    assert model.rate(1, 1) == pytest.approx(0.25)  # no sibling seen: 0.5 / (rank + 1)
    calibrated = model.calibrate(torch.tensor([0.3]))
    assert float(calibrated[0]) == pytest.approx(0.5, abs=0.02)  # 200 of 400 nodes at conf 0.3 accepted


def test_fits_follow_the_machine():
    fit = OnlineFit(slope=1.0)
    for x in range(1, 30):
        fit.add(float(x), 0.002 + 2.0 * x)
    a, b = fit.coefficients()
    assert b == pytest.approx(2.0, rel=1e-3) and a == pytest.approx(0.002, abs=1e-3)
    proportional = OnlineFit(slope=None, bounded=False)
    for _ in range(5):
        proportional.add(6.0, 0.03)  # one work size only: all of the time is per unit
    assert proportional.coefficients()[1] == pytest.approx(0.005)
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]


def test_batch_size_moves_the_budget():
    """The curve is measured at the run's batch size: where 4 rows of k nodes cost what one row of
    4k does (compute-bound), each row's extra node costs more against the step's fixed part, so
    a batch of 4 verifies fewer nodes per row than batch 1."""
    one = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.004 * rows))
    four = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 4 * 0.004 * rows))
    four.curve.batch = 4
    tree = confident_chain(confidence=0.9)
    assert 1 <= four.select(tree, 10).n < one.select(tree, 10).n


def batch_curve(batch: int, slope: float) -> CostCurve:
    curve = CostCurve.synthetic(lambda rows: 0.01 + slope * rows)
    curve.batch = batch
    return curve


def test_a_draining_batch_reads_the_curve_at_its_live_rows():
    """A policy at batch size 4 holds curves at 1, 2 and 4 rows; a step with 3 rows live reads
    between 2 and 4, and a last row alone reads the one-row curve: there verification is cheaper,
    so it keeps more nodes than each of 4 rows does (the old policy read batch 4's curve for all)."""
    assert curve_batches(16) == [1, 2, 4, 8, 16] and curve_batches(6) == [1, 2, 4, 6] and curve_batches(1) == [1]
    curves = {1: batch_curve(1, 0.001), 2: batch_curve(2, 0.002), 4: batch_curve(4, 0.008)}
    policy = BudgetPolicy(curves[4], curves)
    assert policy.curve_time(5, 0, live=3) == pytest.approx((0.01 + 0.002 * 5 + 0.01 + 0.008 * 5) / 2)
    assert policy.curve_time(5, 0, live=1) == pytest.approx(0.01 + 0.001 * 5)
    assert policy.curve_time(5, 0) == policy.curve_time(5, 0, live=4) == pytest.approx(0.01 + 0.008 * 5)
    tree = confident_chain(confidence=0.8)
    alone = policy.choose([tree], 10, [tree.n], Plan("all", False))[0].n
    four = policy.choose([tree] * 4, 10, [tree.n] * 4, Plan("all", False))[0].n
    assert 1 <= four < alone


def test_a_long_run_times_its_length_bucket():
    """Curves are timed over 64 and 512 cached positions, and a run whose steps reach past LONG_FROM over its
    length bucket too (the next power of two, within the model's context and LONG_POSITIONS over the rows)."""
    assert curve_contexts(8192) == curve_contexts(8192, 1, 700) == [64, 512]
    assert curve_contexts(8192, 1, 3000) == [64, 512, 4096]
    assert curve_contexts(8192, 1, 7300) == [64, 512, 8192 - 256]  # the room for the curve's rows kept
    assert curve_contexts(8192, 8, 3000) == [64, 512, LONG_POSITIONS // 8]
    assert curve_contexts(8192, 32, 3000) == [64, 512], "a bucket cut to 512 positions adds nothing"
    assert curve_contexts(512, 1, 3000) == [64, 256]


def test_the_curve_reads_between_the_two_nearest_contexts():
    """With a length bucket the cost is read between the two measured contexts around the step's (the first
    two below them, the last two beyond), not along a line from the first to the last."""
    rows = [1, 2, 4]
    curve = CostCurve(rows, [64, 512, 4096], [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [3.0, 6.0, 9.0]])
    assert curve.time(2, 512) == pytest.approx(2.0) and curve.time(2, 4096) == pytest.approx(6.0)
    assert curve.time(2, 2048) == pytest.approx(2.0 + (2048 - 512) / (4096 - 512) * 4.0)
    assert curve.time(2, 300) == pytest.approx(2.0)
    assert curve.time(2, 6144) == pytest.approx(6.0 + (6144 - 4096) / (4096 - 512) * 4.0)
    for context in (0, 300, 2048, 6144):
        assert curve.times(torch.tensor([1, 2, 3, 4]).numpy(), context) == pytest.approx(
            [curve.time(r, context) for r in (1, 2, 3, 4)])


def test_the_length_bucket_is_measured_and_cached_apart(targets, cost_dir):
    target = targets["llama"]  # rotary positions: longer contexts than its config's 512 run all the same
    short = cost_curve(target, 1, context_limit=4096)
    long = cost_curve(target, 1, context_limit=4096, longest=1500)
    assert short.contexts == [64, 512] and long.contexts == [64, 512, 2048]
    assert len(list(cost_dir.glob("*.json"))) == 2
    assert cost_curve(target, 1, context_limit=4096, longest=1900).contexts == long.contexts  # the same bucket
    assert len(list(cost_dir.glob("*.json"))) == 2


@pytest.mark.parametrize("batch", [1, 3])
def test_a_batch_curve_times_the_batched_steps_mask(targets, batch):
    """A batch's curve is timed on the forward a batched step runs: the same 4D mask and positions as
    `step_inputs` gives rows of equal length verifying chains (the attention takes another code path
    without one: SmolLM2's one-row step at batch size 8 cost 158 ms unmasked against 112 masked); a single
    row's forwards take none, as a chain's step."""
    from specbench.engine.batch import step_inputs

    target = targets["llama"]
    seen: list[tuple[tuple[int, ...], dict]] = []
    hook = target.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((tuple(kwargs["input_ids"].shape), dict(kwargs))), with_kwargs=True)
    try:
        curve = measure_curve(target, batch, repeats=1, context_limit=512, contexts=[16])
    finally:
        hook.remove()
    steps = [(shape, kwargs) for shape, kwargs in seen if "logits_to_keep" not in kwargs]  # the prefill keeps one
    assert {shape[1] for shape, _ in steps} == set(curve.rows)
    for (b, n), kwargs in steps:
        if batch == 1:
            assert kwargs.get("attention_mask") is None and kwargs.get("position_ids") is None
            continue
        trees = [DraftTree.chain(torch.zeros(n - 1, dtype=torch.long))] * b
        _, mask, positions = step_inputs(trees, [0] * b, [16] * b, 16, torch.device("cpu"), target.dtype)
        assert torch.equal(kwargs["attention_mask"], mask), f"{n} rows: the mask differs from a batched step's"
        assert torch.equal(kwargs["position_ids"], positions)


def test_a_run_tells_the_budget_how_far_its_steps_reach(tiny_models, cost_dir, tmp_path, monkeypatch):
    """The runner prepares each budgeted method with the longest prompt (every turn's text) and every turn's
    answer: a two-turn question reaches max_new_tokens twice."""
    from specbench.engine import loop

    told = []
    curves = loop.policy_curves
    monkeypatch.setattr(loop, "policy_curves", lambda t, b, c, longest=None: told.append(longest) or curves(
        t, b, c, longest))
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    for tokens in (8, 40):
        done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "method=pld", "budget=auto",
                   "dataset=spec_bench", f"dataset.path={questions}", f"output_dir={tmp_path / str(tokens)}",
                   f"max_new_tokens={tokens}", "warmup=0", "progress=false", "task=[mt_bench,qa]",
                   "contention_threshold=1000", "baseline=false", cwd=tmp_path)
        assert done.code == 0, done
    assert len(told) == 2 and told[0] > 16
    assert told[1] - told[0] == 2 * (40 - 8)


def test_the_expected_tokens_follow_what_drafts_gave():
    """Chains that stand or fall whole (half accepted in full, half rejected at their first node):
    per-node chances calibrated on the run expect more than the chains give; the ratio of given to
    expected tokens (`yield_`) brings the policy's expectation to what was measured."""
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.0001 * rows))
    chain = confident_chain(6, 0.5)
    for i in range(300):
        path = list(range(6)) if i % 2 else []
        policy.observe(chain, Verdict(path, list(range(len(path))), 0))
    alone = float(policy.accept.node_probs(chain).sum())
    assert abs(alone - 3.0) > 0.3  # the per-node model alone: off by more than 10%
    assert policy.yield_ * alone == pytest.approx(3.0, rel=0.1)
    kept = policy.choose([chain], 10, [6], Plan("all", False))[0]
    assert kept.n == 6 and policy.rate_now * (0.01 + 0.0001 * 7) == pytest.approx(4.0, rel=0.1)


def test_a_verdict_is_weighed_against_the_expectation_the_choice_was_made_on():
    """Two rows of one step: the first row's verdict refreshes the acceptance model, so the second
    row's chances recomputed at its verdict are no longer those its width was chosen on. What the
    draft gave is set against `choose`'s own expectation (`yield_`'s ratio); a tree the forward
    reshaped (not the one chosen) is weighed by the model as it is then."""
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.0001 * rows))
    kept = policy.choose([confident_chain(4, 0.5), confident_chain(4, 0.5)], 10, [4, 4], Plan("all", False))
    assert [t.n for t in kept] == [4, 4]
    chosen = [float(policy.accept.node_probs(t).sum()) for t in kept]
    got, expected = policy.got, policy.expected
    policy.observe(kept[0], Verdict([0, 1, 2, 3], [0, 1, 2, 3], 0), 0)
    now = float(policy.accept.node_probs(kept[1]).sum())
    assert abs(now - chosen[1]) > 0.1  # the refresh moved the second row's chances
    policy.observe(kept[1], Verdict([], [], 0), 1)
    decay = policy.expected - TOKENS_DECAY * (TOKENS_DECAY * expected + chosen[0])
    assert decay == pytest.approx(chosen[1])
    assert policy.got == pytest.approx(TOKENS_DECAY * (TOKENS_DECAY * got + 4))
    reshaped = kept[1].select([0, 1])  # what a forward that cannot verify the tree would hand back
    before, model_now = policy.expected, float(policy.accept.node_probs(reshaped).sum())
    policy.observe(reshaped, Verdict([], [], 0), 1)
    assert policy.expected == pytest.approx(TOKENS_DECAY * before + model_now)


def test_the_steps_own_clock_overrules_the_models():
    """The models say drafting pays (sure chains, cheap verification); the measured steps say each
    drafted step took twice what was expected, plain steps what was expected. From that record the
    policy stops drafting; fed what was expected, it drafts on."""
    def run(slowdown: float) -> list[str]:
        policy = BudgetPolicy(batch_curve(4, 0.002))
        drafting_costs(policy, 0.0005)  # not CHEAP: drafting may stop
        rows = [confident_chain(6, 0.6) for _ in range(4)]
        plans = []
        for _ in range(400):
            plan = policy.plan(4, 10)
            plans.append(plan.rows)
            tokens = 4
            if plan.rows != "none":
                kept = policy.choose(rows, 10, [6] * 4, plan)
                tokens += sum(k.n for k in kept) // 2
            seconds = tokens / policy.rate_now * (slowdown if plan.rows != "none" else 1.0)
            policy.outcome(4, tokens)(seconds)
        return plans

    assert run(1.0)[-100:].count("all") == 100
    assert run(2.0)[-100:].count("none") > 90


def test_zero_nodes_is_a_choice_off_probes():
    """Nodes too unlikely for what a wider step costs: outside a probe nothing is verified (the step is
    the plain one); a probe still verifies the likeliest node (what is never verified is never learnt)."""
    tree = confident_chain(5, confidence=0.02)
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 * rows))
    assert policy.choose([tree], 10, [5], Plan("all", False))[0].n == 0
    assert policy.choose([tree], 10, [5], Plan("all", True))[0].n == 1


def test_one_width_for_the_batch():
    """Rows of a batch share the step's width (the forward pads to the longest block): a row with a
    sure chain buys a width the other rows fill with their own likeliest nodes, up to what they have."""
    sure, unsure, empty = confident_chain(6, 0.99), confident_chain(6, 0.3), DraftTree.empty()
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.03 + 0.001 * rows))
    policy.curve.batch = 3
    kept = policy.choose([sure, unsure, empty], 10, [6, 6, 0], Plan("all", True))
    assert kept[0].n == 6 and kept[1].n == 6 and kept[2].n == 0  # width bought by the sure row, free for the next
    steep = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.003 + 0.01 * rows))
    steep.curve.batch = 3
    kept = steep.choose([sure, unsure, empty], 10, [6, 6, 0], Plan("all", False))
    assert kept[0].n == kept[1].n < 6  # one width for both


def drafting_costs(policy: BudgetPolicy, seconds: float) -> None:
    for _ in range(200):  # the fit forgets the older costs
        policy.draft_fit.add(6.0, seconds)


def test_drafting_stops_where_it_does_not_pay_and_probes_ever_less():
    """A drafter that costs three plain steps per proposal and is rarely right: after its first
    GAIN_EVIDENCE proposals no row drafts, except one row at probes spaced 1, 2, 4, ... up to PROBE_MAX
    steps apart; when what it proposes becomes sure, every row drafts again."""
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.001 * rows))
    policy.curve.batch = 4
    drafting_costs(policy, 0.03)
    rows = [confident_chain(6, 0.05) for _ in range(4)]
    plans = []
    for _ in range(2000):
        plan = policy.plan(4, 10)
        plans.append(plan.rows)
        if plan.rows != "none":
            policy.choose(rows, 10, [6] * 4, plan)
    assert plans[:GAIN_EVIDENCE] == ["all"] * GAIN_EVIDENCE and plans[GAIN_EVIDENCE] != "all" and policy.gain < 1
    probes = [i for i, rows_ in enumerate(plans) if rows_ == "one"]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:4] == [2, 3, 5, 9] and max(gaps) == PROBE_MAX + 1 and gaps[-1] == PROBE_MAX + 1
    assert plans.count("none") > 0.95 * len(plans)
    sure = [confident_chain(6, 0.999) for _ in range(4)]
    drafting_costs(policy, 0.0001)
    for _ in range(2 * PROBE_MAX):
        plan = policy.plan(4, 10)
        if plan.rows != "none":
            policy.choose(sure, 10, [6] * 4, plan)
    assert policy.gain >= 1 and policy.plan(4, 10).rows == "all"


def test_while_drafting_pays_a_step_may_verify_nothing_until_a_probe_is_due():
    """Drafting pays, but a step's nodes do not: that step verifies none (its own choice, the plain
    step), and only after PROBE_EVERY such steps in a row does one verify its likeliest node."""
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.004 * rows))
    drafting_costs(policy, 0.0)
    for _ in range(GAIN_EVIDENCE):
        plan = policy.plan(1, 10)
        assert policy.choose([confident_chain(4, 0.99)], 10, [4], plan)[0].n > 0
    assert policy.drafting
    kept = []
    for _ in range(PROBE_EVERY + 2):
        policy.gain = 100.0  # drafting pays over the run: these few steps do not move that
        plan = policy.plan(1, 10)
        assert plan.rows == "all"
        kept.append(policy.choose([confident_chain(4, 0.01)], 10, [4], plan)[0].n)
    assert kept == [0] * PROBE_EVERY + [1, 0]


def test_a_cheap_drafter_always_proposes():
    """A drafter whose proposal costs under CHEAP of a plain step is asked every step even where
    nothing pays: the choice verifies nothing then (outside probes), at no cost."""
    policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.01 * rows))
    drafting_costs(policy, 0.0)
    for _ in range(50):
        plan = policy.plan(1, 10)
        assert plan.rows == "all"
        policy.choose([confident_chain(4, 0.01)], 10, [4], plan)
    assert policy.gain < 1


# --- sampling: pruned drafts keep the target's distribution --------------------------------------


class PolicyPrune:
    """The budget's choice (a curve steep enough that it prunes often), learning as it goes."""

    def __init__(self, slope: float = 0.0015) -> None:
        self.policy = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + slope * rows))
        self.proposed = self.kept = self.branched = 0

    def __call__(self, tree: DraftTree, prev: int, p_table: torch.Tensor) -> DraftTree:
        if tree.draft_probs is None:  # deterministic: the drafter's own confidence, its probability at the parent
            rows = [prev, *tree.tokens.tolist()]
            tree.confidence = torch.stack([p_table[rows[p + 1], t] for p, t in zip(tree.parents, tree.tokens)])
        kept = self.policy.select(tree, context=10)
        self.proposed, self.kept = self.proposed + tree.n, self.kept + kept.n
        self.branched += kept.n >= 2
        return kept

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.policy.observe(tree, verdict)


class DrawnValuePrune(PolicyPrune):
    """What the budget must not do: cut a sampled chain where a drawn token is unlikely under the draft."""

    def __call__(self, tree: DraftTree, prev: int, p_table: torch.Tensor) -> DraftTree:
        rows = [prev, *tree.tokens.tolist()]
        keep = []
        for i, token in enumerate(tree.tokens.tolist()):
            if float(p_table[rows[i], token]) < 0.3:
                break
            keep.append(i)
        return tree.select(keep)


@pytest.mark.parametrize("kind", ["chain", "iid", "without_replacement", "deterministic"])
def test_pruned_drafts_follow_the_target(kind):
    prune = PolicyPrune(slope=0.0008 if kind == "chain" else 0.0015)  # 3 chain nodes against 39 tree nodes
    counts, exact = sample_first_tokens(kind, PARAMS, verify_sampled, draws=3000, depth=3, shape=prune)
    assert prune.kept < 0.9 * prune.proposed and prune.branched > 100  # it pruned, and kept more than one node often
    assert chi_square_p(counts, exact) > 1e-3


def test_pruning_by_drawn_values_fails_the_same_test():
    counts, exact = sample_first_tokens("chain", PARAMS, verify_sampled, draws=3000, depth=3, shape=DrawnValuePrune())
    assert chi_square_p(counts, exact) < 1e-6


# --- end to end -------------------------------------------------------------------------------------


@pytest.fixture
def cost_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_COST_DIR", str(tmp_path / "costs"))
    return tmp_path / "costs"


@pytest.mark.parametrize("name", ["sps", "pld"])
def test_auto_and_fixed_emit_the_baseline_tokens(targets, drafts, cost_dir, name):
    """Greedy: the budget changes how much is verified, never what is emitted; `auto` records the
    proposal sizes it chose from, and measures its cost curve once (cached)."""
    target = targets["llama"]
    extra = {"draft": str(drafts["llama"]["noisy"])} if name == "sps" else {}
    results = {}
    for budget in ("auto", "fixed"):
        method = build_method(method_cfg(name, budget=budget, **extra), target, {})
        method.prepare(1)
        results[budget] = assert_matches_baseline(method, target)
    stats = [r.stats for r in results["auto"] if r.stats.get("steps")]
    assert stats and all(s["budget"] == "auto" for s in stats)
    assert all(v <= p for s in stats for v, p in zip(s["draft_lengths"], s["proposed_lengths"], strict=True))
    assert all("proposed_lengths" not in r.stats for r in results["fixed"])
    assert len(list(cost_dir.glob("*.json"))) == 1


def test_budget_setting_is_checked_and_labels_the_run(targets):
    with pytest.raises(SpecbenchError, match="budget must be one of auto, fixed"):
        build_method(method_cfg("pld", budget="half"), targets["llama"], {})
    with pytest.raises(SpecbenchError, match="has no setting 'budget'"):
        build_method(method_cfg("baseline", budget="auto"), targets["llama"], {})
    assert method_label(method_cfg("pld", budget="fixed")) == "pld-fixed"
    assert method_label(method_cfg("pld")) == "pld"


def test_both_budgets_take_turns_and_resume(tiny_models, cost_dir, tmp_path):
    """`budget=both`: one job answers every question with `auto` (filed under the method's name)
    and `fixed` (<name>-fixed), alternating which goes first, so the two see the same stretch of
    the machine's speed; each folder resumes on its own; the end-of-run summary shows both."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    args = ("run", "model=local", f"model.path={tiny_models['llama']}", "method=pld", "budget=both",
            "dataset=spec_bench", f"dataset.path={questions}", f"output_dir={out}", "max_new_tokens=8",
            "warmup=0", "progress=false", "task=[qa,rag,translation]", "contention_threshold=1000")
    done = cli(*args, cwd=tmp_path)
    assert done.code == 0, done
    assert "| pld vs baseline" not in done.out  # sanity of the check below: titles are headers
    assert "pld vs baseline" in done.out and "pld-fixed vs baseline" in done.out

    def answers(name):
        (path,) = out.rglob(f"{name}/temp-0/run-1/answers.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()]

    auto, fixed = answers("pld"), answers("pld-fixed")
    assert [r["question_id"] for r in auto] == [r["question_id"] for r in fixed] and len(auto) == 3
    stamps = sorted([(r["tstamp"], "auto", i) for i, r in enumerate(auto)]
                    + [(r["tstamp"], "fixed", i) for i, r in enumerate(fixed)])
    assert [(lane, i) for _, lane, i in stamps] == [("auto", 0), ("fixed", 0), ("fixed", 1), ("auto", 1),
                                                    ("auto", 2), ("fixed", 2)]
    assert [r["specbench"]["output_ids"] for r in auto] == [r["specbench"]["output_ids"] for r in fixed]
    assert all("proposed_lengths" in s for r in auto for s in r["specbench"]["stats"] if s.get("steps"))
    assert all("proposed_lengths" not in s for r in fixed for s in r["specbench"]["stats"])
    # a lane cut short resumes alone; the complete one is left as it was
    (path,) = out.rglob("pld-fixed/temp-0/run-1/answers.jsonl")
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:1]))
    kept = answers("pld")
    done = cli(*args, cwd=tmp_path)
    assert done.code == 0, done
    assert "pld run 1: all 3 answers already in" in done.err and "pld-fixed run 1: resuming, 1 answers kept" in done.err
    assert answers("pld") == kept and len(answers("pld-fixed")) == 3


def test_interleaved_methods_share_each_stretch_of_time(tiny_models, cost_dir, tmp_path):
    """`interleave=[...]`: the baseline, `method` and the listed methods (both budgets of each under
    `budget=both`) answer question 1 in a seeded random order, then question 2 in the reverse order, and so on,
    in one job;
    every answer equals the baseline's (greedy); the summary lists every method run."""
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "results"
    done = cli("run", "model=local", f"model.path={tiny_models['llama']}", "method=pld", "interleave=[samd,pld]",
               "budget=both", "dataset=spec_bench", f"dataset.path={questions}", f"output_dir={out}",
               "max_new_tokens=8", "warmup=0", "progress=false", "task=[qa,rag,translation]",
               "contention_threshold=1000", cwd=tmp_path)
    assert done.code == 0, done
    lanes = ["baseline", "pld", "pld-fixed", "samd", "samd-fixed"]
    answers = {}
    for name in lanes:
        (path,) = out.rglob(f"{name}/temp-0/run-1/answers.jsonl")
        answers[name] = [json.loads(line) for line in path.read_text().splitlines()]
    orders = turn_orders(len(lanes), 3, "shuffled", 0, 1)  # the default lane_order, seed 0, run 1
    for i in range(3):
        turn = sorted(lanes, key=lambda n: answers[n][i]["tstamp"])
        assert turn == [lanes[k] for k in orders[i]], (i, turn)
        if i:  # every method run answered question i - 1 before any answered question i
            assert max(answers[n][i - 1]["tstamp"] for n in lanes) < min(answers[n][i]["tstamp"] for n in lanes)
    base = [r["specbench"]["output_ids"] for r in answers["baseline"]]
    assert all([r["specbench"]["output_ids"] for r in answers[n]] == base for n in lanes)
    table = done.out.split("all questions, against the baseline")[1]
    assert all(f"\n| {n} " in table for n in lanes[1:]) and "\n| baseline " not in table


def test_interleave_names_known_methods(tmp_path):
    for value, problem in (("[nosuch]", "unknown method 'nosuch'"), ("[pld,3]", "unknown method '3'")):
        done = cli("run", f"interleave={value}", "progress=false", f"output_dir={tmp_path}", cwd=tmp_path)
        assert done.code != 0 and problem in done.err, done
