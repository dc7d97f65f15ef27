"""alpha = 1 of the numba row solvers: softmax as log-sum-exp (units as in :mod:`.rows`)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import CACHE
from .candidates import _row_max


@njit(cache=CACHE)
def _softmax_row(x, out, m, e):
    """Softmax of one row with maximum m: ``A = log(sum exp(x - m))`` computed as
    ``log1p(sum over all but one argmax)`` (the max term separated out, as scipy's
    logsumexp does) with a compensated sum; ``exp(x - m)`` is kept in ``e`` so that the
    output is ``e_i / (1 + s)`` (``exp(y_i - A)`` directly where that is below the normal
    range).  Returns (A, support)."""
    n = x.shape[0]
    imax = 0
    for i in range(n):
        if np.float64(x[i]) == m:
            imax = i
            break
    s = 0.0
    comp = 0.0
    for i in range(n):
        ei = math.exp(np.float64(x[i]) - m)
        e[i] = ei
        if i == imax:
            continue
        t = s + ei
        if s >= ei:
            comp += (s - t) + ei
        else:
            comp += (ei - t) + s
        s = t
    s = s + comp
    A = math.log1p(s)
    inv = 1.0 / (1.0 + s)
    cnt = 0
    for i in range(n):
        d = (np.float64(x[i]) - m) - A
        if d > -700.0:
            p = e[i] * inv
        else:
            p = math.exp(d)
        out[i] = p
        cnt += p > 0.0
    return A, cnt


@njit(cache=CACHE)
def _solve_softmax(x, out, c):
    """alpha = 1, ``method=None``: log-sum-exp."""
    m = _row_max(x)
    if not (m > -np.inf):
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    A, cnt = _softmax_row(x, out, m, c)
    return m + A, cnt, 0, True
