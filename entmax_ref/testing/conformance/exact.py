"""The oracles the corpus's expected values come from: the real-number answer of every row
operation, correctly rounded to float64.

alpha = 2 (sparsemax) and budget-sparsemax are solved exactly in rational arithmetic
(:class:`fractions.Fraction`); every other alpha by the mpmath oracle
(:func:`entmax_ref.testing.oracle.entmax_mp`) at the two precisions of :data:`DIGITS`.  A
value is written only when both precisions round it to the same float64 (Ziv's test: the
80-digit value is then the correctly rounded one); a value that the higher precision shrinks
by many orders of magnitude is an exact zero that rounding noise hid (a gradient that cancels,
the threshold of a row whose answer is rational).  The support is the real-number support:
the entries whose exact probability is positive, however small (a subnormal, or a value that
rounds to 0 in float64).  Nothing here calls the library's solvers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

#: the oracle's two precisions (decimal digits): a value is written when both round it to
#: the same float64
DIGITS = (80, 120)


class OracleError(RuntimeError):
    """The oracle could not decide a value's rounding at its precisions."""


def _mp():
    from .. import oracle

    return oracle.mp


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
    """The float64 of a real value computed at the two precisions of :data:`DIGITS` (``lo``,
    ``hi``: mpf, Fraction or float), correctly rounded: both round to the same float64; or
    the value is an exact zero (``hi`` is smaller than ``lo`` by the precisions' ratio); or it
    is exactly the midpoint of two floats (both approach it as the precision grows: a
    difference of two floats, say), rounded to the even one."""
    a, b = to_float(lo), to_float(hi)
    if a == b or (np.isnan(a) and np.isnan(b)):
        return b
    shrink = 10.0 ** -(DIGITS[1] - DIGITS[0] - 10)
    if lo == 0 or abs(hi) <= abs(lo) * shrink:
        return 0.0
    if abs(np.nextafter(a, b) - b) == 0:  # neighbours: is the value their midpoint?
        mid = (Fraction(a) + Fraction(b)) / 2
        if abs(exact_value(hi) - mid) <= abs(exact_value(lo) - mid) * shrink:
            return a if int(np.float64(a).view(np.int64)) % 2 == 0 else b
    raise OracleError(f"a value rounds differently at {DIGITS[0]} and {DIGITS[1]} digits: {a!r} vs {b!r}")


def settle_all(lo, hi) -> np.ndarray:
    """:func:`settle` of two (nested) lists of values, as a float64 array."""
    if isinstance(lo, (list, tuple)):
        return np.array([settle_all(a, b) for a, b in zip(lo, hi)], dtype=np.float64)
    return np.float64(settle(lo, hi))


def at_both(compute):
    """``compute(dps)`` (a value or nested list of values, evaluated at ``dps`` digits) at
    both precisions, settled to float64."""
    mp = _mp()
    vals = []
    for d in DIGITS:
        with mp.workdps(d):
            vals.append(compute(d))
    return settle_all(*vals)


# ----------------------------------------------------------------------------- alpha-entmax rows


def sparsemax_exact(x64: np.ndarray):
    """(p as Fractions, T as a Fraction) of sparsemax(x) exactly: sort, the support is the
    largest k with 1 + k z_k > z_1 + ... + z_k, T = (z_1 + ... + z_k - 1) / k, p = [x - T]_+."""
    z = sorted((Fraction(float(v)) for v in x64 if np.isfinite(v)), reverse=True)
    cum = Fraction(0)
    k, top = 0, Fraction(0)
    for j, v in enumerate(z, 1):
        cum += v
        if 1 + j * v > cum:
            k, top = j, cum
    T = (top - 1) / k
    return [Fraction(float(v)) - T if np.isfinite(v) and Fraction(float(v)) > T else Fraction(0) for v in x64], T


@dataclass
class RowAnswer:
    """The exact answer of one alpha-entmax row, correctly rounded."""

    p: np.ndarray  #: float64, correctly rounded
    tau: float  #: the threshold in public units (logsumexp at alpha 1), correctly rounded; -inf when all masked
    theta: float  #: the x-space threshold T (p_i = ((alpha-1)(x_i - T))_+^(1/(alpha-1))), correctly rounded
    support: int  #: entries whose exact probability is positive
    on: np.ndarray  #: bool, which entries those are
    levels: dict = field(default_factory=dict)  #: digits -> (p as mpf list, T as mpf) for derived values


