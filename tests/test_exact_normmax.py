"""alpha-normmax rows are correctly rounded, with the real-number support and a correctly
rounded tau, and the same bits on both CPU engines (docs/conventions.md, "Correct
rounding").

Every row is held to :func:`entmax_ref.testing.family_oracle.normmax_cr` at 0 ulp (mpmath
at 90 and 130 digits, raising where its two precisions round differently).  The rows are
built to break a float64 solver (:func:`~entmax_ref.testing.family_oracle.normmax_edge_rows`:
entries at the threshold and one or two ulps either side, ties and near ties of the
maximum, the maximum alone with an entry at ``max - 1``, thresholds that are floats and
entries, huge offsets, masked entries) plus Hypothesis rows.  The default tier runs a
sample; the exhaustive tier sweeps more alphas, the offsets and float32.  The exact
fallback (:func:`entmax_ref.backends.exact_normmax.normmax_row`), which the engines take
only for rows their double-word check leaves open, is held to the same oracle on its own.
A failure prints the row, the field, and the hex of input, got and want.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import entmax_ref as E
from entmax_ref.backends.exact_normmax import normmax_row
from entmax_ref.testing.family_oracle import normmax_edge_rows, normmax_cr
from row_bits import assert_same_row, hexs

ENGINES = ("numpy", "numba")


def _check(x, alpha, got, where, dtype=np.float64):
    """``got = (p, tau, support)`` of the float64 row ``x`` equals the oracle bit for bit."""
    assert_same_row(f"{where}, {np.dtype(dtype).name}, alpha={alpha!r}: x = {hexs(x)}", got, normmax_cr(x, alpha, dtype))


def check_row(x, alpha, backend, name="", dtype=np.float64):
    """The public ``normmax`` of ``x`` (rounded to ``dtype``) on ``backend`` is the oracle's
    answer at those inputs."""
    x = np.asarray(x).astype(dtype)
    p, info = E.normmax(x[None, :], alpha, backend=backend, return_info=True)
    _check(x.astype(np.float64), alpha, (p[0], float(info.tau[0]), int(info.support[0])),
           f"{backend}, row {name!r}", dtype)


#: the maximum and an entry 2^-53 above max - 1, where the maximum alone has its threshold
TOP_ALONE = np.array([0.0, -1.0, np.nextafter(-1.0, 0.0), -3.0])


@pytest.mark.parametrize("backend", ENGINES)
def test_tiny_positive_entry_is_in_the_support(backend):
    """At alpha = 2, ``[0, -1, -1 + 2^-53, -3]``: ``T = -1 + d`` (``d`` about 2^-107), the
    entry at -1 is outside, the one 2^-53 above it inside with ``p = t / (t_0 + t)``, about
    2^-53 (support 2)."""
    p, info = E.normmax(TOP_ALONE[None, :], 2.0, backend=backend, return_info=True)
    assert int(info.support[0]) == 2 and 0.0 < p[0, 2] < 2.0 ** -52, hexs(p)
    check_row(TOP_ALONE, 2.0, backend, "top alone")


SAMPLE_ALPHAS = (1.5, 2.0, 3.0, 1.33, 1.05, 10.0)


@pytest.mark.parametrize("backend, alpha", [(b, a) for a in SAMPLE_ALPHAS for b in ENGINES])
def test_boundary_rows_sample(backend, alpha):
    """Boundary rows of every sample alpha (near 1, between 1 and 2, the closed-form betas
    2 and 3, above 2, large) on both engines."""
    for name, x in normmax_edge_rows(np.random.default_rng(int(alpha * 1000) + 3), alpha, n=10):
        check_row(x, alpha, backend, name)


@pytest.mark.parametrize("alpha", (1.5, 2.0, 3.0, 1.33))
def test_exact_fallback_rows(alpha):
    """The exact row solver alone, in both dtypes, on the boundary rows."""
    rng = np.random.default_rng(int(alpha * 100) + 1)
    for name, x in normmax_edge_rows(rng, alpha, n=8, offset=2.0 ** 20):
        for dtype in (np.float64, np.float32):
            xr = x.astype(dtype).astype(np.float64)
            _check(xr, alpha, normmax_row(xr, alpha, dtype), f"normmax_row, row {name!r}", dtype)


@pytest.mark.parametrize("backend", ENGINES)
def test_float32_rows_sample(backend):
    """float32 rows are rounded once, to float32, from the exact value at the float32 scores."""
    for alpha in (1.5, 2.0, 3.0):
        rng = np.random.default_rng(int(alpha * 10) + 32)
        for name, x in normmax_edge_rows(rng, alpha, n=10):
            check_row(x, alpha, backend, name, np.float32)


def test_engines_give_the_same_bits_on_a_batch():
    """A batch of rows of several alphas (and scales: sparse and dense rows): identical p,
    tau and support on both engines, and each row as it is alone."""
    rng = np.random.default_rng(8)
    alphas = np.array([1.05, 1.5, 2.0, 3.0, 7.0, 1.33] * 4)
    x = rng.standard_normal((len(alphas), 300)) * rng.choice([0.01, 0.1, 1.0, 10.0], size=(len(alphas), 1))
    x[2, :5] = x[2].max()
    x[3, 7] = -np.inf
    for dtype in (np.float64, np.float32):
        xd = x.astype(dtype)
        a = [E.normmax(xd, alphas, backend=b, return_info=True) for b in ENGINES]
        bits = np.int64 if dtype == np.float64 else np.int32
        assert np.array_equal(a[0][0].view(bits), a[1][0].view(bits))
        assert np.array_equal(a[0][1].tau, a[1][1].tau) and np.array_equal(a[0][1].support, a[1][1].support)
        for r in (0, 5, 9):
            alone = E.normmax(xd[r:r + 1], alphas[r], backend="numpy")
            assert np.array_equal(alone[0].view(bits), a[0][0][r].view(bits))


def _engines_match_oracle(x, alpha, where):
    """``x`` in both dtypes on both engines against one oracle call per dtype."""
    for dtype in (np.float64, np.float32):
        xr = x.astype(dtype)
        want = normmax_cr(xr.astype(np.float64), alpha, dtype)
        for backend in ENGINES:
            p, info = E.normmax(xr[None, :], alpha, backend=backend, return_info=True)
            assert_same_row(f"{backend}, {np.dtype(dtype).name}, alpha={alpha!r}, {where}: x = {hexs(xr)}",
                            (p[0], float(info.tau[0]), int(info.support[0])), want)


@pytest.mark.exhaustive
@pytest.mark.parametrize("alpha", (1.5, 2.0, 3.0, 1.01, 1.05, 1.25, 1.33, 1.75, 2.5, 10.0, 100.0))
@pytest.mark.parametrize("offset", [0.0, 2.0 ** 20, 2.0 ** 50])
def test_boundary_rows_exhaustive(alpha, offset):
    """Boundary rows of 4, 12 and 40 entries, both dtypes, both engines."""
    for seed in range(6):
        rng = np.random.default_rng(seed * 131 + int(alpha * 100))
        for name, x in normmax_edge_rows(rng, alpha, n=int(rng.choice([4, 12, 40])), offset=offset):
            _engines_match_oracle(x, alpha, f"row {name!r}, seed {seed}")


@pytest.mark.exhaustive
@pytest.mark.parametrize("alpha", (1.5, 2.0, 3.0, 1.25))
def test_long_boundary_rows(alpha):
    """Rows of n = 2,048 (hundreds of entries in the support at the smaller scales)."""
    rng = np.random.default_rng(2048 + int(alpha * 10))
    for name, x in normmax_edge_rows(rng, alpha, n=2048):
        _engines_match_oracle(x, alpha, f"row {name!r}")


_floats = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False, width=64)


@pytest.mark.exhaustive
@settings(deadline=None, max_examples=200)
@given(row=st.lists(st.one_of(_floats, st.sampled_from([0.0, 0.5, -0.5, -1.0, 1.0, 2.0 ** -53, -np.inf])),
                    min_size=1, max_size=16),
       alpha=st.sampled_from([1.25, 1.5, 2.0, 3.0, 5.0]))
def test_hypothesis_rows(row, alpha):
    x = np.array(row, np.float64)
    if not np.isfinite(x).any():
        x[0] = 0.0
    _engines_match_oracle(x, alpha, "hypothesis")
