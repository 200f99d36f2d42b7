"""One result whatever the path: every built-in method on the zoo, greedy, at batch size 1 gives the
same tokens, the same accepted length at every step and the same number of steps

- in process, through `decode` (one row on its own cache) and through `generate_batch` with one slot
  (the batched forward on a shared cache): both are the engine's one step (engine.decode), with
  another forward;
- through the CLI, each method timed alone (`schedule=sequential`, one phase per method: a plain run)
  and all of them in one interleaved job with the baseline (`run batch_size=1` is that same decode);
- the zoo card's greedy answers are the baseline's decode.

budget=fixed: the presets, whose choices do not follow measured timings."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from helpers import cli
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



def test_the_zoo_card_answers_as_the_baseline_does(zoo):
    """The zoo card's greedy answers (its EOS and quality floors) are the baseline's own decode: the
    shared step with an empty draft, on the bare model."""
    from specbench.zoo import card

    target, model_cfg, prompts = zoo
    baseline = registry.build_method(compose_method("baseline"), target, model_cfg)
    eos = target.tokenizer.eos_token_id
    for prompt in prompts:
        want = baseline.decode(baseline.prefill(prompt, GREEDY), GREEDY, StopCriteria.build([eos], 40), CpuTimer())
        assert card.greedy(target.model, prompt[0].tolist(), eos, 40) == want.tokens

def answers_by_lane(out) -> dict[str, dict[int, tuple]]:
    """Per answer folder (lane): question id -> (tokens, accepted lengths, steps per turn)."""
    found = {}
    for path in out.rglob("answers.jsonl"):
        lane = path.parent.parent.parent.name
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        found[lane] = {r["question_id"]: (r["specbench"]["output_ids"], r["choices"][0]["accept_lengths"],
                                          r["choices"][0]["decoding_steps"]) for r in rows}
    return found


def test_every_method_alone_and_interleaved_gives_the_same_answers(tmp_path):
    """Every built-in in one interleaved job with the baseline, then each alone (sequential): per method
    and question the same tokens, accepted lengths and steps, and every method's tokens are the
    baseline's (greedy: lossless), except the one lossy option's."""
    methods = ",".join(n for n in BUILTINS if n != "baseline")
    jobs = {}
    for schedule in ("interleaved", "sequential"):
        out = tmp_path / schedule
        done = cli("run", "method=baseline", f"interleave=[{methods}]", f"schedule={schedule}", "budget=fixed",
                   "task=all", "limit=1", "max_new_tokens=24", "warmup=0", "progress=false",
                   "contention_threshold=1000", f"output_dir={out}", cwd=tmp_path)
        assert done.code == 0, done
        jobs[schedule] = answers_by_lane(out)
    interleaved, sequential = jobs["interleaved"], jobs["sequential"]
    assert len(interleaved) == len(BUILTINS) and interleaved.keys() == sequential.keys(), sorted(interleaved)
    baseline = {q: tokens for q, (tokens, _, _) in interleaved["baseline"].items()}
    assert len(baseline) == 6
    lossy = {f"{n}-fixed" for n in BUILTINS if str(compose_method(n).facts.verification).startswith("LOSSY")}
    assert lossy == {"specdec_lossy-fixed"}, lossy  # the one lossy option, labelled so
    for lane, answers in interleaved.items():
        assert answers == sequential[lane], lane
        if lane not in lossy:
            assert {q: tokens for q, (tokens, _, _) in answers.items()} == baseline, lane
        for tokens, accepted, steps in answers.values():
            assert len(tokens) + sum(accepted) == sum(len(t) for t in tokens) and len(accepted) == sum(steps), lane


# --- the draft budget's skips: a drafter asked for nothing mid-answer catches up ------------------


class Skipping:
    """A draft budget that skips on a fixed pattern: every third step no row drafts, every third one
    row only (in a batch), else all; it verifies all that is proposed and sets drafters no
    thresholds (their presets), so what they propose depends on the skips alone."""

    def __init__(self, skip: bool = True) -> None:
        from specbench.engine.budget import BudgetPolicy, CostCurve

        self.inner = BudgetPolicy(CostCurve.synthetic(lambda rows: 0.01 + 0.001 * rows))
        self.skip, self.steps = skip, 0

    def plan(self, live, context):
        from specbench.engine.budget import Plan

        self.steps += 1
        if self.skip and self.steps % 3 == 1:
            return Plan("none", False)
        if self.skip and self.steps % 3 == 2:
            return Plan("one", True, self.steps % live)
        return Plan("all", True)

    def budget(self):
        return None

    def choose(self, trees, context, works, plan):
        return trees

    def __getattr__(self, name):  # the clock's and the verdicts' hooks
        return getattr(self.inner, name)


def recorded(drafter, seen: dict) -> None:
    """Record each proposal the drafter makes (generated length -> tokens, parents)."""
    propose = drafter.propose

    def wrapped(ctx):
        tree = propose(ctx)
        if ctx.max_depth > 0:
            seen[len(ctx.tokens)] = (tuple(tree.tokens.tolist()), tree.parents)
        return tree

    drafter.propose = wrapped


#: drafters whose proposal depends on what they saw at earlier steps, not on the text alone
STATEFUL = {"lookahead", "lookahead_cpu", "jacobi", "recycling", "online_spec", "noise"}


@pytest.mark.parametrize("name", [n for n in BUILTINS if n not in ("baseline", "hf_assisted", "hf_pld")])
def test_skipped_steps_keep_answers_and_drafts(zoo, name):
    """Steps on which the budget drafts nothing (max_depth 0), for every row or all but one: every
    answer is still the baseline's (batch size 1 and batches of 3), and a drafter that proposes from
    the text alone proposes after skips exactly what it proposes without them, at every length
    both runs drafted at (its state caught up; a chain's length may follow its own schedule)."""
    target, model_cfg, prompts = zoo
    method = registry.build_method(fixed(name), target, model_cfg)
    if not hasattr(method, "policies"):
        pytest.skip(f"{name} has no draft budget")
    method.budget_mode = "auto"  # the policies below stand in for the measured one
    baseline = registry.build_method(compose_method("baseline"), target, model_cfg)
    stop = StopCriteria.build(target.eos_ids, 40)
    want = [baseline.decode(baseline.prefill(p, GREEDY), GREEDY, stop, CpuTimer()).tokens for p in prompts]
    lossy = str(compose_method(name).facts.verification).startswith("LOSSY")
    proposals = {}
    for skip in (True, False):
        method.reset()
        method.policies = {1: Skipping(skip), 3: Skipping(skip)}
        seen: dict = {}
        recorded(method.drafter, seen)
        results = [method.decode(method.prefill(p, GREEDY), GREEDY, stop, CpuTimer()) for p in prompts[:1]]
        del method.drafter.propose
        proposals[skip] = seen
        if not lossy:
            assert results[0].tokens == want[0], (name, skip)
        if skip:
            assert results[0].stats["budget_skipped"] > 0
    common = proposals[True].keys() & proposals[False].keys()
    assert common, name
    if name not in STATEFUL:
        for length in sorted(common):
            (one, one_parents), (other, other_parents) = proposals[True][length], proposals[False][length]
            if one_parents == tuple(range(-1, len(one) - 1)) and other_parents == tuple(range(-1, len(other) - 1)):
                n = min(len(one), len(other))  # chains: their lengths may follow a schedule (SpS's K)
                one, other = one[:n], other[:n]
            else:
                one, other = (one, one_parents), (other, other_parents)
            assert one == other, (name, length)
    if method.batch_problem is None and not lossy:
        method.reset()
        method.policies = {3: Skipping()}
        requests = RequestList([Request(i, p, stop) for i, p in enumerate(prompts)])
        method.generate_batch(requests, 3, GREEDY, CpuTimer())
        assert [requests.results[i].tokens for i in range(len(prompts))] == want, name
