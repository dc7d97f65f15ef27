"""The exact answer of one row, correctly rounded: the slow path both CPU engines fall back
to where their double-word finishing stage (:mod:`.exact_rows`, :mod:`.numba.exact_rows`)
leaves a row undecided.  It runs in pure Python, from the exact inputs.  Units: ``a1 =
alpha - 1``, ``T`` the support threshold of the row in x's units, so that

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
  other are linearly independent over the rationals) (:func:`mass_is_one`).  An output
  ``p_i`` exactly on a rounding midpoint ``c`` is decided exactly where ``c^a1`` is
  rational (then ``T = x_i - c^a1/a1`` is rational and the same test applies) and where
  ``P = 1`` (``alpha = 1 + 1/Q``: the mass is a polynomial in ``c^(1/Q)``, whose minimal
  polynomial is known, :func:`_poly_root_is_zero`); otherwise an output that no evaluation
  to :data:`MAX_DIGITS` digits separates from a midpoint is taken to be on it (no such row
  is known).
* alpha = 1 (softmax): every output is ``exp(x_i - theta)``, transcendental unless it is
  ``1/k`` (Lindemann and Weierstrass), so the interval iteration always ends.

Everything is the real-number problem at the given float inputs: ``tau``, ``theta`` and
``p`` rounded to nearest, ties to even, ``p`` and ``tau`` in the output dtype (float32
outputs are rounded once, from the exact value; ``theta`` is float64), and the support ``{i : p_i > 0}`` of the exact values.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction

import numpy as np

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
class Iv:
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


def precisions():
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


def mass_is_one(bases, a1: Fraction):
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
    for prec in precisions():
        iv = Iv(prec)
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
        tau = round_real(Fraction(th[0]), dtype)
        done = theta == round_real(Fraction(th[1]), np.float64) and tau == round_real(Fraction(th[1]), dtype)
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
            return p, tau, theta, len(xs)
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
    return p, round_real(tau, dtype), round_real(tau + 1, np.float64), k


# ----------------------------------------------------------------------------- any other alpha
#: a non-negative value below this rounds to 0 in float64 and float32 (half the smallest
#: subnormal float64 is 2^-1075)
_ROUNDS_TO_ZERO = Decimal(2) ** -1076


def round_iv(iv, dtype):
    """The common rounding of every value of the interval ``iv``, or None (an end of
    magnitude below 2^-1076, such as 10^-(10^8) at alpha near 1 on either side of 0, rounds
    to 0 without forming its exact rational, whose digits would not fit in memory)."""
    a, b = (0.0 if abs(v) < _ROUNDS_TO_ZERO else round_real(Fraction(v), dtype) for v in iv)
    return a if a == b else None


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
        self._signs: dict = {}  # mass_sign's answers

    def mass_sign(self, v: Fraction) -> int:
        """The sign of ``M(v) - 1`` at a rational ``v``, exactly (module docstring), once per
        ``v`` (the support's search and its tie test may ask twice)."""
        if v not in self._signs:
            self._signs[v] = self._mass_sign(v)
        return self._signs[v]

    def _mass_sign(self, v: Fraction) -> int:
        bases = [(self.a1 * (w - v), c) for w, c in self.vals if w > v]
        if self.g.denominator == 1 and self.g.numerator <= 16:  # a polynomial: exact rationals
            tot = sum(c * b ** self.g.numerator for b, c in bases)
            return (tot > 1) - (tot < 1)
        prec = START_DIGITS
        while True:
            iv = Iv(prec)
            gi = iv.of(self.g)
            lo, hi = iv.total(iv.mul(iv.pow(iv.of(b), self.g, gi), iv.of(c)) for b, c in bases)
            if lo > 1:
                return 1
            if hi < 1:
                return -1
            if prec == 4 * START_DIGITS and mass_is_one(bases, self.a1):
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
        q^a1)_+^(1/a1) - 1`` (``ds``: the support's ``d_j = x_j - x_c`` as Decimals with
        counts ``c_j``, ``x_c`` the reference entry of :meth:`_ref`), which increases from ``G(0) < 0`` to ``G(qhi) >= 0``; bracketed,
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
            s = ctx.exp(ctx.multiply(a1, ctx.ln(q)))  # q^a1
            G = dG = _ZERO
            for b, c in ad:
                v = ctx.add(b, s)
                if v <= 0:  # below the threshold at this q (a reference entry above the edge)
                    continue
                p = ctx.power(v, ig) if ig is not None else ctx.exp(ctx.multiply(g, ctx.ln(v)))
                G = ctx.add(G, ctx.multiply(c, p))
                dG = ctx.add(dG, ctx.multiply(c, ctx.divide(p, v)))
            # dp/dq = (q / p)^(a1 - 1) = q^(a1 - 1) p / v (p = v^(1/a1)): one division a
            # term, no logarithm or exponential
            dG = ctx.multiply(dG, ctx.divide(s, q))
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
        iv = Iv(self._digits(prec, start))
        a1i, gi = iv.of(self.a1), iv.of(self.g)
        qmax = iv.pow(iv.of(self.a1 * (xc - out_end)), self.g, gi)[1]
        nprec = iv.prec + 20
        q = self._newton_q(nprec, [(Iv(nprec).of(d)[0], Decimal(c)) for d, c in ds], qmax, start)
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
        iv = Iv(self._digits(prec, start))
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
        c = _midpoint_between(t[0], t[1], self.dtype)
        s = self.mass_sign(c / self.a1)
        return round_real(c, self.dtype) if s == 0 else None

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
            tau, theta = round_real(self.a1 * out_end, self.dtype), round_real(out_end + self.g, np.float64)
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
                tau = round_iv(tau_iv, self.dtype)
                if tau is None and ties:
                    tau = self._tie_tau(tau_iv)
                if tau is not None:  # theta is internal: its nearest float64 where decided
                    theta = round_iv(theta_iv, np.float64)
                    if theta is None:
                        theta = round_real(Fraction(theta_iv[0]), np.float64)
            left = []
            for i in todo:
                q = p_of(i)
                v = round_iv(q, self.dtype)
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
    (float64 or float32), ``tau`` rounded in ``dtype`` (as a Python float), ``theta``
    float64 (both ``-inf`` for a row with no finite entry), ``support`` the number of exactly positive ``p``.  ``theta_hint``, an estimate
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
