"""The package's layers point one way, and no import cycle exists (imports inside functions count).

shared basics (core) <- models <- engine <- methods, heads, datastore <- run <- analysis <-
presentation <- cli; `gguf` (GGUF files as model folders) sits with models. The zoo, the kits and
the synthetic data set are leaves: only the cli (the zoo and the kits, for the synthetic corpus and
the zoo's training code) import them; everything else reaches the zoo and the kits through the
`zoo:` / `KIT:` resolvers they register, and the synthetic set through its dataset config's `generator`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import PACKAGE, find_cycle, import_graph, layer, modules

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

LAYERS = {
    "core": 0, "models": 1, "engine": 2, "methods": 3, "heads": 3, "datastore": 3, "run": 4, "analysis": 5,
    "presentation": 6, "cli": 7, "__main__": 8, "zoo": 7, "kit": 7, "synth": 0, "gguf": 1,
    "serving": 4,  # engines we did not write (backend=vllm): beside run, whose files and helpers it shares
}
#: leaves: who may import them (a kit builds its parts with the zoo's training code)
LEAVES = {"zoo": {"cli", "zoo", "kit"}, "kit": {"cli", "kit"}, "synth": {"cli", "zoo", "kit", "synth"}}


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_layers_point_one_way() -> None:
    wrong = []
    for module, targets in import_graph().items():
        source = layer(module)
        if source == "__init__":
            assert not targets, f"specbench/__init__.py imports {targets}: keep the package root empty"
            continue
        assert source in LAYERS, f"{module}: add its layer '{source}' to LAYERS in this test"
        for target in targets:
            dest = layer(target)
            if dest == source:
                continue
            if dest in LEAVES and source not in LEAVES[dest]:
                wrong.append(f"{module} -> {target} (only {sorted(LEAVES[dest])} may import {dest})")
            elif dest not in LEAVES and LAYERS[dest] > LAYERS[source]:
                wrong.append(f"{module} (layer {source}) -> {target} (higher layer {dest})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between packages (layers): an edge when any module of one imports any of the other."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = layer(module)
        out.setdefault(source, set()).update(layer(t) for t in targets if layer(t) != source)
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_no_import_cycle_between_packages() -> None:
    """methods may use heads and heads may not use methods (and so on): the packages form a DAG too."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_package_graph_sees_a_package_cycle() -> None:
    graph = {"specbench.methods.a": {"specbench.heads.b"}, "specbench.heads.b": {"specbench.methods.c"},
             "specbench.methods.c": set()}
    assert find_cycle(package_graph(graph)) == ["heads", "methods", "heads"]


def private_imports() -> list[str]:
    """`from specbench.x import _name` across modules: code shared by leaning on another module's privates."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specbench") and not node.level:
                found += [f"{name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = private_imports()
    assert not found, "share it through a public name of a common module:\n" + "\n".join(found)


def imports_of_test_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of a `test_*` module in `tree`, at any depth: `import test_x`,
    `from test_x import y`, `from test_x.sub import y`, `from . import test_x`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module else [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0].startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    """Test modules share plain helpers through tests/helpers.py and fixtures through tests/conftest.py,
    never by importing each other (which runs one module's code inside another and ties their fixtures)."""
    sample = "import test_a\nfrom test_b import c\nimport helpers\n\ndef f():\n    from test_d.e import g\n"
    assert imports_of_test_modules(ast.parse(sample)) == [(1, "test_a"), (2, "test_b"), (6, "test_d.e")]
    found = [f"tests/{path.name}:{line}: imports {name}"
             for path in sorted(Path(__file__).resolve().parent.glob("*.py"))
             for line, name in imports_of_test_modules(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "move what they share into tests/helpers.py or tests/conftest.py:\n" + "\n".join(found)


def test_a_method_module_imports_no_other_method_module() -> None:
    """Methods share code through common modules (methods.drafts, heads.*, engine.*), not through each
    other: a built-in method's module (named by a configs/method YAML's impl) is imported by no module of
    methods/ or heads/ (the cli and the kits may read a method's public API, e.g. self_spec's cache)."""
    impls = set()
    for yaml in (PACKAGE.parent / "configs" / "method").glob("*.yaml"):
        for line in yaml.read_text(encoding="utf-8").splitlines():
            if line.startswith("impl:"):
                impls.add(line.split(":", 1)[1].strip().rpartition(".")[0])
    assert "specbench.methods.sps" in impls
    users = [f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
             if t in impls and layer(m) in ("methods", "heads")]
    assert not users, "imports of method modules:\n" + "\n".join(users)


def test_the_report_does_not_import_torch(tmp_path) -> None:
    """`specbench report` reads answer files and writes tables: torch (seconds to import) stays out."""
    code = """
import sys
from pathlib import Path
from specbench.core.answers import AnswerWriter, run_dir, write_meta
root = Path(sys.argv[1])
for method, seconds in (("baseline", 1.0), ("pld", 0.5)):
    folder = run_dir(root, "synthetic", "tiny", method, 0.0, 1)
    with AnswerWriter(folder / "answers.jsonl") as w:
        for qid, category in enumerate(("writing", "qa")):
            w.write({"question_id": qid, "category": category, "answer_id": str(qid), "model_id": "m",
                     "tstamp": 0.0, "choices": [{"index": 0, "turns": ["x"], "decoding_steps": [4],
                     "new_tokens": [8], "wall_time": [seconds], "accept_lengths": [2, 2, 2, 2]}],
                     "specbench": {"output_ids": [list(range(8))]}})
    write_meta(folder / "meta.json", {"identity": {"dtype": "float32", "model": "zoo:target",
               "method": {"name": method}}, "environment": {"device": "cpu"},
               "config": {"method": {"name": method}}})
from specbench.cli import main
status = main(["report", str(root), "--out", sys.argv[2], "--no-figures"])
print("STATUS", status, "TORCH", "torch" in sys.modules)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert "STATUS 0 TORCH False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "out" / "synthetic-tiny.md").is_file()
