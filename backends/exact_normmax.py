"""Correctly rounded alpha-normmax rows and their VJP, the same on both CPU engines: one
NumPy algorithm that both run (``docs/math/normmax.md``).

With ``a1 = alpha - 1``, ``g = 1/a1``, ``beta = alpha/a1 = 1 + g`` and ``y = x - max x``,
the threshold ``T`` (``tau = max x + T``) is the root of ``f(T) = sum_i [y_i - T]_+^beta
- 1``, continuous, convex and strictly decreasing on ``[-1, 0)`` (``T >= -1``: the top
entry alone has ``f(-1) >= 0``), and ``p_i = t_i^g / sum_j t_j^g``, ``t_i = [y_i - T]_+``.

:func:`normmax_rows`, every row at once (Ziv's strategy, as :mod:`.exact_rows`):

1. the candidates ``y_i > -1`` (``y`` exactly, a double-word by TwoSum), gathered into a
   padded (rows, k) array;
2. ``T`` in float64 by Newton's method from ``T = -1``, on the candidates (``f`` is convex:
   the iterates increase to the root);
3. Newton steps in double-word: each evaluates ``t = y - T`` (double-word), ``q = t^g =
   exp(g log t)`` (:func:`.double_word.log_dw`, :func:`.double_word.exp_dw`), ``t^beta =
   t q``, ``f`` and ``D = sum q`` (pairwise double-word sums) with a rigorous bound ``E``
   on f's error; then ``|T - T*| <= (|f| + E) / (beta (1 - |f| - E))`` (between the two,
   ``|f'| = beta sum t^(beta-1) >= beta sum t^beta = beta (1 + f)``, as ``t <= 1``);
4. from the last evaluation, every candidate's membership is decided against that radius,
   ``p_i = q_i / D`` and ``tau`` rounded where the error interval holds no rounding
   boundary (:func:`.exact_rows.round_dw`).

A row left undecided anywhere (an entry within the radius of the threshold, an output
within its error of a rounding boundary, ``tau`` below the normal range) is solved again
exactly by :func:`normmax_row`: the support from exact mass tests at the candidates'
values (rationals where ``beta`` is a small integer, intervals otherwise, an exact tie test
(:func:`.exact_fallback.mass_is_one`) where the mass could be exactly 1), then the
threshold and every output enclosed by interval arithmetic at increasing precision.

The outputs are the real-number map at the given scores: ``p`` rounded to nearest in the
input's dtype (float32 rows from the exact value, once), ``tau`` to nearest float64, the
support ``{i : p_i > 0}`` of the exact values; so every engine that runs this gets the
same bits.  :func:`normmax_vjp_rows` is deterministic (correctly rounded logs,
exponentials and sums, the same float64 operations between them), not correctly rounded.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np

from . import double_word as M
from ._base import RowSolve
from .constants import MAX_NEWTON
from .double_word import NEWTON_EVALS, SLACK, U2, dw_add, dw_add_fp, dw_div, dw_mul, exp_dw, log_dw, two_sum
from .exact_fallback import MAX_DIGITS, START_DIGITS, Iv, mass_is_one, precisions, round_iv
from .exact_rows import round_dw, round_scaled, row_sums
from .exact_sums import dot_rows, exp_any, log_rows

#: the threshold's error radius (absolute; ``T`` lies in [-1, 0)) where the refinement stops
T_TARGET = 2.0 ** -84
#: a term below this is not formed (its exponent ``g log t`` would pass ``EXP_MAX``): its
#: ``q`` is below ``exp(-EXP_MAX)``, ``p`` rounds to 0 and it counts as this much error
_Z_MIN = -M.EXP_MAX
#: the absolute error of a term ``q`` or ``t q`` that underflows when it is unscaled
_UNDER = 2.0 ** -1070
#: the relative error of ``g`` and ``beta`` as double-words, of ``t = y - T`` (a double-word sum)
_EPS_G, _EPS_T = M.DW_DIV * U2, M.DW_ADD * U2
#: the candidates kept after the float64 root ``T0``: ``y > T0 - _MARGIN`` (absolute)
_MARGIN = 2.0 ** -20


def _gather(x, live, m):
    """The candidates ``y_i = x_i - m > -1`` of the rows ``live`` of ``x`` (float64 or
    float32; ``m`` the rows' maxima, float64), as flat arrays ``(r, c, yh, yl)``: ``r`` the
    row (into ``live``, ascending), ``c`` the column, ``yh + yl = y`` exactly (TwoSum)."""
    L = np.flatnonzero(live)
    xl = x if len(L) == len(x) else x[L]
    ml = m[L]
    with np.errstate(invalid="ignore"):
        lim = np.nextafter(ml - 1.0, -np.inf)  # at most max - 1
        lim_x = lim.astype(x.dtype)  # compared in x's dtype: no float64 copy of a float32 x
        lim_x = np.where(lim_x > lim, np.nextafter(lim_x, x.dtype.type(-np.inf)), lim_x)
        r, c = np.nonzero(xl > lim_x[:, None])  # a superset of y > -1
    yh, yl = two_sum(xl[r, c].astype(np.float64), -ml[r])
    keep = (yh > -1.0) | ((yh == -1.0) & (yl > 0.0))
    return r[keep], c[keep], yh[keep], yl[keep]


def _padded(r, R, *cols):
    """The flat values ``cols`` of the rows ``r`` (ascending) as (R, k) arrays, 0 on the padding."""
    kc = np.bincount(r, minlength=R)
    pos = np.arange(len(r)) - np.repeat(np.cumsum(kc) - kc, kc)
    k = max(int(kc.max(initial=0)), 1)
    out = []
    for v in cols:
        a = np.zeros((R, k))
        a[r, pos] = v
        out.append(a)
    return out


def _segments(r, R):
    """The start of each row's run in the flat candidates ``r`` (ascending; every row has
    one at least, its maximum)."""
    return np.searchsorted(r, np.arange(R))


def _row_sum(seg, v):
    """Per row, the float64 sum of the flat values ``v`` (a count for booleans)."""
    return np.add.reduceat(v if v.dtype != bool else v.astype(np.int64), seg)


def _float64_root(r, seg, yh, g, beta):
    """``T`` in float64 by monotone Newton from -1 on the candidates, and the steps taken."""
    R = len(seg)
    T = np.full(R, -1.0)
    g1 = g[0] if (g == g[0]).all() else g[r]  # one alpha: a scalar power (NumPy's fast paths)
    its = np.zeros(R, np.int64)
    done = np.zeros(R, bool)
    for _ in range(MAX_NEWTON):
        with np.errstate(under="ignore", invalid="ignore", divide="ignore"):
            t = np.maximum(yh - T[r], 0.0)
            q = t ** g1
            F = _row_sum(seg, t * q) - 1.0
            step = F / (beta * _row_sum(seg, q))
        grow = ~done & (F > 0.0) & (T + step > T)
        T = np.where(grow, T + step, T)
        its += grow
        done |= ~grow
        if done.all():
            break
    return T, its


def _powers(th, tl, formed, gh, gl):
    """``q = t^g`` of the flat double-words ``t`` (normal, where ``formed``) as (e, hi, lo),
    its relative error bound, and ``formed`` less the entries with ``g log t < -EXP_MAX``
    (``q`` not formed): one or two products at ``g`` = 1 and 2 (alpha = 2 and 1.5; ``t``
    from 2^-400), else ``exp(g log t)``."""
    n = len(th)
    qe, qh, ql = np.zeros(n, np.int64), np.zeros(n), np.zeros(n)
    eps = np.zeros(n)
    formed = formed.copy()
    one = formed & (gh == 1.0) & (gl == 0.0)
    two = formed & (gh == 2.0) & (gl == 0.0) & (th >= 2.0 ** -400)
    qh[one], ql[one], eps[one] = th[one], tl[one], 1.01 * _EPS_T
    sh, sl = dw_mul(th[two], tl[two], th[two], tl[two])
    qh[two], ql[two], eps[two] = sh, sl, 1.01 * (2.0 * _EPS_T + M.DW_MUL * U2)
    gen = np.flatnonzero(formed & ~one & ~two)
    if len(gen):
        Lh, Ll = log_dw(th[gen], tl[gen])
        zh, zl = dw_mul(Lh, Ll, gh[gen], gl[gen])
        ok = zh >= _Z_MIN
        e, h, l = exp_dw(np.where(ok, zh, 0.0), np.where(ok, zl, 0.0))
        qe[gen], qh[gen], ql[gen] = e, h, l
        eps[gen] = M.EPS_EXP + 1.01 * (np.abs(zh) * (M.EPS_LOG + M.DW_MUL * U2 + _EPS_G) + gh[gen] * _EPS_T)
        formed[gen] = ok
    return qe, qh, ql, eps, formed


def _evaluate(r, seg, yh, yl, Th, Tl, gh, gl):
    """One double-word evaluation at ``T = Th + Tl`` (per row), over the flat candidates:
    ``t`` (hi, lo), ``on`` (t > 0), ``formed`` (q formed), ``q = t^g`` as (e, hi, lo) with
    its relative error bound (the threshold's error aside), ``f`` (hi) and the bound on its
    error, ``D = sum q`` (hi, lo) and the bound on its error."""
    th, tl = dw_add(yh, yl, -Th[r], -Tl[r])
    on = th > 0.0
    formed = on & (th >= M.NORMAL_MIN)
    with np.errstate(all="ignore"):
        qe, qh, ql, eps_q, formed = _powers(th, tl, formed, gh[r], gl[r])
        Qh = np.where(formed, np.ldexp(qh, qe), 0.0)
        Ql = np.where(formed, np.ldexp(ql, qe), 0.0)
        Ph, Pl = dw_mul(th, tl, Qh, Ql)  # t^beta
        Ph, Pl = np.where(formed, Ph, 0.0), np.where(formed, Pl, 0.0)
        R = len(seg)
        lost = _row_sum(seg, on) * _UNDER  # the underflows and the terms not formed
        PH, PL, QH, QL = _padded(r, R, Ph, Pl, Qh, Ql)
        sh, sl, s_err = row_sums(PH, PL)
        Fh, _ = dw_add_fp(sh, sl, -1.0)
        E = (s_err + 1.01 * _row_sum(seg, np.abs(Ph) * (eps_q + (M.DW_MUL + M.DW_ADD) * U2)) + lost
             + M.DW_ADD * U2 * (np.abs(sh) + 1.0)) * SLACK
        Dh, Dl, d_err = row_sums(QH, QL)
    return th, on, formed, (qe, qh, ql, eps_q), Fh, E, Dh, Dl, d_err + lost


def _radius(Fh, E, bh):
    """The bound on ``|T - T*|`` from ``f(T)`` (``Fh``, error ``E``); +inf where it fails."""
    Fa = (np.abs(Fh) + E) * SLACK
    with np.errstate(divide="ignore", invalid="ignore"):
        rad = Fa / (bh * (1.0 - 2.0 ** -50) * (1.0 - Fa)) * SLACK
    return np.where(Fa < 0.5, rad, np.inf)


def _round_rows(r, seg, ev, eT, gh, m, Th, Tl, dt):
    """The outputs from the last evaluation ``ev`` (:func:`_evaluate`) at ``T = Th + Tl``,
    within ``eT`` of the root: ``p`` of the candidates (in ``dt``), whether each row is
    decided, the support's size and ``tau`` (float64)."""
    th, on, formed, (qe, qh, ql, eps_q), Fh, E, Dh, Dl, d_err = ev
    eTr = eT[r]
    with np.errstate(all="ignore"):
        margin = eTr * SLACK + 2.0 * _EPS_T * np.abs(th)
        inside = on & (th > margin)  # t > 0 at every T within eT of the computed one
        unplaced = ~inside & (th >= -margin)
        # q_i = t_i^g: the threshold's radius moves t_i by eT, q_i by about g eT / t_i (relative)
        rel_t = eTr / np.where(on, th, 1.0) * SLACK
        eps_i = eps_q + 1.01 * gh[r] * rel_t
        first_order = ~formed | (gh[r] * rel_t <= 2.0 ** -20)
        Q = np.where(formed, np.ldexp(qh, qe), 0.0)
        D_rel = (d_err + 1.01 * _row_sum(seg, Q * eps_i)) / Dh * SLACK
        ph, pl = dw_div(qh, ql, Dh[r], Dl[r])
        err = (eps_i + D_rel[r] + M.DW_DIV * U2) * 1.01 * np.abs(ph)
        c, ok = round_scaled(qe, ph, pl, err, dt)
        Ah, Al = dw_add_fp(Th, Tl, m)
        t_c, t_ok = round_dw(Ah, Al, eT * SLACK + _EPS_T * np.abs(Ah), np.float64)
    p = np.where(formed & inside, c, 0.0).astype(dt)
    bad = unplaced | (formed & inside & ~(ok & first_order))
    good = (_row_sum(seg, bad) == 0) & t_ok & np.isfinite(eT)
    return p, good, _row_sum(seg, inside), t_c


def normmax_rows(x: np.ndarray, alpha: np.ndarray) -> RowSolve:
    """alpha-normmax of every row of ``x`` (rows, n), correctly rounded in x's dtype
    (float64, float32; a narrower dtype is rounded from the float64 result); alpha (rows,)
    float64, all > 1.  ``theta`` is ``tau`` rounded to nearest float64 (-inf on rows without
    entries), ``support`` the exact support's size, ``n_iter`` the Newton steps."""
    rows, n = x.shape
    out_dtype = x.dtype
    dt = np.float32 if x.dtype == np.float32 else np.float64
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    m = x.max(axis=1, initial=-np.inf).astype(np.float64)
    live = np.isfinite(m)
    p = np.zeros((rows, n), dt)
    tau = np.full(rows, -np.inf)
    support = np.zeros(rows, np.int64)
    n_iter = np.zeros(rows, np.int64)
    if live.any():
        L = np.flatnonzero(live)
        R = len(L)
        r, c, yh, yl = _gather(x, live, m)
        a = np.asarray(alpha, np.float64)[L]
        a1h, a1l = two_sum(a, -1.0)
        gh, gl = dw_div(np.ones(R), np.zeros(R), a1h, a1l)
        bh, _ = dw_add_fp(gh, gl, 1.0)
        T0, its = _float64_root(r, _segments(r, R), yh, gh, bh)
        # the entries below T0 - _MARGIN stay out (checked below: T moves less than that)
        near = yh > T0[r] - _MARGIN
        r, c, yh, yl = r[near], c[near], yh[near], yl[near]
        seg = _segments(r, R)
        Th, Tl = T0, np.zeros(R)
        for k in range(NEWTON_EVALS):
            ev = _evaluate(r, seg, yh, yl, Th, Tl, gh, gl)
            eT = _radius(ev[4], ev[5], bh)
            todo = (eT > T_TARGET) & np.isfinite(ev[4]) & np.isfinite(ev[5])
            if k == NEWTON_EVALS - 1 or not todo.any():
                break
            with np.errstate(all="ignore"):
                step = ev[4] / (bh * ev[6])
            Th, Tl = dw_add_fp(Th, Tl, np.where(todo & np.isfinite(step), step, 0.0))  # a row done keeps its T
            its += todo
        pc, good, sup, tau_l = _round_rows(r, seg, ev, eT, gh, m[L], Th, Tl, dt)
        # T >= -1 (the radius takes t <= 1), and within the candidates' margin
        good &= (Th - T0 > -0.5 * _MARGIN) & (eT < 0.25 * _MARGIN) & ((Th > -1.0) | ((Th == -1.0) & (Tl >= 0.0)))
        p[L[r], c] = pc
        tau[L] = tau_l
        support[L] = sup
        n_iter[L] = its
        for i in np.flatnonzero(~good):
            p[L[i]], tau[L[i]], support[L[i]] = normmax_row(x[L[i]], float(alpha[L[i]]), dt, hint=float(Th[i]))
    return RowSolve(p.astype(out_dtype, copy=False), tau, support, n_iter, np.ones(rows, bool))


# ----------------------------------------------------------------------------- exact rows
class _Row:
    """One row in exact arithmetic: the candidates' distinct values ``y = x - max > -1``
    (descending, with their counts) and ``beta``, ``g`` as rationals."""

    def __init__(self, x: np.ndarray, alpha: float):
        live = np.isfinite(x)
        self.m = Fraction(float(x[live].max()))
        A = Fraction(alpha)
        self.g = 1 / (A - 1)
        self.beta = A * self.g
        near = np.flatnonzero(live & (x > np.nextafter(float(self.m) - 1.0, -np.inf)))
        self.y = {int(i): Fraction(float(x[i])) - self.m for i in near}
        self.y = {i: v for i, v in self.y.items() if v > -1}
        counts: dict = {}
        for v in self.y.values():
            counts[v] = counts.get(v, 0) + 1
        self.vals = sorted(counts.items(), reverse=True)

    def mass_sign(self, v: Fraction) -> int:
        """The sign of ``f(v) = sum_{y_j > v} (y_j - v)^beta - 1`` at a rational ``v``,
        exactly: in rationals where ``beta`` is a small integer, else by intervals at
        increasing precision, with the exact test for ``f(v) = 0``
        (:func:`.exact_fallback.mass_is_one`, radicals of index ``1 / beta``)."""
        bases = [(w - v, c) for w, c in self.vals if w > v]
        b = self.beta
        if b.denominator == 1 and b.numerator <= 16:
            tot = sum(c * d ** b.numerator for d, c in bases)
            return (tot > 1) - (tot < 1)
        prec = START_DIGITS
        while True:
            iv = Iv(prec)
            bi = iv.of(b)
            lo, hi = iv.total(iv.mul(iv.pow(iv.of(d), b, bi), iv.of(c)) for d, c in bases)
            if lo > 1:
                return 1
            if hi < 1:
                return -1
            if prec == 4 * START_DIGITS and mass_is_one(bases, 1 / b):
                return 0
            prec *= 2

    def support(self):
        """The index ``j`` of the smallest support value in ``vals``, the largest value
        outside it (-1 when none: ``f(-1) >= 0``) and whether ``f`` is 0 there (the root)."""
        lo, hi = 0, len(self.vals)  # vals[0] = 0 is inside (f(0) = -1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.mass_sign(self.vals[mid][0]) < 0:
                lo = mid
            else:
                hi = mid
        out = self.vals[lo + 1][0] if lo + 1 < len(self.vals) else Fraction(-1)
        return lo, out, self.mass_sign(out) == 0

    def root(self, prec: int, j: int, lo: Decimal, hi: Decimal, T: Decimal) -> Decimal:
        """The root of ``f`` on the support ``vals[:j + 1]``, between ``lo`` and ``hi``, by
        bracketed Newton at ``prec`` digits from ``T`` (plain rounding: only the enclosure
        that follows is rigorous)."""
        ctx = Context(prec=prec + 10, Emin=-999_999_999, Emax=999_999_999)
        b = ctx.divide(Decimal(self.beta.numerator), Decimal(self.beta.denominator))
        b1 = ctx.subtract(b, 1)
        ws = [(ctx.divide(Decimal(w.numerator), Decimal(w.denominator)), c) for w, c in self.vals[:j + 1]]
        tol = Decimal(10) ** -(prec + 4)
        if not lo < T < hi:
            T = lo
        for _ in range(8 * prec):
            F, dF = Decimal(-1), Decimal(0)
            for w, c in ws:
                d = ctx.subtract(w, T)
                if d <= 0:
                    continue
                e = ctx.exp(ctx.multiply(b1, ctx.ln(d)))  # d^(beta - 1)
                F = ctx.add(F, ctx.multiply(c, ctx.multiply(e, d)))
                dF = ctx.add(dF, ctx.multiply(c, e))
            if F > 0:
                lo = T
            else:
                hi = T
            step = ctx.divide(F, ctx.multiply(b, dF))
            nxt = ctx.add(T, step)
            if abs(step) <= tol:
                return nxt
            T = nxt if lo < nxt < hi else ctx.divide(ctx.add(lo, hi), 2)
        return T  # pragma: no cover - bracketed Newton converges

    def _mass_iv(self, iv, j, T: Decimal, bi):
        return iv.total(iv.mul(iv.pow(iv.sub(iv.of(w), (T, T)), self.beta, bi), iv.of(c))
                        for w, c in self.vals[:j + 1])


def normmax_row(x: np.ndarray, alpha: float, dtype=np.float64, hint: float | None = None):
    """alpha-normmax of one row exactly, correctly rounded: ``p`` in ``dtype``, ``tau`` (a
    float64), the exact support's size.  The support from exact mass tests (a binary search
    over the candidates' values, :class:`_Row`); at an exact root (an entry at the
    threshold) the outputs from that rational ``T``, else ``T`` enclosed by an interval
    whose ends have ``f > 0`` and ``f < 0`` (proven by interval arithmetic); every output
    from its interval, at increasing precision until each rounds to one value (after
    :data:`.exact_fallback.MAX_DIGITS` digits, the rounding of its lower end).  ``hint``:
    an approximate ``T`` to start Newton's method from."""
    x = np.asarray(x, np.float64)
    p = np.zeros(len(x), dtype)
    if not np.isfinite(x).any():
        return p, -math.inf, 0
    row = _Row(x, alpha)
    j, out, exact = row.support()
    top = row.vals[j][0]
    members = [i for i, v in row.y.items() if v >= top]
    T = Decimal(hint) if hint is not None and math.isfinite(hint) else None
    for prec in precisions():
        iv = Iv(prec)
        gi, bi = iv.of(row.g), iv.of(row.beta)
        if exact:
            Ti = iv.of(out)
        else:
            lo, hi = iv.of(out)[0], iv.of(top)[1]
            T = row.root(prec, j, lo, hi, T if T is not None else lo)
            eps = Decimal(10) ** -(prec - 6)
            Ti = None
            for _ in range(4):
                a, b = max(iv.dn.subtract(T, eps), iv.of(out)[1]), min(iv.up.add(T, eps), iv.of(top)[0])
                if a < b and (a == iv.of(out)[1] or row._mass_iv(iv, j, a, bi)[0] > 1) \
                        and row._mass_iv(iv, j, b, bi)[1] < 1:
                    Ti = (a, b)
                    break
                eps *= 10 ** 4
            if Ti is None:
                continue
        q = {i: iv.pow(iv.sub(iv.of(row.y[i]), Ti), row.g, gi) for i in members}
        S = iv.total(q.values())
        vals = {i: round_iv(iv.div(v, S), dtype) for i, v in q.items()}
        t = round_iv(iv.add(iv.of(row.m), Ti), np.float64)
        last = prec * 2 > MAX_DIGITS
        if last or (t is not None and all(v is not None for v in vals.values())):
            for i, v in q.items():
                c = vals[i]
                p[i] = c if c is not None else round_iv((iv.div(v, S)[0],) * 2, dtype)
            if t is None:
                lo_end = iv.add(iv.of(row.m), Ti)[0]
                t = round_iv((lo_end, lo_end), np.float64)
            return p, float(t), len(members)
    raise AssertionError("unreachable")  # pragma: no cover - the last precision returns


# ----------------------------------------------------------------------------- VJP
def normmax_vjp_rows(p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """dL/dx of alpha-normmax from its output: ``v (g - <p, g>) - p (v . (g - <p, g>))``
    with ``v_i = N^a1 p_i^(2 - alpha) / a1`` on the support (0 elsewhere), ``N =
    ||p||_alpha``, by one deterministic algorithm: ``L = log p``, every exponential and
    every sum correctly rounded (:mod:`.exact_sums`), the same float64 operations between
    them, so every engine gives the same bits.  ``log N = Lm + log(sum_i exp(alpha (L_i -
    Lm))) / alpha`` (``Lm = max L``) and ``v_i = exp(log N + (2 - alpha) (L_i - log N)) /
    a1``."""
    p64 = np.asarray(p, np.float64)
    g64 = np.asarray(g, np.float64)
    a = np.asarray(alpha, np.float64)[:, None]
    on = p64 > 0
    L = np.zeros_like(p64)
    L[on] = log_rows(p64[on])
    any_on = on.any(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        Lm = np.where(any_on, np.where(on, L, -np.inf).max(axis=1, initial=-np.inf), 0.0)[:, None]
        w = np.zeros_like(p64)
        w[on] = exp_any((a * (L - Lm))[on])
        s = dot_rows(w)
        ls = np.zeros_like(s)
        ls[any_on] = log_rows(s[any_on])
        lN = Lm + ls[:, None] / a
        v = np.zeros_like(p64)
        v[on] = exp_any((lN + (2.0 - a) * (L - lN))[on])
        v = v / (a - 1.0)
        d = g64 - dot_rows(np.where(on, p64, 0.0), np.where(on, g64, 0.0))[:, None]
        vd = np.where(on, v * d, 0.0)
        dx = vd - p64 * dot_rows(np.where(on, v, 0.0), np.where(on, d, 0.0))[:, None]
    dx = np.where(on, dx, 0.0)
    return dx.astype(np.result_type(p.dtype, g.dtype), copy=False)
