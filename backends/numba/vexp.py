"""A vectorisable float64 exponential for the numba row kernels.

LLVM vectorises a loop only when its body makes no opaque calls, and ``math.exp`` is a call
into libm, so a loop of ``math.exp`` runs one element at a time.  :func:`vexp` is the same
function written as straight-line arithmetic that LLVM inlines and vectorises (4 float64
lanes with AVX2), without fast-math flags, so every operation is rounded as written:

1. range reduction ``d = k ln2 + r``, ``|r| <= ln2 / 2 + tiny``: ``k`` is the nearest integer to
   ``d / ln2``, found by adding and subtracting ``1.5 * 2^52`` (the addition rounds to an
   integer), and ``r = (d - k ln2_hi) - k ln2_lo`` with ``ln2_hi`` carrying 32 significant
   bits, so ``k ln2_hi`` and the first subtraction are exact (Cody and Waite);
2. ``exp(r) = 1 + r + (r^2 g(r) + c)`` with ``c`` the rounding error of ``r`` and ``g`` a
   degree-10 polynomial fitted (Chebyshev, 60 digits, mpmath) to ``(exp(r) - 1 - r) / r^2``
   on ``|r| <= 0.352`` (relative error below 5.3e-19), evaluated by Estrin's scheme;
   ``1 + r`` is split exactly into a rounded sum and its error, so the result is rounded
   essentially once;
3. ``2^k`` from its bits: ``k`` is read from the low bits of the shifted sum (an integer
   view, no float-to-int conversion, which AVX2 lacks for 64-bit integers) and applied in
   two halves ``2^k1 2^k2`` so that subnormal results (``d`` down to -745.13) round once
   and large ``d`` overflows to ``inf``.

``d`` is clamped to ``[-746, 710]`` first (``exp`` is 0 or ``inf`` beyond), ``-inf`` gives 0,
NaN gives NaN.  The error is below 0.8 ulp in the normal range (0.5 for the final rounding,
the rest from the small part; 0.64 is the worst seen) and below 1 ulp of the subnormal
grid below it (``tests/test_numba_vexp.py`` checks both against mpmath on a dense
sweep).

:func:`vexp32` is a shorter one for the float32 softmax rows, whose float32 rounding is all
that is kept: one multiply-add for the reduction, a degree-10 polynomial, within ``14.4 +
0.302 |d|`` units of 2^-53 (relative) on ``[-88, 0]``.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import jit

_SHIFT = 6755399441055744.0  # 1.5 * 2^52: x + _SHIFT rounds x to an integer (|x| < 2^51)
_INV_LN2 = 1.4426950408889634
_LN2 = 0.6931471805599453
_LN2_HI = 6.93147180369123816490e-01  # 32 significant bits: k * _LN2_HI is exact for |k| < 2^21
_LN2_LO = 1.90821492927058770002e-10  # ln2 - _LN2_HI
# g(r) ~ (exp(r) - 1 - r) / r^2, highest degree first (mpmath.chebyfit on |r| <= 0.3516;
# relative error of 1 + r + r^2 g(r) below 5.3e-19 with the coefficients rounded as here)
_G10 = 2.091578834062386e-09
_G9 = 2.5106759317764318e-08
_G8 = 2.7557270958448667e-07
_G7 = 2.7557251640734314e-06
_G6 = 2.4801587327695137e-05
_G5 = 0.00019841269877827726
_G4 = 0.0013888888888883126
_G3 = 0.008333333333325262
_G2 = 0.04166666666666667
_G1 = 0.1666666666666667
_G0 = 0.5


@intrinsic
def float_bits(typingctx, x):
    """The int64 with the bits of float64 ``x`` (a register move, no conversion)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def from_bits(typingctx, b):
    """The float64 whose bits are int64 ``b``."""
    if b != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _fmuladd(typingctx, a, b, c):
    """``a * b + c``, fused into one rounding where the CPU has FMA (``llvm.fmuladd``), two
    roundings otherwise; either way within the error bounds stated here."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [f64, f64, f64]),
                                            "llvm.fmuladd.f64")
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def _exponent_field(typingctx, b):
    """The exponent field (bits 52-62) of the float64 whose bits are int64 ``b >= 0``, as an
    int64: a logical shift, which AVX2 has for 64-bit lanes (an arithmetic one it lacks)."""
    if b != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], ir.Constant(ir.IntType(64), 52))

    return types.int64(types.int64), codegen


@intrinsic
def div(typingctx, a, b):
    """``a / b`` as a plain IEEE division: numba's ``/`` tests for a zero divisor (to raise
    ZeroDivisionError), and that branch keeps a loop from being vectorised."""
    if not (a == b == types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return types.float64(types.float64, types.float64), codegen


_SHIFT_BITS = 0x4338000000000000  # the bits of _SHIFT


@jit(forceinline=True)
def _exp_reduced(d):
    """Steps 1 and 2 of the module docstring for a float64 ``d`` in ``[-746, 710]``: returns
    ``(e, kd, kf)`` with ``exp(d) = e 2^k``, ``e = exp(r + c)`` rounded once, ``kd`` the
    shifted sum that holds ``k`` in its low bits and ``kf = k`` as a float64.  The
    polynomial is evaluated by Estrin's scheme (pairs, then pairs of pairs), whose
    dependency chain is 5 multiply-adds deep where Horner's is 10 (the softmax pass, 512 x
    8192 float32 on one thread: 2.15 -> 1.8 ns an entry with :func:`vexp_neg`)."""
    kd = _fmuladd(d, _INV_LN2, _SHIFT)
    kf = kd - _SHIFT
    h = _fmuladd(kf, -_LN2_HI, d)  # exact
    r = _fmuladd(kf, -_LN2_LO, h)
    c = _fmuladd(kf, -_LN2_LO, h - r)  # r + c = d - k ln2 to ~2^-106 (h - r is exact)
    r2 = r * r
    r4 = r2 * r2
    g = _fmuladd(_fmuladd(_fmuladd(_G10, r2, _fmuladd(_G9, r, _G8)), r4,
                          _fmuladd(_fmuladd(_G7, r, _G6), r2, _fmuladd(_G5, r, _G4))), r4,
                 _fmuladd(_fmuladd(_G3, r, _G2), r2, _fmuladd(_G1, r, _G0)))
    t = _fmuladd(r2, g, c)  # the small part, |t| < 0.07
    s = 1.0 + r
    return s + (((1.0 - s) + r) + t), kd, kf  # 1 + r split exactly (|r| < 1): one rounding


#: :func:`vexp` clamps its argument to [VEXP_MIN, VEXP_MAX]: float64's exp(d) is 0 below
#: -745.13 and inf above 709.78, so the clamp changes no result and keeps the range
#: reduction's integer in range.
VEXP_MIN = -746.0
VEXP_MAX = 710.0


@jit(forceinline=True)
def vexp(d):
    """``exp(d)`` for a float64 ``d`` (under 0.8 ulp; 1 subnormal ulp below the normal range),
    as vectorisable arithmetic (module docstring)."""
    if d < VEXP_MIN:  # a select, not a branch: -inf -> 0; NaN passes through
        d = VEXP_MIN
    if d > VEXP_MAX:
        d = VEXP_MAX
    e, kd, kf = _exp_reduced(d)
    k = float_bits(kd) - _SHIFT_BITS  # the integer k, |k| <= 1077
    k1 = float_bits(kf * 0.5 + _SHIFT) - _SHIFT_BITS  # about k / 2 (AVX2 has no 64-bit arithmetic shift)
    k2 = k - k1
    s1 = from_bits((k1 + 1023) << 52)
    s2 = from_bits((k2 + 1023) << 52)
    return (e * s1) * s2


@jit(forceinline=True)
def _pow2(kd):
    """``2^k`` for the integer ``k >= -1022`` held in the low bits of the shifted sum ``kd``
    (step 3 of the module docstring in one step: a normal power of two)."""
    return from_bits((float_bits(kd) - _SHIFT_BITS + 1023) << 52)


#: below this, :func:`vexp_neg`'s result is not exp(d) (a subnormal or zero would be)
VEXP_NEG_MIN = -708.0


@jit(forceinline=True)
def vexp_neg(d):
    """``exp(d)`` for a float64 ``VEXP_NEG_MIN <= d <= 0``, the same bits as :func:`vexp`
    there, with one clamp and one scaling by a normal ``2^k`` in place of two (2.6 -> 1.8
    ns an entry in the softmax pass).
    Below ``VEXP_NEG_MIN`` it returns ``exp(-708)`` (about 3e-308), not ``exp(d)``: the
    caller must recompute those entries with :func:`vexp` (the softmax pass counts them).
    NaN passes through."""
    if d < VEXP_NEG_MIN:  # a select, not a branch
        d = VEXP_NEG_MIN
    e, kd, _ = _exp_reduced(d)
    return e * _pow2(kd)


#: the relative error of :func:`vexp32` at ``d`` is below ``VEXP32_ERR + VEXP32_SLOPE |d|``
#: units of 2^-53 for ``|d| <= VEXP32_RANGE`` (proof in its docstring)
VEXP32_ERR = 14.4
VEXP32_SLOPE = 0.302
VEXP32_RANGE = 88.0
# (exp(r) - 1 - r) / r^2 on |r| <= 0.34665 (ln2 / 2 and 0.02%), degree 8, highest first
# (mpmath.chebyfit at 60 digits): 1 + r + r^2 g(r) is within 1.171e-15 of exp(r), relative,
# with the coefficients rounded as here (the maximum over 20,001 points of the interval)
_H = (2.761381816969184e-07, 2.7625129152550647e-06, 2.480153636831133e-05, 0.00019841208708073097,
      0.0013888888905891745, 0.008333333353741644, 0.04166666666665134, 0.16666666666648272, 0.5)


@jit(forceinline=True)
def vexp32(d):
    """``exp(d)`` for a float64 ``-88 <= d <= 0`` within ``VEXP32_ERR + VEXP32_SLOPE |d|``
    units of ``2^-53``, relative (at most 41 units): the exponential of the float32 softmax
    rows, whose float32 results it must decide, not round to float64 (:mod:`.softmax`).
    Below -88 it is within ``2^-44`` relative down to ``d = -708``; below that it returns
    ``exp(-708)``.  NaN passes through.

    :func:`vexp_neg`'s steps, shortened: ``k`` the nearest integer to ``d / ln2``, ``r = d -
    k ln2`` in one multiply-add with the float64 ``ln2`` (``|r| <= ln2 / 2`` and a few
    ulps), ``exp(r) = 1 + r + r^2 g(r)`` as ``E(z) + r O(z)``, ``z = r^2``, its even and odd parts
    each by Horner's rule in ``z`` (two independent chains of 5 and 4 multiply-adds: the
    loop is bound by the multiply-adds' throughput, not by one long chain), scaled by
    ``2^k`` in its exponent field (exact: ``k >= -1021``).  The error, relative, in units of
    ``2^-53``: the polynomial 10.6 (``_H``); its evaluation 3.3 (the last multiply-add
    rounds once, ``E <= 1.07`` once, ``r O`` carries ``|r| <= 0.35`` of O's rounding, and
    the earlier steps at most ``z <= 0.12`` of theirs, over ``exp(r) >= 0.7``); the
    rounding of ``r`` 0.35 (``|r| u``); the error of the float64 ``ln2`` (``2.32e-17``, 0.209
    units) times ``|k| <= |d| / ln2 + 0.5``: ``0.302 |d| + 0.11``.  Together below ``14.4 +
    0.302 |d|`` (``tests/test_numba_vexp.py`` measures every point of a dense sweep against
    it, and fails when the polynomial is one degree shorter)."""
    if d < VEXP_NEG_MIN:  # a select, not a branch
        d = VEXP_NEG_MIN
    kd = _fmuladd(d, _INV_LN2, _SHIFT)
    r = _fmuladd(kd - _SHIFT, -_LN2, d)
    z = r * r
    even = 1.0  # 1 + a0 z + a2 z^2 + ... + a8 z^5, a_j the coefficient of r^j in g
    odd = 1.0  # 1 + a1 z + a3 z^2 + a5 z^3 + a7 z^4
    ev = _H[0]
    for j in range(2, len(_H), 2):
        ev = _fmuladd(ev, z, _H[j])
    od = _H[1]
    for j in range(3, len(_H), 2):
        od = _fmuladd(od, z, _H[j])
    even = _fmuladd(ev, z, even)
    odd = _fmuladd(od, z, odd)
    # times 2^k (-1021 <= k <= 0, the result normal) as k added to the exponent field: the
    # bits of kd are those of 1.5 * 2^52 + k, whose shift by 52 leaves k << 52 alone
    return from_bits(float_bits(_fmuladd(r, odd, even)) + (float_bits(kd) << 52))


_EXP_BITS = 0x7FF0000000000000  # the exponent field of a float64
_EXP_FLIP = 0x7FE0000000000000  # minus the bits of 2^e gives the bits of 2^-e (|e| < 1023)
_TWO52_BITS = 0x4330000000000000  # the bits of 2^52: an integer below 2^52 in its low bits reads as 2^52 + it
_SQRT2 = 1.4142135623730951
# 2 atanh(s) = 2 s + s R(s^2) with R(z) = sum_{j >= 1} 2 z^j / (2 j + 1): the Taylor
# coefficients 2 / (2 j + 1), j = 1 .. 10 (|s| <= 0.1716, z <= 0.0295: the terms left out
# are below 6e-19 of the result)
_R = (2.0 / 3.0, 2.0 / 5.0, 2.0 / 7.0, 2.0 / 9.0, 2.0 / 11.0, 2.0 / 13.0, 2.0 / 15.0, 2.0 / 17.0,
      2.0 / 19.0, 2.0 / 21.0)


@jit(forceinline=True)
def _atanh_series(z, terms):
    """``R(z) = sum_{j=1}^{terms} 2 z^j / (2 j + 1)`` (the first ``terms`` of :data:`_R`) by
    Horner's rule; ``terms`` is a constant of the caller, so the loop unrolls."""
    r = _R[terms - 1]
    for j in range(terms - 2, -1, -1):
        r = _fmuladd(r, z, _R[j])
    return r * z


