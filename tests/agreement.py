"""Engine agreement: the budgets within which two float64 engines must agree.

Two engines that both compute in float64 (the compiled engines against the NumPy
reference: tests/test_numba_rows.py, the CUDA core in its g++ harness and on the GPU) must
agree far more tightly than an implementation in ``dtype`` is judged by
:mod:`entmax_ref.testing.tolerance`: to a few float64 ulps *of the problem's own
conditioning*.  These budgets are written with ``eps = 2^-52`` and ``K = 8`` roundings'
worth; each function derives its budget from the row (its length, ``u = p^(2-alpha)``,
``|log p|``):

* the CUDA core (compensated sums): :func:`core_theta_tolerance`,
  :func:`core_p_tolerance`, :func:`core_p_edge_tolerance` (alpha > 2, relative to the
  edge probability), :func:`core_vjp_tolerance`, :func:`core_alpha_vjp_tolerance`;
* the numba row engine (pairwise sums, growth ``Lg = 1 + log2 |support|``):
  :func:`rows_agreement_tolerances`, :func:`rows_agreement_vjp_tolerances`;
* normmax and budget-sparsemax in float64 against the exact oracles and against each
  other (16 ulps of the row's magnitude in the threshold, carried to p):
  :func:`family_threshold_agreement`, :func:`normmax_agreement_tolerance`,
  :func:`budget_agreement_tolerance`.

They are the test suite's own: the public tolerance model judges an implementation in its
own dtype, these judge the engines against each other.
"""

from __future__ import annotations

import numpy as np

_EPS64 = float(np.finfo(np.float64).eps)
K = 8.0  #: roundings' worth in the engine-agreement budgets


