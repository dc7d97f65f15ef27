"""Double-word arithmetic for the numba kernels, and the rounding of a double-word with an
error bound to float64 or float32: the error-free transformations, the double-word operations and
``exp_dw``, ``log_dw``, ``log1p_dw`` of :mod:`entmax_ref.backends.double_word`, as scalar
functions without libm calls or branches on the data (selects), which LLVM vectorises in
loops.  Those that the finishing stage's vectorised loops call are ``forceinline`` (LLVM
inlines them into the loop before vectorising it); those it calls once per row or in loops
with branches (``log_dw``, ``log1p_dw``, ``dw_div``, ``round_signed``, ``neighbours``,
``nearest_even``) are plain calls, whose code each caller links once rather than at every
call site.

TwoProd is one fused multiply-add (``llvm.fma.f64``: a single rounding on every CPU, in
hardware where the CPU has FMA), which also gives the FMA forms of the double-word products
(DWTimesFP3, DWTimesDW3 of Joldes, Muller and Popescu).  The NumPy engine uses Dekker's
product instead; an error-free transformation has one exact answer, and each
function's error bound in :mod:`entmax_ref.backends.double_word` covers both.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import double_word as M
from ._jit import jit
from .vexp import div, float_bits, from_bits

_T64_HI, _T64_LO = M.EXP_T64_HI, M.EXP_T64_LO
_T4096_HI, _T4096_LO = M.EXP_T4096_HI, M.EXP_T4096_LO
_T1024_HI, _T1024_LO = M.EXP_T1024_HI, M.EXP_T1024_LO
_INV1024 = M.INV_LN2_1024
_L1024A, _L1024B, _L1024C = M.LN2_1024_A, M.LN2_1024_B, M.LN2_1024_C
_LOG_HI, _LOG_LO, _LOG_C = M.LOG_T_HI, M.LOG_T_LO, M.LOG_C
_INV = M.INV_LN2_4096
_LA, _LB, _LC = M.LN2_4096_A, M.LN2_4096_B, M.LN2_4096_C
_NA, _NB, _NC = M.LN2_A, M.LN2_B, M.LN2_C
_SHIFT = M.SHIFT
_SHIFT_BITS = 0x4338000000000000  # the bits of SHIFT: an integer k < 2^51 in its low bits
_C6, _C24, _C120, _C720 = M.EXP_C
_A5, _A7, _A9, _A11 = M.ATANH_C
_TT_HI, _TT_LO = M.TWO_THIRDS_HI, M.TWO_THIRDS_LO
_J0 = M.LOG_J0
_N = float(M.LOG_N)
_NEAR = M.LOG_NEAR
_SQRT2 = M.SQRT2
_TINY = 2.0 ** -600


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` with one rounding (``llvm.fma.f64``)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [f64, f64, f64]), "llvm.fma.f64")
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@jit(forceinline=True)
def two_sum(a, b):
    """``a + b = s + e`` exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@jit(forceinline=True)
def fast_two_sum(a, b):
    """``a + b = s + e`` exactly, for ``|a| >= |b|`` (or a = 0) (Dekker)."""
    s = a + b
    return s, b - (s - a)


@jit(forceinline=True)
def two_prod(a, b):
    """``a * b = p + e`` exactly."""
    p = a * b
    return p, fma(a, b, -p)


@jit(forceinline=True)
def dw_add(ah, al, bh, bl):
    """Double-word + double-word (AccurateDWPlusDW): relative error <= 3 u^2."""
    sh, sl = two_sum(ah, bh)
    th, tl = two_sum(al, bl)
    vh, vl = fast_two_sum(sh, sl + th)
    return fast_two_sum(vh, tl + vl)


@jit(forceinline=True)
def dw_add_fp(ah, al, b):
    """Double-word + float64 (DWPlusFP): relative error <= 2 u^2."""
    sh, sl = two_sum(ah, b)
    return fast_two_sum(sh, al + sl)


