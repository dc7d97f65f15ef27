"""mpmath and rational oracles for alpha-entmax of one row (slow; for small and medium rows).

:func:`entmax_mp` solves a row to 50 digits (or ``dps``).  :func:`entmax_cr` is the
correctly rounded answer the library's float64 rows are held to, 0 ulp: exact rationals for
alpha = 2; otherwise :func:`entmax_mp` at :data:`CR_DPS` digits (or more: enough to hold
the row's differences exactly, :func:`cr_digits`) and again at 40 digits more, and each
output rounded only where the two agree (the oracle raises
where they do not): an entry whose probability shrinks with the precision sits at the
threshold (p = 0), and a value within ``10^-(CR_DPS - 10)`` of a rounding midpoint is
taken to be on it (ties to even).  It shares no code with the library's own exact path
(:mod:`entmax_ref.backends.exact_rows`).

It needs ``mpmath`` (the ``test`` and ``corpus`` extras: ``pip install "entmax-ref[corpus]"``).
The test suite (``tests/oracle.py``) and the conformance corpus generator
(:mod:`entmax_ref.testing.conformance`) both use this one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

try:
    import mpmath as mp
except ModuleNotFoundError as _exc:  # pragma: no cover - exercised only without mpmath
    raise ModuleNotFoundError(
        'the 50-digit oracle needs mpmath: pip install "entmax-ref[corpus]" (or: pip install mpmath)',
        name="mpmath") from _exc

DPS = 50

#: :func:`edge_row` spreads entries only where their gap to the edge, ``p^(alpha-1) /
#: (alpha-1)``, is at least this: a normal float64 with room for the rounding next to c.
EDGE_GAP_MIN = 1e-290


def entmax_mp(x, alpha, start: float | None = None, dps: int = DPS):
    """Exact probabilities (mpf list) of alpha-entmax(x) and the support threshold T
    (p_i = ((alpha-1)(x_i - T))_+ ** (1/(alpha-1)); T = logsumexp(x) at alpha = 1).

    alpha <= 2: safeguarded Newton on T inside the bracket [max - 1/(alpha-1), max] (where
    the mass is >= 1 and 0), at ``dps`` digits; ``start`` (a float estimate of T) only speeds
    it up.  alpha > 2: see :func:`_edge_relative` (``start`` is not used): there an edge
    probability p needs T to ~p^(alpha-1) (1e-330 for p = 5e-4 at alpha = 100), which no
    fixed number of digits of T resolves.

    The row is shifted by its maximum first (each difference of two floats to 50 digits),
    so huge offsets (1e300) cost no digits; T is returned in x's units.  ``dps`` (decimal
    digits, 50 by default) sets the working precision and the stopping rule.
    """
    with mp.workdps(dps):
        top0 = mp.mpf(float(max(float(v) for v in x if np.isfinite(v))))
        xm = [mp.mpf(float(v)) - top0 if np.isfinite(v) else None for v in x]
        xs = [v for v in xm if v is not None]
        if float(alpha) == 1.0:  # log1p of the sum without one maximum (its term is exactly 1):
            # a tiny T (a maximum near 0 far above the rest) keeps its digits
            rest = list(xs)
            rest.remove(mp.mpf(0))
            lse = mp.log1p(mp.fsum(mp.e ** v for v in rest))
            return [mp.e ** (v - lse) if v is not None else mp.mpf(0) for v in xm], lse + top0
        a1 = mp.mpf(float(alpha)) - 1
        if float(alpha) > 2.0:
            p, T = _edge_relative(xm, xs, a1, dps)
            return p, T + top0
        top = max(xs)
        lo, hi = top - 1 / a1, top

        def mass(T):
            ps = [(a1 * (v - T)) ** (1 / a1) if v > T else mp.mpf(0) for v in xs]
            return mp.fsum(ps) - 1, mp.fsum(p ** (2 - a1 - 1) for p in ps if p > 0)

        start = None if start is None else mp.mpf(float(start)) - top0
        T = start if start is not None and lo < start < hi else (lo + hi) / 2
        tol = mp.mpf(10) ** (-dps + 3)
        for _ in range(2000):
            f, df = mass(T)
            if f == 0:
                break
            if f > 0:
                lo = T
            else:
                hi = T
            step = f / df if df > 0 else None
            if step is not None and abs(step) <= tol * (1 + abs(T)):
                T = T + step  # converged: a step this small cannot leave the bracket's interior
                break
            nxt = T + step if step is not None else None
            if nxt is None or not (lo < nxt < hi):
                nxt = (lo + hi) / 2
            if abs(nxt - T) <= tol * (1 + abs(T)) or hi - lo <= tol * (1 + abs(T)):
                T = nxt
                break
            T = nxt
        else:  # pragma: no cover
            raise RuntimeError("mpmath oracle did not converge")
        return [(a1 * (v - T)) ** (1 / a1) if v is not None and v > T else mp.mpf(0) for v in xm], T + top0


def _edge_relative(xm, xs, a1, dps):
    """alpha > 2, exactly: the support from the mass at the entries themselves, then the
    edge probability q.

    With the distinct entries sorted, ``M(v) = sum_{x_i > v} (a1 (x_i - v))^(1/a1)`` is
    evaluated exactly at entry values (50 digits of an exact difference of floats); the
    smallest support entry c is the smallest entry with M(c) < 1 (bisection over the
    sorted entries, M is decreasing).  Then, with d_i = x_i - c >= 0 on the support,
    T = c - q^a1 / a1 and p_i = (a1 d_i + q^a1)^(1/a1) (= q at the edge), and
    G(q) = sum_i p_i - 1 is increasing in q with slope >= 1, G(0) = M(c) - 1 < 0 and
    G(q_b) >= 0 at q_b = (a1 (c - b))^(1/a1), b the largest excluded entry (or the
    window's end max - 1/a1): bisection on q to 50 digits (mpmath has no underflow).
    ``xm`` is the (shifted) row, None at masked entries; ``xs`` its finite entries.
    Returns (p, T) as :func:`entmax_mp`."""
    vals = sorted(set(xs), reverse=True)  # vals[0] = max
    inv = 1 / a1

    def M(v):
        return mp.fsum((a1 * (w - v)) ** inv for w in xs if w > v)

    # vals[0] is in the support (M = 0); find the last index j with M(vals[j]) < 1
    lo_i, hi_i = 0, len(vals)  # M(vals[lo_i]) < 1; hi_i: first index known to have M >= 1
    while hi_i - lo_i > 1:
        mid = (lo_i + hi_i) // 2
        if M(vals[mid]) < 1:
            lo_i = mid
        else:
            hi_i = mid
    c = vals[lo_i]
    b = vals[hi_i] if hi_i < len(vals) else vals[0] - inv
    b = max(b, vals[0] - inv)
    sup = [w - c for w in xs if w >= c]

    def G(q):
        qa = q ** a1
        return mp.fsum((a1 * d + qa) ** inv if d > 0 else q for d in sup) - 1

    qlo, qhi = mp.mpf(0), (a1 * (c - b)) ** inv
    tol = mp.mpf(10) ** (-dps + 3)
    for _ in range(2000):
        if qhi - qlo <= tol * qhi:
            break
        q = (qlo + qhi) / 2
        if G(q) < 0:
            qlo = q
        else:
            qhi = q
    else:  # pragma: no cover
        raise RuntimeError("mpmath oracle did not converge")
    q = (qlo + qhi) / 2
    qa = q ** a1
    T = c - qa / a1
    p = []
    for v in xm:
        if v is not None and v >= c:
            d = v - c
            p.append((a1 * d + qa) ** inv if d > 0 else q)
        else:
            p.append(mp.mpf(0))
    return p, T


#: the lower of the correctly rounded oracle's two working precisions, in digits
CR_DPS = 90
#: the higher: CR_DPS plus this
CR_MORE = 40

_FMT = {np.dtype(np.float64): (53, -1022, 1024), np.dtype(np.float32): (24, -126, 128)}


def _exact(v) -> Fraction:
    """An mpf (or float, int, Fraction) as an exact rational (an mpf's own bits, whatever
    the working precision)."""
    if isinstance(v, Fraction):
        return v
    if isinstance(v, (int, float)):
        return Fraction(v)
    if not isinstance(v, mp.mpf):
        v = mp.mpf(v)
    man, exp = v.man_exp  # the magnitude's (mpmath keeps the sign apart)
    q = Fraction(man) * Fraction(2) ** exp if man else Fraction(0)
    return -q if v < 0 else q


def _grid(q: Fraction, dtype):
    """(the two neighbours of ``|q|`` in ``dtype``'s grid, as Fractions, below and above;
    and whether above overflows): floor and ceiling at the last place of ``|q|``."""
    bits, emin, emax = _FMT[np.dtype(dtype)]
    q = abs(q)
    e = emin
    if q > 0:
        e = max(emin, q.numerator.bit_length() - q.denominator.bit_length() - 1)
        while Fraction(2) ** (e + 1) <= q:
            e += 1
        while e > emin and Fraction(2) ** e > q:
            e -= 1
    ulp = Fraction(2) ** (e - bits + 1)
    lo = (q // ulp) * ulp
    return lo, lo + ulp, ulp


def round_cr(v_lo, v_hi, dtype) -> float:
    """The correct rounding in ``dtype`` of a real known as ``v_lo`` (mpf at the lower
    precision) and ``v_hi`` (at the higher one; exact Fractions are their own): the two
    must round alike (else ValueError); a value within ``10^-(D - 10)`` (relative) of a
    rounding midpoint, ``D`` the digits of its precision, is that midpoint (ties to even).
    A value the lower precision takes for a midpoint and the higher one separates from it
    (10^-80 away: a threshold just off a midpoint at alpha = 10) is the higher one's (one of
    that midpoint's neighbours).  A value below 2^-1100 rounds to a zero of its sign."""
    out, near = [], []
    for v, digits in ((v_lo, CR_DPS), (v_hi, CR_DPS + CR_MORE)):
        if not isinstance(v, Fraction) and abs(v) < mp.mpf(2) ** -1100:  # rounds to 0 in both formats
            out.append(-0.0 if v < 0 else 0.0)  # (10^-(10^8) at alpha near 1: its exact rational is not formed)
            near.append(False)
            continue
        q = _exact(v)
        sign = -1 if q < 0 else 1
        lo, hi, ulp = _grid(q, dtype)
        mid = lo + ulp / 2
        dist = abs(abs(q) - mid)
        tie = dist == 0 if isinstance(v, Fraction) else dist <= abs(q) * Fraction(10) ** -(digits - 10)
        near.append(dist <= abs(q) * Fraction(10) ** -(CR_DPS - 10))
        if tie:
            r = lo if (lo / ulp) % 2 == 0 else hi
        else:
            r = lo if abs(q) < mid else hi
        bits, emin, emax = _FMT[np.dtype(dtype)]
        f = float(r) if r < Fraction(2) ** emax else np.inf
        out.append(sign * f)
    if out[0] != out[1] and not (near[0] and near[1] and np.nextafter(out[0], out[1]) == out[1]):
        raise ValueError(f"the oracle's two precisions round differently: {out[0]!r} and {out[1]!r}")
    return out[1]


@dataclass
class CrRow:
    """One row solved by a correctly rounding oracle (:func:`entmax_cr_row`,
    :func:`~entmax_ref.testing.family_oracle.normmax_cr_row`): its outputs correctly rounded,
    and the exact solution at the oracle's two precisions for the values derived from it
    (VJPs, losses)."""

    p: np.ndarray  #: in the requested dtype, each entry rounded once from the exact value
    tau: float  #: the threshold in public units (logsumexp at alpha 1) as a float64; -inf when all masked
    theta: float  #: the x-space threshold T (p_i = ((alpha-1)(x_i - T))_+^(1/(alpha-1))) as a float64
    on: np.ndarray  #: bool: the entries whose exact probability is positive, however small
    digits: tuple  #: the two working precisions (decimal digits), the lower first
    #: at each of ``digits``: (p as an mpf list, 0 outside the support; T as an mpf), or for
    #: normmax (p; x - tau as an mpf list)
    levels: tuple

    @property
    def support(self) -> int:
        return int(self.on.sum())


def entmax_cr(x, alpha, dtype=np.float64):
    """The correctly rounded alpha-entmax of the float64 row ``x`` (``-inf`` masked): ``(p``
    and ``tau`` each rounded once from the exact value in ``dtype`` (``tau`` as a float64),
    the exact support size ``)`` (module docstring; :func:`entmax_cr_row`)."""
    row = entmax_cr_row(x, alpha, dtype)
    return row.p, row.tau, row.support


def entmax_cr_row(x, alpha, dtype=np.float64) -> CrRow:
    """:func:`entmax_cr` with the x-space threshold, the support as a mask and the exact
    solution at the two working precisions (:func:`cr_digits` and :data:`CR_MORE` more)."""
    x = np.asarray(x, np.float64)
    alpha = float(alpha)
    n = len(x)
    if not np.isfinite(x).any():
        zero = ([mp.mpf(0)] * n, mp.mpf("-inf"))
        return CrRow(np.zeros(n, dtype), -np.inf, -np.inf, np.zeros(n, bool), (CR_DPS, CR_DPS + CR_MORE),
                     (zero, zero))
    digits = cr_digits(x, alpha)
    both = (digits, digits + CR_MORE)
    if alpha == 2.0:
        return _sparsemax_cr(x, dtype, both)
    levels = tuple(entmax_mp(x, alpha, dps=d) for d in both)
    (lo_p, lo_T), (hi_p, hi_T) = levels
    p = np.zeros(n, dtype)
    on = np.zeros(n, bool)
    with mp.workdps(both[1]):
        for i, (a, b) in enumerate(zip(lo_p, hi_p)):
            if b == 0 and a == 0:
                continue
            if b < a * mp.mpf(10) ** -20:  # vanishing with the precision: at the threshold
                continue
            on[i] = True
            p[i] = round_cr(a, b, dtype)
        if alpha > 2.0:
            a1 = Fraction(alpha) - 1
            tau, theta = (_edge_tau(x, alpha, lo_p, hi_p, dtype, digits, k) for k in (a1, Fraction(1)))
        else:
            theta = _vanishing_or_rounded(lo_T, hi_T, dtype)
            a1 = mp.mpf(alpha - 1)
            tau = theta if alpha == 1.0 else _vanishing_or_rounded(a1 * lo_T, a1 * hi_T, dtype)
    levels = tuple(([v if o else mp.mpf(0) for v, o in zip(ps, on)], T) for ps, T in levels)
    return CrRow(p, tau, theta, on, both, levels)


def _vanishing_or_rounded(lo, hi, dtype) -> float:
    """A threshold known at the two precisions, rounded in ``dtype``: 0 where it vanishes
    with the precision (a threshold exactly at 0), else :func:`round_cr`."""
    return 0.0 if abs(hi) < abs(lo) * mp.mpf(10) ** -20 else round_cr(lo, hi, dtype)


def _sparsemax_cr(x, dtype, digits) -> CrRow:
    """alpha = 2 in exact rationals: the support size k is the one whose threshold
    ``tau_k = (sum of the top k - 1) / k`` the k-th value exceeds and the next does not;
    the levels are the exact values at ``digits``."""
    fin = sorted((Fraction(float(v)) for v in x if np.isfinite(v)), reverse=True)
    cs = Fraction(0)
    tau = None
    for k, v in enumerate(fin, start=1):
        cs += v
        t = (cs - 1) / k
        if v > t and (k == len(fin) or fin[k] <= t):
            tau = t
            break
    exact = [Fraction(float(v)) - tau if np.isfinite(v) and Fraction(float(v)) > tau else Fraction(0) for v in x]
    p = np.array([round_cr(v, v, dtype) for v in exact], dtype)
    levels = []
    for d in digits:
        with mp.workdps(d):
            levels.append(([mp.mpf(v.numerator) / v.denominator for v in exact], mp.mpf(tau.numerator) / tau.denominator))
    t = round_cr(tau, tau, dtype)
    return CrRow(p, t, t, np.array([v > 0 for v in exact], bool), tuple(digits), tuple(levels))


def cr_digits(x, alpha: float) -> int:
    """The lower working precision of :func:`entmax_cr` for the float64 row ``x``: at least
    :data:`CR_DPS` digits, and enough to hold exactly every difference ``y = x - max x``
    within reach of the support (``y > -1/(alpha - 1) - 1``; ``y > -800`` at alpha = 1),
    so that an entry a tiny difference above the threshold (``[-0.5, -1.4e-158]`` at
    alpha = 3: ``p = 1.4e-158``) is not rounded onto it."""
    return digits_to_hold(x, 800 if alpha == 1.0 else 1.0 / (alpha - 1.0) + 1.0)


def digits_to_hold(x, reach: float) -> int:
    """At least :data:`CR_DPS` digits, and enough to hold exactly every difference
    ``y = x - max x`` of the float64 row ``x`` with ``y > -reach`` (30 to spare)."""
    fin = x[np.isfinite(x)]
    top = Fraction(float(fin.max()))
    ys = (Fraction(float(v)) - top for v in fin)
    return max([CR_DPS] + [int(y.denominator.bit_length() * 0.302) + 30 for y in ys if y > -reach])


def _edge_tau(x, alpha: float, lo_p, hi_p, dtype, digits: int, k: Fraction) -> float:
    """``k T`` rounded in ``dtype``, at alpha > 2, from the edge form ``T = c - q^a1 / a1``
    (``c`` the smallest support entry, ``q`` its probability; ``k = a1`` gives tau, 1 the
    x-space threshold): ``k c`` an exact rational and ``k q^a1 / a1`` to the oracle's
    relative precision, however small (1e-297 at alpha = 100), so that a tau just below a
    rounding midpoint ``a1 c`` rounds down (its T-form, ``a1 T``, loses ``q^a1`` below the
    digits of T)."""
    a1 = Fraction(alpha) - 1
    ref = min((i for i, b in enumerate(hi_p) if b > 0), key=lambda i: float(x[i]))
    t = k * Fraction(float(x[ref]))
    w = k / a1
    out = []
    for ps, digits in ((lo_p, digits), (hi_p, digits + CR_MORE)):
        with mp.workdps(digits + 20):
            s = ps[ref] ** (mp.mpf(a1.numerator) / a1.denominator) * w.numerator / w.denominator
            if s > abs(mp.mpf(t.numerator) / t.denominator) * mp.mpf(10) ** -(digits - 10) or t == 0:
                out.append(mp.mpf(t.numerator) / t.denominator - s)
                continue
        lo, hi, ulp = _grid(t, dtype)  # s is below the digits of t: the rounding of t - 0+
        at = abs(t)
        if at == lo:  # t on the grid: t - s rounds to t
            out.append(t)
        else:  # t - s lies on t's side of every boundary but t itself (a midpoint: the lower side)
            r = lo if (at < lo + ulp / 2 or (at == lo + ulp / 2 and t > 0)) else hi
            out.append(r if t > 0 else -r)
    if not isinstance(out[1], Fraction) and abs(out[1]) < abs(out[0]) * mp.mpf(10) ** -20:
        return 0.0  # vanishing with the precision: a threshold exactly at 0 (the maximum alone, p = 1)
    return round_cr(out[0], out[1], dtype)


def edge_row(rng, alpha: float, ties: int, deficit: float, spread: bool) -> np.ndarray:
    """A row for alpha > 2 whose support edge is ``ties`` equal entries c carrying about
    ``deficit / ties`` each, so that for small enough ``deficit`` the edge gap
    ``q^(alpha-1) / (alpha-1)`` lies below float64's range (q < ~1e-308^(1/(alpha-1))).

    An entry at distance d above the threshold has p = ((alpha-1) d)^(1/(alpha-1)), so at
    large alpha only entries ~p^(alpha-1) apart can share the mass.  The row's maximum is
    0 (so the backends' shift by the maximum is exact), with probability p_1;
    c = -p_1^(alpha-1) / (alpha-1) (the row [0, -0.009617] at alpha = 100 is this with
    p_1 = 1 - deficit); with ``spread`` (where float64 can hold it) 1-3 more entries at
    c + p_j^(alpha-1) / (alpha-1), the p_j random, within a factor 10^(-8/(alpha-1)) of
    p_1 (so that they survive the rounding next to c), summing to 1 - deficit.  Entries
    below c, inside the window and outside it, and a -inf are added; shuffled."""
    a1 = alpha - 1.0
    w = 1.0 / a1
    r = 10.0 ** (-8.0 / a1)
    p_repr = float(np.exp((np.log(EDGE_GAP_MIN) + np.log(a1)) / a1))  # p^a1 / a1 stays normal
    m = int(rng.integers(2, 5)) if spread else 1
    while m > 1 and (1.0 - deficit) * r / (m - 1 + r) < p_repr:
        m -= 1
    ps = rng.uniform(r, 1.0, m)
    ps = ps / ps.sum() * (1.0 - deficit)
    ps = -np.sort(-ps)
    c = -float(np.exp(a1 * np.log(ps[0]))) / a1
    top = np.concatenate([[0.0], c + np.exp(a1 * np.log(ps[1:])) / a1])
    below = c - rng.uniform(0.0, 2.0 * w, 4)
    x = np.concatenate([top, np.full(ties, c), below, [-np.inf]])
    return rng.permutation(x)


#: the alphas :func:`boundary_rows` builds rows for, by how their threshold can be placed:
#: rationally (2; 1.5 and 3, through dyadic probabilities) or at the float nearest it
BOUNDARY_ALPHAS = (1.0, 1.5, 2.0, 3.0, 1.0 + 1e-6, 1.0 + 2.0 ** -30, 1.25, 1.33, 1.75, 2.5, 10.0, 100.0)


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _exact_threshold_row(rng, alpha: float):
    """A row whose threshold T is a float64 that is also an entry (p = 0 there exactly),
    with entries one ulp on either side: support probabilities ``p_j`` dyadic with sum 1
    and ``x_j = T + p_j^(alpha-1) / (alpha-1)`` exact (alpha = 2: ``T + p``; 1.5: ``T + 2
    sqrt(p)`` with ``sqrt(p)`` dyadic; 3: ``T + p^2 / 2``)."""
    # T != 0: a threshold at 0 with subnormal entries one ulp from it moves by about their
    # square (10^-647), beyond this oracle's digits
    T = float(rng.choice([-2.0, -1.75, -1.5, -1.25, -1.0, -0.75, -0.5, -0.25, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]))
    if alpha == 2.0:
        p = _pick(rng, [[0.5, 0.25, 0.25], [0.5, 0.5], [0.75, 0.125, 0.125], [1.0]])
        top = [T + v for v in p]
    elif alpha == 1.5:
        v = _pick(rng, [[0.5, 0.5, 0.5, 0.5], [0.75, 0.5, 0.25, 0.25, 0.25], [1.0]])
        top = [T + 2.0 * s for s in v]
    else:  # alpha = 3
        p = _pick(rng, [[0.5, 0.5], [0.75, 0.25], [0.5, 0.25, 0.25], [1.0]])
        top = [T + v * v / 2.0 for v in p]
    edge = [T, np.nextafter(T, np.inf), np.nextafter(T, -np.inf)]
    return np.array(top + edge + list(T - rng.uniform(0.0, 2.0, 3)))


def _threshold(x, alpha: float) -> float:
    """The float64 nearest the row's support threshold T (x-space theta at alpha = 1)."""
    with mp.workdps(30):
        return float(entmax_mp(x, alpha, dps=30)[1])


def boundary_rows(rng, alpha: float, n: int = 12, offset: float = 0.0):
    """Rows built to sit on the edges of correct rounding at ``alpha``, each a float64 row
    of about ``n`` entries (or ``n`` for the long ones), ``offset`` added where it keeps the
    entries exact: a random row with entries added at the float nearest its threshold,
    one and two ulps on either side (tiny exact probabilities, or exactly 0); ties of the
    maximum and near ties one ulp apart; a row whose threshold is a float and an entry
    (alpha in {1.5, 2, 3}); the issue row of sparsemax (an entry 3.7e-17 above the
    threshold); rows with subnormal outputs; a masked entry.  Yields (name, row)."""
    x = rng.standard_normal(n) * float(rng.choice([0.3, 1.0, 3.0]))
    if alpha != 1.0:
        T = _threshold(x, alpha)
        near = [T, np.nextafter(T, np.inf), np.nextafter(T, -np.inf),
                np.nextafter(np.nextafter(T, np.inf), np.inf), np.nextafter(np.nextafter(T, -np.inf), -np.inf)]
        yield "threshold", np.concatenate([x, near])
    m = float(x.max())
    yield "ties", np.concatenate([x, [m, m, np.nextafter(m, -np.inf), np.nextafter(m, np.inf)]])
    if alpha in (1.5, 2.0, 3.0):
        yield "exact threshold", _exact_threshold_row(rng, alpha) + offset
    if alpha == 2.0:
        yield "issue row", np.array([0.0, -0.5000000000000001, -0.49999999999999994, 0.0, -0.5, -1.5]) + offset
        # p = 2^-1070 (2/3): a subnormal output
        yield "subnormal", np.array([0.5, 0.5, 2.0 ** -1070, 0.0, -3.0])
    if alpha == 1.0:
        yield "subnormal", np.concatenate([x, m - rng.uniform(700.0, 745.0, 4), [m - 2000.0]])
    if offset:
        yield "offset", np.round(x * 4.0) / 4.0 + offset
    masked = x.copy()
    masked[int(rng.integers(len(x)))] = -np.inf
    yield "masked", masked
