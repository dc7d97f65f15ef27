"""Correctly rounded sums, dot products and powers for the numba row kernels: the compiled
twin of :mod:`entmax_ref.backends.exact_sums` (read its docstring for the algorithm and
the error bound), in a form a row loop calls one entry at a time.

A sum is a running state ``(s, c, A, inexact)``: ``s`` the TwoSum chain of the terms (or
of the products' rounded parts), ``c`` the float64 sum of the TwoSum errors and of the
products' exact low parts (TwoProd by one FMA), ``A`` the sum of the terms' magnitudes,
``inexact`` whether an addition into ``c`` rounded (each is checked by TwoSum).  Where none
did, ``s + c`` is the exact sum and its float64 rounding is the answer (this decides the
exact midpoints that a sum of a few terms often lands on); otherwise :func:`sum_round`
rounds ``s + c`` where the bound :func:`sum_bound` (the same as the NumPy engine's, valid
in any order) proves the rounding, and says so.  A product whose low part underflows sets
the state's ``bad`` flag.  Where the rounding is not proven the caller sends the row to
the NumPy engine, whose exact fallback decides it.  The value is the same on both
engines: the real-number sum, rounded to nearest.

:func:`pow_cr` is ``p^a`` rounded to nearest (or a flag): ``exp(a log p)`` in double-word,
rounded where its error bound proves the rounding.

:func:`add_products` adds the terms of ``a @ b`` to the NumPy engine's sum states
(:func:`entmax_ref.backends.exact_sums.add_products`) and :func:`round_products` rounds
them: the float64 attention's scores, outputs and gradient sums.
"""

from __future__ import annotations

import math

import numpy as np

from .. import double_word as M
from ._jit import ANY, b1, f64, i64, jit, kernel
from ..exact_sums import EXP_OVER, EXP_UNDER
from .double_word import dw_mul_fp, exp_dw, log1p_dw_sel, log_dw, round_scaled, round_signed, two_prod, two_sum

_U2, _SLACK, _NORMAL_MIN = M.U2, M.SLACK, M.NORMAL_MIN
_EPS_EXP, _EPS_LOG_MUL = M.EPS_EXP, M.EPS_LOG + M.DW_MUL * M.U2
_EPS_LOG = M.EPS_LOG
_TINY = 2.0 ** -1022


@jit(forceinline=True)
def sum_bound(n, absum):
    """:func:`entmax_ref.backends.exact_sums.sum_bound`."""
    return 8.0 * (n + 2.0) ** 2 * _U2 * absum * _SLACK


@jit(forceinline=True)
def sum_add(s, c, A, inexact, x):
    """Add the float64 term ``x`` to the sum state ``(s, c, A, inexact)``."""
    s, q = two_sum(s, x)
    c, r = two_sum(c, q)
    return s, c, A + abs(x), inexact | (r != 0.0)


@jit(forceinline=True)
def dot_add(s, c, A, inexact, bad, a, b):
    """Add the exact product ``a b`` to the sum state ``(s, c, A, inexact, bad)``."""
    p, e = two_prod(a, b)
    s, q = two_sum(s, p)
    c, r1 = two_sum(c, q)
    c, r2 = two_sum(c, e)
    bad = bad | ((p != 0.0) & (abs(p) < _NORMAL_MIN))
    return s, c, A + abs(p), inexact | (r1 != 0.0) | (r2 != 0.0), bad


@jit(forceinline=True)
def sum_round(s, c, A, inexact, n):
    """The sum state of ``n`` terms rounded to nearest float64, and whether the rounding is
    proven (an exact 0 is +0)."""
    if not (A - A == 0.0):  # the magnitudes overflow
        return 0.0, False
    if not inexact:
        return (s + c) + 0.0, True
    h, l = two_sum(s, c)
    return round_signed(h, l, sum_bound(n, A), np.bool_(False))


