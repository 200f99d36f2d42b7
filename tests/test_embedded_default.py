"""Every method on the embedded default (the zoo), end to end: greedy output equals the
baseline's token for token on a trained model, and the report sees every method."""

import pytest
from hydra import compose, initialize_config_dir

from specbench import report, runner
from specbench.config import CONFIG_DIR, options

METHODS = [m for m in options("method") if m != "baseline"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("embedded")
    for method in ["baseline", *METHODS]:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[
                f"method={method}", "task=all", "limit=1", "max_new_tokens=40", "warmup=0", "progress=false",
                f"output_dir={out}", f"dataset.path={out / 'question.jsonl'}"])
        runner.run(cfg)
    (group,) = [report.analyse(g) for g in report.group_runs(report.load_runs(out))]
    return group


@pytest.mark.parametrize("method", METHODS)
def test_method_is_lossless_on_the_zoo(results, method):
    result = next(r for r in results.results if r.method == method)
    audit = result.audit
    assert audit["compared"] == 6 and audit["equal"] == 6, audit["mismatches"]
    assert result.rows["overall"]["mean_accepted"] >= 1.0


def test_report_sees_every_method(results):
    assert {r.method for r in results.results} == {"baseline", *METHODS}
    assert not results.problems
