"""Fused Jacobian-vector products of the numba backend (row kernels, float64 sums).

With ``u = p^(2 - alpha)`` on the support (0 elsewhere):

* scores:  ``dx = u * (g - (u . g) / sum u)``.  float64 rows with alpha <= 2: ``u``
  correctly rounded (in a vectorised pass, or on the support alone for a sparse row), then
  ``sum u`` and ``u . g`` correctly rounded in lanes (:mod:`.exact_sums`), then ``dx``:
  the NumPy engine's bits.  float32 rows: two passes, the first accumulates ``sum u`` and
  ``u . g`` (Neumaier-compensated), the second writes ``dx``.
* alpha:   ``sum_i g_i p_i c_i - (u . g)(sum_i p_i c_i) / sum u`` with
  ``c_i = -L_i^2 h(-(alpha - 1) L_i)``, ``L_i = log p_i`` and
  ``h(w) = (e^w - 1 - w) / w^2`` (its Taylor series for ``|w| < 1``), one pass per row,
  with ``log p``, ``exp`` and ``u`` and the four sums correctly rounded (the NumPy
  engine's bits).  This has no ``1/(alpha - 1)`` cancellation and is continuous at alpha = 1.

``u`` is computed as the reference computes it, ``exp((2 - alpha) log p)``, except at
alpha in {1, 1.5, 2} where it is exactly ``p``, ``sqrt(p)`` and ``1``.

alpha > 2: u is unbounded at the support's edge and overflows float64 for small p at
large alpha (p < ~1e-3 at alpha = 100); both VJPs then follow the reference's
overflow-free forms (``NumpyBackend.entmax_vjp`` / ``entmax_alpha_vjp``): the ratio
``r`` from ``w = u / max u``, the entry of largest u as ``sum_{j != m} u_j (g_m - g_j) /
sum u``, +-inf only where the true value exceeds float64's range, and
``d/dalpha = sum_i p_i (1 - (alpha-1) log p_i) (g_i - r) / (alpha-1)^2`` (always finite),
with ``log p``, every exponential and every sum correctly rounded and the same float64
operations around them as :func:`entmax_ref.backends.exact_sums.vjp_big_rows` and
``alpha_vjp_big_rows``: the NumPy engine's bits (float32 ``dx``: their float32 rounding).
A row whose rounding these kernels do not prove is finished by the NumPy engine.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import SERIES_TERMS
from ._jit import ANY, b1, f64, i64, jit, kernel
from .compensated import acc as _acc
from .exact_sums import LANES, dot_add, dot_lanes, exp_cr, log_cr, skew_cr, sum_add, sum_round
from ._threads import run_blocks


@jit(forceinline=True)
def skew(p, a2):
    """``u = p^(2 - alpha)`` for ``p > 0`` (``a2 = 2 - alpha``)."""
    if a2 == 0.0:
        return 1.0
    elif a2 == 0.5:
        return math.sqrt(p)
    elif a2 == 1.0:
        return p
    return math.exp(a2 * math.log(p))


@jit(forceinline=True)
def _h(w):
    """``(exp(w) - 1 - w) / w^2`` without cancellation (the reference's series for |w| < 1)."""
    if abs(w) < 1.0:
        series = 0.0
        term = 0.5
        for k in range(SERIES_TERMS):
            series = series + term
            term = term * w / (k + 3)
        return series
    return (math.expm1(w) - w) / (w * w)


@jit
def _vjp_row(p, g, a2, dx):
    su = 0.0
    csu = 0.0
    ug = 0.0
    cug = 0.0
    n = p.shape[0]
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            u = skew(pi, a2)
            su, csu = _acc(su, csu, u)
            ug, cug = _acc(ug, cug, u * np.float64(g[i]))
    su = su + csu
    r = (ug + cug) / su if su > 0.0 else 0.0
    for i in range(n):
        pi = np.float64(p[i])
        u = skew(pi, a2) if pi > 0.0 else 0.0
        dx[i] = u * (np.float64(g[i]) - r) if u > 0.0 else 0.0


@jit(forceinline=True)
def signed_exp(l, v):
    """``sign(v) exp(l + log|v|)`` (0 at v = 0): ``exp(l) * v`` without overflowing early."""
    if v == 0.0:
        return 0.0
    e = math.exp(l + math.log(abs(v)))
    return e if v > 0.0 else -e


@jit(forceinline=True)
def _lu(p, a2):
    """``lu = a2 log p`` (``log p`` correctly rounded) for ``p > 0``, and whether it is proven."""
    L, ok = log_cr(p)
    return a2 * L, ok


@jit(forceinline=True)
def _lu_argmax(p, a2):
    """The first entry m of largest ``lu = a2 log p`` on the support (-1 on an empty row),
    ``lu_m`` (-inf there) and whether every log is proven."""
    m = -1
    lmax = -np.inf
    good = True
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            lu, ok = _lu(pi, a2)
            good = good & ok
            if m < 0 or lu > lmax:
                lmax = lu
                m = i
    return m, lmax, good


@jit(forceinline=True)
def _signed_exp_cr(l, v):
    """``sign(v) exp(l + log|v|)`` (0 at v = 0; ``exp`` and ``log`` correctly rounded):
    ``exp(l) * v`` without overflowing early; and whether it is proven."""
    if v == 0.0:
        return 0.0, True
    L, ok1 = log_cr(abs(v))
    e, ok2 = exp_cr(l + L)
    return (e if v > 0.0 else -e), ok1 & ok2


@jit
def _vjp_row_big(p, g, a2, dx):
    """alpha > 2, as :func:`entmax_ref.backends.exact_sums.vjp_big_rows` (the same
    operations, so the same bits): with ``lu = a2 log p``, m the first entry of largest u
    and ``w = exp(lu - lu_m)``, ``g_i - r = (g_i S_i - G_i) / S`` (S_i, G_i: sums of w and
    w g over j != i, by subtraction); entries ``u_i (g_i - r)``
    (``sign exp(lu_i + log|g_i - r|)`` where u_i overflows) and, at m, ``sum_{j != m} u_j
    (g_m - g_j) / S`` (scaled by the second largest u where that sum is not finite).
    ``log``, ``exp`` and every sum correctly rounded.  Returns False (``dx`` unfinished)
    where a rounding is not proven."""
    n = p.shape[0]
    m, lmax, good = _lu_argmax(p, a2)
    if m < 0:
        for i in range(n):
            dx[i] = 0.0
        return True
    if not good:
        return False
    gm = np.float64(g[m])
    S, cS, aS, xS = 0.0, 0.0, 0.0, np.bool_(False)
    G, cG, aG, xG, bad = 0.0, 0.0, 0.0, np.bool_(False), np.bool_(False)
    D, cD, aD, xD = 0.0, 0.0, 0.0, np.bool_(False)
    uinf = False
    l2 = -np.inf
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            gi = np.float64(g[i])
            lu = _lu(pi, a2)[0]
            wi, ok1 = exp_cr(lu - lmax)
            S, cS, aS, xS = sum_add(S, cS, aS, xS, wi)
            G, cG, aG, xG, bad = dot_add(G, cG, aG, xG, bad, wi, gi)
            if i != m:
                u, ok2 = exp_cr(lu)
                good = good & ok2
                uinf = uinf | (u == np.inf)
                if not uinf:
                    D, cD, aD, xD, bad = dot_add(D, cD, aD, xD, bad, u, gm - gi)
                if lu > l2:
                    l2 = lu
            good = good & ok1
    S, ok1 = sum_round(S, cS, aS, xS, n)
    G, ok2 = sum_round(G, cG, aG, xG, n)
    if not (good & ok1 & ok2 & (not bad)):
        return False
    Sd = S if S > 0.0 else 1.0
    for i in range(n):
        pi = np.float64(p[i])
        if not (pi > 0.0) or i == m:
            dx[i] = 0.0
            continue
        gi = np.float64(g[i])
        lu = _lu(pi, a2)[0]
        wi = exp_cr(lu - lmax)[0]
        diff = (gi * (S - wi) - (G - wi * gi)) / Sd
        if diff == 0.0:
            dx[i] = 0.0
            continue
        u = exp_cr(lu)[0]
        if u == np.inf:
            v, ok = _signed_exp_cr(lu, diff)
            good = good & ok
            dx[i] = v
        else:
            dx[i] = u * diff
    if l2 == -np.inf:  # m alone on the support
        dx[m] = 0.0
        return good
    if not uinf:
        Dm, ok = sum_round(D, cD, aD, xD, n)
        Dm = Dm / Sd
        if not ok:
            return False
        if Dm - Dm == 0.0:  # finite
            dx[m] = Dm
            return good
    T, cT, aT, xT = 0.0, 0.0, 0.0, np.bool_(False)
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and i != m:
            w2, ok = exp_cr(_lu(pi, a2)[0] - l2)
            good = good & ok
            T, cT, aT, xT, bad = dot_add(T, cT, aT, xT, bad, w2, gm - np.float64(g[i]))
    T, ok = sum_round(T, cT, aT, xT, n)
    v, ok2 = _signed_exp_cr(l2, T / Sd)
    dx[m] = v
    return good & ok & ok2 & (not bad)


#: the row VJP drivers' signature for input dtype ``x``: (p, g, alpha, dx, r0, r1)
def _VJP(x):
    return x[:, ::1], x[:, ::1], f64[::1], x[:, ::1], i64, i64


@jit
def _skew_dense(p, a2, u):
    """``u[i] = p[i]^a2`` correctly rounded on the support (0 elsewhere), in a loop without
    a branch on the data (so LLVM vectorises it); whether every rounding is proven."""
    bad = False
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        on = pi > 0.0
        v, ok = skew_cr(pi if on else 1.0, a2)
        u[i] = v if on else 0.0
        bad = bad | (on & (not ok))
    return not bad


@jit
def _skew_sparse(p, a2, u, idx, k):
    """:func:`_skew_dense` on the ``k`` entries ``idx[:k]`` of the support alone."""
    bad = False
    for i in range(p.shape[0]):
        u[i] = 0.0
    for j in range(k):
        v, ok = skew_cr(np.float64(p[idx[j]]), a2)
        u[idx[j]] = v
        bad = bad | (not ok)
    return not bad


@jit(forceinline=True)
def _skew_pass(p, a2, u, idx):
    """:func:`_skew_dense`, or on a sparse row (under 1/8 of it on the support, whose
    indices go to the scratch ``idx``) :func:`_skew_sparse`: the same values."""
    n = p.shape[0]
    k = np.int64(0)  # it reaches _skew_sparse: not a literal (the package docstring)
    for i in range(n):
        if p[i] > 0.0:
            if k < n // 8:
                idx[k] = i
            k += 1
    return _skew_sparse(p, a2, u, idx, k) if 8 * k < n else _skew_dense(p, a2, u)


@jit
def _vjp_row_cr(p, g, a2, dx, lanes, idx):
    """A float64 row with alpha in [1, 2], as :func:`entmax_ref.backends.exact_sums.vjp_rows`:
    ``u`` (kept in ``dx``) and the sums ``sum u``, ``u . g`` correctly rounded, then
    ``dx = u (g - r)`` (``lanes``, ``idx``: the scratch of :func:`.exact_sums.dot_lanes`
    and :func:`_skew_pass`).  Returns
    False (``dx`` unfinished) where a rounding is not proven."""
    n = p.shape[0]
    if not _skew_pass(p, a2, dx, idx):
        return False
    su, ok1, ug, ok2 = dot_lanes(dx, g, lanes)
    if not (ok1 and ok2):
        return False
    r = ug / su if su > 0.0 else 0.0
    for i in range(n):
        u = dx[i]
        dx[i] = u * (g[i] - r) if u > 0.0 else 0.0
    return True


#: the float64 row VJP driver's signature (every input dtype): (p, g, alpha, dx, ok, r0,
#: r1), ``ok[r]``: whether row r's roundings are proven
_VJP64 = (f64[:, ::1], f64[:, ::1], f64[::1], f64[:, ::1], b1[::1], i64, i64)


@kernel(lambda _: _VJP64, ops=("entmax_vjp",), dtypes=ANY)
def _vjp_cr(p, g, alpha, dx, ok, r0, r1):
    """float64 rows: alpha <= 2 by :func:`_vjp_row_cr`, the others by :func:`_vjp_row_big`."""
    lanes = np.empty((10, LANES), np.float64)
    idx = np.empty(p.shape[1] // 8 + 1, np.int64)
    for r in range(r0, r1):
        if alpha[r] > 2.0:
            ok[r] = _vjp_row_big(p[r], g[r], 2.0 - alpha[r], dx[r])
        else:
            ok[r] = _vjp_row_cr(p[r], g[r], 2.0 - alpha[r], dx[r], lanes, idx)


@kernel(_VJP, ops=("entmax_vjp",), dtypes=("float32",))
def _vjp_small(p, g, alpha, dx, r0, r1):
    for r in range(r0, r1):
        _vjp_row(p[r], g[r], 2.0 - alpha[r], dx[r])


def _vjp_float64(p, g, alpha, dx, nblk):
    """:func:`_vjp_cr` on float64 rows; the rare row it does not prove the NumPy engine's
    ``vjp_float64`` finishes (the same bits either way)."""
    ok = np.empty(p.shape[0], np.bool_)
    run_blocks(_vjp_cr, (p, g, alpha, dx, ok), p.shape, nblk)
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..numpy_backend import vjp_float64

        dx[bad] = vjp_float64(p[bad], g[bad], alpha[bad])


#: entries of a float32 block that :func:`_vjp_widened` widens at once (its three float64
#: arrays then stay in the core's cache)
WIDEN_BLOCK = 1 << 14


def _vjp_widened(p, g, alpha, dx, nblk):
    """:func:`_vjp_float64` of float32 rows (exactly widened), rounded once to float32 into
    ``dx``: the float64 copies are made a few rows at a time (:data:`WIDEN_BLOCK` entries)
    on the worker threads, so that they stay in cache instead of doubling the batch in
    memory.  The same bits as widening the whole batch."""
    ok = np.empty(p.shape[0], np.bool_)
    step = max(1, WIDEN_BLOCK // max(p.shape[1], 1))

    def block(r0, r1):
        for a in range(r0, r1, step):
            b = min(a + step, r1)
            out = np.empty((b - a, p.shape[1]))
            _vjp_cr(p[a:b].astype(np.float64), g[a:b].astype(np.float64), alpha[a:b], out, ok[a:b], 0, b - a)
            with np.errstate(over="ignore"):  # +-inf where the value is beyond float32's range
                dx[a:b] = out

    run_blocks(block, (), p.shape, nblk)
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..numpy_backend import vjp_float64

        with np.errstate(over="ignore"):
            dx[bad] = vjp_float64(p[bad].astype(np.float64), g[bad].astype(np.float64), alpha[bad])


def entmax_vjp_rows(p, g, alpha, dx, nblk=64):
    """``dx[r] = u * (g[r] - (u . g[r]) / sum u)`` for every row (``u = p^(2-alpha)``):
    float64 rows by :func:`_vjp_cr` (the NumPy engine's bits); float32 rows with alpha <= 2
    by :func:`_vjp_row`, the others as float64 rows rounded once to float32 (the NumPy
    engine's bits too).  Only the kernels the rows need are compiled.  Rows run on worker
    threads (:func:`~._threads.run_blocks`)."""
    if p.dtype == np.float64:
        _vjp_float64(p, g, alpha, dx, nblk)
        return
    big = alpha > 2.0
    if not big.any():
        run_blocks(_vjp_small, (p, g, alpha, dx), p.shape, nblk)
        return
    if big.all():
        _vjp_widened(p, g, alpha, dx, nblk)
        return
    out = np.empty((int(big.sum()), p.shape[1]), p.dtype)
    _vjp_widened(p[big], g[big], alpha[big], out, nblk)
    dx[big] = out
    small = np.empty((p.shape[0] - out.shape[0], p.shape[1]), p.dtype)
    run_blocks(_vjp_small, (p[~big], g[~big], alpha[~big], small), small.shape, nblk)
    dx[~big] = small


@jit(forceinline=True)
def _h_cr(w):
    """:func:`entmax_ref.backends.numpy_backend._h`, the same operations: the series for
    ``|w| < 1``, else ``(e - 1 - w) / w^2`` with ``e = exp(w)`` correctly rounded.
    Returns (h, whether e's rounding is proven)."""
    if abs(w) < 1.0:
        return _h(w), True
    e, ok = exp_cr(w)
    return (e - 1.0 - w) / (w * w), ok


@jit
def alpha_vjp_row_cr(p, g, a1):
    """A row with alpha in [1, 2] (``a1 = alpha - 1``), as the NumPy engine's
    ``alpha_vjp_rows``: ``log p``, ``exp`` and ``u`` correctly rounded, the four sums
    correctly rounded (:mod:`.exact_sums`).  Returns (value, whether every rounding is
    proven)."""
    a2 = 1.0 - a1
    n = p.shape[0]
    s1, c1, A1, x1, bad = 0.0, 0.0, 0.0, np.bool_(False), np.bool_(False)
    s2, c2, A2, x2 = 0.0, 0.0, 0.0, np.bool_(False)
    s3, c3, A3, x3 = 0.0, 0.0, 0.0, np.bool_(False)
    s4, c4, A4, x4 = 0.0, 0.0, 0.0, np.bool_(False)
    good = True
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            gi = np.float64(g[i])
            L, ok = log_cr(pi)
            good = good & ok
            h, ok = _h_cr(-a1 * L)
            pc = -pi * L * L * h
            u, ok2 = skew_cr(pi, a2)
            good = good & ok & ok2
            s1, c1, A1, x1, bad = dot_add(s1, c1, A1, x1, bad, gi, pc)
            s2, c2, A2, x2 = sum_add(s2, c2, A2, x2, pc)
            s3, c3, A3, x3, bad = dot_add(s3, c3, A3, x3, bad, u, gi)
            s4, c4, A4, x4 = sum_add(s4, c4, A4, x4, u)
    sgc, ok1 = sum_round(s1, c1, A1, x1, n)
    spc, ok2 = sum_round(s2, c2, A2, x2, n)
    sug, ok3 = sum_round(s3, c3, A3, x3, n)
    su, ok4 = sum_round(s4, c4, A4, x4, n)
    good = good & ok1 & ok2 & ok3 & ok4 & (not bad)
    corr = sug * spc / su if su > 0.0 else 0.0
    return sgc - corr, good


@jit
def alpha_vjp_row(p, g, a1):
    """A row with alpha in [1, 2] in float64 with compensated sums (the attention
    backward's dalpha)."""
    a2 = 1.0 - a1
    sgc = 0.0
    cgc = 0.0
    spc = 0.0
    cpc = 0.0
    sug = 0.0
    cug = 0.0
    su = 0.0
    csu = 0.0
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            gi = np.float64(g[i])
            L = math.log(pi)
            pc = -pi * L * L * _h(-a1 * L)
            u = skew(pi, a2)
            sgc, cgc = _acc(sgc, cgc, gi * pc)
            spc, cpc = _acc(spc, cpc, pc)
            sug, cug = _acc(sug, cug, u * gi)
            su, csu = _acc(su, csu, u)
    su = su + csu
    corr = (sug + cug) * (spc + cpc) / su if su > 0.0 else 0.0
    return (sgc + cgc) - corr


@jit
def alpha_vjp_row_big(p, g, a1):
    """alpha > 2 in float64 with compensated sums (the attention backward's dalpha), as
    the reference: ``sum_i p_i (1 - a1 log p_i) (g_i - r) / a1^2`` with
    ``r = (w . g) / sum w``, ``w = exp(lu - max lu)`` (the unbounded u-terms of the
    general form cancel exactly and are left out)."""
    a2 = 1.0 - a1
    lmax = -np.inf
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            lu = a2 * math.log(pi)
            if lu > lmax:
                lmax = lu
    if lmax == -np.inf:
        return 0.0
    S, cS, G, cG = 0.0, 0.0, 0.0, 0.0
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            wi = math.exp(a2 * math.log(pi) - lmax)
            S, cS = _acc(S, cS, wi)
            G, cG = _acc(G, cG, wi * np.float64(g[i]))
    r = (G + cG) / (S + cS)
    t, ct = 0.0, 0.0
    for i in range(p.shape[0]):
        pi = np.float64(p[i])
        if pi > 0.0:
            t, ct = _acc(t, ct, pi * (1.0 - a1 * math.log(pi)) * (np.float64(g[i]) - r))
    return (t + ct) / (a1 * a1)


@jit
def alpha_vjp_row_big_cr(p, g, a1):
    """alpha > 2, as :func:`entmax_ref.backends.exact_sums.alpha_vjp_big_rows` (the same
    operations, so the same bits): ``sum_i p_i (1 - a1 L_i) (g_i - r) / a1^2`` with ``r =
    (w . g) / sum w``, ``w = exp(lu - max lu)``, ``lu = (1 - a1) L``, ``L = log p`` (the
    unbounded u-terms of the general form cancel exactly and are left out); ``log``,
    ``exp`` and the sums correctly rounded.  Returns (value, whether every rounding is
    proven)."""
    a2 = 1.0 - a1
    n = p.shape[0]
    m, lmax, good = _lu_argmax(p, a2)
    if m < 0:
        return 0.0, True
    S, cS, aS, xS = 0.0, 0.0, 0.0, np.bool_(False)
    G, cG, aG, xG, bad = 0.0, 0.0, 0.0, np.bool_(False), np.bool_(False)
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            wi, ok = exp_cr(_lu(pi, a2)[0] - lmax)
            good = good & ok
            S, cS, aS, xS = sum_add(S, cS, aS, xS, wi)
            G, cG, aG, xG, bad = dot_add(G, cG, aG, xG, bad, wi, np.float64(g[i]))
    S, ok1 = sum_round(S, cS, aS, xS, n)
    G, ok2 = sum_round(G, cG, aG, xG, n)
    r = G / S if S > 0.0 else 0.0
    t, ct, at, xt = 0.0, 0.0, 0.0, np.bool_(False)
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0:
            L = log_cr(pi)[0]
            t, ct, at, xt = sum_add(t, ct, at, xt, pi * (1.0 - a1 * L) * (np.float64(g[i]) - r))
    t, ok3 = sum_round(t, ct, at, xt, n)
    return t / (a1 * a1), good & ok1 & ok2 & ok3 & (not bad)


@kernel(lambda x: (x[:, ::1], x[:, ::1], f64[::1], f64[::1], b1[::1], i64, i64), ops=("entmax_alpha_vjp",))
def _alpha_vjp(p, g, alpha, out, ok, r0, r1):
    for r in range(r0, r1):
        if alpha[r] > 2.0:
            out[r], ok[r] = alpha_vjp_row_big_cr(p[r], g[r], alpha[r] - 1.0)
        else:
            out[r], ok[r] = alpha_vjp_row_cr(p[r], g[r], alpha[r] - 1.0)


def entmax_alpha_vjp_rows(p, g, alpha, out, nblk=64):
    """``out[r] = sum_i g_i dp_i/dalpha`` for every row (float64); the rare row that
    :func:`alpha_vjp_row_cr` or :func:`alpha_vjp_row_big_cr` does not round is finished by
    the NumPy engine (the same bits)."""
    ok = np.empty(p.shape[0], np.bool_)
    run_blocks(_alpha_vjp, (p, g, alpha, out, ok), p.shape, nblk)
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..numpy_backend import alpha_vjp_float64

        out[bad] = alpha_vjp_float64(p[bad].astype(np.float64), g[bad].astype(np.float64), alpha[bad])
