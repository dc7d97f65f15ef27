"""Independent oracles for alpha-normmax (mpmath, 50 digits) and budget-sparsemax (exact
rational arithmetic).  Slow; for small rows.  They share no code with the library.

The normmax oracle needs ``mpmath`` (the ``test`` and ``corpus`` extras).  The test suite
(``tests/family_oracle.py``) and the conformance corpus generator
(:mod:`entmax_ref.testing.conformance`) both use this one copy.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .oracle import DPS, mp  # one mpmath import guard (it names the extra to install)


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
