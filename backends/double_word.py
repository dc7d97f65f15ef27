"""Double-word arithmetic of the correctly rounded rows: the constants, tables and error
bounds that both CPU engines use, and the NumPy versions of the operations (the numba
engine's, compiled, are in :mod:`.numba.double_word`).

A double-word number is an unevaluated sum ``hi + lo`` of two float64 with ``|lo| <=
ulp(hi) / 2``: about 106 bits.  Its operations are the error-free transformations (TwoSum,
Fast2Sum, TwoProd: ``a * b = p + e`` exactly, by FMA or by Veltkamp's split and Dekker's
product) and the double-word algorithms of Joldes, Muller and Popescu ("Tight and rigorous
error bounds for basic building blocks of double-word arithmetic", ACM TOMS 2017), whose
relative error bounds, in units of ``u^2 = 2^-106``, are at most :data:`DW_ADD` (a sum),
:data:`DW_MUL` (a product) and :data:`DW_DIV` (a quotient), whichever of the FMA and the
split versions an engine runs.  NumPy has no fused multiply-add, so the NumPy TwoProd here
is Dekker's product with Veltkamp's split (valid below 2^996 in magnitude: the callers keep
their operands there); an error-free transformation has one exact answer whichever way it
is computed.

The functions below take arrays of any matching shapes, or scalars.  A double-word result
is a pair ``(hi, lo)``; an exponential is a triple ``(e, hi, lo)`` for ``2^e (hi + lo)``, so
that results below float64's normal range keep their precision until they are rounded.

The two elementary functions, each with a proven relative error bound (the derivation is in
``docs/math/solvers.md``, "Correct rounding"):
``exp_dw(z)``, :data:`EPS_EXP`
    ``z = k ln2 / 4096 + r`` with ``ln2 / 4096`` in three parts (the first two of 30 bits, so
    ``k`` times them is exact for ``|k| < 2^23``: ``|z| <= EXP_MAX``), ``|r| <= 2^-13.1``;
    ``exp(r) = 1 + r + r^2/2 + r^3 q(r)`` with ``r^2`` exact (TwoProd) and ``q`` of degree
    3 in float64 (its first omitted term, ``r^7/5040``, is below ``2^-104``); then
    ``2^(k/4096) = 2^(k >> 12) T64[(k >> 6) & 63] T4096[k & 63]``, the two tables
    double-word.  The float64 part ``r^3 q(r)`` (below ``2^-41``) carries the largest
    error, about ``2^-93``.
``log1p_dw(w)``, :data:`EPS_LOG` (relative to the result)
    ``1 + w = 2^e c_j (1 + r)`` with ``c_j = 1 + j/256`` (exact) the table point nearest,
    ``r`` formed without forming ``1 + w`` where ``|w| <= 1/4`` (``r = (w - j/256) /
    c_j``), so the result keeps its relative precision however small ``w`` is; then
    ``log(1 + r) = 2 atanh(s)``, ``s = r / (2 + r)`` (``|s| <= 2^-9.4``), as ``2s + 2s^3/3``
    in double-word and ``2s^5 (1/5 + s^2/7 + s^4/9 + s^6/11)`` in float64, plus ``log c_j``
    (a double-word table) and ``e ln2``.
"""
from __future__ import annotations

from decimal import Context, Decimal

import numpy as np

U = 2.0 ** -53  #: the unit roundoff of float64
U2 = U * U  #: its square, the scale of double-word errors

#: relative error bounds of the double-word operations, in units of U2 (Joldes, Muller and
#: Popescu 2017: DWPlusDW 3 u^2, DWTimesDW 4-7 u^2 (FMA / no FMA), DWDivFP 3 u^2,
#: DWDivDW 15 u^2; a little above each)
DW_ADD = 4.0
DW_MUL = 8.0
DW_DIV = 16.0

#: relative error bound of :func:`exp_dw` (the analysis gives about 2^-93; see the module)
EPS_EXP = 2.0 ** -90
#: relative error bound of ``exp_lean`` (the analysis gives about 2^-75.5): ``z = k ln2 /
#: 1024 + r`` (``|r| <= 2^-11.5``; ln2/1024 in three parts, the first two of 32 bits, exact
#: times ``|k| < 2^21``), ``exp(r) = (1 + r) + r^2 q(r)`` with ``q`` of degree 3 in float64
#: (the first omitted term ``r^6/720`` is below 2^-78; the float64 part, below 2^-23,
#: carries an error of about 2^-76) and ``2^(k/1024) = 2^(k >> 10) T1024[k & 1023]``, one
#: double-word table of 16 KiB
EPS_EXP_LEAN = 2.0 ** -74
#: relative error bound of :func:`log1p_dw` (the analysis gives about 2^-92)
EPS_LOG = 2.0 ** -89
#: the largest |z| that ``exp_dw`` takes (its reduction's integer stays below 2^23)
EXP_MAX = 1400.0

