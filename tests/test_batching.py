"""Batched decoding: batch_size > 1 through the engine, the runner and the report.

Greedy: every row of a batch (static or continuous, any number of slots) emits exactly what the
same method emits one sequence at a time, with drafters built to break things (random chains,
multi-branch trees, aux rows) and real methods. Sampling: the first tokens of batched rows
follow the target's distribution (chi-square, as in test_lossless). The runner: answers,
timing shares and batch records; batch size 1 unchanged; refusals with one-line errors. The
report: a table per batch size, the batch-size table and figure, the audit against batch 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicLayer

from helpers import (
    EMPTY,
    GREEDY,
    PROMPTS,
    VOCAB,
    RandomChainDrafter,
    RandomTreeDrafter,
    accept_everything,
    baseline_tokens,
    chi_square_p,
    cli,
    exact_first_three,
    long_continuation,
    method_cfg,
    prompt_of,
    run,
    tiny_vocab_model,
    write_questions,
)
from specbench.analysis.runs import Run
from specbench.core.answers import EXTRA_KEY, read_answers
from specbench.core.sampling import SamplingParams, probs_from_logits
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine import SpeculativeMethod
from specbench.engine.api import Prefilled, Request, RequestList
from specbench.engine.batch import PREFILL_POSITIONS, PREFILL_SLACK, prefill_groups
from specbench.methods.drafts import SpsDrafter
from specbench.models import GrowingLayer, LoadedModel, load_model
from specbench.run.local import warmup_passes
from specbench.run.registry import build_method

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ["llama", "qwen2"]


@pytest.fixture(scope="module")
def targets(tiny_models) -> dict[str, LoadedModel]:
    return {arch: load_model(str(tiny_models[arch]), device=torch.device("cpu"), dtype=torch.float32)
            for arch in ARCHS}

MORE_PROMPTS = [*PROMPTS, ["tom has 3 boxes with 12 apples each so how many apples"], ["hi"],
                ["translate the sentence into another language please", "and summarize it"]]


def generate_batch(method, prompts: list[torch.Tensor], stops: list[StopCriteria], slots: int,
                   sampling: SamplingParams = GREEDY) -> list:
    requests = RequestList([Request(i, p, s) for i, (p, s) in enumerate(zip(prompts, stops, strict=True))])
    method.generate_batch(requests, slots, sampling, CpuTimer())
    assert sorted(requests.results) == list(range(len(prompts)))
    results = [requests.results[i] for i in range(len(prompts))]
    for result in results:
        assert len(result.tokens) == 1 + sum(result.accept_lengths) and all(a >= 1 for a in result.accept_lengths)
    return results


class TableTreeDrafter(RandomTreeDrafter):
    """RandomTreeDrafter whose continuation is looked up by prompt in `begin`: per row, since each
    row of a batch has its own prompt."""

    def __init__(self, table: dict[tuple[int, ...], list[int]], seed: int = 0) -> None:
        super().__init__([], seed)
        self.table = table

    def begin(self, state: Prefilled, sampling: SamplingParams) -> None:
        self.continuation = self.table[tuple(state.input_ids[0].tolist())]


def check_rows(method, target: LoadedModel, slots: int, lengths=(1, 9, 30)) -> None:
    """Every prompt x max_new_tokens as one row of one batched call, equal to the one-at-a-time answer."""
    prompts, stops = [], []
    for turns in MORE_PROMPTS:
        for max_new in lengths:
            prompts.append(prompt_of(target, turns))
            stops.append(StopCriteria.build(target.eos_ids, max_new))
    for prompt, stop, result in zip(prompts, stops, generate_batch(method, prompts, stops, slots), strict=True):
        assert result.tokens == baseline_tokens(target, prompt, stop)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("slots", [1, 3, 18])  # 18: every row at once (a static batch)
def test_batched_rows_equal_unbatched_answers(targets, arch, slots):
    target = targets[arch]
    table = {tuple(prompt_of(target, t)[0].tolist()): long_continuation(target, prompt_of(target, t), 40)
             for t in MORE_PROMPTS}
    for drafter in (RandomChainDrafter(int(target.model.config.vocab_size)), TableTreeDrafter(table)):
        check_rows(SpeculativeMethod(target, EMPTY, EMPTY, drafter=drafter), target, slots)
    check_rows(build_method(method_cfg("baseline"), target, EMPTY), target, slots)


@pytest.mark.parametrize("name", ["pld", "lookahead", "jacobi", "recycling", "samd"])
def test_training_free_methods_batch_losslessly(targets, name):
    target = targets["llama"]
    method = build_method(method_cfg(name), target, EMPTY)
    check_rows(method, target, slots=4)
    # the same method one sequence at a time after a batched call: forks left the original alone
    for turns in PROMPTS:
        stop = StopCriteria.build(target.eos_ids, 12)
        assert run(method, prompt_of(target, turns), stop).tokens == baseline_tokens(target, prompt_of(target, turns),
                                                                                     stop)


@pytest.mark.parametrize("name", ["self_spec", "hf_pld"])
def test_methods_that_cannot_batch_say_why(targets, name):
    method = build_method(method_cfg(name), targets["llama"], EMPTY)
    assert method.batch_problem
    with pytest.raises(Exception, match="cannot decode batches"):
        generate_batch(method, [prompt_of(targets["llama"], PROMPTS[0])], [StopCriteria.build((), 4)], 2)


@pytest.mark.parametrize("biased", [False, True])
def test_sampled_batched_rows_follow_the_target(biased):
    target, draft = tiny_vocab_model(0), tiny_vocab_model(1)
    params = SamplingParams(temperature=1.0)
    method = SpeculativeMethod(target, EMPTY, EMPTY, drafter=SpsDrafter(draft, num_tokens=3, vocab_size=VOCAB))
    if biased:  # the failing condition: a verifier that accepts every draft token
        method.verify_step = lambda tree, logits, s: accept_everything(tree, probs_from_logits(logits, s))
    prompt = [1, 3, 2]
    torch.manual_seed(0)
    draws = 1200
    results = generate_batch(method, [torch.tensor([prompt])] * draws, [StopCriteria.build((), 4)] * draws, 8, params)
    counts = torch.zeros(VOCAB, VOCAB, VOCAB)
    for result in results:
        counts[tuple(result.tokens[:3])] += 1
    p = chi_square_p(counts, exact_first_three(target, prompt, params))
    assert p < 1e-6 if biased else p > 1e-3


def test_growing_layer_behaves_like_a_dynamic_layer():
    torch.manual_seed(0)
    grow, plain = GrowingLayer(), DynamicLayer()
    for step in (5, 1, 70, 2, 300):
        k, v = torch.randn(3, 2, step, 4), torch.randn(3, 2, step, 4)
        for a, b in zip(grow.update(k, v), plain.update(k, v), strict=True):
            assert torch.equal(a, b)
    for layer in (grow, plain):
        layer.crop(-7)
        layer.keys[:, :, 10:12] = layer.keys[:, :, 20:22]  # in place through the view
        layer.keys, layer.values = layer.keys[:, :, :100], layer.values[:, :, :100]
        layer.batch_select_indices(torch.tensor([2, 0]))
    assert grow.get_seq_length() == plain.get_seq_length() == 100
    assert torch.equal(grow.keys, plain.keys) and torch.equal(grow.values, plain.values)
    grow.extend(120)
    assert grow.get_seq_length() == 120 and not grow.keys[:, :, 100:].any()


# --- the runner and the report ----------------------------------------------------------------


@pytest.fixture(scope="module")
def batched_runs(tiny_models, tmp_path_factory):
    """Answers of model=local at batch sizes 1 and 3 (continuous) and 2 (static), baseline and pld."""
    root = tmp_path_factory.mktemp("batched")
    questions = write_questions(root / "q.jsonl", per_category=2)
    out = root / "results"
    common = ["model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench", f"dataset.path={questions}",
              f"output_dir={out}", "max_new_tokens=24", "warmup=0", "progress=false", "task=all"]
    for extra in (["batch_size=1"], ["batch_size=3"], ["batch_size=2", "batch_mode=static"]):
        done = cli("run", "method=pld", *extra, *common, cwd=root)
        assert done.code == 0, done
    return root, out, common


def answers(out, method: str, batch: int) -> list[dict]:
    level = f"batch-{batch}/" if batch > 1 else ""
    return read_answers(out / "spec_bench" / "local" / method / "temp-0" / f"{level}run-1" / "answers.jsonl")


@pytest.mark.parametrize("batch", [2, 3])
def test_batched_answers_equal_batch_one_and_record_their_batch(batched_runs, batch):
    _, out, _ = batched_runs
    for method in ("baseline", "pld"):
        single = {r["question_id"]: r for r in answers(out, method, 1)}
        batched = answers(out, method, batch)
        assert sorted(r["question_id"] for r in batched) == sorted(single)
        sequences: dict[tuple, list] = {}
        for record in batched:
            extra = record[EXTRA_KEY]
            assert extra["output_ids"] == single[record["question_id"]][EXTRA_KEY]["output_ids"]
            assert len(extra["batch"]) == len(record["choices"][0]["turns"])
            for turn, info in enumerate(extra["batch"]):
                assert info["size"] == batch
                assert 0 <= info["queued"] <= info["admitted"] <= info["first"] <= info["finished"] <= info["wall_time"]
                assert info["latency"] == pytest.approx(info["finished"] - info["admitted"])
                sequences.setdefault((info["id"], info["wall_time"]), []).append(
                    (record["choices"][0]["wall_time"][turn], record["choices"][0]["new_tokens"][turn], info))
        for (_, wall), rows in sequences.items():  # shares add up to the sequence's time and tokens
            assert sum(r[0] for r in rows) == pytest.approx(wall)
            assert sum(r[1] for r in rows) == rows[0][2]["tokens"]
    static = [info for r in answers(out, "pld", 2) for info in r[EXTRA_KEY]["batch"]]
    assert {i["mode"] for i in static} == {"static"} and max(i["questions"] for i in static) == 2
    assert all("batch" not in r[EXTRA_KEY] for r in answers(out, "pld", 1))  # batch size 1 as before


def test_report_adds_the_batch_table_and_figure_and_audits_against_batch_one(batched_runs):
    root, out, _ = batched_runs
    done = cli("report", str(out), "--out", str(root / "board"), cwd=root)
    assert done.code == 0, done
    assert "Batch sizes: spec_bench / local / temperature 0" in done.out
    for name in ("spec_bench-local-batch.md", "spec_bench-local-batch.csv", "spec_bench-local-batch.png",
                 "spec_bench-local-batch.svg", "spec_bench-local-batch-3.md", "spec_bench-local-batch-2.md"):
        assert (root / "board" / name).is_file(), name
    rows = (root / "board" / "spec_bench-local-batch.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 3  # baseline and pld at 1, 2, 3
    assert all(f"{name}_p{q}" in rows[0] for name in ("ttft", "tpot") for q in (50, 90, 99))
    summary = (root / "board" / "spec_bench-local-batch.md").read_text()
    assert "TTFT s p50 / p90 / p99" in summary and "Crossover" in summary
    table = (root / "board" / "spec_bench-local-batch-3.md").read_text()
    line = next(row for row in table.splitlines() if row.startswith("| pld ") and "equal" in row)
    assert "14/14 equal" in line  # 14 questions, compared with the batch-1 baseline
    assert "Speedup and throughput against batch size" in (root / "board" / "index.html").read_text()


def test_batched_greedy_answers_without_a_batch_one_baseline_say_why_they_are_not_audited(batched_runs, tmp_path):
    import shutil

    root, out, _ = batched_runs
    copy = tmp_path / "answers"
    shutil.copytree(out, copy)
    singles = [d for d in copy.rglob("run-*") if d.is_dir() and d.parent.name.startswith("temp-")]
    assert singles  # batch size 1 files beside the batch-N folders
    for folder in singles:
        shutil.rmtree(folder)
    done = cli("report", str(copy), "--out", str(tmp_path / "board"), cwd=root)
    assert done.code == 0, done
    line = next(row for row in (tmp_path / "board" / "spec_bench-local-batch-3.md").read_text().splitlines()
                if row.startswith("| pld ") and "n/a" in row)
    assert "n/a (no batch-1 baseline)" in line and "sampled" not in line
    assert "no batch-1 baseline answers, so the batched answers are not audited" in done.out + done.err


@pytest.mark.parametrize(("extra", "message"), [
    (["method=self_spec", "batch_size=2"], "method 'self_spec' cannot run batched: it drafts through the target"),
    (["batch_size=0"], "batch_size must be a positive integer"),
    (["batch_size=2", "batch_mode=dynamic"], "batch_mode must be one of continuous, static"),
    (["batch_size=2", "batch_queue=0"], "batch_queue must be a positive integer"),
])
def test_bad_batch_settings_get_one_line_errors(batched_runs, extra, message):
    root, _, common = batched_runs
    done = cli("run", *common, *extra, "baseline=false", cwd=root)
    assert done.code != 0 and message in done.err, done
    assert len([line for line in done.err.strip().splitlines() if line.startswith("error")]) == 1


def test_serving_numbers_and_crossovers():
    """TTFT from a turn's arrival to its first token (batch size 1: its prefill), TPOT per token after
    the first, nearest-rank percentiles; a crossover is the first batch size below the baseline after
    one above it."""
    from specbench.analysis.batching import BatchPoint, crossovers, percentiles, turn_latencies

    batched = {"choices": [{"new_tokens": [11, 1], "wall_time": [0.4, 0.1]}],
               EXTRA_KEY: {"batch": [{"queued": 0.0, "admitted": 0.5, "first": 0.7, "finished": 1.7},
                                     {"queued": 2.0, "admitted": 2.0, "first": 2.3, "finished": 2.3}]}}
    assert list(turn_latencies(batched)) == [(pytest.approx(0.7), pytest.approx(0.1)), (pytest.approx(0.3), None)]
    single = {"choices": [{"new_tokens": [5], "wall_time": [1.0]}], EXTRA_KEY: {"prefill_time": [0.2]}}
    assert list(turn_latencies(single)) == [(0.2, pytest.approx(0.2))]
    assert percentiles([float(i) for i in range(1, 101)]) == (50.0, 90.0, 99.0)
    assert percentiles([]) is None

    def point(method, batch, speedup):
        return BatchPoint(method, batch, 1, 1.0, speedup, 0.0, 0.0, 1.0, None)

    points = [point("a", 1, 1.3), point("a", 2, 1.1), point("a", 4, 0.8), point("a", 8, 1.2),
              point("b", 1, 0.9), point("b", 2, 0.7), point("c", 1, 1.2), point("c", 2, 1.0)]
    assert crossovers(points) == {"a": 4}  # b was never faster, c never fell below


def test_the_batch_sweep_preset_lists_the_sizes():
    from specbench.core.resources import CONFIG_DIR

    assert "batch_size: 1,2,4,8,16" in (CONFIG_DIR / "sweep" / "batch.yaml").read_text()


@pytest.mark.parametrize("seed", range(5))
def test_prefill_groups_bound_padding_and_positions(seed):
    """Every prompt in one group; a group of several pads within PREFILL_SLACK of its real positions and
    fits PREFILL_POSITIONS; groups come shortest first, each in index order."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 3000, (40,), generator=gen).tolist() + [9000, 3, 3]
    groups = prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert g == sorted(g)
        longest = max(lengths[i] for i in g)
        if len(g) > 1:
            assert len(g) * longest <= (1 + PREFILL_SLACK) * sum(lengths[i] for i in g)
            assert len(g) * longest <= PREFILL_POSITIONS
    tops = [max(lengths[i] for i in g) for g in groups]
    assert tops == sorted(tops) and len(groups) > 1


