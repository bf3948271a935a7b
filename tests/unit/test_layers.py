"""The package layout keeps its three layers: core (recmesh/, minus recmesh/tools
and the generated recmesh/v1), services (services/) and tools (recmesh/tools/).

Imports only go down: core imports neither services nor tools, services do not
import tools, and nothing outside the tools imports demo code. No two modules
import each other, directly or around a loop. Every import counts, also the
lazy ones inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "recmesh.tools"
GENERATED = "recmesh.v1"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for recmesh/ and services/ (a package is its __init__)."""
    files: dict[str, Path] = {}
    for top in ("recmesh", "services"):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _imported_names(module: str, path: Path, files: Mapping[str, Path]) -> set[str]:
    """What `module` imports: `from pkg import name` is pkg.name when that is a module, else pkg."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                names.add(submodule if submodule in files else source)
    return names


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name inside a module counts as the module)."""

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        if module.startswith(GENERATED):
            continue
        targets = {resolve(n) for n in _imported_names(module, path, files)}
        graph[module] = {t for t in targets if t and t != module and not t.startswith(GENERATED)}
    return graph


def layer(module: str) -> str:
    if module == TOOLS or module.startswith(TOOLS + "."):
        return "tools"
    if module.split(".", maxsplit=1)[0] == "services":
        return "services"
    return "core"


def is_demo(module: str) -> bool:
    return "demo" in module.split(".")


# Which layers each layer may import.
ALLOWED = {"core": {"core"}, "services": {"core", "services"}, "tools": {"core", "services", "tools"}}


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer(target) not in ALLOWED[layer(module)]:
                found.append(f"{module} ({layer(module)}) imports {target} ({layer(target)})")
            elif is_demo(target) and not is_demo(module) and layer(module) != "tools":
                found.append(f"{module} ({layer(module)}) imports demo code {target}")
    return found


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_imports_only_go_down() -> None:
    violations = layer_violations(import_graph(module_files()))
    assert not violations, "imports that go up a layer:\n" + "\n".join(violations)


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph(module_files()))
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_tree_has_all_three_layers() -> None:
    """A walk that found nothing would pass the two tests above."""
    layers = {layer(m) for m in import_graph(module_files())}
    assert layers == {"core", "services", "tools"}


def test_upward_and_demo_imports_are_found() -> None:
    graph = {
        "recmesh.settings": {"recmesh.errors"},
        "recmesh.features.vectorize": {"recmesh.tools.demo.generate"},
        "recmesh.clients": {"services.ranker.graph"},
        "services.ranker.pipeline": {"recmesh.tools.bench.common", "recmesh.clients"},
        "recmesh.tools.cli.main": {"services.ranker.graph", "recmesh.tools.demo.generate"},
    }
    assert layer_violations(graph) == [
        "recmesh.clients (core) imports services.ranker.graph (services)",
        "recmesh.features.vectorize (core) imports recmesh.tools.demo.generate (tools)",
        "services.ranker.pipeline (services) imports recmesh.tools.bench.common (tools)",
    ]
    assert layer_violations({"services.feature.writer": {"services.demo"}}) == [
        "services.feature.writer (services) imports demo code services.demo"
    ]


def test_cycles_are_found_also_around_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_lazy_and_from_imports_count(tmp_path: Path) -> None:
    bench = tmp_path / "recmesh" / "tools" / "bench"
    bench.mkdir(parents=True)
    (tmp_path / "services").mkdir()
    for package in (tmp_path / "recmesh", tmp_path / "recmesh" / "tools", bench):
        (package / "__init__.py").write_text("")
    (bench / "floor.py").write_text("from recmesh.tools.bench.e2e import sweep\n")
    (bench / "e2e.py").write_text("def main() -> None:\n    from recmesh.tools.bench import floor\n")
    graph = import_graph(module_files(tmp_path))
    assert graph["recmesh.tools.bench.e2e"] == {"recmesh.tools.bench.floor"}, "the module, not its package"
    assert import_cycles(graph) == [["recmesh.tools.bench.e2e", "recmesh.tools.bench.floor"]]


# The parts of the Redis key layout (recmesh/features/keys.py spells each once).
KEY_PARTS = ("{u:", "{i:", "{catalog}", "{ingest}", "}:s:", "}:newest", "}:ids", "}:history",
             "}:covisits", "}:profile", "}:static")  # fmt: skip


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants in `tree` (prose may show the layout)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def key_literals(path: Path) -> list[str]:
    """`file:line: text` of each string in code (docstrings aside) holding a part of the key layout."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        and any(part in node.value for part in KEY_PARTS)
    ]  # fmt: skip


def test_the_key_layout_is_spelled_only_in_keys_py() -> None:
    files = module_files()
    found = [
        hit
        for module, path in files.items()
        if module != "recmesh.features.keys" and not module.startswith(GENERATED)
        for hit in key_literals(path)
    ]
    assert found == [], "key parts outside recmesh/features/keys.py:\n" + "\n".join(found)
    # The rule can fail: the layout itself is found where it lives.
    assert key_literals(files["recmesh.features.keys"])
