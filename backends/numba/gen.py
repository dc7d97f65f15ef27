"""1 < alpha < 2 (other than 1.5) of the numba row solvers, on compacted candidates.

After the lower bound (:func:`.rows.solve_gen`), the row's candidates above it, the entries
with ``a1 (y - lo) > -1`` (about 155 of a normal row of 8192 at alpha = 1.33), are gathered
once into a contiguous array with their column indices, and everything after works on that
array alone (units as in :mod:`.rows`):

* the mass ``f(A) = sum p - 1`` and ``sum u`` (:func:`_f_gen`) in one loop that LLVM
  vectorises: ``p = exp(log1p(w) / a1)``, ``w = a1 (y - A)``, with the straight-line
  :func:`.vexp.vlog1p` and :func:`.vexp.vexp` (``math.log1p`` and ``math.exp`` are libm
  calls, one element at a time: 10 of the 17 ms of a 128-row block went there), summed in
  ``GL`` independent TwoSum lanes merged with Neumaier's step (the accuracy of a compensated
  sum, whatever the order);
* the safeguarded Newton iteration of :func:`.threshold.newton_row` on ``phi``, step for step
  (same bracket, same fallbacks, same stopping rules), dropping the candidates that are zero
  at the lower bound as it grows.  Its early steps, while f is far above 0, evaluate f
  with :func:`.vexp.vlog1p_rough` and :func:`.vexp.vexp_rough` (about 3e-8 relative, two
  divisions a candidate instead of four: the first two evaluations run on every candidate
  and were half the work); they move the iterate and the lower end of the bracket only
  where the rough f is certainly positive, and the exact iteration finishes
  (:func:`_newton_gen`);
* the output pass (:func:`_output_gen`): the row was zero-filled in the maximum pass
  (:func:`.candidates.max_zeroing`), and the probabilities of the candidates, computed
  by the same vectorised map, are written at their indices; an entry off the candidates
  is zero at every ``A >= lo``.

The functions agree with libm's to about 1 ulp each (``vlog1p`` 0.75 ulp, ``vexp`` 0.8 ulp,
worst seen), so ``p`` and the threshold differ from the libm-based map by a few float64 ulps
at most, well inside the accuracy contract (``tests/test_numba_rows.py``,
``tests/test_oracle.py``); they are not bitwise those of ``newton_row`` and ``write_output``.
"""

from __future__ import annotations

import numpy as np

from ..constants import MAX_ITER
from ._jit import jit
from .compensated import acc, merge_lanes, two_sum
from .candidates import gather_alive
from .elementwise import K_GEN, K_SPARSE, is_alive, bound_above
from .threshold import newton_step, phi_step
from .vexp import div, vexp, vexp_rough, vlog1p, vlog1p_rough

#: lanes of the candidate sums (two AVX2 registers of float64 per accumulator)
GL = 8

#: Newton's early steps use the rough functions while their f is above ROUGH_F (there it
#: is certainly positive: its error is below 1e-7 (1 + f)), and the next evaluation is
#: exact once f falls below ROUGH_SWITCH (Newton's next f is then about f^2 or less)
ROUGH_F = 1e-3
ROUGH_SWITCH = 0.05
#: below this a1 the rounding of 1 + w, divided by a1, would dominate the rough p's error:
#: the iteration is exact throughout
ROUGH_MIN_A1 = 1e-6


@jit(forceinline=True)
def _pu_gen(y, A, a1):
    """``p = e_alpha(y - A)`` and ``u = p^(2 - alpha) = p / (1 + w)``, 0 off the support, as
    selects (no branch), with the vectorisable log1p and exp."""
    w = a1 * (y - A)
    alive = w > -1.0
    t = w if alive else 0.0
    p = vexp(div(vlog1p(t), a1))
    u = div(p, 1.0 + t)
    return (p if alive else 0.0), (u if alive else 0.0)


@jit(forceinline=True)
def _mass(P, Q, k, lanes, exact):
    """``(sum P[:k] - 1, sum Q[:k])`` in ``L`` lanes, one per position in a block of ``L``
    consecutive entries (``lanes``: float64 scratch of shape (3, L)); with ``exact`` (a
    run-time bool) the first is compensated: a TwoSum lane each, merged with Neumaier's
    step (the rough evaluations, whose terms carry 3e-8 errors, skip it: 40% of their
    saving otherwise)."""
    L = lanes.shape[1]
    lanes[:3] = 0.0
    S = lanes[0]
    C = lanes[1]
    U = lanes[2]
    nb = k // L
    for b in range(nb):
        o = b * L
        for j in range(L):
            i = np.uint64(o + j)  # unsigned, not a slice a block: see .candidates.lane_max
            if exact:
                S[j], err = two_sum(S[j], P[i])
                C[j] += err
            else:
                S[j] += P[i]
            U[j] += Q[i]
    s, comp = merge_lanes(S, C, L)
    su = 0.0
    for j in range(L):
        su += U[j]
    for i in range(nb * L, k):
        s, comp = acc(s, comp, P[i])
        su += Q[i]
    return (s - 1.0) + comp, su