# The finishing stages' shared parameters (:mod:`.exact_rows`, :mod:`.numba.exact_rows`):
#: a computed bound is trusted up to this relative slack (the rounding of the bound itself)
SLACK = 1.0 + 2.0 ** -40
#: relative margin of the candidates below the solver's threshold (any margin is safe: the
#: stage checks that the refined threshold stayed within it)
CAND_MARGIN = 1e-9
#: results at or above this magnitude are rounded here (their double-word low part is normal)
NORMAL_MIN = 2.0 ** -960
#: Newton evaluations of the threshold (one from a float64 threshold is usually enough;
#: each further one runs only if a row's f still exceeds its error bound)
NEWTON_EVALS = 6

#: the shift of the rounding trick: ``(t + SHIFT) - SHIFT`` rounds |t| < 2^51 to an integer
SHIFT = 6755399441055744.0  # 1.5 * 2^52
#: Veltkamp's splitter 2^27 + 1 (Dekker's product without FMA)
SPLITTER = 134217729.0

_CTX = Context(prec=80)
_LN2 = _CTX.ln(Decimal(2))


def _split_bits(v: Decimal, bits: int) -> float:
    """``v`` rounded to a float64 with at most ``bits`` significant bits."""
    f = float(v)
    if f == 0.0:
        return 0.0
    m, e = np.frexp(f)
    scale = float(2 ** bits)
    return float(np.ldexp(np.round(m * scale) / scale, e))


def _dw(v: Decimal) -> tuple[float, float]:
    hi = float(v)
    return hi, float(_CTX.subtract(v, Decimal(hi)))


# ln2 / 4096 in three parts: two of 30 significant bits, then the rest
_L = _CTX.divide(_LN2, 4096)
LN2_4096_A = _split_bits(_L, 30)
LN2_4096_B = _split_bits(_CTX.subtract(_L, Decimal(LN2_4096_A)), 30)
LN2_4096_C = float(_CTX.subtract(_CTX.subtract(_L, Decimal(LN2_4096_A)), Decimal(LN2_4096_B)))
INV_LN2_4096 = float(_CTX.divide(4096, _LN2))
# ln2 / 1024 likewise, two parts of 32 bits (exp_lean)
_L1024 = _CTX.divide(_LN2, 1024)
LN2_1024_A = _split_bits(_L1024, 32)
LN2_1024_B = _split_bits(_CTX.subtract(_L1024, Decimal(LN2_1024_A)), 32)
LN2_1024_C = float(_CTX.subtract(_CTX.subtract(_L1024, Decimal(LN2_1024_A)), Decimal(LN2_1024_B)))
INV_LN2_1024 = float(_CTX.divide(1024, _LN2))

# ln2 in three parts for e ln2 (|e| < 2^11): 42 bits (e times it is exact), then a
# double-word rest (its product with e is formed exactly by TwoProd)
LN2_A = _split_bits(_LN2, 42)
LN2_B, LN2_C = _dw(_CTX.subtract(_LN2, Decimal(LN2_A)))


def _table(values):
    pairs = [_dw(v) for v in values]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


#: 2^(j/64) and 2^(j/4096), j = 0..63, double-word (hi, lo)
EXP_T64_HI, EXP_T64_LO = _table([_CTX.exp(_CTX.multiply(_LN2, _CTX.divide(j, 64))) for j in range(64)])
EXP_T4096_HI, EXP_T4096_LO = _table([_CTX.exp(_CTX.multiply(_LN2, _CTX.divide(j, 4096))) for j in range(64)])
#: 2^(j/1024), j = 0..1023, double-word (hi, lo)
EXP_T1024_HI, EXP_T1024_LO = _table([_CTX.exp(_CTX.multiply(_LN2, _CTX.divide(j, 1024))) for j in range(1024)])

