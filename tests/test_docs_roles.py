"""The docs site turns numpydoc roles into links (55 literal ``:func:`` were printed before)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[1]


def _ext():
    spec = importlib.util.spec_from_file_location("numpydoc_roles", ROOT / "docs" / "_hooks" / "numpydoc_roles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.NumpydocRoles()


def test_roles_become_links_or_code():
    ext = _ext()
    ext.members = set()
    assert "entmax_ref.transforms.entmax" in ext.ids  # read from the pages' ::: lines
    text = ("See :func:`entmax_ref.entmax`, :func:`~entmax_ref.attention.attention`, :func:`use_backend`, "
            ":mod:`entmax_ref.backends._base` and :func:`_edge_p`.")
    out = ext._rewrite(text)
    assert ":func:" not in out and ":mod:" not in out
    assert "[`entmax_ref.entmax`][entmax_ref.transforms.entmax]" in out
    assert "[`attention`][entmax_ref.attention.attention]" in out
    assert "[`use_backend`][backends.use_backend]" in out
    assert "[`entmax_ref.backends._base`][backends._base]" in out
    assert "`_edge_p`" in out and "[`_edge_p`]" not in out  # not rendered anywhere: plain code


def test_every_docstring_role_is_handled_by_the_pattern():
    import re

    roles = re.compile(r":[a-z]+:`")
    for path in [*ROOT.joinpath("entmax_ref").rglob("*.py"), *ROOT.joinpath("backends").rglob("*.py")]:
        for m in roles.finditer(path.read_text(encoding="utf-8")):
            role = m.group(0)[1:-2]
            assert role in ("func", "class", "mod", "meth", "data", "attr", "obj", "exc"), (path, role)