@jit
def _f_gen(c, k, a1, A, buf, lanes):
    """``f(A) = sum p - 1`` (compensated) and ``sum u`` over ``c[:k]``: the ``p`` and ``u`` in
    one vectorised loop into ``buf`` (float64, shape (2, >= k)), then their sums
    (:func:`_mass`)."""
    P = buf[0]
    Q = buf[1]
    for i in range(k):
        P[i], Q[i] = _pu_gen(c[i], A, a1)
    return _mass(P, Q, k, lanes, np.bool_(True))


@jit(forceinline=True)
def _pu_gen_rough(y, A, a1, inv_a1):
    """:func:`_pu_gen` with :func:`.vexp.vlog1p_rough` and :func:`.vexp.vexp_rough` (and a
    product by ``1 / a1`` for the division).  For ``a1 >= ROUGH_MIN_A1``, ``p`` is within
    3e-8 relative where ``p > 1e-9``: ``log p`` is then above -21, so the log's 1e-9
    relative error moves it by at most 2.1e-8, the rounding of ``1 + w`` (over ``a1``) by
    at most 1.1e-10, and the exponential adds 7.7e-9.  Below 1e-9 a term's error is a
    small multiple of itself."""
    w = a1 * (y - A)
    alive = w > -1.0
    t = w if alive else 0.0
    p = vexp_rough(vlog1p_rough(t) * inv_a1)
    u = div(p, 1.0 + t)
    return (p if alive else 0.0), (u if alive else 0.0)


@jit
def _f_gen_rough(c, k, a1, A, buf, lanes):
    """:func:`_f_gen` with :func:`_pu_gen_rough`: ``f`` within about 4e-8 (1 + f) (the
    terms' errors), for Newton's early steps only."""
    P = buf[0]
    Q = buf[1]
    inv_a1 = 1.0 / a1
    for i in range(k):
        P[i], Q[i] = _pu_gen_rough(c[i], A, a1, inv_a1)
    return _mass(P, Q, k, lanes, np.bool_(False))


@jit
def _compact_gen(c, idx, k, a1, lo):
    """Keep, in order, the candidates of ``c[:k]`` (and their indices) alive at ``lo``; the
    others are zero at every ``A >= lo``.  Returns the new count."""
    j = 0
    for i in range(k):
        y = c[i]
        c[j] = y
        idx[j] = idx[i]
        j += is_alive(y - lo, a1, K_GEN)
    return j


@jit
def _rough_steps(cand, k, a1, A, lo, hi, scratch, switch):
    """Newton's early steps on phi with rough evaluations (:func:`_f_gen_rough`) on the
    candidates ``cand = (c, idx)``: ``c[:k]`` (columns ``idx[:k]``, filtered at ``lo``;
    ``scratch = (buf, lanes)``), from ``A``: while the
    rough f is above :data:`ROUGH_F` (so f > 0 certainly, and A is a lower bound of the
    root: the bracket's ``lo`` and the compaction move there), until a step leaves the
    bracket ``(A, hi)`` or follows an f below ``switch``.  Returns (A, lo, k, last_lo,
    evaluations): the next point, the last certain lower bound, the candidates left and
    the bound at which they were last filtered."""
    c, idx = cand
    buf, lanes = scratch
    last_lo = lo
    it = 0
    while it < MAX_ITER and a1 >= ROUGH_MIN_A1:
        if lo > last_lo:
            k = _compact_gen(c, idx, k, a1, lo)
            last_lo = lo
        f, fp = _f_gen_rough(c, k, a1, A, buf, lanes)
        it += 1
        if not (f > ROUGH_F and fp > 0.0):
            break
        lo = A
        An = phi_step(A, f, fp, a1)
        if not (An > A and An < hi):
            break
        A = An
        if f < switch:
            break
    return A, lo, k, last_lo, it


