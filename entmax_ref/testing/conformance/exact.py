"""The oracles the corpus's expected values come from: the real-number answer of every row
operation, correctly rounded to float64.

An alpha-entmax row's p, tau and support are the test oracle's
(:func:`entmax_ref.testing.oracle.entmax_cr_row`: exact rationals at alpha = 2, mpmath
otherwise at :data:`~entmax_ref.testing.oracle.CR_DPS` digits or more, enough to hold the
row's differences exactly, and 40 more); budget-sparsemax is solved exactly in rational
arithmetic.  A value derived from a row (a VJP, a loss), the ASEntmax scale and attention are
computed at the same two precisions and written only when both round them to the same float64
(Ziv's test: the lower one's value is then the correctly rounded one); a value that the higher
precision shrinks by many orders of magnitude is an exact zero that rounding noise hid (a
gradient that cancels).  The support is the real-number support: the entries whose exact
probability is positive, however small (a subnormal, or a value that rounds to 0 in float64).
Nothing here calls the library's solvers.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


class OracleError(RuntimeError):
    """The oracle could not decide a value's rounding at its precisions."""


def _mp():
    from .. import oracle

    return oracle.mp


def base_digits() -> tuple[int, int]:
    """The oracle's two precisions (decimal digits) where a row's differences need no more."""
    from .. import oracle

    return oracle.CR_DPS, oracle.CR_DPS + oracle.CR_MORE


def exact_value(v) -> Fraction | float:
    """An mpf, Fraction or float as the exact rational it is (a float for inf and nan)."""
    if isinstance(v, Fraction):
        return v
    if hasattr(v, "_mpf_"):
        sign, man, exp, _ = v._mpf_
        if not man:
            return float(v)  # 0, inf, nan
        f = Fraction(man) * Fraction(2) ** exp
        return -f if sign else f
    return Fraction(v) if np.isfinite(v) else float(v)


def to_float(v) -> float:
    """The float64 nearest to ``v`` (ties to even, subnormals included: Python's rational
    division rounds once); 0 or inf far outside float64's range, where the exact rational
    would be huge (p = t^(1/(alpha-1)) near alpha = 1 reaches 1e-1000000)."""
    if hasattr(v, "_mpf_") and v._mpf_[1]:
        sign, _, exp, bc = v._mpf_
        if exp + bc < -1100:
            return -0.0 if sign else 0.0
        if exp + bc > 1100:
            return -np.inf if sign else np.inf
    return float(exact_value(v))


def settle(lo, hi) -> float:
    """The float64 of a real value computed at the oracle's two precisions (``lo``, ``hi``:
    mpf, Fraction or float), correctly rounded: an exact zero where ``hi`` is smaller than
    ``lo`` by the precisions' ratio (a gradient that cancels); else
    :func:`~entmax_ref.testing.oracle.round_cr` (both round alike; a value within the
    precision's reach of a rounding midpoint is on it, ties to even: a difference of two
    floats, or a multiple of one, that the oracle approaches from one side at both
    precisions).  nan, and values beyond float64's range, as :func:`to_float`."""
    from ..oracle import CR_MORE, round_cr

    a, b = to_float(lo), to_float(hi)
    if not (np.isfinite(a) and np.isfinite(b)):  # nan, or beyond float64's range
        if a == b or (np.isnan(a) and np.isnan(b)):
            return b
    elif lo == 0 or abs(hi) <= abs(lo) * 10.0 ** -(CR_MORE - 10):
        return 0.0
    else:
        try:
            return round_cr(lo, hi, np.float64)
        except ValueError:
            pass
    raise OracleError(f"a value rounds differently at the oracle's two precisions: {a!r} vs {b!r}")


def settle_all(lo, hi) -> np.ndarray:
    """:func:`settle` of two (nested) lists of values, as a float64 array."""
    if isinstance(lo, (list, tuple)):
        return np.array([settle_all(a, b) for a, b in zip(lo, hi)], dtype=np.float64)
    return np.float64(settle(lo, hi))


def at_both(compute, digits=None):
    """``compute(level)`` (a value or nested list of values) evaluated at each of the two
    precisions ``digits`` (level 0 the lower; :func:`base_digits` by default), settled to
    float64."""
    return settle_all(*_at_levels(compute, digits))


