"""alpha = 1 of the numba row solvers: softmax as log-sum-exp (units as in :mod:`.rows`).

Every pass over the row is a loop that LLVM vectorises (AVX2: 4 float64 lanes): the
maximum (:func:`.candidates._lane_max`), ``e_i = exp(x_i - m)`` with the straight-line
:func:`.vexp.vexp_neg` (``math.exp`` is a libm call, one element at a time; entries below
its range, rare, are redone with :func:`.vexp.vexp`), the compensated
sum of the ``e_i`` in ``L`` independent lanes (one lane per position in a block of ``L``
consecutive entries, each with Knuth's branch-free TwoSum error term, so no loop-carried
rounding order has to be kept and the lanes are vector registers), and ``p_i = e_i / (1 +
s)``.  The lanes are merged with Neumaier's step.  The error of the sum is that of a
compensated sum (``~2 eps |s|`` plus ``n eps^2 |s|``), whatever the order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import CACHE
from .candidates import _lane_max
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


@njit(cache=CACHE)
def _softmax_row(x, out, m, e, lanes):
    """Softmax of one row with maximum m: ``A = log(sum exp(x - m))`` computed as
    ``log1p(s)``, ``s`` the sum over all but one argmax (the max term separated out, as
    scipy's logsumexp does; further entries equal to m add exactly 1 each) with a
    compensated sum; ``exp(x - m)`` is kept in ``e`` so that the output is
    ``e_i / (1 + s)`` (``exp(y_i - A)`` directly where that is below the normal range).
    ``lanes`` is float64 scratch of shape (4, LANES).  Returns (A, support)."""
    n = x.shape[0]
    L = _lanes(n)
    # entries with y - A <= -700 take exp(y - A) directly below; A <= log(n), so only
    # entries with y <= low can: count them (usually none) while computing the e_i
    low = -699.0 + math.log(n)
    ties = 0
    nlow = 0
    for i in range(n):
        y = np.float64(x[i]) - m
        e[i] = vexp_neg(y)  # y <= 0; exact for y >= VEXP_NEG_MIN, which y > low includes
        ties += np.float64(x[i]) == m  # the row is finite here (:func:`_softmax_lanes`)
        nlow += y <= low
    if nlow > 0:
        for i in range(n):
            y = np.float64(x[i]) - m
            if y < VEXP_NEG_MIN:
                e[i] = vexp(y)
    lanes[:2, :L] = 0.0
    S = lanes[0, :L]
    C = lanes[1, :L]
    nb = n // L
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
                cnt -= e[i] * inv > 0.0
                p = math.exp(d)
                out[i] = p
                cnt += p > 0.0
    return A, cnt


@njit(cache=CACHE)
def _softmax_lanes(x, out, c, lanes):
    """alpha = 1, ``method=None``: log-sum-exp, with the lane scratch of :func:`_softmax_row`
    (and of :func:`.candidates._lane_max`) from the caller."""
    L = _lanes(x.shape[0])
    m, bad = _lane_max(x, lanes[2, :L], lanes[3, :L])
    settled, res = _settled_row(out, m, bad)
    if settled:
        return res
    A, cnt = _softmax_row(x, out, m, c, lanes)
    return m + A, cnt, 0, True


@njit(cache=CACHE)
def _solve_softmax(x, out, c):
    """alpha = 1, ``method=None``: log-sum-exp."""
    return _softmax_lanes(x, out, c, np.empty((4, LANES), np.float64))
