"""The candidate passes of the numba row solvers: the row maximum, and the entries that
can be in the support (a superset gathered in one pass, then the output pass's own test).
Units as in :mod:`.rows`."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import CACHE
from .elementwise import _LB_MARGIN, _alive


@njit(cache=CACHE)
def _row_max(x, M, M2):
    """The row maximum (NaN entries ignored; ``-inf`` for an empty or all ``-inf`` row), in a
    loop that LLVM vectorises: ``L = M.shape[0]`` lane maxima over consecutive blocks of
    ``L`` entries, then the lanes and the tail.  A maximum is exact in any order; the lanes
    alternate between ``M`` and ``M2`` so that each store is unconditional (a store kept
    only where the entry is larger becomes a masked store, microcoded and slow on AMD)."""
    n = x.shape[0]
    L = M.shape[0]
    for j in range(L):
        M[j] = -np.inf
    nb = n // L
    for b in range(nb):
        xb = x[b * L:(b + 1) * L]  # a slice: its index is provably in range, so no wraparound test
        src = M if b % 2 == 0 else M2
        dst = M2 if b % 2 == 0 else M
        for j in range(L):
            v = np.float64(xb[j])
            w = src[j]
            dst[j] = v if v > w else w
    last = M if nb % 2 == 0 else M2
    m = -np.inf
    for j in range(L):
        if last[j] > m:
            m = last[j]
    for i in range(nb * L, n):
        v = np.float64(x[i])
        if v > m:
            m = v
    return m


@njit(cache=CACHE)
def _max_gather(x, W, c):
    """One pass over the row: its maximum m and, in ``c[:k]`` (as float64 x values), a
    superset of the entries with ``x > m - W``.  An entry is kept when it exceeds the
    running maximum minus W (widened by a relative margin that covers rounding); the
    running maximum only grows, so no entry within W of the final maximum is missed, and
    for rows in random order only a few more are kept.  Returns (m, k)."""
    m = -np.inf
    thr = -np.inf
    k = 0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        if v > thr:
            c[k] = v
            k += 1
            if v > m:
                m = v
                thr = (m - W) - _LB_MARGIN * (abs(m) + W)
    return m, k


@njit(cache=CACHE)
def _refilter(c, k, m, a1, kind, lo):
    """Turn the x values in ``c[:k]`` into ``y = x - m`` and keep the candidates: the
    entries that can be in the support for some ``A >= lo`` (the output pass's own test)."""
    j = 0
    for i in range(k):
        y = c[i] - m
        if _alive(y - lo, a1, kind):
            c[j] = y
            j += 1
    return j


@njit(cache=CACHE)
def _compact(c, k, a1, kind, lo, dst):
    """Copy the candidates of ``c[:k]`` (y values) alive at ``lo`` into ``dst``."""
    j = 0
    for i in range(k):
        if _alive(c[i] - lo, a1, kind):
            dst[j] = c[i]
            j += 1
    return j


@njit(cache=CACHE)
def _count_finite(x):
    nf = 0
    for i in range(x.shape[0]):
        nf += np.float64(x[i]) > -np.inf
    return nf


@njit(cache=CACHE)
def _max_scratch(x, aux, aux2):
    """The row maximum (:func:`_row_max`) with its lanes in the first entries of two float64
    scratch rows of the row's length (free before the candidates are gathered)."""
    L = min(64, aux.shape[0])
    if L == 0:
        return -np.inf
    return _row_max(x, aux[:L], aux2[:L])


@njit(cache=CACHE)
def _gather_gen(x, m, a1, lo, a1b, dst):
    """Gather into ``dst``, in row order, the ``y = x - m`` that a 1 < alpha < 2 row solver
    keeps, in one pass with the maximum known: with ``a1b = 0``, those alive at ``lo >= 0``
    (``a1 (y - lo) > -1``, the test of :func:`_compact`); with ``a1b`` 0.5 or 1 (and
    ``a1 < a1b``), those alive for the 1.5-entmax or sparsemax bound at 0 (``1 + a1b y > 0``,
    exactly the ``_K_15`` / ``_K_SPARSE`` test).  Either test implies the window test ``a1 y >
    -1`` of :func:`_refilter` (rounding is monotone: ``y - lo <= y`` and ``a1 y >= a1b y`` for
    ``y < 0``), so the set is the one that gathering the window and filtering it gives,
    without storing the window (a third of a normal row at alpha = 1.33).  Returns the count."""
    k = 0
    if a1b == 0.0:
        for i in range(x.shape[0]):
            y = np.float64(x[i]) - m
            if a1 * (y - lo) > -1.0:
                dst[k] = y
                k += 1
    else:
        for i in range(x.shape[0]):
            y = np.float64(x[i]) - m
            if 1.0 + a1b * y > 0.0:
                dst[k] = y
                k += 1
    return k
