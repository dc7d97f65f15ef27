"""The numba engine's scalar functions applied to every entry of an array, compiled with a
Python entry, for the tests that hold them to mpmath, libm or the NumPy engine."""

from __future__ import annotations

import numpy as np

from entmax_ref.backends.numba._jit import jit
from entmax_ref.backends.numba.exact_sums import dot_add, skew_cr, sum_add, sum_round
from entmax_ref.backends.numba.vexp import vexp, vexp_neg, vlog1p


@jit(no_cpython_wrapper=False)
def vexp_array(d, out):
    """``out[i] = vexp(d[i])``."""
    for i in range(d.shape[0]):
        out[i] = vexp(np.float64(d[i]))


@jit(no_cpython_wrapper=False)
def vexp_neg_array(d, out):
    """``out[i] = vexp_neg(d[i])``."""
    for i in range(d.shape[0]):
        out[i] = vexp_neg(np.float64(d[i]))


@jit(no_cpython_wrapper=False)
def vlog1p_array(w, out):
    """``out[i] = vlog1p(w[i])``."""
    for i in range(w.shape[0]):
        out[i] = vlog1p(np.float64(w[i]))


@jit(no_cpython_wrapper=False)
def dot_rows_array(a, b, out, ok):
    """``out[r]``: ``a[r] . b[r]`` rounded to nearest as the kernels round it, ``ok[r]``:
    whether the rounding is proven (``b`` None: ``sum a[r]``)."""
    for r in range(a.shape[0]):
        s, c, A, inexact, bad = 0.0, 0.0, 0.0, np.bool_(False), np.bool_(False)
        for i in range(a.shape[1]):
            if b is None:
                s, c, A, inexact = sum_add(s, c, A, inexact, a[r, i])
            else:
                s, c, A, inexact, bad = dot_add(s, c, A, inexact, bad, a[r, i], b[r, i])
        out[r], good = sum_round(s, c, A, inexact, a.shape[1])
        ok[r] = good & (not bad)


@jit(no_cpython_wrapper=False)
def pow_array(p, a, out, ok):
    """``out[i], ok[i] = skew_cr(p[i], a)``."""
    for i in range(p.shape[0]):
        out[i], ok[i] = skew_cr(p[i], a)