def _at_levels(compute, digits=None) -> list:
    """``[compute(0), compute(1)]``, each at its precision of ``digits``."""
    mp = _mp()
    vals = []
    for level, d in enumerate(digits or base_digits()):
        with mp.workdps(d):
            vals.append(compute(level))
    return vals


# ----------------------------------------------------------------------------- alpha-entmax rows


class RowOracle:
    """The exact alpha-entmax of each row (:func:`entmax_ref.testing.oracle.entmax_cr_row`:
    p, tau, the x-space threshold theta and the support correctly rounded to float64, and the
    exact p and T at its two precisions), memoised on (row bits, alpha)."""

    def __init__(self):
        self.cache: dict = {}

    def row(self, x64: np.ndarray, alpha: float):
        from ..oracle import entmax_cr_row

        key = (np.asarray(x64, np.float64).tobytes(), float(alpha))
        if key not in self.cache:
            self.cache[key] = entmax_cr_row(np.asarray(x64, np.float64), float(alpha))
        return self.cache[key]

    def derived(self, x64, alpha, compute) -> np.ndarray:
        """``compute(p, T, dps)`` (mpf values from the row's exact p and T at ``dps`` digits)
        at the row's two precisions, settled to float64."""
        ans = self.row(x64, alpha)
        return at_both(lambda level: compute(*ans.levels[level], ans.digits[level]), ans.digits)


def _mpf_list(mp, values):
    return [mp.mpf(v) for v in values]


def vjp_exact(mp, p, g, alpha):
    """dx = u (g - <u, g> / sum u), u = p^(2 - alpha) on the support."""
    a2 = 2 - mp.mpf(alpha)
    u = [e ** a2 if e > 0 else mp.mpf(0) for e in p]
    su = mp.fsum(u)
    g = _mpf_list(mp, g)
    if su == 0:
        return [mp.mpf(0)] * len(p)
    m = mp.fdot(u, g) / su
    return [ui * (gi - m) for ui, gi in zip(u, g)]


def alpha_vjp_exact(mp, p, g, alpha):
    """dL/dalpha = sum_i g_i (p_i c_i - u_i <p, c> / sum u), c_i = -l_i^2 h(-(alpha-1) l_i),
    l = log p, h(w) = (e^w - 1 - w) / w^2, u = p^(2 - alpha).

    The sum is unchanged by c_i -> c_i + k p_i^(1-alpha) for any constant k; k =
    1/(alpha-1)^2 takes out c's exponential part, c_i = (1 - (alpha-1) l_i) / (alpha-1)^2.
    Of the two forms the one with the smaller largest |c_i| is summed: at a large alpha a tiny
    p (2e-17 at alpha 10) makes p_i c_i and u_i <p, c> / sum u about 1e133 in the first form,
    equal to every digit the oracle carries, and its O(1) difference is lost at both precisions."""
    a = mp.mpf(alpha)
    a1 = a - 1
    on = [e > 0 for e in p]
    ell = [mp.log(e) if o else mp.mpf(0) for e, o in zip(p, on)]

    def h(w):
        return (mp.expm1(w) - w) / w ** 2 if w != 0 else mp.mpf(1) / 2

    c = [-li ** 2 * h(-a1 * li) for li in ell]
    if a1 != 0:
        shifted = [(1 - a1 * li) / a1 ** 2 if o else mp.mpf(0) for li, o in zip(ell, on)]
        if max(abs(v) for v in shifted) < max(abs(v) for v in c):
            c = shifted
    u = [e ** (2 - a) if o else mp.mpf(0) for e, o in zip(p, on)]
    su = mp.fsum(u)
    if su == 0:
        return mp.mpf(0)
    m = mp.fdot(p, c) / su
    return mp.fsum(gi * (e * ci - ui * m) for gi, e, ci, ui in zip(_mpf_list(mp, g), p, c, u))