@jit(forceinline=True)
def add_product_at(S, C, A, X, U, j, a, b):
    """Add the exact product ``a b`` to entry ``j`` of the sum-state arrays: the TwoSum
    chain ``S``, the error sum ``C``, the magnitudes ``A``, ``X`` > 0 where an addition
    into ``C`` rounded, ``U`` > 0 where the product's low part underflows (a vector loop's
    step: a lane of :func:`dot_lanes`, a column of :func:`add_products`)."""
    p, e = two_prod(a, b)
    t, q = two_sum(S[j], p)
    S[j] = t
    t, r1 = two_sum(C[j], q)
    t, r2 = two_sum(t, e)
    C[j] = t
    A[j] += abs(p)
    X[j] += abs(r1) + abs(r2)
    U[j] += 1.0 if (p != 0.0) & (abs(p) < _NORMAL_MIN) else 0.0


#: the lanes of :func:`dot_lanes` (a row of at least 2 * LANES terms uses them)
LANES = 16


@jit(forceinline=True)
def dot_lanes(u, g, lanes):
    """``sum u`` and ``u . g`` of two float64 rows, each rounded to nearest as
    :func:`sum_round` rounds, with whether each is proven: ``LANES`` independent sum states
    (TwoSum lanes, a loop LLVM vectorises; ``lanes``: float64 scratch of shape (10, LANES)),
    merged by TwoSums, then the rest of the row.  Any order is covered by
    :func:`sum_bound`; every addition into a ``c`` is checked as in :func:`sum_add`."""
    n = u.shape[0]
    L = LANES
    lanes[:] = 0.0
    S1, C1, A1, X1 = lanes[0], lanes[1], lanes[2], lanes[3]
    S2, C2, A2, X2, B2 = lanes[4], lanes[5], lanes[6], lanes[7], lanes[8]
    nb = n // L if n >= 2 * L else 0
    for b in range(nb):
        o = b * L
        for j in range(L):
            i = np.uint64(o + j)  # unsigned, not a slice a block: see .candidates.lane_max
            v = u[i]
            t, q = two_sum(S1[j], v)
            S1[j] = t
            t, r = two_sum(C1[j], q)
            C1[j] = t
            A1[j] += abs(v)
            X1[j] += abs(r)
            add_product_at(S2, C2, A2, X2, B2, j, v, g[i])
    s1, c1, a1, x1 = 0.0, 0.0, 0.0, np.bool_(False)
    s2, c2, a2, x2 = 0.0, 0.0, 0.0, np.bool_(False)
    bad = False
    for j in range(L if nb else 0):
        s1, c1, a1, x1 = sum_add(s1, c1, a1, x1 | (X1[j] != 0.0), S1[j])
        c1, r = two_sum(c1, C1[j])
        s2, c2, a2, x2 = sum_add(s2, c2, a2, x2 | (X2[j] != 0.0), S2[j])
        c2, r2 = two_sum(c2, C2[j])
        x1 = x1 | (r != 0.0)
        x2 = x2 | (r2 != 0.0)
        bad = bad | (B2[j] != 0.0)
    # the lanes' A: the sums of the magnitudes, not of the lane sums
    a1, a2 = 0.0, 0.0
    for j in range(L if nb else 0):
        a1 += A1[j]
        a2 += A2[j]
    for i in range(nb * L, n):
        s1, c1, a1, x1 = sum_add(s1, c1, a1, x1, u[i])
        s2, c2, a2, x2, bad = dot_add(s2, c2, a2, x2, bad, u[i], g[i])
    su, ok1 = sum_round(s1, c1, a1, x1, n)
    ug, ok2 = sum_round(s2, c2, a2, x2, n)
    return su, ok1, ug, ok2 & (not bad)


@jit(forceinline=True)
def pow_cr(p, a):
    """``p^a`` rounded to nearest float64 for a normal ``p > 0`` (``|a log p| <= 1400``),
    and whether the rounding is proven (False for a subnormal ``p``)."""
    normal = p >= _TINY
    wh, wl = two_sum(p if normal else 1.0, -1.0)  # p - 1 exactly: log p = log1p(p - 1)
    lh, ll = log1p_dw_sel(wh, wl)  # inlined: the loops that call this vectorise
    zh, zl = dw_mul_fp(lh, ll, a)
    e, hi, lo = exp_dw(zh, zl)
    eps = _EPS_EXP + 1.01 * abs(zh) * _EPS_LOG_MUL
    v, ok = round_scaled(e, hi, lo, eps * abs(hi) * 1.01, np.bool_(False))
    return v, ok & normal


