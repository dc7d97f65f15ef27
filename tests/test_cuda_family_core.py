"""The normmax / budget-sparsemax CUDA core (backends/cuda/family_core.cuh) on the CPU.

family_harness.cpp compiles the header's __host__ __device__ functions with g++ and runs
them with the reduction orders of the GPU teams (serial, a 32-lane warp, a 256-thread
block); the results are compared with the NumPy reference (and so, through
tests/test_normmax.py and tests/test_budget_sparsemax.py, with the exact oracles).  CI has
no GPU: this is how the cupy backend's math is tested there.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuda_cases import build_harness, family_rows, forward_outputs, ptr
from entmax_ref.backends.constants import CUDA_MAX_PASSES
from entmax_ref.backends.numpy_family import budget_rows, budget_vjp_rows, normmax_rows, normmax_vjp_rows
from agreement import budget_agreement_tolerance, family_threshold_agreement

LANES = (1, 32, 256)
MAX_ITER = CUDA_MAX_PASSES  # what the cupy backend passes its kernels


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_harness(tmp_path_factory, "family_harness.cpp")


def _forward(lib, name, x, prm, lanes):
    x = np.ascontiguousarray(x, np.float64)
    rows, n = x.shape
    prm = np.ascontiguousarray(prm, np.float64)
    p = np.empty_like(x)
    tau, sup, it, conv = forward_outputs(rows)
    rc = getattr(lib, name)(ptr(x), ctypes.c_long(rows), ctypes.c_int(n), ptr(prm), ctypes.c_int(MAX_ITER),
                            ctypes.c_int(lanes), ptr(p), ptr(tau), ptr(sup), ptr(it), ptr(conv))
    assert rc == 0
    return p, tau, sup, it, conv.astype(bool)


def _batch(seed):
    return family_rows(seed, 40, 70, huge_row=True)


@pytest.mark.parametrize("lanes", LANES)
def test_normmax_core_matches_reference(lib, lanes):
    x = _batch(1)
    alpha = np.random.default_rng(2).uniform(1.1, 5.0, len(x))
    p, tau, sup, it, conv = _forward(lib, "er_normmax_f64", x, alpha, lanes)
    want = normmax_rows(x, alpha)
    assert conv.all()
    np.testing.assert_array_equal(sup, want.support)
    live = np.isfinite(want.theta)
    np.testing.assert_array_equal(np.isfinite(tau), live)
    assert (np.abs(tau[live] - want.theta[live]) <= family_threshold_agreement(want.theta[live])).all()
    np.testing.assert_allclose(p, want.p, rtol=1e-12, atol=1e-14)
    g = np.random.default_rng(3).standard_normal(x.shape)
    dx = np.empty_like(x)
    assert lib.er_normmax_vjp_f64(ptr(want.p), ptr(g), ctypes.c_long(len(x)), ctypes.c_int(x.shape[1]),
                                  ptr(alpha), ctypes.c_int(lanes), ptr(dx)) == 0
    d0 = normmax_vjp_rows(want.p, g, alpha)
    np.testing.assert_allclose(dx, d0, rtol=1e-12, atol=1e-12 * np.abs(d0).max())


@pytest.mark.parametrize("lanes", LANES)
def test_budget_core_matches_reference(lib, lanes):
    x = _batch(4)
    budget = np.random.default_rng(5).uniform(0, 70, len(x))
    budget[:6] = [0.0, 1.0, 2.0, 70.0, 69.0, 3.0]
    p, tau, sup, it, conv = _forward(lib, "er_budget_f64", x, budget, lanes)
    want = budget_rows(x, budget)
    assert conv.all()
    np.testing.assert_array_equal(np.isfinite(tau), np.isfinite(want.theta))
    assert (np.abs(p - want.p) <= budget_agreement_tolerance(x, budget)).all(), np.abs(p - want.p).max()
    np.testing.assert_array_equal(sup, want.support)
    g = np.random.default_rng(6).standard_normal(x.shape)
    dx = np.empty_like(x)
    assert lib.er_budget_vjp_f64(ptr(want.p), ptr(g), ctypes.c_long(len(x)), ctypes.c_int(x.shape[1]),
                                 ctypes.c_int(lanes), ptr(dx)) == 0
    np.testing.assert_allclose(dx, budget_vjp_rows(want.p, g), rtol=0, atol=1e-13)
