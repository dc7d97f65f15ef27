"""Row solvers of the numba backend: alpha-entmax of every row of a (rows, n) array.

Units are those of :mod:`entmax_ref.backends._base`: with ``y = x - max(x)`` and
``a1 = alpha - 1`` each row solves for ``A >= 0`` in

    f(A) = sum_i e_alpha(y_i - A) - 1 = 0,   e_alpha(d) = [1 + a1 d]_+ ** (1 / a1)  (exp(d) at a1 = 0),

and returns ``theta = max(x) + A``.  Everything is computed in float64 whatever the
input dtype; only the probabilities are rounded to the input dtype when stored.  Sums of
probabilities use Neumaier's compensated summation.

Per row (``_solve_row``):

1. One pass finds ``m = max(x)`` and gathers a superset of the entries within the
   support window ``1/a1`` of it (an all ``-inf`` row, or ``n = 0``, gives p = 0,
   theta = -inf); the candidates are then the ``y_i`` for which the output pass's own
   test ``a1 * y > -1`` holds at ``A = 0`` (rounding is monotone, so a dropped entry is
   zero for every ``A >= 0``, and ``A >= 0`` because the maximum alone has mass 1 there).
2. The threshold, by alpha (``method=None``):

   * alpha = 1: ``A = log1p(sum_{i != argmax} exp(y_i))`` (the max term separated out,
     as scipy's logsumexp does); ``p_i = exp(y_i) / (1 + s)``.
   * alpha = 2: Condat's (2016) algorithm finds the support S in expected O(k); the
     closed form ``A = (sum_S y + |S| - 1) / |S|`` with a compensated sum.
   * alpha = 1.5: a randomised pivot (quickselect-like, expected O(k)) on
     ``f(t) = sum_{y > t} (y - t)^2 / 4 - 1``, keeping count, mean and centred sum of
     squares of the entries known to be in the support (Chan's merge, no cancellation),
     then the left root of the quadratic on that support.  Both closed forms are
     polished by Newton on their support until a step no longer changes ``A``.
   * 1 < alpha < 2, other: the exact 1.5-entmax (alpha < 1.5) or sparsemax threshold is a
     lower bound (``e_alpha(d)`` is nonincreasing in alpha), which prunes the candidates
     to a thin shell; then safeguarded Newton from that bound on
     ``phi(A) = ((f + 1)^a1 - 1) / a1``, the (1/a1)-norm of the ``[1 + a1 (y - A)]_+``:
     convex and nearly linear, so the steps from the left are monotone and few (5-7 on
     random rows).  A step that leaves the bracket, or a computed f that did not change
     (flat at this resolution), falls back to bisection; candidates that are zero at the
     lower bound are dropped as it grows.  It stops when a step no longer changes ``A``,
     ``f(A) == 0``, or the bracket cannot be split (then the end with the smaller |f|).
   * alpha > 2: ``dp/dA = p^(2 - alpha)`` is unbounded at the support's edge, so, as in
     the reference, the answer is written relative to the smallest support entry cv:
     ``p_i = (a1 (y_i - cv) + q^a1)^(1/a1)`` with ``q = (a1 delta)^(1/a1)`` the edge
     probability, ``delta = cv - T``, evaluated in log space (``q^a1`` is below the
     float64 range once q < ~1e-308^(1/a1): 8e-4 at alpha = 100).  A randomised pivot on
     the entries themselves (f evaluated exactly at entry values, expected O(k + s log k)
     powers) finds cv, then Newton on q (the mass is increasing and convex in q, so Newton
     from the right is monotone), and the float nearest it whose mass is closest to 1 is
     kept.
   * ``method="newton"``: the safeguarded Newton iteration for alpha <= 2 (from A = 0,
     no closed form or bound); alpha > 2 as above.
   * ``method="bisect"``: the reference's bisection on the same bracket
     ``[0, (1 - nf^(-a1)) / a1]`` (``[0, log nf]`` at alpha = 1, nf = finite entries),
     two-stage (T, then the edge probability q) for alpha > 2, until the midpoint equals an endpoint;
     then the endpoint with the smaller |f|.
3. Output pass: ``p_i = e_alpha(y_i - A)`` with the reference's formula
   ``exp(log1p(a1 d) / a1)`` (``1 + d`` at alpha = 2 and ``(1 + d/2)^2`` at 1.5, the same
   function with fewer roundings); support = ``#{p_i > 0}`` counted in float64 before the
   rounding to the output dtype.

``n_iter`` counts f evaluations of the iterative solvers (pivot steps included for
alpha > 2, bisection halvings for ``"bisect"``) and is 0 for the closed forms.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..constants import EDGE_ULPS, LB_MARGIN, MAX_ITER, TIE_ULPS
from . import CACHE
from ._threads import run_blocks

#: method codes of :func:`entmax_rows`
METHOD_DEFAULT = 0
METHOD_BISECT = 1
METHOD_NEWTON = 2

# kinds of the elementwise map e_alpha
_K_EXP = 0  # alpha = 1: exp(d)
_K_SPARSE = 1  # alpha = 2: [1 + d]_+
_K_15 = 2  # alpha = 1.5: [1 + d/2]_+^2
_K_GEN = 3  # any alpha > 1: exp(log1p(a1 d) / a1)
_K_BIG = 4  # alpha > 2: support-threshold units T = A - 1/a1, p = (a1 (y - T))_+^(1/a1)

_EPS = np.finfo(np.float64).eps
#: rounding error of a computed mass (sum of powers, each within ~2 ulps, compensated)
_TIE = TIE_ULPS * _EPS
#: relative margin that turns a computed lower bound into a certain one
_LB_MARGIN = LB_MARGIN


# --------------------------------------------------------------------------- elementwise
@njit(inline="always", cache=CACHE)
def _p_u(d, a1, kind):
    """``p = e_alpha(d)`` and ``u = p^(2 - alpha)`` (0 off the support)."""
    if kind == _K_SPARSE:
        v = 1.0 + d
        if v > 0.0:
            return v, 1.0
        return 0.0, 0.0
    elif kind == _K_15:
        v = 1.0 + 0.5 * d
        if v > 0.0:
            return v * v, v
        return 0.0, 0.0
    elif kind == _K_EXP:
        p = math.exp(d)
        return p, p
    else:
        w = a1 * d
        if w > -1.0:
            p = math.exp(math.log1p(w) / a1)
            return p, p / (1.0 + w)
        return 0.0, 0.0


@njit(inline="always", cache=CACHE)
def _alive(d, a1, kind):
    """Whether ``e_alpha(d)`` can be nonzero (the exact test the output pass uses)."""
    if kind == _K_SPARSE:
        return 1.0 + d > 0.0
    elif kind == _K_15:
        return 1.0 + 0.5 * d > 0.0
    elif kind == _K_EXP:
        return d > -np.inf
    elif kind == _K_BIG:
        # T >= -1/a1, but the edge-relative stage may put T up to a few ulps lower
        return d > -(1.0 + 16.0 * _EPS) / a1
    else:
        return a1 * d > -1.0


@njit(inline="always", cache=CACHE)
def _power(t, a1):
    """``t_+ ** (1 / a1)``, computed as the reference does, ``exp(log(t) / a1)``."""
    if t > 0.0:
        return math.exp(math.log(t) / a1)
    return 0.0


# --------------------------------------------------------------------------- row passes
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
def _f_eval(c, k, a1, kind, A, lo, compact):
    """``f(A) = sum p - 1`` (compensated), ``sum u`` over the candidates ``c[:k]``; when
    ``compact``, candidates that are zero at the lower bound ``lo`` are dropped in place.
    Returns (f, sum_u, new k)."""
    s = 0.0
    comp = 0.0
    su = 0.0
    j = 0
    for i in range(k):
        y = c[i]
        p, u = _p_u(y - A, a1, kind)
        t = s + p
        if s >= p:
            comp += (s - t) + p
        else:
            comp += (p - t) + s
        s = t
        su += u
        if compact:
            if _alive(y - lo, a1, kind):
                c[j] = y
                j += 1
    if not compact:
        j = k
    return (s - 1.0) + comp, su, j


@njit(cache=CACHE)
def _newton(c, k, a1, kind, A, lo, hi):
    """Safeguarded Newton on ``f`` (see the module docstring).  Returns (A, evaluations,
    converged)."""
    flo = np.inf  # |f| at lo / hi once evaluated there
    fhi = np.inf
    last_lo = lo  # lower bound at which c was last filtered
    f_prev = np.nan
    it = 0
    while it < MAX_ITER:
        f, fp, k = _f_eval(c, k, a1, kind, A, last_lo, lo > last_lo)
        if lo > last_lo:
            last_lo = lo
        it += 1
        if f == 0.0:
            return A, it, True
        if f > 0.0:
            lo = A
            flo = f
        else:
            hi = A
            fhi = -f
        if fp > 0.0 and f > -1.0:
            if kind == _K_GEN or kind == _K_EXP:
                # Newton on phi(A) = ((f + 1)^a1 - 1) / a1 (log(f + 1) at a1 = 0): the
                # (1/a1)-norm of the [1 + a1 (y - A)]_+, convex and nearly linear (exactly
                # linear for a constant row, and for softmax), so the steps from the left
                # are monotone and far fewer than on f.
                ls = math.log1p(f)
                phi = math.expm1(a1 * ls) / a1 if a1 > 0.0 else ls
                An = A + phi / (math.exp((a1 - 1.0) * ls) * fp)
            else:
                An = A + f / fp
        else:
            An = 0.5 * (lo + hi)
        if An == A:
            return A, it, True
        # a computed f that did not change is flat at this resolution (e.g. a term
        # 1 - O(1e-20) that rounds to 1): Newton would creep, so bisect instead
        flat = f == f_prev
        f_prev = f
        if flat or not (An > lo and An < hi):
            mid = 0.5 * (lo + hi)
            if not (mid > lo and mid < hi):
                return (lo if flo <= fhi else hi), it, True
            An = mid
        A = An
    return A, it, False


@njit(cache=CACHE)
def _bisect(c, k, a1, kind, lo, hi):
    """The reference's bisection (midpoint until it equals an endpoint, then the endpoint
    with the smaller |f|).  Returns (A, halvings, converged)."""
    it = 0
    flo = np.nan
    fhi = np.nan
    last_lo = lo
    done = False
    for _ in range(MAX_ITER):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            done = True
            break
        f, fp, k = _f_eval(c, k, a1, kind, mid, last_lo, lo > last_lo)
        if lo > last_lo:
            last_lo = lo
        if f >= 0.0:
            lo = mid
            flo = f
        else:
            hi = mid
            fhi = f
        it += 1
    if not done:
        mid = 0.5 * (lo + hi)
        done = mid <= lo or mid >= hi
    if flo != flo:
        flo = _f_eval(c, k, a1, kind, lo, lo, False)[0]
    if fhi != fhi:
        fhi = _f_eval(c, k, a1, kind, hi, lo, False)[0]
    A = hi if abs(fhi) < abs(flo) else lo
    return A, it, done


@njit(cache=CACHE)
def _condat(c, k, v, vt):
    """Condat's (2016) simplex-projection threshold on ``c[:k]`` (sum 1); returns
    ``(A, |S|)`` with ``A = tau + 1`` from the identified support S, summed with
    compensation; S is left in ``v[:|S|]``.  Uses ``v`` and ``vt`` as scratch and leaves
    ``c`` unchanged unless ``vt`` is ``c`` (allowed: ``vt`` is written behind the read
    position)."""
    nv = 1
    v[0] = c[0]
    rho = c[0] - 1.0
    nt = 0
    for j in range(1, k):
        y = c[j]
        if y > rho:
            rho += (y - rho) / (nv + 1)
            if rho > y - 1.0:
                v[nv] = y
                nv += 1
            else:
                for q in range(nv):
                    vt[nt + q] = v[q]
                nt += nv
                v[0] = y
                nv = 1
                rho = y - 1.0
    for q in range(nt):
        y = vt[q]
        if y > rho:
            v[nv] = y
            nv += 1
            rho += (y - rho) / nv
    while True:
        cur = nv
        w = 0
        for q in range(nv):
            y = v[q]
            if y > rho or cur == 1:
                v[w] = y
                w += 1
            else:
                cur -= 1
                rho += (rho - y) / cur
        if w == nv:
            break
        nv = w
    s = 0.0
    comp = 0.0
    for q in range(nv):
        y = v[q]
        t = s + y
        if abs(s) >= abs(y):
            comp += (s - t) + y
        else:
            comp += (y - t) + s
        s = t
    return ((s + comp) - 1.0) / nv + 1.0, nv


@njit(inline="always", cache=CACHE)
def _seed(seed):
    """The pivot generator's state for a row (a deterministic function of the seed)."""
    return np.int64(seed) * np.int64(2654435761) + np.int64(1013904223)


