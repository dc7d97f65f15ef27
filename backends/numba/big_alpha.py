"""alpha > 2 in the numba row solvers: the answer written relative to the support's edge
(units as in :mod:`.rows`)."""

from __future__ import annotations

import math

import numpy as np

from ..constants import EDGE_ULPS, MAX_ITER
from ._jit import jit
from .candidates import count_finite, window_candidates
from .compensated import acc as _acc
from .elementwise import EPS, K_BIG, TIE, power, settled_row
from .threshold import halve, partition3, random_entry, pivot_seed


# For alpha > 2, dp/dT = p^(2 - alpha) is unbounded at the edge of the support, so a
# threshold that is exact to the last bit can still leave an edge entry's probability
# wrong by O(1).  As in the reference, the answer is written relative to the smallest
# support entry cv and the edge probability q: T = cv - q^a1 / a1 and
# p_i = (a1 d_i + q^a1)^(1/a1), d_i = y_i - cv >= 0 (0 below cv), evaluated in log space
# (:func:`edge_p`), so an edge entry's probability is q itself, to full precision, even
# where its gap q^a1 / a1 is below the float64 range.
@jit
def _mass_T(c, i0, k, T, a1):
    """``sum_{i0 <= i < k} (a1 (c_i - T))_+^(1/a1) - 1``, compensated."""
    s = 0.0
    comp = 0.0
    for i in range(i0, k):
        p = power(a1 * (c[i] - T), a1)
        s, comp = _acc(s, comp, p)
    return (s - 1.0) + comp


@jit(forceinline=True)
def _logaddexp(x, y):
    """``log(exp(x) + exp(y))``, numpy's ``npy_logaddexp`` step for step."""
    if x == y:
        return x + 0.6931471805599453
    tmp = x - y
    if tmp > 0.0:
        return x + math.log1p(math.exp(-tmp))
    elif tmp <= 0.0:
        return y + math.log1p(math.exp(tmp))
    return tmp


@jit(forceinline=True)
def a1_log_q(q, a1):
    """``a1 log q`` = ``log(q^a1)`` (``-inf`` at q = 0)."""
    if q > 0.0:
        return a1 * math.log(q)
    return -np.inf


@jit(forceinline=True)
def edge_p(d, a1, q, lqa):
    """``(a1 d + q^a1)^(1/a1)`` for ``d >= 0`` (0 for ``d < 0``), as the reference's
    ``edge_p``: ``exp(logaddexp(log(a1 d), a1 log q) / a1)``, never forming ``q^a1``
    (below the float64 range once q < ~1e-308^(1/a1)); exactly ``q`` at the edge d = 0, and
    at least q above it (as the reference: the log round trip can land an ulp below q)."""
    if d > 0.0:
        return max(math.exp(_logaddexp(math.log(a1 * d), lqa) / a1), q)
    elif d == 0.0:
        return q
    return 0.0


@jit
def _mass_q(c, k, a1, cv, q):
    """``sum_i p_i - 1`` over ``c[:k]`` at edge probability q (:func:`edge_p`), compensated."""
    lqa = a1_log_q(q, a1)
    s = 0.0
    comp = 0.0
    for i in range(k):
        p = edge_p(c[i] - cv, a1, q, lqa)
        s, comp = _acc(s, comp, p)
    return (s - 1.0) + comp


@jit
def _pivot_big(c, k, a1, tmin, seed):
    """The support edge for alpha > 2 by randomised pivoting on the entries themselves
    (expected O(k + s log k) power evaluations, s = support size).  f(v) is evaluated
    exactly at entry values v, where v itself has p = 0, and v counts as outside when the
    mass above it is within rounding (8 eps) of 1.  Returns (cv, bv, s0, steps):
    cv = smallest entry with f(cv) < 0 (the smallest support entry), bv = largest entry
    with f(bv) >= 0 (or ``tmin``), the support is ``c[s0:k]`` (``c`` is permuted)."""
    lo = np.int64(0)  # not a literal (it reaches _mass_T): see the package docstring
    hi = k
    cv = 0.0
    bv = tmin
    steps = 0
    state = pivot_seed(seed)
    while hi > lo:
        state, v = random_entry(state, c, lo, hi)
        lt, gt, _, _ = partition3(c, lo, hi, v)
        steps += 1
        # the threshold is below v (v and above are in) only when the mass above v is
        # short of 1 by more than its rounding error: an entry that sits on the edge to
        # working precision (e.g. k equal entries each at exactly 1/k) gets p = 0
        if _mass_T(c, gt, k, v, a1) < -TIE:
            cv = v
            hi = lt
        else:  # the threshold is at or above v: v and below are out
            bv = v
            lo = gt
    return cv, bv, hi, steps


