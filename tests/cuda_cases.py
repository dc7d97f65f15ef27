"""Rows and error bounds shared by the CPU harness test (test_cuda_core.py) and the GPU
test (test_cupy_backend.py) of the CUDA kernels."""

from __future__ import annotations

import numpy as np

from entmax_ref.backends.numpy_backend import skew_weights

EPS64 = np.finfo(np.float64).eps
ALPHAS = (1.0, 1.0 + 1e-6, 1.25, 1.5, 2.0, 3.0, 10.0)


def rows(n_random: int, seed: int) -> np.ndarray:
    """Seeded random and adversarial rows, padded with -inf to a common length."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1, 2, 3, 7, 50, 300):
        for scale in (0.1, 1.0, 10.0):
            rows += list(rng.standard_normal((n_random, n)) * scale)
    rows += [
        np.array([0.0]), np.array([5.0, 5.0]), np.zeros(8), np.full(40, -3.25),  # constant rows
        np.array([1.0, 1.0, 1.0, 0.0]), np.array([2.0, 2.0, -1.0, -1.0, -1.0]),  # ties
        np.array([0.0, 1.0, 1.5]), np.array([-2.0, 0.0, 0.5]), np.array([1.0, 0.0, 0.0]),
        np.array([3.0, 1.0, 1.0, 1.0]), np.arange(20.0) / 10, np.arange(200.0)[::-1] / 50,
        rng.integers(-2, 3, 64).astype(float) / 4,  # many exact ties on a grid
        rng.standard_normal(30) + 1e6, rng.standard_normal(30) * 1e-3 + 1e6,  # large offsets
        rng.standard_normal(30) - 1e6, rng.standard_normal(30) * 1e-9,  # nearly uniform
        np.array([0.0, -1e-300, 1e-300]), np.array([1e3, -1e3, 0.0]),  # extreme spreads
    ]
    width = max(len(r) for r in rows)
    x = np.full((len(rows), width), -np.inf)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    # Masks: -inf inside rows, all -inf rows, and shuffled columns.
    masked = x[rng.integers(0, len(x), 40)].copy()
    masked[rng.random(masked.shape) < 0.3] = -np.inf
    x = np.vstack([x, masked, np.full((2, width), -np.inf)])
    perm = rng.permutation(width)
    return np.vstack([x, x[:50, perm]])


def theta_tol(x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """|theta| error bound: theta = m + A is one rounding of the sum (|m| + |A| scale), and
    A is the root of f with |f'| = sum p^(2-alpha) >= sum p = 1, so its error is that of
    f, a compensated sum of terms each exact to a few ulps (log n of them at most matter)."""
    m = np.max(x, axis=1, initial=-np.inf)
    live = np.isfinite(theta)
    A = np.where(live, theta - np.where(live, m, 0.0), 0.0)
    n = np.isfinite(x).sum(axis=1)
    return 8 * EPS64 * (np.abs(np.where(live, m, 0.0)) + np.abs(A) + np.log2(n + 1) + 1)


def p_tol(x, theta_ref, p_ref, alpha, dtype):
    """|p| error bound: a threshold error dtheta moves p_i by u_i dtheta (u = p^(2-alpha),
    -dp/dtheta), and evaluating p_i = exp(log1p((alpha-1) d)/(alpha-1)) rounds it by a few
    ulps times (1 + |log p_i|); float32 output adds half an ulp of float32 on each side."""
    u = skew_weights(p_ref, alpha[:, None])
    with np.errstate(divide="ignore"):
        logp = np.where(p_ref > 0, np.abs(np.log(np.where(p_ref > 0, p_ref, 1.0))), 0.0)
    tol = u * theta_tol(x, theta_ref)[:, None] + 8 * EPS64 * p_ref * (1 + logp)
    if dtype == np.float32:
        tol = tol + np.spacing(np.abs(p_ref).astype(np.float32)).astype(np.float64)
    return tol
