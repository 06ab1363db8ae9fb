"""The package's layout holds: no import loops between couplet's modules, counting imports placed inside
functions (a loop hidden that way is still a loop); annotation-only imports under `if TYPE_CHECKING:` aside."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "couplet"


def _imports(tree: ast.AST, known: set[str]) -> set[str]:
    """couplet modules imported anywhere in `tree`, except under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("couplet"):
            found |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in known}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        found |= _imports(node, known)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    return {m: _imports(ast.parse(p.read_text(encoding="utf-8")), set(files)) - {m} for m, p in files.items()}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_loop_hidden_in_a_function():
    tree = ast.parse("def f():\n    from couplet.b import x\n")
    assert _imports(tree, {"couplet.b"}) == {"couplet.b"}
    assert loops({"couplet.a": {"couplet.b"}, "couplet.b": {"couplet.a"}, "couplet.c": set()}) == [
        ["couplet.a", "couplet.b"]]


def test_no_import_loops_in_the_package():
    graph = import_graph()
    assert {"couplet.writing.rules", "couplet.serving.engine", "couplet.kvcache.policy"} <= set(graph)
    assert loops(graph) == []
