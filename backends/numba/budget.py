"""budget-sparsemax kernels of the numba backend (forward and VJP), float64 math.

Per row (same answer as :mod:`entmax_ref.backends.numpy_family`): a selection
(:func:`.sorting.select`) finds the ``(floor(B)+1)``-th largest entry v; at least B + 1 entries
reach 1 at ``tau = v - 1``, so ``tau > v - 1`` and only entries x with ``x - v > -1`` can be
nonzero.  Those candidates are sorted; ``h(t) = sum_i clip(x_i - t, 0, 1)`` is nonincreasing, so
two binary searches over the sorted candidates find the first rank ``j_up`` whose breakpoint
``s_j - 1`` has ``h > budget`` (ranks above it are 1) and the first rank ``j_in`` whose
breakpoint ``s_j`` has ``h > budget`` (ranks from it on are 0); ``F = [j_up, j_in)`` is the free
set.  ``h`` at a breakpoint is summed from the differences ``x_i - s_j`` (never from ``s_j - 1``,
which rounds to ``s_j`` once ``|s_j| >= 2^53``; a difference that overflows is +-inf and clips
exactly).  Then ``tau = c + r`` with c the largest free entry and
``r = (|U| + sum_F (x_i - c) - budget) / |F|`` (the free entries lie within 1 of c, so the
differences are exact; the sum Neumaier-compensated), and on the free set
``p = clip((x - hi) - lo, 0, 1)`` with ``hi + lo = c + r`` exactly (TwoSum): exact where
tau itself is not representable.  No candidate over the budget:
every unmasked entry is 1, ``tau = -inf``.  O(n log n) per row.

Then each solved row is checked and rounded in the kernel (:func:`_budget_check`, the
NumPy engine's double-word check): p and tau correctly rounded, the NumPy engine's bits.

Rows run in blocks on Python worker threads, each a ``nogil`` kernel
(:func:`~._threads.run_blocks`; small inputs on the calling thread alone).
"""

from __future__ import annotations

import math

import numpy as np

from ._jit import b1, f64, i64, jit, kernel
from .compensated import acc as _acc
from .. import double_word as M
from .double_word import dw_add_fp, dw_div_fp, round_dw, two_sum
from .exact_sums import sum_add, sum_bound, sum_round
from .sorting import select, sort
from ._threads import run_blocks

#: a row sum of magnitude below this cannot overflow float64 (as in the numpy reference)
_SUM_LIMIT = 2.0 ** 1020
#: rows with an entry this large are left to the NumPy engine's check (as there)
_BIG = 2.0 ** 1000
_U2, _DW_ADD, _DW_DIV, _SLACK = M.U2, M.DW_ADD, M.DW_DIV, M.SLACK