#: the log table: c_j = 1 + j / LOG_N for j = LOG_J0 .. LOG_J1 (m in [sqrt(2)/2, sqrt(2)) and
#: w in [-1/4, 1/4] both round to such j), log(c_j) double-word at index j - LOG_J0
LOG_N = 256
LOG_J0 = -76
LOG_J1 = 107
LOG_C = np.array([1.0 + j / LOG_N for j in range(LOG_J0, LOG_J1 + 1)])
LOG_T_HI, LOG_T_LO = _table([_CTX.ln(_CTX.add(1, _CTX.divide(j, LOG_N))) for j in range(LOG_J0, LOG_J1 + 1)])

#: |w| at most this: ``log1p_dw`` reduces ``w`` itself, without forming ``1 + w``
LOG_NEAR = 0.25
SQRT2 = 1.4142135623730951
SQRT_HALF = 0.7071067811865476

#: 2/3 as a double-word, and the float64 coefficients 2/5, 2/7, 2/9, 2/11 of the atanh series
TWO_THIRDS_HI, TWO_THIRDS_LO = _dw(_CTX.divide(2, 3))
ATANH_C = (2.0 / 5.0, 2.0 / 7.0, 2.0 / 9.0, 2.0 / 11.0)
#: the coefficients 1/6, 1/24, 1/120, 1/720 of the exp polynomial's float64 part
EXP_C = (1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0)