def core_theta_tolerance(x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per-row |theta| budget of the CUDA core against the float64 reference : theta = m + A is one rounding of the sum (|m| + |A| scale), and
    A is the root of f with |f'| = sum p^(2-alpha) >= sum p = 1, so its error is that of
    f, a compensated sum of terms each exact to a few ulps (log n of them at most matter)."""
    m = np.max(x, axis=1, initial=-np.inf)
    live = np.isfinite(theta)
    A = np.where(live, theta - np.where(live, m, 0.0), 0.0)
    n = np.isfinite(x).sum(axis=1)
    return 8 * _EPS64 * (np.abs(np.where(live, m, 0.0)) + np.abs(A) + np.log2(n + 1) + 1)


def core_p_tolerance(x, theta_ref, p_ref, alpha, dtype):
    """Per-entry |p| budget of the CUDA core (``alpha`` per row): a threshold error dtheta moves p_i by u_i dtheta (u = p^(2-alpha),
    -dp/dtheta), and evaluating p_i = exp(log1p((alpha-1) d)/(alpha-1)) rounds it by a few
    ulps times (1 + |log p_i|); float32 output adds half an ulp of float32 on each side."""
    from entmax_ref.backends.numpy_elementwise import skew_weights

    u = skew_weights(p_ref, alpha[:, None])
    with np.errstate(divide="ignore"):
        logp = np.where(p_ref > 0, np.abs(np.log(np.where(p_ref > 0, p_ref, 1.0))), 0.0)
    tol = u * core_theta_tolerance(x, theta_ref)[:, None] + 8 * _EPS64 * p_ref * (1 + logp)
    if dtype == np.float32:
        tol = tol + np.spacing(np.abs(p_ref).astype(np.float32)).astype(np.float64)
    return tol


def core_p_edge_tolerance(x, p_ref):
    """alpha > 2: per-entry |p| budget of the CUDA core from the edge probability q .  The mass is increasing in q
    with slope >= 1, so q's error is that of the compensated mass (a few ulps of 1, log n
    of them at most matter), and dp_i/dq = (q/p_i)^(alpha-2) <= 1 carries it to every p_i;
    evaluating p_i = exp(logaddexp(log((alpha-1) d_i), (alpha-1) log q)/(alpha-1)) rounds it
    by a few ulps times (1 + |log p_i|).  Much tighter than core_p_tolerance at the edge, where u =
    p^(2-alpha) is huge (inf where it overflows)."""
    n = np.isfinite(x).sum(axis=1)
    with np.errstate(divide="ignore"):
        logp = np.where(p_ref > 0, np.abs(np.log(np.where(p_ref > 0, p_ref, 1.0))), 0.0)
    return 8 * _EPS64 * (np.log2(n + 1) + 1)[:, None] + 8 * _EPS64 * p_ref * (1 + logp)


def core_vjp_tolerance(p, g, alpha):
    """Per-entry dx budget of the CUDA core's VJP against the float64 reference: each term is a few roundings of ``u_i (g_i - r)``, so ``16 eps u_i (|g_i| + r)``
    with ``r = sum |u g| / sum u``; and the core's ``u_i = exp((2 - alpha) log p_i)`` is
    within ``k_i eps`` of the reference's correctly rounded one, ``k_i = |(2 - alpha) log p_i|
    + 2``, which moves ``dx_i`` by ``k_i eps u_i (|g_i| + r)`` and ``r`` by ``eps sum_j k_j u_j
    (|g_j| + r) / sum u``.  ``p``, ``g`` float64 (rows, n), ``alpha`` (rows,)."""
    from entmax_ref.backends.numpy_elementwise import skew_weights

    a = np.asarray(alpha, np.float64)[:, None]
    u = skew_weights(p, a)
    su = u.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(su > 0, np.abs(u * g).sum(axis=1, keepdims=True) / su, 0.0)
        k = np.where(p > 0, np.abs((2.0 - a) * np.log(np.where(p > 0, p, 1.0))), 0.0) + 2.0
        dr = np.where(su > 0, (k * u * (np.abs(g) + r)).sum(axis=1, keepdims=True) / su, 0.0)
    return _EPS64 * u * ((16 + k) * (np.abs(g) + r) + dr)


def core_alpha_vjp_tolerance(p, g, alpha):
    """Per-row dL/dalpha budget of the CUDA core against the float64 reference :
    every term ``p_i c_i`` is at most ``p_i L_i^2 e^{|(alpha-1) L_i|}`` (L = log p), so
    ``64 eps (sum |g_i| |p_i c_i| + sum |u g| sum |p c| / sum u)``.  ``p``, ``g`` float64
    (rows, n), ``alpha`` (rows,)."""
    from entmax_ref.backends.numpy_elementwise import skew_weights

    a = np.asarray(alpha, np.float64)[:, None]
    on = p > 0
    with np.errstate(divide="ignore"):
        L = np.where(on, np.log(np.where(on, p, 1.0)), 0.0)
    pc = np.where(on, p * L * L * np.exp(np.minimum(np.abs((a - 1) * L), 700)), 0.0)
    u = skew_weights(p, a)
    su = u.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(su > 0, np.abs(u * g).sum(axis=1) * pc.sum(axis=1) / su, 0.0)
    return 64 * _EPS64 * ((np.abs(g) * pc).sum(axis=1) + corr)


def rows_agreement_tolerances(x64: np.ndarray, alpha: np.ndarray, p: np.ndarray, theta: np.ndarray):
    """(per-entry p tolerance, per-row theta tolerance) between two float64 row engines
    that sum pairwise (numba against the NumPy reference), from the float64 reference's
    ``p`` and ``theta`` .

    The threshold is the root of ``f(A) = sum_i p_i(A) - 1``.  Both engines evaluate f to
    ``eps Lg S1`` with ``S1 = sum_S p (1 + |log p|)`` (each p carries ~``eps (1 + |log p|)``
    from log1p/exp; ``Lg = 1 + log2 |S|`` bounds pairwise summation), and ``|f'| = sum_S
    u``, so the roots differ by ``dA <= K eps (Lg S1 / sum u + R)``, ``R = 1 + |A| +
    1/(alpha - 1)`` (``1 + |A|`` at alpha 1); ``|dp_i| <= u_i dA + K eps p_i (1 + |log
    p_i|)``.  For alpha > 2 both solve relative to the smallest support entry, so ``|dp_i|
    <= K eps [(u_i / sum u) Lg S1 + p_i (1 + |log p_i| + 1/(alpha - 1))]`` (u may overflow
    at the edge; the ratio does not).  theta = max + A is rounded once more: ``|dtheta| <=
    dA + K eps (|theta| + |max|)``.  float32 output adds one float32 ulp of p (the caller's)."""
    rows, n = x64.shape
    tol_p = np.zeros_like(p)
    tol_t = np.zeros(rows)
    for r in range(rows):
        if not np.isfinite(theta[r]):
            continue
        a = alpha[r]
        m = x64[r].max()
        A = theta[r] - m
        on = p[r] > 0
        ps = p[r][on]
        logp = np.log(ps)
        lg = 1.0 + np.log2(max(on.sum(), 1))
        s1 = np.sum(ps * (1.0 + np.abs(logp)))
        if a > 2.0:
            # u = p^(2-alpha) is unbounded at the support's edge (it may overflow), but
            # the solve is relative to the edge entry: dp_i = (u_i / sum u) * (error of
            # the mass) plus the rounding of p_i itself, and d_i + delta carries only a
            # relative rounding, which moves p_i by eps p_i / (alpha - 1)
            lu = (2.0 - a) * logp
            lsu = np.logaddexp.reduce(lu)
            w = np.exp(lu - lsu)
            dA = K * _EPS64 * (lg * s1 * np.exp(-lsu) + 2.0 / (a - 1.0))
            tol_p[r][on] = K * _EPS64 * (w * lg * s1 + ps * (1.0 + np.abs(logp) + 1.0 / (a - 1.0)))
        else:
            u = np.exp((2.0 - a) * logp)
            R = 1.0 + abs(A) + (1.0 / (a - 1.0) if a > 1.0 else 0.0)
            dA = K * _EPS64 * (lg * s1 / u.sum() + R)
            tol_p[r][on] = u * dA + K * _EPS64 * ps * (1.0 + np.abs(logp))
        tol_t[r] = dA + K * _EPS64 * (abs(theta[r]) + abs(m))
    return tol_p, tol_t


def rows_agreement_vjp_tolerances(p, g, alpha):
    """(per-entry dx tolerance, per-row dalpha tolerance) between two float64 row engines
    (numba against the NumPy reference), from float64 ``p``, ``g`` and per-row
    ``alpha``:

    |d dx_i| <= K eps [u_i e_i (|g_i| + |r|) + u_i Lg (sum_j u_j e_j (|g_j| + |r|)) / sum u],
    e_i = 1 + |(2 - alpha) log p_i| (the relative error of u_i), r = (u.g)/sum u.

    alpha > 2 (the overflow-free forms of both backends): the ratios u_j / sum u are
    formed as w_j / sum w (w = u / max u), u_i e_i ... as exp(log u_i + log(...)) (inf
    where it overflows, where the check is that both sides give the same inf); at the
    entry m of largest u, dx_m = sum_{j != m} u_j (g_m - g_j) / sum w, so
    |d dx_m| <= K eps Lg sum_{j != m} u_j e_j (|g_m| + |g_j|) / sum w; the alpha VJP is
    sum_i p_i (1 + t_i) (g_i - r) / (alpha-1)^2, t_i = (alpha - 1)|log p_i|, each term
    carrying ~ (3 + |log p_i|) relative error plus that of r."""
    rows = p.shape[0]
    tol = np.zeros_like(p)
    tol_a = np.zeros(rows)
    for r in range(rows):
        on = p[r] > 0
        if not on.any():
            continue
        a = alpha[r]
        ps, gs = p[r][on], g[r][on]
        logp = np.log(ps)
        lg = 1.0 + np.log2(on.sum())
        if a > 2.0:
            lu = (2.0 - a) * logp
            m = lu.argmax()
            w = np.exp(lu - lu[m])
            sw = w.sum()
            e = 2.0 + np.abs(lu)
            rr = np.dot(w, gs) / sw
            spread = lg * np.sum(w * e * (np.abs(gs) + abs(rr))) / sw
            with np.errstate(over="ignore"):
                t = np.exp(lu + np.log(e * (np.abs(gs) + abs(rr)) + spread))
                others = np.arange(len(ps)) != m
                t[m] = lg * np.sum(np.exp(lu[others]) * e[others] * (abs(gs[m]) + np.abs(gs[others]))) / sw
            tol[r][on] = K * _EPS64 * t
            a1 = a - 1.0
            rel = 3.0 + np.abs(logp)
            tol_a[r] = K * _EPS64 * lg * np.sum(ps * (1.0 - a1 * logp) * (rel * (np.abs(gs) + abs(rr)) + spread)) / a1**2
            continue
        u = np.exp((2.0 - a) * logp)
        e = 2.0 + np.abs((2.0 - a) * logp)
        su = u.sum()
        rr = np.dot(u, gs) / su
        spread = lg * np.sum(u * e * (np.abs(gs) + abs(rr))) / su
        tol[r][on] = K * _EPS64 * u * (e * (np.abs(gs) + abs(rr)) + spread)
        # alpha VJP: terms g_i p_i c_i and (u.g)(sum p c)/sum u, each entry carrying
        # ~ (3 + |log p| + e) relative error, summed with growth Lg
        w = -(a - 1.0) * logp
        pc = np.abs(ps * logp * logp) * np.maximum(0.5, np.abs(np.expm1(w) - w) / np.maximum(w * w, 1e-300))
        rel = 3.0 + np.abs(logp) + e
        tol_a[r] = K * _EPS64 * lg * (np.sum(np.abs(gs) * pc * rel) + np.sum(u * np.abs(gs) * rel) * np.sum(pc * rel) / su)
    return tol, tol_a


def family_threshold_agreement(tau):
    """|tau| budget of a float64 normmax or budget-sparsemax threshold against the exact
    one : 16 ulps of ``1 + |tau|``."""
    return 16 * _EPS64 * (1 + np.abs(tau))


def normmax_agreement_tolerance(x, p_ref, tau, alpha, scale=16.0):
    """Per-entry |p| budget of a float64 alpha-normmax against the exact one .

    First-order propagation of ``scale`` ulps in tau (relative to the row's magnitude)
    plus the rounding of p itself: ``|dp_i| <= |dp_i/dtau| dtau + scale eps p_i``, with
    ``dp_i/dtau = gamma p_i (sum_j p_j / t_j - 1 / t_i)``, ``gamma = 1/(alpha - 1)``,
    ``t = x - tau``.  ``alpha`` scalar or (rows, 1)."""
    g = 1.0 / (alpha - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p_ref > 0, x - tau[:, None], np.inf)
        pt = np.where(p_ref > 0, p_ref / t, 0.0)
    dtau = scale * _EPS64 * (1.0 + np.nanmax(np.where(np.isfinite(x), np.abs(x), 0.0), axis=1, keepdims=True))
    sens = g * (pt + p_ref * pt.sum(axis=1, keepdims=True))
    return scale * _EPS64 * p_ref + sens * dtau + 1e-300


def budget_agreement_tolerance(x, budget):
    """(rows, 1) |p| budget of a float64 budget-sparsemax against the exact one: a few roundings of ``tau = max + (|U| + sum_F (x - max) - B)/|F|`` and of
    ``x - tau``, ``16 eps (1 + max|x| + max B)``."""
    mag = np.nanmax(np.where(np.isfinite(x), np.abs(x), 0.0), axis=1, keepdims=True)
    return 16 * _EPS64 * (1 + mag + np.max(budget))



def float64_support(ref, x, alpha) -> np.ndarray:
    """The support a float64 solver finds on rows ``x`` at ``alpha``, from a CPU engine's
    :class:`RowSolve` ``ref`` of them: the count of its nonzero correctly rounded float64 p.
    A row's ``support`` there is the real-number support, which also counts entries whose
    exact probability rounds to 0 in float64 (softmax entries 750 below the maximum); a
    float32 row's float64 p are those of its (exactly widened) float64 scores."""
    if ref.p.dtype == np.float32:
        from entmax_ref.backends.numpy_backend import NumpyBackend

        ref = NumpyBackend().entmax_forward(np.asarray(x, np.float64), np.asarray(alpha, np.float64), None)
    return np.count_nonzero(ref.p > 0, axis=1)
