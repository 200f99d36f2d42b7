"""The lossless audit in half precision: the spread a run measures for its dtype, the noise floor
(`method=noise`), the precision-aware verdicts, and the controls: a verifier that emits the target's
second choice now and then is a bug in bfloat16 and float16; random drafts, exact in float32, are not."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import cli, write_questions
from specbench.analysis.audit import NOISE, above_floor, is_bug, lossless_audit, wilson
from specbench.analysis.runs import Run
from specbench.engine.precision import measure_spread
from specbench.models import load_model
from specbench.presentation import leaderboard

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
#: the tiny random Llama's head scaled so that its top-2 gaps are a few logits (a trained model's
#: regime), not the hundredths of a random init, which half precision would blur everywhere
SHARPEN = 40.0

WRONG_PY = '''
from specbench.engine.verifier import Verdict, verify
from specbench.methods.noise import Noise


class SecondChoice(Noise):
    """A broken verifier: every 4th step emits the target's second choice instead of its first."""

    calls = 0

    def verify_step(self, tree, logits, sampling):
        verdict = verify(tree, logits, sampling)
        self.calls += 1
        if sampling.greedy and self.calls % 4 == 0:
            second = int(logits[verdict.rows[-1]].float().topk(2).indices[1])
            return Verdict(verdict.path, verdict.tokens, second)
        return verdict
