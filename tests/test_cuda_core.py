"""The CUDA kernels' numerical core (backends/cuda/entmax_core.cuh) on the CPU.

The header's ``__host__ __device__`` functions are compiled with g++ into a small shared
library (backends/cuda/harness.cpp) and run on NumPy arrays through ctypes, with the same
reduction orders as the GPU teams (serial, a warp of 32 lanes, a block of 256 threads).
They are compared with the NumPy reference backend: identical supports, thresholds and
probabilities within a few float64 ulps of the problem's scale, and the VJPs.  This is how
the CUDA math is tested in CI, which has no GPU (tests/test_cupy_backend.py runs the
kernels themselves when one is present).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuda_cases import ALPHAS, BIG_ALPHAS, EPS64, build_harness, edge_rows, forward_outputs, ptr, rows
from entmax_ref.backends import get_backend
from agreement import core_alpha_vjp_tolerance, core_vjp_tolerance, float64_support
from agreement import core_p_edge_tolerance as p_edge_tol
from agreement import core_p_tolerance as p_tol
from agreement import core_theta_tolerance as theta_tol
LANES = (1, 32, 256)
DEFAULT, BISECT = 0, 1
MAX_ITER = 4400  # CupyTuning.max_iter


class Harness:
    """ctypes front of harness.cpp (one call per batch of rows)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def _fn(self, name: str, dtype):
        return getattr(self.lib, f"{name}_f64" if dtype == np.float64 else f"{name}_f32")

    def forward(self, x, alpha, method=DEFAULT, lanes=1):
        x = np.ascontiguousarray(x)
        rows, n = x.shape
        alpha = np.ascontiguousarray(alpha, np.float64)
        p = np.empty_like(x)
        theta, support, n_iter, conv = forward_outputs(rows)
        rc = self._fn("er_forward", x.dtype)(ptr(x), ctypes.c_long(rows), ctypes.c_int(n), ptr(alpha),
                                             ctypes.c_int(method), ctypes.c_int(MAX_ITER), ctypes.c_int(lanes), ptr(p),
                                             ptr(theta), ptr(support), ptr(n_iter), ptr(conv))
        assert rc == 0
        return p, theta, support, n_iter, conv.astype(bool)

    def _pg(self, name, p, g, alpha, lanes, out):
        """An entry point of (p, g) rows: ``name``(p, g, rows, n, alpha, lanes, out)."""
        rows, n = p.shape
        alpha = np.ascontiguousarray(alpha, np.float64)
        assert self._fn(name, p.dtype)(ptr(p), ptr(g), ctypes.c_long(rows), ctypes.c_int(n), ptr(alpha),
                                       ctypes.c_int(lanes), ptr(out)) == 0
        return out

    def vjp(self, p, g, alpha, lanes=1):
        p, g = np.ascontiguousarray(p), np.ascontiguousarray(g)
        return self._pg("er_vjp", p, g, alpha, lanes, np.empty_like(p))

    def alpha_vjp(self, p, g, alpha, lanes=1):
        p, g = np.ascontiguousarray(p), np.ascontiguousarray(g)
        return self._pg("er_alpha_vjp", p, g, alpha, lanes, np.empty(p.shape[0]))


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    return Harness(build_harness(tmp_path_factory, "harness.cpp"))


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy")


X64 = rows(4, seed=20240601)


