"""The capability table drives dispatch errors, the method tests and the docs' table."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import capabilities as caps
from entmax_ref.testing.tolerance import entmax_tolerance

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the alphas a method applies to ("sort" is defined only where a sort solves the threshold)
SORT_ALPHAS = (1.0, 1.5, 2.0)
ALPHAS = (1.0, 1.25, 1.5, 2.0, 3.0)


def _rows(rng, rows=6, n=17):
    x = rng.standard_normal((rows, n)) * 3
    x[1, ::3] = -np.inf
    x[2, 4:9] = 0.5  # ties
    return x


def test_every_method_of_the_table_matches_the_reference(backend_method):
    """Each (backend, method) pair the table lists runs, and agrees with the float64
    reference's default solver within the derived tolerance, with the same support."""
    backend, method = backend_method
    x = _rows(np.random.default_rng(13))
    for alpha in (SORT_ALPHAS if method == "sort" else ALPHAS):
        want, winfo = er.entmax(x, alpha, method=None, backend="numpy", return_info=True)
        got, info = er.entmax(backend.asarray(x), alpha, method=method, backend=backend, return_info=True)
        got = backend.numpy(got)
        tol = entmax_tolerance(want, np.full(len(x), alpha), np.float64)
        assert np.all(np.abs(got - want) <= tol), (backend, method, alpha, np.abs(got - want).max())
        np.testing.assert_array_equal(backend.numpy(info.support), winfo.support)


def test_unknown_method_is_a_value_error_listing_the_backends_methods(backend):
    have = caps.methods(backend, "entmax_forward")
    with pytest.raises(ValueError, match=r"unknown method 'halley' for entmax_forward on the %s backend; "
                       r"valid methods: %s" % (backend, re.escape(", ".join(map(repr, have))))):
        er.entmax(backend.asarray(np.zeros(3)), 1.3, method="halley", backend=backend)


def test_a_method_the_backend_lacks_names_where_it_exists(backend):
    have = caps.methods(backend, "entmax_forward")
    missing = [m for m in caps.METHODS if m not in have]
    assert missing, "every backend lacks some method today; update this test if that changes"
    for m in missing:
        where = ", ".join(caps.backends_with("entmax_forward", m))
        with pytest.raises(NotImplementedError, match=f"'{m}' exists on: {where}$"):
            er.entmax(backend.asarray(np.zeros(3)), 1.5, method=m, backend=backend)


def test_the_table_is_consistent():
    builtin = ("numpy", "numba", "cupy")
    for op, table in caps.CAPABILITIES.items():
        assert set(table) >= set(builtin), op
        for b, ms in table.items():
            assert ms and ms[0] is None, (op, b)  # every backend has its exact default
            assert set(ms) - {None} <= set(caps.METHODS), (op, b, ms)
    used = {m for t in caps.CAPABILITIES.values() for ms in t.values() for m in ms}
    assert set(caps.METHODS) <= used, "a method name no backend implements"
    assert set(caps.DEFAULTS) == set(builtin)
    assert not hasattr(er.backends._base, "METHODS")


def test_docs_show_the_table():
    page = (ROOT / "docs" / "guides" / "backends.md").read_text()
    assert caps.markdown_table() in page, "regenerate the table in docs/guides/backends.md from markdown_table()"


def test_register_backend_with_capabilities_gets_the_dispatch_errors():
    ref = er.get_backend("numpy")

    class Bisect:
        name = "bisect-only"

        def owns(self, x):
            return isinstance(x, np.ndarray)

        def entmax_forward(self, x, alpha, method):
            caps.require(self.name, "entmax_forward", method)
            return ref.entmax_forward(x, alpha, "bisect")

    er.backends.register_backend("bisect-only", Bisect, capabilities={"entmax_forward": (None, "bisect")})
    try:
        assert caps.methods("bisect-only", "entmax_forward") == (None, "bisect")
        er.entmax([0.0, 1.0], 1.5, method="bisect", backend="bisect-only")
        where = ", ".join(caps.backends_with("entmax_forward", "sort"))
        assert where.startswith("numpy")
        with pytest.raises(NotImplementedError, match=f"'sort' exists on: {where}$"):
            er.entmax([0.0, 1.0], 1.5, method="sort", backend="bisect-only")
        with pytest.raises(NotImplementedError, match="the bisect-only backend does not implement entmax_vjp"):
            caps.require("bisect-only", "entmax_vjp")
        with pytest.raises(ValueError, match="unknown operation 'normmax'"):
            caps.methods("numpy", "normmax")
    finally:
        er.backends._REGISTRY.pop("bisect-only")
        er.backends._instances.pop("bisect-only", None)
        caps.remove_backend("bisect-only")
    assert "bisect-only" not in caps.backends_with("entmax_forward", "bisect")
