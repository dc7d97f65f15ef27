"""The exact side of the corpus: the 50-digit mpmath oracle of each row operation (memoised
per row) and the exact normmax and budget-sparsemax oracles, that the written expected values
are measured against (``oracle_err``)."""

from __future__ import annotations

import numpy as np

from .sources import Context


class RowOracle:
    """The 50-digit oracle, memoised on (row, alpha)."""

    def __init__(self):
        from .. import oracle

        self.mp = oracle.mp
        self.entmax_mp = oracle.entmax_mp
        self.cache: dict = {}
        self.calls = 0

    def row(self, x64: np.ndarray, alpha: float, tau: float):
        key = (x64.tobytes(), alpha)
        if key not in self.cache:
            self.calls += 1
            if not np.isfinite(x64).any():  # all masked: p = 0, tau = -inf (the contract)
                self.cache[key] = ([self.mp.mpf(0)] * len(x64), self.mp.mpf("-inf"))
                return self.cache[key]
            start = tau / (alpha - 1.0) if alpha != 1.0 and np.isfinite(tau) else None
            p, T_ = self.entmax_mp(x64, alpha, start)
            with self.mp.workdps(50):
                tau_mp = T_ if alpha == 1.0 else (self.mp.mpf(alpha) - 1) * T_
            self.cache[key] = (p, tau_mp)
        return self.cache[key]


def mp_err(mp, got, exact) -> float:
    with mp.workdps(50):
        return float(max((abs(mp.mpf(float(g)) - e) for g, e in zip(got, exact)), default=mp.mpf(0)))




def vjp_mp(mp, exact, g, a):
    with mp.workdps(50):
        a2 = 2 - mp.mpf(a)
        u = [e ** a2 if e > 0 else mp.mpf(0) for e in exact]
        su = mp.fsum(u)
        if su == 0:
            return [mp.mpf(0)] * len(exact)
        m = mp.fsum(ui * mp.mpf(float(gi)) for ui, gi in zip(u, g)) / su
        return [ui * (mp.mpf(float(gi)) - m) for ui, gi in zip(u, g)]



def alpha_vjp_mp(mp, exact, g, a):
    with mp.workdps(50):
        a = mp.mpf(a)
        a1 = a - 1
        on = [e > 0 for e in exact]
        ell = [mp.log(e) if o else mp.mpf(0) for e, o in zip(exact, on)]

        def h(w):
            return (mp.expm1(w) - w) / w ** 2 if w != 0 else mp.mpf(1) / 2

        c = [-li ** 2 * h(-a1 * li) for li in ell]
        u = [e ** (2 - a) if o else mp.mpf(0) for e, o in zip(exact, on)]
        su = mp.fsum(u)
        if su == 0:
            return mp.mpf(0)
        m = mp.fsum(e * ci for e, ci in zip(exact, c)) / su
        return mp.fsum(mp.mpf(float(gi)) * (e * ci - ui * m) for gi, e, ci, ui in zip(g, exact, c, u))



def loss_mp(mp, exact, x64, target, a):
    with mp.workdps(50):
        a = mp.mpf(a)

        def omega(ps):
            if a == 1:
                return mp.fsum(pi * mp.log(pi) for pi in ps if pi > 0)
            return (mp.fsum(pi ** a for pi in ps if pi > 0) - 1) / (a * (a - 1))

        q = [mp.mpf(1) if i == target else mp.mpf(0) for i in range(len(exact))]
        top = mp.mpf(float(x64.max()))
        lin = mp.fsum((e - qi) * (mp.mpf(float(v)) - top) for e, qi, v in zip(exact, q, x64) if e != qi)
        return omega(q) - omega(exact) + lin



class FamilyOracle:
    """The normmax (50 digits) and budget (exact rational) oracles, memoised per row."""

    def __init__(self):
        from .. import family_oracle

        self.fo = family_oracle
        self.cache: dict = {}

    def normmax(self, x64, alpha):
        key = ("n", x64.tobytes(), alpha)
        if key not in self.cache:
            self.cache[key] = self.fo.normmax_mp(x64, alpha)
        return self.cache[key]

    def budget(self, x64, budget):
        key = ("b", x64.tobytes(), budget)
        if key not in self.cache:
            self.cache[key] = self.fo.budget_exact(x64, budget)
        return self.cache[key]


def family_oracle(ctx: Context) -> FamilyOracle:
    if "family_oracle" not in ctx.stats:
        ctx.stats["family_oracle"] = FamilyOracle()
    return ctx.stats["family_oracle"]



def normmax_vjp_mp(mp, x64, tau_mp, exact, g, alpha):
    """dx = c - p sum(c), c_i = r_i (g_i - <p, g>), r_i = gg t_i^(gg-1) / sum_j t_j^gg on
    the support, t = x - tau, gg = 1/(alpha-1) (differentiating the KKT conditions)."""
    with mp.workdps(50):
        if tau_mp is None:
            return [mp.mpf(0)] * len(x64)
        gg = 1 / (mp.mpf(alpha) - 1)
        t = [mp.mpf(float(v)) - tau_mp if np.isfinite(v) and mp.mpf(float(v)) > tau_mp else None for v in x64]
        S = mp.fsum(ti ** gg for ti in t if ti is not None)
        r = [gg * ti ** (gg - 1) / S if ti is not None else mp.mpf(0) for ti in t]
        m = mp.fsum(e * mp.mpf(float(gi)) for e, gi in zip(exact, g))
        c = [ri * (mp.mpf(float(gi)) - m) for ri, gi in zip(r, g)]
        sc = mp.fsum(c)
        return [ci - e * sc for ci, e in zip(c, exact)]