class RowOracle:
    """The exact alpha-entmax of each row, memoised on (row bits, alpha)."""

    def __init__(self):
        self.cache: dict = {}

    def row(self, x64: np.ndarray, alpha: float) -> RowAnswer:
        key = (np.asarray(x64, np.float64).tobytes(), float(alpha))
        if key not in self.cache:
            self.cache[key] = self._solve(np.asarray(x64, np.float64), float(alpha))
        return self.cache[key]

    def _solve(self, x64: np.ndarray, alpha: float) -> RowAnswer:
        from .. import oracle

        mp = oracle.mp
        n = len(x64)
        if not np.isfinite(x64).any():  # all masked: p = 0, tau = -inf, support 0 (the contract)
            zero = [mp.mpf(0)] * n
            return RowAnswer(np.zeros(n), -np.inf, -np.inf, 0, np.zeros(n, bool),
                             {d: (zero, mp.mpf("-inf")) for d in DIGITS})
        a1 = alpha - 1.0
        if alpha == 2.0:
            pf, Tf = sparsemax_exact(x64)
            levels = {}
            for d in DIGITS:
                with mp.workdps(d):
                    levels[d] = ([mp.mpf(v.numerator) / v.denominator for v in pf], mp.mpf(Tf.numerator) / Tf.denominator)
            on = np.array([v > 0 for v in pf])
            return RowAnswer(np.array([float(v) for v in pf]), float(Tf), float(Tf), int(on.sum()), on, levels)
        levels, start = {}, None
        for d in DIGITS:
            p, T = oracle.entmax_mp(x64, alpha, start, dps=d)
            levels[d] = (p, T)
            start = float(T)
        (p_lo, T_lo), (p_hi, T_hi) = levels[DIGITS[0]], levels[DIGITS[1]]
        on = np.array([v > 0 for v in p_hi])
        if not np.array_equal(on, [v > 0 for v in p_lo]):
            raise OracleError(f"the support of a row at alpha {alpha!r} differs between {DIGITS} digits")
        with mp.workdps(DIGITS[1]):
            tau_lo = T_lo if alpha == 1.0 else mp.mpf(a1) * T_lo
            tau_hi = T_hi if alpha == 1.0 else mp.mpf(a1) * T_hi
        return RowAnswer(settle_all(p_lo, p_hi), settle(tau_lo, tau_hi), settle(T_lo, T_hi), int(on.sum()), on, levels)

    def derived(self, x64, alpha, compute) -> np.ndarray:
        """``compute(p, T, dps)`` (mpf values from the row's exact p and T at ``dps`` digits)
        at both precisions, settled to float64."""
        ans = self.row(x64, alpha)
        return at_both(lambda d: compute(*ans.levels[d], d))


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
    l = log p, h(w) = (e^w - 1 - w) / w^2."""
    a = mp.mpf(alpha)
    a1 = a - 1
    on = [e > 0 for e in p]
    ell = [mp.log(e) if o else mp.mpf(0) for e, o in zip(p, on)]

    def h(w):
        return (mp.expm1(w) - w) / w ** 2 if w != 0 else mp.mpf(1) / 2

    c = [-li ** 2 * h(-a1 * li) for li in ell]
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
    """The normmax (mpmath) and budget-sparsemax (exact rational) oracles, memoised per row."""

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


def normmax_vjp_exact(mp, x64, tau, p, g, alpha):
    """dx = c - p sum(c), c_i = r_i (g_i - <p, g>), r_i = gg t_i^(gg-1) / sum_j t_j^gg on
    the support, t = x - tau, gg = 1/(alpha-1) (differentiating the KKT conditions)."""
    if tau is None:
        return [mp.mpf(0)] * len(x64)
    gg = 1 / (mp.mpf(alpha) - 1)
    t = [mp.mpf(float(v)) - tau if np.isfinite(v) and mp.mpf(float(v)) > tau else None for v in x64]
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
    with mp.workdps(DIGITS[1]):
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

    def compute(d):
        sc = {idx: s_mp[idx] * scale for idx in rows}
        pm = {idx: rows[idx].levels[d][0] for idx in rows}
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

    result = {"out": at_both(compute)} if do is None else dict(zip(("out", "dq", "dk", "dv"), _settle_parts(compute)))
    p = np.zeros((B, Hq, Nq, Nk))
    for idx, ans in rows.items():
        p[idx] = ans.p
    with mp.workdps(DIGITS[1]):
        result.update(p=p, s=np.vectorize(float, otypes=[np.float64])(s_mp))
    return result


def _settle_parts(compute):
    """:func:`at_both` of a ``compute`` that returns several arrays of different shapes."""
    mp = _mp()
    vals = []
    for d in DIGITS:
        with mp.workdps(d):
            vals.append(compute(d))
    return [settle_all(lo, hi) for lo, hi in zip(*vals)]
