"""The candidate passes of the numba row solvers: the row maximum, and the entries that
can be in the support (a superset gathered in one pass, then the output pass's own test).
Units as in :mod:`.rows`."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import CACHE
from .elementwise import _LB_MARGIN, _alive


@njit(cache=CACHE)
def _row_max(x):
    m = -np.inf
    for i in range(x.shape[0]):
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
