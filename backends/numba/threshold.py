"""Threshold searches of the numba row solvers for 1 <= alpha <= 2: the mass function and
its safeguarded Newton and bisection, Condat's sparsemax support, and the randomised
1.5-entmax pivot (units as in :mod:`.rows`)."""

from __future__ import annotations

import math

import numpy as np

from ..constants import MAX_ITER
from ._jit import jit
from .compensated import acc as _acc
from .elementwise import K_EXP, K_GEN, TIE, is_alive, p_u


@jit
def _f_eval(c, k, a1, kind, A, lo, compact):
    """``f(A) = sum p - 1`` (compensated), ``sum u`` over the candidates ``c[:k]``; when
    ``compact``, candidates that are zero at the lower bound ``lo <= A`` are dropped in place
    (each is zero at ``A`` too, so f and sum u are those over every candidate).
    Returns (f, sum_u, new k)."""
    s = 0.0
    comp = 0.0
    su = 0.0
    j = 0
    for i in range(k):
        y = c[i]
        p, u = p_u(y - A, a1, kind)
        s, comp = _acc(s, comp, p)
        su += u
        if compact:
            if is_alive(y - lo, a1, kind):
                c[j] = y
                j += 1
    if not compact:
        j = k
    return (s - 1.0) + comp, su, j


@jit(forceinline=True)
def phi_step(A, f, fp, a1):
    """Newton's step on phi(A) = ((f + 1)^a1 - 1) / a1 (log(f + 1) at a1 = 0) from A, given
    ``f(A)`` and ``fp = -f'(A)``: phi is the (1/a1)-norm of the [1 + a1 (y - A)]_+, convex
    and nearly linear (exactly linear for a constant row, and for softmax), so the steps
    from the left are monotone and far fewer than on f."""
    ls = math.log1p(f)
    phi = math.expm1(a1 * ls) / a1 if a1 > 0.0 else ls
    return A + phi / (math.exp((a1 - 1.0) * ls) * fp)


@jit
def newton_step(A, f, fp, f_prev, bracket, a1, on_phi):
    """One step of the safeguarded Newton iteration, after ``f(A)`` and ``fp = -f'(A)``:
    the bracket ``bracket = (lo, hi, flo, fhi)`` (``[lo, hi]`` with ``|f|`` at its ends,
    ``flo``/``fhi``) narrowed by A, then
    a Newton step (on ``phi``, the (1/a1)-norm form below, when ``on_phi``; else on f), or a
    bisection when the step leaves the bracket or f did not change since ``f_prev``.
    Returns (done, A, lo, hi, flo, fhi): A is the next point, or the answer when done."""
    lo, hi, flo, fhi = bracket
    if f == 0.0:
        return True, A, lo, hi, flo, fhi
    if f == f_prev and abs(f) <= TIE:
        # the step changed nothing in f, and f is within its own rounding error of 0: A is
        # a root to working precision.  (Bisecting the bracket from here, as the flat case
        # below does, spent some 50 evaluations to move A by an ulp or two: a polished
        # closed form whose f sits at +1.5 eps on both sides of an ulp step did this on
        # 7% of 27-candidate attention rows, 8 evaluations a row on average instead of 1.3.)
        return True, A, lo, hi, flo, fhi
    if f > 0.0:
        lo = A
        flo = f
    else:
        hi = A
        fhi = -f
    if fp > 0.0 and f > -1.0:
        if on_phi:
            An = phi_step(A, f, fp, a1)
        else:
            An = A + f / fp
    else:
        An = 0.5 * (lo + hi)
    if An == A:
        return True, A, lo, hi, flo, fhi
    # a computed f that did not change is flat at this resolution (e.g. a term
    # 1 - O(1e-20) that rounds to 1): Newton would creep, so bisect instead
    if f == f_prev or not (An > lo and An < hi):
        mid = 0.5 * (lo + hi)
        if not (mid > lo and mid < hi):
            return True, (lo if flo <= fhi else hi), lo, hi, flo, fhi
        An = mid
    return False, An, lo, hi, flo, fhi