def test_admitted_prompts_are_prefilled_in_groups_of_like_length(targets, monkeypatch):
    """Prompts of very different lengths admitted at once are not padded to the longest in one forward:
    each prefill forward pads within PREFILL_SLACK (or holds one prompt), and the answers stay the
    one-at-a-time ones."""
    import specbench.engine.batch as batch_module

    calls = []
    real_prefill = batch_module.prefill_batch

    def recording(target, prompts, *args, **kwargs):
        calls.append([int(p.shape[1]) for p in prompts])
        return real_prefill(target, prompts, *args, **kwargs)

    monkeypatch.setattr(batch_module, "prefill_batch", recording)
    target = targets["llama"]
    check_rows(build_method(method_cfg("baseline"), target, EMPTY), target, 18, lengths=(9,))
    assert sorted(n for call in calls for n in call) == sorted(int(prompt_of(target, t).shape[1]) for t in MORE_PROMPTS)
    assert len(calls) > 1
    for call in calls:
        assert len(call) == 1 or len(call) * max(call) <= (1 + PREFILL_SLACK) * sum(call)


def _batched_run(method: str, ratios: list[float], size: int = 15) -> Run:
    """A run of len(ratios) batches of `size` questions; batch k's tokens/s is ratios[k] x 100 (every
    answer of a batch its share of the batch's clock)."""
    records = []
    for k, ratio in enumerate(ratios):
        for j in range(size):
            qid = k * size + j
            records.append({"question_id": qid, "category": "qa",
                            "choices": [{"new_tokens": [10 + j], "wall_time": [(10 + j) / (100 * ratio)],
                                         "accept_lengths": [1] * (9 + j)}],
                            EXTRA_KEY: {"batch": [{"id": k * size, "size": size}]}})
    return Run("d", "m", method, 0.0, 1, records, batch=size)