@njit(inline="always", cache=CACHE)
def _random_entry(state, c, lo, hi):
    """Advance the 64-bit LCG and return (state, a pseudo-random entry of c[lo:hi])."""
    state = state * np.int64(6364136223846793005) + np.int64(1442695040888963407)
    r = (state >> 33) & 0x3FFFFFFF
    return state, c[lo + r % (hi - lo)]


@njit(cache=CACHE)
def _pivot15(c, k, seed):
    """Expected-O(k) 1.5-entmax threshold on ``c[:k]`` by randomised pivoting (permutes
    ``c`` in place, keeps every element).  Returns ``(A, s0)``: ``A = t + 2`` where ``t``
    is the closed-form root of ``sum_{y > t} (y - t)^2 = 4`` on the identified support
    ``c[s0:k]``, or -1.0 when rounding left no usable support."""
    lo = 0
    hi = k
    kk = 0
    mean = 0.0
    m2 = 0.0
    state = _seed(seed)
    while hi > lo:
        state, v = _random_entry(state, c, lo, hi)
        lt = lo
        i = lo
        gt = hi
        s1 = 0.0
        s2 = 0.0
        while i < gt:
            y = c[i]
            if y < v:
                c[i] = c[lt]
                c[lt] = y
                lt += 1
                i += 1
            elif y > v:
                gt -= 1
                c[i] = c[gt]
                c[gt] = y
                e = y - v
                s1 += e
                s2 += e * e
            else:
                i += 1
        dk = mean - v
        f = 0.25 * (s2 + m2 + kk * dk * dk) - 1.0
        if f < 0.0:
            # the root is below v: every element >= v is in the support
            cb = hi - lt
            mb = v + s1 / cb
            m2b = s2 - s1 * s1 / cb
            if m2b < 0.0:
                m2b = 0.0
            if kk == 0:
                mean = mb
                m2 = m2b
            else:
                delta = mb - mean
                tot = kk + cb
                mean += delta * cb / tot
                m2 += m2b + delta * delta * (kk * cb / tot)
            kk += cb
            hi = lt
        else:
            # the root is at or above v: every element <= v is out
            lo = gt
    if kk == 0:
        return -1.0, hi
    disc = (4.0 - m2) / kk
    if disc < 0.0:
        return -1.0, hi
    return (mean - math.sqrt(disc)) + 2.0, hi