@jit(forceinline=True)
def dw_mul_fp(ah, al, b):
    """Double-word times float64 (DWTimesFP3): relative error <= 2 u^2."""
    ch, cl1 = two_prod(ah, b)
    return fast_two_sum(ch, fma(al, b, cl1))


@jit(forceinline=True)
def dw_mul(ah, al, bh, bl):
    """Double-word times double-word (DWTimesDW3): relative error <= 4 u^2."""
    ch, cl1 = two_prod(ah, bh)
    tl1 = fma(ah, bl, al * bl)
    return fast_two_sum(ch, cl1 + fma(al, bh, tl1))


@jit(forceinline=True)
def dw_div_fp(ah, al, b):
    """Double-word divided by float64 (DWDivFP3): relative error <= 3 u^2."""
    th = div(ah, b)
    ph, pl = two_prod(th, b)
    return fast_two_sum(th, div(((ah - ph) - pl) + al, b))


@jit
def dw_div(ah, al, bh, bl):
    """Double-word divided by double-word (DWDivDW2): relative error <= 15 u^2."""
    th = div(ah, bh)
    rh, rl = dw_mul_fp(bh, bl, th)
    return fast_two_sum(th, div((ah - rh) + (al - rl), bh))


@jit(forceinline=True)
def pow2(k):
    """``2^k`` for an integer ``-1022 <= k <= 1023`` (int64), from its bits."""
    return from_bits((k + 1023) << 52)


@jit(forceinline=True)
def scale2(v, k):
    """``v 2^k`` (int64 ``k``, |k| <= 2000) in two exact halvings: one rounding at most,
    where the result is subnormal."""
    k1 = k >> 1
    return (v * pow2(k1)) * pow2(k - k1)


@jit(forceinline=True)
def exp_dw(zh, zl):
    """``exp(zh + zl) = 2^e (hi + lo)`` with relative error below ``EPS_EXP``, for
    ``|zh| <= EXP_MAX`` (the algorithm is in :mod:`entmax_ref.backends.double_word`).
    Returns (e int64, hi, lo); ``hi`` in [0.7, 1.5]."""
    kd = zh * _INV + _SHIFT
    kf = kd - _SHIFT
    k = float_bits(kd) - _SHIFT_BITS
    h = zh - kf * _LA  # exact
    rh, rl = two_sum(h, -(kf * _LB))  # kf * B is exact
    rl = rl + (zl - kf * _LC)
    rh, rl = fast_two_sum(rh, rl)
    qh, ql = two_prod(rh, rh)
    poly = (qh * rh) * (_C6 + rh * (_C24 + rh * (_C120 + rh * _C720)))
    small = (0.5 * ql + rh * rl) + poly + rl
    s1, e1 = fast_two_sum(1.0, rh)
    s2, e2 = two_sum(s1, 0.5 * qh)
    eh, el = fast_two_sum(s2, (e1 + e2) + small)
    j1 = (k >> 6) & 63
    j2 = k & 63
    th, tl = dw_mul(_T64_HI[j1], _T64_LO[j1], _T4096_HI[j2], _T4096_LO[j2])
    hi, lo = dw_mul(th, tl, eh, el)
    return k >> 12, hi, lo


@jit(forceinline=True)
def exp_lean(zh, zl):
    """``exp(zh + zl) = 2^e (hi + lo)`` with relative error below ``EPS_EXP_LEAN`` (the
    algorithm is in :mod:`entmax_ref.backends.double_word`): one table of 1024 double-words
    and ``1 + r`` the only double-word of the polynomial, in two thirds of
    :func:`exp_dw`'s time.  For the softmax's first pass, whose rounding tests send the
    rare row they cannot decide to :func:`exp_dw`.  Returns (e int64, hi, lo)."""
    kd = zh * _INV1024 + _SHIFT
    kf = kd - _SHIFT
    k = float_bits(kd) - _SHIFT_BITS
    h = zh - kf * _L1024A  # exact
    rh, rl = two_sum(h, -(kf * _L1024B))  # kf * B is exact
    rh, rl = fast_two_sum(rh, rl + (zl - kf * _L1024C))
    q = (rh * rh) * (0.5 + rh * (_C6 + rh * (_C24 + rh * _C120)))
    s1, e1 = fast_two_sum(1.0, rh)
    eh, el = fast_two_sum(s1, e1 + (rl + q))
    j = k & 1023
    hi, lo = dw_mul(_T1024_HI[j], _T1024_LO[j], eh, el)
    return k >> 10, hi, lo