def loss_exact(mp, p, x64, target, alpha):
    """The Fenchel-Young loss Omega(q) - Omega(p) + <p - q, x> for the one-hot q of
    ``target``, on the max-shifted scores."""
    a = mp.mpf(alpha)

    def omega(ps):
        if a == 1:
            return mp.fsum(pi * mp.log(pi) for pi in ps if pi > 0)
        return (mp.fsum(pi ** a for pi in ps if pi > 0) - 1) / (a * (a - 1))

    q = [mp.mpf(1) if i == target else mp.mpf(0) for i in range(len(p))]
    top = mp.mpf(float(np.max(x64)))
    lin = mp.fsum((e - qi) * (mp.mpf(float(v)) - top) for e, qi, v in zip(p, q, x64) if e != qi)
    return omega(q) - omega(p) + lin


# ----------------------------------------------------------------------------- normmax, budget-sparsemax


class FamilyOracle:
    """The normmax (correctly rounding) and budget-sparsemax (exact rational) oracles,
    memoised per row."""

    def __init__(self):
        from .. import family_oracle

        self.fo = family_oracle
        self.cache: dict = {}

    def budget(self, x64, budget):
        key = ("b", x64.tobytes(), budget)
        if key not in self.cache:
            self.cache[key] = self.fo.budget_exact(x64, budget)
        return self.cache[key]


def normmax_vjp_exact(mp, t, p, g, alpha):
    """dx = c - p sum(c), c_i = r_i (g_i - <p, g>), r_i = gg t_i^(gg-1) / sum_j t_j^gg on
    the support, t = x - tau (None outside the support), gg = 1/(alpha-1) (differentiating
    the KKT conditions)."""
    if all(ti is None for ti in t):
        return [mp.mpf(0)] * len(t)
    gg = 1 / (mp.mpf(alpha) - 1)
    S = mp.fsum(ti ** gg for ti in t if ti is not None)
    r = [gg * ti ** (gg - 1) / S if ti is not None else mp.mpf(0) for ti in t]
    g = _mpf_list(mp, g)
    m = mp.fdot(p, g)
    c = [ri * (gi - m) for ri, gi in zip(r, g)]
    sc = mp.fsum(c)
    return [ci - e * sc for ci, e in zip(c, p)]


# ----------------------------------------------------------------------------- attention


def visible(B: int, Nq: int, Nk: int, kw: dict) -> np.ndarray:
    """(B, Nq, Nk) bool: the keys each query sees (causal bottom-right, key lengths, key mask)."""
    from entmax_ref.backends import geometry

    i_abs = np.arange(Nq)[:, None] + geometry.key_offset(Nq, Nk)
    keep = geometry.attendable_keys(Nk, np.ones((B, Nk), bool) if kw.get("key_padding_mask") is None
                                    else kw["key_padding_mask"], kw.get("key_lengths"))
    return geometry.sees(i_abs, np.arange(Nk)[None, :], bool(kw.get("causal")))[None] & keep[:, None, :]