def _compare_forward(h, ref, x, alpha, method, lanes, edge=False):
    name = None if method == DEFAULT else "bisect"
    want = ref.entmax_forward(x, alpha, name)
    p, theta, support, n_iter, conv = h.forward(x, alpha, method, lanes)
    x64 = x.astype(np.float64)
    assert conv.all()
    np.testing.assert_array_equal(support, float64_support(want, x, alpha))
    np.testing.assert_array_equal(np.isfinite(theta), np.isfinite(want.theta))
    live = np.isfinite(want.theta)
    err_t = np.abs(theta[live] - want.theta[live])
    assert (err_t <= theta_tol(x64, want.theta)[live]).all(), err_t.max()
    p_ref = want.p.astype(np.float64)
    err_p = np.abs(p.astype(np.float64) - p_ref)
    tol = p_tol(x64, want.theta, p_ref, alpha, x.dtype)
    if edge:  # alpha > 2 rows: also within the edge-relative bound (tighter where u is huge)
        tol = np.minimum(tol, p_edge_tol(x64, p_ref))
    bad = err_p > tol
    assert not bad.any(), (np.argwhere(bad)[:5], err_p[bad][:5], tol[bad][:5])
    np.testing.assert_array_equal(p[~live], 0.0)
    return err_t, err_p


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_forward_matches_reference_f64(harness, ref, alpha, lanes):
    _compare_forward(harness, ref, X64, np.full(len(X64), alpha), DEFAULT, lanes)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_forward_bisect_matches_reference(harness, ref, alpha):
    x = X64[::3]
    _compare_forward(harness, ref, x, np.full(len(x), alpha), BISECT, 32)


@pytest.mark.parametrize("alpha", (1.0, 1.25, 1.5, 2.0, 3.0))
def test_forward_matches_reference_f32(harness, ref, alpha):
    with np.errstate(over="ignore"):
        x = X64.astype(np.float32)
    _compare_forward(harness, ref, x, np.full(len(x), alpha), DEFAULT, 32)


@pytest.mark.parametrize("method", (DEFAULT, BISECT))
@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("alpha", BIG_ALPHAS)
def test_forward_edge_rows_big_alpha(harness, ref, alpha, lanes, method):
    """alpha in {20, 100, 1000}: edge entries whose p^(alpha-1) is below the float64 range
    ([0, -0.009617] at alpha = 100: p_2 = 4.96e-4; the delta = c - T form gave 5.68e-4 and
    a sum of 1.00007) and rows with several small-p edge entries: the same supports as
    numpy, p within p_tol and the edge-relative p_edge_tol, and the mass exact to ulps."""
    x = edge_rows(alpha, 6, seed=int(alpha))
    a = np.full(len(x), alpha)
    _compare_forward(harness, ref, x, a, method, lanes, edge=True)
    p = harness.forward(x, a, method, lanes)[0]
    n = np.isfinite(x).sum(axis=1)
    assert (np.abs(p.sum(axis=1) - 1.0) <= 8 * EPS64 * (np.log2(n + 1) + 1)).all()


def test_forward_edge_regression(harness):
    """The row of the 004d5b5 report, at alpha = 100 (exact p_2 = 4.958676e-4)."""
    p, _, support, _, conv = harness.forward(np.array([[0.0, -0.009617]]), np.array([100.0]))
    assert conv.all() and support[0] == 2
    assert abs(p[0, 1] - 4.958676e-4) < 1e-9, p
    assert abs(p.sum() - 1.0) <= 2 * EPS64


def test_forward_big_alpha_per_row(harness, ref):
    """Big and small alphas mixed row by row on the edge rows."""
    x = edge_rows(100.0, 4, seed=7)
    alpha = np.resize(np.array(BIG_ALPHAS + ALPHAS), len(x))
    _compare_forward(harness, ref, x, alpha, DEFAULT, 32)


def test_forward_per_row_alpha(harness, ref):
    """Each row its own alpha (the kernels take alpha per row)."""
    alpha = np.resize(np.array(ALPHAS), len(X64))
    _compare_forward(harness, ref, X64, alpha, DEFAULT, 256)


def test_reduction_order_barely_matters(harness):
    """Compensated sums make serial, warp and block orders agree to about an ulp."""
    alpha = np.full(len(X64), 1.25)
    out = [harness.forward(X64, alpha, DEFAULT, lanes) for lanes in LANES]
    for p, theta, support, _, _ in out[1:]:
        np.testing.assert_array_equal(support, out[0][2])
        live = np.isfinite(theta)
        assert np.all(np.abs(theta[live] - out[0][1][live]) <= 2 * np.spacing(np.abs(theta[live]) + 1))


