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

float32 rows (:func:`_softmax32_row`) need the float32 rounding of those float64
probabilities, not the probabilities: :func:`_softmax32_row` computes them in two passes
with a shorter exponential (:func:`.vexp.vexp32`, about 2^-47 relative: 13 products and
multiply-adds where :func:`.vexp.vexp_neg` takes 18 and five additions), a plain sum in two levels of lanes, and a product,
under a proven error bound; a rounding test on the float64 bits shows that this value and
:func:`_softmax_row`'s lie on the same side of every float32 rounding boundary, so both
round to the same float32.  The rare row where the test does not decide (about one in 300
normal rows of 8192, and every row with a ``-inf`` entry or one far below the maximum) is
solved again by :func:`_softmax_row`: the bits are its bits on every row.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import SOFTMAX_EXP_FLOOR
from ._jit import jit
from .candidates import lane_max, max_block, max_end, max_into, max_lanes
from .compensated import acc, merge_lanes, two_sum
from .elementwise import settled_row
from .vexp import VEXP32_ERR, VEXP32_RANGE, VEXP_NEG_MIN, float_bits, vexp, vexp32, vexp_neg

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
    compute-bound exponentials instead of stalling passes of their own (float32 rows:
    :func:`_exp_pass32`).  Returns (A, support, the maximum of xn, nonzero when xn holds a
    NaN or +inf)."""
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


#: blocks of a lane's first-level sum in :func:`_softmax32_row` (then added into the second level)
_GROUP = 16
#: the low 29 bits of a float64, which its rounding to float32 drops, and their value at a
#: float32 rounding boundary (the midpoint between two float32 neighbours)
_LOW29 = (1 << 29) - 1
_MID29 = 1 << 28
#: the bound, in units of 2^-53 relative, on the error of the float64 probabilities of
#: :func:`_softmax_row` (``vexp_neg`` under 0.8 ulp, the compensated sum about 3 units,
#: ``1 + s``, the division and the product one each: under 8)
_OLD_ERR = 16.0
_F32_MIN = 1.1754943508222875e-38  # 2^-126: below it float32 is subnormal
_F32_ZERO = 2.0 ** -152  # a probability below it (within its bound) rounds to 0 in float32
_P_FLOOR = 1e-290  # below it the entry's y is under -667 (or -inf): the row is redone


@jit
def _exp_pass32(x, c, m, lanes, xn):
    """Step 1 of :func:`_softmax32_row`: ``c_i = vexp32(x_i - m)``, their sum ``D`` in two
    levels of lanes, the number ``k`` of roundings it carries, and the maximum and NaN/+inf
    count of ``xn``.  Returns (D, k, maximum of xn, NaN/+inf count of xn)."""
    n = x.shape[0]
    L = _lanes(n)
    S = lanes[0, :L]
    S2 = lanes[1, :L]
    S[:] = 0.0
    S2[:] = 0.0
    A, B = max_lanes(xn, lanes[2, :L], lanes[3, :L])
    bad = 0
    nb = n // L
    for b in range(nb):
        xb = x[b * L:(b + 1) * L]
        cb = c[b * L:(b + 1) * L]
        nxb = xn[b * L:(b + 1) * L]
        src, dst = max_block(A, B, b)
        for j in range(L):
            e = vexp32(np.float64(xb[j]) - m)
            cb[j] = e
            S[j] += e
            bad += max_into(src, dst, j, nxb[j])
        if b % _GROUP == _GROUP - 1:
            for j in range(L):
                S2[j] += S[j]
                S[j] = 0.0
    m_next, tail = max_end(xn, A, B, nb)
    for i in range(nb * L, n):  # the tail: one more block of the last group
        e = vexp32(np.float64(x[i]) - m)
        c[i] = e
        S[i - nb * L] += e
    for j in range(L):
        S2[j] += S[j]
    w = L
    while w > 1:  # the lanes pairwise, in halves
        w //= 2
        for j in range(w):
            S2[j] += S2[j + w]
    return S2[0], _GROUP + nb // _GROUP + 2 + math.log2(L), m_next, bad + tail


@jit
def _round_pass32(c, inv, T, out):
    """Step 2 of :func:`_softmax32_row`: ``out_i = c_i inv`` rounded to float32; returns the
    number of entries left undecided with ``T`` ulps on either side."""
    und = np.int64(0)  # not a literal: see the package docstring
    for i in range(c.shape[0]):
        p = c[i] * inv
        near = ((float_bits(p) + (T - _MID29)) & _LOW29) <= 2 * T  # low bits within T of the midpoint
        und += near | ((p < _F32_MIN) & ((p >= _F32_ZERO) | (p < _P_FLOOR)))
        out[i] = p
    return und


@jit
def _softmax32_row(x, out, m, c, lanes, xn):
    """Softmax of the float32 row ``x`` with maximum ``m`` in two passes, with the maximum and
    the NaN/+inf count of ``xn`` (the next row of the block) taken in the first; the float32
    outputs (and the float32 rounding of ``theta``) those of :func:`_softmax_row`, or
    ``ok = False`` and ``out`` to be redone by it.  ``c`` is float64 scratch of the row's length.

    1. ``e_i = vexp32(x_i - m)`` into ``c``, summed in ``L`` lanes in two levels (each lane
       adds :data:`_GROUP` blocks, then its sum into the second level), the lanes merged
       pairwise: ``D = sum e_i``, within ``VEXP32_ERR + k`` units of ``2^-53`` of the exact
       sum of ``exp(x_i - m)`` (``k = _GROUP + nb / _GROUP + 2 + log2 L`` roundings of
       sums of positive terms; terms below ``exp(-88)`` change it by less than ``n e^-88``).
    2. ``p_i = e_i / D`` (a product with ``1 / D``: two more units), stored as float32.  A
       probability and :func:`_softmax_row`'s, whose error is under :data:`_OLD_ERR` units,
       lie within ``T`` ulps of the float64 ``p_i`` (``T`` the sum of both bounds, ``p_i /
       ulp(p_i) < 2^53``); when the low 29 bits of ``p_i`` (those float32 drops) are more
       than ``T`` from ``2^28``, the midpoint, no float32 rounding boundary lies within
       ``T`` ulps, so both round to the same float32, the correctly rounded one.  Below
       float32's normal range: ``p < 2^-152`` rounds to 0 (both are below ``2^-150``);
       a row with an entry in ``[2^-152, 2^-126)``, or with ``p < 1e-290`` (``x_i - m <
       -667``, which :func:`_softmax_row` treats on its own, or ``-inf``), is left undecided.
       Every other entry has ``p_i > 0`` in float64 on both paths: the support is ``n``.
    3. ``theta = m + log(D)``; its float32 rounding (``tau``) is kept when ``theta`` within
       both paths' bounds rounds to one float32.

    Returns (theta, support, ok, maximum of xn, NaN/+inf count of xn)."""
    D, ksum, m_next, bad = _exp_pass32(x, c, m, lanes, xn)
    T = np.int64((VEXP32_ERR + ksum + 2.0 + _OLD_ERR) * 1.01) + 2
    und = _round_pass32(c[:x.shape[0]], 1.0 / D, T, out)
    A = math.log(D)
    theta = m + A
    E = 2.0 * ((VEXP32_ERR + ksum + _OLD_ERR + 4.0) + 4.0 * abs(A) + 2.0 * abs(theta)) * 2.0 ** -53
    ok = und == 0 and np.float32(theta - E) == np.float32(theta + E)
    return theta, x.shape[0], ok, m_next, bad


@jit(inline="always")
def softmax_rows_next(x, out, theta, support, n_iter, converged, r0, r1, f32):
    """alpha = 1, ``method=None``, rows ``r0 .. r1 - 1``: log-sum-exp, each row's maximum
    taken in the previous row's exponential pass: :func:`_softmax_row_next` for float64
    rows, :func:`_softmax32_row` for float32 ones (``f32``, a constant of the calling
    kernel, which numba inlines this function into and prunes to one branch), whose row
    left undecided (about one in 300 normal rows of 8192) is solved again by
    :func:`_softmax_row`: its bits on every row."""
    n = x.shape[1]
    L = _lanes(n)
    lanes = np.empty((4, LANES), np.float64)
    c = np.empty(n if f32 else 0, np.float64)
    m, bad = lane_max(x[r0], lanes[2, :L], lanes[3, :L])
    for r in range(r0, r1):
        xn = x[r + 1] if r + 1 < r1 else x[r]  # the last row's pass reads itself again
        settled, res = settled_row(out[r], m, bad)
        if settled:
            theta[r], support[r], n_iter[r], converged[r] = res
            m, bad = lane_max(xn, lanes[2, :L], lanes[3, :L])
            continue
        if f32:
            th, cnt, ok, m_next, bad = _softmax32_row(x[r], out[r], m, c, lanes, xn)
            if not ok:
                A, cnt = _softmax_row(x[r], out[r], m, c, lanes)
                th = m + A
        else:
            A, cnt, m_next, bad = _softmax_row_next(x[r], out[r], m, lanes, xn)
            th = m + A
        theta[r], support[r], n_iter[r], converged[r] = th, cnt, 0, True
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
