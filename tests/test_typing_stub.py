"""The public API's type hints (entmax_ref/__init__.pyi) agree with the runtime: every public
name is declared, and every function's parameters (names, kinds, which have defaults) are
those of the implementation.  (mypy checks a usage example against the stub in CI.)"""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path

import entmax_ref as er

STUB = Path(er.__file__).with_suffix(".pyi")


def _stub_functions() -> dict[str, list[ast.FunctionDef]]:
    """Public name -> its signatures: its ``def`` (and overloads), or for ``name: P`` with P
    a Protocol class of the stub, P's ``__call__`` overloads without ``self``."""
    body = ast.parse(STUB.read_text()).body
    protocols = {node.name: node for node in body if isinstance(node, ast.ClassDef)}
    out: dict[str, list[ast.FunctionDef]] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, []).append(node)
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and isinstance(node.annotation, ast.Name) and node.annotation.id in protocols):
            for call in protocols[node.annotation.id].body:
                if isinstance(call, ast.FunctionDef) and call.name == "__call__":
                    call = copy.deepcopy(call)
                    assert call.args.args[0].arg == "self", node.target.id
                    del call.args.args[0]
                    out.setdefault(node.target.id, []).append(call)
    return out


def _stub_names() -> set[str]:
    names = set(_stub_functions())
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname for a in node.names if a.asname and a.asname == a.name)
    return names


def test_every_public_name_is_in_the_stub():
    assert STUB.is_file() and (STUB.parent / "py.typed").is_file()
    missing = set(er.__all__) - _stub_names()
    assert not missing, f"add to entmax_ref/__init__.pyi: {sorted(missing)}"


def test_stub_signatures_match_the_runtime():
    kinds = {"posonly": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
             "kwonly": inspect.Parameter.KEYWORD_ONLY}
    for name, defs in _stub_functions().items():
        runtime = inspect.signature(getattr(er, name))
        want = [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in runtime.parameters.values()]
        for node in defs:
            a = node.args
            got = [(x.arg, kinds["posonly"], False) for x in a.posonlyargs]
            pos = a.args
            pos_defaults = [False] * (len(pos) - len(a.defaults)) + [True] * len(a.defaults)
            got += [(x.arg, kinds["args"], d) for x, d in zip(pos, pos_defaults)]
            got += [(x.arg, kinds["kwonly"], d is not None) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
            assert [(n, k) for n, k, _ in got] == [(n, k) for n, k, _ in want], name
            # an overload may make a defaulted flag required (return_info: Literal[True])
            for (n, _, has), (_, _, should) in zip(got, want):
                assert has == should or n == "return_info", (name, n)