def test_exact_alphas_finish_in_few_passes(harness):
    """Newton with exact-support termination: a handful of passes for 1.5 and 2."""
    for alpha in (1.5, 2.0):
        _, _, _, n_iter, _ = harness.forward(X64, np.full(len(X64), alpha), DEFAULT, 1)
        assert n_iter.max() <= 12, n_iter.max()


def test_bisect_reaches_the_last_bit(harness):
    """method=bisect halves [0, (1 - n^(1-alpha))/(alpha-1)] until it holds two adjacent
    floats: at least 52 halvings (a float64 mantissa) for every row with two finite entries."""
    x = X64[:200]
    alpha = np.full(len(x), 1.25)
    _, _, _, it, conv = harness.forward(x, alpha, BISECT, 1)
    assert conv.all()
    several = np.isfinite(x).sum(axis=1) >= 2
    assert (it[several] >= 52).all(), it[several].min()


def _grad(rng, p):
    g = rng.standard_normal(p.shape)
    return np.where(np.isfinite(g), g, 0.0)


def _pg(ref, alpha, dtype, seed):
    """(alpha per row, the reference p of X64 and a seeded gradient, both in dtype)."""
    a = np.full(len(X64), alpha)
    p = ref.entmax_forward(X64, a, None).p.astype(dtype)
    return a, p, _grad(np.random.default_rng(seed), p).astype(dtype)


@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("alpha", ALPHAS)
def test_vjp_matches_reference(harness, ref, alpha, dtype):
    a, p, g = _pg(ref, alpha, dtype, seed=1)
    want = ref.entmax_vjp(p, g, a).astype(np.float64)
    tol = core_vjp_tolerance(p.astype(np.float64), g.astype(np.float64), a)
    if dtype == np.float32:
        tol = tol + np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    for lanes in LANES:
        dx = harness.vjp(p, g, a, lanes)
        assert dx.dtype == dtype
        err = np.abs(dx.astype(np.float64) - want)
        assert (err <= tol).all(), err.max()


@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("alpha", ALPHAS)
def test_alpha_vjp_matches_reference(harness, ref, alpha, dtype):
    a, p, g = _pg(ref, alpha, dtype, seed=2)
    want = ref.entmax_alpha_vjp(p, g, a)
    tol = core_alpha_vjp_tolerance(p.astype(np.float64), g.astype(np.float64), a)
    for lanes in LANES:
        got = harness.alpha_vjp(p, g, a, lanes)
        err = np.abs(got - want)
        assert (err <= tol).all(), (err.max(), tol[np.argmax(err - tol)])


def _big_rows(alpha):
    """edge_rows and every 7th row of X64, padded with -inf to a common width."""
    e, o = edge_rows(alpha, 6, seed=int(alpha)), X64[::7]
    x = np.full((len(e) + len(o), max(e.shape[1], o.shape[1])), -np.inf)
    x[:len(e), :e.shape[1]] = e
    x[len(e):, :o.shape[1]] = o
    return x


def _log_abs(v):
    with np.errstate(divide="ignore"):
        return np.log(np.abs(v))


