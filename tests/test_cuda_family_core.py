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
from entmax_ref.backends.exact_normmax import normmax_rows, normmax_vjp_rows
from entmax_ref.backends.numpy_family import budget_rows, budget_vjp_rows
from agreement import budget_agreement_tolerance, family_threshold_agreement
from family_oracle import budget_np

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


def budget_tolerance(budget):
    """The CPU engines' budget-sparsemax tolerance (tests/test_budget_sparsemax.py): the free
    entries lie within 1 of each other, so the error does not grow with the row's magnitude."""
    return budget_agreement_tolerance(np.ones((1, 1)), np.asarray(budget, np.float64))


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
    assert (np.abs(p - want.p) <= budget_tolerance(budget)).all(), np.abs(p - want.p).max()
    np.testing.assert_array_equal(sup, want.support)
    g = np.random.default_rng(6).standard_normal(x.shape)
    dx = np.empty_like(x)
    assert lib.er_budget_vjp_f64(ptr(want.p), ptr(g), ctypes.c_long(len(x)), ctypes.c_int(x.shape[1]),
                                 ctypes.c_int(lanes), ptr(dx)) == 0
    np.testing.assert_allclose(dx, budget_vjp_rows(want.p, g), rtol=0, atol=1e-13)


BIG = 2.0 ** 53
#: rows whose exact projection is representable, with their budget: entries beyond 2^53
#: and up to the float maximum, apart and tied
EXACT_BUDGET_ROWS = [
    ([1.7976931348623157e308, -1.7976931348623157e308], 1.25, [1.0, 0.25]),
    ([4 * BIG, 4 * BIG - 8.0, 0.0, -np.inf], 1.5, [1.0, 0.5, 0.0, 0.0]),
    ([1e300, -1e300, 0.0, 0.25, -np.inf], 1.5, [1.0, 0.0, 0.125, 0.375, 0.0]),
    ([-1e17, -1e17, -1e17, 1e17], 2.5, [0.5, 0.5, 0.5, 1.0]),
]


@pytest.mark.parametrize("lanes", LANES)
def test_budget_core_is_exact_at_every_magnitude(lib, lanes):
    """|x| >= 2^53 and up to the float64 maximum: the rows the CPU engines project exactly
    come out exactly, and rows of whole float64 steps around huge offsets (ties, masks, an
    entry at -offset) are the exact projection within the CPU's tolerance, which does not
    grow with the offset."""
    for row, budget, want in EXACT_BUDGET_ROWS:
        p = _forward(lib, "er_budget_f64", np.array([row]), [budget], lanes)[0]
        np.testing.assert_array_equal(p[0], want, err_msg=str(row))
    rng = np.random.default_rng(9)
    rows, budgets = [], []
    for shift in (2.0 ** 50, 2.0 ** 52, 2.0 ** 53, 1e16, -1e17, 2.0 ** 60, 1e300, -1e300, 1.7e308):
        for _ in range(6):
            steps = rng.integers(-8, 9, 8).astype(float)
            extra = [[], [-shift], [-np.inf]][rng.integers(0, 3)]
            rows.append(np.concatenate([shift + np.spacing(abs(shift)) * steps, extra, [-np.inf] * (1 - len(extra))]))
            budgets.append(rng.uniform(0, 9))
    x, budgets = np.array(rows), np.array(budgets)
    p, tau, _, _, conv = _forward(lib, "er_budget_f64", x, budgets, lanes)
    assert conv.all()
    want = budget_np(x, budgets)[0]
    err = np.abs(p - want)
    tol = budget_tolerance(budgets)
    assert (err <= tol).all(), (np.argwhere(err > tol)[:3], err.max())
