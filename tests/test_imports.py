"""The package's modules import one another one way only (DESIGN.md: cli -> adapter -> core <- reference,
training -> core): no import cycle, counting the imports inside functions, which Python defers but
which tie the modules together just the same."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_wedlm"


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (function bodies included).

    ``from a import b`` is an edge to the module ``a.b`` when there is one, else to ``a``.
    """
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package, up level - 1 more
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            else:
                continue
            edges.update(target for target in targets if target in paths and target != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and graph["vllm_wedlm.plugin"], "the graph was not read"
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    """A cycle closed by an import in a function body (as cli.py <-> plugin.py once were) is found."""
    package = tmp_path / "vllm_wedlm"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from vllm_wedlm.sub.b import X\n")
    (package / "sub" / "b.py").write_text("X = 1\n\ndef later():\n    from ..a import Y\n")
    graph = import_graph(package)
    assert graph["vllm_wedlm.a"] == {"vllm_wedlm.sub.b"} and graph["vllm_wedlm.sub.b"] == {"vllm_wedlm.a"}
    assert find_cycle(graph) == ["vllm_wedlm.a", "vllm_wedlm.sub.b", "vllm_wedlm.a"]
