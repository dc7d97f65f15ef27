"""The package's import graph, read from the source (ast), has no cycle.

Modules are those of ``entmax_ref/`` and of ``backends/`` (installed as
``entmax_ref.backends``).  An edge ``a -> b`` is an ``import`` of b in a:

* at import time (the module body, ``if`` blocks included, ``if TYPE_CHECKING`` left out):
  this graph must be acyclic, so ``import entmax_ref`` never sees a half-initialised
  module of its own;
* anywhere (function-level imports too): a cycle there is two modules that need each
  other, which only a lazy import hides.  It must be acyclic too.

``from pkg import name`` depends on ``pkg.name`` when that is a module, else on ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent



def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "backends":
        parts = ["entmax_ref", "backends", *parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for d in ("entmax_ref", "backends") for p in sorted((ROOT / d).rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
                                         or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, import_time: bool):
    """The Import/ImportFrom nodes of a module: those run at import time, or all."""
    if not import_time:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)) and not _is_type_checking(node):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def _graph(import_time: bool) -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), import_time):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                subs = [f"{source}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in mods] + ([source] if any(s not in mods for s in subs) else [])
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_package():
    graph = _graph(import_time=True)
    assert {"entmax_ref", "entmax_ref.backends", "entmax_ref.backends.numpy_backend", "entmax_ref.testing"} <= set(graph)
    assert "entmax_ref.backends.capabilities" in graph["entmax_ref.backends.numpy_backend"]
    assert "entmax_ref._validate" in graph["entmax_ref.family"]  # from . import _validate as V


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_import_time():
    assert _cycles(_graph(import_time=True)) == []


def test_no_cycle_through_function_level_imports():
    # numpy_backend's attention methods import the attention driver lazily; the driver
    # takes the row maps from numpy_elementwise, not from numpy_backend
    assert "entmax_ref.backends.numpy_attention" in _graph(import_time=False)["entmax_ref.backends.numpy_backend"]
    assert [sorted(c) for c in _cycles(_graph(import_time=False))] == []
