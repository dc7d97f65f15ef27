"""Correctly rounded rows in numba: the finishing stage that runs after the row solvers
(:mod:`.rows`), as an entry kernel of its own, in double-word arithmetic
(:mod:`.double_word`): on float64 rows, and on the float32 rows at 1 < alpha <= 2 that the
float32 rounding test leaves undecided (exactly widened, from the solver's ``theta``,
outputs and ``tau`` rounded to float32: the flag ``f32`` at run time).

**The finishing stage**: the NumPy engine's (:mod:`entmax_ref.backends.exact_rows`, whose
docstring describes it), one row at a time.  The solvers' float64 answer gives the start:
at 1 < alpha <= 2 the threshold ``A0 = theta - m`` (relative to the row's maximum ``m``) is
recovered from the solver's largest output, ``p_max = e_alpha(-A0)`` (accurate to an ulp
however large ``m`` is); at alpha > 2 the reference entry is the solver's smallest support
entry and its probability.  From there: the candidates' probabilities in double-word with an
error bound each, Newton steps on the threshold until the computed mass is within its own
error bound of 1, the threshold's radius from the last evaluation, membership decided
against it, every output and ``tau`` rounded where its error interval holds no rounding
boundary of the target format.  A row left undecided returns ``ok = False``; the Python side then solves it with
:func:`entmax_ref.backends.exact_rows.entmax_row`.

Its entry kernels, one per stage, are in :mod:`.exact_finish`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import double_word as M
from ._jit import jit
from .candidates import gather_alive
from .double_word import (dw_add, dw_add_fp, dw_div, dw_div_fp, dw_mul, dw_mul_fp, exp_dw, exp_lean, fast_two_sum, fma,
                          half_gaps, log1p_dw, log1p_dw_sel, log_dw, nearest_even, neighbours, pow2, round_dw, round_scaled,
                          round_signed, scale2, sum_sign, tau_alone, two_prod, two_sum)
from .elementwise import K_GEN
from .vexp import div


U2 = M.U2
SLACK, CAND_MARGIN, NORMAL_MIN, NEWTON_EVALS = M.SLACK, M.CAND_MARGIN, M.NORMAL_MIN, M.NEWTON_EVALS
_EPS_EXP, _EPS_EXP_LEAN, _EPS_LOG, _EXP_MAX = M.EPS_EXP, M.EPS_EXP_LEAN, M.EPS_LOG, M.EXP_MAX
_DW_ADD, _DW_MUL, _DW_DIV = M.DW_ADD, M.DW_MUL, M.DW_DIV
_TINY_ABS = 2.0 ** -1070  # the absolute error of a term below the normal range

#: kinds of the map, as :mod:`entmax_ref.backends.exact_rows`': sparsemax p = v, 1.5-entmax p = v^2, else exp(log(v)/a1)
KIND_SPARSE = 2
KIND_15 = 15
KIND_GEN = 0


@jit
def _one_boundary(h, l, err, f32):
    """Whether the error interval ``h + l +- err`` (``h >= 0``) holds at most one rounding
    boundary of the target format: the one nearest ``h + l`` (:func:`.double_word.neighbours`).
    With ``c`` the rounding of ``h`` and ``d = h + l - c`` (at most about a half gap), the
    boundaries next to ``c`` lie ``up`` above and ``dn`` below it and the farther ones at
    least twice as far, so a radius below both half gaps reaches the nearest boundary at
    most, wherever ``d`` lies, an exact rounding midpoint included.  A float64 ``c`` below
    ``NORMAL_MIN`` is left to the exact solver (:func:`.double_word.half_gaps` and the exact
    products of :func:`_sparse_ties` hold from there on)."""
    c = np.float64(np.float32(h)) if f32 else h
    up, dn = half_gaps(c, f32)
    return err * SLACK < min(up, dn) and (f32 or c >= NORMAL_MIN)


@jit
def _sparse_ties(x, idx, inside, k, ks, ph, pl, good, err, th, tl, terr, out, f32):
    """Sparsemax rows whose rounding tests left outputs (or tau) undecided, each within its
    error bound (``err[j]``, ``terr``) of one rounding midpoint c: the values are
    rational, ``p_i = (ks x_i - sigma + 1) / ks`` and ``tau = (sigma - 1) / ks`` (``sigma``
    the support's sum, ``ks`` its size), so the exact sign of ``ks (value - c)``, a sum of
    floats (TwoProd makes each product two), decides each: above c, below c, or on it
    (ties to even).  ``inside[j]``, ``good[j]`` (1.0 / 0.0): membership and rounding of
    candidate j.  Rewrites ``out``; returns (tau rounded the same way, ok): not ok where an
    error interval holds more than one boundary (the row is left to the exact solver)."""
    ok = _one_boundary(abs(th), abs(tl), terr, f32)
    for j in range(k):
        if inside[j] != 0.0 and good[j] == 0.0:
            ok = ok and _one_boundary(ph[j], pl[j], err[j], f32)
    if not ok:
        return th, False
    t = np.empty(ks + 8, np.float64)
    e = np.empty(ks + 8, np.float64)
    nt = 0
    for j in range(k):
        if inside[j] != 0.0:
            t[nt] = -np.float64(x[idx[j]])
            nt += 1
    kf = np.float64(ks)
    for j in range(k):
        if inside[j] == 0.0 or good[j] != 0.0:
            continue
        lo, hi, ch, cl = neighbours(ph[j], pl[j], f32)
        # ks x_i + 1 - sigma - ks c
        t[nt], t[nt + 1] = two_prod(kf, np.float64(x[idx[j]]))
        t[nt + 2] = 1.0
        a, b = two_prod(kf, ch)
        t[nt + 3], t[nt + 4], t[nt + 5] = -a, -b, -kf * cl
        s = sum_sign(t, nt + 6, e)
        out[idx[j]] = hi if s > 0 else (lo if s < 0 else nearest_even(lo, hi, f32))
    # tau = (sigma - 1) / ks: the sign of (sigma - 1 - ks c) is that of -(t sum) - 1 - ks c
    neg = th < 0.0
    h, l = (-th, -tl) if neg else (th, tl)
    lo, hi, ch, cl = neighbours(h, l, f32)
    if neg:  # |tau| = (1 - sigma) / ks: the sign of (1 - sigma - ks c)
        t[nt] = 1.0
    else:
        for j in range(nt):
            t[j] = -t[j]
        t[nt] = -1.0
    a, b = two_prod(kf, ch)
    t[nt + 1], t[nt + 2], t[nt + 3] = -a, -b, -kf * cl
    s = sum_sign(t, nt + 4, e)
    v = hi if s > 0 else (lo if s < 0 else nearest_even(lo, hi, f32))
    return (-v if neg else v), True


# ----------------------------------------------------------------------------- 1 < alpha <= 2
@jit(forceinline=True)
def _v_at(yh, yl, Ah, Al, a1):
    """A candidate's ``w = a1 (y - A)`` and ``v = 1 + w`` (double-words) at ``A``, as
    ``exact_rows._eval_a`` forms them: returns (wh, wl, the bound on w's error, vh, vl,
    ``dv`` the bound on v's, whether v > 0)."""
    dh, dl = dw_add(yh, yl, -Ah, -Al)
    wh, wl = dw_mul_fp(dh, dl, a1)
    dw_err = (_DW_ADD + 2.0) * U2 * abs(wh) * SLACK
    vh, vl = dw_add_fp(wh, wl, 1.0)
    dv = dw_err + _DW_ADD * U2 * abs(vh)
    return wh, wl, dw_err, vh, vl, dv, (vh > 0.0) | ((vh == 0.0) & (vl > 0.0))


@jit(forceinline=True)
def _eval_low(yh, yl, Ah, Al, a1, square):
    """One candidate's probability at ``A`` for sparsemax (``p = v``) or, with ``square``,
    1.5-entmax (``p = v^2``), without a branch on the data (the loop of :func:`_eval_all`,
    which LLVM vectorises): returns (ph, pl, rel, u, vh, vl, dv), ``rel`` the relative
    error bound of p, ``u = p / v``; p = 0 (and rel = u = 0) off the support."""
    _, _, _, vh, vl, dv, alive = _v_at(yh, yl, Ah, Al, a1)
    vpos = vh if alive else 1.0
    sh, sl = dw_mul(vh, vl, vh, vl)
    ph = (sh if square else vh) if alive else 0.0
    pl = (sl if square else vl) if alive else 0.0
    rel = (div(2.0 * dv, vpos) * 1.01 + _DW_MUL * U2) if square else div(dv, vpos)
    return ph, pl, (rel * SLACK if alive else 0.0), div(ph, vpos), vh, vl, dv


@jit(forceinline=True)
def _eval_gen(yh, yl, Ah, Al, a1):
    """:func:`_eval_low` at any other 1 < alpha < 2 (``p = v^(1/a1)`` in double-word), also
    without a branch on the data."""
    wh, wl, dw_err, vh, vl, dv, alive = _v_at(yh, yl, Ah, Al, a1)
    Lh, Ll = log1p_dw_sel(wh if alive else 0.0, wl if alive else 0.0)
    zh, zl = dw_div_fp(Lh, Ll, a1)
    zh = zh if zh > -_EXP_MAX else -_EXP_MAX
    e, eh, el = exp_dw(zh, zl)
    s = pow2(e if e > -1022 else -1022)  # below 2^-1022 a term's error is counted absolutely
    vpos = vh if alive else 1.0
    dz = div(div(dw_err, vpos) + _EPS_LOG * abs(Lh), a1) + 3.0 * U2 * abs(zh)
    rel = (_EPS_EXP + 1.01 * dz) * SLACK
    ph = eh * s if alive else 0.0
    return ph, (el * s if alive else 0.0), (rel if alive else 0.0), div(ph, vpos), vh, vl, dv


@jit
def _eval_all(yh, yl, k, Ah, Al, a1, kind, ph, pl, rel, vh, vl, dv, u):
    """Every candidate's probability at ``A`` (:func:`_eval_low`, :func:`_eval_gen`);
    returns ``sum u`` (the Newton step's slope).  Each kind runs a loop of its own, without
    branches and without a sum (a floating-point sum keeps a loop from being vectorised:
    ``u`` is summed after), which LLVM vectorises: several times faster than one candidate
    at a time."""
    if kind == KIND_GEN:
        for j in range(k):
            ph[j], pl[j], rel[j], u[j], vh[j], vl[j], dv[j] = _eval_gen(yh[j], yl[j], Ah, Al, a1)
    else:
        square = kind == KIND_15
        for j in range(k):
            ph[j], pl[j], rel[j], u[j], vh[j], vl[j], dv[j] = _eval_low(yh[j], yl[j], Ah, Al, a1, square)
    su = 0.0
    for j in range(k):
        su += u[j]
    return su


#: :func:`_shift_all` moves a probability by its second-order series where ``|step / v|``
#: is at most this (the third-order term is then below 2^-90 of it)
SHIFT_MAX = 2.0 ** -30
#: the error bound it adds (relative): the series' remainder and the rounding of its terms
SHIFT_ERR = 2.0 ** -82


@jit
def _shift_all(yh, yl, k, Ah, Al, a1, step, ph, pl, rel, vh, vl, dv, u):
    """The candidates' probabilities at ``A`` from those at ``A - step`` (the evaluation
    before a Newton step), without a logarithm or an exponential: with ``v`` the previous
    ``1 + a1 (y - A)`` and ``g = step / v``, ``p(A) = p exp(log1p(-a1 g) / a1) = p (1 - g +
    (1 - a1) g^2 / 2 + O(g^3))``, and ``v(A) = v - a1 step``.  Each probability's error
    bound grows by :data:`SHIFT_ERR`.  An entry with ``|g| > SHIFT_MAX`` (at the support's
    edge) or that the step brings into the support is evaluated again
    (:func:`_eval_gen`).  Returns True (always: the interface of a pass that may decline)."""
    nbad = 0
    for j in range(k):
        alive = ph[j] > 0.0
        vpos = vh[j] if alive else 1.0
        g = div(step, vpos)
        c = -g + (0.5 * (1.0 - a1)) * (g * g)
        nh, nl = dw_add_fp(ph[j], pl[j], ph[j] * c)
        ah = a1 * step
        wh, wl = dw_add_fp(vh[j], vl[j], -ah)
        far = abs(g) > SHIFT_MAX
        born = (~alive) & (wh > 0.0)
        ph[j] = nh if alive else 0.0
        pl[j] = nl if alive else 0.0
        rel[j] = rel[j] + (SHIFT_ERR if alive else 0.0)
        vh[j], vl[j] = wh, wl
        dv[j] = dv[j] + 2.0 ** -53 * abs(ah) + _DW_ADD * U2 * abs(wh)
        u[j] = div(ph[j], wh if alive else 1.0)
        nbad += far | born
    if nbad:
        for j in range(k):
            if abs(step) > SHIFT_MAX * abs(vh[j]) or (ph[j] == 0.0 and vh[j] > 0.0):
                ph[j], pl[j], rel[j], u[j], vh[j], vl[j], dv[j] = _eval_gen(yh[j], yl[j], Ah, Al, a1)
    return True


@jit
def _mass(ph, pl, rel, k):
    """``sum p - 1`` (double-word) over ``(ph, pl)[:k]`` and a bound on its error (a
    compensated sum: TwoSum of the high parts, the errors and low parts summed beside;
    their rounding is at most ``k u`` of their own sum, ``2 k u^2`` of the total), plus the
    terms' own error bounds ``rel p``."""
    s = 0.0
    c = 0.0
    ab = 0.0
    ev = 0.0
    for j in range(k):
        s, e = two_sum(s, ph[j])
        c += e + pl[j]
        ab += ph[j]
        ev += rel[j] * ph[j]
    fh, fl = fast_two_sum(s, c)
    fh, fl = dw_add_fp(fh, fl, -1.0)
    err = ((2.0 * k + 4.0) * U2 * ab + ev + k * _TINY_ABS) * SLACK * SLACK
    return fh, fl, err


@jit
def cr_alpha(x, out, m, a1, kind, A0, idx, yh, yl, ph, pl, rel, vh, vl, dv, u, f32):
    """The correctly rounded row ``x`` (maximum ``m``) at ``1 < alpha = 1 + a1 <= 2``, from
    the solver's ``A0`` (``theta - m``): writes ``out`` at the candidates (the solver left
    every other entry 0) and returns (tau, theta, support, ok); the outputs and ``tau``
    rounded to float64, or with ``f32`` to float32.  ``idx`` (int64) and the
    float64 ``yh`` .. ``dv`` are scratch of the row's length."""
    W = 1.0 / a1
    mu = CAND_MARGIN * (1.0 + A0 + W)
    # the candidates: y > A0 - W - mu, by the solvers' own gather (a1 (y - lo) > -1)
    k = gather_alive(x, m, a1, K_GEN, A0 - mu, yh, idx)
    for j in range(k):
        yh[j], yl[j] = two_sum(np.float64(x[idx[j]]), -m)
    Ah, Al = A0, 0.0
    Fh = 0.0
    E = 0.0
    moved = False
    step = 0.0
    for it in range(NEWTON_EVALS):
        if moved and kind == KIND_GEN and it == 1 and _shift_all(yh, yl, k, Ah, Al, a1, step, ph, pl, rel, vh, vl, dv, u):
            su = 0.0  # the first step, from the evaluation before it (:func:`_shift_all`)
            for j in range(k):
                su += u[j]
        else:
            su = _eval_all(yh, yl, k, Ah, Al, a1, kind, ph, pl, rel, vh, vl, dv, u)
        Fh, Fl, E = _mass(ph, pl, rel, k)
        if abs(Fh) <= 4.0 * E or it == NEWTON_EVALS - 1 or not su > 0.0:
            break
        step = Fh / su
        Ah, Al = dw_add_fp(Ah, Al, step)
        moved = True
    F = (abs(Fh) + E) * SLACK
    RA = F / (1.0 - F) * SLACK
    ok = abs(Ah - A0) + RA < 0.5 * mu and F < 0.5 and abs(m) < 2.0 ** 990
    cnt = np.int64(0)  # it reaches _sparse_ties: not a literal (the package docstring)
    last = -1
    rounded = True
    for j in range(k):  # no branch on the data: a candidate outside the support is written 0
        slack = (dv[j] + a1 * RA) * SLACK
        vlow = vh[j] - abs(vl[j]) - slack
        inside = vlow > 0.0
        tot = (rel[j] + div(RA, vlow if inside else 1.0) * 1.01) * SLACK  # div: no zero-divisor branch
        c, good = round_dw(ph[j], pl[j], tot * ph[j], f32)
        out[idx[j]] = c if inside else 0.0
        good = good | (not inside)
        rounded &= good
        cnt += inside
        last = j if inside else last
        rel[j] = tot * ph[j] if inside else rel[j]  # the absolute error bound, for the ties below
        ok &= inside | (vh[j] + abs(vl[j]) + slack <= 0.0)
        # the membership and the rounding of each candidate, for the ties below
        vh[j] = 1.0 if inside else 0.0
        vl[j] = 1.0 if good else 0.0
    if ok and rounded and cnt == 1:  # the maximum alone: p = 1, A = 0, tau = a1 m - 1 exactly
        out[idx[last]] = 1.0
        return tau_alone(a1, m, f32), m, cnt, ok
    # tau = a1 (m + A) - 1; theta = m + A
    Ph, Pl = two_prod(a1, m)
    Qh, Ql = dw_mul_fp(Ah, Al, a1)
    th, tl = dw_add(Ph, Pl, Qh, Ql)
    th, tl = dw_add_fp(th, tl, -1.0)
    err = (a1 * RA + 3.0 * _DW_ADD * U2 * (abs(Ph) + abs(Qh) + 1.0)) * SLACK
    tau, good = round_signed(th, tl, err, f32)  # on the outputs' grid
    theta = dw_add_fp(Ah, Al, m)[0]
    if ok and kind == KIND_SPARSE and not (rounded and good):  # rational: exact ties
        tau, ok = _sparse_ties(x, idx, vh, k, cnt, ph, pl, vl, rel, th, tl, err, out, f32)
        return tau, theta, cnt, ok
    return tau, theta, cnt, ok and rounded and good


# ----------------------------------------------------------------------------- alpha > 2
@jit
def cr_edge(x, out, m, a1, cv, q0, idx, dh, dl, ph, pl, rel, vh, vl, dv, f32):
    """The correctly rounded row ``x`` at alpha = 1 + a1 > 2, in the edge probability q of
    the reference entry ``x_c`` (the solver's smallest support entry, at ``cv = x_c - m``
    as the solver computed it, with probability ``q0``): ``exact_rows._edge_rows``.  Writes
    ``out`` at the candidates and returns (tau, theta, support, ok)."""
    W = 1.0 / a1
    mu = CAND_MARGIN * (1.0 + abs(cv) + W)
    T0 = cv - math.exp(a1 * math.log(max(q0, 1e-300))) / a1
    lo = (min(T0, cv) - mu) + W  # the candidates y > lo - W: a1 (y - lo) > -1
    k = gather_alive(x, m, a1, K_GEN, lo, dh, idx)
    xc = np.nan
    for j in range(k):
        if dh[j] == cv:  # the reference entry (the solver's own y = x - m)
            xc = np.float64(x[idx[j]])
    if not xc == xc:
        return np.nan, np.nan, 0, False
    for j in range(k):
        dh[j], dl[j] = two_sum(np.float64(x[idx[j]]), -xc)
    qh, ql = q0, 0.0
    Gh = 0.0
    E = 0.0
    sh = 0.0
    sl = 0.0
    s_err = 0.0
    for it in range(NEWTON_EVALS + 2):
        Lqh, Lql = log_dw(qh, ql)
        zh, zl = dw_mul_fp(Lqh, Lql, a1)
        if zh < -_EXP_MAX:
            zh = -_EXP_MAX
        es, s1, s2 = exp_dw(zh, zl)
        sh, sl = scale2(s1, es), scale2(s2, es)  # s = q^a1
        s_err = (_EPS_EXP + (_EPS_LOG * abs(Lqh) + _DW_MUL * U2 * abs(zh)) * 1.01) * sh + _TINY_ABS
        lq = math.log(qh)
        gp = 0.0
        for j in range(k):
            if dh[j] == 0.0 and dl[j] == 0.0:  # the reference entry: p = q
                ph[j], pl[j], rel[j] = qh, ql, 0.0
                vh[j], vl[j], dv[j] = sh, sl, s_err
                gp += 1.0
                continue
            ah, al = dw_mul_fp(dh[j], dl[j], a1)
            vh[j], vl[j] = dw_add(ah, al, sh, sl)
            dv[j] = (_DW_ADD + 2.0) * U2 * (abs(ah) + abs(vh[j])) + s_err
            if not (vh[j] > 0.0 or (vh[j] == 0.0 and vl[j] > 0.0)):
                ph[j], pl[j], rel[j] = 0.0, 0.0, 0.0
                continue
            Lh, Ll = log_dw(vh[j], vl[j])
            gh, gl = dw_div_fp(Lh, Ll, a1)
            if gh < -_EXP_MAX:
                gh = -_EXP_MAX
            e, eh, el = exp_dw(gh, gl)
            ph[j], pl[j] = scale2(eh, e), scale2(el, e)
            rel[j] = (_EPS_EXP + ((dv[j] / vh[j] + _EPS_LOG * abs(Lh)) / a1 + 3.0 * U2 * abs(gh)) * 1.01) * SLACK
            if ph[j] > 0.0:
                gp += math.exp(min((a1 - 1.0) * (lq - math.log(ph[j])), 700.0))  # dp/dq = (q/p)^(a1-1)
        Gh, Gl, E = _mass(ph, pl, rel, k)
        if abs(Gh) <= 4.0 * E or it == NEWTON_EVALS + 1:
            break
        nh, nl = dw_add_fp(qh, ql, -Gh / max(gp, 1.0))
        if nh > 0.0:
            qh, ql = nh, nl
        else:
            qh, ql = 0.5 * qh, 0.0
    Rq = (abs(Gh) + E) * SLACK
    dq_s = a1 * math.exp((a1 - 1.0) * math.log(qh + Rq)) * Rq * SLACK  # |ds| from |dq|: s' = a1 q^(a1-1)
    ds = dq_s + s_err
    # the reference entry is in the support, and T* - m = cv - s*/a1 stays above the
    # candidates' line lo - W (in y = x - m, where the candidates were chosen)
    ok = qh - Rq > 0.0 and cv - (sh + ds) / a1 * SLACK > (lo - W) + 0.5 * mu
    cnt = 0
    for j in range(k):
        if dh[j] == 0.0 and dl[j] == 0.0:
            cnt += 1
            c, good = round_dw(ph[j], pl[j], Rq * 1.01 * SLACK, f32)
            out[idx[j]] = c
            ok = ok and good
            continue
        slack = (dv[j] + ds) * SLACK
        vlow = vh[j] - abs(vl[j]) - slack
        if vlow > 0.0:
            cnt += 1
            tot = (rel[j] + dq_s / a1 / vlow * 1.01) * SLACK
            c, good = round_dw(ph[j], pl[j], tot * ph[j], f32)
            out[idx[j]] = c
            ok = ok and good
        else:
            out[idx[j]] = 0.0
            ok = ok and vh[j] + abs(vl[j]) + slack <= 0.0
    if ok and cnt == 1:  # the maximum alone: p = q = 1, tau = a1 m - 1 exactly
        for j in range(k):
            if out[idx[j]] != 0.0:
                out[idx[j]] = 1.0
        return fma(a1, m, -1.0), m, cnt, ok
    # tau = a1 x_c - s; theta = x_c + (1 - s) / a1
    Ph, Pl = two_prod(a1, xc)
    th, tl = dw_add(Ph, Pl, -sh, -sl)
    err = (ds + 2.0 * _DW_ADD * U2 * (abs(Ph) + abs(sh))) * SLACK
    tau, good = round_signed(th, tl, err, np.bool_(False))
    ok = ok and good and abs(m) < 2.0 ** 990 and abs(xc) < 2.0 ** 990
    return tau, xc + (1.0 - sh) / a1, cnt, ok


# ----------------------------------------------------------------------------- alpha = 1
#: the lanes of the softmax sum (a row of n >= 2 * SM_LANES entries uses all of them)
SM_LANES = 16


@jit(forceinline=True)
def _reduced(v, m):
    """``v - m`` exactly (TwoSum), set to 0 for a masked or far entry (whose exponential
    is below 2^-2000), and whether it is live."""
    yh, yl = two_sum(v, -m)
    live = yh > -_EXP_MAX
    return (yh if live else 0.0), (yl if live else 0.0), live


@jit(forceinline=True)
def _scaled(e, h, l, live):
    """``2^e (h, l)`` of a live entry, 0 otherwise; below 2^-1022 not accurate (the caller
    sends such an entry to :func:`round_scaled`)."""
    s = pow2(e if e > -1022 else -1022)
    return (h * s if live else 0.0), (l * s if live else 0.0)


@jit(forceinline=True)
def _softmax_out(eh, el, ih, il, rel_p, out, f32):
    """The output pass of :func:`cr_softmax`: ``p_i = e_i (1/S)`` rounded where its error
    ``rel_p p_i`` decides it.  Returns (entries whose ``p_i`` lies below ``NORMAL_MIN``
    redone by the caller with :func:`round_scaled`), left to it; entries undecided)."""
    low = 0
    bad = 0
    for i in range(eh.shape[0]):
        ph, pl = dw_mul(eh[i], el[i], ih, il)
        c, good = round_dw(ph, pl, rel_p * ph, f32)
        out[i] = c
        lo = (eh[i] > 0.0) & (eh[i] * ih < NORMAL_MIN)
        low += lo
        bad += (~good) & (~lo) & (eh[i] > 0.0)  # eh = 0: masked or far (p below 2^-1076): 0
    return low, bad


@jit
def cr_softmax(x, out, m, eh, el, lanes, f32, precise):
    """The correctly rounded softmax row ``x`` (maximum ``m``): ``e_i = exp(x_i - m)`` in
    double-word into the scratch ``eh``, ``el`` (:func:`_exp_entry`: the lean exponential,
    or with ``precise`` the double-word one), their sum ``S`` in lanes of TwoSums, then
    ``p_i = e_i (1/S)`` and ``tau = m + log(S)``, rounded to float64, or with ``f32`` to
    float32 (``out`` then float32; ``theta`` then the float64 whose float32 rounding is
    ``tau``).  ``lanes``: float64 scratch of shape (3,
    SM_LANES).  Writes ``out`` and returns (tau, theta, support, ok); the caller runs a row
    that is not ``ok`` again with ``precise``.  The passes are loops without branches,
    which LLVM vectorises; an entry whose ``e_i`` is below the normal range is redone on
    its own (:func:`round_scaled`)."""
    n = x.shape[0]
    eps = _EPS_EXP if precise else _EPS_EXP_LEAN
    L = SM_LANES
    lanes[:3] = 0.0
    S = lanes[0]
    C = lanes[1]
    nf = 0
    # exp(x_i - m): the lean exponential or the double-word one (the test is the loop's
    # invariant: LLVM unswitches it and vectorises each loop)
    for i in range(n):
        v = np.float64(x[i])
        yh, yl, live = _reduced(v, m)
        e, h, l = exp_dw(yh, yl) if precise else exp_lean(yh, yl)
        eh[i], el[i] = _scaled(e, h, l, live)
        nf += v > -np.inf
    # the sum: every term is in [0, 1] (x_i <= m), so a lane that starts at 1 is never
    # below the term it adds, and Fast2Sum gives each addition's error exactly
    nb = n // L
    for j in range(L):
        S[j] = 1.0
        C[j] = 0.0
    for b in range(nb):
        o = b * L
        for j in range(L):
            i = np.uint64(o + j)  # unsigned, not a slice a block: see .candidates.lane_max
            h = eh[i]
            t = S[j] + h
            C[j] += (h - (t - S[j])) + el[i]
            S[j] = t
    s = 0.0
    c = 0.0
    for j in range(L):
        s, e2 = two_sum(s, S[j])
        c += e2 + C[j]
    s, e2 = two_sum(s, -float(L))  # the lanes' starting ones, exactly
    c += e2
    for i in range(nb * L, n):
        s, e2 = two_sum(s, eh[i])
        c += e2 + el[i]
    Sh, Sl = fast_two_sum(s, c)
    # the sum's own error (each lane's low parts and Fast2Sum errors, summed with rounding),
    # the terms' (each below the normal range: 2^-1070)
    serr = ((2.0 * (nb + L) + 4.0) * U2 * (Sh + L) + eps * Sh + n * _TINY_ABS) * SLACK
    rel_s = serr / Sh * SLACK
    ih, il = dw_div(1.0, 0.0, Sh, Sl)
    rel_p = (eps + rel_s + (_DW_DIV + _DW_MUL) * U2) * SLACK
    if f32:  # two loops: the format is a constant of each, which LLVM then vectorises
        low, bad = _softmax_out(eh, el, ih, il, rel_p, out, np.bool_(True))  # bool: no literal twin
    else:
        low, bad = _softmax_out(eh, el, ih, il, rel_p, out, np.bool_(False))
    if low:  # entries below the normal range: their own exponent, and their grid
        for i in range(n):
            if eh[i] > 0.0 and eh[i] * ih < NORMAL_MIN or (eh[i] == 0.0 and np.float64(x[i]) - m > -_EXP_MAX):
                yh, yl = two_sum(np.float64(x[i]), -m)
                e, h, l = exp_dw(yh, yl) if precise else exp_lean(yh, yl)
                mh, ml = dw_mul(h, l, ih, il)
                v, good = round_scaled(e, mh, ml, rel_p * mh, np.bool_(f32))
                out[i] = v
                bad += not good
    lh, ll = log_dw(Sh, Sl)
    th, tl = dw_add_fp(lh, ll, m)
    err = (_EPS_LOG * abs(lh) + rel_s + _DW_ADD * U2 * (abs(m) + abs(lh))) * SLACK
    if f32:  # tau: the float32 rounding of th (as a float64), decided the same way; theta = th
        tau, good = round_signed(th, tl, err, np.bool_(True))
        if not good:
            th, tl, err = _tau_dominant(x, eh, el, m, eps)
            tau, good = round_signed(th, tl, err, np.bool_(True))
        return tau, th, nf, bad == 0 and good
    tau, good = round_signed(th, tl, err, np.bool_(False))
    if not good:
        th, tl, err = _tau_dominant(x, eh, el, m, eps)
        tau, good = round_signed(th, tl, err, np.bool_(False))
    return tau, tau, nf, bad == 0 and good


@jit
def _tau_dominant(x, eh, el, m, eps):
    """``tau = m + log1p(q)`` (double-word) and a bound on its error, ``q`` the sum of the
    terms ``e_i`` of :func:`cr_softmax` but one maximum's (exactly 1): a bound relative to
    ``q``, which decides a tiny tau (a maximum near 0 far above the rest) where the bound
    of ``log(S)`` is absolute.  Terms below ``NORMAL_MIN`` (scaled inexactly) are left out,
    each counted at that size; ``eps`` bounds each term's relative error."""
    n = x.shape[0]
    top = False
    s = 0.0
    c = 0.0
    ab = 0.0
    small = 0
    for i in range(n):
        if not top and np.float64(x[i]) == m:
            top = True
            continue
        if eh[i] < NORMAL_MIN:
            small += eh[i] > 0.0
            continue
        s, e = two_sum(s, eh[i])
        c += e + el[i]
        ab += eh[i]
    qh, ql = fast_two_sum(s, c)
    qerr = ((2.0 * n + 4.0) * U2 * ab + eps * ab + small * NORMAL_MIN + n * _TINY_ABS) * SLACK * SLACK
    lh, ll = log1p_dw(qh, ql)
    th, tl = dw_add_fp(lh, ll, m)
    return th, tl, (_EPS_LOG * abs(lh) + qerr + _DW_ADD * U2 * (abs(m) + abs(lh))) * SLACK