def two_sum(a, b):
    """``a + b = s + e`` exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):
    """``a + b = s + e`` exactly, for ``|a| >= |b|`` (or a = 0) (Dekker)."""
    s = a + b
    return s, b - (s - a)


def _split(a):
    c = SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """``a * b = p + e`` exactly (Dekker's product; |a|, |b| below 2^996)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


# ----------------------------------------------------------------------------- double-word
def dw_add(ah, al, bh, bl):
    """Double-word + double-word (AccurateDWPlusDW): relative error <= 3 u^2."""
    sh, sl = two_sum(ah, bh)
    th, tl = two_sum(al, bl)
    vh, vl = fast_two_sum(sh, sl + th)
    return fast_two_sum(vh, tl + vl)


def dw_add_fp(ah, al, b):
    """Double-word + float64 (DWPlusFP): relative error <= 2 u^2."""
    sh, sl = two_sum(ah, b)
    return fast_two_sum(sh, al + sl)


def dw_mul_fp(ah, al, b):
    """Double-word times float64 (DWTimesFP1): relative error <= 1.5 u^2 + 4 u^3."""
    ch, cl1 = two_prod(ah, b)
    th, tl1 = fast_two_sum(ch, al * b)
    return fast_two_sum(th, tl1 + cl1)


def dw_mul(ah, al, bh, bl):
    """Double-word times double-word (DWTimesDW1): relative error <= 7 u^2."""
    ch, cl1 = two_prod(ah, bh)
    cl3 = cl1 + (ah * bl + al * bh)
    return fast_two_sum(ch, cl3)


def dw_div_fp(ah, al, b):
    """Double-word divided by float64 (DWDivFP3): relative error <= 3 u^2."""
    th = ah / b
    ph, pl = two_prod(th, b)
    d = ((ah - ph) - pl) + al
    return fast_two_sum(th, d / b)


def dw_div(ah, al, bh, bl):
    """Double-word divided by double-word (DWDivDW2): relative error <= 15 u^2."""
    th = ah / bh
    rh, rl = dw_mul_fp(bh, bl, th)
    d = (ah - rh) + (al - rl)
    return fast_two_sum(th, d / bh)


# ----------------------------------------------------------------------------- exp, log
def _horner(z, coeffs):
    """``c0 + z (c1 + z (c2 + ...))`` in float64, innermost first."""
    acc = coeffs[-1]
    for c in coeffs[-2::-1]:
        acc = c + z * acc
    return acc


def exp_dw(zh, zl):
    """``exp(zh + zl) = 2^e (hi + lo)`` with relative error below :data:`EPS_EXP`,
    for ``|zh| <= EXP_MAX`` (the algorithm is in the module docstring).  Returns (e, hi, lo),
    ``e`` int64; ``hi`` in [0.7, 1.5]."""
    kf = (zh * INV_LN2_4096 + SHIFT) - SHIFT
    h = zh - kf * LN2_4096_A  # exact
    rh, rl = two_sum(h, -(kf * LN2_4096_B))  # kf * B is exact
    rl = rl + (zl - kf * LN2_4096_C)
    rh, rl = fast_two_sum(rh, rl)
    qh, ql = two_prod(rh, rh)
    poly = (qh * rh) * _horner(rh, EXP_C)
    small = (0.5 * ql + rh * rl) + poly + rl
    s1, e1 = fast_two_sum(1.0, rh)
    s2, e2 = two_sum(s1, 0.5 * qh)
    eh, el = fast_two_sum(s2, (e1 + e2) + small)
    k = np.asarray(kf).astype(np.int64)
    j1 = (k >> 6) & 63
    j2 = k & 63
    th, tl = dw_mul(EXP_T64_HI[j1], EXP_T64_LO[j1], EXP_T4096_HI[j2], EXP_T4096_LO[j2])
    hi, lo = dw_mul(th, tl, eh, el)
    return k >> 12, hi, lo


def _log_table(j, rh, rl):
    """``log(c_j) + log(1 + r)`` for ``c_j = 1 + j/256`` (``j`` int64) and a small
    double-word ``r`` (``|r| <= 2^-8.5``): ``log(1 + r) = 2 atanh(s)``, ``s = r / (2 + r)``."""
    dh, dl = fast_two_sum(2.0, rh)
    sh, sl = dw_div(rh, rl, dh, dl + rl)
    s2h, s2l = dw_mul(sh, sl, sh, sl)  # s^2 and s^3 within 8 u^2: their terms are below 2^-17 of 2s
    s3h, s3l = dw_mul(s2h, s2l, sh, sl)
    th, tl = dw_mul(s3h, s3l, TWO_THIRDS_HI, TWO_THIRDS_LO)
    tail = (s3h * s2h) * _horner(s2h, ATANH_C)
    ah, al = dw_add(2.0 * sh, 2.0 * sl, th, tl + tail)
    i = j - LOG_J0
    return dw_add(LOG_T_HI[i], LOG_T_LO[i], ah, al)


def log_dw(vh, vl):
    """``log(vh + vl)`` for a positive double-word (normalised, ``vh`` normal), with
    relative error below :data:`EPS_LOG`: ``v = 2^e m``, ``m`` in [sqrt(2)/2,
    sqrt(2)), ``m = c_j (1 + r)``.  Returns (hi, lo)."""
    mf, ef = np.frexp(vh)
    m = 2.0 * mf
    e = ef - 1
    big = m > SQRT2
    m = np.where(big, 0.5 * m, m)
    e = np.where(big, e + 1, e)
    scale = np.ldexp(1.0, -e)
    j = np.rint((m - 1.0) * LOG_N).astype(np.int64)
    c = LOG_C[j - LOG_J0]
    nh, nl = two_sum(m - c, vl * scale)  # m - c is exact
    rh, rl = dw_div_fp(nh, nl, c)
    lh, ll = _log_table(j, rh, rl)
    ef = e.astype(np.float64)
    ph, pl = two_prod(ef, LN2_B)
    eh, el = fast_two_sum(ef * LN2_A, ph)  # e * LN2_A is exact
    return dw_add(eh, el + (pl + ef * LN2_C), lh, ll)


def log1p_dw(wh, wl):
    """``log(1 + wh + wl)`` for ``wh + wl > -1``, with relative error below
    :data:`EPS_LOG`.  For ``|w| <= 1/4`` the reduction starts from ``w``
    itself (``1 + w = c_j (1 + r)``, ``r = (w - j/256) / c_j``), so that a tiny ``w`` keeps
    its precision; otherwise it is :func:`log_dw` of ``1 + w``.  Returns (hi, lo)."""
    wh, wl = np.broadcast_arrays(np.asarray(wh, np.float64), np.asarray(wl, np.float64))
    near = np.abs(wh) <= LOG_NEAR
    j = np.where(near, np.rint(wh * LOG_N), 0.0).astype(np.int64)
    c = LOG_C[j - LOG_J0]
    nh, nl = two_sum(wh - (c - 1.0), wl)  # wh - j/256 is exact
    rh, rl = dw_div_fp(nh, nl, c)
    with np.errstate(invalid="ignore", divide="ignore"):
        nh_, nl_ = _log_table(j, rh, rl)
    tiny = np.abs(wh) < 2.0 ** -600  # log1p(w) = w (1 - w/2 + ...): w itself, to 2^-601
    nh_, nl_ = np.where(tiny, wh, nh_), np.where(tiny, wl, nl_)
    if near.all():
        return nh_, nl_
    vh, vl = two_sum(1.0, np.where(near, 1.0, wh))
    vh, vl = fast_two_sum(vh, vl + np.where(near, 0.0, wl))
    fh, fl = log_dw(np.where(near, 1.0, vh), np.where(near, 0.0, vl))
    return np.where(near, nh_, fh), np.where(near, nl_, fl)
