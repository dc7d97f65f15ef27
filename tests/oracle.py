"""A 50-digit mpmath oracle for alpha-entmax of one row (slow; for small and medium rows)."""

from __future__ import annotations

import mpmath as mp
import numpy as np

DPS = 50


def entmax_mp(x, alpha, theta0: float):
    """Exact p (as mpf list) and x-space theta of alpha-entmax(x), refined by Newton from
    the float64 estimate ``theta0`` with a sign-checked bracket, at 50 digits."""
    with mp.workdps(DPS):
        xs = [mp.mpf(float(v)) for v in x if np.isfinite(v)]
        a = mp.mpf(float(alpha))
        a1 = a - 1

        def probs(theta):
            out = []
            for v in xs:
                y = v - theta
                if a1 == 0:
                    out.append(mp.e ** y)
                else:
                    t = 1 + a1 * y
                    out.append(t ** (1 / a1) if t > 0 else mp.mpf(0))
            return out

        def f_and_df(theta):
            ps = probs(theta)
            f = mp.fsum(ps) - 1
            df = mp.fsum(pi ** (2 - a) for pi in ps if pi > 0)  # -df/dtheta
            return f, df

        theta = mp.mpf(theta0)
        for _ in range(100):
            f, df = f_and_df(theta)
            step = f / df
            theta += step
            if abs(step) < mp.mpf(10) ** (-DPS + 5):
                break
        else:  # pragma: no cover - would mean the float64 start was far off
            raise RuntimeError("mpmath Newton did not converge")
        ps = iter(probs(theta))
        full = [next(ps) if np.isfinite(v) else mp.mpf(0) for v in x]
        return full, theta
