"""Correctly rounded float32 rows in numba: the rounding test that runs on each float32 row
right after its solver (:func:`round32`, called by the float32 drivers of :mod:`.rows`),
while the row is in cache.  The solvers work in float64; where their threshold decides
every float32 rounding of the row and its support, the row is rewritten correctly rounded
(each probability, ``tau`` and the support of the real-number problem at the float32
scores): sparsemax exactly, in float64 integers of the support's grid (:func:`sparse32`),
1 < alpha < 2 by the NumPy engine's bound (:func:`alpha32`;
:func:`entmax_ref.backends.exact_rows.float32_rows`), with the threshold's error bound
the radius that the row's residual and the mass's slope prove.  Its candidates are the solver's own, filtered,
where they hold every entry within its margin of the threshold (:func:`_candidates32`;
else a pass over the row).  A row it does not decide is finished by the compiled
finishing stage on the float32 grid (:mod:`.exact_finish`; the NumPy engine's stage,
:func:`entmax_ref.backends.exact_rows.finish`, compiled), and the rare row that stage
leaves by the exact solver, so that both engines return the same bits.
"""

from __future__ import annotations

import math

import numpy as np

from .. import double_word as M
from ..exact_rows import F32_SOLVER_ERR as _D32
from ._jit import jit
from .candidates import unpack
from .elementwise import K_15, K_GEN, K_SPARSE, is_alive
from .double_word import half_gaps, tau_alone, two_prod, two_sum

SLACK = M.SLACK

#: the float32 test's candidates: the entries with ``1 + a1 (y - A) > -_MARGIN32`` at the
#: solver's threshold; every other entry is decided outside the support by the same bound
_MARGIN32 = 2.0 ** -20
_U = M.U


@jit
def _div32(num, k):
    """``num / k`` (float64 ``num``, integer ``k > 0``, both exact) rounded once to float32
    (returned as float64): the float64 quotient q rounded, except where q is itself a
    float32 rounding midpoint and not the exact value, where the sign of ``q k - num``
    (exact: TwoProd) says which way (:func:`entmax_ref.backends.exact_rows._div32`)."""
    q = num / k
    ph, pl = two_prod(q, k)
    r = (ph - num) + pl  # ph - num is exact (Sterbenz)
    c = np.float64(np.float32(q))
    up, dn = half_gaps(abs(c), np.bool_(True))  # a bool, not a literal: one specialization
    d = abs(q) - abs(c)
    if r != 0.0 and (d == up or d == -dn):  # q k < num: the exact value is above q
        q = q + (abs(q) if r < 0.0 else -abs(q)) * 2.0 ** -30
        c = np.float64(np.float32(q))
    return c


@jit
def _above32(x, cut):
    """The smallest value of x's dtype above ``cut`` (float64): the entries above ``cut`` are
    those ``>=`` it, a comparison in x's precision."""
    cx = x.dtype.type(cut)  # the cut in x's precision, rounded down
    if np.float64(cx) > cut:
        cx = np.nextafter(cx, x.dtype.type(-np.inf))
    return np.nextafter(cx, x.dtype.type(np.inf))


@jit
def _solver_gathered(v, gathered):
    """Whether the solver's gather (``gathered = (cols, m, lo, a1)``: the test of
    :func:`.candidates.gather_alive` at ``lo`` with the row's maximum ``m`` and the kind of
    ``a1``, :func:`.rows.kind_of`) keeps an entry of value ``v``.  The test is nondecreasing
    in the entry (:func:`.candidates._first_alive`), so it then keeps every entry ``>= v``."""
    _, m, lo, a1 = gathered
    d = (np.float64(v) - m) - lo
    if a1 == 1.0:
        return is_alive(d, 1.0, K_SPARSE)
    if a1 == 0.5:
        return is_alive(d, 0.5, K_15)
    return is_alive(d, a1, K_GEN)


