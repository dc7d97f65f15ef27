"""alpha = 1 of the numba row solvers: softmax as log-sum-exp (units as in :mod:`.rows`).

Every pass over the row is a loop that LLVM vectorises (AVX2: 4 float64 lanes): the
maximum (:func:`.candidates._lane_max`), ``e_i = exp(x_i - m)`` with the straight-line
:func:`.vexp.vexp_neg` (``math.exp`` is a libm call, one element at a time; entries below
its range, rare, are redone with :func:`.vexp.vexp`), the compensated
sum of the ``e_i`` in ``L`` independent lanes (one lane per position in a block of ``L``
consecutive entries, each with Knuth's branch-free TwoSum error term, so no loop-carried
rounding order has to be kept and the lanes are vector registers), and ``p_i = e_i / (1 +
s)``.  The lanes are merged with Neumaier's step.  The error of the sum is that of a
compensated sum (``~2 eps |s|`` plus ``n eps^2 |s|``), whatever the order.  In a block
of rows the maximum of the next row is taken inside this row's exponential pass
(:func:`_softmax_row`), so each row is read from memory once while the exponentials run.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from . import CACHE
from .candidates import _lane_max, _max_end, _max_into, _max_lanes
from .compensated import acc, merge_lanes, two_sum
from .elementwise import _settled_row
from .vexp import VEXP_NEG_MIN, vexp, vexp_neg

#: lanes of the vectorised passes (a row of n >= 2 * LANES entries uses all of them)
LANES = 64


@njit(cache=CACHE)
def _lanes(n):
    """How many lanes a row of n entries uses: fewer for short rows, whose lane merge would
    otherwise cost more than the row (the answer depends only on n)."""
    L = 8
    while L < LANES and 16 * L <= n:
        L *= 2
    return L


def _exp_buffer(out, c):
    """Where the exponential pass keeps ``e_i = exp(x_i - m)``: ``out`` itself when it is
    float64 (the output pass then scales it in place; writing ``out`` during the
    compute-bound exponentials overlaps its write-allocate traffic with them), else the
    float64 scratch ``c``.  Chosen when the caller compiles."""


@overload(_exp_buffer, inline="always")
def _exp_buffer_impl(out, c):
    if out.dtype == types.float64:
        return lambda out, c: out
    return lambda out, c: c


def _next_max_in_exp_pass(x):
    """Whether the exponential pass of row ``x`` also takes the next row's maximum: for
    float64 rows (512 x 8192, two threads: 5.4-5.7 -> 4.7-4.9 ms), whose next row is 64 KiB
    read from memory while the exponentials run; a float32 row's pass got slower with it
    (4.4-4.5 -> 4.9-5.2 ms: half the bytes to hide, and the float32 lanes in the float64
    loop).  A constant when the caller compiles."""


@overload(_next_max_in_exp_pass, inline="always")
def _next_max_in_exp_pass_impl(x):
    fused = x.dtype == types.float64
    return lambda x: fused


@njit(inline="always", cache=CACHE)
def _exp_entry(x, e, i, m, low):
    """``e[i] = exp(x[i] - m)`` (``x[i] <= m``), and whether ``x[i]`` is a tie at ``m`` and
    whether it lies at or below ``low`` (both as 0/1)."""
    y = np.float64(x[i]) - m
    e[i] = vexp_neg(y)  # y <= 0; exact for y >= VEXP_NEG_MIN, which y > low includes
    return np.float64(x[i]) == m, y <= low  # the row is finite here (the callers settle others)


@njit(cache=CACHE)
def _softmax_row(x, out, m, c, lanes, xn):
    """Softmax of one row with maximum m: ``A = log(sum exp(x - m))`` computed as
    ``log1p(s)``, ``s`` the sum over all but one argmax (the max term separated out, as
    scipy's logsumexp does; further entries equal to m add exactly 1 each) with a
    compensated sum; ``exp(x - m)`` is kept (:func:`_exp_buffer`: ``out``, or ``c``) so
    that the output is ``e_i / (1 + s)`` (``exp(y_i - A)`` directly where that is below the
    normal range).  ``lanes`` is float64 scratch of shape (4, LANES).

    ``xn`` is the next row of the caller's block (x's length), or empty: its maximum and
    NaN/+inf count (:func:`.candidates._lane_max`) are taken here, for float64 rows inside
    the exponential pass (:func:`_next_max_in_exp_pass`), so that the next row's first read
    from memory overlaps this row's exponentials instead of stalling a pass of its own.
    Returns (A, support, the maximum of xn, its NaN/+inf count); -inf, 0 for an empty xn."""
    n = x.shape[0]
    L = _lanes(n)
    e = _exp_buffer(out, c)
    # entries with y - A <= -700 take exp(y - A) directly below; A <= log(n), so only
    # entries with y <= low can: count them (usually none) while computing the e_i
    low = -699.0 + math.log(n)
    ties = 0
    nlow = 0
    nb = n // L
    if _next_max_in_exp_pass(x) and xn.shape[0] == n:
        A_, B_ = _max_lanes(xn, lanes[2, :L], lanes[3, :L])
        bad = 0
        for b in range(nb):
            xb = x[b * L:(b + 1) * L]
            eb = e[b * L:(b + 1) * L]
            nxb = xn[b * L:(b + 1) * L]
            src = A_ if b % 2 == 0 else B_
            dst = B_ if b % 2 == 0 else A_
            for j in range(L):
                tie, below = _exp_entry(xb, eb, j, m, low)
                ties += tie
                nlow += below
                bad += _max_into(src, dst, j, nxb[j])
        for i in range(nb * L, n):
            tie, below = _exp_entry(x, e, i, m, low)
            ties += tie
            nlow += below
        m_next, tail = _max_end(xn, A_, B_, nb)
        bad += tail
    else:
        for i in range(n):
            tie, below = _exp_entry(x, e, i, m, low)
            ties += tie
            nlow += below
        m_next, bad = -np.inf, 0
        if xn.shape[0] > 0:
            m_next, bad = _lane_max(xn, lanes[2, :L], lanes[3, :L])
    if nlow > 0:
        for i in range(n):
            y = np.float64(x[i]) - m
            if y < VEXP_NEG_MIN:
                e[i] = vexp(y)
    lanes[:2, :L] = 0.0
    S = lanes[0, :L]
    C = lanes[1, :L]
    for b in range(nb):
        xb = x[b * L:(b + 1) * L]
        eb = e[b * L:(b + 1) * L]
        for j in range(L):
            # the maximum's own terms are left out (counted in ties)
            v = 0.0 if np.float64(xb[j]) == m else eb[j]
            S[j], err = two_sum(S[j], v)
            C[j] += err
    s, comp = merge_lanes(S, C, L)
    for i in range(nb * L, n):
        if np.float64(x[i]) != m:
            s, comp = acc(s, comp, e[i])
    s, comp = acc(s, comp, ties - 1.0)
    s = s + comp
    A = math.log1p(s)
    inv = 1.0 / (1.0 + s)
    cnt = 0
    for i in range(n):
        p = e[i] * inv
        out[i] = p
        cnt += p > 0.0
    if nlow > 0:
        for i in range(n):
            d = (np.float64(x[i]) - m) - A
            if not (d > -700.0):
                cnt -= out[i] > 0.0
                p = math.exp(d)
                out[i] = p
                cnt += p > 0.0
    return A, cnt, m_next, bad


@njit(cache=CACHE)
def _softmax_rows(x, out, theta, support, n_iter, converged, r0, r1):
    """alpha = 1, ``method=None``, rows ``r0 .. r1 - 1``: log-sum-exp, each row's maximum
    taken in the previous row's exponential pass (:func:`_softmax_row`)."""
    n = x.shape[1]
    L = _lanes(n)
    c = np.empty(n, np.float64)
    lanes = np.empty((4, LANES), np.float64)
    m, bad = _lane_max(x[r0], lanes[2, :L], lanes[3, :L])
    for r in range(r0, r1):
        xn = x[r + 1] if r + 1 < r1 else x[r][:0]
        settled, res = _settled_row(out[r], m, bad)
        if settled:
            theta[r], support[r], n_iter[r], converged[r] = res
            m, bad = _lane_max(xn, lanes[2, :L], lanes[3, :L])
            continue
        A, cnt, m_next, bad = _softmax_row(x[r], out[r], m, c, lanes, xn)
        theta[r], support[r], n_iter[r], converged[r] = m + A, cnt, 0, True
        m = m_next


@njit(cache=CACHE)
def _solve_softmax(x, out, c):
    """alpha = 1, ``method=None``, one row: log-sum-exp."""
    L = _lanes(x.shape[0])
    lanes = np.empty((4, LANES), np.float64)
    m, bad = _lane_max(x, lanes[2, :L], lanes[3, :L])
    settled, res = _settled_row(out, m, bad)
    if settled:
        return res
    A, cnt, _, _ = _softmax_row(x, out, m, c, lanes, x[:0])
    return m + A, cnt, 0, True