@jit(forceinline=True)
def skew_cr(p, a2):
    """``u = p^a2`` rounded to nearest for ``p > 0`` (exact at ``a2`` = 0 and 1, one IEEE
    square root at 1/2), and whether it is proven."""
    if a2 == 0.0:
        return 1.0, True
    elif a2 == 0.5:
        return math.sqrt(p), True
    elif a2 == 1.0:
        return p, True
    return pow_cr(p, a2)


@jit(forceinline=True)
def log_cr(p):
    """``log p`` rounded to nearest float64 for ``p > 0`` (exactly 0 at ``p = 1``), and
    whether the rounding is proven (False for a subnormal ``p``):
    :func:`entmax_ref.backends.exact_sums.log_rows`."""
    if p == 1.0:
        return 0.0, True
    lh, ll = log_dw(p, 0.0)
    v, ok = round_signed(lh, ll, _EPS_LOG * abs(lh) * _SLACK, np.bool_(False))
    return v, ok & (p >= _TINY)


@jit(forceinline=True)
def exp_cr(z):
    """``exp(z)`` rounded to nearest float64 for any ``z`` (+inf above ``EXP_OVER``, 0 below
    ``EXP_UNDER``; NaN at NaN), and whether the rounding is proven:
    :func:`entmax_ref.backends.exact_sums.exp_any`."""
    if z > EXP_OVER:
        return math.inf, True
    if not (z >= EXP_UNDER):
        return (0.0 if z < EXP_UNDER else z), True
    k, hi, lo = exp_dw(z, 0.0)
    return round_scaled(k, hi, lo, _EPS_EXP * abs(hi) * _SLACK, np.bool_(False))


@kernel(lambda _: (f64[:, ::1], f64[:, ::1], f64[:, :, ::1], i64, i64), dtypes=ANY,
        ops=("attention_forward", "attention_backward"))
def add_products(a, b, st, r0, r1):
    """Rows ``r0 .. r1 - 1`` of :func:`entmax_ref.backends.exact_sums.add_products`: the
    exact terms of ``a @ b`` ((m, n) and (n, k) float64) added to the sum states ``st``
    ((m, 5, k): ``s``, ``c``, ``A``, ``X``, ``U`` of each sum, the same states, which the
    NumPy engine rounds), a term whose ``a[r, i]`` is 0 left out (a sparse ``a``, the attention's
    probabilities, costs its nonzero entries only).  The terms of a row are taken in
    inner-index order, one sum state per column of ``b``: a loop that LLVM vectorises."""
    n = a.shape[1]
    k = b.shape[1]
    for r in range(r0, r1):
        S, C, A, X, U = st[r, 0], st[r, 1], st[r, 2], st[r, 3], st[r, 4]
        for i in range(n):
            x = a[r, i]
            if x == 0.0:
                continue
            bi = b[i]
            for j in range(k):
                add_product_at(S, C, A, X, U, j, x, bi[j])


@kernel(lambda _: (f64[:, :, ::1], i64, f64[:, ::1], b1[:, ::1]), dtypes=ANY,
        ops=("attention_forward", "attention_backward"))
def round_products(st, n, v, ok):
    """:func:`entmax_ref.backends.exact_sums.round_products` of the sum states ``st``
    ((m, 5, k), of at most ``n`` terms each) into ``v`` and ``ok`` ((m, k)): each sum
    rounded by :func:`sum_round`, proven where that says so and no term was inexact in
    the engines' TwoProd.  Where both engines prove a sum, both hold its correctly rounded
    value."""
    for r in range(st.shape[0]):
        for j in range(st.shape[2]):
            v[r, j], good = sum_round(st[r, 0, j], st[r, 1, j], st[r, 2, j], st[r, 3, j] != 0.0, n)
            ok[r, j] = good and st[r, 4, j] == 0.0