@pytest.mark.parametrize("alpha", BIG_ALPHAS)
def test_vjp_big_alpha_matches_reference(harness, ref, alpha):
    """alpha > 2 where u = p^(2-alpha) overflows: the same non-finite entries (same signs)
    as numpy, and every finite entry within the bound of test_vjp_matches_reference,
    16 ulps of u_i (|g_i| + r) with r = sum u|g| / sum u, compared in log space (u / max u
    and log u, so that the bound itself does not overflow); the entry m of largest u is
    sum_{j != m} u_j (g_m - g_j) / sum u in both, bounded by 16 ulps of
    sum_{j != m} u_j |g_m - g_j| / sum u."""
    x = _big_rows(alpha)
    a = np.full(len(x), alpha)
    p = ref.entmax_forward(x, a, None).p
    g = _grad(np.random.default_rng(3), p)
    # a few rows with ties in g (g_i = r exactly, and g_m = g_j)
    g[:10:3] = np.round(g[:10:3])
    want = ref.entmax_vjp(p, g, a)
    on = p > 0
    with np.errstate(divide="ignore"):
        lu = np.where(on, (2.0 - alpha) * np.log(np.where(on, p, 1.0)), -np.inf)
    lmax = lu.max(axis=1, keepdims=True)
    lmax = np.where(np.isfinite(lmax), lmax, 0.0)
    w = np.where(on, np.exp(lu - lmax), 0.0)
    S = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(S > 0, (w * np.abs(g)).sum(axis=1, keepdims=True) / S, 0.0)
    log_tol = lu + np.log(16 * EPS64) + _log_abs(np.abs(g) + r)  # log of 16 eps u (|g| + r)
    rows_ = np.arange(len(p))
    m = lu.argmax(axis=1)
    others = on.copy()
    others[rows_, m] = False
    l2 = np.where(others, lu, -np.inf).max(axis=1)
    l2f = np.where(np.isfinite(l2), l2, 0.0)
    gm = g[rows_, m][:, None]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # m's own term is masked
        Tm = np.where(others, np.exp(lu - l2f[:, None]) * np.abs(gm - g), 0.0).sum(axis=1) / S[:, 0]
    log_tol[rows_, m] = l2f + np.log(16 * EPS64) + _log_abs(Tm)
    assert not np.isfinite(want).all() or alpha == 20.0  # the rows do overflow u at 100, 1000
    for lanes in LANES:
        dx = harness.vjp(p, g, a, lanes)
        fin = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(dx), fin)
        np.testing.assert_array_equal(dx[~fin], want[~fin])
        with np.errstate(invalid="ignore", divide="ignore"):
            err = np.abs(dx - want)
        ok = ~fin | (err == 0) | (_log_abs(err) <= log_tol)
        assert ok.all(), (np.argwhere(~ok)[:5], dx[~ok][:5], want[~ok][:5])


@pytest.mark.parametrize("alpha", BIG_ALPHAS)
def test_alpha_vjp_big_alpha_matches_reference(harness, ref, alpha):
    """alpha > 2: sum_i p_i (1 - (alpha-1) log p_i) (g_i - r) / (alpha-1)^2, finite where
    u overflows, within 64 ulps of the sum of its terms' sizes (|g_i| + |r| for g_i - r)."""
    x = _big_rows(alpha)
    a = np.full(len(x), alpha)
    p = ref.entmax_forward(x, a, None).p
    g = _grad(np.random.default_rng(4), p)
    want = ref.entmax_alpha_vjp(p, g, a)
    assert np.isfinite(want).all()
    on = p > 0
    with np.errstate(divide="ignore"):
        L = np.where(on, np.log(np.where(on, p, 1.0)), 0.0)
    lu = np.where(on, (2.0 - alpha) * L, -np.inf)
    lmax = lu.max(axis=1, keepdims=True)
    w = np.where(on, np.exp(lu - np.where(np.isfinite(lmax), lmax, 0.0)), 0.0)
    S = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(S > 0, (w * np.abs(g)).sum(axis=1, keepdims=True) / S, 0.0)
    a1 = alpha - 1.0
    tol = 64 * EPS64 * (p * (1 + a1 * np.abs(L)) * (np.abs(g) + r)).sum(axis=1) / a1**2
    for lanes in LANES:
        got = harness.alpha_vjp(p, g, a, lanes)
        assert np.isfinite(got).all()
        err = np.abs(got - want)
        assert (err <= tol).all(), (err.max(), tol[np.argmax(err - tol)])


def test_empty_rows_give_zeros(harness):
    x = np.full((3, 5), -np.inf)
    for alpha in ALPHAS + BIG_ALPHAS:
        p, theta, support, n_iter, conv = harness.forward(x, np.full(3, alpha))
        assert (p == 0).all() and np.isneginf(theta).all() and (support == 0).all() and conv.all()
        g = np.ones_like(x)
        assert (harness.vjp(p, g, np.full(3, alpha)) == 0).all()
        assert (harness.alpha_vjp(p, g, np.full(3, alpha)) == 0).all()