# --------------------------------------------------------------------------- alpha > 2
# For alpha > 2, dp/dT = p^(2 - alpha) is unbounded at the edge of the support, so a
# threshold that is exact to the last bit can still leave an edge entry's probability
# wrong by O(1).  As in the reference, the answer is written relative to the smallest
# support entry cv and the edge probability q: T = cv - q^a1 / a1 and
# p_i = (a1 d_i + q^a1)^(1/a1), d_i = y_i - cv >= 0 (0 below cv), evaluated in log space
# (:func:`_edge_p`), so an edge entry's probability is q itself, to full precision, even
# where its gap q^a1 / a1 is below the float64 range.
@njit(cache=CACHE)
def _mass_T(c, i0, k, T, a1):
    """``sum_{i0 <= i < k} (a1 (c_i - T))_+^(1/a1) - 1``, compensated."""
    s = 0.0
    comp = 0.0
    for i in range(i0, k):
        p = _power(a1 * (c[i] - T), a1)
        t = s + p
        if s >= p:
            comp += (s - t) + p
        else:
            comp += (p - t) + s
        s = t
    return (s - 1.0) + comp


@njit(inline="always", cache=CACHE)
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


@njit(inline="always", cache=CACHE)
def _lqa(q, a1):
    """``a1 log q`` = ``log(q^a1)`` (``-inf`` at q = 0)."""
    if q > 0.0:
        return a1 * math.log(q)
    return -np.inf


