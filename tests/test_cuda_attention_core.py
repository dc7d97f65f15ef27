"""The CUDA attention kernels' row math (entmax_core.cuh: edge_residual, attn_grad_row) on
the CPU through the g++ harness, against the NumPy driver's (numpy_attention.edge_residual,
rebuild_p, the row VJP and the shifted ds), on rows with entries just inside and just
outside the support, alpha from 1 to 1000, with the reduction orders of a serial loop, a
warp and a 256-thread block."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from entmax_ref.backends.numpy_attention import _row_scale_grad, edge_residual, rebuild_p
from entmax_ref.backends.numpy_backend import NumpyBackend
from test_attention_exact import ALPHAS, edge_rows
from test_cuda_core import MAX_ITER, harness  # noqa: F401 - the harness fixture

LANES = (1, 32, 256)


def _attn(h, z, alpha, dp, delta, lanes):
    z, dp = np.ascontiguousarray(z, np.float64), np.array(dp, np.float64)
    rows, n = z.shape
    p = np.empty_like(z)
    outs = [np.empty(rows) for _ in range(5)]
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    delta = np.ascontiguousarray(delta, np.float64)
    rc = h.lib.er_attn_rows_f64(ptr(z), ctypes.c_long(rows), ctypes.c_int(n), ctypes.c_double(alpha),
                                ctypes.c_int(MAX_ITER), ctypes.c_int(lanes), ptr(delta), ptr(p), ptr(dp),
                                *(ptr(o) for o in outs))
    assert rc == 0
    return p, dp, *outs


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("alpha", ALPHAS, ids=[repr(a) for a in ALPHAS])
def test_attention_row_core_matches_the_numpy_driver(harness, alpha, lanes):  # noqa: F811
    rng = np.random.default_rng(int(alpha * 11) % 997)
    z = edge_rows(rng, alpha)
    g = rng.standard_normal(z.shape)  # dp_j = dO . v_j
    ref = NumpyBackend()
    res = ref.entmax_forward(z, np.full(len(z), alpha), None)
    m, c, q = edge_residual(z, res.p)
    # delta = dO . skew = sum u g / sum u (u / max u in log space) over the core's own p
    p0 = _attn(harness, z, alpha, g, np.zeros(len(z)), lanes)[0]
    on = p0 > 0
    with np.errstate(divide="ignore"):
        lu = np.where(on, (2.0 - alpha) * np.log(np.where(on, p0, 1.0)), -np.inf)
    w = np.where(on, np.exp(lu - lu.max(axis=1, keepdims=True)), 0.0)
    delta = (w * g).sum(axis=1) / w.sum(axis=1)
    p, dz, theta, row_max, edge, edge_p, ds = _attn(harness, z, alpha, g, delta, lanes)
    np.testing.assert_array_equal(row_max, m)
    if alpha > 2.0:  # the residual the backward uses (q is determined to an absolute eps: mass 1)
        np.testing.assert_array_equal(edge, c)
        assert np.all(np.abs(edge_p - q) <= 8 * np.finfo(float).eps), (edge_p, q)
    p_want = rebuild_p(z, alpha, theta, row_max, edge, edge_p)  # the NumPy driver's, from this residual
    # libm vs NumPy's exp/log: ulps of the exponent log(p) = log1p(w) / a1, which exp turns
    # into a relative error of p |log p| times as large (near 1e-305 at alpha = 1 + 1e-12, a
    # sub-ulp difference in the exponent is 1.1e-13 relative: AVX-512 NumPy on AMD)
    with np.errstate(divide="ignore", invalid="ignore"):
        rtol = np.maximum(1e-13, 8 * np.finfo(float).eps * np.abs(np.log(p_want)))
        tol = np.where(p_want > 0.0, rtol * p_want, 0.0)  # a zero stays exactly zero
    assert np.all(np.abs(p - p_want) <= tol), np.max(np.abs(p - p_want) - tol)
    dz_want = ref.entmax_vjp(p_want, g, np.full(len(z), alpha))
    # p agrees to ulps only (libm vs NumPy), and u = p^(2 - alpha) multiplies a relative
    # change of p by |2 - alpha|: the tolerance carries that factor
    tol = 1e-12 * max(1.0, abs(2.0 - alpha))
    scale = np.abs(dz_want).max(axis=1, keepdims=True)
    assert np.all(np.abs(dz - dz_want) <= tol * scale), np.abs(dz - dz_want).max()
    ds_want = _row_scale_grad(dz_want, z, p_want, alpha)
    assert np.all(np.abs(ds - ds_want) <= tol * (np.abs(dz_want) * np.abs(z - z.max(axis=1, keepdims=True))).sum(axis=1))