@jit
def newton_row(c, k, a1, kind, A, lo, hi):
    """Safeguarded Newton on ``f`` (described in :mod:`.rows`; one step is
    :func:`newton_step`, on ``phi`` for alpha = 1 and the general kind), from ``A`` in
    ``[lo, hi]``.  Returns (A, evaluations, converged)."""
    flo = np.inf  # |f| at lo / hi once evaluated there
    fhi = np.inf
    last_lo = lo  # lower bound at which c was last filtered
    f_prev = np.nan
    on_phi = kind == K_GEN or kind == K_EXP
    it = 0
    while it < MAX_ITER:
        f, fp, k = _f_eval(c, k, a1, kind, A, lo, lo > last_lo)
        if lo > last_lo:
            last_lo = lo
        it += 1
        done, A, lo, hi, flo, fhi = newton_step(A, f, fp, f_prev, (lo, hi, flo, fhi), a1, on_phi)
        if done:
            return A, it, True
        f_prev = f
    return A, it, False


@jit(forceinline=True)
def halve(lo, hi):
    """The reference's bisection step: the midpoint of ``[lo, hi]``, and whether it equals
    an endpoint (then the bracket cannot be split and the bisection stops)."""
    mid = 0.5 * (lo + hi)
    return mid, mid <= lo or mid >= hi


@jit
def bisect_row(c, k, a1, kind, lo, hi):
    """The reference's bisection (midpoint until it equals an endpoint, then the endpoint
    with the smaller |f|).  Returns (A, halvings, converged)."""
    it = 0
    flo = np.nan
    fhi = np.nan
    last_lo = lo
    done = False
    for _ in range(MAX_ITER):
        mid, done = halve(lo, hi)
        if done:
            break
        f, fp, k = _f_eval(c, k, a1, kind, mid, lo, lo > last_lo)
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
        done = halve(lo, hi)[1]
    if flo != flo:
        flo = _f_eval(c, k, a1, kind, lo, lo, np.bool_(False))[0]
    if fhi != fhi:
        fhi = _f_eval(c, k, a1, kind, hi, lo, np.bool_(False))[0]
    A = hi if abs(fhi) < abs(flo) else lo
    return A, it, done


@jit
def condat(c, k, v, vt):
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
        s, comp = _acc(s, comp, v[q])
    return ((s + comp) - 1.0) / nv + 1.0, nv


@jit(forceinline=True)
def pivot_seed(seed):
    """The pivot generator's state for a row (a deterministic function of the seed)."""
    return np.int64(seed) * np.int64(2654435761) + np.int64(1013904223)


@jit(forceinline=True)
def random_entry(state, c, lo, hi):
    """Advance the 64-bit LCG and return (state, a pseudo-random entry of c[lo:hi])."""
    state = state * np.int64(6364136223846793005) + np.int64(1442695040888963407)
    r = (state >> 33) & 0x3FFFFFFF
    return state, c[lo + r % (hi - lo)]


@jit(forceinline=True)
def partition3(c, lo, hi, v):
    """Three-way partition of ``c[lo:hi]`` around ``v`` in place: returns ``(lt, gt, s1,
    s2)`` with ``c[lo:lt] < v``, ``c[lt:gt] == v``, ``c[gt:hi] > v``, and the sums of
    ``y - v`` and ``(y - v)^2`` over the entries above v (a caller that does not use
    them pays nothing: the function is inlined and the dead sums removed).  Two
    Lomuto passes with no branch on the data (every entry is swapped, the boundary
    advanced by the test): the entries below v to the front, then, among the rest, those
    equal to v; a branch on the comparisons would be mispredicted about every other entry
    of a random pivot's partition."""
    lt = lo
    s1 = 0.0
    s2 = 0.0
    for i in range(lo, hi):
        y = c[i]
        e = max(y - v, 0.0)
        s1 += e
        s2 += e * e
        c[i] = c[lt]
        c[lt] = y
        lt += y < v
    gt = lt
    for i in range(lt, hi):
        y = c[i]
        c[i] = c[gt]
        c[gt] = y
        gt += not (y > v)
    return lt, gt, s1, s2


@jit
def pivot15(c, k, seed):
    """Expected-O(k) 1.5-entmax threshold on ``c[:k]`` by randomised pivoting (permutes
    ``c`` in place, keeps every element).  Returns ``(A, s0)``: ``A = t + 2`` where ``t``
    is the closed-form root of ``sum_{y > t} (y - t)^2 = 4`` on the identified support
    ``c[s0:k]``, or -1.0 when rounding left no usable support."""
    lo = np.int64(0)  # counters reach helpers: not literals (the package docstring)
    hi = k
    kk = 0
    mean = 0.0
    m2 = 0.0
    state = pivot_seed(seed)
    while hi > lo:
        state, v = random_entry(state, c, lo, hi)
        lt, gt, s1, s2 = partition3(c, lo, hi, v)
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