@njit(inline="always", cache=CACHE)
def _edge_p(d, a1, q, lqa):
    """``(a1 d + q^a1)^(1/a1)`` for ``d >= 0`` (0 for ``d < 0``), as the reference's
    ``_edge_p``: ``exp(logaddexp(log(a1 d), a1 log q) / a1)``, never forming ``q^a1``
    (below the float64 range once q < ~1e-308^(1/a1)); exactly ``q`` at the edge d = 0."""
    if d > 0.0:
        return math.exp(_logaddexp(math.log(a1 * d), lqa) / a1)
    elif d == 0.0:
        return q
    return 0.0


@njit(cache=CACHE)
def _mass_q(c, k, a1, cv, q):
    """``sum_i p_i - 1`` over ``c[:k]`` at edge probability q (:func:`_edge_p`), compensated."""
    lqa = _lqa(q, a1)
    s = 0.0
    comp = 0.0
    for i in range(k):
        p = _edge_p(c[i] - cv, a1, q, lqa)
        t = s + p
        if s >= p:
            comp += (s - t) + p
        else:
            comp += (p - t) + s
        s = t
    return (s - 1.0) + comp


@njit(cache=CACHE)
def _pivot_big(c, k, a1, tmin, seed):
    """The support edge for alpha > 2 by randomised pivoting on the entries themselves
    (expected O(k + s log k) power evaluations, s = support size).  f(v) is evaluated
    exactly at entry values v, where v itself has p = 0, and v counts as outside when the
    mass above it is within rounding (8 eps) of 1.  Returns (cv, bv, s0, steps):
    cv = smallest entry with f(cv) < 0 (the smallest support entry), bv = largest entry
    with f(bv) >= 0 (or ``tmin``), the support is ``c[s0:k]`` (``c`` is permuted)."""
    lo = 0
    hi = k
    cv = 0.0
    bv = tmin
    steps = 0
    state = _seed(seed)
    while hi > lo:
        state, v = _random_entry(state, c, lo, hi)
        lt = lo
        i = lo
        gt = hi
        while i < gt:
            y = c[i]
            if y < v:
                c[i] = c[lt]
                c[lt] = y
                lt += 1
                i += 1
            elif y > v:
                gt -= 1
                c[i] = c[gt]
                c[gt] = y
            else:
                i += 1
        steps += 1
        # the threshold is below v (v and above are in) only when the mass above v is
        # short of 1 by more than its rounding error: an entry that sits on the edge to
        # working precision (e.g. k equal entries each at exactly 1/k) gets p = 0
        if _mass_T(c, gt, k, v, a1) < -_TIE:
            cv = v
            hi = lt
        else:  # the threshold is at or above v: v and below are out
            bv = v
            lo = gt
    return cv, bv, hi, steps


