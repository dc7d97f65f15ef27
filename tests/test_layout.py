"""The tree stays readable: files of one idea, functions that fit on a screen, and private
names that stay in the module that owns them.

Read from the source with ``ast`` over every Python file of ``entmax_ref/`` and ``backends/``
(installed as ``entmax_ref.backends``):

* no file is longer than :data:`MAX_FILE_LINES` lines;
* no function or method body (its docstring left out) is longer than
  :data:`MAX_BODY_LINES` lines;
* at most :data:`MAX_PRIVATE_IMPORTS` imports bring an underscore name of one module of the
  package into another (``from .x import _name``; ``from . import _module`` and the
  package's own dunder names do not count).  A private name that several modules need is a
  real name of the module that owns it; the bound only goes down.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 600
MAX_BODY_LINES = 100
MAX_PRIVATE_IMPORTS = 0

FILES = sorted(p for d in ("entmax_ref", "backends") for p in (ROOT / d).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the function."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def _long_functions(tree: ast.Module) -> list[tuple[str, int, int]]:
    return [(node.name, node.lineno, _body_lines(node)) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_BODY_LINES]


def _is_module(package: Path, name: str) -> bool:
    return (package / f"{name}.py").is_file() or (package / name / "__init__.py").is_file()


def _private_imports(path: Path, tree: ast.Module) -> list[str]:
    """``module:line name`` for every underscore name imported from another module of the
    package (relative imports, or absolute ones under ``entmax_ref``)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and not (node.module or "").startswith("entmax_ref"):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
        else:
            parts = node.module.split(".")[1:]
            base = ROOT / ("backends" if parts[:1] == ["backends"] else "entmax_ref")
            parts = parts[1:] if parts[:1] == ["backends"] else parts
            base = base.joinpath(*parts)
        if node.level and node.module:
            base = base.joinpath(*node.module.split("."))
        for alias in node.names:
            name = alias.name
            if not name.startswith("_") or name.startswith("__") or _is_module(base, name):
                continue
            out.append(f"{_rel(path)}:{node.lineno} {name}")
    return out


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_file_length(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_FILE_LINES, f"{_rel(path)} has {n} lines (at most {MAX_FILE_LINES}): split it by idea"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_function_length(path):
    long = _long_functions(_parse(path))
    assert not long, "; ".join(f"{_rel(path)}:{line} {name}() has a {n}-line body (at most {MAX_BODY_LINES})"
                               for name, line, n in long)


def test_private_names_stay_home():
    found = [hit for path in FILES for hit in _private_imports(path, _parse(path))]
    assert len(found) <= MAX_PRIVATE_IMPORTS, (
        f"{len(found)} imports of another module's underscore name (at most {MAX_PRIVATE_IMPORTS}): make a "
        "name that several modules share a real name of the module that owns it\n" + "\n".join(found))


def test_the_measures_see_what_they_measure(tmp_path):
    """The three measures find a long body, skip a docstring and resolve a relative import."""
    fn = "def f():\n    '''doc\n\n    more'''\n" + "    x = 1\n" * (MAX_BODY_LINES + 1)
    assert _long_functions(ast.parse(fn)) == [("f", 1, MAX_BODY_LINES + 1)]
    short = "def f():\n    '''" + "doc\n" * 200 + "'''\n" + "    x = 1\n" * MAX_BODY_LINES
    assert _long_functions(ast.parse(short)) == []
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "_mod.py").write_text("")
    mod = pkg / "user.py"
    tree = ast.parse("from . import _mod\nfrom ._mod import _x, y, __all__\nfrom numpy import _z\n")
    assert [h.split(" ")[1] for h in _private_imports(mod, tree)] == ["_x"]
