"""Correctly rounded row sums, dot products and powers: the float64 pieces that make the row
VJPs give the same bits on every CPU engine (the numba twin: :mod:`.numba.exact_sums`).

A sum taken in a different order rounds differently, so a vectorised NumPy pass and a
sequential numba loop disagree in the last bits unless both return the one value that does
not depend on the order: the real-number sum rounded to nearest (ties to even).  Every
function here returns that value (or a flag saying it could not decide it, where the caller
takes the exact fallback of this module):

:func:`dot_rows`
    per row, ``sum_i a_i b_i`` correctly rounded (``sum_i a_i`` when ``b`` is None).  Each
    product is formed exactly (TwoProd: ``a_i b_i = p_i + e_i``), the ``p_i`` are added
    by TwoSum (here in a pairwise tree) and the TwoSum errors and the ``e_i`` in float64.
    Whatever the order, the double-word result is within :func:`sum_bound` of the exact
    sum: n products give at most ``2n + 1`` float64 error terms (the ``e_i`` and the TwoSum
    errors), each at most ``u`` times a partial sum of ``|p|``, and their float64 sum adds
    a relative error of ``gamma_2n``: at most ``2 n (n + 1) u^2 sum |p_i|``; summing in up
    to ``n / 2`` independent lanes first (the numba kernels) adds ``3n / 2`` more terms,
    below ``6 (n + 1)^2 u^2 sum |p_i|``; the bound is ``8 (n + 2)^2 u^2 sum |p_i|``.  The
    result is rounded where every value within the bound
    rounds the same (:func:`.exact_rows.round_dw`); a row where that fails, whose sum is
    below ``NORMAL_MIN`` (but not exactly 0), or whose products are not exact in both
    engines' TwoProd (a product below ``NORMAL_MIN``: its error underflows; an operand
    from ``2^995``: Dekker's split overflows) is summed exactly (:func:`exact_dot`).
:func:`matmul_rows`
    ``a @ b``, each entry correctly rounded by the same algorithm, its terms taken a
    block of inner indices at a time over the whole block into sum states
    (:func:`add_products`, which may run over several products, then
    :func:`round_products`): the float64
    attention's scores ``q . k``, outputs ``sum_j p_ij v_j`` and gradient sums.
:func:`pow_rows`
    ``p^a`` correctly rounded for positive normal ``p`` (the Jacobian weights ``u =
    p^(2 - alpha)``, ``0 < 2 - alpha < 1``): ``exp(a log p)`` with the double-word log and
    exponential of :mod:`.double_word` (relative error at most ``EPS_EXP + 1.01 |z|
    (EPS_LOG + DW_MUL u^2)``, ``z = a log p``), rounded where that error cannot cross a
    rounding boundary; the other entries (and subnormal ``p``) by :func:`exact_pow`.

The two engines need not decide the same rows: each returns the correctly rounded value,
fast or exact, so the bits agree either way.
"""

from __future__ import annotations

from decimal import Context, Decimal
from fractions import Fraction

import numpy as np

from .double_word import DW_MUL, EPS_EXP, EPS_LOG, NORMAL_MIN, SLACK, U2, dw_mul_fp, exp_dw, log_dw, two_prod, two_sum
from .exact_fallback import round_real
from .exact_rows import round_dw, round_scaled

#: operands from here on are not split by Dekker's product (the NumPy TwoProd) without overflow
SPLIT_MAX = 2.0 ** 995
#: the smallest normal float64 (``log_dw`` takes normal arguments)
TINY = 2.0 ** -1022
#: exp(z) is +inf (it rounds to it) for every z above this
EXP_OVER = 709.79


def sum_bound(n, absum):
    """The bound on the error of a double-word sum of ``n`` exact products (or ``n``
    float64 terms) in any order, given the float64 sum ``absum`` of their ``|p_i|``."""
    return 8.0 * (n + 2.0) ** 2 * U2 * absum * SLACK