@njit(cache=CACHE)
def _edge_q(c, s0, k, a1, cv, bv):
    """The edge probability q for the support ``c[s0:k]`` (smallest entry cv, largest excluded entry bv).

    Newton on q = (a1 delta)^(1/a1): G(q) = sum_i (a1 d_i + q^a1)^(1/a1) - 1 (:func:`_edge_p`)
    is increasing and convex in q (each term is the a1-norm of (q, (a1 d_i)^(1/a1))), so
    Newton from the right end q(bv) decreases monotonically to the root; it stops when a
    step no longer decreases q or G(q) <= 0 (then the better of the last two points).
    Returns (q, steps, converged)."""
    q = _power(a1 * (cv - bv), a1)
    q_prev = q
    g_prev = np.inf
    for it in range(1, MAX_ITER + 1):
        lqa = _lqa(q, a1)
        s = 0.0
        comp = 0.0
        gp = 0.0
        for i in range(s0, k):
            d = c[i] - cv
            if d == 0.0:
                p = q
                dp = 1.0
            else:
                p = _edge_p(d, a1, q, lqa)
                dp = math.exp((a1 - 1.0) * math.log(q / p)) if q > 0.0 else 0.0
            t = s + p
            if s >= p:
                comp += (s - t) + p
            else:
                comp += (p - t) + s
            s = t
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


@njit(cache=CACHE)
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


@njit(cache=CACHE)
def _last_bit_T(c, k, a1, lo, hi):
    """The reference's first stage for alpha > 2: bisection of T to adjacent floats."""
    it = 0
    for _ in range(MAX_ITER):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return lo, hi, it, True
        if _mass_T(c, 0, k, mid, a1) >= 0.0:
            lo = mid
        else:
            hi = mid
        it += 1
    return lo, hi, it, False


