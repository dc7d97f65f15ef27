"""The elementwise map of the numba row solvers, and the codes they share.

``e_alpha(d) = [1 + a1 d]_+ ** (1 / a1)`` (``exp(d)`` at ``a1 = 0``) in the units of
:mod:`.rows` (``d = y - A``, ``y = x - max(x)``), its kinds (closed forms for alpha = 1,
1.5 and 2), the method codes of :func:`.rows.entmax_rows`, the output pass that
writes ``p`` and counts the support, and the answer of a row with nothing to solve.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import LB_MARGIN, TIE_ULPS
from ._jit import jit

#: method codes of :func:`.rows.entmax_rows`
METHOD_DEFAULT = 0
METHOD_BISECT = 1
METHOD_NEWTON = 2

# kinds of the elementwise map e_alpha
K_EXP = 0  # alpha = 1: exp(d)
K_SPARSE = 1  # alpha = 2: [1 + d]_+
K_15 = 2  # alpha = 1.5: [1 + d/2]_+^2
K_GEN = 3  # any alpha > 1: exp(log1p(a1 d) / a1)
K_BIG = 4  # alpha > 2: support-threshold units T = A - 1/a1, p = (a1 (y - T))_+^(1/a1)

EPS = np.finfo(np.float64).eps
#: rounding error of a computed mass (sum of powers, each within ~2 ulps, compensated)
TIE = TIE_ULPS * EPS


@jit(forceinline=True)
def p_u(d, a1, kind):
    """``p = e_alpha(d)`` and ``u = p^(2 - alpha)`` (0 off the support)."""
    if kind == K_SPARSE:
        v = 1.0 + d
        if v > 0.0:
            return v, 1.0
        return 0.0, 0.0
    elif kind == K_15:
        v = 1.0 + 0.5 * d
        if v > 0.0:
            return v * v, v
        return 0.0, 0.0
    elif kind == K_EXP:
        p = math.exp(d)
        return p, p
    else:
        w = a1 * d
        if w > -1.0:
            p = math.exp(math.log1p(w) / a1)
            return p, p / (1.0 + w)
        return 0.0, 0.0


@jit(forceinline=True)
def is_alive(d, a1, kind):
    """Whether ``e_alpha(d)`` can be nonzero (the exact test the output pass uses)."""
    if kind == K_SPARSE:
        return 1.0 + d > 0.0
    elif kind == K_15:
        return 1.0 + 0.5 * d > 0.0
    elif kind == K_EXP:
        return d > -np.inf
    elif kind == K_BIG:
        # T >= -1/a1, but the edge-relative stage may put T up to a few ulps lower
        return d > -(1.0 + 16.0 * EPS) / a1
    else:
        return a1 * d > -1.0


@jit(forceinline=True)
def power(t, a1):
    """``t_+ ** (1 / a1)``, computed as the reference does, ``exp(log(t) / a1)``."""
    if t > 0.0:
        return math.exp(math.log(t) / a1)
    return 0.0


@jit(forceinline=True)
def uniform_bound(k, a1):
    """``(1 - k^(-a1)) / a1`` (``log k`` at ``a1 = 0``): the A at which k entries equal to the
    maximum have mass 1, so the root for a row of at most k entries alive lies below it."""
    if a1 == 0.0:
        return math.log(k)
    return -math.expm1(-a1 * math.log(k)) / a1


@jit(forceinline=True)
def bound_above(k, a1):
    """:func:`uniform_bound` raised by :data:`LB_MARGIN`: certainly above the root despite
    rounding (the upper end of the Newton bracket)."""
    hi = uniform_bound(k, a1)
    return hi + LB_MARGIN * (1.0 + hi)


@jit(forceinline=True)
def bound_below(A):
    """A lower bound ``A`` of the root, computed with rounding, lowered by :data:`LB_MARGIN`
    (the mirror of :func:`bound_above`) so that it is certainly below, and at least 0
    (where the maximum alone has mass 1)."""
    lo = A - LB_MARGIN * (1.0 + A)
    return lo if lo > 0.0 else 0.0


@jit
def write_output(x, out, m, A, a1, kind):
    """Write ``p = e_alpha(x - m - A)`` and return the support size (p > 0 in float64)."""
    cnt = 0
    n = x.shape[0]
    if kind == K_SPARSE:
        for i in range(n):
            v = 1.0 + ((np.float64(x[i]) - m) - A)
            v = v if v > 0.0 else 0.0
            out[i] = v
            cnt += v > 0.0
    elif kind == K_15:
        for i in range(n):
            v = 1.0 + 0.5 * ((np.float64(x[i]) - m) - A)
            v = v if v > 0.0 else 0.0
            p = v * v
            out[i] = p
            cnt += p > 0.0
    else:
        for i in range(n):
            p = p_u((np.float64(x[i]) - m) - A, a1, kind)[0]
            out[i] = p
            cnt += p > 0.0
    return cnt


@jit
def write_output_at(x, out, m, A, a1, kind, idx, k):
    """:func:`write_output` for a row whose entries that can be nonzero at ``A`` are among the
    columns ``idx[:k]`` (the candidates alive at a lower bound of A), and whose ``out`` is
    already zero (the solvers' maximum pass, :func:`.candidates.max_zeroing`): ``p`` at
    those columns, by the same formula from the same ``y``.  Returns the support size."""
    cnt = 0
    for j in range(k):
        i = idx[j]
        p = p_u((np.float64(x[i]) - m) - A, a1, kind)[0]
        out[i] = p
        cnt += p > 0.0
    return cnt


@jit
def settled_row(out, m, nonfinite):
    """Whether a solver's maximum pass settles the row (``m``: its maximum; ``nonfinite``:
    its count of NaN and +inf entries), and the row's (theta, support, n_iter, converged):

    * a row holding NaN or +inf: p = NaN, (NaN, 0, -1, False).  ``n_iter = -1`` is the
      mark the scanned calls raise on (``check_finite``); with the check off the answer is
      unspecified by the contract, and this is it.  A row of -inf and NaN alone is one;
    * an all ``-inf`` row (or n = 0): p = 0, (-inf, 0, 0, True).

    Otherwise (False, a placeholder) and ``out`` is left to the solver."""
    if nonfinite:
        for i in range(out.shape[0]):
            out[i] = np.nan
        return True, (np.nan, 0, -1, False)
    if not (m > -np.inf):
        for i in range(out.shape[0]):
            out[i] = 0.0
        return True, (-np.inf, 0, 0, True)
    return False, (m, 0, 0, True)
