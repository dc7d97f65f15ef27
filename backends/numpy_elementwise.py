"""The elementwise maps of the NumPy reference, shared by its row solvers
(:mod:`.numpy_backend`) and its attention driver (:mod:`.numpy_attention`), so that neither
imports the other: ``e_alpha``, the Jacobian weights ``u = p^(2-alpha)`` (plain and
normalised by the row's largest), and the edge-relative probabilities used above alpha = 2.
Units as in :mod:`entmax_ref.backends._base`."""

from __future__ import annotations

import numpy as np


def e_alpha(y: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``[1 + (alpha - 1) y]_+ ** (1 / (alpha - 1))``, and ``exp(y)`` where alpha == 1.

    Computed as ``exp(log1p((alpha - 1) y) / (alpha - 1))``, which is accurate for every
    alpha >= 1, including alpha -> 1 where it tends to ``exp(y)``.  ``y = -inf`` gives 0.
    """
    a1 = alpha - 1.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.maximum(a1 * y, -1.0)
        logp = np.where(a1 == 0.0, y, np.log1p(t) / np.where(a1 == 0.0, 1.0, a1))
    return np.exp(logp)


def skew_weights(p: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``u = p ** (2 - alpha)`` on the support of p and 0 elsewhere (the Jacobian weights)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        u = np.exp((2.0 - alpha) * np.log(p))
    return np.where(p > 0, u, 0.0)


def normalised_skew(p: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``w = u / max u`` per row, computed as ``exp(log u - max log u)`` (u = p^(2 - alpha)
    on the support, 0 elsewhere), for rows with alpha > 2 where u itself may overflow.
    alpha: (rows, 1)."""
    on = p > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lu = np.where(on, (2.0 - alpha) * np.log(np.where(on, p, 1.0)), -np.inf)
    lmax = lu.max(axis=1, keepdims=True)
    lmax = np.where(np.isfinite(lmax), lmax, 0.0)
    return np.where(on, np.exp(lu - lmax), 0.0)


def edge_p(Ld: np.ndarray, d: np.ndarray, q: np.ndarray, a1: np.ndarray) -> np.ndarray:
    """alpha > 2, edge-relative: ``p_i = (a1 d_i + q^a1)^(1/a1)`` for ``d_i >= 0`` (0 for
    ``d_i < 0``), with ``Ld = log(a1 d)`` precomputed; ``q`` is the edge probability.

    Evaluated as ``exp(logaddexp(log(a1 d_i), a1 log q) / a1)`` so that ``q^a1`` (below
    the float64 range once q < ~1e-308^(1/a1), e.g. q < 8e-4 at alpha = 100) never has
    to be formed; ``p = q`` exactly at the edge (d = 0).  For d > 0 the value is at least q
    (the exact one is above it): the log round trip can land an ulp below q where ``a1 d``
    is negligible next to ``q^a1``, which would rank an entry above the edge below it.
    Elementwise: q and a1 broadcast against Ld and d (one per row: shape (rows, 1))."""
    with np.errstate(divide="ignore"):
        lqa = a1 * np.log(q)
    p = np.maximum(np.exp(np.logaddexp(Ld, lqa) / a1), q)
    return np.where(d > 0, p, np.where(d == 0, q, 0.0))
