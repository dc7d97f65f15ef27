"""alpha = 1 of the numba row solvers: softmax as log-sum-exp (units as in :mod:`.rows`).

Every pass over the row is a loop that LLVM vectorises (AVX2: 4 float64 lanes): the
maximum (:func:`.candidates.lane_max`), ``e_i = exp(x_i - m)`` with the straight-line
:func:`.vexp.vexp_neg` (``math.exp`` is a libm call, one element at a time; entries below
its range, rare, are redone with :func:`.vexp.vexp`), the compensated
sum of the ``e_i`` in ``L`` independent lanes (one lane per position in a block of ``L``
consecutive entries, each with Knuth's branch-free TwoSum error term, so no loop-carried
rounding order has to be kept and the lanes are vector registers), and ``p_i = e_i / (1 +
s)``.  The lanes are merged with Neumaier's step.  The error of the sum is that of a
compensated sum (``~2 eps |s|`` plus ``n eps^2 |s|``), whatever the order.  In a block
of float64 rows the maximum of the next row is taken inside this row's exponential pass
(:func:`_softmax_row_next`), so that row's read from memory overlaps the exponentials.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import SOFTMAX_EXP_FLOOR
from ._jit import jit
from .candidates import lane_max, max_block, max_end, max_into, max_lanes
from .compensated import acc, merge_lanes, two_sum
from .elementwise import settled_row
from .vexp import VEXP_NEG_MIN, vexp, vexp_neg

#: lanes of the vectorised passes (a row of n >= 2 * LANES entries uses all of them)
LANES = 64


@jit
def _lanes(n):
    """How many lanes a row of n entries uses: fewer for short rows, whose lane merge would
    otherwise cost more than the row (the answer depends only on n)."""
    L = 8
    while L < LANES and 16 * L <= n:
        L *= 2
    return L


@jit(forceinline=True)
def _exp_entry(x, e, i, m, low):
    """``e[i] = exp(x[i] - m)`` (``x[i] <= m``: the row is finite here, the callers settle
    others), and whether ``x[i] - m`` lies at or below ``low`` (0/1)."""
    y = np.float64(x[i]) - m
    e[i] = vexp_neg(y)  # y <= 0; exact for y >= VEXP_NEG_MIN, which y > low includes
    return y <= low


@jit(forceinline=True)
def _low(n):
    """Entries with ``y - A <= SOFTMAX_EXP_FLOOR`` take ``exp(y - A)`` directly in the output
    pass; ``A <= log(n)``, so only entries with ``y <= _low(n)`` can (one unit more allows
    for the rounding of A): the exponential pass counts them (usually none)."""
    return (SOFTMAX_EXP_FLOOR + 1.0) + math.log(n)


@jit
def _softmax_finish(x, e, out, m, nlow, lanes):
    """Softmax of row ``x`` with maximum m after its exponential pass left ``e_i = exp(x_i -
    m)`` in ``e`` (``out`` itself, or scratch) and found entries at or below :func:`_low`
    (``nlow > 0``): ``A = log(sum exp(x - m))`` computed as ``log1p(s)``, ``s``
    the sum over all but one argmax (the max term separated out, as scipy's logsumexp
    does; further entries equal to m add exactly 1 each) with a compensated sum, and the
    output ``e_i / (1 + s)`` (``exp(y_i - A)`` directly where that is below the normal
    range).  ``lanes`` is float64 scratch of shape (4, LANES).  Returns (A, support)."""
    n = x.shape[0]
    L = _lanes(n)
    if nlow > 0:
        for i in range(n):
            y = np.float64(x[i]) - m
            if y < VEXP_NEG_MIN:
                e[i] = vexp(y)
    lanes[:2, :L] = 0.0
    S = lanes[0, :L]
    C = lanes[1, :L]
    ties = 0
    nb = n // L
    for b in range(nb):
        xb = x[b * L:(b + 1) * L]
        eb = e[b * L:(b + 1) * L]
        for j in range(L):
            # the maximum's own terms are left out (counted in ties)
            tie = np.float64(xb[j]) == m
            ties += tie
            v = 0.0 if tie else eb[j]
            S[j], err = two_sum(S[j], v)
            C[j] += err
    s, comp = merge_lanes(S, C, L)
    for i in range(nb * L, n):
        if np.float64(x[i]) != m:
            s, comp = acc(s, comp, e[i])
        else:
            ties += 1
    s, comp = acc(s, comp, ties - 1.0)
    s = s + comp
    A = math.log1p(s)
    inv = 1.0 / (1.0 + s)
    cnt = 0
    if e.ctypes.data == out.ctypes.data:  # in place (the float64 pipeline): a loop LLVM
        for i in range(n):                # vectorises without its overlap check failing
            p = e[i] * inv
            e[i] = p
            cnt += p > 0.0
    else:
        for i in range(n):
            p = e[i] * inv
            out[i] = p
            cnt += p > 0.0
    if nlow > 0:
        for i in range(n):
            d = (np.float64(x[i]) - m) - A
            if not (d > SOFTMAX_EXP_FLOOR):
                cnt -= out[i] > 0.0
                p = math.exp(d)
                out[i] = p
                cnt += p > 0.0
    return A, cnt


@jit
def _softmax_row(x, out, m, c, lanes):
    """Softmax of one row with maximum m: the exponentials into the float64 scratch ``c``,
    then :func:`_softmax_finish`.  Returns (A, support)."""
    low = _low(x.shape[0])
    nlow = np.int64(0)  # not a literal: see the package docstring
    for i in range(x.shape[0]):
        nlow += _exp_entry(x, c, i, m, low)
    return _softmax_finish(x, c, out, m, nlow, lanes)


@jit
def _softmax_row_next(x, out, m, lanes, xn):
    """:func:`_softmax_row` of a float64 row whose exponential pass also takes the maximum
    and NaN/+inf count of ``xn``, the next row of the caller's block (x itself when there
    is none), and keeps ``exp(x - m)`` in ``out``, which the output pass scales in place.
    The next row's first read from memory and this row's output traffic then overlap the
    compute-bound exponentials instead of stalling passes of their own.  Float32 rows are
    not run this way: with half the bytes to hide, and float32 lanes in a float64 loop, the
    overlap does not pay for itself.  Returns (A, support, the maximum of xn, nonzero when
    xn holds a NaN or +inf)."""
    n = x.shape[0]
    L = min(_lanes(n), n)
    A, B = max_lanes(xn, lanes[2, :L], lanes[3, :L])
    low = _low(n)
    nlow = np.int64(0)  # not a literal: see the package docstring
    bad = 0
    # blocks of L entries; the last one ends at n and overlaps the one before, whose
    # exponentials and maxima it redoes (the same values): one loop in the compiled code,
    # no tail loop.  Its counts are used as "any" only (the ties are counted in the sum)
    nbt = (n + L - 1) // L
    for b in range(nbt):
        s0 = min(b * L, n - L)
        xb = x[s0:s0 + L]
        eb = out[s0:s0 + L]
        nxb = xn[s0:s0 + L]
        src, dst = max_block(A, B, b)
        for j in range(L):
            nlow += _exp_entry(xb, eb, j, m, low)
            bad += max_into(src, dst, j, nxb[j])
    m_next, _ = max_end(xn, A, B, nbt)  # the blocks covered every entry: no tail
    Ax, cnt = _softmax_finish(x, out, out, m, nlow, lanes)
    return Ax, cnt, m_next, bad


@jit
def softmax_rows_next(x, out, theta, support, n_iter, converged, r0, r1):
    """alpha = 1, ``method=None``, float64 rows ``r0 .. r1 - 1``: log-sum-exp, each row's
    maximum taken in the previous row's exponential pass (:func:`_softmax_row_next`)."""
    n = x.shape[1]
    L = _lanes(n)
    lanes = np.empty((4, LANES), np.float64)
    m, bad = lane_max(x[r0], lanes[2, :L], lanes[3, :L])
    for r in range(r0, r1):
        xn = x[r + 1] if r + 1 < r1 else x[r]  # the last row's pass reads itself again
        settled, res = settled_row(out[r], m, bad)
        if settled:
            theta[r], support[r], n_iter[r], converged[r] = res
            m, bad = lane_max(xn, lanes[2, :L], lanes[3, :L])
            continue
        A, cnt, m_next, bad = _softmax_row_next(x[r], out[r], m, lanes, xn)
        theta[r], support[r], n_iter[r], converged[r] = m + A, cnt, 0, True
        m = m_next


@jit
def softmax_lanes(x, out, c, lanes):
    """alpha = 1, ``method=None``, one row: log-sum-exp, with the scratch of
    :func:`_softmax_row` from the caller."""
    L = _lanes(x.shape[0])
    m, bad = lane_max(x, lanes[2, :L], lanes[3, :L])
    settled, res = settled_row(out, m, bad)
    if settled:
        return res
    A, cnt = _softmax_row(x, out, m, c, lanes)
    return m + A, cnt, 0, True


@jit(_nrt=True)  # allocates: also when called from code compiled without NRT
def solve_softmax(x, out, c):
    """alpha = 1, ``method=None``: log-sum-exp."""
    return softmax_lanes(x, out, c, np.empty((4, LANES), np.float64))