@njit(cache=CACHE)
def _bisect_big(c, k, a1, nf):
    """The reference's two-stage bisection for alpha > 2: T to adjacent floats, then the
    edge probability q on ``[0, q(lo)]``.  Returns (cv, q, it, ok)."""
    lo, hi, it1, ok1 = _last_bit_T(c, k, a1, -1.0 / a1, -math.exp(-a1 * math.log(nf)) / a1)
    cv = np.inf
    for i in range(k):
        if c[i] > lo and c[i] < cv:
            cv = c[i]
    qlo = 0.0
    qhi = _power(a1 * (cv - lo) * (1.0 + EDGE_ULPS * _EPS), a1)
    it2 = 0
    ok2 = False
    for _ in range(MAX_ITER):
        mid = 0.5 * (qlo + qhi)
        if mid <= qlo or mid >= qhi:
            ok2 = True
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


@njit(cache=CACHE)
def _output_big(x, out, m, cv, q, a1):
    lqa = _lqa(q, a1)
    cnt = 0
    for i in range(x.shape[0]):
        p = _edge_p((np.float64(x[i]) - m) - cv, a1, q, lqa)
        out[i] = p
        cnt += p > 0.0
    return cnt


@njit(cache=CACHE)
def _output(x, out, m, A, a1, kind):
    """Write ``p = e_alpha(x - m - A)`` and return the support size (p > 0 in float64)."""
    cnt = 0
    n = x.shape[0]
    if kind == _K_SPARSE:
        for i in range(n):
            v = 1.0 + ((np.float64(x[i]) - m) - A)
            v = v if v > 0.0 else 0.0
            out[i] = v
            cnt += v > 0.0
    elif kind == _K_15:
        for i in range(n):
            v = 1.0 + 0.5 * ((np.float64(x[i]) - m) - A)
            v = v if v > 0.0 else 0.0
            p = v * v
            out[i] = p
            cnt += p > 0.0
    else:
        for i in range(n):
            p = _p_u((np.float64(x[i]) - m) - A, a1, kind)[0]
            out[i] = p
            cnt += p > 0.0
    return cnt


@njit(cache=CACHE)
def _finish(x, out, m, k, a1, kind, A0, lo, sup, ns, closed):
    """Newton from ``A0`` in ``[lo, hi]`` (on the identified support ``sup[:ns]`` when
    ``closed``: a closed form is only polished), then the output pass.  ``k`` is the
    number of candidates (for the bound), ``closed`` a run-time bool (a literal would
    compile a second copy)."""
    if a1 == 0.0:
        hi = math.log(k)
    else:
        hi = -math.expm1(-a1 * math.log(k)) / a1
    hi += _LB_MARGIN * (1.0 + hi)  # the uniform bound, certainly above despite rounding
    if not (A0 >= lo):
        A0 = lo
    if A0 > hi:
        A0 = hi
    if hi > lo:
        # a closed form is polished by Newton on its identified support (an entry that
        # rounding puts on the other side of the edge carries a probability at the
        # rounding level either way); the candidates c[:k] are sup[:ns] otherwise
        A, it, ok = _newton(sup, ns, a1, kind, A0, lo, hi)
        if closed:
            it = 0
    else:  # a single candidate: the row maximum carries all the mass
        A, it, ok = lo, 0, True
    cnt = _output(x, out, m, A, a1, kind)
    return m + A, cnt, it, ok


# One solver per path, so that a call compiles only the path it takes (the drivers below
# are chosen in Python from alpha and the method); ``_solve_row`` dispatches among them
# at run time for the mixed case and for the attention kernels.


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


@njit(cache=CACHE)
def _solve_big(x, out, a1, method, c, seed):
    """alpha > 2: pivot on the entries, Newton on the edge probability (or bisection)."""
    m, k = _max_gather(x, 1.0 / a1, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, a1, _K_BIG, 0.0)
    if method == METHOD_BISECT:
        cv, q, it, ok = _bisect_big(c, k, a1, _count_finite(x))
    else:
        cv, bv, s0, it = _pivot_big(c, k, a1, -1.0 / a1, seed)
        q, it2, ok = _edge_newton(c, s0, k, a1, cv, bv)
        it += it2
    cnt = _output_big(x, out, m, cv, q, a1)
    delta = math.exp(a1 * math.log(q)) / a1 if q > 0.0 else 0.0  # may underflow to 0
    return m + ((cv - delta) + 1.0 / a1), cnt, it, ok