def test_a_batchs_answers_are_one_measurement_in_the_speedup_intervals():
    """Questions decoded in one batch share its clock: the intervals resample batches whole. Four batches
    timed at 0.8-1.2x the baseline's (every answer of a batch alike) leave the interval wide, where
    sixty questions taken as sixty measurements would make it narrow."""
    from specbench.analysis.batching import throughput_ci
    from specbench.analysis.frame import bootstrap_ratio_ci, speedups, tidy

    ratios = [0.8, 1.05, 0.95, 1.2]
    base, ours = _batched_run("baseline", [1.0] * 4), _batched_run("pld", ratios)
    overall = speedups(tidy([base, ours])).loc[("pld", "overall")]
    assert overall["ci_low"] < 0.9 and overall["ci_high"] > 1.1, overall
    per_question = bootstrap_ratio_ci(np.repeat([80.0, 105.0, 95.0, 120.0], 15), np.full(60, 100.0))
    assert per_question[0] > 0.95 and per_question[1] < 1.05  # the same numbers as 60 units: too sure
    low, high = throughput_ci([ours], [base])
    assert low < 0.9 and high > 1.1
    one = _batched_run("pld", [1.0] * 4, size=1)  # batches of one: each question its own unit, as before
    assert bootstrap_ratio_ci(np.arange(1.0, 9.0), np.full(8, 4.0), clusters=np.arange(8)[::-1]) == \
        bootstrap_ratio_ci(np.arange(1.0, 9.0), np.full(8, 4.0))
    assert throughput_ci([one], [_batched_run("baseline", [1.0] * 4, size=1)]) == (1.0, 1.0)


