"""NumPy reference of budget-sparsemax (alpha-normmax, correctly rounded on both CPU
engines, is :mod:`.exact_normmax`).

Written to be read, vectorised over rows, in float64 whatever the input dtype (only the
probabilities are rounded to the input dtype).  The support is found exactly from the
sorted row, then the threshold in closed form: no fixed number of bisection steps, no
renormalisation that hides an unconverged solve.

budget-sparsemax (``docs/math/budget_sparsemax.md``)
    ``p = argmin ||p - x||^2`` over ``{0 <= p <= 1, sum p = B}`` is ``clip(x - tau, 0, 1)``.
    ``h(tau) = sum_i clip(x_i - tau, 0, 1)`` is continuous, piecewise linear and
    nonincreasing with breakpoints at ``x_i`` and ``x_i - 1``.  A binary search over the
    sorted breakpoints finds the first one where ``h > B``; between it and the previous
    one ``h`` is linear with the upper set ``U`` and free set ``F`` fixed, and
    ``tau = c + (|U| + sum_F (x_i - c) - B) / |F|`` exactly, with ``c`` the largest free
    entry (the free entries lie within 1 of it, so the differences do not round).  Where the solution
    set of ``h(tau) = B`` is an interval (an integer budget with an empty free set) the
    smallest ``tau`` of it is returned; a row whose unmasked entries number at most ``B``
    gets ``p = 1`` on all of them and ``tau = -inf``.
"""

from __future__ import annotations

import numpy as np

from ._base import RowSolve
from .exact_sums import dot_rows

_F64 = np.float64
#: a row sum of magnitude below this cannot overflow float64 (2^1020: eight times below its largest)
_SUM_LIMIT = 2.0 ** 1020


# ----------------------------------------------------------------------------- budget
def _first_over(x: np.ndarray, fin: np.ndarray, s: np.ndarray, k: np.ndarray, budget: np.ndarray,
                kind: float) -> np.ndarray:
    """Per row, the first rank ``j < k`` with ``h(s_j - kind) > budget`` (``k`` when none),
    ``s`` the row sorted descending.  ``h`` at the breakpoint is formed from the differences
    ``x_i - s_j``, never from ``s_j - 1`` itself (which rounds to ``s_j`` once ``|s_j| >= 2^53``);
    a difference that overflows is +-inf, and its clip is exact."""
    idx = np.arange(len(s))
    lo = np.zeros(len(s), np.int64)
    hi = k.copy()
    while np.any(lo < hi):
        act = lo < hi
        mid = np.where(act, (lo + hi) // 2, 0)
        with np.errstate(over="ignore", invalid="ignore"):
            d = x - s[idx, mid][:, None]
            mass = np.where(fin, np.clip(d + kind, 0.0, 1.0), 0.0).sum(axis=1)
        over = mass > budget
        hi = np.where(act & over, mid, hi)
        lo = np.where(act & ~over, mid + 1, lo)
    return lo


def budget_rows(x: np.ndarray, budget: np.ndarray) -> RowSolve:
    """budget-sparsemax of every row of ``x`` (rows, n); budget (rows,) float64 in [0, n].

    ``theta`` is the ``tau`` of ``p = clip(x - tau, 0, 1)`` (the smallest one when it is
    not unique, -inf when every unmasked entry is 1), rounded to float64; ``p`` itself is
    formed from ``tau`` and what that rounding drops, so it is exact where ``tau`` is not
    representable (``|x| >= 2^53``); ``n_iter`` is 0 (exact)."""
    rows, n = x.shape
    x64 = x.astype(_F64)
    fin = np.isfinite(x64)
    k = fin.sum(axis=1)
    tau = np.full(rows, -np.inf)
    p = fin.astype(_F64)  # rows with at most `budget` unmasked entries: all of them are 1
    solved = k > budget
    if solved.any():
        xs, fs, ks, B = x64[solved], fin[solved], k[solved], budget[solved]
        s = -np.sort(-xs, axis=1)  # descending, -inf last
        idx = np.arange(len(s))
        j_up = _first_over(xs, fs, s, ks, B, 1.0)  # ranks < j_up are 1
        j_in = _first_over(xs, fs, s, ks, B, 0.0)  # ranks >= j_in are 0; F = [j_up, j_in)
        c = s[idx, j_up]  # the largest free entry (j_up < k, as k > budget)
        n_free = j_in - j_up
        rank = np.arange(n)[None, :]
        with np.errstate(over="ignore", invalid="ignore"):
            # the free entries lie within 1 of c: these differences do not round
            free_sum = np.where((rank >= j_up[:, None]) & (rank < j_in[:, None]), s - c[:, None], 0.0).sum(axis=1)
            r = np.where(n_free > 0, (j_up + free_sum - B) / np.maximum(n_free, 1), 0.0)  # tau = c + r
            top = np.where(j_up > 0, s[idx, np.maximum(j_up - 1, 0)], np.inf)  # entries >= top are 1
            low = np.where(j_in < n, s[idx, np.minimum(j_in, n - 1)], -np.inf)  # entries <= low are 0
            # tau = c + r as hi + lo exactly (TwoSum): p = (x - hi) - lo keeps what hi rounds off
            hi = c + r
            lo = (c - (hi - (hi - c))) + (r - (hi - c))
            mid = np.clip((xs - hi[:, None]) - lo[:, None], 0.0, 1.0)
        p[solved] = np.where(xs >= top[:, None], 1.0, np.where(xs <= low[:, None], 0.0, mid))
        tau[solved] = hi
    support = (p > 0).sum(axis=1).astype(np.int64)
    return RowSolve(p.astype(x.dtype, copy=False), tau, support, np.zeros(rows, np.int64), np.ones(rows, bool))


def budget_vjp_rows(p: np.ndarray, g: np.ndarray) -> np.ndarray:
    """dL/dx of budget-sparsemax: ``g_i - mean_F(g)`` on the free set ``F = {0 < p < 1}``,
    0 elsewhere (all zeros when F is empty).  A row whose sum over F could overflow is
    scaled by a power of two (exact) first; the sum is correctly rounded
    (:func:`.exact_sums.dot_rows`), so every engine gives the same bits; a difference whose
    true value is beyond float64's range is +-inf."""
    p64 = p.astype(_F64)
    g64 = g.astype(_F64)
    F = (p64 > 0) & (p64 < 1)
    nF = F.sum(axis=1, keepdims=True)
    big = np.where(F, np.abs(g64), 0.0).max(axis=1, keepdims=True, initial=0.0)
    scale = np.where(big >= _SUM_LIMIT / np.maximum(nF, 1), np.ldexp(1.0, -np.frexp(big)[1]), 1.0)
    gs = g64 * scale
    mean = dot_rows(np.where(F, gs, 0.0))[:, None] / np.maximum(nF, 1)
    with np.errstate(over="ignore"):
        dx = np.where(F, (gs - mean) / scale, 0.0)
    return dx.astype(np.result_type(p.dtype, g.dtype), copy=False)
