"""Every method on the embedded default (the zoo), end to end: greedy output equals the
baseline's token for token on a trained model, and the report sees every method."""

import shutil

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.analysis import report
from specbench.core.resources import CONFIG_DIR
from specbench.run import runner
from specbench.run.config import options
from specbench.run.registry import method_label

METHODS = [m for m in options("method") if m != "baseline"]
LOSSY = ["specdec_lossy"]  # labelled lossy options: audited, expected to differ
#: the name each method's answers are reported under (`<name>-fixed` where its YAML keeps budget: fixed)
LABEL = {m: method_label(OmegaConf.load(CONFIG_DIR / "method" / f"{m}.yaml")) for m in ["baseline", *METHODS]}


@pytest.fixture(scope="module")
def answers_dir(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("embedded")
    for method in ["baseline", *METHODS]:
        zoo_run(out, f"method={method}")
    return out


def zoo_run(out, *overrides: str) -> None:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            *overrides, "task=all", "limit=1", "max_new_tokens=40", "warmup=0", "progress=false",
            f"output_dir={out}", f"dataset.path={out / 'question.jsonl'}"])
    runner.run(cfg)


@pytest.fixture(scope="module")
def results(answers_dir):
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(answers_dir))]
    return group


#: methods whose drafters hold trained parts (draft models, heads, a datastore): batched on the zoo
BATCHED = ["sps", "eagle", "eagle2", "eagle3", "medusa", "hydra", "specinfer", "specdec", "rest"]


def test_trained_drafters_batch_losslessly_on_the_zoo(answers_dir, tmp_path):
    """Batch size 3 (continuous: 6 questions and a second turn through 3 slots) against the batch-1
    baseline: every answer equal, token for token."""
    out = tmp_path / "batched"
    shutil.copytree(answers_dir / "synthetic" / "tiny" / "baseline", out / "synthetic" / "tiny" / "baseline")
    zoo_run(out, "method=baseline", "batch_size=3")
    for method in BATCHED:
        zoo_run(out, f"method={method}", "batch_size=3", "baseline=false")
    groups = [report.analyse(g) for g in report.group_runs(report.load_runs(out))]
    (batched,) = [g for g in groups if g.batch == 3]
    assert {r.method for r in batched.results} == {LABEL[m] for m in ["baseline", *BATCHED]}
    for result in batched.results:
        assert result.audit["compared"] == 6 and result.audit["equal"] == 6, (result.method, result.audit)


@pytest.mark.parametrize("method", [m for m in METHODS if m not in LOSSY])
def test_method_is_lossless_on_the_zoo(results, method):
    result = next(r for r in results.results if r.method == LABEL[method])
    audit = result.audit
    assert audit["compared"] == 6 and audit["equal"] == 6, audit["mismatches"]
    assert result.rows["overall"]["mean_accepted"] >= 1.0


def test_the_lossy_option_is_audited_not_hidden(results):
    """SpecDec's top-beta tolerance accepts tokens the target would not emit: the audit compares its
    answers with the baseline's and reports the differences (none may be called a near-tie match)."""
    lossy = next(r for r in results.results if r.method == "specdec_lossy")
    exact = next(r for r in results.results if r.method == "specdec")
    assert lossy.audit["compared"] == 6 and lossy.audit["equal"] < 6, lossy.audit
    assert exact.audit["equal"] == exact.audit["compared"] == 6, exact.audit
    # (#mean accepted of the two is not compared: both run budget=auto, whose choice follows the steps' clock)


def test_report_sees_every_method(results):
    assert {r.method for r in results.results} == set(LABEL.values())
    assert not results.problems


def test_check_catches_a_method_made_worse(tmp_path):
    """The regression check on real runs: unchanged code passes, a crippled PLD (one-token
    drafts) fails on #mean accepted tokens, with exit code 1."""
    from helpers import cli

    # budget=fixed, as `check --quick`: the gate is on exact acceptance, which auto's timing-driven choice is not
    args = ["task=[summarization,rag]", "limit=1", "max_new_tokens=48", "warmup=0", "progress=false", "budget=fixed"]
    ref, now, worse = (tmp_path / name for name in ("ref", "now", "worse"))
    for out, extra in ((ref, []), (now, []), (worse, ["method.num_pred_tokens=1"])):
        done = cli("run", "method=pld", f"output_dir={out}", f"dataset.path={tmp_path / 'q.jsonl'}", *args, *extra,
                   cwd=tmp_path)
        assert done.code == 0, done
    check = ["check", "--reference", str(tmp_path / "reference")]
    updated = cli(*check, "--results", str(ref), "--update", cwd=tmp_path)
    assert updated.code == 0, updated
    same = cli(*check, "--results", str(now), "tolerance.speedup_rel_min=0.6", cwd=tmp_path)
    assert same.code == 0, same.out
    bad = cli(*check, "--results", str(worse), "tolerance.speedup_rel_min=0.6", cwd=tmp_path)
    assert bad.code == 1
    assert any("pld" in line and "#mean accepted" in line and "REGRESSED" in line for line in bad.out.splitlines())
