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
import shutil
import subprocess

import numpy as np
import pytest

from cuda_cases import ALPHAS, EPS64, p_tol, rows, theta_tol
from entmax_ref.backends import _cuda_loader, get_backend
from entmax_ref.backends.numpy_backend import skew_weights
LANES = (1, 32, 256)
DEFAULT, BISECT = 0, 1
MAX_ITER = 4400  # CupyTuning.max_iter


class Harness:
    """ctypes front of harness.cpp (one call per batch of rows)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    @staticmethod
    def _p(a: np.ndarray):
        return a.ctypes.data_as(ctypes.c_void_p)

    def forward(self, x, alpha, method=DEFAULT, lanes=1):
        x = np.ascontiguousarray(x)
        rows, n = x.shape
        alpha = np.ascontiguousarray(alpha, np.float64)
        p = np.empty_like(x)
        theta = np.empty(rows)
        support = np.empty(rows, np.int64)
        n_iter = np.empty(rows, np.int64)
        conv = np.empty(rows, np.uint8)
        fn = self.lib.er_forward_f64 if x.dtype == np.float64 else self.lib.er_forward_f32
        rc = fn(self._p(x), ctypes.c_long(rows), ctypes.c_int(n), self._p(alpha), ctypes.c_int(method),
                ctypes.c_int(MAX_ITER), ctypes.c_int(lanes), self._p(p), self._p(theta), self._p(support),
                self._p(n_iter), self._p(conv))
        assert rc == 0
        return p, theta, support, n_iter, conv.astype(bool)

    def vjp(self, p, g, alpha, lanes=1):
        p, g = np.ascontiguousarray(p), np.ascontiguousarray(g)
        rows, n = p.shape
        alpha = np.ascontiguousarray(alpha, np.float64)
        dx = np.empty_like(p)
        fn = self.lib.er_vjp_f64 if p.dtype == np.float64 else self.lib.er_vjp_f32
        assert fn(self._p(p), self._p(g), ctypes.c_long(rows), ctypes.c_int(n), self._p(alpha),
                  ctypes.c_int(lanes), self._p(dx)) == 0
        return dx

    def alpha_vjp(self, p, g, alpha, lanes=1):
        p, g = np.ascontiguousarray(p), np.ascontiguousarray(g)
        rows, n = p.shape
        alpha = np.ascontiguousarray(alpha, np.float64)
        out = np.empty(rows)
        fn = self.lib.er_alpha_vjp_f64 if p.dtype == np.float64 else self.lib.er_alpha_vjp_f32
        assert fn(self._p(p), self._p(g), ctypes.c_long(rows), ctypes.c_int(n), self._p(alpha),
                  ctypes.c_int(lanes), self._p(out)) == 0
        return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build the CPU harness of the CUDA core")
    src = _cuda_loader.cuda_dir()
    out = tmp_path_factory.mktemp("cuda_core") / "harness.so"
    cmd = [cxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-shared", "-fPIC",
           f"-I{src}", str(src / "harness.cpp"), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return Harness(ctypes.CDLL(str(out)))


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy")


X64 = rows(4, seed=20240601)


def _compare_forward(h, ref, x, alpha, method, lanes):
    name = None if method == DEFAULT else "bisect"
    want = ref.entmax_forward(x, alpha, name)
    p, theta, support, n_iter, conv = h.forward(x, alpha, method, lanes)
    x64 = x.astype(np.float64)
    assert conv.all()
    np.testing.assert_array_equal(support, want.support)
    np.testing.assert_array_equal(np.isfinite(theta), np.isfinite(want.theta))
    live = np.isfinite(want.theta)
    err_t = np.abs(theta[live] - want.theta[live])
    assert (err_t <= theta_tol(x64, want.theta)[live]).all(), err_t.max()
    p_ref = want.p.astype(np.float64)
    err_p = np.abs(p.astype(np.float64) - p_ref)
    tol = p_tol(x64, want.theta, p_ref, alpha, x.dtype)
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


@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("alpha", ALPHAS)
def test_vjp_matches_reference(harness, ref, alpha, dtype):
    a = np.full(len(X64), alpha)
    p = ref.entmax_forward(X64, a, None).p.astype(dtype)
    g = _grad(np.random.default_rng(1), p).astype(dtype)
    want = ref.entmax_vjp(p, g, a).astype(np.float64)
    u = skew_weights(p.astype(np.float64), a[:, None])
    g64 = g.astype(np.float64)
    su = u.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(su > 0, np.abs(u * g64).sum(axis=1, keepdims=True) / su, 0.0)
    # Each term is a few roundings of u_i (g_i - r): bound by ulps of |u_i| (|g_i| + |r|).
    tol = 16 * EPS64 * u * (np.abs(g64) + r)
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
    a = np.full(len(X64), alpha)
    p = ref.entmax_forward(X64, a, None).p.astype(dtype)
    g = _grad(np.random.default_rng(2), p).astype(dtype)
    want = ref.entmax_alpha_vjp(p, g, a)
    p64, g64 = p.astype(np.float64), g.astype(np.float64)
    on = p64 > 0
    with np.errstate(divide="ignore"):
        L = np.where(on, np.log(np.where(on, p64, 1.0)), 0.0)
    # |p_i c_i| <= p_i L_i^2 e^{|(alpha-1) L_i|}: the size of every term, for the bound.
    pc = np.where(on, p64 * L * L * np.exp(np.minimum(np.abs((alpha - 1) * L), 700)), 0.0)
    u = skew_weights(p64, a[:, None])
    su = u.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(su > 0, np.abs(u * g64).sum(axis=1) * pc.sum(axis=1) / su, 0.0)
    tol = 64 * EPS64 * ((np.abs(g64) * pc).sum(axis=1) + corr)
    for lanes in LANES:
        got = harness.alpha_vjp(p, g, a, lanes)
        err = np.abs(got - want)
        assert (err <= tol).all(), (err.max(), tol[np.argmax(err - tol)])


def test_empty_rows_give_zeros(harness):
    x = np.full((3, 5), -np.inf)
    for alpha in ALPHAS:
        p, theta, support, n_iter, conv = harness.forward(x, np.full(3, alpha))
        assert (p == 0).all() and np.isneginf(theta).all() and (support == 0).all() and conv.all()
        g = np.ones_like(x)
        assert (harness.vjp(p, g, np.full(3, alpha)) == 0).all()
        assert (harness.alpha_vjp(p, g, np.full(3, alpha)) == 0).all()