@jit(forceinline=True)
def _log_reduce(u):
    """``log(u) = e ln2 + log(1 + f)`` for a normal ``u > 0``: ``u = 2^e m`` with ``m`` in
    ``[sqrt(2)/2, sqrt(2))`` read from the bits, ``f = m - 1`` (exact), and ``s = f / (2 +
    f)``, so that ``log(1 + f) = 2 atanh(s)``.  Returns (e, f, s)."""
    eb = float_bits(u) & _EXP_BITS
    e = from_bits(_exponent_field(eb) | _TWO52_BITS) - 4503599627371519.0  # 2^52 + 1023
    m = u * from_bits(_EXP_FLIP - eb)  # u / 2^e, in [1, 2), exact
    if m > _SQRT2:
        m = 0.5 * m
        e = e + 1.0
    f = m - 1.0  # exact
    return e, f, div(f, 2.0 + f)


@jit(forceinline=True)
def vlog1p(w):
    """``log1p(w)`` for a float64 ``w > -1`` (under 0.8 ulp), as vectorisable arithmetic.

    ``u = 1 + w`` is rounded and its rounding error ``c`` kept exactly (Fast2Sum, the larger
    of 1 and w first), so ``log1p(w) = log(u) + c / u`` to ~2^-106; ``u = 2^e m`` with
    ``m`` in ``[sqrt(2)/2, sqrt(2))`` read from the bits (``u >= 2^-53`` is normal), and
    ``log(m) = log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2))``, ``s = f / (2 + f)``, the form in
    which the large term ``f = m - 1`` is exact and the rest is a small correction; then
    ``e ln2`` in two parts (``e ln2_hi`` exact).  Outside ``w > -1`` (and for NaN, inf) the
    result is not meant to be used: callers select it away."""
    u = 1.0 + w
    if abs(w) <= 1.0:  # selects, not branches
        c = w - (u - 1.0)
    else:
        c = 1.0 - (u - w)
    e, f, s = _log_reduce(u)
    r = _atanh_series(s * s, 10)
    hfsq = 0.5 * f * f
    return e * _LN2_HI + (f - (hfsq - (s * (hfsq + r) + (e * _LN2_LO + div(c, u)))))


