"""budget-sparsemax kernels of the numba backend (forward and VJP), float64 math.

Per row (same answer as :mod:`entmax_ref.backends.numpy_family`): a selection
(:func:`.sorting.select`) finds the ``(floor(B)+1)``-th largest entry v; at least B + 1 entries
reach 1 at ``tau = v - 1``, so ``tau > v - 1`` and only entries above ``v - 1`` can be
nonzero.  Those are sorted, then one walk over the breakpoints in decreasing order (``x_i``: an entry becomes
fractional; ``x_i - 1``: it reaches 1), merged from the sorted entries with two pointers,
keeps the counts of the upper set ``U`` and of ``U`` plus the free set ``F``, and
``sum_F x_i`` (Neumaier-compensated, so entries that leave F leave no rounding behind).
At each breakpoint ``t``, ``h(t) = |U| + sum_F x_i - |F| t``; at the first with
``h(t) > budget`` the threshold is the closed form on the piece above it,
``tau = c + (|U| + sum_F (x_i - c) - budget) / |F|`` with c the largest free entry (the
free entries lie within 1 of each other, so the differences are exact; the sum recomputed
from the sorted range with compensation, and ``tau`` clamped to the piece).  No breakpoint over
the budget: every unmasked entry is 1, ``tau = -inf``.  O(n log n) per row.

Rows run in blocks on Python worker threads, each a ``nogil`` kernel
(:func:`~._threads.run_blocks`; small inputs on the calling thread alone).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import CACHE
from .compensated import acc as _acc
from .sorting import select, sort
from ._threads import run_blocks


@njit(cache=CACHE)
def _budget_tau(x, B, c):
    """The threshold of one row (``c``: float64 scratch of length >= n)."""
    n = x.shape[0]
    k = 0
    for i in range(n):
        v = np.float64(x[i])
        if v > -np.inf:
            c[k] = v
            k += 1
    if k <= B:
        return -np.inf  # every unmasked entry is 1 (all -inf rows: none)
    # Prefilter: with v the (floor(B) + 1)-th largest entry, at least B + 1 entries are
    # >= v, so h(v - 1) >= B + 1 > B and tau > cut = v - 1; entries <= cut are 0 there.
    j = int(math.floor(B))
    cut = select(c, k, k - 1 - j) - 1.0
    kk = 0
    for i in range(k):
        if c[i] > cut:
            c[kk] = c[i]
            kk += 1
    k = kk
    s = c[:k]
    sort(s)  # ascending; descending rank j is s[k - 1 - j]
    i_in = 0  # entries of rank < i_in are in U or F
    i_up = 0  # entries of rank < i_up are in U
    sF, cF = 0.0, 0.0  # sum_F x, compensated (entries leave it again: no cancellation)
    prev = np.inf
    while True:
        t_in = s[k - 1 - i_in] if i_in < k else -np.inf
        t_up = s[k - 1 - i_up] - 1.0 if i_up < i_in else -np.inf
        t = max(t_in, t_up, cut)  # h(cut) > B: the walk ends there at the latest
        nF = i_in - i_up
        h = i_up + ((sF + cF) - nF * t)
        if h > B or t == cut:
            if nF == 0:  # breakpoints collapsed in float64 (|x| >= 2^53, x - 1 == x): tau is t
                return min(t, prev)
            # closed form relative to the largest free entry (F spans less than 1)
            ref = s[k - 1 - i_up]
            S, cS = 0.0, 0.0
            for jj in range(i_up, i_in):
                S, cS = _acc(S, cS, s[k - 1 - jj] - ref)
            tau = ref + (i_up + (S + cS) - B) / nF
            return min(max(tau, t), prev)
        if t_in >= t_up:
            sF, cF = _acc(sF, cF, s[k - 1 - i_in])
            i_in += 1
        else:
            sF, cF = _acc(sF, cF, -s[k - 1 - i_up])
            i_up += 1
        prev = t


@njit(cache=CACHE)
def _budget_row(x, out, B, c):
    tau = _budget_tau(x, B, c)
    cnt = 0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        if v == -np.inf:
            q = 0.0
        else:
            q = min(max(v - tau, 0.0), 1.0)
        if q > 0.0:
            cnt += 1
        out[i] = q
    return tau, cnt


@njit(nogil=True, cache=CACHE)
def _forward_blk(x, budget, out, tau, support, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        tau[r], support[r] = _budget_row(x[r], out[r], budget[r], c)


def budget_rows(x, budget, out, tau, support, nblk):
    """budget-sparsemax of every row of ``x`` (rows, n) into ``out``; per-row ``tau``
    (float64) and ``support``."""
    run_blocks(_forward_blk, (x, budget, out, tau, support), x.shape, nblk)


@njit(cache=CACHE)
def _vjp_row(p, g, dx):
    """``dx_i = g_i - mean_F(g)`` on ``F = {0 < p < 1}``, 0 elsewhere."""
    n = p.shape[0]
    S, cS = 0.0, 0.0
    nF = 0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and pi < 1.0:
            S, cS = _acc(S, cS, np.float64(g[i]))
            nF += 1
    mean = (S + cS) / nF if nF else 0.0
    for i in range(n):
        pi = np.float64(p[i])
        if pi > 0.0 and pi < 1.0:
            dx[i] = np.float64(g[i]) - mean
        else:
            dx[i] = 0.0


@njit(nogil=True, cache=CACHE)
def _vjp_blk(p, g, dx, r0, r1):
    for r in range(r0, r1):
        _vjp_row(p[r], g[r], dx[r])


def budget_vjp_rows(p, g, dx, nblk=64):
    """The budget-sparsemax VJP of every row into ``dx``."""
    run_blocks(_vjp_blk, (p, g, dx), p.shape, nblk)
