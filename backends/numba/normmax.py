"""alpha-normmax kernels of the numba backend (forward and VJP), float64 math.

Same algorithm as the NumPy reference (:mod:`entmax_ref.backends.numpy_family`), per row:

1. ``m = max(x)``; an all ``-inf`` row (or ``n = 0``) gives zeros and ``tau = -inf``.
2. Candidates ``y_i = x_i - m > -1`` (the top entry alone has ``beta``-norm 1 at
   ``tau = m - 1``, so ``tau >= m - 1`` and the others are 0), sorted.
3. Support size ``K``: binary search over ranks of the largest ``j`` with
   ``sum_{i<j} (s_i - s_j)^beta < 1`` (``s`` descending, ``beta = alpha / (alpha - 1)``).
4. Newton on ``phi(T) = ||s_{<K} - T||_beta - 1`` (convex, decreasing) from the left end
   ``max(s_K, -1)`` of the support's interval: monotone; stops when ``phi <= 0`` or a
   step no longer increases ``T``.
5. ``p_i = (t_i / t_0)^(1/(alpha-1)) / sum``, ``t_i = [y_i - T]_+`` (Neumaier-compensated
   sum), ``tau = m + T``.

Rows run in blocks on Python worker threads, each a ``nogil`` kernel
(:func:`~._threads.run_blocks`; small inputs on the calling thread alone).
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import MAX_NEWTON
from ._jit import f64, i64, jit, kernel
from .compensated import acc as _acc
from .sorting import sort
from ._threads import run_blocks
from .rows import solved_type


@jit
def _norm_slope(s, k, K, T, beta):
    """``||s_desc[:K] - T||_beta`` and ``sum_i ((s_i - T) / norm)^(beta - 1)``, with
    ``s_desc[i] = s[k - 1 - i]`` (``s`` ascending); scaled by the top term ``s_desc[0] - T``."""
    top = s[k - 1] - T
    srb = 0.0
    for i in range(K):
        r = (s[k - 1 - i] - T) / top
        if r > 0.0:
            srb += math.exp(beta * math.log(r))
    lsr = math.log(srb) / beta
    slope = 0.0
    for i in range(K):
        r = (s[k - 1 - i] - T) / top
        if r > 0.0:
            slope += math.exp((beta - 1.0) * (math.log(r) - lsr))
    return top * math.exp(lsr), slope


@jit
def _normmax_row(x, out, a, c):
    """alpha-normmax of one row into ``out``; returns (tau, support, n_iter, converged).
    ``c`` is float64 scratch of length >= n."""
    n = x.shape[0]
    m = -np.inf
    for i in range(n):
        v = np.float64(x[i])
        if v > m:
            m = v
    if m == -np.inf:
        for i in range(n):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = np.int64(0)  # not a literal: see the package docstring
    for i in range(n):
        y = np.float64(x[i]) - m
        if y > -1.0:
            c[k] = y
            k += 1
    s = c[:k]
    sort(s)  # ascending; s[k - 1] == 0 is the maximum (c is scratch again after the solve)
    beta = a / (a - 1.0)
    lo = 0
    hi = k - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        sm = s[k - 1 - mid]
        mass = 0.0
        for i in range(mid):
            mass += (s[k - 1 - i] - sm) ** beta
        if mass < 1.0:
            lo = mid
        else:
            hi = mid - 1
    K = lo + 1
    below = s[k - 1 - K] if K < k else -np.inf
    T = max(below, -1.0)
    t_hi = s[k - K]
    it = 0
    ok = False
    for _ in range(MAX_NEWTON):
        norm, slope = _norm_slope(s, k, K, T, beta)
        if not norm > 1.0:
            ok = True
            break
        nxt = min(T + (norm - 1.0) / slope, t_hi)
        if not nxt > T:
            ok = True
            break
        T = nxt
        it += 1
    g = 1.0 / (a - 1.0)
    top = -T
    S, cS = 0.0, 0.0
    for i in range(n):
        t = np.float64(x[i]) - m - T
        if t > 0.0:
            w = math.exp(g * math.log(t / top))
            c[i] = w
            S, cS = _acc(S, cS, w)
        else:
            c[i] = 0.0
    S = S + cS
    cnt = 0
    for i in range(n):
        v = c[i] / S
        if v > 0.0:
            cnt += 1
        out[i] = v
    return m + T, cnt, it, ok


@kernel(lambda x: (x[:, ::1], f64[::1], solved_type(x), i64, i64), ops=("normmax_forward",))
def _forward_blk(x, alpha, res, r0, r1):
    tau, support, n_iter, converged = res.theta, res.support, res.n_iter, res.converged
    out = res.p
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        tau[r], support[r], n_iter[r], converged[r] = _normmax_row(x[r], out[r], alpha[r], c)


def normmax_rows(x, alpha, res, nblk):
    """alpha-normmax of every row of ``x`` (rows, n) into ``res`` (a :data:`.rows.Solved`:
    ``p``; per-row ``theta``, the x-space tau (float64), ``support``, ``n_iter`` (Newton
    steps), ``converged``)."""
    run_blocks(_forward_blk, (x, alpha, res), x.shape, nblk)


@jit
def _vjp_row(p, g, a, dx):
    """``dx = v (g - <p, g>) - p (v . (g - <p, g>))``, ``v = N (p / N)^(2 - a) / (a - 1)``
    on the support, ``N = ||p||_a`` (computed relative to the largest p)."""
    n = p.shape[0]
    top = 0.0
    pg, cpg = 0.0, 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > top:
            top = pi
        if pi > 0.0:
            pg, cpg = _acc(pg, cpg, pi * np.float64(g[i]))
    if top == 0.0:
        for i in range(n):
            dx[i] = 0.0
        return
    pg = pg + cpg
    sa = 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            sa += math.exp(a * math.log(pi / top))
    lnorm = math.log(top) + math.log(sa) / a
    vd, cvd = 0.0, 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            v = math.exp(lnorm + (2.0 - a) * (math.log(pi) - lnorm)) / (a - 1.0)
            vd, cvd = _acc(vd, cvd, v * (np.float64(g[i]) - pg))
    vd = vd + cvd
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            v = math.exp(lnorm + (2.0 - a) * (math.log(pi) - lnorm)) / (a - 1.0)
            dx[i] = v * (np.float64(g[i]) - pg) - pi * vd
        else:
            dx[i] = 0.0


@kernel(lambda x: (x[:, ::1], x[:, ::1], f64[::1], x[:, ::1], i64, i64), ops=("normmax_vjp",))
def _vjp_blk(p, g, alpha, dx, r0, r1):
    for r in range(r0, r1):
        _vjp_row(p[r], g[r], alpha[r], dx[r])


def normmax_vjp_rows(p, g, alpha, dx, nblk=64):
    """The normmax VJP of every row into ``dx``."""
    run_blocks(_vjp_blk, (p, g, alpha, dx), p.shape, nblk)
