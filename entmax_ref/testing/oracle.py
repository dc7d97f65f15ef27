"""A 50-digit mpmath oracle for alpha-entmax of one row (slow; for small and medium rows).

It needs ``mpmath`` (the ``test`` and ``corpus`` extras: ``pip install "entmax-ref[corpus]"``).
The test suite (``tests/oracle.py``) and the conformance corpus generator
(:mod:`entmax_ref.testing.conformance`) both use this one copy.
"""

from __future__ import annotations

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
        if float(alpha) == 1.0:
            lse = mp.log(mp.fsum(mp.e ** v for v in xs))
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