'''
WRONG_YAML = """defaults:
  - noise
  - _self_

name: wrong
impl: wrong.SecondChoice
rows: [1, 4]
suites: [tests]
"""


@pytest.fixture(scope="module")
def sharp_model(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharp")
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPEN)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_models["llama"]).save_pretrained(folder)
    return folder


def prompts(n=2, length=12, vocab=300):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(4, vocab, (1, length), generator=gen) for _ in range(n)]


def test_the_spread_is_measured_in_the_run_dtype(sharp_model):
    spreads = {}
    for dtype in (torch.float32, torch.bfloat16):
        target = load_model(str(sharp_model), device=CPU, dtype=dtype)
        found = measure_spread(target, prompts(), new_tokens=16, blocks=(2, 8))
        assert found["dtype"] == str(dtype).removeprefix("torch.") and found["device"] == "cpu"
        assert found["positions"] == 2 * 15 * 3  # 2 prompts x 15 scored steps x (2 chain shapes + the tree mask)
        assert found["shapes"] == ["2 rows", "8 rows", "8 rows, tree mask"]
        spreads[dtype] = found
    assert spreads[torch.float32]["spread"] < 1e-3 and spreads[torch.float32]["flips"] == 0
    # bfloat16 resolves a logit of a few units to ~0.02: its shapes disagree far beyond float32's last bits
    assert spreads[torch.bfloat16]["spread"] > 100 * max(spreads[torch.float32]["spread"], 1e-6)


def test_wilson_interval():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def fake_run(method, outputs, margins, spread=None, dtype="bfloat16"):
    records = [{"question_id": q, "choices": [{"turns": ["x"], "accept_lengths": [1]}],
                "specbench": {"output_ids": [ids], "stats": [{"top2_margin": margins}]}} for q, ids in outputs.items()]
    meta = {"identity": {"dtype": dtype}}
    if spread is not None:
        meta["precision"] = {"spread": spread, "dtype": dtype}
    return Run("d", "m", method, 0.0, 1, records, meta)


def test_the_near_tie_margin_is_the_measured_spread_when_larger():
    base = {1: [5, 6, 7, 8], 2: [5, 6, 7, 8]}
    ours = {1: [5, 6, 9, 8], 2: [5, 6, 7, 8]}  # question 1 leaves the baseline at token 2, margin 0.25 there
    margins = [3.0, 2.0, 0.25, 1.0]
    measured = lossless_audit([fake_run("pld", ours, margins, spread=0.3)], [fake_run("baseline", base, margins,
                                                                                      spread=0.3)], 0.05)
    (m,) = measured["mismatches"]
    assert m["near_tie"] and m["tie_margin"] == 0.3 and not is_bug(m)
    assert "measured bfloat16 spread 0.3" in measured["rule"]
    assert measured["rate"] == 0.5 and measured["interval"] == wilson(1, 2)
    assert measured["tokens"] == 3 + 4 and measured["token_rate"] == 1 / 7  # up to the divergence, then all of q2
    # without a measured spread (runs of older versions) the fixed margin applies: not a near-tie
    fixed = lossless_audit([fake_run("pld", ours, margins)], [fake_run("baseline", base, margins)], 0.05)
    (m,) = fixed["mismatches"]
    assert not m["near_tie"] and is_bug(m) and "no measured spread" in fixed["rule"]
    # a method wholly above the noise floor stands out; one within it does not
    floor = {"compared": 60, "equal": 58, "interval": wilson(2, 60)}
    assert above_floor({"compared": 60, "equal": 30, "interval": wilson(30, 60)}, floor)
    assert not above_floor({"compared": 60, "equal": 57, "interval": wilson(3, 60)}, floor)
    # in half precision most answers diverge somewhere: per token compared, a method that diverges early stands out
    floor = {"compared": 60, "equal": 10, "interval": wilson(50, 60), "tokens": 3000,
             "token_interval": wilson(50, 3000)}
    early = {"compared": 60, "equal": 5, "interval": wilson(55, 60), "tokens": 600, "token_interval": wilson(55, 600)}
    assert early["interval"][0] < floor["interval"][1] and above_floor(early, floor)


@pytest.fixture(scope="module")
def half_runs(sharp_model, tmp_path_factory):
    """bfloat16 and float16 runs of the sharpened tiny Llama: the baseline, the noise floor and the
    wrong verifier in turn, then `report --recheck`'s groups."""
    out = {}
    for dtype in ("bfloat16", "float16"):
        root = tmp_path_factory.mktemp(dtype)
        write_questions(root / "q.jsonl", per_category=2)
        (root / "methods").mkdir()
        (root / "methods" / "wrong.py").write_text(WRONG_PY, encoding="utf-8")
        (root / "methods" / "wrong.yaml").write_text(WRONG_YAML, encoding="utf-8")
        done = cli("run", "model=local", f"model.path={sharp_model}", "dataset=spec_bench", "dataset.path=q.jsonl",
                   "output_dir=results", "max_new_tokens=40", "warmup=0", "progress=false", f"dtype={dtype}",
                   "method=baseline", f"interleave=[{NOISE},wrong]", "contention_threshold=1000", cwd=root)
        assert done.code == 0, done
        assert f"precision: {dtype} on cpu: one-row vs multi-row forwards move a top-2 logit gap" in done.err
        groups = leaderboard.build(root / "results", root / "lb", figures=False, recheck=True).groups
        (group,) = groups
        out[dtype] = (root, group)
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_wrong_verifier_is_a_bug_in_half_precision(half_runs, dtype):
    root, group = half_runs[dtype]
    audits = {r.method: r.audit for r in group.results}
    wrong = audits["wrong"]
    assert wrong["mismatches"] and wrong["dtype"] == dtype
    verdicts = [m["recheck"] for m in wrong["mismatches"]]
    assert verdicts.count("bug") > len(verdicts) / 2, wrong["mismatches"]  # a second choice is rarely a near-tie
    assert all(is_bug(m) == (m["recheck"] == "bug") for m in wrong["mismatches"])
    meta = json.loads(next((root / "results").rglob("meta.json")).read_text(encoding="utf-8"))
    assert meta["precision"]["dtype"] == dtype and meta["precision"]["spread"] > 0
    md = next((root / "lb").glob("*.md")).read_text(encoding="utf-8")
    assert "## Lossless audit" in md and f"{NOISE} (noise floor)" in md


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_random_drafts_are_never_a_bug_in_half_precision(half_runs, dtype):
    """The noise lane verifies correctly (random drafts, every token the target's own): whatever of its
    answers leaves the baseline's in half precision is explained by that precision."""
    _, group = half_runs[dtype]
    noise = next(r.audit for r in group.results if r.method == NOISE)
    assert noise["compared"] > 0
    assert not [m for m in noise["mismatches"] if m["recheck"] == "bug" or is_bug(m)], noise["mismatches"]
    if dtype == "bfloat16":  # the control has something to judge: bf16 moves some of its answers
        assert noise["mismatches"] and all(m["recheck"] in ("numerical", "baseline off") for m in noise["mismatches"])