def dot_rows(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Per row of the (rows, n) float64 arrays, ``sum_i a_i b_i`` (``sum_i a_i`` when
    ``b`` is None), correctly rounded to float64; an exact 0 is +0."""
    rows, n = a.shape
    with np.errstate(all="ignore"):
        if b is None:
            p, e = a, np.zeros_like(a)
            unsafe = np.zeros(rows, bool)
        else:
            p, e = two_prod(a, b)
            unsafe = (((p != 0.0) & (np.abs(p) < NORMAL_MIN)) | (np.abs(a) >= SPLIT_MAX)
                      | (np.abs(b) >= SPLIT_MAX)).any(axis=1)
        absum = np.abs(p).sum(axis=1)
        width = 1 << max(n - 1, 0).bit_length()
        h = np.zeros((rows, width))
        h[:, :n] = p
        c = e.sum(axis=1)
        while h.shape[1] > 1:
            h, q = two_sum(h[:, 0::2], h[:, 1::2])
            c = c + q.sum(axis=1)
        hi, lo = two_sum(h[:, 0], c)
        v, ok = round_dw(hi, lo, sum_bound(n, absum), np.float64)
    v = np.where(absum == 0.0, 0.0, v)
    ok = (ok | (absum == 0.0)) & ~unsafe & np.isfinite(absum)
    for r in np.flatnonzero(~ok):
        v[r] = exact_dot(a[r], None if b is None else b[r])
    return v


#: the fields of a product sum state (:func:`product_state`): the TwoSum chain ``s``, the
#: float64 sum ``c`` of the errors, the terms' magnitudes ``A``, ``X`` > 0 where an addition
#: into ``c`` rounded, ``U`` > 0 where a term is not exact in the engine's TwoProd
STATE_FIELDS = 5


def product_state(m: int, k: int) -> np.ndarray:
    """Empty sum states of ``(m, k)`` sums of products, shape (m, 5, k): field ``f`` of the
    sums of row ``r`` is ``st[r, f]`` (:func:`add_products`)."""
    return np.zeros((m, STATE_FIELDS, k))


#: how many terms (rows x inner indices x columns) one step of :func:`add_products` takes
#: at most: small products go in a few NumPy calls, large ones one inner index at a time
BLOCK_TERMS = 1 << 14


def add_products(st: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Add the exact terms ``a_ri b_ic`` of ``a @ b`` (float64 (m, n) and (n, k)) to the
    sum states ``st`` ((m, 5, k), :func:`product_state`), in place.  A term whose ``a_ri``
    is 0 is left out, whatever ``b_ic`` holds (the attention's probabilities: a value off
    the support, even a NaN, does not reach the sum).  The terms go in blocks of inner
    indices (at most :data:`BLOCK_TERMS` terms a block): a block's exact products are summed
    by a pairwise TwoSum tree into ``s``, its TwoSum and product errors by another into
    ``c``; an error of that second tree or of the addition into ``c`` marks ``X``.  That
    is a double-word sum in one of the orders :func:`sum_bound` allows, so the rounded
    sums do not depend on the blocks (nor on the order of the compiled
    :func:`.numba.exact_sums.add_products`, which takes one index at a time)."""
    s, c, A, X, U = (st[:, f] for f in range(STATE_FIELDS))
    m, n = a.shape
    step = max(1, min(n, BLOCK_TERMS // max(1, m * b.shape[1])))
    with np.errstate(all="ignore"):
        for i in range(0, n, step):
            ai, bi = a[:, i:i + step, None], b[None, i:i + step, :]
            off = ai == 0.0
            p, e = two_prod(ai, bi)
            p, e = np.where(off, 0.0, p), np.where(off, 0.0, e)
            A += _across(np.abs(p))
            U += _across(((p != 0.0) & (np.abs(p) < NORMAL_MIN))
                         | ~off & ((np.abs(ai) >= SPLIT_MAX) | (np.abs(bi) >= SPLIT_MAX)))
            h, errs = _pairwise(p)
            s[...], q = two_sum(s, h)
            if errs:
                t, dropped = _pairwise(np.concatenate([e, *errs, q[:, None]], axis=1))
            else:  # one inner index: two error terms
                t, d = two_sum(e[:, 0], q)
                dropped = [d[:, None]]
            c[...], r = two_sum(c, t)
            X += np.abs(r)
            for d in dropped:
                X += _across(np.abs(d))


def _across(t: np.ndarray) -> np.ndarray:
    """The sums over axis 1 of ``t`` (m, j, k)."""
    return t[:, 0] if t.shape[1] == 1 else t.sum(axis=1)


def _pairwise(t: np.ndarray):
    """The TwoSum tree over axis 1 of ``t`` (m, j, k): the (m, k) float64 sums and the
    tree's error terms, one (m, j', k) array a level (the exact sums are the sums plus
    the errors)."""
    errs = []
    while t.shape[1] > 1:
        if t.shape[1] % 2:
            t = np.concatenate([t, np.zeros_like(t[:, :1])], axis=1)
        t, q = two_sum(t[:, 0::2], t[:, 1::2])
        errs.append(q)
    return t[:, 0], errs


def round_products(st: np.ndarray, n: int):
    """The sums of the states ``st`` (shape (..., 5, k), of at most ``n`` terms each) rounded to nearest
    float64, and whether each rounding is proven: where no addition into ``c`` rounded,
    ``s + c`` is the exact sum and one rounding of it the answer (exact midpoints,
    cancellation); otherwise where :func:`sum_bound` proves it.  An exact 0 is +0."""
    s, c, A, X, U = (st[..., f, :] for f in range(STATE_FIELDS))
    with np.errstate(all="ignore"):
        hi, lo = two_sum(s, c)
        v, ok = round_dw(hi, lo, sum_bound(n, A), np.float64)
        v = np.where(X == 0.0, s + c, v) + 0.0
    ok = (ok | (X == 0.0)) & (U == 0.0) & np.isfinite(A)
    return v, ok


def matmul_rows(a: np.ndarray, b: np.ndarray, add=add_products, rnd=round_products) -> np.ndarray:
    """``a @ b`` of float64 (m, n) and (n, k) arrays, each entry ``sum_i a_ri b_ic``
    correctly rounded to float64 (an exact 0 is +0): the products' sum states
    (:func:`add_products`, or an engine's compiled ``add``), rounded where that is proven
    (:func:`round_products`, or an engine's ``rnd``), the other entries summed exactly
    (:func:`exact_dot`).  Terms whose ``a_ri`` is 0 are left out."""
    st = product_state(a.shape[0], b.shape[1])
    add(st, a, b)
    v, ok = rnd(st, a.shape[1])
    for r, col in zip(*np.nonzero(~ok)):
        on = a[r] != 0.0
        v[r, col] = exact_dot(a[r, on], b[on, col])
    return v


def exact_dot(a: np.ndarray, b: np.ndarray | None) -> float:
    """``sum_i a_i b_i`` (``sum_i a_i`` when ``b`` is None) of float64 vectors, exactly in
    integers, then rounded to nearest, ties to even (+-inf beyond float64's range).  A
    row holding an infinity or a NaN sums to what float64 arithmetic gives in any order
    (+-inf or NaN)."""
    if not (np.isfinite(a).all() and (b is None or np.isfinite(b).all())):
        with np.errstate(invalid="ignore", over="ignore"):
            return float(np.sum(a if b is None else a * b))
    nz = np.flatnonzero((a != 0) if b is None else (a != 0) & (b != 0))
    terms = []
    for i in nz.tolist():
        n, d = float(a[i]).as_integer_ratio()
        if b is not None:
            m, f = float(b[i]).as_integer_ratio()
            n, d = n * m, d * f
        if n:
            terms.append((n, d.bit_length() - 1))  # d is a power of two
    if not terms:
        return 0.0
    K = max(k for _, k in terms)
    total = sum(n << (K - k) for n, k in terms)
    return float(round_real(Fraction(total, 1 << K), np.float64)) + 0.0


def pow_rows(p: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``p^a`` correctly rounded to float64, for ``p > 0`` and ``|a log p| <= 1400``
    (``a`` broadcasts against ``p``)."""
    p, a = np.broadcast_arrays(np.asarray(p, np.float64), np.asarray(a, np.float64))
    normal = p >= TINY
    with np.errstate(all="ignore"):
        q = np.where(normal, p, 1.0)
        lh, ll = log_dw(q, np.zeros_like(q))
        zh, zl = dw_mul_fp(lh, ll, a)
        e, hi, lo = exp_dw(zh, zl)
        eps = EPS_EXP + 1.01 * np.abs(zh) * (EPS_LOG + DW_MUL * U2)
        v, ok = round_scaled(e, hi, lo, eps * np.abs(hi) * 1.01, np.float64)
    v = np.array(v, np.float64)
    for i in zip(*np.nonzero(~(ok & normal))):
        v[i] = exact_pow(float(p[i]), float(a[i]))
    return v


def _ziv(f) -> float:
    """The float64 nearest to a real value that ``f(ctx)`` encloses: ``f`` returns ``(v,
    k)`` with the value within relative ``k 10^(1 - prec)`` of the decimal ``v`` computed
    at ``ctx``'s precision ``prec``; the precision doubles until the enclosure rounds to one
    float64 (an exact midpoint, after 1280 digits, is rounded as the 1280-digit value is)."""
    prec = 40
    while True:
        ctx = Context(prec=prec, Emax=999_999_999, Emin=-999_999_999)
        v, k = f(ctx)
        v = Fraction(v)
        eps = Fraction(k) / 10 ** (prec - 1)
        lo, hi = round_real(v * (1 - eps), np.float64), round_real(v * (1 + eps), np.float64)
        if lo == hi:
            return lo
        if prec >= 1280:
            return round_real(v, np.float64)
        prec *= 2


def exact_pow(p: float, a: float) -> float:
    """``p^a`` (``p > 0``) rounded to nearest float64: ``exp(a ln p)`` in decimal (each of
    ln, the product and exp rounded once: a relative error below ``(|z| + 1) 10^(1 - prec)``,
    ``z = a ln p``)."""
    def f(ctx):
        z = ctx.multiply(ctx.ln(Decimal(p)), Decimal(a))
        return ctx.exp(z), 2 * int(abs(z)) + 4
    return _ziv(f)


def exact_log(p: float) -> float:
    """``ln p`` (``p > 0``) rounded to nearest float64."""
    return _ziv(lambda ctx: (ctx.ln(Decimal(p)), 1))


def exact_exp(z: float) -> float:
    """``exp(z)`` rounded to nearest float64."""
    return _ziv(lambda ctx: (ctx.exp(Decimal(z)), 1))


def log_rows(p: np.ndarray) -> np.ndarray:
    """``ln p`` correctly rounded to float64 for ``p > 0`` (exactly 0 at ``p = 1``)."""
    p = np.asarray(p, np.float64)
    normal = p >= TINY
    with np.errstate(all="ignore"):
        q = np.where(normal, p, 2.0)
        lh, ll = log_dw(q, np.zeros_like(q))
        v, ok = round_dw(lh, ll, EPS_LOG * np.abs(lh) * SLACK, np.float64)
    v = np.where(p == 1.0, 0.0, v)
    for i in zip(*np.nonzero(~(ok & normal) & (p != 1.0))):
        v[i] = exact_log(float(p[i]))
    return v


def exp_rows(z: np.ndarray) -> np.ndarray:
    """``exp(z)`` correctly rounded to float64 for ``|z| <= 1400``."""
    z = np.asarray(z, np.float64)
    with np.errstate(all="ignore"):
        e, hi, lo = exp_dw(z, np.zeros_like(z))
        v, ok = round_scaled(e, hi, lo, EPS_EXP * np.abs(hi) * SLACK, np.float64)
    v = np.array(v, np.float64)
    for i in zip(*np.nonzero(~ok)):
        v[i] = exact_exp(float(z[i]))
    return v


def skew_rows(p: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """The Jacobian weights ``u = p^a2`` (``a2 = 2 - alpha`` in [0, 1], one per row: shape
    (rows, 1)) correctly rounded on the support of the float64 rows ``p``, 0 elsewhere:
    exact at ``a2`` = 0 and 1, one IEEE square root at 1/2, :func:`pow_rows` otherwise."""
    on = p > 0
    a2 = np.broadcast_to(a2, p.shape)
    with np.errstate(invalid="ignore"):
        u = np.where(a2 == 0.0, 1.0, np.where(a2 == 1.0, p, np.sqrt(np.where(on, p, 0.0))))
    gen = on & (a2 != 0.0) & (a2 != 0.5) & (a2 != 1.0)
    if gen.any():
        u[gen] = pow_rows(p[gen], a2[gen])
    return np.where(on, u, 0.0)


def vjp_rows(p: np.ndarray, g: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """``dx = u (g - r)`` on the support (0 elsewhere) of float64 rows with alpha in [1, 2]:
    ``u = p^a2`` (:func:`skew_rows`), ``r = (u . g) / sum u`` from the correctly rounded
    sums, then one subtraction and one product per entry: the same bits in every engine."""
    u = skew_rows(p, a2)
    su = dot_rows(u)
    ug = dot_rows(u, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(su > 0.0, ug / np.where(su > 0.0, su, 1.0), 0.0)[:, None]
    return np.where(u > 0.0, u * (g - r), 0.0)


# ----------------------------------------------------------------------------- alpha > 2
#: exp(z) rounds to 0 for every z below this (exp(-746) < 2^-1075)
EXP_UNDER = -746.0


def exp_any(z: np.ndarray) -> np.ndarray:
    """``exp(z)`` correctly rounded for any float64 ``z``: +inf above :data:`EXP_OVER`, 0
    below :data:`EXP_UNDER`, :func:`exp_rows` between (NaN at NaN)."""
    z = np.asarray(z, np.float64)
    out = np.where(z > EXP_OVER, np.inf, np.where(z < EXP_UNDER, 0.0, z))
    mid = (z >= EXP_UNDER) & (z <= EXP_OVER)
    if mid.any():
        out[mid] = exp_rows(z[mid])
    return out


def _log_abs(v: np.ndarray) -> np.ndarray:
    """``log|v|`` correctly rounded for finite nonzero ``v``; ``|v|`` (+inf or NaN) where
    that is not finite."""
    a = np.abs(v)
    fin = np.isfinite(a)
    a[fin] = log_rows(a[fin])
    return a


def _log_support(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(on, L)``: the support of the rows ``p`` and ``L = log p`` correctly rounded there
    (0 elsewhere)."""
    on = p > 0
    L = np.zeros_like(p)
    L[on] = log_rows(p[on])
    return on, L


def _on_exp(on: np.ndarray, z: np.ndarray) -> np.ndarray:
    """:func:`exp_any` of ``z`` on ``on``, 0 elsewhere."""
    out = np.zeros(z.shape)
    out[on] = exp_any(z[on])
    return out


def vjp_big_rows(p: np.ndarray, g: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """The row VJP ``u (g - r)`` of float64 rows with alpha > 2 (``a2 = 2 - alpha``, shape
    (rows, 1)) in the overflow-free form of ``NumpyBackend.entmax_vjp``, by one
    deterministic algorithm: ``L = log p`` and every exponential correctly rounded
    (``lu = a2 L``, ``w = exp(lu - max lu)``, ``u = exp(lu)``), every sum and dot product
    correctly rounded (:func:`dot_rows`), and the same few float64 operations around
    them as the numba engine's ``_vjp_row_big``, so both give the same bits."""
    on, L = _log_support(p)
    rows = np.arange(len(p))
    lu = np.where(on, a2 * L, -np.inf)
    m = lu.argmax(axis=1)  # the first entry of largest u (0 on an empty row)
    lmax = np.where(on.any(axis=1), lu[rows, m], 0.0)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        w = _on_exp(on, lu - lmax)
        u = _on_exp(on, lu)
        others = on.copy()
        others[rows, m] = False
        S = dot_rows(w)[:, None]
        Sd = np.where(S > 0, S, 1.0)
        Sm = S - w  # sum_{j != i} w_j (no cancellation: S - w_i >= S / 2 for i != m)
        Gm = dot_rows(w, g)[:, None] - w * g
        diff = (g * Sm - Gm) / Sd  # g_i - r (the entry m is set below)
        dx = np.where(others & (diff != 0), u * diff, 0.0)
        huge = others & (diff != 0) & np.isinf(u)  # u_i |g_i - r| where u_i overflows
        if huge.any():
            dx[huge] = np.sign(diff[huge]) * exp_any(lu[huge] + _log_abs(diff[huge]))
        # the entry m: sum_{j != m} u_j (g_m - g_j) / S where that is finite, else scaled by
        # the second largest u (it is then beyond float64's range)
        dg = g[rows, m][:, None] - g
        D = np.full(len(p), np.nan)
        fin = ~np.isinf(np.where(others, u, 0.0)).any(axis=1)
        if fin.any():
            D[fin] = dot_rows(np.where(others, u, 0.0)[fin], dg[fin]) / Sd[fin, 0]
        dm = D
        wide = ~np.isfinite(D) & others.any(axis=1)
        if wide.any():
            l2 = np.where(others, lu, -np.inf)[wide].max(axis=1)[:, None]
            T = dot_rows(_on_exp(others[wide], lu[wide] - l2), dg[wide]) / Sd[wide, 0]
            nz = T != 0
            scaled = np.zeros(len(T))
            scaled[nz] = np.sign(T[nz]) * exp_any(l2[nz, 0] + _log_abs(T[nz]))
            dm[wide] = scaled
    dx[rows, m] = np.where(others.any(axis=1), dm, 0.0)
    return dx


def alpha_vjp_big_rows(p: np.ndarray, g: np.ndarray, a1: np.ndarray) -> np.ndarray:
    """``NumpyBackend.entmax_alpha_vjp`` of float64 rows with alpha > 2 (``a1 = alpha - 1``,
    shape (rows, 1)): ``sum_i p_i (1 - a1 L_i) (g_i - r) / a1^2`` with ``r = (w . g) /
    sum w``, ``w = exp(lu - max lu)``, ``lu = (1 - a1) L``; ``L = log p`` and ``w``
    correctly rounded, the three sums correctly rounded, the same float64 operations around
    them as the numba engine's ``alpha_vjp_row_big_cr``: the same bits on both."""
    on, L = _log_support(p)
    lu = np.where(on, (1.0 - a1) * L, -np.inf)
    lmax = lu.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        w = _on_exp(on, lu - np.where(np.isfinite(lmax), lmax, 0.0))
    S = dot_rows(w)
    r = np.where(S > 0, dot_rows(w, g) / np.where(S > 0, S, 1.0), 0.0)[:, None]
    term = np.where(on, p * (1.0 - a1 * L) * (g - r), 0.0)
    return dot_rows(term) / (a1[:, 0] * a1[:, 0])
