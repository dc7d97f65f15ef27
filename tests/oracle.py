"""A 50-digit mpmath oracle for alpha-entmax of one row (slow; for small and medium rows)."""

from __future__ import annotations

import mpmath as mp
import numpy as np

DPS = 50


def entmax_mp(x, alpha, start: float | None = None):
    """Exact probabilities (mpf list) of alpha-entmax(x) and the support threshold T
    (p_i = ((alpha-1)(x_i - T))_+ ** (1/(alpha-1)); T = logsumexp(x) at alpha = 1).

    Safeguarded Newton on T inside the bracket [max - 1/(alpha-1), max] (where the
    mass is >= 1 and 0), at 50 digits; ``start`` (a float estimate of T) only speeds it up.
    """
    with mp.workdps(DPS):
        xs = [mp.mpf(float(v)) for v in x if np.isfinite(v)]
        if float(alpha) == 1.0:
            lse = mp.log(mp.fsum(mp.e ** v for v in xs))
            return [mp.e ** (mp.mpf(float(v)) - lse) if np.isfinite(v) else mp.mpf(0) for v in x], lse
        a1 = mp.mpf(float(alpha)) - 1
        top = max(xs)
        lo, hi = top - 1 / a1, top

        def mass(T):
            ps = [(a1 * (v - T)) ** (1 / a1) if v > T else mp.mpf(0) for v in xs]
            return mp.fsum(ps) - 1, mp.fsum(p ** (2 - a1 - 1) for p in ps if p > 0)

        T = mp.mpf(start) if start is not None and lo < start < hi else (lo + hi) / 2
        tol = mp.mpf(10) ** (-DPS + 3)
        for _ in range(2000):
            f, df = mass(T)
            if f > 0:
                lo = T
            else:
                hi = T
            step = f / df if df > 0 else None
            nxt = T + step if step is not None else None
            if nxt is None or not (lo < nxt < hi):
                nxt = (lo + hi) / 2
            if abs(nxt - T) <= tol * (1 + abs(T)) or hi - lo <= tol * (1 + abs(T)):
                T = nxt
                break
            T = nxt
        else:  # pragma: no cover
            raise RuntimeError("mpmath oracle did not converge")
        return [(a1 * (mp.mpf(float(v)) - T)) ** (1 / a1) if np.isfinite(v) and v > T else mp.mpf(0)
                for v in x], T
