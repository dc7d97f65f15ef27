"""The threshold of alpha-entmax, one row at a time: the definition the NumPy engine computes.

This is the solver to read.  ``backend="numpy"`` is defined as :func:`solve_row` applied to
every row; :mod:`.numpy_backend` computes the same problem for all rows at once, faster
(safeguarded Newton steps that narrow the bisection's bracket, entries that cannot reach the
support skipped, a Newton polish after the sorts, a two-stage solve above alpha = 2), and
``tests/test_numpy_threshold.py`` shows that the two give the same probabilities, threshold
and support within the budgets of :mod:`entmax_ref.testing.tolerance`.  The same problem to
50 significant digits, in mpmath, is :mod:`entmax_ref.testing.oracle`, the readable twin the
test suite holds both to.

The problem, for a row ``x`` with maximum ``m`` and ``y = x - m``: find ``A`` with
``sum_i e_alpha(y_i - A) = 1``, where ``e_alpha(t) = [1 + (alpha - 1) t]_+ ** (1/(alpha - 1))``
(``exp(t)`` at alpha = 1); then ``theta = m + A`` and ``p_i = e_alpha(x_i - theta)``.
``-inf`` entries are masked (p = 0); a row with no finite entry has ``theta = -inf``.

* alpha = 1: ``A = log(sum_i exp(y_i))``.
* alpha = 2: sort ``y`` decreasingly; the support is the top ``k`` entries for the largest
  ``k`` with ``1 + k y_(k) > y_(1) + ... + y_(k)``, and ``A = 1 + (sum of those - 1) / k``.
* alpha = 1.5: sort ``z = y / 2`` decreasingly; ``t_k = mean_k - sqrt(max(0, (1 - k var_k) / k))``
  (mean and variance of the top k), the support is the largest ``k`` with ``t_k <= z_(k)``,
  and ``A = 2 (t_k + 1)``.
* any other alpha: bisection of ``f(A) = sum_i e_alpha(y_i - A) - 1``, which decreases from
  ``f(0) >= 0`` (the maximum alone has p = 1) to ``f(top) <= 0``, ``top = (1 - n^(1 - alpha))
  / (alpha - 1)`` (``log n`` at alpha = 1; n finite entries).  **Stopping rule**: stop when the
  midpoint of ``[lo, hi]`` equals one of its ends, i.e. ``lo`` and ``hi`` are adjacent
  floats, and return the end whose ``|f|`` is smaller.  No renormalisation.
"""

from __future__ import annotations

import numpy as np

from .numpy_elementwise import e_alpha


def solve_row(x: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """``(p, theta)`` of one float64 row ``x`` (shape (n,)) at ``alpha >= 1`` (see the module)."""
    live = np.isfinite(x)
    if not live.any():
        return np.zeros(len(x)), -np.inf
    m = x[live].max()
    y = np.where(live, x - m, -np.inf)
    z = np.sort(y[np.isfinite(y)])[::-1]  # the finite shifted scores, largest first
    k = np.arange(1, len(z) + 1)
    if alpha == 1.0:
        A = np.log(np.sum(np.exp(z)))
    elif alpha == 2.0:
        cs = np.cumsum(z)
        ks = np.count_nonzero(1.0 + k * z > cs)
        A = 1.0 + (cs[ks - 1] - 1.0) / ks
    elif alpha == 1.5:
        with np.errstate(over="ignore", invalid="ignore"):  # squares of gaps beyond 1e154: never support
            mean, meansq = np.cumsum(z / 2) / k, np.cumsum((z / 2) ** 2) / k
            t = mean - np.sqrt(np.maximum((1.0 - k * (meansq - mean * mean)) / k, 0.0))
            ks = np.count_nonzero(t <= z / 2)
        A = 2.0 * (t[ks - 1] + 1.0)
    else:
        def f(A):
            return np.sum(e_alpha(z - A, alpha)) - 1.0

        lo, hi = last_bit(f, 0.0, -np.expm1((1.0 - alpha) * np.log(len(z))) / (alpha - 1.0))
        A = hi if abs(f(hi)) < abs(f(lo)) else lo
    theta = m + A
    return e_alpha(y - A, alpha), theta


def last_bit(f, lo: float, hi: float) -> tuple[float, float]:
    """Bisect ``[lo, hi]`` for a root of a decreasing ``f`` (``f(lo) >= 0 >= f(hi)``; the ends
    are never evaluated) until its midpoint equals an end: ``lo`` and ``hi`` are then adjacent
    floats with ``f(lo) >= 0`` and ``f(hi) < 0`` (or ``hi`` the given end)."""
    while lo < (mid := 0.5 * (lo + hi)) < hi:
        lo, hi = (mid, hi) if f(mid) >= 0.0 else (lo, mid)
    return lo, hi


def solve_rows(x: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`solve_row` on every row of a float64 (rows, n) ``x``; ``alpha`` one per row.
    Returns ``p`` (rows, n) and ``theta`` (rows,)."""
    out = [solve_row(row, float(a)) for row, a in zip(x, alpha)]
    p = np.array([o[0] for o in out]).reshape(x.shape)
    return p, np.array([o[1] for o in out], dtype=np.float64)