@njit(cache=CACHE)
def _solve_bisect(x, out, a1, c):
    """``method="bisect"``, alpha <= 2."""
    kind = _K_EXP if a1 == 0.0 else _K_GEN
    m, k = _max_gather(x, 1.0 / a1 if a1 > 0.0 else np.inf, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, a1, kind, 0.0)
    nf = _count_finite(x)
    if a1 == 0.0:
        hi = math.log(nf)
    else:
        hi = -math.expm1(-a1 * math.log(nf)) / a1
    A, it, ok = _bisect(c, k, a1, kind, 0.0, hi)
    cnt = _output(x, out, m, A, a1, kind)
    return m + A, cnt, it, ok


@njit(cache=CACHE)
def _kind(a1):
    if a1 == 0.0:
        return _K_EXP
    elif a1 == 1.0:
        return _K_SPARSE
    elif a1 == 0.5:
        return _K_15
    return _K_GEN


@njit(cache=CACHE)
def _solve_newton(x, out, a1, c):
    """``method="newton"``, alpha <= 2: safeguarded Newton from A = 0."""
    kind = _kind(a1)
    m, k = _max_gather(x, 1.0 / a1 if a1 > 0.0 else np.inf, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, a1, kind, 0.0)
    closed = False
    return _finish(x, out, m, k, a1, kind, 0.0, 0.0, c[:k], k, closed)


@njit(cache=CACHE)
def _solve_sparse(x, out, c, aux, aux2):
    """alpha = 2, ``method=None``: Condat's algorithm, polished by Newton."""
    m, k = _max_gather(x, 1.0, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, 1.0, _K_SPARSE, 0.0)
    A0, ns = _condat(c, k, aux, aux2)
    closed = True
    return _finish(x, out, m, k, 1.0, _K_SPARSE, A0, 0.0, aux[:ns], ns, closed)


@njit(cache=CACHE)
def _solve_15(x, out, c, seed):
    """alpha = 1.5, ``method=None``: randomised pivot, polished by Newton."""
    m, k = _max_gather(x, 2.0, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, 0.5, _K_15, 0.0)
    A0, s0 = _pivot15(c, k, seed)
    closed = A0 >= 0.0
    if not closed:
        s0 = 0
    return _finish(x, out, m, k, 0.5, _K_15, A0, 0.0, c[s0:k], k - s0, closed)


@njit(cache=CACHE)
def _lower_bound(c, k, a1, aux, aux2, seed):
    """The exact 1.5-entmax (alpha < 1.5) or sparsemax (1.5 < alpha < 2) threshold of the
    candidates: e_alpha(d) is nonincreasing in alpha, so it is a lower bound of this row's
    threshold, cheap (no powers), and prunes the candidates to a thin shell."""
    if a1 < 0.5:
        kb = _compact(c, k, 0.5, _K_15, 0.0, aux)
        return _pivot15(aux, kb, seed)[0]
    kb = _compact(c, k, 1.0, _K_SPARSE, 0.0, aux)
    return _condat(aux, kb, aux2, aux)[0]  # aux is consumed in place (Condat's trick)


@njit(cache=CACHE)
def _solve_gen(x, out, a1, c, aux, aux2, seed):
    """1 < alpha < 2 (not 1.5), ``method=None``: lower bound, then Newton."""
    m, k = _max_gather(x, 1.0 / a1, c)  # max, candidates in the window
    if not (m > -np.inf):  # an all -inf row (or n = 0)
        for i in range(out.shape[0]):
            out[i] = 0.0
        return -np.inf, 0, 0, True
    k = _refilter(c, k, m, a1, _K_GEN, 0.0)
    lo = 0.0
    Ab = _lower_bound(c, k, a1, aux, aux2, seed)
    if Ab > 0.0:
        lo = Ab - _LB_MARGIN * (1.0 + Ab)  # certainly below, despite rounding
        if lo < 0.0:
            lo = 0.0
        k = _compact(c, k, a1, _K_GEN, lo, c)
    closed = False
    return _finish(x, out, m, k, a1, _K_GEN, lo, lo, c[:k], k, closed)