@jit
def _candidates32(x, cut, gathered, c, idx):
    """The float32 test's candidates of the row ``x``: its entries above ``cut``, in row
    order, their values (float64) in ``c`` and their columns in ``idx``.  The callers' cuts
    lie below every entry that the solver's output can hold (it wrote ``out`` only where
    ``1 + a1 (x - theta)`` is positive up to its roundings, far less than the cut's margin
    :data:`_MARGIN32`), so every other entry of ``out`` is 0.

    Where the solver's own candidates hold every entry above ``cut`` (``gathered = (cols,
    m, lo, a1)``: the columns ``cols``, in row order, of the entries its gather kept, which
    keeps every entry at least the smallest value above ``cut``, :func:`_solver_gathered`),
    they are filtered (``cols`` may be ``idx`` itself: each is read before it is written);
    else the whole row is read, by a bit mask of the comparison in x's precision (a loop
    with no branch that LLVM vectorises) whose set bits are then visited
    (:func:`.candidates.unpack`).  The same entries either way.  Returns (k, the
    candidates' maximum)."""
    v = _above32(x, cut)
    cols = gathered[0]
    k = 0
    if _solver_gathered(v, gathered):
        for j in range(cols.shape[0]):
            i = cols[j]
            xi = np.float64(x[i])
            c[k] = xi
            idx[k] = i
            k += xi > cut
    else:
        n = x.shape[0]
        words = np.empty(n // 64, np.uint64)
        for w in range(words.shape[0]):
            xb = x[64 * w:64 * (w + 1)]
            b = np.uint64(0)
            for t in range(64):
                b |= np.uint64(xb[t] >= v) << np.uint64(t)
            words[w] = b
        k = unpack(x, 0.0, words, c, idx)
        for i in range(64 * words.shape[0], n):
            c[k] = x[i]
            idx[k] = i
            k += np.float64(x[i]) > cut
    m = -np.inf
    for j in range(k):
        m = max(m, c[j])
    return k, m


@jit
def sparse32(x, out, theta, gathered, c, idx):
    """The float32 sparsemax row ``x`` exactly, on the support ``S = {x > tau0}`` at the
    solver's threshold ``tau0 = theta - 1``, among the candidates ``x > tau0 - _MARGIN32``
    (:func:`_candidates32`): with ``k = |S|`` and ``N = sum_S x - 1``, where every ``x_i``
    of S is a multiple of a grid ``g <= 1`` (their finest float32 spacing; 0 is on every
    grid) and ``k max|x| + sum|x| + 1 < 2^52 g``, the sums and products are exact in
    float64, so that S is proven the support (``k x_i > N`` exactly on S and at every other
    candidate; the other entries lie below ``tau0 - _MARGIN32`` and so below ``N / k``,
    checked) and every value is one division rounded once (:func:`_div32`).  Writes
    ``out`` at the candidates and returns (tau, support, ok): not ok where a condition
    fails (the row is then left to the finishing stage)."""
    tau0 = theta - 1.0
    k, m = _candidates32(x, tau0 - _MARGIN32, gathered, c, idx)
    ks, s, amax, asum, g = 0, 0.0, 0.0, 0.0, 1.0
    for j in range(k):
        xi = c[j]
        if xi > tau0:
            ks += 1
            s += xi
            a = abs(xi)
            asum += a
            amax = max(amax, a)
            if a > 0.0:
                g = min(g, 2.0 * half_gaps(a, np.bool_(True))[0])
    kf = np.float64(ks)
    ok = ks > 0 and kf * amax + asum + 1.0 < 2.0 ** 52 * g and abs(tau0) < 2.0 ** 24
    if not ok:
        return tau0, ks, False
    N = s - 1.0
    ok = N / kf - tau0 > -0.5 * _MARGIN32  # the entries that are not candidates lie below N / k
    for j in range(k):
        i = idx[j]
        kx = kf * c[j]
        if c[j] > tau0:
            ok = ok and kx > N
            out[i] = _div32(kx - N, kf)
        else:
            ok = ok and kx <= N
            out[i] = 0.0
    return _div32(N, kf), ks, ok


@jit
def _p32(d, a1):
    """``e_alpha(d) = exp(log1p(a1 d) / a1)`` in float64, as the NumPy engine's solvers
    evaluate it (:func:`entmax_ref.backends.numpy_elementwise.e_alpha`), 0 where ``a1 d
    <= -1``."""
    t = a1 * d
    if not t > -1.0:
        return 0.0
    return math.exp(math.log1p(t) / a1)


@jit
def alpha32(x, out, a1, theta, gathered, c, idx, pv):
    """Whether the solver's float64 threshold decides every float32 rounding of the row
    ``x`` at ``1 < alpha = 1 + a1 < 2``: the NumPy engine's test
    (:func:`entmax_ref.backends.exact_rows.float32_rows`), with each probability evaluated
    here in float64 from ``A = theta - m`` (after one Newton step on the candidates where
    ``theta`` is large enough for its rounding to matter), and the threshold's error bound
    the radius ``R`` that the row's residual proves (``|sum p - 1|`` with its own error
    ``E``), at most :data:`~entmax_ref.backends.exact_rows.F32_SOLVER_ERR`: the mass's
    slope is at least ``1 - |f|`` in A, which gives a first radius ``R0``, and over
    ``A +- R0`` at least ``sum p / v (1 - c a1 R0 / v)`` on the support (``p / v = v^(1/a1 -
    1)``, ``c = max(1/a1 - 1, 1)``), taken low: where that exceeds 1 (a support of many
    entries) it gives the smaller radius.  Each ``p`` is known to ``e = rel p + R s``
    (``rel`` its evaluation's relative error, ``s = p^(2 - alpha)`` its sensitivity); the
    row is decided when every ``p +- e`` rounds to one float32 and stays positive, every
    other entry is outside the support by more than its error, and ``tau +- e_tau`` rounds
    to one float32; where the maximum alone is proven the support, p = 1 there and ``tau =
    a1 m - 1`` exactly, rounded once (:func:`.double_word.tau_alone`), ``theta = m``.  The candidates are the entries with ``1 + a1 (x -
    theta) > -_MARGIN32`` (:func:`_candidates32`); every other entry is then outside the
    support whatever the threshold within the margin (one Newton step moves it less than
    a quarter of it, checked).  Writes ``out`` at the candidates (float32 of each p; the
    solver left every other entry 0: :func:`_candidates32`) and returns (tau, theta, support,
    ok).  ``c``, ``pv`` (float64) and ``idx`` (int64) are scratch of the row's
    length."""
    u = _U
    n = x.shape[0]
    # the candidates: 1 + a1 (x - theta) > -_MARGIN32, the row's maximum m among them
    k, m = _candidates32(x, theta - (1.0 + _MARGIN32) / a1, gathered, c, idx)
    ok = a1 * abs(theta) < 2.0 ** 28  # the cut's rounding is far below the margin
    for j in range(k):
        c[j] -= m  # y = x - m, exact: two float32 values
    A = theta - m
    if not A >= 0.0:
        A = 0.0
    if abs(theta) * u * 64.0 > _D32:  # theta - m lost bits of A: one Newton step on the candidates
        s = 0.0
        su = 0.0
        for j in range(k):
            p = _p32(c[j] - A, a1)
            if p > 0.0:
                s += p
                su += p / (1.0 + a1 * (c[j] - A))
        if su > 0.0:
            A1 = max(A + (s - 1.0) / su, 0.0)
            ok = ok and a1 * abs(A1 - A) < 0.25 * _MARGIN32
            A = A1
    # the residual, from the probabilities and their evaluation errors; c[j] becomes log p
    sh = sl = absum = relsum = s1 = s2 = 0.0
    for j in range(k):
        y = c[j]
        d = y - A
        t = a1 * d
        if a1 == 0.5:  # (1 + d/2)^2: error u (|d| / v + 3), within the bound below with log p = 0
            z = 0.0
            p = (1.0 + 0.5 * d) ** 2 if t > -1.0 else 0.0
        else:
            z = math.log1p(t) / a1 if t > -1.0 else 0.0
            p = math.exp(z) if t > -1.0 else 0.0
        pv[j] = p
        c[j] = z
        if p > 0.0:
            rel = 2.0 * u * ((abs(y) + 2.0 * abs(d)) / (1.0 + t) + 2.0 * abs(z) + 4.0)
            sh, e = two_sum(sh, p)
            sl += e
            absum += p
            relsum += rel * p
            # the slope's terms p / v = v^(1/a1 - 1), low, with v's own error g
            g = 2.0 * u * (a1 * (abs(y) + abs(d)) + 1.0)
            if 1.0 + t - g > 0.0:
                w = p * max(1.0 - rel, 0.0) / (1.0 + t + g)
                s1 += w
                s2 += w / (1.0 + t - g)
    F = abs((sh - 1.0) + sl)
    serr = 2.0 * ((k * u) ** 2 * absum + u * F)
    E = (serr + relsum * (1.0 + 4.0 * u) + n * 2.0 ** -1070) * SLACK
    R = (F + E) / (1.0 - F - E) * SLACK
    ok = ok and F + E < 0.5 and R <= _D32
    # within R of A the mass's slope is sum v^(1/a1 - 1) >= sum v^(1/a1 - 1) (1 - c a1 R / v)
    # with c = max(1/a1 - 1, 1) (Bernoulli; a negative term where the entry may leave the
    # support) over the support at A: at least s1 - c a1 R s2 (each term of s1 low, of s2
    # high by the sums' and terms' roundings); where that exceeds 1 the radius it proves,
    # (F + E) / slope, is the smaller one
    eps = 2.0 * (k + 4.0) * u
    slope = s1 * (1.0 - eps) / SLACK - max(1.0 / a1 - 1.0, 1.0) * a1 * R * s2 * (1.0 + eps) * SLACK
    if slope > 1.0:
        R = min(R, (F + E) / slope * SLACK)
    cnt = 0
    last = -1
    for j in range(k):
        i = idx[j]
        y = np.float64(x[i]) - m
        d = y - A
        v = 1.0 + a1 * d
        ay, ad = abs(y), abs(d)
        gamma = 2.0 * u * (a1 * (ay + ad) + 1.0)  # v's own error
        p = pv[j]
        if p > 0.0:
            cnt += 1
            last = i
            vlow = v - 2.0 * a1 * R - gamma
            rel = 2.0 * u * ((ay + 2.0 * ad) / v + 2.0 * abs(c[j]) + 4.0)
            # p^(2 - alpha) = p / v, at most p / vlow exp(w) <= p / vlow / (1 - w) over the
            # thresholds within R (w = (2 R + gamma / a1) / vlow)
            w = (2.0 * R + gamma / a1) / vlow if vlow > 0.0 else 1.0
            sens = min(1.0, p / vlow / (1.0 - w)) if w < 0.5 else 1.0
            e = (rel * p + R * sens) * SLACK
            ok = ok and vlow > 0.0 and p - e > 0.0 and np.float32(p - e) == np.float32(p + e)
            out[i] = p
        else:
            ok = ok and v + 2.0 * a1 * R + gamma <= 0.0
            out[i] = 0.0
    if ok and cnt == 1:  # the maximum alone: p = 1, A = 0, tau = a1 m - 1 exactly
        out[last] = 1.0
        return tau_alone(a1, m, np.bool_(True)), m, cnt, ok
    # tau = a1 theta - 1, theta = m + A to R and a few roundings
    th = m + A
    e_theta = R + 4.0 * u * (A + 2.0 / a1 + 1.0) + 2.0 * u * abs(th)
    t = a1 * th - 1.0
    e_tau = (a1 * e_theta + 2.0 * u * (abs(a1 * th) + abs(t))) * SLACK
    ok = ok and np.float32(t - e_tau) == np.float32(t + e_tau)
    return np.float64(np.float32(t)), th, cnt, ok


@jit
def round32_sparse(x, out, theta, gathered, c, aux2):
    """:func:`sparse32` of the float32 row ``x`` that the sparsemax solver has just solved
    (``theta``, ``out``, its candidates ``gathered``), with the solvers' scratch ``c``,
    ``aux2`` (free once the row is solved).  Returns (tau, support, ok); a settled row (NaN
    or +inf entries, or none finite) keeps the solver's answer, with ``tau = theta``."""
    if not (theta > -np.inf and theta < np.inf):
        return theta, 0, True
    return sparse32(x, out, theta, gathered, c, aux2.view(np.int64))


@jit(inline="always")
def round32(x, out, a1, solved, scratch, path, sparse):
    """The rounding test of the float32 row ``x`` that its solver has just solved
    (``solved = (theta, gathered)``: its threshold and candidates, :func:`.rows.solve_on_path`;
    ``scratch = (c, aux, aux2)``, the solvers'): :func:`round32_sparse` where ``path ==
    sparse`` (constants of the calling kernel's code: numba inlines this function and prunes
    the other branch), else :func:`round32_alpha`.  Returns (tau, theta, support, ok)."""
    theta, gathered = solved
    c, aux, aux2 = scratch
    if path == sparse:
        tau, cnt, ok = round32_sparse(x, out, theta, gathered, c, aux2)
        return tau, theta, cnt, ok
    return round32_alpha(x, out, a1, theta, gathered, c, aux, aux2)


@jit
def round32_alpha(x, out, a1, theta, gathered, c, aux, aux2):
    """:func:`alpha32` of the float32 row ``x`` that a solver at ``1 < alpha = 1 + a1 < 2``
    has just solved, as :func:`round32_sparse`.  Returns (tau, theta, support, ok)."""
    if not (theta > -np.inf and theta < np.inf):
        return theta, theta, 0, True
    return alpha32(x, out, a1, theta, gathered, c, aux2.view(np.int64), aux)
