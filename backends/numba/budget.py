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

Rows run in blocks on Python worker threads, each a ``nogil`` kernel
(:func:`~._threads.run_blocks`; small inputs on the calling thread alone).
"""

from __future__ import annotations

import math

import numpy as np

from ._jit import b1, f64, i64, jit, kernel
from .compensated import acc as _acc
from .exact_sums import sum_add, sum_round
from .sorting import select, sort
from ._threads import run_blocks

#: a row sum of magnitude below this cannot overflow float64 (as in the numpy reference)
_SUM_LIMIT = 2.0 ** 1020


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


@kernel(lambda x: (x[:, ::1], f64[::1], x[:, ::1], f64[::1], i64[::1], i64, i64), ops=("budget_forward",))
def _forward_blk(x, budget, out, tau, support, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        tau[r], support[r] = _budget_row(x[r], out[r], budget[r], c)


def budget_rows(x, budget, out, tau, support, nblk):
    """budget-sparsemax of every row of ``x`` (rows, n) into ``out``; per-row ``tau``
    (float64) and ``support``."""
    run_blocks(_forward_blk, (x, budget, out, tau, support), x.shape, nblk)


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
    S, cS, A, inexact = 0.0, 0.0, 0.0, False
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