@njit(cache=CACHE)
def _solve_row(x, out, a1, method, c, aux, aux2, seed):
    """One row: returns (theta, support, n_iter, converged); writes ``out``."""
    if a1 > 1.0:
        return _solve_big(x, out, a1, method, c, seed)
    if method == METHOD_BISECT:
        return _solve_bisect(x, out, a1, c)
    if method == METHOD_NEWTON:
        return _solve_newton(x, out, a1, c)
    if a1 == 0.0:
        return _solve_softmax(x, out, c)
    if a1 == 1.0:
        return _solve_sparse(x, out, c, aux, aux2)
    if a1 == 0.5:
        return _solve_15(x, out, c, seed)
    return _solve_gen(x, out, a1, c, aux, aux2, seed)


# --------------------------------------------------------------------------- drivers
# Every driver solves rows r0 .. r1 - 1 of ``x`` with the GIL released (``nogil``); the
# threads of :func:`entmax_rows` each run one on its own blocks of rows.  A row's answer
# depends only on the row (its random pivots are seeded with the row index), never on
# the block or the thread.


@njit(nogil=True, cache=CACHE)
def _rows_softmax(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = _solve_softmax(x[r], out[r], c)


@njit(nogil=True, cache=CACHE)
def _rows_sparse(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    n = x.shape[1]
    c = np.empty(n, np.float64)
    aux = np.empty(n, np.float64)
    aux2 = np.empty(n, np.float64)
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = _solve_sparse(x[r], out[r], c, aux, aux2)


@njit(nogil=True, cache=CACHE)
def _rows_15(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = _solve_15(x[r], out[r], c, r)


@njit(nogil=True, cache=CACHE)
def _rows_gen(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    n = x.shape[1]
    c = np.empty(n, np.float64)
    aux = np.empty(n, np.float64)
    aux2 = np.empty(n, np.float64)
    for r in range(r0, r1):
        th, sup, it, ok = _solve_gen(x[r], out[r], alpha[r] - 1.0, c, aux, aux2, r)
        theta[r], support[r], n_iter[r], converged[r] = th, sup, it, ok


@njit(nogil=True, cache=CACHE)
def _rows_big(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        th, sup, it, ok = _solve_big(x[r], out[r], alpha[r] - 1.0, method, c, r)
        theta[r], support[r], n_iter[r], converged[r] = th, sup, it, ok


@njit(nogil=True, cache=CACHE)
def _rows_any(x, alpha, method, out, theta, support, n_iter, converged, r0, r1):
    n = x.shape[1]
    c = np.empty(n, np.float64)
    aux = np.empty(n, np.float64)
    aux2 = np.empty(n, np.float64)
    for r in range(r0, r1):
        th, sup, it, ok = _solve_row(x[r], out[r], alpha[r] - 1.0, method, c, aux, aux2, r)
        theta[r], support[r], n_iter[r], converged[r] = th, sup, it, ok


def _driver(alpha, method):
    """The driver that compiles least for these rows: one path when every row takes it."""
    a = alpha[0]
    if not (alpha == a).all():
        if method != METHOD_BISECT and (alpha > 2.0).all():
            return _rows_big
        return _rows_any
    if a > 2.0:
        return _rows_big
    if method != METHOD_DEFAULT:
        return _rows_any
    if a == 1.0:
        return _rows_softmax
    if a == 2.0:
        return _rows_sparse
    if a == 1.5:
        return _rows_15
    if 1.0 < a < 2.0:
        return _rows_gen
    return _rows_any


def entmax_rows(x, alpha, method, out, theta, support, n_iter, converged, nblk):
    """alpha-entmax of every row of ``x`` (rows, n) into ``out`` (same shape and dtype);
    per-row ``theta`` (float64), ``support``, ``n_iter`` (int64), ``converged`` (bool).
    Rows are processed in ``nblk`` blocks (one scratch allocation per block) on
    ``numba.get_num_threads()`` Python threads (:func:`~._threads.run_blocks`)."""
    run_blocks(_driver(alpha, method), (x, alpha, method, out, theta, support, n_iter, converged), x.shape, nblk)