# exp(r) = sum_{j <= 7} r^j / j! on |r| <= ln2 / 2: the first term left out is below
# 0.3466^8 / 8! * e^0.3466 = 7.7e-9 of the result
_E7 = (1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5)


@jit(forceinline=True)
def vexp_rough(d):
    """``exp(d)`` for a float64 ``d <= 0``, within 1e-8 relative, for ``d >= -708`` (below it,
    ``exp(-708)``: about 3e-308, for the callers' purpose 0): :func:`vexp`'s range reduction
    with one float64 ln2 and a degree-7 Taylor polynomial, no subnormal results.  For the
    early Newton steps of :mod:`.gen`, whose values only move the iterate while f is
    certainly positive; never for a result."""
    if d < VEXP_NEG_MIN:  # selects, not branches (a NaN passes through)
        d = VEXP_NEG_MIN
    if d > 0.0:
        d = 0.0
    kd = _fmuladd(d, _INV_LN2, _SHIFT)
    kf = kd - _SHIFT
    r = _fmuladd(kf, -_LN2, d)  # |kf ln2 rounding| <= 1022 * 2^-53: 1e-13 of r's range
    e = _fmuladd(_E7[0], r, _E7[1])
    e = _fmuladd(e, r, _E7[2])
    e = _fmuladd(e, r, _E7[3])
    e = _fmuladd(e, r, _E7[4])
    e = _fmuladd(e, r, _E7[5])
    e = _fmuladd(e, r, 1.0)
    e = _fmuladd(e, r, 1.0)
    return e * _pow2(kd)


@jit(forceinline=True)
def vlog1p_rough(w):
    """``log1p(w)`` for a float64 ``-1 < w <= 0`` within ``1e-9 |log1p(w)| + 2^-53 / (1 + w)``:
    :func:`vlog1p` without the rounding correction of ``1 + w`` and with five terms of
    the series (the first left out, ``2 s^13 / 13``, is below 2.1e-11 at ``|s| <=
    0.1716``: 6e-11 of the log there).  For the early Newton steps of :mod:`.gen` (see
    :func:`vexp_rough`)."""
    e, f, s = _log_reduce(1.0 + w)
    r = _atanh_series(s * s, 5)
    hfsq = 0.5 * f * f
    return e * _LN2 + (f - (hfsq - s * (hfsq + r)))
