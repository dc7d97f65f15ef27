"""alpha = 1 of the numba row solvers: softmax as log-sum-exp (units as in :mod:`.rows`).

Every pass over the row is a loop that LLVM vectorises (AVX2: 4 float64 lanes): the
maximum (:func:`.candidates.lane_max`), ``e_i = exp(x_i - m)`` with the straight-line
:func:`.vexp.vexp_neg` (``math.exp`` is a libm call, one element at a time; entries below
its range, rare, are redone with :func:`.vexp.vexp`), the compensated
sum of the ``e_i`` in ``L`` independent lanes (one lane per position in a block of ``L``
consecutive entries, each with Knuth's branch-free TwoSum error term, so no loop-carried
rounding order has to be kept and the lanes are vector registers), and ``p_i = e_i / (1 +
s)``.  The lanes are merged with Neumaier's step.  The error of the sum is that of a
compensated sum (``~2 eps |s|`` plus ``n eps^2 |s|``), whatever the order.  That is the
per-row path (:func:`solve_softmax`); a batch of float64 rows takes only each row's maximum
here (:func:`softmax64_rows`), since the finishing stage computes every output again,
correctly rounded.

float32 rows (:func:`softmax32_rows`) are correctly rounded: each output is the exact
real-number softmax at the float32 entries, rounded once to float32, and so is ``tau``.
One sweep per row computes the exponentials with a shorter float64 exponential
(:func:`.vexp.vexp32`: 13 products and multiply-adds where :func:`.vexp.vexp_neg` takes 18
and five additions) and their sum, writes the previous row's outputs, and takes the next
row's maximum and least entry as integer order keys (:func:`_pass32`); a proven bound on
the error of each float64 probability against the exact value, and a rounding test on its
bits, decide its float32 rounding.  The rare row the test does not decide (about one in
300 normal rows of 8192) goes to the compiled finishing stage's double-word row
(:func:`.exact_rows.cr_softmax`), the NumPy engine's algorithm: the same bits on both
engines by construction.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..constants import SOFTMAX_EXP_FLOOR
from ._jit import jit
from .candidates import lane_max
from .compensated import acc, merge_lanes, two_sum
from .elementwise import settled_row
from .exact_rows import SM_LANES, cr_softmax
from .vexp import VEXP32_ERR, VEXP32_RANGE, VEXP32_SLOPE, VEXP_NEG_MIN, div, float_bits, vexp, vexp32, vexp_neg

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
    m)`` in the scratch ``e`` and found entries at or below :func:`_low`
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
        o = b * L
        for j in range(L):
            i = np.uint64(o + j)  # unsigned, not a slice a block: see .candidates.lane_max
            # the maximum's own terms are left out (counted in ties)
            tie = np.float64(x[i]) == m
            ties += tie
            v = 0.0 if tie else e[i]
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


#: blocks of a lane's first-level sum in :func:`_pass32` (then added into the second level)
_GROUP = 16
#: the low 29 bits of a float64, which its rounding to float32 drops, and their value at a
#: float32 rounding boundary (the midpoint between two float32 neighbours)
_LOW29 = (1 << 29) - 1
_MID29 = 1 << 28
_F32_MIN = 1.1754943508222875e-38  # 2^-126: below it float32 is subnormal
_F32_ZERO = 2.0 ** -152  # a probability below it (within its bound) rounds to 0 in float32
#: order keys (:func:`_order_key`): the extremes, and those of +inf and -inf; a row's
#: largest key at or above that of +inf, or its smallest below that of -inf, means a NaN
#: or +inf entry
_KEY_LO = np.int32(-(1 << 31))
_KEY_HI = np.int32((1 << 31) - 1)
_KEY_PINF = 0x7F800000
_KEY_NINF = -0x7F800001


@intrinsic
def _order_key(typingctx, b):
    """The order key of the float32 whose bits are int32 ``b``: an int32 that orders as the
    floats do (the sign-magnitude bits of a negative float turned into two's complement;
    -0 just below +0), +NaN above +inf, -NaN below -inf.  Integer maxima and minima
    vectorise where a float maximum (with NaN to ignore) does not."""
    if b != types.int32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        neg = builder.ashr(args[0], ir.Constant(i32, 31))
        return builder.xor(args[0], builder.and_(neg, ir.Constant(i32, 0x7FFFFFFF)))

    return types.int32(types.int32), codegen


@intrinsic
def _key_value(typingctx, k):
    """The float32 (as a float64) whose order key is int32 ``k``."""
    if k != types.int32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        neg = builder.ashr(args[0], ir.Constant(i32, 31))
        b = builder.xor(args[0], builder.and_(neg, ir.Constant(i32, 0x7FFFFFFF)))
        return builder.fpext(builder.bitcast(b, ir.FloatType()), ir.DoubleType())

    return types.float64(types.int32), codegen


@jit
def _key_range(x):
    """The largest and smallest order keys of the float32 row ``x``."""
    xk = x.view(np.int32)
    hi, lo = _KEY_LO, _KEY_HI
    for i in range(xk.shape[0]):
        k = _order_key(xk[i])
        hi = max(hi, k)
        lo = min(lo, k)
    return hi, lo


@jit(forceinline=True)
def _entry32(x, c, c0, out, xkey, i, m, inv, off, low, hi, lo):
    """Entry ``i`` of the three rows of a :func:`_pass32` sweep: ``c_i = vexp32(x_i - m)``,
    ``out_i = c0_i inv`` with its low bits (plus ``off``) folded into ``low``, the order key
    of ``xkey_i`` into ``hi`` and ``lo``.  Returns (c_i, low, hi, lo)."""
    e = vexp32(np.float64(x[i]) - m)
    c[i] = e
    p = c0[i] * inv
    out[i] = p
    k = _order_key(xkey[i])
    return e, min(low, (float_bits(p) + off) & _LOW29), max(hi, k), min(lo, k)


@jit
def _pass32(x, m, c, S, S2, out, c0, inv, off, xk):
    """One sweep of :func:`softmax32_rows`, three rows at once: the exponentials ``c_i =
    vexp32(x_i - m)`` of row ``x`` into ``c`` and their sum ``D`` in two levels of lanes
    (``S``, ``S2``: ``L`` lanes each; each lane adds :data:`_GROUP` blocks of ``L``
    entries, then its sum into the second level; the lanes merged pairwise); the outputs
    ``out_i = c0_i inv`` of the row before, stored as float32, with the least value of
    their low 29 bits plus ``off`` (:func:`softmax32_rows`, step 2); the largest and
    smallest order keys of ``xk``, the row after.  One loop, which LLVM vectorises: the
    row after is read from memory and the row before is written while the exponentials
    keep the multiply-add units busy.  Returns (D, least low bits, largest key, smallest
    key)."""
    n = x.shape[0]
    L = S.shape[0]
    S[:] = 0.0
    S2[:] = 0.0
    hi, lo = _KEY_LO, _KEY_HI
    low = np.int64(_LOW29 + 1)  # not a literal: see the package docstring
    nb = n // L
    xkey = xk.view(np.int32)
    for b in range(nb):
        o = b * L
        for j in range(L):
            # unsigned indices, not five slices a block: see .candidates.lane_max
            e, low, hi, lo = _entry32(x, c, c0, out, xkey, np.uint64(o + j), m, inv, off, low, hi, lo)
            S[j] += e
        if b % _GROUP == _GROUP - 1:
            for j in range(L):
                S2[j] += S[j]
                S[j] = 0.0
    for i in range(nb * L, n):  # the tail: one more block of the last group
        e, low, hi, lo = _entry32(x, c, c0, out, xkey, np.uint64(i), m, inv, off, low, hi, lo)
        S[i - nb * L] += e
    for j in range(L):
        S2[j] += S[j]
    w = L
    while w > 1:  # the lanes pairwise, in halves
        w //= 2
        for j in range(w):
            S2[j] += S2[j + w]
    return S2[0], low, hi, lo


@jit
def _row_test(n, L, m, lo):
    """The rounding test's width ``T`` (float64 ulps) for a row of ``n`` entries with maximum
    ``m`` and least entry ``lo`` (:func:`softmax32_rows`, steps 1 and 2), and the bound
    ``E`` (units of 2^-53, relative) on the error of its sum ``D``."""
    Y = min(m - lo, VEXP32_RANGE) if lo > -np.inf else VEXP32_RANGE
    nb = n // L
    ksum = _GROUP + nb // _GROUP + 3 + math.log2(L)
    Ee = VEXP32_ERR + (VEXP32_SLOPE + 1.0) * Y * 1.01 + 1.0
    E = Ee + ksum
    return np.int64((Ee + E + 2.0) * 1.01) + 2, E


@jit
def _row_end32(x, out, c, m, lo, D, T, E, low):
    """Step 3 of :func:`softmax32_rows` for a row whose outputs :func:`_pass32` wrote from
    ``c`` with the least low bits ``low``: returns (theta, support, decided)."""
    n = x.shape[0]
    und = low <= 2 * T
    inv = 1.0 / D
    if vexp32(max(lo, VEXP_NEG_MIN) - m) * inv < 2.0 * _F32_MIN:  # entries may lie below float32's normal range
        for i in range(n):
            p = c[i] * inv
            und |= (p < _F32_MIN) & (p >= _F32_ZERO)
    cnt = n
    if lo == -np.inf:
        cnt = 0
        for i in range(n):
            cnt += np.float64(x[i]) > -np.inf
    A = math.log(D)
    theta = m + A
    Et = 2.0 * ((E + 4.0) + 4.0 * abs(A) + 2.0 * abs(theta)) * 2.0 ** -53
    ok = not und and np.float32(theta - Et) == np.float32(theta + Et)
    return theta, cnt, ok


@jit
def _exact32(x, out, m):
    """The correctly rounded float32 softmax row ``x`` (maximum ``m``) by the finishing
    stage's compiled row (:func:`.exact_rows.cr_softmax`: the lean double-word exponential,
    then the precise one).  Returns (theta, whose float32 rounding is the correctly rounded
    tau; support; decided); a row it leaves undecided is
    solved exactly on the Python side (:func:`entmax_ref.backends.numba_backend`)."""
    n = x.shape[0]
    eh = np.empty(n, np.float64)
    el = np.empty(n, np.float64)
    lanes = np.empty((3, SM_LANES), np.float64)
    _, theta, cnt, ok = cr_softmax(x, out, m, eh, el, lanes, np.bool_(True), np.bool_(False))
    if not ok:
        _, theta, cnt, ok = cr_softmax(x, out, m, eh, el, lanes, np.bool_(True), np.bool_(True))
    return theta, cnt, ok


@jit
def softmax32_rows(x, out, theta, support, n_iter, converged, r0, r1):
    """alpha = 1, ``method=None``, float32 rows ``r0 .. r1 - 1``, each correctly rounded: its
    float32 outputs and the float32 rounding of ``theta`` (``tau``) are those of the exact
    real-number softmax at its float32 entries.  The rows go through :func:`_pass32` as a
    pipeline: one sweep computes the exponentials of row r + 1, writes the outputs of row
    r and takes the order keys of row r + 2 (the first sweep of a block writes nothing it
    keeps; the last computes row r's exponentials again, unused).  Per row:

    1. its maximum ``m`` and least entry ``lo`` from the keys (a NaN or +inf entry, or no
       entry above -inf, settles the row: :func:`.elementwise.settled_row`); ``e_i =
       vexp32(y_i)`` with ``y_i = x_i - m`` rounded to float64 (exact unless the
       exponents of x_i and m lie 29 or more apart, and always within ``|y_i| 2^-53``), so
       each ``e_i`` is within ``Ee = VEXP32_ERR + (VEXP32_SLOPE + 1) Y`` units of
       ``2^-53`` of ``exp(y_i)`` (relative; ``Y = min(m - lo, 88)``: an entry with ``y_i <
       -88`` is below ``exp(-88)``, which changes no float32 output this test decides and
       the sum by less than ``n e^-88``).  Their sum ``D`` carries ``k = _GROUP + nb /
       _GROUP + 3 + log2 L`` roundings of sums of positive terms, so it is within ``E = Ee
       + k`` units of the exact ``sum exp(y_i)``.
    2. ``p_i = e_i (1 / D)``: within ``Ee + E + 2`` units of the exact probability (two
       more roundings), and a unit of ``2^-53`` relative is at most one float64 ulp of
       ``p_i``; with ``T`` that many ulps (1% and two ulps more for the products of the
       small terms), when the low 29 bits of ``p_i`` (those float32 drops) are more than
       ``T`` from ``2^28``, the midpoint, no float32 rounding boundary lies between the
       float64 ``p_i`` and the exact value, so its float32 rounding is the correctly
       rounded one.  :func:`_pass32` keeps the least of ``(bits + T - 2^28) mod 2^29`` over
       the row: the row is decided when it exceeds ``2 T``.  Below float32's normal range
       (checked only where ``exp(lo - m) / D`` can reach it): ``p < 2^-152`` rounds to 0
       (the exact value is below ``2^-150``; an entry below ``-708``, clamped, or ``-inf``,
       is far below), an entry in ``[2^-152, 2^-126)`` leaves the row undecided.
    3. ``theta = m + log(D)``; its float32 rounding ``tau`` is decided when ``theta``
       within twice its error bound rounds to one float32.  The support is the number of
       entries above ``-inf`` (every such exact probability is positive).

    A row left undecided (about one in 300 normal rows of 8192) is solved by
    :func:`_exact32`, correctly rounded, and one that stage leaves too gets
    ``converged = False`` for the Python side's exact row.  The float64 path's bits play
    no part: every answer is the exact value rounded once."""
    n = x.shape[1]
    if r0 >= r1:
        return
    L = _lanes(n)
    lanes = np.empty((4, LANES), np.float64)
    c = np.empty((2, n), np.float64)
    S = lanes[0, :L]
    S2 = lanes[1, :L]
    hi, lo_k = _key_range(x[r0])
    m, lo, bad = _key_value(hi), _key_value(lo_k), (hi >= _KEY_PINF) | (lo_k < _KEY_NINF)
    xk = x[r0 + 1] if r0 + 1 < r1 else x[r0]
    # the first sweep: row r0's exponentials (its output part writes into out[r0], which
    # the next sweep overwrites)
    D, _, hi, lo_k = _pass32(x[r0], m, c[0], S, S2, out[r0], c[1], 0.0, np.int64(0), xk)
    T, E = _row_test(n, L, m, lo)
    for r in range(r0, r1):
        cur, nxt = c[(r - r0) % 2], c[(r - r0 + 1) % 2]
        rn = r + 1 if r + 1 < r1 else r
        xk = x[r + 2] if r + 2 < r1 else x[rn]
        m_n, lo_n, bad_n = _key_value(hi), _key_value(lo_k), (hi >= _KEY_PINF) | (lo_k < _KEY_NINF)
        if rn == r:
            m_n, lo_n = m, lo
        D_n, low, hi, lo_k = _pass32(x[rn], m_n, nxt, S, S2, out[r], cur, div(1.0, D), T - _MID29, xk)
        settled, res = settled_row(out[r], m, bad)
        if settled:
            theta[r], support[r], n_iter[r], converged[r] = res
        else:
            th, cnt, ok = _row_end32(x[r], out[r], cur, m, lo, D, T, E, low)
            if not ok:
                th, cnt, ok = _exact32(x[r], out[r], m)
            theta[r], support[r], n_iter[r], converged[r] = th, cnt, 0, ok
        m, lo, bad, D = m_n, lo_n, bad_n, D_n
        T, E = _row_test(n, L, m, lo)


@jit
def softmax64_rows(x, out, theta, support, n_iter, converged, r0, r1):
    """alpha = 1, ``method=None``, float64 rows ``r0 .. r1 - 1``: the solver stage of rows
    whose every output and ``tau`` the finishing stage computes (correctly rounded,
    :func:`.exact_finish.finish_rows`).  One read of each row: a row holding NaN or +inf, or
    no entry above -inf, is settled (:func:`.elementwise.settled_row`); any other gets its
    maximum as ``theta`` (finite: the finishing stage's mark of a row to finish), its
    ``out`` left to that stage.  A log-sum-exp here would be redone there in double-word
    arithmetic, its outputs overwritten (float32 rows: :func:`softmax32_rows`)."""
    L = _lanes(x.shape[1])
    lanes = np.empty((2, LANES), np.float64)
    for r in range(r0, r1):
        m, bad = lane_max(x[r], lanes[0, :L], lanes[1, :L])
        theta[r], support[r], n_iter[r], converged[r] = settled_row(out[r], m, bad)[1]


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