@jit(forceinline=True)
def _log_table(j, rh, rl):
    """``log(c_j) + log(1 + r)`` for ``c_j = 1 + j/256`` and a small double-word ``r``:
    ``log(1 + r) = 2 atanh(s)``, ``s = r / (2 + r)``."""
    dh, dl = fast_two_sum(2.0, rh)
    sh, sl = dw_div(rh, rl, dh, dl + rl)
    s2h, s2l = two_prod(sh, sh)
    s2l = s2l + 2.0 * sh * sl
    s3h, s3l = dw_mul(s2h, s2l, sh, sl)
    th, tl = dw_mul(s3h, s3l, _TT_HI, _TT_LO)
    tail = (s3h * s2h) * (_A5 + s2h * (_A7 + s2h * (_A9 + s2h * _A11)))
    ah, al = dw_add(2.0 * sh, 2.0 * sl, th, tl + tail)
    i = j - _J0
    return dw_add(_LOG_HI[i], _LOG_LO[i], ah, al)


@jit
def log_dw(vh, vl):
    """``log(vh + vl)`` for a positive double-word (normalised, ``vh`` normal), relative
    error below ``EPS_LOG``: ``v = 2^e m``, ``m`` in [sqrt(2)/2, sqrt(2)), ``m = c_j (1 +
    r)``.  Returns (hi, lo)."""
    b = float_bits(vh)
    e = ((b >> 52) & 0x7FF) - 1023
    m = from_bits((b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)  # in [1, 2)
    if m > _SQRT2:  # a select
        m = 0.5 * m
        e = e + 1
    j = np.int64((m - 1.0) * _N + _SHIFT - _SHIFT)
    c = _LOG_C[j - _J0]
    nh, nl = two_sum(m - c, vl * pow2(-e))  # m - c is exact
    rh, rl = dw_div_fp(nh, nl, c)
    lh, ll = _log_table(j, rh, rl)
    ef = np.float64(e)
    ph, pl = two_prod(ef, _NB)
    eh, el = fast_two_sum(ef * _NA, ph)  # e * LN2_A is exact
    return dw_add(eh, el + (pl + ef * _NC), lh, ll)


@jit
def log1p_dw(wh, wl):
    """``log(1 + wh + wl)`` for ``wh + wl > -1``, relative error below ``EPS_LOG``: for
    ``|w| <= 1/4`` from ``w`` itself (``r = (w - j/256) / c_j``), so a tiny ``w`` keeps its
    precision; otherwise :func:`log_dw` of ``1 + w``.  Returns (hi, lo)."""
    if abs(wh) <= _NEAR:
        if abs(wh) < _TINY:  # log1p(w) = w (1 - w/2 + ...): w itself, to 2^-601
            return wh, wl
        j = np.int64(wh * _N + _SHIFT - _SHIFT)
        c = _LOG_C[j - _J0]
        nh, nl = two_sum(wh - (c - 1.0), wl)  # wh - j/256 is exact
        rh, rl = dw_div_fp(nh, nl, c)
        return _log_table(j, rh, rl)
    vh, vl = two_sum(1.0, wh)
    vh, vl = fast_two_sum(vh, vl + wl)
    return log_dw(vh, vl)


@jit(forceinline=True)
def log1p_dw_sel(wh, wl):
    """:func:`log1p_dw` with both reductions formed and one of them selected (no branch on
    the data), for loops that LLVM vectorises."""
    near = abs(wh) <= _NEAR
    # near 1: 1 + w = c_j (1 + r), r = (w - j/256) / c_j
    jn = np.int64(wh * _N + _SHIFT - _SHIFT)
    jn = jn if near else 0
    cn = _LOG_C[jn - _J0]
    nh, nl = two_sum(wh - (cn - 1.0), wl)
    # otherwise 1 + w = 2^e m, m = c_j (1 + r)
    vh, vl = two_sum(1.0, wh)
    vh, vl = fast_two_sum(vh, vl + wl)
    vh = vh if not near else 1.0
    vl = vl if not near else 0.0
    b = float_bits(vh)
    e = ((b >> 52) & 0x7FF) - 1023
    m = from_bits((b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)  # in [1, 2)
    big = m > _SQRT2
    m = 0.5 * m if big else m
    e = e + 1 if big else e
    jf = np.int64((m - 1.0) * _N + _SHIFT - _SHIFT)
    cf = _LOG_C[jf - _J0]
    fh, fl = two_sum(m - cf, vl * pow2(-e))
    j = jn if near else jf
    rh, rl = dw_div_fp(nh if near else fh, nl if near else fl, cn if near else cf)
    lh, ll = _log_table(j, rh, rl)
    ef = np.float64(e) if not near else 0.0
    ph, pl = two_prod(ef, _NB)
    eh, el = fast_two_sum(ef * _NA, ph)
    sh, sl = dw_add(eh, el + (pl + ef * _NC), lh, ll)
    tiny = abs(wh) < _TINY
    return (wh if tiny else sh), (wl if tiny else sl)


SLACK, NORMAL_MIN = M.SLACK, M.NORMAL_MIN


# ----------------------------------------------------------------------------- rounding
@jit(forceinline=True)
def half_gaps(c, f32):
    """Half the distances from ``c >= 0`` (a value of the target format, as float64) to its
    neighbours above and below in that format (float64, or float32 when ``f32``), from
    the bits: the gap below is half the gap above at a power of two."""
    b = float_bits(c)
    ex = (b >> 52) & 0x7FF
    if f32:
        # float32's last place: 2^(ex - 1023 - 23), and 2^-149 below its normal range
        q = ex - 23
        if q < 1023 - 149:
            q = 1023 - 149
        mant_zero = ((b & 0x000FFFFFFFFFFFFF) == 0) & (ex > 1023 - 126)
    else:
        q = ex - 52
        if q < 1:
            q = 1
        mant_zero = ((b & 0x000FFFFFFFFFFFFF) == 0) & (ex > 1)
    up = 0.5 * from_bits(q << 52)
    dn = 0.5 * up if mant_zero else up
    return up, dn


@jit(forceinline=True)
def round_dw(h, l, err, f32):
    """The rounding to nearest of ``h + l`` (a normalised double-word, ``|h| >=
    NORMAL_MIN``, ``h >= 0``) in float64 (or float32), and whether every value within
    ``err`` of it rounds the same.  Returns (value as float64, ok)."""
    c = np.float64(np.float32(h)) if f32 else h
    d = (h - c) + l  # h - c is exact
    up, dn = half_gaps(c, f32)
    e = err * SLACK
    ok = (d + e < up / SLACK) & (d - e > -dn / SLACK) & (h >= NORMAL_MIN)
    return c, ok


@jit
def round_signed(h, l, err, f32):
    """:func:`round_dw` in float64 (or float32) for a double-word of either sign (tau)."""
    if h < 0.0:
        c, ok = round_dw(-h, -l, err, f32)
        return -c, ok
    return round_dw(h, l, err, f32)


@jit
def round_scaled(e, h, l, err, f32):
    """:func:`round_dw` of ``2^e (h + l)`` (``h`` near 1, positive) with absolute error ``2^e
    err``, results below ``NORMAL_MIN`` included: there the low part of a double-word no
    longer resolves the value, so the test runs in ``h``'s units, on float64's grid at
    ``v`` (its last place, 2^-1074 for a subnormal ``v``).  Returns (value as float64, ok)."""
    v = scale2(h, e)
    if v >= NORMAL_MIN:
        return round_dw(v, scale2(l, e), scale2(err, e), f32)
    if f32:  # every value this small is 0 in float32
        return 0.0, v < 2.0 ** -200
    d, up, dn = _grid_offset(v, e, h, l)  # v: h 2^e rounded once to float64's grid
    if d > up or d < -dn:  # h alone on a midpoint of the grid, rounded away from l's side
        v = np.nextafter(v, np.inf if d > 0.0 else -np.inf)
        d, up, dn = _grid_offset(v, e, h, l)
    return v, d + err * SLACK < up / SLACK and d - err * SLACK > -dn / SLACK


@jit(forceinline=True)
def _grid_offset(v, e, h, l):
    """``h + l - v 2^-e`` and half the gaps of float64's grid above and below ``v >= 0``
    (its last place: 2^-1074 below the normal range), in ``h``'s units (all exact)."""
    b = float_bits(v)
    ex = (b >> 52) & 0x7FF
    up = scale2(1.0, max(ex, 1) - 1076 - e)
    dn = 0.5 * up if ex > 1 and (b & 0x000FFFFFFFFFFFFF) == 0 else up  # below a power of two: half
    return (h - scale2(v, -e)) + l, up, dn


# ----------------------------------------------------------------------------- exact ties
@jit
def sum_sign(t, n, e):
    """The exact sign (-1, 0, 1) of ``t[0] + ... + t[n-1]`` (float64, no overflow), by
    Shewchuk's Grow-Expansion with zero elimination into the scratch ``e`` (length >= n):
    the expansion's components do not overlap and grow in magnitude, so its sign is that
    of the last."""
    m = 0
    for i in range(n):
        q = t[i]
        k = 0
        for j in range(m):
            q, h = two_sum(q, e[j])
            if h != 0.0:
                e[k] = h
                k += 1
        if q != 0.0:
            e[k] = q
            k += 1
        m = k
    if m == 0:
        return 0
    return 1 if e[m - 1] > 0.0 else -1


@jit
def tau_alone(a1, m, f32):
    """``a1 m - 1``, the tau of a row whose maximum ``m`` alone is the support (p = 1
    there), rounded once to float64, or with ``f32`` to float32 (as a float64).  The FMA's
    float64 value ``t`` is the float64 rounding; its float32 rounding is the exact value's
    except where ``t`` is itself a float32 rounding midpoint and not the exact value
    (``a1`` has more bits than a float32), where the exact sign of ``a1 m - 1 - t``
    (TwoProd, :func:`sum_sign`) says which way."""
    t = fma(a1, m, -1.0)
    if not f32:
        return t
    c = np.float64(np.float32(t))
    up, dn = half_gaps(abs(c), f32)
    d = abs(t) - abs(c)
    if d == up or d == -dn:
        terms = np.empty(4, np.float64)
        terms[0], terms[1] = two_prod(a1, m)
        terms[2], terms[3] = -1.0, -t
        s = sum_sign(terms, np.int64(4), np.empty(4, np.float64))
        c = np.float64(np.float32(t + s * abs(t) * 2.0 ** -30))  # ties (s = 0): to even
    return c


@jit
def neighbours(h, l, f32):
    """The two values of the target format around ``h + l`` that a rounding chooses between
    when ``h + l`` is within a hair of their midpoint: (below, above, midpoint as a
    double-word), ``h >= 0``."""
    c = np.float64(np.float32(h)) if f32 else h
    up, dn = half_gaps(c, f32)
    if (h - c) + l >= 0.0:
        return c, c + 2.0 * up, c, up
    return c - 2.0 * dn, c, c, -dn


@jit
def nearest_even(a, b, f32):
    """Of two neighbouring values of the target format, the one whose last digit is even."""
    if f32:
        return a if (float_bits(a) >> 29) & 1 == 0 else b
    return a if float_bits(a) & 1 == 0 else b