@jit
def _newton_gen(cand, k, a1, A, lo, hi, scratch):
    """:func:`.threshold.newton_row` for ``K_GEN`` on the compacted candidates (see
    :mod:`.rows`), after early steps with rough evaluations: while the rough f is above
    :data:`ROUGH_F` (so f > 0 certainly, and A is a lower bound of the root: the bracket
    and the compaction move there) Newton steps on phi from it, until one lands where f
    is small (:data:`ROUGH_SWITCH`), leaves the bracket, or the rough f is not clearly
    positive; then the exact safeguarded iteration from there, whose stopping rules give
    the answer.  Returns (A, evaluations of either kind, converged, (k, lo), fresh): the
    candidates left, ``c[:k]``, are those alive at ``lo`` (:func:`_compact_gen`, the bound
    of their last filtering); ``fresh`` when A is the point of the last exact evaluation,
    whose ``p`` of ``c[:k]`` are then in ``buf[0, :k]`` (``cand = (c, idx)``, ``scratch =
    (buf, lanes)``)."""
    c, idx = cand
    buf, lanes = scratch
    flo = np.inf  # |f| at lo / hi once evaluated there (exactly)
    fhi = np.inf
    f_prev = np.nan
    # the exact iteration evaluates A again when the rough steps stop
    A, lo, k, last_lo, it = _rough_steps(cand, k, a1, A, lo, hi, scratch, ROUGH_SWITCH)
    while it < MAX_ITER:
        if lo > last_lo:
            k = _compact_gen(c, idx, k, a1, lo)
            last_lo = lo
        f, fp = _f_gen(c, k, a1, A, buf, lanes)
        it += 1
        at = A
        done, A, lo, hi, flo, fhi = newton_step(A, f, fp, f_prev, (lo, hi, flo, fhi), a1, np.bool_(True))
        if done:
            return A, it, True, (k, last_lo), A == at
        f_prev = f
    return A, it, False, (k, last_lo), False


@jit
def _output_gen(x, out, A, a1, cand, k, pbuf, fresh):
    """Write ``p = e_alpha(x - m - A)`` for the whole row, whose ``out`` is already zero
    (:func:`.candidates.max_zeroing`): the candidates' ``p`` (computed into ``pbuf`` in a
    vectorised loop, unless ``fresh``: the Newton iteration's last evaluation left them
    there, at this A) at their indices (``cand = (c, idx)``).  Returns the support size
    (p > 0 in float64)."""
    c, idx = cand
    if not fresh:
        for j in range(k):
            pbuf[j] = _pu_gen(c[j], A, a1)[0]
    cnt = 0
    for j in range(k):
        p = pbuf[j]
        out[idx[j]] = p
        cnt += p > 0.0
    return cnt


#: the window of :func:`subset_bound_gen`: the entries with ``y > -GEN_WINDOW``
GEN_WINDOW = 1.25


@jit
def subset_bound_gen(x, m, a1, c, idx):
    """A lower bound of the threshold of a row with maximum m: the rough steps of
    :func:`_rough_steps` on alpha's own mass over the entries within :data:`GEN_WINDOW` of
    the maximum (some 55 of a normal row of 8192, gathered into ``c``, their columns into
    ``idx``), run until the rough mass is no longer certainly positive.  A point where the
    subset's mass is certainly above 1 is below the subset's root, and the subset's mass
    is at most the row's at every A, so below the row's root too.  At alpha = 1.33 on
    normal rows it leaves some 155 candidates for the row's Newton, against 364 above
    the 1.5-entmax threshold it replaces (140 are alive at the answer).  Returns (the
    bound, its evaluations)."""
    k = gather_alive(x, m, 1.0, K_SPARSE, 1.0 - GEN_WINDOW, c, idx)  # y > -GEN_WINDOW
    buf = np.empty((2, k), np.float64)
    lanes = np.empty((3, GL), np.float64)
    res = _rough_steps((c, idx), k, a1, 0.0, 0.0, bound_above(k, a1), (buf, lanes), 0.0)
    return res[1], res[4]


@jit
def finish_gen(x, out, m, a1, lo, cand, k, pbuf):
    """:func:`.rows._finish` for ``K_GEN`` from the lower bound ``lo``: Newton on the ``k``
    candidates ``cand = (c, idx)``, ``c[:k]`` (columns ``idx[:k]``), then the output pass.
    Returns ((theta, support, evaluations, converged), (k, lo)): the candidates left in
    ``cand``'s first ``k``, in row order, are those of the row alive at ``lo``
    (:func:`_newton_gen`)."""
    hi = bound_above(k, a1)
    A0 = lo if lo <= hi else hi
    if hi > lo:
        buf = np.empty((2, k), np.float64)
        lanes = np.empty((3, GL), np.float64)
        A, it, ok, (k, lo), fresh = _newton_gen(cand, k, a1, A0, lo, hi, (buf, lanes))
        if fresh:
            pbuf = buf[0]
    else:  # a single candidate: the row maximum carries all the mass
        A, it, ok, fresh = lo, 0, True, False
    cnt = _output_gen(x, out, A, a1, cand, k, pbuf, fresh)
    return (m + A, cnt, it, ok), (k, lo)
