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

PACKAGE = Path(__file__).resolve().parents[1] / "specbench"

LAYERS = {
    "core": 0, "models": 1, "engine": 2, "methods": 3, "heads": 3, "datastore": 3, "run": 4, "analysis": 5,
    "presentation": 6, "cli": 7, "__main__": 8, "zoo": 7, "kit": 7, "synth": 0, "gguf": 1,
}
#: leaves: who may import them (a kit builds its parts with the zoo's training code)
LEAVES = {"zoo": {"cli", "zoo", "kit"}, "kit": {"cli", "kit"}, "synth": {"cli", "zoo", "kit", "synth"}}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the specbench modules it imports anywhere in its body (the most specific
    module named: `from specbench.zoo import data` is an edge to specbench.zoo.data)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


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