def test_warm_up_answers_warmup_questions_as_whole_batches(batched_runs, tiny_models):
    """`warmup` counts questions: ceil(warmup / batch_size) untimed passes over the first batch (3 passes of one
    question at batch size 1, as upstream; one pass of 16 at 16, not three), recorded in each lane's meta."""
    assert [warmup_passes(3, b) for b in (1, 2, 3, 4, 16)] == [3, 2, 1, 1, 1]
    assert warmup_passes(0, 8) == 0 and warmup_passes(5, 2) == 3
    root, out, common = batched_runs
    meta = json.loads((out / "spec_bench" / "local" / "pld" / "temp-0" / "batch-3" / "run-1" / "meta.json").read_text())
    assert meta["warmup"] == {"passes": 0, "questions": 0, "seconds": 0.0}  # warmup=0: none
    warm = root / "warm"
    done = cli("run", "method=pld", "batch_size=3", "warmup=4", *[c for c in common if not c.startswith(
        ("warmup=", "output_dir="))], f"output_dir={warm}", "task=[qa,rag]", cwd=root)
    assert done.code == 0, done
    for method in ("baseline", "pld"):
        run = warm / "spec_bench" / "local" / method / "temp-0" / "batch-3" / "run-1"
        meta = json.loads((run / "meta.json").read_text())
        assert meta["warmup"]["passes"] == 2 and meta["warmup"]["questions"] == 6 and meta["warmup"]["seconds"] > 0
        cold = {r["question_id"]: r[EXTRA_KEY]["output_ids"] for r in answers(out, method, 3)}
        assert all(r[EXTRA_KEY]["output_ids"] == cold[r["question_id"]] for r in read_answers(run / "answers.jsonl"))
