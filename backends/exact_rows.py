"""Correctly rounded float64 rows of the NumPy engine, and the exact answer of one row that
both CPU engines fall back to.

**The finishing stage** (:func:`finish`).  The engine's solvers (:mod:`.numpy_backend`)
find each row's threshold in float64; this stage turns it into the correctly rounded answer
of the real-number problem (Ziv's strategy), for every row at once:

1. the candidates: the entries with ``x - max > A0 - 1/a1 - mu`` (``A0`` the solver's
   threshold relative to the row's maximum, ``mu`` a margin of 1e-9 of the row's scale),
   gathered into a padded (rows, k) array; ``y = x - max`` exactly, as a double-word
   (TwoSum);
2. the threshold to double-word precision, with a rigorous radius: Newton steps on
   ``f(A) = sum_i e_alpha(y_i - A) - 1`` (alpha <= 2: ``A = theta - max``), or on the
   edge probability ``q`` (alpha > 2, :func:`_edge_rows`), each probability evaluated in
   double-word (:mod:`.double_word`) with a bound on its error; then, from the last
   evaluation, ``|A - A*| <= (|f| + E) / (1 - |f| - E)`` (``|f'| >= sum p`` for alpha <= 2,
   and ``>= 1`` in q for alpha > 2), ``E`` the bound on the computed f's error;
   at alpha = 1 ``A = log(sum exp(y))`` directly;
3. every candidate's membership decided against that radius, its probability rounded where
   its error interval does not hold a rounding boundary (:func:`round_dw`), ``tau``
   likewise.

A row where anything is left undecided (an entry within its error bound of a rounding
boundary or of the support's edge, a result below float64's normal range that this stage
does not round, a threshold that did not converge inside the candidates' margin) is
flagged and solved again by :func:`entmax_row`.  The numba engine runs the same stage,
compiled, one row at a time (:mod:`.numba.exact_rows`).

**The exact answer of one row** (:func:`entmax_row`), in pure Python from the exact
inputs.  Units: ``a1 = alpha - 1``, ``T`` the support threshold of the row in x's units,
so that

    p_i = (a1 (x_i - T))_+ ** (1/a1),    sum_i p_i = 1,    tau = a1 T,    theta = T + 1/a1

(at alpha = 1: ``p_i = exp(x_i - theta)``, ``tau = theta = logsumexp(x)``).

* alpha = 2 (sparsemax) and budget-sparsemax are rational: :class:`fractions.Fraction`
  arithmetic gives the support, the threshold and every output exactly, then one rounding
  (ties to even; exact midpoints included).
* any other alpha > 1: entry ``x_i`` is in the support iff ``M(x_i) < 1``, with
  ``M(v) = sum_{x_j > v} (a1 (x_j - v))^(1/a1)`` the mass the row would have at ``T = v``
  (``M`` decreases); the threshold is then enclosed by interval arithmetic (:mod:`decimal`
  with directed rounding; its ``exp`` and ``ln`` are correctly rounded, so one step outward
  bounds them) and each output is the common rounding of both ends of its interval; where
  they differ the precision is doubled (:data:`START_DIGITS`, twice that, ... up to
  :data:`MAX_DIGITS`).  ``M(v) = 1`` at a rational ``v`` (an entry exactly at the
  threshold, or ``tau`` exactly on a rounding midpoint) is decided exactly: with
  ``a1 = P/Q`` in lowest terms, ``M(v)`` is a sum of real radicals ``(b^Q)^(1/P)`` of
  positive rationals ``b``, which is rational only if every ``b`` is a ``P``-th power
  (Besicovitch 1940: real radicals of rationals that are not rational multiples of each
  other are linearly independent over the rationals) (:func:`_mass_is_one`).  An output
  ``p_i`` exactly on a rounding midpoint ``c`` is decided exactly where ``c^a1`` is
  rational (then ``T = x_i - c^a1/a1`` is rational and the same test applies) and where
  ``P = 1`` (``alpha = 1 + 1/Q``: the mass is a polynomial in ``c^(1/Q)``, whose minimal
  polynomial is known, :func:`_poly_root_is_zero`); otherwise an output that no evaluation
  to :data:`MAX_DIGITS` digits separates from a midpoint is taken to be on it (no such row
  is known).
* alpha = 1 (softmax): every output is ``exp(x_i - theta)``, transcendental unless it is
  ``1/k`` (Lindemann and Weierstrass), so the interval iteration always ends.

Everything is the real-number problem at the given float inputs: ``tau``, ``theta`` and
``p`` rounded to nearest, ties to even, ``p`` in the output dtype (float32 outputs are
rounded once, from the exact value), and the support ``{i : p_i > 0}`` of the exact values.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction

import numpy as np

from . import double_word as M
from .double_word import CAND_MARGIN, NEWTON_EVALS, NORMAL_MIN, SLACK
from .double_word import (dw_add, dw_add_fp, dw_div, dw_div_fp, dw_mul, dw_mul_fp, exp_dw, fast_two_sum, log1p_dw,
                          log_dw, two_prod, two_sum)

#: the first working precision of the interval iteration, in decimal digits (~133 bits)
START_DIGITS = 40
#: the last: an output still undecided there is taken to sit on its rounding midpoint
MAX_DIGITS = 1280
#: softmax entries further than this below the row maximum have p < 2^-1442 (rounded to 0)
#: and add less than ``exp(-SOFTMAX_FAR)`` each to the row's sum
SOFTMAX_FAR = 1000

_EXP = 999_999_999  # exponent range of the decimal contexts: no overflow or underflow
_ZERO = Decimal(0)


# ----------------------------------------------------------------------------- rounding
_FORMATS = {np.dtype(np.float64): (53, -1022, 1024), np.dtype(np.float32): (24, -126, 128)}


def round_real(q: Fraction, dtype) -> float:
    """The rational ``q`` rounded to nearest, ties to even, in ``dtype`` (float64 or
    float32), subnormals and overflow to +-inf included; returned as a Python float."""
    bits, emin, emax = _FORMATS[np.dtype(dtype)]
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    n, d = abs(q.numerator), q.denominator
    e = n.bit_length() - d.bit_length()  # 2^(e-1) < |q| < 2^(e+1)
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1  # now 2^e <= |q| < 2^(e+1)
    E = max(e, emin) - (bits - 1)  # the exponent of the last place
    num, den = (n, d << E) if E >= 0 else (n << -E, d)
    N, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and N % 2 == 1):
        N += 1
    if N.bit_length() + E > emax:
        return sign * math.inf
    return sign * math.ldexp(N, E)


def _midpoint_between(lo: Decimal, hi: Decimal, dtype):
    """The rounding boundary (a midpoint of two neighbours of ``dtype``) inside
    ``[lo, hi]`` when the two ends round differently (as a Fraction), else None."""
    a, b = round_real(Fraction(lo), dtype), round_real(Fraction(hi), dtype)
    if a == b:
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    return (Fraction(a) + Fraction(b)) / 2


# ----------------------------------------------------------------------------- intervals
class _Iv:
    """Closed intervals ``(lo, hi)`` of reals with :class:`~decimal.Decimal` ends, every
    operation rounded outward at ``prec`` digits."""

    def __init__(self, prec: int):
        self.prec = prec
        self.dn = Context(prec=prec, rounding=ROUND_FLOOR, Emin=-_EXP, Emax=_EXP)
        self.up = Context(prec=prec, rounding=ROUND_CEILING, Emin=-_EXP, Emax=_EXP)

    def of(self, q) -> tuple[Decimal, Decimal]:
        """The interval of a rational (a Fraction, an int or a float)."""
        q = Fraction(q)
        n, d = Decimal(q.numerator), Decimal(q.denominator)
        return self.dn.divide(n, d), self.up.divide(n, d)

    def add(self, a, b):
        return self.dn.add(a[0], b[0]), self.up.add(a[1], b[1])

    def sub(self, a, b):
        return self.dn.subtract(a[0], b[1]), self.up.subtract(a[1], b[0])

    def mul(self, a, c):
        """``a`` times an interval ``c`` of positive numbers."""
        lo = min(self.dn.multiply(a[0], c[0]), self.dn.multiply(a[0], c[1]))
        hi = max(self.up.multiply(a[1], c[0]), self.up.multiply(a[1], c[1]))
        return lo, hi

    def div(self, a, c):
        """``a`` divided by an interval ``c`` of positive numbers."""
        lo = min(self.dn.divide(a[0], c[0]), self.dn.divide(a[0], c[1]))
        hi = max(self.up.divide(a[1], c[0]), self.up.divide(a[1], c[1]))
        return lo, hi

    def exp(self, a):
        # decimal's exp and ln are correctly rounded (half even): one step out bounds them
        return self.dn.next_minus(self.dn.exp(a[0])), self.up.next_plus(self.up.exp(a[1]))

    def ln(self, a):
        """log of an interval of positive numbers."""
        return self.dn.next_minus(self.dn.ln(a[0])), self.up.next_plus(self.up.ln(a[1]))

    def _ipow(self, ctx, b: Decimal, k: int) -> Decimal:
        r = Decimal(1)
        while k:
            if k & 1:
                r = ctx.multiply(r, b)
            k >>= 1
            if k:
                b = ctx.multiply(b, b)
        return r

    def pow(self, b, g: Fraction, gi):
        """``b_+ ** g`` for an interval ``b`` and a rational ``g > 0`` (``gi`` its interval):
        repeated products for a small integer ``g``, ``exp(g ln b)`` otherwise."""
        lo, hi = max(b[0], _ZERO), b[1]
        if hi <= 0:
            return _ZERO, _ZERO
        if g.denominator == 1 and g.numerator <= 64:
            k = g.numerator
            return self._ipow(self.dn, lo, k), self._ipow(self.up, hi, k)
        plo = _ZERO
        if lo > 0:
            L = self.dn.next_minus(self.dn.ln(lo))
            plo = self.dn.next_minus(self.dn.exp(self.dn.multiply(L, gi[0] if L >= 0 else gi[1])))
        H = self.up.next_plus(self.up.ln(hi))
        return plo, self.up.next_plus(self.up.exp(self.up.multiply(H, gi[1] if H >= 0 else gi[0])))

    def total(self, terms):
        lo, hi = _ZERO, _ZERO
        for t in terms:
            lo = self.dn.add(lo, t[0])
            hi = self.up.add(hi, t[1])
        return lo, hi


def _precisions():
    prec = START_DIGITS
    while prec <= MAX_DIGITS:
        yield prec
        prec *= 2


# ----------------------------------------------------------------------------- exact ties
def _int_root(n: int, k: int):
    """The integer ``k``-th root of ``n >= 0`` when ``n`` is a ``k``-th power, else None."""
    if n < 2 or k == 1:
        return n
    if k >= n.bit_length():
        return None
    r = 1 << (n.bit_length() // k + 1)  # above the root: Newton's iteration comes down to its floor
    while True:
        s = ((k - 1) * r + n // r ** (k - 1)) // k
        if s >= r:
            break
        r = s
    return r if r ** k == n else None


def _rational_root(q: Fraction, k: int):
    """``q^(1/k)`` for a positive rational ``q`` that is a ``k``-th power, else None."""
    a, b = _int_root(q.numerator, k), _int_root(q.denominator, k)
    return None if a is None or b is None else Fraction(a, b)


#: the largest bit size of an exact power the tie tests form (beyond it a tie is taken)
_EXACT_BITS = 1 << 22


def _mass_is_one(bases, a1: Fraction):
    """Whether ``sum_j count_j b_j^(1/a1) = 1`` exactly, for ``bases`` a list of
    ``(b_j > 0 rational, count_j)``: with ``a1 = P/Q``, each term is the real radical
    ``(b_j^Q)^(1/P)``; their sum is rational only if every ``b_j`` is a ``P``-th power of a
    rational (the module docstring), and then it is computed exactly.  True also when the
    exact sum is too large to form (see :data:`_EXACT_BITS`): the caller asks only about
    sums within ``10^-MAX_DIGITS`` of 1."""
    P, Q = a1.numerator, a1.denominator
    total = Fraction(0)
    for b, count in bases:
        r = _rational_root(b, P)
        if r is None:
            return False
        if Q * max(r.numerator.bit_length(), r.denominator.bit_length()) > _EXACT_BITS:
            return True
        total += count * r ** Q
        if total > 1:
            return False
    return total == 1


def _poly_root_is_zero(coeffs, M: Fraction, Q: int):
    """Whether ``sum_k coeffs[k] mu^k = 0`` for ``mu = M^(1/Q)`` (``Q`` a power of two,
    ``M > 0`` rational): ``M = s^(2^f)`` with ``f`` largest, then ``mu = s^(1/D)``,
    ``D = Q / 2^f``, whose minimal polynomial ``t^D - s`` is irreducible (Capelli: ``s`` is
    not a square); the polynomial vanishes at mu iff its remainder modulo ``t^D - s`` is 0."""
    s, D = M, Q
    while D > 1:
        r = _rational_root(s, 2)
        if r is None:
            break
        s, D = r, D // 2
    rem = [Fraction(0)] * D
    for k, c in enumerate(coeffs):
        rem[k % D] += c * s ** (k // D)
    return all(c == 0 for c in rem)


# ----------------------------------------------------------------------------- softmax
def _softmax(x: np.ndarray, live: np.ndarray, dtype):
    fin = x[live]
    m = Decimal(float(fin.max()))
    xs = [Decimal(float(v)) for v in fin]
    p = np.zeros(len(x), dtype)
    for prec in _precisions():
        iv = _Iv(prec)
        far = 0
        e = []
        for v in xs:
            y = iv.sub((v, v), (m, m))
            if y[1] < -SOFTMAX_FAR:
                far += 1
                e.append(None)
            else:
                e.append(iv.exp(y))
        S = iv.total(t for t in e if t is not None)
        if far:  # each far term lies in [0, exp(-SOFTMAX_FAR)]
            S = (S[0], iv.up.add(S[1], iv.up.multiply(Decimal(far), iv.exp(iv.of(-SOFTMAX_FAR))[1])))
        th = iv.add((m, m), iv.ln(S))
        theta = round_real(Fraction(th[0]), np.float64)
        done = theta == round_real(Fraction(th[1]), np.float64)
        out = []
        for t in e:
            if t is None:
                out.append(0.0)
                continue
            q = iv.div(t, S)
            a = round_real(Fraction(q[0]), dtype)
            if a != round_real(Fraction(q[1]), dtype):
                done = False
                break
            out.append(a)
        if done:
            p[live] = out
            return p, theta, theta, len(xs)
    raise RuntimeError("softmax row undecided at the largest precision")  # pragma: no cover (Lindemann)


# ----------------------------------------------------------------------------- sparsemax
def _sparsemax(x: np.ndarray, live: np.ndarray, dtype):
    m = float(x[live].max())
    # entries at or below max - 1 have p = 0: the threshold T = tau is at least max - 1
    cand = np.flatnonzero(live & (x >= m - 1.0 - abs(m) * 1e-15))  # a superset (the test below is exact)
    vals = sorted((Fraction(float(x[i])) for i in cand), reverse=True)
    cs = Fraction(0)
    k, tau = 0, None
    for j, v in enumerate(vals, start=1):
        cs += v
        if 1 + j * v > cs:
            k, tau = j, (cs - 1) / j
    p = np.zeros(len(x), dtype)
    for i in cand:
        q = Fraction(float(x[i])) - tau
        if q > 0:
            p[i] = round_real(q, dtype)
    return p, round_real(tau, np.float64), round_real(tau + 1, np.float64), k


# ----------------------------------------------------------------------------- any other alpha
#: a non-negative value below this rounds to 0 in float64 and float32 (half the smallest
#: subnormal float64 is 2^-1075)
_ROUNDS_TO_ZERO = Decimal(2) ** -1076


def _round_iv(iv, dtype):
    """The common rounding of every value of the interval ``iv``, or None (an interval
    of tiny non-negative values, 10^-(10^6) at alpha near 1, is 0 without forming its
    exact rationals)."""
    if _ZERO <= iv[0] and iv[1] < _ROUNDS_TO_ZERO:
        return 0.0
    a = round_real(Fraction(iv[0]), dtype)
    return a if a == round_real(Fraction(iv[1]), dtype) else None


class _General:
    """alpha > 1 other than 2, one row (units of the module docstring)."""

    def __init__(self, x: np.ndarray, live: np.ndarray, alpha: float, dtype):
        self.x, self.dtype = x, np.dtype(dtype)
        self.a1 = Fraction(float(alpha)) - 1
        self.g = 1 / self.a1
        self.P, self.Q = self.a1.numerator, self.a1.denominator
        mf = float(x[live].max())
        # T >= max - 1/a1 (the maximum alone has p <= 1): entries at or below it have p = 0
        self.window = Fraction(mf) - self.g
        near = np.flatnonzero(live & (x >= mf - float(self.g) * (1 + 1e-9) - abs(mf) * 1e-15))  # a superset, in floats
        self.xq = {int(i): Fraction(float(x[i])) for i in near if Fraction(float(x[i])) > self.window}
        counts: dict = {}
        for v in self.xq.values():
            counts[v] = counts.get(v, 0) + 1
        self.vals = sorted(counts.items(), reverse=True)  # distinct values, descending, with multiplicities

    def mass_sign(self, v: Fraction) -> int:
        """The sign of ``M(v) - 1`` at a rational ``v``, exactly (module docstring)."""
        bases = [(self.a1 * (w - v), c) for w, c in self.vals if w > v]
        if self.g.denominator == 1 and self.g.numerator <= 16:  # a polynomial: exact rationals
            tot = sum(c * b ** self.g.numerator for b, c in bases)
            return (tot > 1) - (tot < 1)
        prec = START_DIGITS
        while True:
            iv = _Iv(prec)
            gi = iv.of(self.g)
            lo, hi = iv.total(iv.mul(iv.pow(iv.of(b), self.g, gi), iv.of(c)) for b, c in bases)
            if lo > 1:
                return 1
            if hi < 1:
                return -1
            if prec == 4 * START_DIGITS and _mass_is_one(bases, self.a1):
                return 0  # otherwise M(v) != 1 is proven: more digits will separate it
            prec *= 2

    def support(self, hint):
        """The index ``j`` into ``self.vals`` of the smallest support value, the largest
        value outside (or the window's end ``max - 1/a1``, where the mass is at least 1),
        and whether that is exactly the threshold (``M = 1`` there)."""
        vals = self.vals

        def inside(j):
            return self.mass_sign(vals[j][0]) < 0

        j = None
        if hint is not None:
            T0 = Fraction(hint) - self.g
            j0 = sum(1 for v, _ in vals if v > T0) - 1
            if 0 <= j0 and inside(j0) and (j0 + 1 == len(vals) or not inside(j0 + 1)):
                j = j0
        if j is None:
            lo, hi = 0, len(vals)  # vals[0] is inside (M(max) = 0 < 1); vals[hi] the first known outside
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if inside(mid):
                    lo = mid
                else:
                    hi = mid
            j = lo
        out_end = vals[j + 1][0] if j + 1 < len(vals) else self.window
        return j, out_end, self.mass_sign(out_end) == 0

    def _newton_q(self, prec: int, ds, qhi: Decimal, q) -> Decimal:
        """The edge probability q by Newton's method on ``G(q) = sum_j c_j (a1 d_j +
        q^a1)^(1/a1) - 1`` (``ds``: the support's ``d_j = x_j - x_c >= 0`` as Decimals with
        counts ``c_j``), which increases from ``G(0) < 0`` to ``G(qhi) >= 0``; bracketed,
        at ``prec`` digits (plain rounding: only the enclosure is rigorous)."""
        ctx = Context(prec=prec, Emin=-_EXP, Emax=_EXP)
        a1 = ctx.divide(Decimal(self.P), Decimal(self.Q))
        ig = self.g.numerator if self.g.denominator == 1 else None
        g = ctx.divide(Decimal(self.Q), Decimal(self.P))
        ad = [(ctx.multiply(a1, d), c) for d, c in ds]
        lo, hi = _ZERO, qhi
        if q is None or not lo < q < hi:
            q = hi
        tol = Decimal(10) ** -(prec - 16)
        for _ in range(8 * prec):
            lq = ctx.ln(q)
            s = ctx.exp(ctx.multiply(a1, lq))  # q^a1
            G = dG = _ZERO
            for b, c in ad:
                v = ctx.add(b, s)
                p = ctx.power(v, ig) if ig is not None else ctx.exp(ctx.multiply(g, ctx.ln(v)))
                G = ctx.add(G, ctx.multiply(c, p))
                # dp/dq = (q / p)^(a1 - 1)
                dG = ctx.add(dG, ctx.multiply(c, ctx.exp(ctx.multiply(a1 - 1, ctx.subtract(lq, ctx.ln(p))))))
            G = ctx.subtract(G, 1)
            if G > 0:
                hi = q
            else:
                lo = q
            step = ctx.divide(G, dG)
            nxt = ctx.subtract(q, step)
            if abs(step) <= q * tol:
                return nxt
            if not lo < nxt < hi:
                nxt = ctx.divide(ctx.add(lo, hi), 2)
            q = nxt
        return q  # pragma: no cover - bracketed Newton converges

    def enclose(self, prec: int, j: int, out_end: Fraction, start):
        """An interval of relative width about ``10^-(prec - 8)`` that holds the edge
        probability ``q`` (the probability of the smallest support value ``x_c =
        vals[j]``, above the largest value outside or the window's end ``out_end``), and
        the estimate it is centred on; (None, estimate) when the check fails."""
        xc = self.vals[self._ref(j)][0]
        ds = [(w - xc, c) for w, c in self.vals[: j + 1]]
        iv = _Iv(self._digits(prec, start))
        a1i, gi = iv.of(self.a1), iv.of(self.g)
        qmax = iv.pow(iv.of(self.a1 * (xc - out_end)), self.g, gi)[1]
        nprec = iv.prec + 20
        q = self._newton_q(nprec, [(_Iv(nprec).of(d)[0], Decimal(c)) for d, c in ds], qmax, start)
        r = iv.up.multiply(q, Decimal(10) ** -(prec - 8))
        qlo, qhi = iv.dn.subtract(q, r), iv.up.add(q, r)

        def G(t):  # G(t) + 1, an interval
            s = iv.pow((t, t), self.a1, a1i)
            return iv.total(iv.mul(iv.pow(iv.add(iv.mul(iv.of(d), a1i), s), self.g, gi), (Decimal(c), Decimal(c)))
                            for d, c in ds)

        if qlo > 0 and G(qlo)[1] < 1 and G(qhi)[0] > 1:
            return (qlo, qhi), q
        return None, q

    def _ref(self, j: int) -> int:
        """The index in ``vals`` of the reference entry whose probability q the enclosure
        solves for: the smallest support value ``vals[j]`` above alpha = 2 (where an edge
        probability needs the threshold to its own relative precision), the maximum below
        (where the edge probability can be astronomically small, 10^-(10^6) at alpha = 1 +
        1e-6, and q = p_max is at least 1/n)."""
        return j if self.a1 > 1 else 0

    def _digits(self, prec: int, q) -> int:
        """The working digits for results wanted to ``prec`` digits: q is wanted to
        ``prec`` digits of its own, so the mass, near 1, to as many more as q is below 1
        (q may be far below the row's other probabilities); and ``p = v^(1/a1)`` turns a
        relative error of ``v`` into 1/a1 times that one (alpha near 1).  Below alpha = 2
        the mass's slope in q is ``sum (p / q)^(1 - a1)``, at least ``q^(a1 - 1)``: q is then
        wanted to as many more digits as ``q^a1`` (not q) is below 1."""
        extra = 0 if q is None else max(0, math.ceil(-q.adjusted() * min(1.0, float(self.a1))))
        return prec + extra + max(0, math.ceil(math.log10(float(self.g)))) + 2

    def outputs(self, prec: int, j: int, out_end: Fraction, tie: bool, start):
        """Intervals of ``tau``, ``theta`` and a function giving each support entry's
        ``p``, at ``prec`` digits (None when the enclosure failed), and the next start."""
        iv = _Iv(self._digits(prec, start))
        a1i, gi = iv.of(self.a1), iv.of(self.g)
        if tie:  # the threshold is the rational out_end itself (bases formed exactly: the
            # entries may be huge, their differences small)
            return (iv.of(self.a1 * out_end), iv.of(out_end + self.g),
                    lambda i: iv.pow(iv.of(self.a1 * (self.xq[i] - out_end)), self.g, gi)), start
        qi, start = self.enclose(prec, j, out_end, start)
        if qi is None:
            return None, start
        xc = self.vals[self._ref(j)][0]
        s = iv.pow(qi, self.a1, a1i)  # q^a1 = a1 (x_c - T)
        tau = iv.sub(iv.of(self.a1 * xc), s)
        theta = iv.add(iv.of(xc), iv.div(iv.sub((Decimal(1), Decimal(1)), s), a1i))

        def p(i):
            d = self.xq[i] - xc
            return qi if d == 0 else iv.pow(iv.add(iv.mul(iv.of(d), a1i), s), self.g, gi)

        return (tau, theta, p), start

    def _tie_tau(self, t):
        """tau = a1 T, whose interval ``t`` still holds a rounding midpoint c: M decreases,
        so tau > c exactly when M(c / a1) > 1 (None: proven off c, look closer)."""
        c = _midpoint_between(t[0], t[1], np.float64)
        s = self.mass_sign(c / self.a1)
        return round_real(c, np.float64) if s == 0 else None

    def _tie_p(self, i: int, q, last: bool):
        """p_i, whose interval ``q`` still holds a rounding midpoint c: c itself when
        p_i = c exactly (decided as in the module docstring, or, at the ``last`` precision,
        taken where it cannot be), None otherwise (look closer)."""
        c = _midpoint_between(q[0], q[1], self.dtype)
        xi = self.xq[i]
        r = _rational_root(c, self.Q) if self.Q.bit_length() <= 20 else None
        if r is not None:  # c^a1 = r^P is rational: p_i = c iff M(x_i - c^a1 / a1) = 1
            return round_real(c, self.dtype) if self.mass_sign(xi - r ** self.P / self.a1) == 0 else None
        if self.P == 1 and self.Q <= 64:
            # p_i = c iff sum_j (a1 (x_j - x_i) + mu)^Q = 1 over the support, mu = c^(1/Q)
            mu = float(c) ** (1.0 / self.Q)
            cs = [(self.a1 * (w - xi), cnt) for w, cnt in self.vals if float(self.a1 * (w - xi)) + mu > 0]
            coeffs = [math.comb(self.Q, k) * sum(cnt * cj ** (self.Q - k) for cj, cnt in cs) for k in range(self.Q + 1)]
            coeffs[0] -= 1
            return round_real(c, self.dtype) if _poly_root_is_zero(coeffs, c, self.Q) else None
        return round_real(c, self.dtype) if last else None

    def solve(self, hint):
        j, out_end, tie = self.support(hint)
        sup_idx = [i for i, v in self.xq.items() if v >= self.vals[j][0]]
        p = np.zeros(len(self.x), self.dtype)
        todo = list(sup_idx)
        tau = theta = start = None
        if hint is not None:  # the edge probability the hint gives: Newton's first point
            b = float(self.a1) * (float(self.vals[self._ref(j)][0]) - (hint - float(self.g)))
            q0 = math.exp(math.log(b) * float(self.g)) if 0.0 < b < math.inf else 0.0
            start = Decimal(q0) if 0.0 < q0 < math.inf else None
        if tie:  # the threshold is the rational out_end itself
            tau, theta = round_real(self.a1 * out_end, np.float64), round_real(out_end + self.g, np.float64)
        prec = START_DIGITS
        while todo or tau is None:
            res, start = self.outputs(prec, j, out_end, tie, start)
            if res is None:
                prec *= 2
                continue
            tau_iv, theta_iv, p_of = res
            last = prec == MAX_DIGITS
            ties = prec == 4 * START_DIGITS or last  # exact ties decided once, early
            if tau is None:
                tau = _round_iv(tau_iv, np.float64)
                if tau is None and ties:
                    tau = self._tie_tau(tau_iv)
                if tau is not None:  # theta is internal: its nearest float64 where decided
                    theta = _round_iv(theta_iv, np.float64)
                    if theta is None:
                        theta = round_real(Fraction(theta_iv[0]), np.float64)
            left = []
            for i in todo:
                q = p_of(i)
                v = _round_iv(q, self.dtype)
                if v is None and ties:
                    v = self._tie_p(i, q, last)
                if v is None:
                    left.append(i)
                else:
                    p[i] = v
            todo = left
            prec *= 2
        return p, tau, theta, len(sup_idx)


def entmax_row(x: np.ndarray, alpha: float, dtype=np.float64, theta_hint: float | None = None):
    """alpha-entmax of one row ``x`` (1-D float64, ``-inf`` masked, no NaN/+inf), every
    output correctly rounded: returns ``(p, tau, theta, support)`` with ``p`` in ``dtype``
    (float64 or float32), ``tau`` and ``theta`` float64 (``-inf`` for a row with no finite
    entry), ``support`` the number of exactly positive ``p``.  ``theta_hint``, an estimate
    of theta, only saves work."""
    x = np.asarray(x, np.float64)
    live = np.isfinite(x)
    if not live.any():
        return np.zeros(len(x), dtype), -math.inf, -math.inf, 0
    alpha = float(alpha)
    if alpha == 1.0:
        return _softmax(x, live, dtype)
    if alpha == 2.0:
        return _sparsemax(x, live, dtype)
    return _General(x, live, alpha, dtype).solve(theta_hint)


U2 = M.U2
#: entries per block of rows the stage works on at once (its temporaries stay in cache)
CHUNK = 1 << 15


# ----------------------------------------------------------------------------- rounding
def _half_gaps(c, dtype):
    """Half the distances from ``c`` (values of ``dtype``, as float64) to its neighbours
    above and below in ``dtype``."""
    t = np.dtype(dtype).type
    c_t = c.astype(t)
    with np.errstate(over="ignore"):
        up = np.nextafter(c_t, t(np.inf)).astype(np.float64) - c
        dn = c - np.nextafter(c_t, t(-np.inf)).astype(np.float64)
    return 0.5 * up, 0.5 * dn


def round_dw(h, l, err, dtype):
    """The rounding to nearest of ``hi + lo +- err`` in ``dtype`` (float64 or float32), and
    whether it is decided: every value within ``err`` (absolute) of ``h + l`` rounds to
    it.  ``(h, l)`` normalised, ``|h| >= NORMAL_MIN`` (else not decided)."""
    c = h.astype(dtype).astype(np.float64)
    d = (h - c) + l  # h - c is exact (c is h rounded to a coarser grid)
    up, dn = _half_gaps(c, dtype)
    e = err * SLACK
    ok = (d + e < up / SLACK) & (d - e > -dn / SLACK) & (np.abs(h) >= NORMAL_MIN)
    return c.astype(dtype), ok


def round_scaled(e, h, l, err, dtype):
    """:func:`round_dw` of ``2^e (h + l)`` with absolute error ``2^e err`` (``h`` near 1),
    subnormal results of float64 included (then decided on their grid of 2^-1074)."""
    v = np.ldexp(h, e)
    normal = np.abs(v) >= NORMAL_MIN
    c, ok = round_dw(v, np.ldexp(l, e), np.ldexp(err, e), dtype)
    if normal.all():
        return c, ok
    # below the normal range of the low part: float64's grid there is 2^-1074 (scaled: 2^(-1074-e))
    c64 = np.where(normal, 0.0, v)  # ldexp rounds once, to that grid
    d = (h - np.ldexp(c64, -e)) + l
    half = np.ldexp(1.0, -1075 - e)
    sub_ok = (np.abs(d) + err * SLACK < half / SLACK)
    if np.dtype(dtype) == np.float32:  # every value this small is 0 in float32
        c64 = np.zeros_like(c64)
        sub_ok = np.abs(v) < 2.0 ** -200
    return np.where(normal, c, c64.astype(dtype)), np.where(normal, ok, sub_ok)


# ----------------------------------------------------------------------------- sums
def row_sums(h, l):
    """Per row of ``(h, l)`` (rows, k) double-words: their sum as a double-word and a bound
    on its error, by a pairwise tree of TwoSums (errors and low parts summed alongside)."""
    absum = np.abs(h).sum(axis=1) * SLACK + np.abs(l).sum(axis=1)
    levels = 0
    while h.shape[1] > 1:
        if h.shape[1] % 2:
            h = np.concatenate([h, np.zeros((len(h), 1))], axis=1)
            l = np.concatenate([l, np.zeros((len(l), 1))], axis=1)
        s, e = two_sum(h[:, 0::2], h[:, 1::2])
        h, l = s, (l[:, 0::2] + l[:, 1::2]) + e
        levels += 1
    if h.shape[1] == 0:
        z = np.zeros(len(h))
        return z, z, z
    sh, sl = fast_two_sum(h[:, 0], l[:, 0])
    return sh, sl, (levels + 2) ** 2 * U2 * absum


# ----------------------------------------------------------------------------- candidates
def _gather(x, cand):
    """The candidates of each row first (padded with the row's largest entry, masked off):
    (columns, values, valid), each (rows, k)."""
    k = int(cand.sum(axis=1).max(initial=0))
    cols = np.argsort(~cand, axis=1, kind="stable")[:, :k]
    valid = np.take_along_axis(cand, cols, axis=1)
    return cols, np.take_along_axis(x, cols, axis=1), valid


class _Rows:
    """The outputs of a group of rows, filled by the stages below."""

    def __init__(self, rows: int, n: int, dtype):
        self.p = np.zeros((rows, n), dtype)
        self.tau = np.zeros(rows)
        self.theta = np.zeros(rows)
        self.support = np.zeros(rows, np.int64)
        self.bad = np.zeros(rows, bool)


def _tau_round(th, tl, err, rows: _Rows, single=None, top=None, a1=None):
    """tau (a double-word with absolute error bound ``err``) rounded, or the row flagged.
    Rows whose ``single`` entry of value ``top`` is their whole support have ``p = 1``
    there, ``A = 0`` and ``tau = a1 top - 1`` exactly: rounded from the exact rational
    (such a tau is often a rounding midpoint, which no error bound decides)."""
    c, ok = round_dw(th, tl, err, np.float64)
    if single is not None:
        for r in np.flatnonzero(single):
            c[r] = round_real(Fraction(float(a1[r])) * Fraction(float(top[r])) - 1, np.float64)
        ok = ok | single
    rows.tau[:] = c
    rows.bad |= ~ok


# ----------------------------------------------------------------------------- alpha = 1
def _softmax_rows(x, out: _Rows):
    """alpha = 1: ``A = log(sum exp(y))``, ``p = exp(y) / sum exp(y)``."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    yh, yl = two_sum(np.where(live, x, m[:, None]), -m[:, None])
    far = ~live | ~(yh >= -M.EXP_MAX)  # a gap beyond float64's range gives NaN here: far
    yh, yl = np.where(far, 0.0, yh), np.where(far, 0.0, yl)
    e, eh, el = exp_dw(yh, yl)
    eh, el = np.where(far, 0.0, eh), np.where(far, 0.0, el)
    # the sum of the scaled terms; one below the normal range loses at most 2^-1074 (and a
    # far term is below e^-1400): the sum is at least 1
    sh, sl, serr = row_sums(np.ldexp(eh, e), np.ldexp(el, e))
    n = x.shape[1]
    serr = serr + M.EPS_EXP * sh * SLACK + n * 2.0 ** -1070
    rel_s = serr / sh * SLACK  # relative error of S
    mh, ml = dw_div(eh, el, sh[:, None], sl[:, None])
    rel_p = (M.EPS_EXP + rel_s[:, None] + M.DW_DIV * U2) * SLACK
    c, ok = round_scaled(e, mh, ml, rel_p * np.abs(mh), out.p.dtype)
    out.p[:] = np.where(live, c, 0)
    out.bad |= ~np.where(live, ok, True).all(axis=1)
    lh, ll = log_dw(sh, sl)
    th, tl = dw_add_fp(lh, ll, m)
    err = (M.EPS_LOG * np.abs(lh) + rel_s + M.DW_ADD * U2 * (np.abs(m) + np.abs(lh))) * SLACK
    _tau_round(th, tl, err, out)
    out.theta[:] = out.tau
    out.support[:] = live.sum(axis=1)


# ----------------------------------------------------------------------------- 1 < alpha <= 2
def _eval_a(yh, yl, valid, Ah, Al, a1, kind):
    """Probabilities of the candidates at ``A`` (double-word), each with a bound on its
    relative error, and what the Newton step and the support test need.  ``kind``: 2
    (sparsemax), 15 (1.5-entmax) or 0 (any other alpha in (1, 2)).  Returns (ph, pl,
    rel, u, vh, vl, dv): ``u = p / v`` (float64), ``v = 1 + a1 (y - A)`` as a double-word
    and ``dv`` a bound on its absolute error."""
    dh, dl = dw_add(yh, yl, -Ah, -Al)
    wh, wl = dw_mul_fp(dh, dl, a1)
    dw_err = (M.DW_ADD + 2.0) * U2 * np.abs(wh) * SLACK  # d's and w's roundings, on w
    vh, vl = dw_add_fp(wh, wl, 1.0)
    dv = dw_err + M.DW_ADD * U2 * np.abs(vh)
    alive = valid & ((vh > 0) | ((vh == 0) & (vl > 0)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        vpos = np.where(alive, vh, 1.0)
        if kind == 2:
            ph, pl = vh, vl
            rel = dv / vpos
        elif kind == 15:
            ph, pl = dw_mul(vh, vl, vh, vl)
            rel = 2.0 * dv / vpos * 1.01 + M.DW_MUL * U2
        else:
            w_ok = np.where(alive, wh, 0.0), np.where(alive, wl, 0.0)
            Lh, Ll = log1p_dw(*w_ok)
            zh, zl = dw_div_fp(Lh, Ll, a1)
            zh = np.maximum(zh, -M.EXP_MAX)
            e, eh, el = exp_dw(zh, zl)
            ph, pl = np.ldexp(eh, e), np.ldexp(el, e)
            dz = (dw_err / vpos + M.EPS_LOG * np.abs(Lh)) / a1 + 3.0 * U2 * np.abs(zh)
            rel = M.EPS_EXP + 1.01 * dz
        rel = rel * SLACK
        ph, pl = np.where(alive, ph, 0.0), np.where(alive, pl, 0.0)
        u = np.where(alive, ph / vpos, 0.0)
    return ph, pl, np.where(alive, rel, 0.0), u, vh, vl, dv


def _alpha_rows(x, a1, A0, out: _Rows, kind):
    """1 < alpha <= 2 (``kind`` as in :func:`_eval_a`), ``a1`` (rows,), from the solver's
    threshold ``A0`` relative to the row's maximum."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    W = 1.0 / a1
    mu = CAND_MARGIN * (1.0 + A0 + W)
    # the candidates: y = x - m > A0 - W - mu (y rounded: the margin covers it)
    with np.errstate(over="ignore", invalid="ignore"):
        cand = live & ((x - m[:, None]) > (A0 - W - mu)[:, None])
    cols, xc, valid = _gather(x, cand)
    xc = np.where(valid, xc, m[:, None])
    yh, yl = two_sum(xc, -m[:, None])
    a = a1[:, None]
    Ah, Al = A0.copy(), np.zeros_like(A0)
    n = x.shape[1]
    for it in range(NEWTON_EVALS):
        ph, pl, rel, u, vh, vl, dv = _eval_a(yh, yl, valid, Ah[:, None], Al[:, None], a, kind)
        sh, sl, serr = row_sums(ph, pl)
        Fh, Fl = dw_add_fp(sh, sl, -1.0)
        E = (serr + (rel * np.abs(ph)).sum(axis=1) * SLACK + n * 2.0 ** -1070) * SLACK
        done = np.abs(Fh) <= 4.0 * E
        if done.all() or it == NEWTON_EVALS - 1:
            break
        su = u.sum(axis=1)
        step = np.where(done | ~(su > 0), 0.0, Fh / np.where(su > 0, su, 1.0))
        Ah, Al = dw_add_fp(Ah, Al, step)
    F = (np.abs(Fh) + E) * SLACK
    RA = F / (1.0 - F) * SLACK
    # the candidates stay valid: the threshold moved less than their margin
    out.bad |= ~(np.abs(Ah - A0) + RA < 0.5 * mu) | ~(F < 0.5)
    # membership: v* = 1 + a1 (y - A*) against |v* - v| <= dv + a1 R_A
    slack = (dv + a * RA[:, None]) * SLACK
    vlow = vh - np.abs(vl) - slack
    inside = valid & (vlow > 0)
    outside = ~valid | (vh + np.abs(vl) + slack <= 0)
    decided = (inside | outside).all(axis=1)
    out.bad |= ~decided
    with np.errstate(divide="ignore", invalid="ignore"):
        relA = np.where(inside, RA[:, None] / np.where(inside, vlow, 1.0), 0.0) * 1.01
    tot = (rel + relA) * SLACK
    c, ok = round_dw(ph, pl, tot * np.abs(ph), out.p.dtype)
    single = decided & (inside.sum(axis=1) == 1)  # the maximum alone: p = 1, A = 0
    c = np.where(single[:, None], 1.0, c).astype(out.p.dtype)
    out.bad |= ~np.where(inside, ok, True).all(axis=1) & ~single
    np.put_along_axis(out.p, cols, np.where(inside, c, 0), axis=1)
    out.support[:] = inside.sum(axis=1)
    # tau = a1 (m + A) - 1; theta = m + A
    Ph, Pl = two_prod(a1, m)
    Qh, Ql = dw_mul_fp(Ah, Al, a1)
    th, tl = dw_add(Ph, Pl, Qh, Ql)
    th, tl = dw_add_fp(th, tl, -1.0)
    err = (a1 * RA + 3.0 * M.DW_ADD * U2 * (np.abs(Ph) + np.abs(Qh) + 1.0)) * SLACK
    _tau_round(th, tl, err, out, single, m, a1)
    out.theta[:] = np.where(single, m, dw_add_fp(Ah, Al, m)[0])
    out.bad |= ~(np.abs(m) < 2.0 ** 990)  # Dekker's split and the tau products stay in range


# ----------------------------------------------------------------------------- alpha > 2
def _edge_rows(x, a1, xc0, q0, out: _Rows):
    """alpha > 2 in the edge probability ``q`` of a reference entry ``x_c`` of the support
    (the solver's smallest: ``xc0``, with probability ``q0``): ``s = q^a1 = a1 (x_c -
    T)``, ``p_j = (s + a1 (x_j - x_c))^(1/a1)``, and the mass ``G(q) = sum p - 1``
    increases in q with slope at least 1 (the reference entry's own term), so that
    ``|q - q*| <= |G(q)| + E``.  Newton's steps on q from the right converge monotonically
    (G is convex)."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    W = 1.0 / a1
    cv = xc0 - m  # in y = x - m, where the candidates are chosen
    mu = CAND_MARGIN * (1.0 + np.abs(cv) + W)
    line = np.minimum(cv - np.exp(a1 * np.log(np.maximum(q0, 1e-300))) / a1, cv) - mu
    with np.errstate(over="ignore", invalid="ignore"):
        cand = live & ((x - m[:, None]) > line[:, None])
    cols, xs, valid = _gather(x, cand)
    xs = np.where(valid, xs, xc0[:, None])
    dh, dl = two_sum(xs, -xc0[:, None])
    edge = valid & (dh == 0) & (dl == 0)
    a = a1[:, None]
    adh, adl = dw_mul_fp(dh, dl, a)
    qh, ql = q0.copy(), np.zeros_like(q0)
    n = x.shape[1]
    for it in range(NEWTON_EVALS + 2):
        Lqh, Lql = log_dw(qh, ql)
        zh, zl = dw_mul_fp(Lqh, Lql, a1)
        es, s1, s2 = exp_dw(np.maximum(zh, -M.EXP_MAX), zl)
        shh, shl = np.ldexp(s1, es), np.ldexp(s2, es)  # s = q^a1 (tiny s: below 2^-1074 it is 0)
        s_err = (M.EPS_EXP + (M.EPS_LOG * np.abs(Lqh) + M.DW_MUL * U2 * np.abs(zh)) * 1.01) * np.abs(shh) + 2.0 ** -1070
        vh, vl = dw_add(adh, adl, shh[:, None], shl[:, None])
        dv = (M.DW_ADD + 2.0) * U2 * (np.abs(adh) + np.abs(vh)) + s_err[:, None]
        alive = valid & ((vh > 0) | ((vh == 0) & (vl > 0)))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            vpos = np.where(alive, vh, 1.0)
            Lh, Ll = log_dw(vpos, np.where(alive, vl, 0.0))
            gh, gl = dw_div_fp(Lh, Ll, a)
            e, eh, el = exp_dw(np.maximum(gh, -M.EXP_MAX), gl)
            ph, pl = np.ldexp(eh, e), np.ldexp(el, e)
            rel = (M.EPS_EXP + ((dv / vpos + M.EPS_LOG * np.abs(Lh)) / a + 3.0 * U2 * np.abs(gh)) * 1.01) * SLACK
            ph = np.where(edge, qh[:, None], np.where(alive, ph, 0.0))
            pl = np.where(edge, ql[:, None], np.where(alive, pl, 0.0))
            rel = np.where(edge, 0.0, np.where(alive, rel, 0.0))
            slope = np.where(alive | edge, np.exp(np.minimum((a - 1.0) * (np.log(qh)[:, None] - np.log(np.where(ph > 0, ph, 1.0))), 700.0)), 0.0)
        sh, sl, serr = row_sums(ph, pl)
        Gh, Gl = dw_add_fp(sh, sl, -1.0)
        E = (serr + (rel * np.abs(ph)).sum(axis=1) * SLACK + n * 2.0 ** -1070) * SLACK
        done = np.abs(Gh) <= 4.0 * E
        if done.all() or it == NEWTON_EVALS + 1:
            break
        gp = slope.sum(axis=1)
        step = np.where(done, 0.0, Gh / np.maximum(gp, 1.0))
        nh, nl = dw_add_fp(qh, ql, -step)
        pos = nh > 0
        qh, ql = np.where(pos, nh, 0.5 * qh), np.where(pos, nl, 0.0)
    Rq = (np.abs(Gh) + E) * SLACK
    qhi = qh + Rq
    with np.errstate(divide="ignore", over="ignore"):
        dq_s = a1 * np.exp((a1 - 1.0) * np.log(qhi)) * Rq * SLACK  # |ds| from |dq| (s' = a1 q^(a1-1))
    ds = dq_s + s_err
    out.bad |= ~(qh - Rq > 0)  # the reference entry is in the support
    # T* - m = cv - s*/a1 stays above the candidates' line
    out.bad |= ~(cv - (shh + ds) / a1 * SLACK > line + 0.5 * mu)
    slack = (dv + ds[:, None]) * SLACK
    vlow = vh - np.abs(vl) - slack
    inside = edge | (valid & (vlow > 0))
    outside = ~valid | (~edge & (vh + np.abs(vl) + slack <= 0))
    decided = (inside | outside).all(axis=1)
    out.bad |= ~decided
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # d log p / dq = q^(a1-1) / v; at the reference entry p = q
        relq = np.where(edge, Rq[:, None] / qh[:, None],
                        np.where(inside, (dq_s / a1)[:, None] / np.where(inside, vlow, 1.0), 0.0)) * 1.01
    tot = (rel + relq) * SLACK
    c, ok = round_dw(ph, pl, tot * np.abs(ph), out.p.dtype)
    single = decided & (inside.sum(axis=1) == 1)  # the reference entry alone: p = q = 1
    c = np.where(single[:, None], 1.0, c).astype(out.p.dtype)
    out.bad |= ~np.where(inside, ok, True).all(axis=1) & ~single
    np.put_along_axis(out.p, cols, np.where(inside, c, 0), axis=1)
    out.support[:] = inside.sum(axis=1)
    # tau = a1 x_c - s; theta = x_c + (1 - s) / a1
    Ph, Pl = two_prod(a1, xc0)
    th, tl = dw_add(Ph, Pl, -shh, -shl)
    err = (ds + 2.0 * M.DW_ADD * U2 * (np.abs(Ph) + np.abs(shh))) * SLACK
    _tau_round(th, tl, err, out, single, m, a1)
    out.theta[:] = np.where(single, m, xc0 + (1.0 - shh) / a1)
    out.bad |= ~(np.abs(m) < 2.0 ** 990) | ~(np.abs(xc0) < 2.0 ** 990)


def refine(x, alpha, A0, p0, dtype):
    """The correctly rounded rows of float64 ``x`` (rows, n) with a finite entry each, from
    the solver's threshold ``A0`` (relative to the row's maximum: ``theta - max x``) and
    float64 probabilities ``p0`` (alpha > 2 takes its reference entry from them): returns
    (p in ``dtype``, tau, theta, support, bad), ``bad`` the rows left to
    :func:`entmax_row`."""
    rows, n = x.shape
    res = _Rows(rows, n, dtype)
    kinds = np.where(alpha == 1.0, 1, np.where(alpha == 2.0, 2, np.where(alpha == 1.5, 15, np.where(alpha > 2.0, 3, 0))))
    step = max(1, CHUNK // max(n, 1))
    for kind, r0 in ((kind, r0) for kind in (1, 2, 15, 0, 3) for r0 in range(0, rows, step)):
        sel = r0 + np.flatnonzero(kinds[r0:r0 + step] == kind)
        if not sel.size:
            continue
        part = _Rows(len(sel), n, dtype)
        xs = x[sel]
        # overflow and NaN in rows near float64's limits are expected: such a row is flagged
        # (its maximum beyond 2^990) or its far entries are recognised as far
        with np.errstate(all="ignore"):
            if kind == 1:
                _softmax_rows(xs, part)
            elif kind == 3:
                ps = p0[sel]
                on = ps > 0
                j = np.argmin(np.where(on, xs, np.inf), axis=1)
                xc0 = xs[np.arange(len(sel)), j]
                q0 = ps[np.arange(len(sel)), j]
                _edge_rows(xs, alpha[sel] - 1.0, xc0, q0, part)
            else:
                _alpha_rows(xs, alpha[sel] - 1.0, A0[sel], part, kind)
        res.p[sel], res.tau[sel], res.theta[sel] = part.p, part.tau, part.theta
        res.support[sel], res.bad[sel] = part.support, part.bad
    return res.p, res.tau, res.theta, res.support, res.bad


def finish(x, alpha, A0, p0, dtype):
    """The correctly rounded rows (:func:`refine`, then :func:`entmax_row` for
    the rows it leaves) of float64 ``x`` (rows, n) from the solver's ``A0`` (``theta - max
    x``, -inf for a row with no finite entry) and float64 ``p0``: returns (p in ``dtype``, tau, theta, support); a row with no finite entry
    keeps p = 0, theta = tau = -inf, support 0."""

    rows, n = x.shape
    p = np.zeros((rows, n), dtype)
    tau = np.full(rows, -np.inf)
    theta = np.full(rows, -np.inf)
    support = np.zeros(rows, np.int64)
    live = np.flatnonzero(np.isfinite(A0))
    if live.size:
        pr, tr, hr, sr, bad = refine(x[live], alpha[live], A0[live], p0[live], dtype)
        bad |= alpha[live] >= 2.0 ** 52  # alpha - 1 must be exact in float64
        p[live], tau[live], theta[live], support[live] = pr, tr, hr, sr
        for i in np.flatnonzero(bad):
            r, hint = live[i], float(hr[i])
            p[r], tau[r], theta[r], support[r] = entmax_row(x[r], alpha[r], dtype, hint if np.isfinite(hint) else None)
    return p, tau, theta, support
