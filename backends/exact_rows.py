"""Correctly rounded float64 rows of the NumPy engine: its finishing stage.

**The finishing stage** (:func:`finish`).  The engine's solvers (:mod:`.numpy_backend`)
find each row's threshold in float64; this stage turns it into the correctly rounded answer
of the real-number problem (Ziv's strategy), for every row at once:

1. the candidates: the entries with ``x - max > A0 - 1/a1 - mu`` (``A0`` the solver's
   threshold relative to the row's maximum, ``mu`` a margin of 1e-9 of the row's scale),
   gathered into a padded (rows, k) array; ``y = x - max`` exactly, as a double-word
   (TwoSum);
2. the threshold to double-word precision, with a rigorous radius: Newton steps on
   ``f(A) = sum_i e_alpha(y_i - A) - 1`` (alpha <= 2: ``A = theta - max``), or on the
   edge probability ``q`` (alpha > 2, :func:`_edge_rows`), each probability evaluated in
   double-word (:mod:`.double_word`) with a bound on its error; then, from the last
   evaluation, ``|A - A*| <= (|f| + E) / (1 - |f| - E)`` (``|f'| >= sum p`` for alpha <= 2,
   and ``>= 1`` in q for alpha > 2), ``E`` the bound on the computed f's error;
   at alpha = 1 ``A = log(sum exp(y))`` directly;
3. every candidate's membership decided against that radius, its probability rounded where
   its error interval does not hold a rounding boundary (:func:`round_dw`), ``tau``
   likewise.

A row where anything is left undecided (an entry within its error bound of a rounding
boundary or of the support's edge, a result below float64's normal range that this stage
does not round, a threshold that did not converge inside the candidates' margin) is
flagged and solved again exactly (:func:`.exact_fallback.entmax_row`).  The numba engine
runs the same stage, compiled, one row at a time (:mod:`.numba.exact_rows`).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from . import double_word as M
from .double_word import CAND_MARGIN, NEWTON_EVALS, NORMAL_MIN, SLACK
from .double_word import (dw_add, dw_add_fp, dw_div, dw_div_fp, dw_mul, dw_mul_fp, exp_dw, fast_two_sum, log1p_dw,
                          log_dw, two_prod, two_sum)
from .exact_fallback import entmax_row, round_real

U2 = M.U2
#: entries per block of rows the stage works on at once (its temporaries stay in cache)
CHUNK = 1 << 15


# ----------------------------------------------------------------------------- rounding
def _half_gaps(c, dtype):
    """Half the distances from ``c`` (values of ``dtype``, as float64) to its neighbours
    above and below in ``dtype``."""
    t = np.dtype(dtype).type
    c_t = c if t is np.float64 else c.astype(t)
    with np.errstate(over="ignore"):
        up = np.nextafter(c_t, t(np.inf)).astype(np.float64, copy=False) - c
        dn = c - np.nextafter(c_t, t(-np.inf)).astype(np.float64, copy=False)
    return 0.5 * up, 0.5 * dn


def round_dw(h, l, err, dtype):
    """The rounding to nearest of ``hi + lo +- err`` in ``dtype`` (float64 or float32), and
    whether it is decided: every value within ``err`` (absolute) of ``h + l`` rounds to
    it.  ``(h, l)`` normalised, ``|h| >= NORMAL_MIN`` (else not decided)."""
    c = h.astype(dtype).astype(np.float64, copy=False)
    d = (h - c) + l  # h - c is exact (c is h rounded to a coarser grid)
    up, dn = _half_gaps(c, dtype)
    e = err * SLACK
    ok = (d + e < up / SLACK) & (d - e > -dn / SLACK) & (np.abs(h) >= NORMAL_MIN)
    return c.astype(dtype, copy=False), ok


def round_scaled(e, h, l, err, dtype):
    """:func:`round_dw` of ``2^e (h + l)`` with absolute error ``2^e err`` (``h`` near 1),
    results below ``NORMAL_MIN`` included (decided on float64's grid there, 2^-1074 for a
    subnormal result)."""
    v = np.ldexp(h, e)
    normal = np.abs(v) >= NORMAL_MIN
    c, ok = round_dw(v, np.ldexp(l, e), np.ldexp(err, e), dtype)
    if normal.all():
        return c, ok
    # below NORMAL_MIN the low part of a double-word no longer resolves the value: the test
    # runs in h's units, on float64's grid at c64 (its last place, 2^-1074 for a subnormal)
    c64 = np.where(normal, 0.0, v)  # ldexp rounds h once, to that grid

    def offset(c):  # h + l - c and half the gaps above and below c, in h's units (exact)
        with np.errstate(over="ignore"):
            return ((h - np.ldexp(c, -e)) + l, 0.5 * np.ldexp(np.nextafter(c, np.inf) - c, -e),
                    0.5 * np.ldexp(c - np.nextafter(c, -np.inf), -e))

    d, up, dn = offset(c64)
    # h alone on a midpoint of the grid, rounded away from the side l lies on: the neighbour
    c64 = np.where(d > up, np.nextafter(c64, np.inf), np.where(d < -dn, np.nextafter(c64, -np.inf), c64))
    d, up, dn = offset(c64)
    sub_ok = (d + err * SLACK < up / SLACK) & (d - err * SLACK > -dn / SLACK)
    if np.dtype(dtype) == np.float32:  # every value this small is 0 in float32
        c64 = np.zeros_like(c64)
        sub_ok = np.abs(v) < 2.0 ** -200
    return np.where(normal, c, c64.astype(dtype)), np.where(normal, ok, sub_ok)


# ----------------------------------------------------------------------------- sums
def row_sums(h, l):
    """Per row of ``(h, l)`` (rows, k) double-words: their sum as a double-word and a bound
    on its error, by a pairwise tree of TwoSums (errors and low parts summed alongside)."""
    absum = np.abs(h).sum(axis=1) * SLACK + np.abs(l).sum(axis=1)
    levels = 0
    while h.shape[1] > 1:
        if h.shape[1] % 2:
            h = np.concatenate([h, np.zeros((len(h), 1))], axis=1)
            l = np.concatenate([l, np.zeros((len(l), 1))], axis=1)
        s, e = two_sum(h[:, 0::2], h[:, 1::2])
        h, l = s, (l[:, 0::2] + l[:, 1::2]) + e
        levels += 1
    if h.shape[1] == 0:
        z = np.zeros(len(h))
        return z, z, z
    sh, sl = fast_two_sum(h[:, 0], l[:, 0])
    return sh, sl, (levels + 2) ** 2 * U2 * absum


# ----------------------------------------------------------------------------- candidates
def _gather(x, cand):
    """The candidates of each row first (padded with the row's largest entry, masked off):
    (columns, values, valid), each (rows, k)."""
    k = int(cand.sum(axis=1).max(initial=0))
    cols = np.argsort(~cand, axis=1, kind="stable")[:, :k]
    valid = np.take_along_axis(cand, cols, axis=1)
    return cols, np.take_along_axis(x, cols, axis=1), valid


class _Rows:
    """The outputs of a group of rows, filled by the stages below."""

    def __init__(self, rows: int, n: int, dtype):
        self.p = np.zeros((rows, n), dtype)
        self.tau = np.zeros(rows)
        self.theta = np.zeros(rows)
        self.support = np.zeros(rows, np.int64)
        self.bad = np.zeros(rows, bool)


def _tau_round(th, tl, err, rows: _Rows, single=None, top=None, a1=None):
    """tau (a double-word with absolute error bound ``err``) rounded in the rows' output
    dtype, or the row flagged.  Rows whose ``single`` entry of value ``top`` is their whole
    support have ``p = 1`` there, ``A = 0`` and ``tau = a1 top - 1`` exactly: rounded from
    the exact rational (such a tau is often a rounding midpoint, which no error bound
    decides)."""
    dtype = rows.p.dtype
    c, ok = round_dw(th, tl, err, dtype)
    c = c.astype(np.float64)
    if single is not None:
        for r in np.flatnonzero(single):
            c[r] = round_real(Fraction(float(a1[r])) * Fraction(float(top[r])) - 1, dtype)
        ok = ok | single
    rows.tau[:] = c
    rows.bad |= ~ok


# ----------------------------------------------------------------------------- alpha = 1
def _softmax_rows(x, out: _Rows):
    """alpha = 1: ``A = log(sum exp(y))``, ``p = exp(y) / sum exp(y)``."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    yh, yl = two_sum(np.where(live, x, m[:, None]), -m[:, None])
    far = ~live | ~(yh >= -M.EXP_MAX)  # a gap beyond float64's range gives NaN here: far
    yh, yl = np.where(far, 0.0, yh), np.where(far, 0.0, yl)
    e, eh, el = exp_dw(yh, yl)
    eh, el = np.where(far, 0.0, eh), np.where(far, 0.0, el)
    # the sum of the scaled terms; one below the normal range loses at most 2^-1074 (and a
    # far term is below e^-1400): the sum is at least 1
    termh, terml = np.ldexp(eh, e), np.ldexp(el, e)
    sh, sl, serr = row_sums(termh, terml)
    n = x.shape[1]
    serr = serr + M.EPS_EXP * sh * SLACK + n * 2.0 ** -1070
    rel_s = serr / sh * SLACK  # relative error of S
    mh, ml = dw_div(eh, el, sh[:, None], sl[:, None])
    rel_p = (M.EPS_EXP + rel_s[:, None] + M.DW_DIV * U2) * SLACK
    c, ok = round_scaled(e, mh, ml, rel_p * np.abs(mh), out.p.dtype)
    out.p[:] = np.where(live, c, 0)
    out.bad |= ~np.where(live & ~far, ok, True).all(axis=1)  # a far entry's p is below 2^-1076: 0
    lh, ll = log_dw(sh, sl)
    th, tl = dw_add_fp(lh, ll, m)
    err = (M.EPS_LOG * np.abs(lh) + rel_s + M.DW_ADD * U2 * (np.abs(m) + np.abs(lh))) * SLACK
    # tau = m + log1p(s) too, s the sum without one maximum (its term is exactly 1): that
    # bound is relative to s, and decides a tiny tau (a maximum near 0 far above the rest)
    top = np.argmax(np.where(live, x, -np.inf), axis=1)
    rows = np.arange(len(x))
    termh[rows, top], terml[rows, top] = 0.0, 0.0
    qh, ql, qerr = row_sums(termh, terml)
    qerr = (qerr + M.EPS_EXP * qh * SLACK + n * 2.0 ** -1070) * SLACK
    Lh, Ll = log1p_dw(qh, ql)
    t2h, t2l = dw_add_fp(Lh, Ll, m)
    err2 = (M.EPS_LOG * np.abs(Lh) + qerr + M.DW_ADD * U2 * (np.abs(m) + np.abs(Lh))) * SLACK
    use = err2 < err
    th, tl, err = np.where(use, t2h, th), np.where(use, t2l, tl), np.where(use, err2, err)
    _tau_round(th, tl, err, out)
    out.theta[:] = out.tau if out.p.dtype == np.float64 else th
    out.support[:] = live.sum(axis=1)


# ----------------------------------------------------------------------------- 1 < alpha <= 2
def _eval_a(yh, yl, valid, Ah, Al, a1, kind):
    """Probabilities of the candidates at ``A`` (double-word), each with a bound on its
    relative error, and what the Newton step and the support test need.  ``kind``: 2
    (sparsemax), 15 (1.5-entmax) or 0 (any other alpha in (1, 2)).  Returns (ph, pl,
    rel, u, vh, vl, dv): ``u = p / v`` (float64), ``v = 1 + a1 (y - A)`` as a double-word
    and ``dv`` a bound on its absolute error."""
    dh, dl = dw_add(yh, yl, -Ah, -Al)
    wh, wl = dw_mul_fp(dh, dl, a1)
    dw_err = (M.DW_ADD + 2.0) * U2 * np.abs(wh) * SLACK  # d's and w's roundings, on w
    vh, vl = dw_add_fp(wh, wl, 1.0)
    dv = dw_err + M.DW_ADD * U2 * np.abs(vh)
    alive = valid & ((vh > 0) | ((vh == 0) & (vl > 0)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        vpos = np.where(alive, vh, 1.0)
        if kind == 2:
            ph, pl = vh, vl
            rel = dv / vpos
        elif kind == 15:
            ph, pl = dw_mul(vh, vl, vh, vl)
            rel = 2.0 * dv / vpos * 1.01 + M.DW_MUL * U2
        else:
            w_ok = np.where(alive, wh, 0.0), np.where(alive, wl, 0.0)
            Lh, Ll = log1p_dw(*w_ok)
            zh, zl = dw_div_fp(Lh, Ll, a1)
            zh = np.maximum(zh, -M.EXP_MAX)
            e, eh, el = exp_dw(zh, zl)
            ph, pl = np.ldexp(eh, e), np.ldexp(el, e)
            dz = (dw_err / vpos + M.EPS_LOG * np.abs(Lh)) / a1 + 3.0 * U2 * np.abs(zh)
            rel = M.EPS_EXP + 1.01 * dz
        rel = rel * SLACK
        ph, pl = np.where(alive, ph, 0.0), np.where(alive, pl, 0.0)
        u = np.where(alive, ph / vpos, 0.0)
    return ph, pl, np.where(alive, rel, 0.0), u, vh, vl, dv


def _alpha_rows(x, a1, A0, out: _Rows, kind):
    """1 < alpha <= 2 (``kind`` as in :func:`_eval_a`), ``a1`` (rows,), from the solver's
    threshold ``A0`` relative to the row's maximum."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    W = 1.0 / a1
    mu = CAND_MARGIN * (1.0 + A0 + W)
    # the candidates: y = x - m > A0 - W - mu (y rounded: the margin covers it)
    with np.errstate(over="ignore", invalid="ignore"):
        cand = live & ((x - m[:, None]) > (A0 - W - mu)[:, None])
    cols, xc, valid = _gather(x, cand)
    xc = np.where(valid, xc, m[:, None])
    yh, yl = two_sum(xc, -m[:, None])
    a = a1[:, None]
    Ah, Al = A0.copy(), np.zeros_like(A0)
    n = x.shape[1]
    for it in range(NEWTON_EVALS):
        ph, pl, rel, u, vh, vl, dv = _eval_a(yh, yl, valid, Ah[:, None], Al[:, None], a, kind)
        sh, sl, serr = row_sums(ph, pl)
        Fh, Fl = dw_add_fp(sh, sl, -1.0)
        E = (serr + (rel * np.abs(ph)).sum(axis=1) * SLACK + n * 2.0 ** -1070) * SLACK
        done = np.abs(Fh) <= 4.0 * E
        if done.all() or it == NEWTON_EVALS - 1:
            break
        su = u.sum(axis=1)
        step = np.where(done | ~(su > 0), 0.0, Fh / np.where(su > 0, su, 1.0))
        Ah, Al = dw_add_fp(Ah, Al, step)
    F = (np.abs(Fh) + E) * SLACK
    RA = F / (1.0 - F) * SLACK
    # the candidates stay valid: the threshold moved less than their margin
    out.bad |= ~(np.abs(Ah - A0) + RA < 0.5 * mu) | ~(F < 0.5)
    # membership: v* = 1 + a1 (y - A*) against |v* - v| <= dv + a1 R_A
    slack = (dv + a * RA[:, None]) * SLACK
    vlow = vh - np.abs(vl) - slack
    inside = valid & (vlow > 0)
    outside = ~valid | (vh + np.abs(vl) + slack <= 0)
    decided = (inside | outside).all(axis=1)
    out.bad |= ~decided
    with np.errstate(divide="ignore", invalid="ignore"):
        relA = np.where(inside, RA[:, None] / np.where(inside, vlow, 1.0), 0.0) * 1.01
    tot = (rel + relA) * SLACK
    c, ok = round_dw(ph, pl, tot * np.abs(ph), out.p.dtype)
    single = decided & (inside.sum(axis=1) == 1)  # the maximum alone: p = 1, A = 0
    c = np.where(single[:, None], 1.0, c).astype(out.p.dtype)
    out.bad |= ~np.where(inside, ok, True).all(axis=1) & ~single
    np.put_along_axis(out.p, cols, np.where(inside, c, 0), axis=1)
    out.support[:] = inside.sum(axis=1)
    # tau = a1 (m + A) - 1; theta = m + A
    Ph, Pl = two_prod(a1, m)
    Qh, Ql = dw_mul_fp(Ah, Al, a1)
    th, tl = dw_add(Ph, Pl, Qh, Ql)
    th, tl = dw_add_fp(th, tl, -1.0)
    err = (a1 * RA + 3.0 * M.DW_ADD * U2 * (np.abs(Ph) + np.abs(Qh) + 1.0)) * SLACK
    _tau_round(th, tl, err, out, single, m, a1)
    out.theta[:] = np.where(single, m, dw_add_fp(Ah, Al, m)[0])
    out.bad |= ~(np.abs(m) < 2.0 ** 990)  # Dekker's split and the tau products stay in range


# ----------------------------------------------------------------------------- alpha > 2
def _edge_rows(x, a1, xc0, q0, out: _Rows):
    """alpha > 2 in the edge probability ``q`` of a reference entry ``x_c`` of the support
    (the solver's smallest: ``xc0``, with probability ``q0``): ``s = q^a1 = a1 (x_c -
    T)``, ``p_j = (s + a1 (x_j - x_c))^(1/a1)``, and the mass ``G(q) = sum p - 1``
    increases in q with slope at least 1 (the reference entry's own term), so that
    ``|q - q*| <= |G(q)| + E``.  Newton's steps on q from the right converge monotonically
    (G is convex)."""
    live = np.isfinite(x)
    m = np.where(live, x, -np.inf).max(axis=1)
    W = 1.0 / a1
    cv = xc0 - m  # in y = x - m, where the candidates are chosen
    mu = CAND_MARGIN * (1.0 + np.abs(cv) + W)
    line = np.minimum(cv - np.exp(a1 * np.log(np.maximum(q0, 1e-300))) / a1, cv) - mu
    with np.errstate(over="ignore", invalid="ignore"):
        cand = live & ((x - m[:, None]) > line[:, None])
    cols, xs, valid = _gather(x, cand)
    xs = np.where(valid, xs, xc0[:, None])
    dh, dl = two_sum(xs, -xc0[:, None])
    edge = valid & (dh == 0) & (dl == 0)
    a = a1[:, None]
    adh, adl = dw_mul_fp(dh, dl, a)
    qh, ql = q0.copy(), np.zeros_like(q0)
    n = x.shape[1]
    for it in range(NEWTON_EVALS + 2):
        Lqh, Lql = log_dw(qh, ql)
        zh, zl = dw_mul_fp(Lqh, Lql, a1)
        es, s1, s2 = exp_dw(np.maximum(zh, -M.EXP_MAX), zl)
        shh, shl = np.ldexp(s1, es), np.ldexp(s2, es)  # s = q^a1 (tiny s: below 2^-1074 it is 0)
        s_err = (M.EPS_EXP + (M.EPS_LOG * np.abs(Lqh) + M.DW_MUL * U2 * np.abs(zh)) * 1.01) * np.abs(shh) + 2.0 ** -1070
        vh, vl = dw_add(adh, adl, shh[:, None], shl[:, None])
        dv = (M.DW_ADD + 2.0) * U2 * (np.abs(adh) + np.abs(vh)) + s_err[:, None]
        alive = valid & ((vh > 0) | ((vh == 0) & (vl > 0)))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            vpos = np.where(alive, vh, 1.0)
            Lh, Ll = log_dw(vpos, np.where(alive, vl, 0.0))
            gh, gl = dw_div_fp(Lh, Ll, a)
            e, eh, el = exp_dw(np.maximum(gh, -M.EXP_MAX), gl)
            ph, pl = np.ldexp(eh, e), np.ldexp(el, e)
            rel = (M.EPS_EXP + ((dv / vpos + M.EPS_LOG * np.abs(Lh)) / a + 3.0 * U2 * np.abs(gh)) * 1.01) * SLACK
            ph = np.where(edge, qh[:, None], np.where(alive, ph, 0.0))
            pl = np.where(edge, ql[:, None], np.where(alive, pl, 0.0))
            rel = np.where(edge, 0.0, np.where(alive, rel, 0.0))
            slope = np.where(alive | edge, np.exp(np.minimum((a - 1.0) * (np.log(qh)[:, None] - np.log(np.where(ph > 0, ph, 1.0))), 700.0)), 0.0)
        sh, sl, serr = row_sums(ph, pl)
        Gh, Gl = dw_add_fp(sh, sl, -1.0)
        E = (serr + (rel * np.abs(ph)).sum(axis=1) * SLACK + n * 2.0 ** -1070) * SLACK
        done = np.abs(Gh) <= 4.0 * E
        if done.all() or it == NEWTON_EVALS + 1:
            break
        gp = slope.sum(axis=1)
        step = np.where(done, 0.0, Gh / np.maximum(gp, 1.0))
        nh, nl = dw_add_fp(qh, ql, -step)
        pos = nh > 0
        qh, ql = np.where(pos, nh, 0.5 * qh), np.where(pos, nl, 0.0)
    Rq = (np.abs(Gh) + E) * SLACK
    qhi = qh + Rq
    with np.errstate(divide="ignore", over="ignore"):
        dq_s = a1 * np.exp((a1 - 1.0) * np.log(qhi)) * Rq * SLACK  # |ds| from |dq| (s' = a1 q^(a1-1))
    ds = dq_s + s_err
    out.bad |= ~(qh - Rq > 0)  # the reference entry is in the support
    # T* - m = cv - s*/a1 stays above the candidates' line
    out.bad |= ~(cv - (shh + ds) / a1 * SLACK > line + 0.5 * mu)
    slack = (dv + ds[:, None]) * SLACK
    vlow = vh - np.abs(vl) - slack
    inside = edge | (valid & (vlow > 0))
    outside = ~valid | (~edge & (vh + np.abs(vl) + slack <= 0))
    decided = (inside | outside).all(axis=1)
    out.bad |= ~decided
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # d log p / dq = q^(a1-1) / v; at the reference entry p = q
        relq = np.where(edge, Rq[:, None] / qh[:, None],
                        np.where(inside, (dq_s / a1)[:, None] / np.where(inside, vlow, 1.0), 0.0)) * 1.01
    tot = (rel + relq) * SLACK
    c, ok = round_dw(ph, pl, tot * np.abs(ph), out.p.dtype)
    single = decided & (inside.sum(axis=1) == 1)  # the reference entry alone: p = q = 1
    c = np.where(single[:, None], 1.0, c).astype(out.p.dtype)
    out.bad |= ~np.where(inside, ok, True).all(axis=1) & ~single
    np.put_along_axis(out.p, cols, np.where(inside, c, 0), axis=1)
    out.support[:] = inside.sum(axis=1)
    # tau = a1 x_c - s; theta = x_c + (1 - s) / a1
    Ph, Pl = two_prod(a1, xc0)
    th, tl = dw_add(Ph, Pl, -shh, -shl)
    err = (ds + 2.0 * M.DW_ADD * U2 * (np.abs(Ph) + np.abs(shh))) * SLACK
    _tau_round(th, tl, err, out, single, m, a1)
    out.theta[:] = np.where(single, m, xc0 + (1.0 - shh) / a1)
    out.bad |= ~(np.abs(m) < 2.0 ** 990) | ~(np.abs(xc0) < 2.0 ** 990)


# ----------------------------------------------------------------------------- float32 rows
#: the bound the float32 test takes for the solvers' threshold error (``A`` at alpha <= 2,
#: the edge probability ``q`` above 2; the solvers converge to a few float64 ulps), proven
#: per row from the row's own residual (:func:`float32_rows`)
F32_SOLVER_ERR = 2.0 ** -44
#: numpy's row sums are pairwise: their error is at most this many float64 unit roundoffs
#: plus log2(n), of the sum of the terms' magnitudes
_PAIRWISE_ULPS = 32.0


def float32_rows(x, alpha, A, p):
    """The float32 rows that the solvers' float64 arithmetic already decides (Ziv's test on
    the float32 grid): ``x`` (rows, n) float64 holding float32 values, the solvers'
    threshold ``A`` (``theta - max x``, -inf for a row with no finite entry) and float64
    probabilities ``p``.  Each probability is known to ``e = rel p + D s`` (``rel`` its
    evaluation's relative error, ``D`` = :data:`F32_SOLVER_ERR` the threshold's, ``s``
    the probability's sensitivity to the threshold: ``p`` at alpha = 1, ``p^(2 - alpha)``
    at 1 < alpha <= 2 (at most 1; ``v = 1 + a1 (y - A)``), at most 1 in ``q`` above); a row is kept
    when every ``p +- e`` rounds to one float32 (and stays positive), no entry outside the
    support is within its error of the threshold, ``tau +- e_tau`` rounds to one float32,
    and the row's residual ``|sum p - 1|`` (with its own error) proves the threshold within
    ``D`` (the mass's slope is at least ``1 - |f|`` in ``A``, at least 1 in ``q``).
    Returns (p float32, tau float64 holding a float32, support, bad): ``bad`` the rows
    left to :func:`finish`."""
    rows, n = x.shape
    p32 = np.zeros((rows, n), np.float32)
    tau = np.full(rows, -np.inf)
    support = np.zeros(rows, np.int64)
    bad = np.zeros(rows, bool)
    if n == 0:  # rows without entries: p empty, tau = -inf, support 0
        return p32, tau, support, bad
    step = max(1, CHUNK // max(n, 1))
    with np.errstate(all="ignore"):
        for r0 in range(0, rows, step):
            sl = slice(r0, r0 + step)
            p32[sl], tau[sl], support[sl], bad[sl] = _float32_block(x[sl], alpha[sl], A[sl], p[sl])
    return p32, tau, support, bad


def _float32_block(x, alpha, A, p):
    """:func:`float32_rows` of one block of rows (floating-point warnings off)."""
    u, D = M.U, F32_SOLVER_ERR
    n = x.shape[1]
    live_x = np.isfinite(x)
    live = np.isfinite(A)
    m = np.where(live_x, x, -np.inf).max(axis=1, initial=-np.inf)
    a1 = alpha - 1.0
    a = a1[:, None]
    soft, big = (a1 == 0.0)[:, None], (a1 > 1.0)[:, None]
    y = np.where(live_x, x - m[:, None], 0.0)
    Ar = np.where(live, A, 0.0)
    d = y - Ar[:, None]
    ay, ad = np.abs(y), np.abs(d)
    on = p > 0
    lp = np.abs(np.log(np.where(on, p, 1.0)))
    # alpha > 2: the reference entry c (the smallest of the support) and q = p_c
    q = np.where(on, p, np.inf).min(axis=1)
    lq = np.abs(np.log(np.where(np.isfinite(q), q, 1.0)))
    # the evaluation's relative error: the roundings of y, d, a1 d and 1 + a1 d carried
    # through v^(1/a1) (u (|y| + 2 |d|) / v), the logarithm and exponential (2 |log p| u),
    # a few more roundings; twice that
    v = 1.0 + a * d
    gamma = 2.0 * u * (a * (ay + ad) + 1.0)  # v's own error
    vlow = v - 2.0 * a * D - gamma
    rel = 2.0 * u * np.where(soft, ay + ad + 4.0,
                             np.where(big, 16.0 + 2.0 * lp + 2.0 * lq[:, None], (ay + 2.0 * ad) / v + 2.0 * lp + 4.0))
    # |dp/dA| = p^(2 - alpha) = v^(1/a1 - 1) grows with v: at most its value at v + 2 a1 D
    sens = np.where(soft, p, np.where(big, 1.0, np.minimum(1.0, p / vlow * np.exp((2.0 * D + gamma / a) / vlow))))
    e = (rel * p + D * sens) * SLACK
    lo, hi = p - e, p + e
    und = on & ((lo.astype(np.float32) != hi.astype(np.float32)) | ~(lo > 0.0))
    und |= on & ~soft & ~big & ~(vlow > 0.0)
    # entries outside the support within reach of the threshold
    ref = np.where(on, x, np.inf).min(axis=1)
    s = np.exp(a1 * np.log(np.where(np.isfinite(q), q, 1.0)))  # q^a1 (may underflow: then the edge is far)
    vb = np.where(big, a * (x - ref[:, None]) + s[:, None], v)
    reach = np.where(big, a * D + 2.0 * u * (a * np.abs(x - ref[:, None]) + s[:, None]), 2.0 * a * D + gamma)
    und |= live_x & ~on & ~soft & ~(vb + reach <= 0.0)
    # the residual: the threshold within D
    sh, sl_, serr = row_sums(p, np.zeros_like(p))
    F = np.abs((sh - 1.0) + sl_)
    E = (serr + (rel * p).sum(axis=1) * (1.0 + (_PAIRWISE_ULPS + np.log2(max(n, 2))) * u) + n * 2.0 ** -1070) * SLACK
    radius = (F + E) / (1.0 - F - E) * SLACK
    # tau = theta at alpha 1, a1 theta - 1 above; theta = m + A to D and a few roundings
    theta = m + Ar
    inv = np.where(a1 > 0.0, 1.0 / np.where(a1 > 0.0, a1, 1.0), 0.0)
    e_theta = D + 4.0 * u * (np.abs(Ar) + 2.0 * inv + 1.0) + 2.0 * u * np.abs(theta)
    t = np.where(a1 == 0.0, theta, a1 * theta - 1.0)
    e_tau = np.where(a1 == 0.0, e_theta, a1 * e_theta + 2.0 * u * (np.abs(a1 * theta) + np.abs(t))) * SLACK
    tau_ok = (t - e_tau).astype(np.float32) == (t + e_tau).astype(np.float32)
    bad = und.any(axis=1) | ~(radius <= D) | ~tau_ok
    support = np.where(a1 == 0.0, live_x.sum(axis=1), on.sum(axis=1))
    tau = t.astype(np.float32).astype(np.float64)
    p32 = p.astype(np.float32)
    sp = a1 == 1.0
    if sp.any():  # sparsemax: rational, exactly
        p32[sp], tau[sp], bad[sp] = _sparse32(x[sp], on[sp])
    return p32, np.where(live, tau, -np.inf), np.where(live, support, 0), live & bad


def _div32(num, k):
    """``num / k`` (float64 ``num``, integers ``k``, both exact) rounded once to float32:
    the float64 quotient q, except where q is itself a float32 rounding midpoint and not the
    exact value, where the sign of ``q k - num`` (exact: TwoProd) says which way."""
    q = num / k
    ph, pl = two_prod(q, k)
    r = (ph - num) + pl  # ph - num is exact (Sterbenz)
    c = q.astype(np.float32)
    c64 = c.astype(np.float64)
    up, dn = _half_gaps(c64, np.float32)
    mid = ((q - c64 == up) | (q - c64 == -dn)) & (r != 0.0)
    nudged = np.nextafter(q, np.where(r < 0.0, np.inf, -np.inf)).astype(np.float32)
    return np.where(mid, nudged, c)


def float32_midpoints(v):
    """Where the float64 values ``v`` are float32 rounding midpoints (halfway between two
    neighbouring float32 values): a float32 value rounded from such a float64 value may be
    the exact value's rounding or not."""
    with np.errstate(over="ignore", invalid="ignore"):
        c = v.astype(np.float32).astype(np.float64)
        up, dn = _half_gaps(c, np.float32)
        d = v - c
        return (d != 0.0) & ((d == up) | (d == -dn))


def _sparse32(x, on):
    """Sparsemax rows of float32 values ``x`` (float64, -inf masked) on the solvers' support
    ``on``, exactly: with ``k = |S|`` and ``N = sum_S x - 1``, ``tau = N / k`` and ``p_i =
    (k x_i - N) / k``; where every ``x_i`` of S is a multiple of a grid ``g <= 1`` (their
    finest float32 spacing) and ``k max|x| + sum|x| + 1 < 2^52 g``, the sums and products
    are exact in float64, so that ``S`` is proven the support (``k x_i > N`` exactly on S
    and nowhere else) and every value is one division, rounded once (:func:`_div32`).
    Returns (p float32, tau, bad): ``bad`` where the grid condition or the support fails."""
    xs = np.where(on, x, 0.0)
    ax = np.abs(xs)
    k = on.sum(axis=1).astype(np.float64)
    g = np.minimum(np.where(on, np.spacing(ax.astype(np.float32)).astype(np.float64), np.inf).min(axis=1), 1.0)
    ok = k * ax.max(axis=1) + ax.sum(axis=1) + 1.0 < 2.0 ** 52 * g
    N = xs.sum(axis=1) - 1.0
    kx = k[:, None] * x
    live_x = np.isfinite(x)
    ok &= np.where(on, kx > N[:, None], ~live_x | (kx <= N[:, None])).all(axis=1) & (k > 0)
    kk = np.maximum(k, 1.0)
    p = np.where(on, _div32(np.where(on, kx - N[:, None], 0.0), kk[:, None]), np.float32(0.0))
    tau = _div32(N, kk).astype(np.float64)
    return p, tau, ~ok


def refine(x, alpha, A0, p0, dtype):
    """The correctly rounded rows of float64 ``x`` (rows, n) with a finite entry each, from
    the solver's threshold ``A0`` (relative to the row's maximum: ``theta - max x``) and
    float64 probabilities ``p0`` (alpha > 2 takes its reference entry from them): returns
    (p in ``dtype``, tau, theta, support, bad), ``bad`` the rows left to
    :func:`entmax_row`."""
    rows, n = x.shape
    res = _Rows(rows, n, dtype)
    kinds = np.where(alpha == 1.0, 1, np.where(alpha == 2.0, 2, np.where(alpha == 1.5, 15, np.where(alpha > 2.0, 3, 0))))
    step = max(1, CHUNK // max(n, 1))
    for kind, r0 in ((kind, r0) for kind in (1, 2, 15, 0, 3) for r0 in range(0, rows, step)):
        sel = r0 + np.flatnonzero(kinds[r0:r0 + step] == kind)
        if not sel.size:
            continue
        part = _Rows(len(sel), n, dtype)
        xs = x[sel]
        # overflow and NaN in rows near float64's limits are expected: such a row is flagged
        # (its maximum beyond 2^990) or its far entries are recognised as far
        with np.errstate(all="ignore"):
            if kind == 1:
                _softmax_rows(xs, part)
            elif kind == 3:
                ps = p0[sel]
                on = ps > 0
                j = np.argmin(np.where(on, xs, np.inf), axis=1)
                xc0 = xs[np.arange(len(sel)), j]
                q0 = ps[np.arange(len(sel)), j]
                _edge_rows(xs, alpha[sel] - 1.0, xc0, q0, part)
            else:
                _alpha_rows(xs, alpha[sel] - 1.0, A0[sel], part, kind)
        res.p[sel], res.tau[sel], res.theta[sel] = part.p, part.tau, part.theta
        res.support[sel], res.bad[sel] = part.support, part.bad
    return res.p, res.tau, res.theta, res.support, res.bad


def finish(x, alpha, A0, p0, dtype):
    """The correctly rounded rows (:func:`refine`, then :func:`entmax_row` for
    the rows it leaves) of float64 ``x`` (rows, n) from the solver's ``A0`` (``theta - max
    x``, -inf for a row with no finite entry) and float64 ``p0``: returns (p in ``dtype``, tau, theta, support); a row with no finite entry
    keeps p = 0, theta = tau = -inf, support 0."""

    rows, n = x.shape
    p = np.zeros((rows, n), dtype)
    tau = np.full(rows, -np.inf)
    theta = np.full(rows, -np.inf)
    support = np.zeros(rows, np.int64)
    live = np.flatnonzero(np.isfinite(A0))
    if live.size:
        pr, tr, hr, sr, bad = refine(x[live], alpha[live], A0[live], p0[live], dtype)
        bad |= alpha[live] >= 2.0 ** 52  # alpha - 1 must be exact in float64
        p[live], tau[live], theta[live], support[live] = pr, tr, hr, sr
        for i in np.flatnonzero(bad):
            r, hint = live[i], float(hr[i])
            p[r], tau[r], theta[r], support[r] = entmax_row(x[r], alpha[r], dtype, hint if np.isfinite(hint) else None)
    return p, tau, theta, support
