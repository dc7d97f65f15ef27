"""Correctly rounded budget-sparsemax rows, the same on both CPU engines: the finishing
stage that checks an engine's answer (:func:`budget_finish`) and the exact solve of one
row in rationals (:func:`budget_row`) for the rows it leaves undecided
(``docs/math/budget_sparsemax.md``)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import double_word as M
from .double_word import SLACK, dw_add_fp, dw_div_fp, two_sum
from .exact_fallback import round_real
from .exact_rows import U2, round_dw, row_sums


def budget_row(x: np.ndarray, budget: float, dtype=np.float64):
    """budget-sparsemax of one row exactly, correctly rounded: ``p = clip(x - tau, 0, 1)``
    with ``tau`` the smallest root of ``h(t) = sum_i clip(x_i - t, 0, 1) = budget`` (``h``
    is continuous, nonincreasing and linear between the breakpoints ``x_i`` and ``x_i - 1``:
    a binary search over them finds the piece, then the root on it), in rationals.  Returns
    (p and tau rounded in ``dtype``, tau as a Python float, -inf when every unmasked entry
    is 1; the support ``{i : p_i > 0}``)."""
    x = np.asarray(x, np.float64)
    live = np.isfinite(x)
    xs = [Fraction(float(v)) for v in x[live]]
    B = Fraction(budget)
    p = np.zeros(len(x), dtype)
    if len(xs) <= B:
        p[live] = 1.0
        return p, -math.inf, len(xs)

    def h(t):
        return sum(min(max(v - t, Fraction(0)), Fraction(1)) for v in xs)

    brk = sorted(set(xs) | {v - 1 for v in xs})  # ascending; h(brk[0]) = len(xs) > B
    lo, hi = 0, len(brk) - 1  # h(brk[lo]) > B; h(brk[-1]) = 0 <= B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if h(brk[mid]) > B:
            lo = mid
        else:
            hi = mid
    a, b = brk[lo], brk[hi]
    ha, hb = h(a), h(b)
    tau = a + (ha - B) * (b - a) / (ha - hb)  # h is linear on [a, b]
    vals = [min(max(v - tau, Fraction(0)), Fraction(1)) for v in xs]
    p[live] = [round_real(v, dtype) for v in vals]
    return p, round_real(tau, dtype), sum(1 for v in vals if v > 0)


def budget_finish(x, budget, p, tau, dtype):
    """Correctly rounded budget-sparsemax rows from an engine's answer: ``x`` (rows, n),
    ``budget`` (rows,), the engine's ``p`` (any float dtype: only its sets are used, ``U =
    {p = 1}``, ``F = {0 < p < 1}``, the rest 0) and ``tau`` (-inf for a row whose unmasked
    entries are all 1).  On F, ``tau = (|U| + sum_F x - B) / |F|`` is formed in double-word
    with an error bound, each ``x_i - tau`` likewise; the row is kept where every entry's
    interval lies inside its set (``(0, 1)`` on F, ``>= 1`` on U, ``<= 0`` elsewhere: the
    sets then give the exact tau) and every rounding is decided, p and tau in ``dtype``.  A
    row with F empty has ``tau = max_Z x`` (the smallest root), kept where ``|U| = B`` and
    every ``x_u - tau >= 1`` exactly (TwoSum).  A row whose sets are proven but a rounding
    not (tau is rational: exact midpoints are common) takes its free entries' values in
    rationals; every other row is solved exactly (:func:`budget_row`).  Returns (p in
    ``dtype``, tau float64, support)."""
    rows, n = x.shape
    x = x.astype(np.float64)
    p64 = p.astype(np.float64)
    fin = np.isfinite(x)
    solved = np.isfinite(tau)
    U = fin & (p64 >= 1.0)
    F = fin & (p64 > 0.0) & (p64 < 1.0)
    Z = fin & ~U & ~F
    nU, nF = U.sum(axis=1).astype(np.float64), F.sum(axis=1)
    out_p = np.where(fin, 1.0, 0.0).astype(dtype)  # rows that are all 1 (tau = -inf)
    out_tau = np.where(solved, 0.0, -np.inf)
    support = fin.sum(axis=1).astype(np.int64)
    big = np.where(fin, np.abs(x), 0.0).max(axis=1, initial=0.0) >= 2.0 ** 1000
    with np.errstate(all="ignore"):
        # F nonempty: tau = S / |F|, S = |U| - B + sum_F x
        sh, sl, serr = row_sums(np.where(F, x, 0.0), np.zeros((rows, n)))
        Sh, Sl = dw_add_fp(*dw_add_fp(sh, sl, nU), -budget)
        s_err = serr + 2.0 * M.DW_ADD * U2 * (np.abs(sh) + nU + np.abs(budget))
        k = np.maximum(nF, 1).astype(np.float64)
        th, tl = dw_div_fp(Sh, Sl, k)
        t_err = (s_err / k + M.DW_DIV * U2 * np.abs(th)) * SLACK
        vh, vl = dw_add_fp(-th[:, None], -tl[:, None], np.where(fin, x, 0.0))  # x - tau
        e = (t_err[:, None] + M.DW_ADD * U2 * np.abs(vh)) * SLACK
        vlo, vhi = vh - np.abs(vl) - e, vh + np.abs(vl) + e
        placed = np.where(F, (vlo > 0.0) & (vhi < 1.0), np.where(U, vlo >= 1.0, ~fin | (vhi <= 0.0)))
        c, ok = round_dw(vh, vl, e, dtype)
        tc, tok = round_dw(th, tl, t_err, dtype)
        good = (nF > 0) & placed.all(axis=1) & np.where(F, ok, True).all(axis=1) & tok
        p_free = np.where(U, 1.0, np.where(F, c.astype(np.float64), 0.0)).astype(dtype)
        # F empty: tau = max over the entries at 0, exactly; every entry at 1 at least 1 above it
        t0 = np.where(Z, x, -np.inf).max(axis=1, initial=-np.inf)
        dh, dl = two_sum(np.where(U, x, 0.0), -np.where(np.isfinite(t0), t0, 0.0)[:, None])
        top = np.where(U, (dh > 1.0) | ((dh == 1.0) & (dl >= 0.0)), True).all(axis=1)
        good0 = (nF == 0) & (nU == budget) & top & np.isfinite(t0)
    keep = solved & ~big & (good | good0)
    out_p[keep] = np.where(good0[keep, None], np.where(U[keep], 1.0, 0.0).astype(dtype), p_free[keep])
    out_tau[keep] = np.where(good0[keep], t0[keep], tc[keep].astype(np.float64))
    support[keep] = (U | (F & (vlo > 0.0)))[keep].sum(axis=1)
    # the sets proven, a rounding undecided (tau = S / |F| is rational: exact midpoints are
    # common): the free entries' values in rationals
    for r in np.flatnonzero(solved & ~keep & ~big & (nF > 0) & placed.all(axis=1)):
        free = np.flatnonzero(F[r])
        t = (sum(Fraction(float(v)) for v in x[r, free]) + int(nU[r]) - Fraction(float(budget[r]))) / len(free)
        out_p[r] = U[r].astype(dtype)
        out_p[r, free] = [round_real(Fraction(float(x[r, i])) - t, dtype) for i in free]
        out_tau[r], support[r], keep[r] = round_real(t, dtype), int(nU[r]) + len(free), True
    for r in np.flatnonzero(solved & ~keep):
        out_p[r], out_tau[r], support[r] = budget_row(x[r], float(budget[r]), dtype)
    return out_p, out_tau, support