@jit
def _first_over(s, k, B, kind):
    """The first descending rank j < k with ``sum_i clip(s_i - s_j + kind, 0, 1) > B``
    (``s`` the k candidates ascending, rank j at ``s[k - 1 - j]``); k when none."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        t = s[k - 1 - mid]
        h = 0.0
        for i in range(k):
            h += min(max((s[i] - t) + kind, 0.0), 1.0)
        if h > B:
            hi = mid
        else:
            lo = mid + 1
    return lo


@jit
def _budget_solve(x, B, c):
    """(c, r, top, low) of one row (``c``: float64 scratch of length >= n): tau = c + r,
    entries >= top are 1, entries <= low are 0, the others ``clip(x - (c + r), 0, 1)``.
    A row whose unmasked entries number at most B: (-inf, 0, -inf, -inf) (all 1)."""
    n = x.shape[0]
    k = np.int64(0)  # not a literal: see the package docstring
    for i in range(n):
        v = np.float64(x[i])
        if v > -np.inf:
            c[k] = v
            k += 1
    if k <= B:
        return -np.inf, 0.0, -np.inf, -np.inf  # every unmasked entry is 1 (all -inf rows: none)
    # Prefilter: with v the (floor(B) + 1)-th largest entry, at least B + 1 entries are
    # >= v, so h(v - 1) >= B + 1 > B and tau > v - 1; entries with x - v <= -1 are 0 there.
    v = select(c, k, k - 1 - int(math.floor(B)))
    kk = np.int64(0)  # not a literal: see the package docstring
    dropped = -np.inf  # the largest entry left out (0 whatever the solution)
    for i in range(k):
        if c[i] - v > -1.0:
            c[kk] = c[i]
            kk += 1
        else:
            dropped = max(dropped, c[i])
    k = kk
    s = c[:k]
    sort(s)  # ascending; descending rank j is s[k - 1 - j]
    j_up = _first_over(s, k, B, 1.0)
    j_in = _first_over(s, k, B, 0.0)
    ref = s[k - 1 - j_up]  # the largest free entry (j_up < k: h(v - 1) > B)
    S, cS = 0.0, 0.0
    for j in range(j_up, j_in):
        S, cS = _acc(S, cS, s[k - 1 - j] - ref)
    r = (j_up + (S + cS) - B) / (j_in - j_up) if j_in > j_up else 0.0
    top = s[k - j_up] if j_up > 0 else np.inf
    low = max(s[k - 1 - j_in] if j_in < k else -np.inf, dropped)
    return ref, r, top, low


@jit
def _budget_row(x, out, B, c):
    ref, r, top, low = _budget_solve(x, B, c)
    if ref == -np.inf:  # every unmasked entry is 1
        top = -np.inf
        low = -np.inf
    # tau = ref + r as hi + lo exactly (TwoSum): p = (x - hi) - lo keeps what hi rounds off
    hi = ref + r
    lo = (ref - (hi - (hi - ref))) + (r - (hi - ref)) if ref > -np.inf else 0.0
    cnt = 0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        if v == -np.inf or (v <= low and ref > -np.inf):
            q = 0.0
        elif v >= top:
            q = 1.0
        else:
            q = min(max((v - hi) - lo, 0.0), 1.0)
        if q > 0.0:
            cnt += 1
        out[i] = q
    return hi, cnt


@jit(forceinline=True)
def _round_tau(th, tl, err, f32):
    """:func:`.double_word.round_dw` of a double-word of either sign."""
    if th < 0.0:
        c, ok = round_dw(-th, -tl, err, f32)
        return -c, ok
    return round_dw(th, tl, err, f32)


@jit
def _budget_check(x, B, p, f32):
    """The NumPy engine's rounding check (:func:`entmax_ref.backends.exact_budget.budget_finish`)
    of one solved row in place: from the sets of the row's ``p`` (``U = {p = 1}``, ``F = {0 <
    p < 1}``, the rest 0), ``tau = (|U| + sum_F x - B) / |F|`` in double-word with an error
    bound (the sum as :mod:`.exact_sums` sums, within :func:`.exact_sums.sum_bound`), each
    ``x_i - tau`` likewise; where every entry's interval lies inside its set and every
    rounding is decided, ``p`` becomes the correctly rounded row (float32 when ``f32``).  F
    empty: ``tau = max_Z x``, kept where ``|U| = B`` and every ``x_u - tau >= 1`` exactly.
    Returns (tau, support, whether the row is decided; ``p`` is untouched where it is not)."""
    n = x.shape[0]
    nU, nF = 0, 0
    s, c, A, inexact = 0.0, 0.0, 0.0, np.bool_(False)
    t0 = -np.inf
    for i in range(n):
        v = np.float64(x[i])
        if not (abs(v) < _BIG):  # -inf is masked; a finite entry this large: not decided here
            if v == -np.inf:
                continue
            return 0.0, 0, False
        q = np.float64(p[i])
        if q >= 1.0:
            nU += 1
        elif q > 0.0:
            nF += 1
            s, c, A, inexact = sum_add(s, c, A, inexact, v)
        else:
            t0 = max(t0, v)
    if nF == 0:
        if not (nU == B and t0 > -np.inf):
            return 0.0, 0, False
        for i in range(n):
            v = np.float64(x[i])
            if v > -np.inf and np.float64(p[i]) >= 1.0:
                dh, dl = two_sum(v, -t0)
                if not ((dh > 1.0) or ((dh == 1.0) and (dl >= 0.0))):
                    return 0.0, 0, False
        for i in range(n):
            p[i] = 1.0 if np.float64(p[i]) >= 1.0 else 0.0
        return t0, nU, True
    sh, sl = two_sum(s, c)
    serr = sum_bound(n, A) if inexact else 0.0
    Sh, Sl = dw_add_fp(sh, sl, np.float64(nU))
    Sh, Sl = dw_add_fp(Sh, Sl, -B)
    s_err = serr + 2.0 * _DW_ADD * _U2 * (abs(sh) + nU + abs(B))
    k = np.float64(nF)
    th, tl = dw_div_fp(Sh, Sl, k)
    t_err = (s_err / k + _DW_DIV * _U2 * abs(th)) * _SLACK
    tc, ok = _round_tau(th, tl, t_err, f32)
    if not ok:
        return 0.0, 0, False
    for i in range(n):  # every entry in its set, every free entry's rounding decided
        v = np.float64(x[i])
        if v == -np.inf:
            continue
        vh, vl = dw_add_fp(-th, -tl, v)
        e = (t_err + _DW_ADD * _U2 * abs(vh)) * _SLACK
        lo, hi = vh - abs(vl) - e, vh + abs(vl) + e
        q = np.float64(p[i])
        if q >= 1.0:
            if not (lo >= 1.0):
                return 0.0, 0, False
        elif q > 0.0:
            if not ((lo > 0.0) & (hi < 1.0) & round_dw(vh, vl, e, f32)[1]):
                return 0.0, 0, False
        elif not (hi <= 0.0):
            return 0.0, 0, False
    for i in range(n):
        q = np.float64(p[i])
        if q > 0.0 and q < 1.0:
            vh, vl = dw_add_fp(-th, -tl, np.float64(x[i]))
            p[i] = round_dw(vh, vl, (t_err + _DW_ADD * _U2 * abs(vh)) * _SLACK, f32)[0]
        else:
            p[i] = 1.0 if q >= 1.0 else 0.0
    return tc, nU + nF, True


@kernel(lambda x: (x[:, ::1], f64[::1], x[:, ::1], f64[::1], i64[::1], b1[::1], i64, i64), ops=("budget_forward",))
def _forward_blk(x, budget, out, tau, support, ok, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    f32 = out.itemsize == 4
    for r in range(r0, r1):
        tau[r], support[r] = _budget_row(x[r], out[r], budget[r], c)
        ok[r] = True
        if tau[r] > -np.inf:  # a row of 1s (tau = -inf) is exact as it is
            t, k, ok[r] = _budget_check(x[r], budget[r], out[r], f32)
            if ok[r]:
                tau[r], support[r] = t, k


def budget_rows(x, budget, out, tau, support, nblk):
    """budget-sparsemax of every row of ``x`` (rows, n) into ``out``, correctly rounded;
    per-row ``tau`` (float64) and ``support``.  A row the kernel's check
    (:func:`_budget_check`) leaves undecided is finished by the NumPy engine's
    :func:`~entmax_ref.backends.exact_budget.budget_finish` (the same bits)."""
    ok = np.empty(x.shape[0], np.bool_)
    run_blocks(_forward_blk, (x, budget, out, tau, support, ok), x.shape, nblk)
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..exact_budget import budget_finish

        out[bad], tau[bad], support[bad] = budget_finish(x[bad], budget[bad], out[bad], tau[bad], x.dtype)


@jit
def _vjp_row(p, g, dx):
    """``dx_i = g_i - mean_F(g)`` on ``F = {0 < p < 1}``, 0 elsewhere.  A row whose sum
    over F could overflow is scaled by a power of two (exact) first; the sum is correctly
    rounded (:mod:`.exact_sums`).  Returns False (``dx`` not written) where its rounding
    is not proven."""
    n = p.shape[0]
    nF = 0
    big = 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and pi < 1.0:
            big = max(big, abs(np.float64(g[i])))
            nF += 1
    scale = 1.0
    if nF and big >= _SUM_LIMIT / nF:
        scale = math.ldexp(1.0, -math.frexp(big)[1])
    S, cS, A, inexact = 0.0, 0.0, 0.0, np.bool_(False)
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and pi < 1.0:
            S, cS, A, inexact = sum_add(S, cS, A, inexact, np.float64(g[i]) * scale)
    S, ok = sum_round(S, cS, A, inexact, n)
    if not ok:
        return False
    mean = S / nF if nF else 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and pi < 1.0:
            dx[i] = (np.float64(g[i]) * scale - mean) / scale
        else:
            dx[i] = 0.0
    return True


@kernel(lambda x: (x[:, ::1], x[:, ::1], x[:, ::1], b1[::1], i64, i64), ops=("budget_vjp",))
def _vjp_blk(p, g, dx, ok, r0, r1):
    for r in range(r0, r1):
        ok[r] = _vjp_row(p[r], g[r], dx[r])


def budget_vjp_rows(p, g, dx, nblk=64):
    """The budget-sparsemax VJP of every row into ``dx``; the rare row whose sum the kernel
    does not round is finished by the NumPy engine (the same bits)."""
    ok = np.empty(p.shape[0], np.bool_)
    run_blocks(_vjp_blk, (p, g, dx, ok), p.shape, nblk)
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..numpy_family import budget_vjp_rows as numpy_rows

        dx[bad] = numpy_rows(p[bad], g[bad])