@jit
def _edge_q(c, s0, k, a1, cv, bv):
    """The edge probability q for the support ``c[s0:k]`` (smallest entry cv, largest excluded entry bv).

    Newton on q = (a1 delta)^(1/a1): G(q) = sum_i (a1 d_i + q^a1)^(1/a1) - 1 (:func:`edge_p`)
    is increasing and convex in q (each term is the a1-norm of (q, (a1 d_i)^(1/a1))), so
    Newton from the right end q(bv) decreases monotonically to the root; it stops when a
    step no longer decreases q or G(q) <= 0 (then the better of the last two points).
    Returns (q, steps, converged)."""
    q = power(a1 * (cv - bv), a1)
    q_prev = q
    g_prev = np.inf
    for it in range(1, MAX_ITER + 1):
        lqa = a1_log_q(q, a1)
        s = 0.0
        comp = 0.0
        gp = 0.0
        for i in range(s0, k):
            d = c[i] - cv
            if d == 0.0:
                p = q
                dp = 1.0
            else:
                p = edge_p(d, a1, q, lqa)
                dp = math.exp((a1 - 1.0) * math.log(q / p)) if q > 0.0 else 0.0
            s, comp = _acc(s, comp, p)
            gp += dp
        g = (s - 1.0) + comp
        if g <= 0.0:
            if abs(g_prev) < abs(g):
                q = q_prev
            return q, it, True
        qn = q - g / gp
        if not (qn < q):
            return q, it, True
        if qn <= 0.0:
            qn = 0.5 * q
        q_prev = q
        g_prev = g
        q = qn
    return q, MAX_ITER, False


@jit
def _edge_newton(c, s0, k, a1, cv, bv):
    """The edge probability q for the support ``c[s0:k]``: :func:`_edge_q`, then, like the
    reference's last-bit bisection, the float near it whose probabilities (over all
    candidates ``c[:k]``) sum closest to 1, the smaller on ties: a walk of at most 8 ulps
    down, else up.  Returns (q, steps, converged)."""
    q, it, ok = _edge_q(c, s0, k, a1, cv, bv)
    best = q
    fbest = abs(_mass_q(c, k, a1, cv, q))
    for _ in range(8):
        d = np.nextafter(best, -np.inf)
        if d < 0.0:
            break
        f = abs(_mass_q(c, k, a1, cv, d))
        if f > fbest:
            break
        best = d
        fbest = f
    if best == q:
        for _ in range(8):
            d = np.nextafter(best, np.inf)
            f = abs(_mass_q(c, k, a1, cv, d))
            if not (f < fbest):
                break
            best = d
            fbest = f
    return best, it, ok


@jit
def _last_bit_T(c, k, a1, lo, hi):
    """The reference's first stage for alpha > 2: bisection of T to adjacent floats."""
    it = 0
    for _ in range(MAX_ITER):
        mid, done = halve(lo, hi)
        if done:
            return lo, hi, it, True
        if _mass_T(c, np.int64(0), k, mid, a1) >= 0.0:
            lo = mid
        else:
            hi = mid
        it += 1
    return lo, hi, it, False


@jit
def _bisect_big(c, k, a1, nf):
    """The reference's two-stage bisection for alpha > 2: T to adjacent floats, then the
    edge probability q on ``[0, q(lo)]``.  Returns (cv, q, it, ok)."""
    lo, hi, it1, ok1 = _last_bit_T(c, k, a1, -1.0 / a1, -math.exp(-a1 * math.log(nf)) / a1)
    cv = np.inf
    for i in range(k):
        if c[i] > lo and c[i] < cv:
            cv = c[i]
    qlo = 0.0
    qhi = power(a1 * (cv - lo) * (1.0 + EDGE_ULPS * EPS), a1)
    it2 = 0
    ok2 = False
    for _ in range(MAX_ITER):
        mid, ok2 = halve(qlo, qhi)
        if ok2:
            break
        if _mass_q(c, k, a1, cv, mid) <= 0.0:
            qlo = mid
        else:
            qhi = mid
        it2 += 1
    flo = abs(_mass_q(c, k, a1, cv, qlo))
    fhi = abs(_mass_q(c, k, a1, cv, qhi))
    q = qhi if fhi < flo else qlo
    return cv, q, it1 + it2, ok1 and ok2


@jit
def _output_big(x, out, m, cv, q, a1):
    lqa = a1_log_q(q, a1)
    cnt = 0
    for i in range(x.shape[0]):
        p = edge_p((np.float64(x[i]) - m) - cv, a1, q, lqa)
        out[i] = p
        cnt += p > 0.0
    return cnt


@jit
def _finish_big(x, out, m, cv, q, a1, it, ok):
    """The output pass at edge entry ``cv`` and edge probability ``q``, and the row's
    (theta, support, n_iter, converged)."""
    cnt = _output_big(x, out, m, cv, q, a1)
    delta = math.exp(a1 * math.log(q)) / a1 if q > 0.0 else 0.0  # may underflow to 0
    return m + ((cv - delta) + 1.0 / a1), cnt, it, ok


@jit(_nrt=True)  # allocates: also when called from code compiled without NRT
def solve_big(x, out, a1, c, seed):
    """alpha > 2, ``method=None`` (and ``"newton"``): pivot on the entries, then Newton
    on the edge probability."""
    m, k, bad = window_candidates(x, a1, K_BIG, c)
    settled, res = settled_row(out, m, bad)
    if settled:
        return res
    cv, bv, s0, it = _pivot_big(c, k, a1, -1.0 / a1, seed)
    q, it2, ok = _edge_newton(c, s0, k, a1, cv, bv)
    return _finish_big(x, out, m, cv, q, a1, it + it2, ok)


@jit
def solve_big_bisect(x, out, a1, c):
    """alpha > 2, ``method="bisect"``: two-stage bisection (T, then q)."""
    m, k, bad = window_candidates(x, a1, K_BIG, c)
    settled, res = settled_row(out, m, bad)
    if settled:
        return res
    cv, q, it, ok = _bisect_big(c, k, a1, count_finite(x))
    return _finish_big(x, out, m, cv, q, a1, it, ok)