def attention_exact(oracle: RowOracle, q, k, v, kw: dict, alpha, do=None) -> dict:
    """The exact entmax attention of a dense problem, correctly rounded.

    ``q`` (B, Hq, Nq, D), ``k`` (B, Hkv, Nk, D), ``v`` (B, Hkv, Nk, Dv) and ``do`` (the
    upstream gradient, or None) are float64 arrays of the case's values; ``kw`` holds
    ``scale``, ``causal``, ``key_lengths``, ``key_padding_mask``, ``alibi_slopes`` and the
    ASEntmax ``beta``, ``gamma``, ``delta``, ``offset``; ``alpha`` is a number or one per query
    head.  The row scale s_i = delta + beta log(n_i + offset)^gamma and the score
    z_ij = s_i scale (q_i . k_j) - slope |i + Nk - Nq - j| are exact, then rounded to float64;
    p_i is the exact alpha-entmax of those scores (:class:`RowOracle`); ``out`` = P V, and
    with ``do`` the gradients dq, dk, dv (dZ = J(p)^T (dO V^T) row by row, dq = c dZ K,
    dk = (c dZ)^T Q, dv = P^T dO, c = s scale; grouped query heads sum into their key/value
    head), exact sums of the exact terms, correctly rounded.  Returns those arrays and ``p``,
    ``s`` (float64, for the tolerance model)."""
    mp = _mp()
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    alphas = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (Hq,))
    seen = visible(B, Nq, Nk, kw)
    n = seen.sum(axis=-1)
    scale = float(kw["scale"])
    slopes = kw.get("alibi_slopes")
    dist = np.abs(np.arange(Nq)[:, None] + Nk - Nq - np.arange(Nk)[None, :])
    shape = (B, Hq, Nq)
    with mp.workdps(base_digits()[1]):
        if kw.get("beta") is None:
            s_mp = np.full(shape, mp.mpf(1), dtype=object)
        else:
            beta, gamma, delta = (np.broadcast_to(np.asarray(kw.get(k_, 1.0), np.float64), shape)
                                  for k_ in ("beta", "gamma", "delta"))
            off = mp.mpf(float(kw.get("offset", 1.0)))
            s_mp = np.empty(shape, dtype=object)
            for idx in np.ndindex(shape):
                m = int(n[idx[0], idx[2]])
                s_mp[idx] = (mp.mpf(delta[idx]) + mp.mpf(beta[idx]) * mp.log(m + off) ** mp.mpf(gamma[idx])
                             if m else mp.mpf(1))
        z = np.full((B, Hq, Nq, Nk), -np.inf)
        for b, h, i in np.ndindex(shape):
            for j in np.flatnonzero(seen[b, i]):
                zz = s_mp[b, h, i] * scale * mp.fdot(q[b, h, i], k[b, h // rep, j])
                if slopes is not None:
                    zz -= mp.mpf(float(slopes[h])) * int(dist[i, j])
                z[b, h, i, j] = to_float(zz)
    rows = {idx: oracle.row(z[idx], float(alphas[idx[1]])) for idx in np.ndindex(shape) if seen[idx[0], idx[2]].any()}
    # the precisions every row's exact p holds at
    digits = tuple(max([b] + [r.digits[level] for r in rows.values()]) for level, b in enumerate(base_digits()))

    def compute(level):
        sc = {idx: s_mp[idx] * scale for idx in rows}
        pm = {idx: rows[idx].levels[level][0] for idx in rows}
        zero = mp.mpf(0)
        out = [[[[mp.fdot(pm[b, h, i], v[b, h // rep, :, e]) if (b, h, i) in pm else zero
                  for e in range(v.shape[3])] for i in range(Nq)] for h in range(Hq)] for b in range(B)]
        if do is None:
            return out
        dz = {idx: vjp_exact(mp, pm[idx], [mp.fdot(do[idx], v[idx[0], idx[1] // rep, j]) for j in range(Nk)],
                             alphas[idx[1]]) for idx in rows}
        dq = [[[[sc[b, h, i] * mp.fdot(dz[b, h, i], k[b, h // rep, :, e]) if (b, h, i) in dz else zero
                 for e in range(D)] for i in range(Nq)] for h in range(Hq)] for b in range(B)]
        dk = [[None] * Hkv for _ in range(B)]
        dv = [[None] * Hkv for _ in range(B)]
        for b, g in np.ndindex(B, Hkv):
            group = [(b, h, i) for h in range(g * rep, (g + 1) * rep) for i in range(Nq) if (b, h, i) in rows]
            qcol = [[q[r][e] for r in group] for e in range(D)]
            docol = [[do[r][e] for r in group] for e in range(do.shape[3])]
            w = [[sc[r] * dz[r][j] for r in group] for j in range(Nk)]
            pj = [[pm[r][j] for r in group] for j in range(Nk)]
            dk[b][g] = [[mp.fdot(w[j], col) for col in qcol] for j in range(Nk)]
            dv[b][g] = [[mp.fdot(pj[j], col) for col in docol] for j in range(Nk)]
        return [out, dq, dk, dv]

    if do is None:
        result = {"out": at_both(compute, digits)}
    else:  # several arrays of different shapes, each settled
        result = dict(zip(("out", "dq", "dk", "dv"), (settle_all(lo, hi) for lo, hi in zip(*_at_levels(compute, digits)))))
    p = np.zeros((B, Hq, Nq, Nk))
    for idx, ans in rows.items():
        p[idx] = ans.p
    with mp.workdps(base_digits()[1]):
        result.update(p=p, s=np.vectorize(float, otypes=[np.float64])(s_mp))
    return result
