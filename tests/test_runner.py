"""The runner's contracts beside the answer files (test_session, test_faults): every part a run names is
built before its clock starts, one line each, and nothing is built once the timed part has begun."""

from __future__ import annotations

import shutil

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import write_questions
from specbench.core.errors import SpecbenchError
from specbench.core.files import build_once, find_only
from specbench.core.resources import CONFIG_DIR
from specbench.models import RESOLVERS, register_resolver
from specbench.run import runner
from specbench.run.local import LocalBackend
from specbench.run.prepare import prepare_parts


def test_a_folder_is_never_built_inside_find_only(tmp_path):
    def fill(tmp):
        (tmp / "card").write_text("built")

    with find_only("build it before the clock"), pytest.raises(SpecbenchError, match="is not built; build it before"):
        build_once(tmp_path / "part", "card", fill)
    assert not (tmp_path / "part").exists()
    built = build_once(tmp_path / "part", "card", fill)  # outside: built on demand, as a library call does
    with find_only("never"):
        assert build_once(tmp_path / "part", "card", fill) == built  # a built folder is found


@pytest.fixture
def fake_parts(tmp_path, tiny_models):
    """A `fakepart:NAME` resolver: NAME's folder, a copy of the tiny Llama built on first use (build_once)."""
    calls: list[str] = []

    def resolve(name: str) -> str:
        calls.append(name)
        return str(build_once(tmp_path / "parts" / name, "config.json",
                              lambda tmp: shutil.copytree(tiny_models["llama"], tmp, dirs_exist_ok=True)))

    register_resolver("fakepart", resolve)
    yield calls
    RESOLVERS.pop("fakepart", None)


def test_prepare_parts_builds_each_named_part_once_with_one_line(fake_parts, capsys):
    prepare_parts(["fakepart:a", "hub-org/model", "fakepart:a", "fakepart:b", "drafting: a fact"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("part ")]
    assert fake_parts == ["a", "b"] and [line.split(":")[1] for line in lines] == ["a", "b"]


def compose_run(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_parts_a_run_reads_are_the_model_its_draft_where_a_method_reads_it_and_the_methods_paths():
    cfg = compose_run("model=local", "model.path=fakepart:target", "+model.draft=fakepart:draft",
                      "method=sps", "interleave=[pld]")
    phases = LocalBackend.plan(cfg)
    assert [m.name for m in phases[0]] == ["baseline", "sps", "pld"]
    parts = LocalBackend.parts(cfg, phases)
    assert parts[0] == "fakepart:target" and "fakepart:draft" in parts  # sps leaves its draft to the model's
    alone = compose_run("model=local", "model.path=fakepart:target", "+model.draft=fakepart:draft", "method=pld")
    assert "fakepart:draft" not in LocalBackend.parts(alone, LocalBackend.plan(alone))  # nothing reads it


def test_a_run_builds_its_parts_before_the_clock(fake_parts, tmp_path, capsys):
    questions = write_questions(tmp_path / "q.jsonl", per_category=1)
    out = tmp_path / "out"
    cfg = compose_run("model=local", "model.path=fakepart:target", "method=sps", "method.draft=fakepart:draft",
                      "dataset=spec_bench", f"dataset.path={questions}", f"output_dir={out}", "task=[qa]",
                      "max_new_tokens=6", "warmup=0", "progress=false", "precision_probe=0")
    done = runner.run(cfg)
    err = capsys.readouterr().err
    assert fake_parts[:2] == ["target", "draft"]  # both built by the preparation step, in the order named
    assert err.index("part fakepart:target:") < err.index("part fakepart:draft:")
    assert done.labels == ["baseline", "sps"] and not done.failures()
    assert (out / "spec_bench" / "local" / "sps" / "temp-0" / "run-1" / "answers.jsonl").is_file()
    shutil.rmtree(tmp_path / "parts" / "draft")
    runner_ = runner.Runner(OmegaConf.merge(cfg, {"overwrite": True}))
    runner_.cls = type("Unprepared", (LocalBackend,), {"parts": staticmethod(lambda cfg, phases: [])})
    with pytest.raises(SpecbenchError, match="parts/draft is not built; a run builds every part it names before"):
        runner_.run()  # a part that the preparation step did not build is found missing, never built in the run


@pytest.mark.fast
def test_lane_orders_pair_each_order_with_its_reverse_and_vary_the_neighbours():
    """Every odd turn runs the lanes in the reverse of the turn before (a steady drift charges all alike);
    `alternating` keeps the job's order, `shuffled` draws each pair's order from the run's seed: the same on a
    rerun, another for another run, and over a run's turns each lane follows more than one other lane."""
    lanes, turns = 15, 40
    alternating = runner.turn_orders(lanes, turns, "alternating", 0, 1)
    assert alternating == [list(range(lanes)) if i % 2 == 0 else list(range(lanes))[::-1] for i in range(turns)]
    shuffled = runner.turn_orders(lanes, turns, "shuffled", 0, 1)
    assert len(shuffled) == turns and all(sorted(order) == list(range(lanes)) for order in shuffled)
    assert all(shuffled[i] == shuffled[i - 1][::-1] for i in range(1, turns, 2))
    assert len({tuple(order) for order in shuffled[::2]}) == turns // 2  # a new draw for every pair
    assert shuffled == runner.turn_orders(lanes, turns, "shuffled", 0, 1)
    assert shuffled != runner.turn_orders(lanes, turns, "shuffled", 0, 2) != runner.turn_orders(lanes, turns,
                                                                                                  "shuffled", 1, 1)
    before = {lane: {order[k - 1] for order in shuffled for k in range(1, lanes) if order[k] == lane}
              for lane in range(lanes)}
    assert all(len(previous) > 1 for previous in before.values()), before
    assert runner.turn_orders(1, 3, "shuffled", 0, 1) == [[0], [0], [0]]
    assert runner.turn_orders(4, 0, "shuffled", 0, 1) == []
