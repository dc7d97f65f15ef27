"""NumPy reference of the rest of the family: alpha-normmax and budget-sparsemax.

Both are written to be read, vectorised over rows, in float64 whatever the input dtype
(only the probabilities are rounded to the input dtype).  Both identify the support
exactly from the sorted row and then solve for the threshold to full working precision:
no fixed number of bisection steps, no renormalisation that hides an unconverged solve.

alpha-normmax (``docs/math/normmax.md``)
    ``p = argmax_{p in simplex} <x, p> - ||p||_alpha``.  With ``beta = alpha / (alpha - 1)``
    and ``t_i = [x_i - tau]_+``, the optimality conditions give
    ``p_i = t_i^(1/(alpha-1)) / sum_j t_j^(1/(alpha-1))`` where ``tau`` solves
    ``||t||_beta = 1``.  Sort the row descending (``s``); the support is the first ``K``
    entries, ``K`` the largest rank with ``sum_{i<K} (s_i - s_K)^beta < 1`` (found by a
    binary search over ranks: that sum grows with the rank).  On the support,
    ``phi(tau) = ||s_{<K} - tau||_beta - 1`` is convex (a norm of an affine map) and
    decreasing, so Newton from a left end of the support's interval, where ``phi >= 0``,
    increases monotonically to the root; it stops when a step no longer increases tau.

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
from .constants import MAX_NEWTON
from .exact_sums import dot_rows

_F64 = np.float64
#: a row sum of magnitude below this cannot overflow float64 (2^1020: eight times below its largest)
_SUM_LIMIT = 2.0 ** 1020


# ----------------------------------------------------------------------------- normmax
def _norm_phi(t: np.ndarray, beta: np.ndarray):
    """``||t||_beta`` per row and ``sum_i (t_i / ||t||_beta)^(beta - 1)`` (``-phi'``),
    for nonnegative ``t`` (zeros allowed; each row has a positive entry), scaled by
    the row's largest entry so nothing overflows."""
    top = t.max(axis=1, keepdims=True)
    r = t / top
    with np.errstate(divide="ignore"):
        lr = np.where(r > 0, np.log(r), -np.inf)
    srb = np.exp(beta * lr).sum(axis=1, keepdims=True)  # >= 1 (the top entry)
    norm = top * srb ** (1.0 / beta)
    # (t_i / N)^(beta - 1) = exp((beta - 1) (log r_i - log srb / beta))
    slope = np.exp((beta - 1.0) * (lr - np.log(srb) / beta)).sum(axis=1, keepdims=True)
    return norm[:, 0], slope[:, 0]


def normmax_rows(x: np.ndarray, alpha: np.ndarray) -> RowSolve:
    """alpha-normmax of every row of ``x`` (rows, n); alpha (rows,) float64, all > 1.

    ``theta`` of the returned :class:`RowSolve` is the x-space ``tau`` of the threshold
    form above; ``n_iter`` counts Newton steps; -inf rows give zeros and ``tau = -inf``.
    """
    rows, n = x.shape
    x64 = x.astype(_F64)
    p = np.zeros((rows, n))
    tau = np.full(rows, -np.inf)
    n_iter = np.zeros(rows, np.int64)
    converged = np.ones(rows, bool)
    m = x64.max(axis=1, initial=-np.inf)
    live = np.isfinite(m)
    if live.any():
        with np.errstate(over="ignore"):  # a gap beyond float64's range is -inf: out of the support, like a mask
            y = x64[live] - m[live, None]  # the maximum is 0, masked entries -inf
        a = alpha[live][:, None]
        beta = a / (a - 1.0)
        s = -np.sort(-y, axis=1)  # descending, -inf last
        R = len(s)
        ranks = np.arange(n)
        # entries at or below max - 1 are never in the support (the top alone has norm >= 1)
        cand = (s > -1.0).sum(axis=1)
        lo = np.zeros(R, np.int64)  # rank 0 is always in the support
        hi = cand - 1
        while np.any(lo < hi):
            mid = (lo + hi + 1) // 2
            sm = s[np.arange(R), mid][:, None]
            with np.errstate(invalid="ignore"):
                d = np.where(ranks[None, :] < mid[:, None], s - sm, 0.0)
            mass = (d ** beta).sum(axis=1)  # sum_{i < mid} (s_i - s_mid)^beta
            inside = mass < 1.0
            act = lo < hi
            lo = np.where(act & inside, mid, lo)
            hi = np.where(act & ~inside, mid - 1, hi)
        K = lo + 1
        on = ranks[None, :] < K[:, None]
        below = np.where(K < n, s[np.arange(R), np.minimum(K, n - 1)], -np.inf)
        t_lo = np.maximum(below, -1.0)  # phi(t_lo) >= 0
        t_hi = s[np.arange(R), K - 1]  # phi < 0 just below it... the root is < t_hi
        T = t_lo.copy()
        done = np.zeros(R, bool)
        its = np.zeros(R, np.int64)
        for _ in range(MAX_NEWTON):
            t = np.where(on, s - T[:, None], 0.0)
            norm, slope = _norm_phi(t, beta)
            step = (norm - 1.0) / slope
            nxt = np.minimum(T + step, t_hi)
            grow = (~done) & (nxt > T) & (norm > 1.0)
            its += grow
            T = np.where(grow, nxt, T)
            done |= ~grow
            if done.all():
                break
        converged[live] = done
        # probabilities t_i^(1/(alpha-1)) / sum, scaled by the largest t (the row's maximum)
        g = 1.0 / (a - 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            t = np.maximum(y - T[:, None], 0.0)
            r = t / (-T[:, None])
            w = np.where(r > 0, np.exp(g * np.log(np.where(r > 0, r, 1.0))), 0.0)
        p[live] = w / w.sum(axis=1, keepdims=True)
        tau[live] = m[live] + T
        n_iter[live] = its
    support = (p > 0).sum(axis=1).astype(np.int64)
    return RowSolve(p.astype(x.dtype, copy=False), tau, support, n_iter, converged)


def normmax_vjp_rows(p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """dL/dx of alpha-normmax from its output: ``v * (g - <p, g>) - p * (v . (g - <p, g>))``
    with ``v_i = N (p_i / N)^(2 - alpha) / (alpha - 1)`` on the support, ``N = ||p||_alpha``
    (0 elsewhere).  The Jacobian ``(I - p 1^T) diag(v) (I - 1 p^T)`` is symmetric."""
    p64 = p.astype(_F64)
    g64 = g.astype(_F64)
    a = alpha[:, None]
    on = p64 > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lp = np.where(on, np.log(np.where(on, p64, 1.0)), -np.inf)
        top = lp.max(axis=1, keepdims=True, initial=-np.inf)
        lnorm = top + np.log(np.where(on, np.exp(a * (lp - top)), 0.0).sum(axis=1, keepdims=True)) / a
        lnorm = np.where(np.isfinite(top), lnorm, 0.0)
        v = np.where(on, np.exp(lnorm + (2.0 - a) * (lp - lnorm)) / (a - 1.0), 0.0)
        d = g64 - (p64 * g64).sum(axis=1, keepdims=True)
        vd = np.where(on, v * d, 0.0)
        dx = vd - p64 * vd.sum(axis=1, keepdims=True)
    return dx.astype(np.result_type(p.dtype, g.dtype), copy=False)


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
