"""Fused Jacobian-vector products of the numba backend (row kernels, float64 sums).

With ``u = p^(2 - alpha)`` on the support (0 elsewhere):

* scores:  ``dx = u * (g - (u . g) / sum u)``; two passes per row, the first accumulates
  ``sum u`` and ``u . g`` (Neumaier-compensated), the second writes ``dx``.
* alpha:   ``sum_i g_i p_i c_i - (u . g)(sum_i p_i c_i) / sum u`` with
  ``c_i = -L_i^2 h(-(alpha - 1) L_i)``, ``L_i = log p_i`` and
  ``h(w) = (e^w - 1 - w) / w^2`` (its Taylor series for ``|w| < 1``), one pass per row.
  This has no ``1/(alpha - 1)`` cancellation and is continuous at alpha = 1.

``u`` is computed as the reference computes it, ``exp((2 - alpha) log p)``, except at
alpha in {1, 1.5, 2} where it is exactly ``p``, ``sqrt(p)`` and ``1``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import CACHE


@njit(inline="always", cache=CACHE)
def _skew(p, a2):
    """``u = p^(2 - alpha)`` for ``p > 0`` (``a2 = 2 - alpha``)."""
    if a2 == 0.0:
        return 1.0
    elif a2 == 0.5:
        return math.sqrt(p)
    elif a2 == 1.0:
        return p
    return math.exp(a2 * math.log(p))


@njit(inline="always", cache=CACHE)
def _h(w):
    """``(exp(w) - 1 - w) / w^2`` without cancellation (the reference's series for |w| < 1)."""
    if abs(w) < 1.0:
        series = 0.0
        term = 0.5
        for k in range(18):
            series = series + term
            term = term * w / (k + 3)
        return series
    return (math.expm1(w) - w) / (w * w)


@njit(inline="always", cache=CACHE)
def _acc(s, comp, v):
    """One step of Neumaier's compensated summation."""
    t = s + v
    if abs(s) >= abs(v):
        comp += (s - t) + v
    else:
        comp += (v - t) + s
    return t, comp


@njit(cache=CACHE)
def _vjp_row(p, g, a2, dx):
    su = 0.0
    csu = 0.0
    ug = 0.0
    cug = 0.0
    n = p.shape[0]
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            u = _skew(pi, a2)
            su, csu = _acc(su, csu, u)
            ug, cug = _acc(ug, cug, u * np.float64(g[i]))
    su = su + csu
    r = (ug + cug) / su if su > 0.0 else 0.0
    for i in range(n):
        pi = np.float64(p[i])
        u = _skew(pi, a2) if pi > 0.0 else 0.0
        dx[i] = u * (np.float64(g[i]) - r) if u > 0.0 else 0.0


@njit(parallel=True, cache=CACHE)
def entmax_vjp_rows(p, g, alpha, dx):
    """``dx[r] = u * (g[r] - (u . g[r]) / sum u)`` for every row (``u = p^(2-alpha)``)."""
    for r in prange(p.shape[0]):
        _vjp_row(p[r], g[r], 2.0 - alpha[r], dx[r])


@njit(cache=CACHE)
def _alpha_vjp_row(p, g, a1):
    a2 = 1.0 - a1
    sgc = 0.0
    cgc = 0.0
    spc = 0.0
    cpc = 0.0
    sug = 0.0
    cug = 0.0
    su = 0.0
    csu = 0.0
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            gi = np.float64(g[i])
            L = math.log(pi)
            pc = -pi * L * L * _h(-a1 * L)
            u = _skew(pi, a2)
            sgc, cgc = _acc(sgc, cgc, gi * pc)
            spc, cpc = _acc(spc, cpc, pc)
            sug, cug = _acc(sug, cug, u * gi)
            su, csu = _acc(su, csu, u)
    su = su + csu
    corr = (sug + cug) * (spc + cpc) / su if su > 0.0 else 0.0
    return (sgc + cgc) - corr


@njit(parallel=True, cache=CACHE)
def entmax_alpha_vjp_rows(p, g, alpha, out):
    """``out[r] = sum_i g_i dp_i/dalpha`` for every row (float64)."""
    for r in prange(p.shape[0]):
        out[r] = _alpha_vjp_row(p[r], g[r], alpha[r] - 1.0)
