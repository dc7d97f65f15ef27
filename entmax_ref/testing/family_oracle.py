"""Independent oracles for alpha-normmax (mpmath, 50 digits) and budget-sparsemax (exact
rational arithmetic).  Slow; for small rows.  They share no code with the library.

The normmax oracle needs ``mpmath`` (the ``test`` and ``corpus`` extras).  The test suite
(``tests/family_oracle.py``) and the conformance corpus generator
(:mod:`entmax_ref.testing.conformance`) both use this one copy.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .oracle import CR_DPS, CR_MORE, DPS, CrRow, digits_to_hold, mp, round_cr  # one mpmath import guard (it names the extra to install)


def normmax_mp(x, alpha):
    """(p as mpf list, tau as mpf or None for an all -inf row) of alpha-normmax(x).

    KKT: p_i = N [x_i - tau]_+^(1/(alpha-1)) with sum_i [x_i - tau]_+^beta = 1,
    beta = alpha/(alpha-1).  The support size K is the number of sorted entries s_j with
    sum_{i<j} (s_i - s_j)^beta < 1 (at 50 digits); tau - max x is then bisected to 1e-45 on
    the support's interval, where the mass is continuous and decreasing.
    """
    with mp.workdps(DPS):
        fin = [mp.mpf(float(v)) for v in x if np.isfinite(v)]
        if not fin:
            return [mp.mpf(0)] * len(x), None
        # work on x - max x (exact at 50 digits for float64 inputs of similar magnitude), so
        # that tau's interval [max x - 1, max x] is resolved at rows with huge offsets
        top = max(fin)
        xm = [mp.mpf(float(v)) - top if np.isfinite(v) else None for v in x]
        a = mp.mpf(float(alpha))
        beta = a / (a - 1)
        s = sorted((v - top for v in fin), reverse=True)
        K = sum(1 for j in range(len(s)) if mp.fsum((s[i] - s[j]) ** beta for i in range(j)) < 1)
        lo = max(s[K] if K < len(s) else -mp.inf, s[0] - 1)
        hi = s[K - 1]

        def f(t):
            return mp.fsum((s[i] - t) ** beta for i in range(K)) - 1

        for _ in range(400):
            mid = (lo + hi) / 2
            if f(mid) > 0:
                lo = mid
            else:
                hi = mid
            if hi - lo < mp.mpf(10) ** (-DPS + 5):
                break
        tau = (lo + hi) / 2
        g = 1 / (a - 1)
        w = [(v - tau) ** g if v is not None and v > tau else mp.mpf(0) for v in xm]
        S = mp.fsum(w)
        return [wi / S for wi in w], tau + top


def _normmax_solve(x, alpha, dps: int):
    """(p as mpf list, T, the row's maximum as mpf) of alpha-normmax(x) at ``dps`` digits,
    ``T = tau - max x`` the root of ``f(T) = sum_i [y_i - T]_+^beta - 1`` (``y = x - max x``,
    each rounded once from its exact value): the support size by a binary search over the
    sorted ``y`` (the mass ``sum_{i<j} (s_i - s_j)^beta`` grows with ``j``), then bisection
    on the support's interval, then Newton kept inside the bracket (one step past a step
    below ``10^-(dps/2 + 10)``)."""
    with mp.workdps(dps):
        topf = max(float(v) for v in x if np.isfinite(v))
        y = [None if not np.isfinite(v) else Fraction(float(v)) - Fraction(topf) for v in x]
        y = [None if v is None else mp.mpf(v.numerator) / v.denominator for v in y]
        a = mp.mpf(float(alpha))
        beta, g = a / (a - 1), 1 / (a - 1)
        s = sorted((v for v in y if v is not None), reverse=True)

        def mass(j, t):
            return mp.fsum((s[i] - t) ** beta for i in range(j))

        lo, hi = 0, len(s) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if mass(mid, s[mid]) < 1 else (lo, mid - 1)
        K = lo + 1
        a_, b_ = max(s[K] if K < len(s) else -mp.inf, s[0] - 1), s[K - 1]
        T = (a_ + b_) / 2
        last = False
        for i in range(400):
            F = mass(K, T) - 1
            if F > 0:
                a_ = T
            else:
                b_ = T
            if i < 60:
                T = (a_ + b_) / 2
                continue
            step = F / (beta * mp.fsum((s[j] - T) ** (beta - 1) for j in range(K)))
            nxt = min(max(T + step, a_), b_)  # a root at an end of the bracket: T goes there
            move, T = abs(nxt - T), nxt
            if last:
                break
            # quadratic convergence: one step after a step of half the digits is at full precision
            last = move < mp.mpf(10) ** -(dps // 2 + 10)
        w = [(v - T) ** g if v is not None and v > T else mp.mpf(0) for v in y]
        S = mp.fsum(w)
        return [wi / S for wi in w], T, mp.mpf(topf), [None if v is None else v - T for v in y]


#: the most digits :func:`normmax_cr` takes for a tau that cancels (a tau exactly 0 ends there)
_TAU_DIGITS = 1440


def normmax_cr(x, alpha, dtype=np.float64):
    """The correctly rounded alpha-normmax of the float64 row ``x`` (``-inf`` masked): ``(p``
    rounded once from the exact value in ``dtype``, ``tau`` rounded to nearest float64, the
    exact support size ``)``.  The row is solved at two precisions
    (:data:`~entmax_ref.testing.oracle.CR_DPS` and 40 more digits), each value rounded by
    :func:`~entmax_ref.testing.oracle.round_cr` (which raises where the two round
    differently); an entry whose ``x_i - tau`` vanishes with the precision is at the
    threshold (``p = 0``, outside the support).  The precisions grow with the digits of the
    candidates ``x - max x`` (each held exactly).  Where ``tau = max x + T`` cancels below
    the working precision, the row is solved again with four times the digits (up to
    :data:`_TAU_DIGITS`); a ``tau`` that vanishes with the precision there is 0."""
    row = normmax_cr_row(x, alpha, dtype)
    return row.p, row.tau, row.support


def normmax_cr_row(x, alpha, dtype=np.float64) -> CrRow:
    """:func:`normmax_cr` with the support as a mask (entries whose exact probability is
    positive, however small) and the exact solution at the two working precisions for the
    values derived from it: p (0 outside the support) and ``t = x - tau`` (held in the
    max-shifted units, exact however large the offset; None outside the support).  ``theta``
    is ``tau`` (normmax's threshold is in x's units)."""
    x = np.asarray(x, np.float64)
    n = len(x)
    if not np.isfinite(x).any():
        zero = ([mp.mpf(0)] * n, [None] * n)
        return CrRow(np.zeros(n, dtype), -np.inf, -np.inf, np.zeros(n, bool), (CR_DPS, CR_DPS + CR_MORE),
                     (zero, zero))
    digits = digits_to_hold(x, 1.0)  # every candidate y = x - max x (|y| < 1) held exactly
    while True:
        lo_p, lo_T, top, lo_t = _normmax_solve(x, alpha, digits)
        hi_p, hi_T, _, hi_t = _normmax_solve(x, alpha, digits + CR_MORE)
        with mp.workdps(digits + CR_MORE):
            small = abs(top + hi_T) < mp.mpf(10) ** -(digits - 20)
        if not small or digits >= _TAU_DIGITS:
            break
        digits *= 4  # tau = max + T cancels: more digits, or a tau exactly 0
    p = np.zeros(len(x), dtype)
    on = np.zeros(len(x), bool)
    with mp.workdps(digits):
        t_lo = top + lo_T
    with mp.workdps(digits + CR_MORE):
        for i, (a, b) in enumerate(zip(lo_t, hi_t)):
            if a is None or b <= 0 or abs(b) < abs(a) * mp.mpf(10) ** -20:
                continue
            on[i] = True
            p[i] = round_cr(lo_p[i], hi_p[i], dtype)
        t_hi = top + hi_T
        tau = 0.0 if abs(t_hi) < abs(t_lo) * mp.mpf(10) ** -20 else round_cr(t_lo, t_hi, np.float64)
    levels = tuple(([v if o else mp.mpf(0) for v, o in zip(ps, on)], [v if o else None for v, o in zip(ts, on)])
                   for ps, ts in ((lo_p, lo_t), (hi_p, hi_t)))
    return CrRow(p, tau, tau, on, (digits, digits + CR_MORE), levels)


def normmax_edge_rows(rng, alpha: float, n: int = 12, offset: float = 0.0):
    """Rows built to sit on the edges of normmax's correct rounding at ``alpha``, about
    ``n`` entries each, ``offset`` added where it keeps the entries exact: a random row with
    entries added at the float nearest its threshold ``tau`` and one and two ulps on either
    side (tiny exact probabilities, or exactly 0); ties and near ties of the maximum; the
    maximum alone (``tau = max - 1``, an entry there and an ulp either side); ``k`` equal
    maxima whose threshold ``-k^(-1/beta)`` is a float and an entry (alpha in {1.5, 2,
    3}), with entries one ulp either side; a masked entry.  Yields (name, row)."""
    x = rng.standard_normal(n) * float(rng.choice([0.3, 1.0, 3.0]))
    with mp.workdps(30):
        _, T, top, _ = _normmax_solve(x, alpha, 30)
        t = float(top + T)
    up, dn = np.nextafter(t, np.inf), np.nextafter(t, -np.inf)
    yield "threshold", np.concatenate([x, [t, up, dn, np.nextafter(up, np.inf), np.nextafter(dn, -np.inf)]])
    m = float(x.max())
    yield "ties", np.concatenate([x, [m, m, np.nextafter(m, -np.inf), np.nextafter(m, np.inf)]])
    yield "top alone", np.array([0.0, -1.0, np.nextafter(-1.0, 0.0), np.nextafter(-1.0, -2.0), -3.0]) + offset
    k = {2.0: 4, 1.5: 8, 3.0: 8}.get(float(alpha))
    if k:
        edge = -float(k ** (-(alpha - 1) / alpha))  # -k^(-1/beta): -1/2, -1/2, -1/4
        yield "exact threshold", np.array([0.0] * k + [edge, np.nextafter(edge, 0.0), np.nextafter(edge, -1.0),
                                                      edge - 0.5]) + offset
    if offset:
        yield "offset", np.round(x * 4.0) / 4.0 + offset
    masked = x.copy()
    masked[int(rng.integers(len(x)))] = -np.inf
    yield "masked", masked


def _rows_np(solve, x, prm):
    """Rows of a 2-D array through ``solve(row, prm) -> (p, tau or None)``: (p float64,
    tau float64, -inf where ``solve`` gives None)."""
    x = np.atleast_2d(np.asarray(x, np.float64))
    ps, taus = [], []
    for row, a in zip(x, np.broadcast_to(prm, len(x))):
        p, t = solve(row, a)
        ps.append([float(v) for v in p])
        taus.append(-np.inf if t is None else float(t))
    return np.array(ps), np.array(taus)


def normmax_np(x, alpha):
    """Rows of a 2-D array through :func:`normmax_mp`: (p float64, tau float64)."""
    return _rows_np(normmax_mp, x, alpha)


def budget_exact(x, budget):
    """(p as Fractions, tau as a Fraction, or None when every unmasked entry is 1) of the
    projection of x onto {0 <= p <= 1, sum p = budget}, exactly.

    h(t) = sum clip(x_i - t, 0, 1) is linear between consecutive breakpoints (x_i and
    x_i - 1); the smallest t with h(t) = budget is found by trying every piece, highest first.
    """
    xs = [Fraction(float(v)) for v in x if np.isfinite(v)]
    B = Fraction(float(budget))
    if len(xs) <= B:
        return [Fraction(1) if np.isfinite(v) else Fraction(0) for v in x], None

    def h(t):
        return sum(min(max(v - t, Fraction(0)), Fraction(1)) for v in xs)

    brk = sorted(set(xs) | {v - 1 for v in xs}, reverse=True)
    tau = None
    for hi, lo in zip(brk, brk[1:]):
        if h(lo) > B >= h(hi):
            U = [v for v in xs if v - 1 >= hi]
            F = [v for v in xs if v >= hi and v - 1 <= lo]
            tau = (len(U) + sum(F) - B) / len(F)
            break
    assert tau is not None
    return [min(max(Fraction(float(v)) - tau, Fraction(0)), Fraction(1)) if np.isfinite(v) else Fraction(0)
            for v in x], tau


def budget_np(x, budget):
    """Rows of a 2-D array through :func:`budget_exact`: (p float64, tau float64)."""
    return _rows_np(budget_exact, x, budget)
