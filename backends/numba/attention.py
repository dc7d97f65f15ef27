"""Attention kernels of the numba backend: fused, support-only forward and backward.

Both directions walk the query chunks of the NumPy driver
(:mod:`entmax_ref.backends.attention_driver`: the same chunk sizes, the same causal key
ranges ``[0, key_end)`` per chunk, rows of all query heads of a kv-head together) and
compute the same quantities in float64 (every score that can carry mass is the float64
``s_i * (scale * q_i.k_j) - slope_h |i_abs - j|`` of the reference, operation by
operation); only the organisation of the work differs.

Scores.  For alpha > 1 a row's support lies within ``W = 1/(alpha - 1)`` of its
threshold (``p_j > 0`` only if ``z_j > theta - W``), so most keys carry nothing.  Per
chunk, one *float32* BLAS product ``g32 = q.k`` serves as a filter: with the rigorous
bound ``|z(g32) - z| <= err_i`` (:func:`score_errors`; Higham's ``gamma_{D+3} ||q|| ||k||``
scaled by ``scale |s_i|``), a key whose approximate score is below ``theta_lb - W -
2 err`` (``theta_lb`` a lower bound of the threshold: four Newton steps, from the left,
on the approximate scores, :func:`_theta_lower`) certainly has ``p = 0``; the other keys
(the candidates, about the support size) get their exact float64 score by a dot product.
The row solver then runs on the candidates only, which gives the threshold and support of
the whole row (the others contribute exactly 0 at every threshold at or above it).  A
row whose float32 scores are not finite or huge, alpha = 1 (no window), and chunks where
the candidates exceed :data:`FILTER_FRACTION` of the keys use a float64 BLAS product
instead.  The reference's overflow check (any non-finite score in the block raises) is
kept: exactly where the float32 scores are suspect.  The forward forms the float32 product
a block of a chunk's rows at a time (:data:`FILTER_BLOCK_BYTES`), up to the last key the
block's rows see, and runs ``fwd_rows`` on each block while its scores are in cache.

forward (``fwd_rows``, per row)
    candidates and exact scores; the compiled row solver of
    :mod:`entmax_ref.backends.numba.rows`; then ``o_i = sum_{p_ij > 0} p_ij v_j`` and the
    skewed output ``skew_i = sum u_ij v_j / sum u_ij`` (``u = p^(2 - alpha)``).  The row's
    residual goes straight into the forward's arrays (:func:`_row_result`); only ``o_i``
    passes through a float64 scratch row, which the driver converts to q's dtype.  A
    forward that keeps no residual (``AttentionSpec.residual`` off: ``er.attention``
    without ``return_info``) forms neither the skewed output nor the support keys.

backward (``bwd_rows`` then ``bwd_scatter``)
    the candidates: the support's keys the forward kept (``AttentionForward.support_keys``,
    :func:`_store_keys`: up to :func:`keys_width` a row), whose exact scores are the only
    ones computed (a chunk whose rows all have them forms no score product and runs no
    filter pass); else the filter against the forward's theta.  ``p_j = e_alpha(z_j - theta_i)`` and ``u_j =
    p_j^(2 - alpha)`` as the row solvers' output pass forms them
    (:func:`~.elementwise._p_u`: the reference's ``exp(log1p(a1 y) / a1)``, closed forms at
    alpha = 1.5 and 2) on them (alpha > 2: edge-relative
    from the forward's row max, edge and edge probability, :func:`~.big_alpha._edge_p`, and dZ in
    the row VJP's overflow-free form, :func:`_dz_big`); the support is compacted
    (key, ``p``, ``u``), the skewed output recomputed from it when the caller has none,
    ``delta_i = dO_i . skew_i``, ``dZ_ij = u_ij (dO_i . v_j - delta_i)`` (a dot product per
    *support* entry, no dense ``dO V^T``), ``ds_i = sum_j dZ_ij a_ij``, ``dQ_i = scale sum_j
    s_i dZ_ij k_j``.  ``bwd_scatter`` adds ``dV_j += p_ij dO_i`` and ``dK_j += scale s_i
    dZ_ij q_i`` over the compacted entries.  When a chunk's support is dense (more than
    :data:`DENSE_FRACTION` of its block) the entries are expanded into dense blocks and dK,
    dV use BLAS.  alpha = 1 (softmax: the support is every visible key) uses the NumPy
    driver's backward.  With ``spec.alpha_grad`` each row's dL/dalpha is the compiled row alpha
    VJP (:mod:`entmax_ref.backends.numba.grads`) of the compacted support's ``p`` and
    ``dO . v_j``.

Alpha per head: every row takes its head's alpha (window, solver, weights); the float32
filter is used only in chunks without a softmax head.  Key masks: when the keys a batch
may attend form one run ``lo <= j < hi``, the batch runs as the key-sliced problem
``k[b, :, lo:]`` with ``hi - lo`` valid keys (:func:`entmax_ref.backends.attention_driver.
forward_by_key_runs`, ``backward_by_key_runs``); masks with holes use the NumPy driver with
the compiled row solver.  The forward's routing (key runs, then the decoding path of
:mod:`entmax_ref.backends.numba.decode` or this chunked forward) is the numba backend's
``attention_forward``; :func:`attention_forward` hands a key-masked call back to it.

Threads.  ``numba.get_num_threads()`` Python worker threads take chunks (largest first)
from a queue (the backward: each from its own list, fixed in advance); each runs a BLAS
product and a ``nogil`` kernel (no ``prange``) on its chunk, so the kernels need no
thread-safe numba threading layer.  Results do not depend on thread timing
(:func:`_run_parallel`).  While any attention call runs,
BLAS is held at one thread (:func:`_single_threaded_blas`: threadpoolctl, shared by
concurrent calls, and the caller's count restored when the last one ends; a multi-threaded
BLAS alternating with the kernels leaves two thread pools spinning against each other).
Each worker accumulates dK, dV of the current kv-head in its own float64 buffer, summed in
worker order at the head's end (one shared buffer, the chunks' parts added in chunk order,
when those would exceed :data:`ACCUMULATOR_BYTES`).

Compile cost.  The helpers are plain ``@njit`` functions, not ``inline="always"``:
numba's IR-level inlining types every inlined body again at each call site (the forward
and backward each inlined ``_candidates`` three times, ``_score`` a dozen times), which
was most of the attention units' compile time, while LLVM inlines the small helpers into
their callers anyway (the warm run time did not change; docs/performance.md).  Constants
that reach a callee are run-time values (``np.int64(0)``, ``np.bool_(True)``): numba
compiles a separate copy of the callee for each literal argument, the forward's and the
backward's ``_candidates`` were two copies (``use_max`` True and False), and a counter
that starts at a literal ``0`` and is passed on (``m = 0; ...; f(m)``) compiles the callee
twice, once for the ``Literal[int](0)`` that type inference sees first and once for int64.

Reference counts.  numba increfs every array argument of a compiled function on entry
and decrefs it on return (an atomic add each, on a counter the threads share): about 60
pairs a forward row, through the per-row helpers, were 4-5% of a forward's time.  The
per-row helpers of both directions (:func:`_candidates_fast` and what it calls,
:func:`_row_result`, :func:`_solve_weigh`, the backward's row helpers) allocate nothing
and return no array, so they are compiled without reference counting (``_nrt=False``):
they borrow the arrays of the kernel that calls them, which holds them for the call.

Memory: per worker, one ``(rows, key_end)`` score block (float32 on the filter path) and
in the backward three more of the compacted support (int32 key, float64 ``p`` and
``u`` / ``s dZ``; ``(rows, width)`` and no score block where the chunk's rows have
their keys); the chunk is the driver's (a float64 block of ~8 MiB).  The forward's
support keys take at most 4 bytes x :func:`keys_width` a row (no more than the float64
skewed output), and are trimmed to the largest support when the forward ends.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import CACHE
from ._threads import run_items
from .candidates import MASK_MIN, _set_bits
from ..attention_driver import backward_by_key_runs, batch_chunks, empty_forward
from ..geometry import key_offset, visible_keys_end
from .big_alpha import _edge_p, _lqa
from .compensated import acc as _acc
from .grads import _alpha_vjp_row, _alpha_vjp_row_big, _signed_exp, _skew
from .elementwise import _p_u
from .rows import _kind, _solve_default, _solver_scratch

#: The fewest support keys the forward keeps room for per row (``AttentionForward.support_keys``,
#: int32; :func:`keys_width`); a row with a larger support has it found again by the
#: backward's filter.
SUPPORT_KEYS = 64

#: Support density of a chunk (nonzeros / block size) above which the backward forms
#: dK and dV with BLAS on dense blocks instead of the support-only scatter.
DENSE_FRACTION = 0.125


@njit(cache=CACHE)
def _visible(r, nc, i0, offset, key_end, causal):
    """(query head index within the group, absolute query index, visible key count)."""
    h = r // nc
    i_abs = i0 + (r - h * nc) + offset
    n = key_end
    if causal:
        n = min(key_end, i_abs + 1)
        if n < 0:
            n = 0
    return h, i_abs, n


@njit(cache=CACHE, _nrt=False)
def _row_params(r, nc, i0, offset, key_end, causal, alphas, row_scale, has_s):
    """Row ``r`` of a chunk: :func:`_visible`'s (h, i_abs, n), then its head's ``a1 =
    alpha - 1``, ``a2 = 2 - alpha``, whether alpha > 2, the support window ``1/a1``
    (inf at alpha = 1) and the row's ASEntmax scale ``s`` (1 without one)."""
    h, i_abs, n = _visible(r, nc, i0, offset, key_end, causal)
    a1 = alphas[h] - 1.0
    a2 = 2.0 - alphas[h]
    window = 1.0 / a1 if a1 > 0.0 else np.inf
    s = row_scale[r] if has_s else 1.0
    return h, i_abs, n, a1, a2, alphas[h] > 2.0, window, s


@njit(cache=CACHE)
def _candidate_buffers(key_end):
    """Scratch of :func:`_candidates` for rows of up to ``key_end`` keys: the approximate
    scores ``za`` and the candidates' key ``idx``, exact score ``zc`` and exact q.k ``gx``."""
    return (np.empty(key_end, np.float64), np.empty(key_end, np.int64), np.empty(key_end, np.float64),
            np.empty(key_end, np.float64))


@njit(cache=CACHE)
def _score(gv, scale, s, has_s, slope, i_abs, j):
    """The reference's z: ``a = scale * g``, ``z = a * s``, ``z = z - slope * |i_abs - j|``."""
    z = scale * gv
    if has_s:
        z = z * s
    if slope != 0.0:
        z = z - slope * np.float64(abs(i_abs - j))
    return z


@njit(cache=CACHE, fastmath={"reassoc", "contract"})
def _dot(qc, r, kk, j):
    """q_r . k_j (``qc[r] . kk[j]``; the backward's dO_r . v_j too) in float64, summed in
    the order the compiler vectorises (``fastmath`` reassociation and fused multiply-adds:
    any order is as exact as BLAS's, and vector lanes are not one serial chain of D
    additions; twice as fast as four explicit partial sums).  ``kk`` is float64 or the
    float32 input itself (converted exactly).  The order depends on the argument types
    and the machine only, so every driver passes K (and V) in the input's precision:
    the chunked forward, the decoding path and the backward then get the same bits."""
    a = 0.0
    for d in range(qc.shape[1]):
        a += qc[r, d] * kk[j, d]
    return a


@njit(cache=CACHE, fastmath={"reassoc", "contract"}, _nrt=False)
def _theta_lower(zc, m, L, a1):
    """A lower bound of the threshold of the scores ``zc[:m]`` (maximum ``L``; every key
    that can carry mass is among them).  For alpha <= 2 the mass ``f(A) = sum_j
    [1 + a1 (z_j - L - A)]_+^(1/a1) - 1`` is convex and decreasing in A, so Newton's
    iterates from A = 0 (where f >= 0) increase and stay below the root; four steps (a
    tighter bound saves more exact dot products and solver work than a step costs, up to
    the fourth: docs/performance.md, session 11), then a relative margin for rounding.
    The sums may be taken in any order (``fastmath`` reassociation: LLVM then vectorises
    them, 3x faster): that changes their last bits, far inside the margin.
    For alpha > 2 (f not convex): L itself."""
    A = 0.0
    if a1 <= 1.0:
        for _ in range(4):
            f = -1.0
            df = 0.0
            if a1 == 0.5:  # branch-free: p = tt^2, dp/dA = -tt
                for i in range(m):
                    tt = max(1.0 + 0.5 * ((zc[i] - L) - A), 0.0)
                    f += tt * tt
                    df += tt
            else:
                for i in range(m):
                    tt = 1.0 + a1 * ((zc[i] - L) - A)
                    if tt > 0.0:
                        p = tt if a1 == 1.0 else math.exp(math.log(tt) / a1)
                        f += p
                        df += p / tt
            if not (f > 0.0) or not (df > 0.0):
                break
            A += f / df
    return (L + A) - 1e-9 * (1.0 + abs(L) + A)


@njit(cache=CACHE)
def _max_cut(L, window, err):
    """The first cut of the float32 filter: a key whose approximate score is at most this
    line, below the row maximum ``L`` of the approximate scores by the window and ``3 err``
    (with margins for rounding), has ``p = 0``.  Shared by every filter pass (the chunked
    forward's and the decoding path's) so that they keep the same keys."""
    return L - (window * (1.0 + 1e-9) + 3.0 * err + 1e-12) - 1e-12 * abs(L)


@njit(cache=CACHE)
def _theta_cut(t, window, err):
    """The second cut: below ``t - window - 2 err`` (``t`` the threshold or a lower bound of
    it, with margins for rounding) a key's approximate score leaves ``p = 0``."""
    return t - window * (1.0 + 1e-9) - 2.0 * err - 1e-12 * (1.0 + abs(t))


@njit(cache=CACHE, _nrt=False)
def _candidates(g, r, n, filt, qc, kk, scale, s, has_s, slope, i_abs, err, window, use_max, t,
                za, idx, zc, gx):
    """The keys of row ``r`` that can carry probability, with their exact float64 scores.

    ``filt = False``: ``g`` holds the float64 q.k; every visible key is a candidate.
    ``filt = True``: ``g`` holds a float32 q.k, within ``err`` of the exact score after
    :func:`_score` (a rigorous bound, see :func:`score_errors`).  A key whose exact score
    is at most ``m - window`` (``m`` the row maximum: forward, ``use_max``) or
    ``t - window`` (``t = theta``: backward) gets ``p = 0`` exactly; it is dropped when
    even its approximate score plus the error cannot reach that line.  The exact score of
    each candidate is then the float64 dot product.  Rows whose approximate scores are
    not finite (or huge) take every key, exactly.  Writes ``idx[:m]`` (key), ``zc[:m]``
    (exact z), ``gx[:m]`` (exact q.k); returns (m, whether every score of the row up to
    ``g.shape[1]`` is finite, checked on the exact scores as the reference does)."""
    key_end = g.shape[1]
    if not filt:
        nonfinite = 0
        for j in range(n):
            z = _score(g[r, j], scale, s, has_s, slope, i_abs, j)
            idx[j] = j
            zc[j] = z
            gx[j] = g[r, j]
            nonfinite += (z - z) != 0.0
        for j in range(n, key_end):
            z = _score(g[r, j], scale, s, has_s, slope, i_abs, j)
            nonfinite += (z - z) != 0.0
        return n, nonfinite == 0
    suspect = 0
    L = -np.inf
    m1 = np.int64(0)  # run-time values, not literals: see "Compile cost" above
    if use_max:
        # the scores and their maximum L (four running maxima: no serial dependency),
        # then, branch-free, every key within the window (+ 3 err) of L
        L0 = -np.inf
        L1 = -np.inf
        L2 = -np.inf
        L3 = -np.inf
        j = np.int64(0)
        while j + 4 <= n:
            z0 = _score(np.float64(g[r, j]), scale, s, has_s, slope, i_abs, j)
            z1 = _score(np.float64(g[r, j + 1]), scale, s, has_s, slope, i_abs, j + 1)
            z2 = _score(np.float64(g[r, j + 2]), scale, s, has_s, slope, i_abs, j + 2)
            z3 = _score(np.float64(g[r, j + 3]), scale, s, has_s, slope, i_abs, j + 3)
            za[j] = z0
            za[j + 1] = z1
            za[j + 2] = z2
            za[j + 3] = z3
            L0 = max(L0, z0)
            L1 = max(L1, z1)
            L2 = max(L2, z2)
            L3 = max(L3, z3)
            j += 4
        while j < n:
            z0 = _score(np.float64(g[r, j]), scale, s, has_s, slope, i_abs, j)
            za[j] = z0
            L0 = max(L0, z0)
            j += 1
        L = max(max(L0, L1), max(L2, L3))
        suspect += not (abs(L) < 1e300) and n > 0
        cut = _max_cut(L, window, err)
        for j in range(n):
            zj = za[j]
            suspect += not (zj > -1e300)
            idx[m1] = j
            zc[m1] = zj
            m1 += zj > cut
    else:
        for j in range(n):
            z = _score(np.float64(g[r, j]), scale, s, has_s, slope, i_abs, j)
            za[j] = z
            suspect += not (abs(z) < 1e300)
    for j in range(n, key_end):
        z = _score(np.float64(g[r, j]), scale, s, has_s, slope, i_abs, j)
        suspect += not (abs(z) < 1e300)
    if suspect == 0:
        if use_max:
            # a lower bound of the threshold of the approximate scores, which is within
            # err of the exact one (theta is 1-Lipschitz in the max norm of the scores)
            t = _theta_lower(zc, m1, L, 1.0 / window)
            for i in range(m1):
                za[i] = zc[i]
        else:
            m1 = n
        cut = _theta_cut(t, window, err)
        m = 0
        for i in range(m1):
            j = idx[i] if use_max else i
            if za[i] > cut:
                gv = _dot(qc, r, kk, j)
                idx[m] = j
                gx[m] = gv
                zc[m] = _score(gv, scale, s, has_s, slope, i_abs, j)
                m += 1
        return m, True
    # the float32 product overflowed or is near the float64 range: everything exactly
    nonfinite = 0
    for j in range(key_end):
        gv = _dot(qc, r, kk, j)
        z = _score(gv, scale, s, has_s, slope, i_abs, j)
        nonfinite += (z - z) != 0.0
        if j < n:
            idx[j] = j
            gx[j] = gv
            zc[j] = z
    return n, nonfinite == 0


@intrinsic
def _sortable(typingctx, x):
    """The integer of float ``x``'s width whose signed order is the order of the floats
    (NaN aside): the bits, with those below the sign flipped for a negative ``x`` (``-0``
    sorts just below ``+0``).  Integer extrema vectorise where float ones, with their NaN
    rules, do not."""
    if x not in (types.float32, types.float64):
        return None
    w = x.bitwidth

    def codegen(context, builder, signature, args):
        ity = ir.IntType(w)
        b = builder.bitcast(args[0], ity)
        sign = builder.ashr(b, ir.Constant(ity, w - 1))
        return builder.xor(b, builder.and_(sign, ir.Constant(ity, (1 << (w - 1)) - 1)))

    return (types.int32 if w == 32 else types.int64)(x), codegen


@intrinsic
def _unsortable(typingctx, s):
    """The float whose :func:`_sortable` is ``s`` (the same flip undoes it)."""
    if s not in (types.int32, types.int64):
        return None
    w = s.bitwidth

    def codegen(context, builder, signature, args):
        ity = ir.IntType(w)
        sign = builder.ashr(args[0], ir.Constant(ity, w - 1))
        b = builder.xor(args[0], builder.and_(sign, ir.Constant(ity, (1 << (w - 1)) - 1)))
        return builder.bitcast(b, ir.FloatType() if w == 32 else ir.DoubleType())

    return (types.float32 if w == 32 else types.float64)(s), codegen


@njit(cache=CACHE, _nrt=False)
def _g_range(g, r, j0, j1):
    """(min, max, NaN count) of the float32 ``g[r, j0:j1]`` ((inf, -inf, 0) when empty): the
    extrema on :func:`_sortable` integers, a loop LLVM vectorises (a NaN makes them
    meaningless, and the caller then checks the row exactly).  The loop runs over a slice
    of the row: its index then provably needs no wraparound test for a negative start,
    which with a run-time ``j0`` made the loop 2.4x slower."""
    if j1 <= j0:
        return np.float32(np.inf), np.float32(-np.inf), 0
    row = g[r, j0:j1]
    lo = hi = _sortable(row[0])
    nan = 0
    for j in range(row.shape[0]):
        x = row[j]
        nan += x != x
        b = _sortable(x)
        lo = min(lo, b)
        hi = max(hi, b)
    return _unsortable(lo), _unsortable(hi), nan


@njit(cache=CACHE, _nrt=False)
def _z_range(g, r, j0, j1, scale, s, has_s, i_abs):
    """For a row whose ``z(g)`` is nondecreasing in g (no ALiBi slope, ``scale s > 0``):
    the largest ``z`` of the keys ``j0 <= j < j1`` (-inf when there are none) and whether
    one of them is non-finite or huge (``|z| >= 1e300``, or a NaN ``g``), from the float32
    range of ``g`` (:func:`_g_range`, a loop LLVM vectorises) in place of a
    float64 score of every key.  Without a NaN, that largest z is bit for bit the largest
    score (a monotone rounding keeps the order); with one the row is suspect and its
    largest z is not used."""
    if j1 <= j0:
        return -np.inf, 0
    lo, hi, nan = _g_range(g, r, j0, j1)
    L = _score(np.float64(hi), scale, s, has_s, 0.0, i_abs, j0)
    z_lo = _score(np.float64(lo), scale, s, has_s, 0.0, i_abs, j0)
    return L, int(nan > 0 or not (z_lo > -1e300 and L < 1e300))


@njit(cache=CACHE)
def _g_cut(cut, scale, s):
    """A float32 line below which no ``g`` has ``z(g) = (scale g) s > cut`` (``scale s > 0``):
    ``cut / (scale s)`` lowered by far more than the roundings of z and of float32."""
    x = cut / (scale * s)
    return np.float32(x - abs(x) * 1e-6 - 1e-37)


@njit(cache=CACHE, _nrt=False)
def _above(g, r, n, gc, idx, scratch):
    """The keys ``j < n`` with ``g[r, j] > gc`` into ``idx``, ascending; returns their count.
    As the row solvers' gathers (:func:`.candidates._gather_alive`): for a long row a bit
    mask of the test (a loop LLVM vectorises; its words in ``scratch``, float64 of at least
    ``n // 64`` entries, free at this point) and then its set bits only, and a pass with no
    branch on the data (every key stored, the count advanced by the test) for the rest."""
    m1 = 0
    j0 = 0
    if n >= MASK_MIN:
        words = scratch[:n // 64].view(np.uint64)
        for w in range(words.shape[0]):
            gb = g[r, 64 * w:64 * (w + 1)]
            b = np.uint64(0)
            for t in range(64):
                b |= np.uint64(gb[t] > gc) << np.uint64(t)
            words[w] = b
        m1 = _set_bits(words, idx)
        j0 = 64 * words.shape[0]
    for j in range(j0, n):
        idx[m1] = j
        m1 += g[r, j] > gc
    return m1


@njit(cache=CACHE, _nrt=False)
def _candidates_fast(g, r, n, filt, qc, kk, scale, s, has_s, slope, i_abs, err, window, use_max, t,
                     za, idx, zc, gx):
    """:func:`_candidates`, the same keys in the same order with the same scores, for the
    float32 filter when ``z(g)`` is nondecreasing in g (no ALiBi slope, ``scale s > 0``):
    the row's range, maximum and the window's line are taken on the float32 ``g`` itself
    (no float64 score of every key), and only the keys above a float32 line just below
    the float64 cut get their approximate float64 score, compared with the cut exactly as
    :func:`_candidates` does.  Anything else (and a suspect row) is :func:`_candidates`."""
    key_end = g.shape[1]
    if not filt or slope != 0.0 or not (scale * s > 0.0) or n == 0:
        return _candidates(g, r, n, filt, qc, kk, scale, s, has_s, slope, i_abs, err, window, use_max, t,
                           za, idx, zc, gx)
    j0 = np.int64(0)  # run-time values, not literals: see "Compile cost" above
    L, bad = _z_range(g, r, j0, n, scale, s, has_s, i_abs)  # L = max_j z(g_j): z is monotone
    if not bad:  # the keys checked for overflow beyond the visible ones
        bad = _z_range(g, r, n, key_end, scale, s, has_s, i_abs)[1]
    if bad:  # the float64 path of the row, exactly as before
        return _candidates(g, r, n, filt, qc, kk, scale, s, has_s, slope, i_abs, err, window, use_max, t,
                           za, idx, zc, gx)
    if use_max:
        cut = _max_cut(L, window, err)
    else:
        cut = _theta_cut(t, window, err)
    gc = _g_cut(cut, scale, s)
    m1 = _above(g, r, n, gc, idx, za)  # za is free on this path
    m = np.int64(0)
    for i in range(m1):  # the approximate float64 scores of the survivors, the exact cut
        j = idx[i]
        z = _score(np.float64(g[r, j]), scale, s, has_s, slope, i_abs, j)
        if z > cut:
            idx[m] = j
            zc[m] = z
            m += 1
    if use_max:
        # the lower bound of the threshold and the second cut of _candidates
        t = _theta_lower(zc, m, L, 1.0 / window)
        cut = _theta_cut(t, window, err)
    m1 = m
    m = 0
    for i in range(m1):
        if zc[i] > cut:
            j = idx[i]
            gv = _dot(qc, r, kk, j)
            idx[m] = j
            gx[m] = gv
            zc[m] = _score(gv, scale, s, has_s, slope, i_abs, j)
            m += 1
    return m, True


@njit(cache=CACHE, _nrt=False)
def _solve_weigh(zc, pc, idx, m, a1, a2, big, vv, o, sk, c, aux, aux2, seed, keep):
    """The exact solve of one row's candidate scores ``zc[:m]`` (keys ``idx[:m]``) into
    ``pc[:m]``, then ``o += sum p_j v_j`` and, with ``keep`` (the backward's residual is
    wanted), the skewed output ``sk = sum u_j v_j / sum u_j`` (``u = p^(2 - alpha)``,
    divided by its maximum, the edge's, when ``big``: alpha > 2) on the support only; ``o``
    and ``sk`` come zeroed (``o`` gets the same bits either way).  Shared by the chunked
    forward and the decoding path, so both give the same bits.  Returns (theta, support,
    L, ce, qe): the row maximum L, the edge ``ce = min_{p > 0} (z - L)`` and its
    probability ``qe``."""
    th, cnt, _, _ = _solve_default(zc[:m], pc[:m], a1, c, aux, aux2, seed)
    L = -np.inf
    for ci in range(m):
        if zc[ci] > L:
            L = zc[ci]
    ce = np.inf
    qe = 0.0
    for ci in range(m):
        if pc[ci] > 0.0:
            y = zc[ci] - L
            if y < ce:
                ce = y
                qe = pc[ci]
    dv = o.shape[0]
    if not keep:
        for ci in range(m):
            pj = pc[ci]
            if pj > 0.0:
                j = idx[ci]
                for d in range(dv):
                    o[d] += pj * np.float64(vv[j, d])
        return th, cnt, L, ce, qe
    lmax = a2 * math.log(qe) if (big and qe > 0.0) else 0.0  # log of max u (at the edge)
    su = 0.0
    for ci in range(m):
        pj = pc[ci]
        if pj > 0.0:
            j = idx[ci]
            u = math.exp(a2 * math.log(pj) - lmax) if big else _skew(pj, a2)
            su += u
            for d in range(dv):
                vjd = np.float64(vv[j, d])
                o[d] += pj * vjd
                sk[d] += u * vjd
    inv = 1.0 / su if su > 0.0 else 0.0
    for d in range(dv):
        sk[d] *= inv
    return th, cnt, L, ce, qe


@njit(cache=CACHE, _nrt=False)
def _store_keys(m, pc, idx, row):
    """A row's support keys into ``row`` (:func:`keys_width` wide): the keys of the
    candidates with ``p > 0`` in candidate (ascending key) order, then -1; -2 and then -1
    when there are more than fit (the backward finds that row's support again)."""
    cap = row.shape[0]
    t = 0
    for ci in range(m):
        if pc[ci] > 0.0:
            if t == cap:
                row[0] = -2
                t = 1
                break
            row[t] = idx[ci]
            t += 1
    for c in range(t, cap):
        row[c] = -1


@njit(cache=CACHE, _nrt=False)
def _row_result(r, b, hq, i, seed, m, ok, zc, pc, idx, a1, a2, big, vv, o, sk, c, aux, aux2,
                out, skew, theta, support, rmax, edge, edge_p, bad, ncand, keys, keep):
    """Everything one forward row writes, from its ``m`` candidates (``ok``: its scores
    were finite): row ``r`` of the caller's float64 ``out`` (the driver converts it to
    q's dtype) and flags ``bad``, ``ncand``; then (:func:`_solve_weigh`, seeded with
    ``seed``, the row's index in its chunk) theta, the support, the residual, the skewed
    output (the output itself at alpha = 1, as the reference has it) and the support's
    keys (:func:`_store_keys`) straight into their place ``[b, hq, i]`` of the forward's
    arrays; without ``keep`` (no backward will follow) the last two are neither formed
    nor written.  A row without candidates, or with overflowed scores, attends nothing.
    Shared by the chunked forward and the decoding path, so both write the same bits."""
    bad[r] = 0 if ok else 1
    ncand[r] = m
    for d in range(o.shape[0]):
        o[d] = 0.0
        sk[d] = 0.0
    L = -np.inf
    ce = -np.inf
    qe = 0.0
    th = -np.inf
    cnt = np.int64(0)
    if m > 0 and ok:
        th, cnt, L, ce, qe = _solve_weigh(zc, pc, idx, m, a1, a2, big, vv, o, sk, c, aux, aux2, seed, keep)
        if cnt == 0:  # the residual (the row maximum, the support's edge) of a row with a support only
            L = -np.inf
            ce = -np.inf
            qe = 0.0
    theta[b, hq, i] = th
    support[b, hq, i] = cnt
    rmax[b, hq, i] = L
    edge[b, hq, i] = ce
    edge_p[b, hq, i] = qe
    for d in range(o.shape[0]):
        out[r, d] = o[d]
    if keep:
        _store_keys(m if cnt > 0 else np.int64(0), pc, idx, keys[b, hq, i])
        src = o if a1 == 0.0 else sk
        for d in range(o.shape[0]):
            skew[b, hq, i, d] = src[d]


@njit(nogil=True, cache=CACHE)
def fwd_rows(g, r0, filt, qc, kk, err, b, h0, nc, i0, offset, causal, scale, row_scale, slopes, alphas, vv,
             out, skew, theta, support, rmax, edge, edge_p, ncand, bad, keys, keep):
    """Fused forward of rows ``r0 .. r0 + rows - 1`` of a chunk (all of it, or a block of
    it: see :data:`FILTER_BLOCK_BYTES`): ``g`` (rows, key_end) is their q.k (float64, or
    float32 as a filter when ``filt``; see :func:`_candidates`), ``err`` (rows,) its score
    error bound; ``row_scale`` (the chunk's rows,) or empty; ``slopes`` and ``alphas``
    (group,) float64 (per query head of the group; ``filt`` needs every alpha > 1).
    ``qc``, ``err``, ``out`` (float64, rows x Dv), ``ncand`` (candidates) and ``bad``
    (1 for a row whose scores overflowed) hold these rows only.  The chunk's query heads
    are ``h0 .. h0 + group - 1`` of batch ``b``, its queries ``i0 .. i0 + nc - 1``; each
    row writes ``skew``, ``theta``, ``support``, the residual ``rmax``, ``edge``,
    ``edge_p`` (the row maximum m, ``c = min_{p > 0} (z - m)`` and its p) and ``keys``
    (the support's keys, :func:`_store_keys`) at its place in those whole (B, Hq, Nq, ...)
    arrays (:func:`_row_result`; ``skew`` and ``keys`` only with ``keep``).  For
    alpha > 2 the skewed output is formed from ``w = u / max u`` (u overflows at the
    support's edge; the factor cancels in the ratio)."""
    rows, key_end = g.shape
    dv = vv.shape[1]
    has_s = row_scale.shape[0] > 0
    za, idx, zc, gx = _candidate_buffers(key_end)
    pc = np.empty(key_end, np.float64)
    c, aux, aux2 = _solver_scratch(key_end)
    o = np.empty(dv, np.float64)
    sk = np.empty(dv, np.float64)
    for r in range(rows):
        rc = r0 + r
        h, i_abs, n, a1, a2, big, window, s = _row_params(rc, nc, i0, offset, key_end, causal, alphas,
                                                          row_scale, has_s)
        m, ok = _candidates_fast(g, r, n, filt, qc, kk, scale, s, has_s, slopes[h], i_abs, err[r], window,
                                 np.bool_(True), 0.0, za, idx, zc, gx)
        _row_result(r, b, h0 + h, i0 + (rc - h * nc), rc, m, ok, zc, pc, idx, a1, a2, big, vv, o, sk, c, aux, aux2,
                    out, skew, theta, support, rmax, edge, edge_p, bad, ncand, keys, keep)


@njit(nogil=True, cache=CACHE)
def bwd_rows(g, filt, qc, kk, err, nc, i0, offset, causal, scale, row_scale, slopes, alphas, th, rmax, edge,
             edge_p, doc, skew_in, vv, idx, pb, ub, cnt, dq, ds, bad, dal, keys):
    """Per-row backward of one chunk over the support only (see the module docstring).
    ``g``, ``filt``, ``err``, ``alphas`` (every one > 1 here) as in :func:`fwd_rows`;
    ``th`` (rows,) theta (-inf: empty row), and for the rows whose alpha > 2 the
    forward's ``rmax``, ``edge``, ``edge_p`` (rows,), from which p is rebuilt as the row
    solver wrote it (:func:`~.big_alpha._edge_p`); ``skew_in`` (rows, Dv) or an empty (0, Dv)
    array (then recomputed from p); writes the compacted support ``idx``, ``pb`` (p),
    ``ub`` (s dZ), ``cnt`` per row, and ``dq`` (rows, D), ``ds`` (rows,); ``bad[r] = 1``
    where a score overflowed.  alpha > 2: :func:`_dz_big`.  ``dal`` (rows,) or empty:
    dL/dalpha of each row, the row transform's alpha VJP
    (:mod:`entmax_ref.backends.numba.grads`) on the support's p and dL/dp = dO . v.
    ``keys`` (rows, cap) or (0, cap): the forward's support keys (:func:`_store_keys`); a
    row that has them takes its candidates from them (:func:`_stored_candidates`) and
    reads nothing of ``g``, which may then be empty when every row has them; ``bad[r] =
    2`` where they do not belong to this call."""
    rows = th.shape[0]
    key_end = kk.shape[0]
    use_keys = keys.shape[0] > 0
    dv = vv.shape[1]
    D = kk.shape[1]
    want_dal = dal.shape[0] > 0
    has_s = row_scale.shape[0] > 0
    have_skew = skew_in.shape[0] > 0
    za, ci, zc, gx = _candidate_buffers(key_end)
    gs = np.empty(key_end, np.float64)
    gd = np.empty(key_end, np.float64)
    sk = np.empty(dv, np.float64)
    acc = np.empty(D, np.float64)
    for r in range(rows):
        h, i_abs, n, a1, a2, big, window, s = _row_params(r, nc, i0, offset, key_end, causal, alphas, row_scale,
                                                          has_s)
        t = th[r]
        for d in range(D):
            acc[d] = 0.0
        live = t > -np.inf
        if use_keys and keys[r, 0] != -2:
            mc, status = _stored_candidates(r, n, qc, kk, scale, s, has_s, slopes[h], i_abs, keys, ci, zc, gx)
            bad[r] = status
        else:
            mc, ok = _candidates_fast(g, r, n, filt, qc, kk, scale, s, has_s, slopes[h], i_abs, err[r], window,
                                      np.bool_(False), t, za, ci, zc, gx)
            bad[r] = 0 if ok else 1
        m = np.int64(0)
        if live and big:
            L = rmax[r]
            ce = edge[r]
            qe = edge_p[r]
            lqa = _lqa(qe, a1)
            for c in range(mc):
                # the scores may differ from the forward's by an ulp (BLAS or _dot, as the
                # float32 filter's state decides per chunk): an entry within rounding of
                # the edge is the edge (p = q), not an entry outside or far inside it
                d = (zc[c] - L) - ce
                if d - d == 0.0 and abs(d) <= 8.0 * 2.220446049250313e-16 * (abs(zc[c]) + abs(L)):
                    d = 0.0
                p = _edge_p(d, a1, qe, lqa)
                if p > 0.0:
                    idx[r, m] = ci[c]
                    pb[r, m] = p
                    ub[r, m] = a2 * math.log(p)  # log u, for _dz_big
                    gs[m] = gx[c]
                    m += 1
        elif live:
            kind = _kind(a1)
            for c in range(mc):
                p, u = _p_u(zc[c] - t, a1, kind)  # the row solvers' e_alpha and p^(2 - alpha)
                if p > 0.0:
                    idx[r, m] = ci[c]
                    pb[r, m] = p
                    ub[r, m] = u
                    gs[m] = gx[c]
                    m += 1
        cnt[r] = m
        mref = 0  # the first entry of largest u (the reference point of ds)
        if big:
            mref = _dz_big(r, m, idx, ub, doc, vv, skew_in, have_skew, sk, gd)
        else:
            for c in range(1, m):
                if ub[r, c] > ub[r, mref]:
                    mref = c
            _row_skew(r, m, idx, ub, np.bool_(False), 0.0, 0.0, vv, skew_in, have_skew, sk)
            delta = _output_grads(r, m, idx, doc, vv, sk, gd)
            for c in range(m):
                ub[r, c] = ub[r, c] * (gd[c] - delta)
        dsr = 0.0
        a_ref = scale * gs[mref] if m > 0 else 0.0
        for c in range(m):
            j = idx[r, c]
            dz = ub[r, c]
            if has_s:
                # ds = sum dZ a as sum dZ (a - a_ref): the dZ sum to 0, and the huge ones
                # (alpha > 2, at the edge) sit where a is nearly a_ref; a term with a =
                # a_ref is 0, also where dZ overflowed (not inf * 0 = NaN)
                da = scale * gs[c] - a_ref
                if da != 0.0:
                    dsr += dz * da
                dz = dz * s
            ub[r, c] = dz
            for d in range(D):
                acc[d] += dz * kk[j, d]
        ds[r] = dsr
        for d in range(D):
            dq[r, d] = scale * acc[d]
        if want_dal:  # gd[:m] = dO . v_j on the support (both branches above)
            if a1 > 1.0:
                dal[r] = _alpha_vjp_row_big(pb[r, :m], gd[:m], a1)
            else:
                dal[r] = _alpha_vjp_row(pb[r, :m], gd[:m], a1)


@njit(cache=CACHE, _nrt=False)
def _stored_candidates(r, n, qc, kk, scale, s, has_s, slope, i_abs, keys, idx, zc, gx):
    """Row r's candidates from the forward's support keys ``keys[r]`` (ascending, then -1):
    their keys ``idx``, exact scores ``zc`` and exact q.k ``gx``, as :func:`_candidates`
    gives them.  Returns (m, status): status 0, 1 where a score is not finite, 2 (and m =
    0) where a key is not ascending or not one the row sees (keys of another call)."""
    m = np.int64(0)
    prev = np.int64(-1)
    status = np.int8(0)
    for c in range(keys.shape[1]):
        j = np.int64(keys[r, c])
        if j == -1:
            break
        if j <= prev or j >= n:
            return np.int64(0), np.int8(2)
        gv = _dot(qc, r, kk, j)
        z = _score(gv, scale, s, has_s, slope, i_abs, j)
        if (z - z) != 0.0:
            status = np.int8(1)
        idx[m] = j
        gx[m] = gv
        zc[m] = z
        m += 1
        prev = j
    return m, status


@njit(cache=CACHE, _nrt=False)
def _row_skew(r, m, idx, ub, big, lmax, S, vv, skew_in, have_skew, sk):
    """Row r's skewed output into ``sk``: the forward's (``skew_in[r]``) when the caller
    kept it, else ``sum_c w_c v_j / sum_c w_c`` over the compacted support (key ``idx[r,
    c]``): ``w = u = ub[r, c]``, or for alpha > 2 (``big``; ``ub`` holds log u) ``w = u /
    max u = exp(ub[r, c] - lmax)`` with its compensated sum ``S``."""
    dv = sk.shape[0]
    if have_skew:
        for d in range(dv):
            sk[d] = skew_in[r, d]
        return
    for d in range(dv):
        sk[d] = 0.0
    su = 0.0
    for c in range(m):
        w = math.exp(ub[r, c] - lmax) if big else ub[r, c]
        su += w
        j = idx[r, c]
        for d in range(dv):
            sk[d] += w * vv[j, d]
    norm = S if big else su
    if norm > 0.0:
        for d in range(dv):
            sk[d] /= norm


@njit(cache=CACHE, _nrt=False)
def _output_grads(r, m, idx, doc, vv, sk, gd):
    """``gd[c] = dO_r . v_j`` over the compacted support of row r (key ``j = idx[r, c]``);
    returns ``delta = dO_r . skew_r``."""
    dv = sk.shape[0]
    delta = 0.0
    for d in range(dv):
        delta += doc[r, d] * sk[d]
    for c in range(m):
        gd[c] = _dot(doc, r, vv, idx[r, c])
    return delta


@njit(cache=CACHE, _nrt=False)
def _dz_big(r, m, idx, ub, doc, vv, skew_in, have_skew, sk, gd):
    """alpha > 2: ``dZ_rc = u_c (g_c - delta_r)`` over the compacted support of row r, in
    the overflow-free form of the row VJP (``NumpyBackend.entmax_vjp``), with ``g_c = dO_r
    . v_j``.  On entry ``ub[r, :m]`` holds ``log u``; on exit dZ.  With ``w = u / max u``
    (log space), ``S = sum w``, the skewed output ``sum w v / S`` (or the forward's) and
    ``delta = dO . skew``: entries other than the first of largest u (the edge) get ``u_c
    (g_c - delta)`` (``sign exp(log u_c + log|g_c - delta|)`` where u_c overflows); that
    entry, whose ``g_m - delta`` is a tiny difference times a huge u, gets ``sum_{c != m}
    u_c (g_m - g_c) / S`` (scaled by the second largest u where that is not finite).
    Returns the index of that entry (0 when ``m = 0``)."""
    if m == 0:
        return 0
    mi = 0
    lmax = ub[r, 0]
    for c in range(1, m):
        if ub[r, c] > lmax:
            lmax = ub[r, c]
            mi = c
    S = 0.0
    cS = 0.0
    for c in range(m):
        S, cS = _acc(S, cS, math.exp(ub[r, c] - lmax))
    S = S + cS
    _row_skew(r, m, idx, ub, np.bool_(True), lmax, S, vv, skew_in, have_skew, sk)
    delta = _output_grads(r, m, idx, doc, vv, sk, gd)
    l2 = -np.inf
    for c in range(m):
        if c != mi and ub[r, c] > l2:
            l2 = ub[r, c]
    gm = gd[mi]
    Dm = 0.0
    cD = 0.0
    for c in range(m):
        if c != mi:
            Dm, cD = _acc(Dm, cD, math.exp(ub[r, c]) * (gm - gd[c]))
    Dm = (Dm + cD) / S
    if not (Dm - Dm == 0.0):  # beyond float64: scaled by the second largest u
        T = 0.0
        cT = 0.0
        for c in range(m):
            if c != mi:
                T, cT = _acc(T, cT, math.exp(ub[r, c] - l2) * (gm - gd[c]))
        Dm = _signed_exp(l2, (T + cT) / S)
    if l2 == -np.inf:  # the edge alone on the support
        Dm = 0.0
    for c in range(m):
        if c == mi:
            continue
        lu = ub[r, c]
        diff = gd[c] - delta
        u = math.exp(lu)
        if diff == 0.0:
            ub[r, c] = 0.0
        elif u == np.inf:
            ub[r, c] = _signed_exp(lu, diff)
        else:
            ub[r, c] = u * diff
    ub[r, mi] = Dm
    return mi


@njit(nogil=True, cache=CACHE)
def bwd_scatter(idx, pb, ub, cnt, doc, qc, scale, dv_acc, dk_acc):
    """``dv_acc[j] += p dO_r`` and ``dk_acc[j] += scale (s dZ) q_r`` over the compacted
    support of one chunk."""
    rows = idx.shape[0]
    Dv = doc.shape[1]
    D = qc.shape[1]
    for r in range(rows):
        for c in range(cnt[r]):
            j = idx[r, c]
            p = pb[r, c]
            for d in range(Dv):
                dv_acc[j, d] += p * doc[r, d]
            dz = scale * ub[r, c]
            for d in range(D):
                dk_acc[j, d] += dz * qc[r, d]


@njit(nogil=True, cache=CACHE)
def expand(idx, pb, ub, cnt, P, U):
    """Dense blocks ``P``, ``U`` (rows, key_end) from the compacted support (zeros off it)."""
    rows, n = P.shape
    for r in range(rows):
        for j in range(n):
            P[r, j] = 0.0
            U[r, j] = 0.0
        for c in range(cnt[r]):
            j = idx[r, c]
            P[r, j] = pb[r, c]
            U[r, j] = ub[r, c]


# --------------------------------------------------------------------------- the drivers
_BLAS_LOCK = threading.Lock()
_BLAS_STATE = {"users": 0, "limiter": None, "controller": None}


@contextlib.contextmanager
def _single_threaded_blas():
    """BLAS on one thread while any attention call of this process runs, restored when the
    last one ends.  The drivers run ``workers`` Python threads that each call BLAS and a
    ``nogil`` kernel in turn; a multi-threaded BLAS between them would have two thread
    pools busy-waiting against each other on the same cores (3x slower on the 2-core VM).
    threadpoolctl sets and restores the limit; a count of the calls in flight (under a
    lock) makes concurrent calls share one limit, so the count the caller had is always
    restored (setting it per call raced: after concurrent calls the process was left at
    one BLAS thread)."""
    with _BLAS_LOCK:
        st = _BLAS_STATE
        if st["users"] == 0:
            if st["controller"] is None:
                from threadpoolctl import ThreadpoolController

                st["controller"] = ThreadpoolController()
            st["limiter"] = st["controller"].limit(limits=1, user_api="blas")
        st["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            st["users"] -= 1
            if st["users"] == 0:
                st["limiter"].restore_original_limits()
                st["limiter"] = None


def _run_parallel(items, work, workers, cost=None):
    """Run ``work(slot, item)`` for every item on ``workers`` threads (slot = the worker's
    index); re-raises the first exception.

    The threads pull the items from one queue, or, given ``cost(item)``, run the items
    given to their slot in advance (each item, in order, to the slot with the least cost
    so far), so that which slot runs which item does not depend on timing: the backward's per-slot dK, dV sums
    are then the same, bit for bit, from run to run.  Nothing else that a chunk computes
    may depend on which chunks ran before it: the drivers let the first (largest) chunk
    alone decide, before the others start, whether the float32 filter pays, because
    exact scores from the filter's candidates and from a float64 BLAS product round
    differently, and a decision taken by whichever chunk finished first gave results that
    changed with thread timing."""
    if workers <= 1 or len(items) <= 1:
        for it in items:
            work(0, it)
        return
    plans = None
    if cost is not None:
        plans, load = [[] for _ in range(workers)], [0] * workers
        for item in items:
            slot = load.index(min(load))
            plans[slot].append(item)
            load[slot] += cost(item)
    run_items(work, workers, items=items, plans=plans)


def _run_chunks(items, work, workers, cost=None, setup=()):
    """A driver's chunks, largest first: the first, as the probe that decides whether the
    float32 filter pays (``work(0, item, probe=True)``, on slot 0; see
    :func:`_run_parallel`), while the other workers run the callables of ``setup`` (the
    forward: the kv-heads' copies, which the chunks would otherwise make when they first
    need them); then the others on ``workers`` threads."""
    if items:
        if workers > 1 and setup:
            def first(slot, it):
                if slot == 0:
                    work(0, it, probe=True)
                else:
                    it()

            run_items(first, workers, plans=[[items[0]]] + [list(setup[s::workers - 1]) for s in range(workers - 1)])
        else:
            work(0, items[0], probe=True)
    _run_parallel(items[1:], work, workers, cost)


class _InOrder:
    """``self(n, add)`` calls the ``add`` of every n = 0, 1, 2, ... in that order, whichever
    thread brings it and when (an add waits, kept, until those before it are done)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.next = 0
        self.waiting = {}

    def __call__(self, n, add):
        with self.lock:
            self.waiting[n] = add
            while self.next in self.waiting:
                self.waiting.pop(self.next)()
                self.next += 1


def _chunk_cost(i0, i1, key_end):
    """A chunk's work, for "largest first" and the backward's static plan: its scores."""
    return (i1 - i0) * key_end


def _head_items(spec, b, Nq, Nk, group):
    """The driver's chunks (i0, i1, key_end) of batch b, largest first."""
    return sorted(batch_chunks(spec, b, Nq, Nk, group), key=lambda t: -_chunk_cost(*t))


# The kernels get C-contiguous, writable float64 arrays only (a fresh copy of the small
# per-head / per-row parameters, the caller's q, k, v ... copied when read-only): numba
# compiles one specialization per argument type, and read-only is part of the type.


def _writable(a):
    return a if a is None or a.flags.writeable else a.copy()


def _group_alphas(spec, h0, group):
    if spec.head_alpha is None:
        return np.full(group, float(spec.alpha))
    return np.array(spec.head_alpha[h0:h0 + group], np.float64, order="C")


def _group_slopes(spec, h0, group):
    if spec.alibi_slopes is None:
        return np.zeros(group)
    return np.array(spec.alibi_slopes[h0:h0 + group], np.float64, order="C")


def _row_scale(spec, b, h0, group, i0, i1):
    if spec.row_scale is None:
        return np.empty(0)
    return np.array(spec.row_scale[b, h0:h0 + group, i0:i1], np.float64, order="C").reshape(-1)


_U32 = 2.0**-24


@njit(cache=CACHE)
def score_errors(qc, kmax, scale, rs, err):
    """Per-row bound ``err[r]`` on |z(float32 q.k) - z(exact q.k)| for the float32 filter;
    returns whether every bound is below 1e290 (a larger one, or NaN, turns the filter
    off for the rows' chunk).

    The float32 product sums D products of the float32-rounded q, k in some order, so
    (Higham, Thm 3.1 with the input roundings) ``|fl32(q.k) - q.k| <= gamma_{D+3}
    sum_d |q_d k_d| <= gamma_{D+3} ||q|| ||k||`` (Cauchy-Schwarz, ``kmax`` the largest
    key norm); z scales it by ``scale |s|`` (``rs``: the rows' ASEntmax scales, or
    empty).  A factor 2 covers the float64 rounding of the norms and of z, and an
    absolute term float32 underflow (subnormal inputs and products)."""
    R, D = qc.shape
    gam = (D + 3) * _U32 / (1.0 - (D + 3) * _U32)
    has_s = rs.shape[0] > 0
    small = D * 2.0**-140
    fits = True
    for r in range(R):
        a = 0.0
        for d in range(D):
            a += qc[r, d] * qc[r, d]
        qn = math.sqrt(a)
        s = abs(rs[r]) if has_s else 1.0
        e = 2.0 * scale * s * (gam * qn * kmax + small * (1.0 + qn + kmax))
        err[r] = e
        fits = fits and e < 1e290
    return fits


@njit(nogil=True, cache=CACHE)
def key_norms(kk):
    """``||k_j||`` of every key (row of ``kk``), from float64 sums of the exact float64
    squares (a float32 input converts exactly; a float64 input's squares may overflow
    to inf, which turns the float32 filter off).  Any order of summation is inside
    :func:`score_errors`' factor 2 for the rounding of the norms.  (The einsum this
    replaces took 0.25 ms a head of 4,096 x 64 on the calling thread, before the chunks.)"""
    n = np.empty(kk.shape[0])
    for j in range(kk.shape[0]):
        a = 0.0
        for d in range(kk.shape[1]):
            x = np.float64(kk[j, d])
            a += x * x
        n[j] = math.sqrt(a)
    return n


class _Head:
    """One kv-head's K and V as the drivers' chunks use them: the float32 keys transposed
    (``k32t``, (D, Nk) C-contiguous: the filter product's right operand, see
    :func:`_product`), the keys and values in the input's precision (``kx``, ``vx``:
    what the filtered chunks' kernels read, the same arrays the decoding path passes, so
    that :func:`_dot` rounds the same way in both; the float32 input is converted
    exactly where it is read), the float64 key norms ``kn`` (a float32 overflow only
    turns the filter off) and, made by the first chunk that needs them (the float64
    product), the float64 keys ``kk`` and values; :meth:`rows` gives a chunk's pair."""

    def __init__(self, k, v, b, hk):
        with np.errstate(over="ignore", invalid="ignore"):
            self.k32t = np.ascontiguousarray(k[b, hk].T, np.float32)
        self.kx = _writable(np.ascontiguousarray(k[b, hk]))
        self.kn = key_norms(self.kx)
        self.vx = _writable(np.ascontiguousarray(v[b, hk]))
        self._kk = self.kx if k.dtype == np.float64 else None
        self._v64 = self.vx if v.dtype == np.float64 else None
        self.lock = threading.Lock()

    @property
    def kk(self):
        """The float64 keys (a copy of a float32 input, made once)."""
        with self.lock:
            if self._kk is None:
                self._kk = np.ascontiguousarray(self.kx, np.float64)
        return self._kk

    def rows(self, filt, key_end):
        """(K, V) up to ``key_end`` for a chunk's kernel: in the input's precision with the
        float32 filter (the exact dot products then round as the decoding path's); with
        the float64 product, whose rows the kernel scores from the product itself, the
        float64 copies, so that a float32 input compiles no kernel variant beyond the
        float64 input's (the values are the same: float32 converts exactly)."""
        if filt:
            return self.kx[:key_end], self.vx[:key_end]
        kk = self.kk
        with self.lock:
            if self._v64 is None:
                self._v64 = np.ascontiguousarray(self.vx, np.float64)
        return kk[:key_end], self._v64[:key_end]


class _Heads:
    """The :class:`_Head` of each kv-head, made once (under that head's lock) by whichever
    worker first needs it: the other workers while the probe chunk runs
    (:func:`_run_chunks`' ``setup``), or the first chunk of the head.  The copies and key
    norms (about 0.6 ms a head at 4,096 x 64, 4.6-5.5 ms for 8) ran on the calling thread
    before the chunks, and the probe alone after them: both serial."""

    def __init__(self, k, v):
        self.k, self.v = k, v
        self.lock = threading.Lock()
        self.made = {}

    def get(self, b, hk):
        with self.lock:
            entry = self.made.setdefault((b, hk), [threading.Lock(), None])
        with entry[0]:
            if entry[1] is None:
                entry[1] = _Head(self.k, self.v, b, hk)
        return entry[1]

    def clear(self):
        self.made.clear()


def _filter_bound(filt, qc, kn, key_end, scale, rs):
    """(filt, err): whether a chunk uses the float32 filter (``filt``: it is on and may be
    used for this chunk; and the error bound is finite) and the per-row bound (zeros
    without the filter)."""
    if filt:
        err = np.empty(qc.shape[0])
        if score_errors(qc, float(kn[:key_end].max()), scale, rs, err):
            return True, err
    return False, np.zeros(qc.shape[0])


def _scores(filt, qsl, qc, head, key_end, scale, rs, need=None):
    """A chunk's score block for the row kernels: with ``filt`` (see :func:`_filter_bound`)
    the float32 product of the chunk's queries ``qsl`` with the keys of ``head`` (a
    :class:`_Head`) and its per-row error bound; else the float64 product of ``qc``
    (``qsl`` as float64 rows) and a zero bound (only this makes the float64 keys).
    With ``need`` (a bool mask of the rows) only those rows of the block are formed (the
    others are left unwritten: their kernel rows do not read them).  Returns (g, err,
    filt)."""
    filt, err = _filter_bound(filt, qc, head.kn, key_end, scale, rs)
    with np.errstate(over="ignore", invalid="ignore"):
        if filt:
            g = _product(np.asarray(qsl, np.float32).reshape(-1, qc.shape[1]), head.k32t[:, :key_end], need)
        else:
            g = _product(qc, head.kk[:key_end].T, need)
    return g, err, filt


def _product(a, bt, need):
    """``a @ bt``, or only its rows where ``need`` (the others unwritten).  For the float32
    filter ``bt`` is a slice of the C-contiguous transposed keys (``_Head.k32t``): OpenBLAS
    packs the keys, the product's long side, at every call, and from that layout (its
    no-transpose copy) the product ran 1.25x faster than from the transposed view of the
    row-major keys (8 heads of 4,096 causal keys in 64-row blocks, one thread: 142 -> 114
    ms; docs/performance.md, session 17)."""
    if need is None or need.all():
        return a @ bt
    g = np.empty((a.shape[0], bt.shape[1]), a.dtype)
    g[need] = a[need] @ bt
    return g


#: The float32 filter is kept while the candidates it leaves are at most this fraction of
#: the visible keys (beyond it, one float64 product per chunk is cheaper than the exact
#: dot products of the candidates); 0 turns the filter off.
FILTER_FRACTION = 0.25

#: Bytes of a chunk's float32 filter product formed at a time: the forward forms it and
#: runs the row kernel on it block by block, so that the scores the kernel reads are
#: still in the core's cache (L2: 1 MiB on the bench machine) rather than in memory.
#: A block has at least D rows (each block reads the keys once).
#: The blocks change nothing in the results (the filter only selects candidates; the
#: pivots keep their seed, the row's index in the chunk).  With a causal mask a block's
#: product stops at the last key its rows see, so the scores of masked keys are checked
#: for overflow up to the block's last visible key, not the chunk's (docs/attention.md).
FILTER_BLOCK_BYTES = 2**20


_OVERFLOW = ("attention scores overflowed (non-finite s * scale * q.k + bias); "
             "rescale q, k, the scale or the ASEntmax scale")

#: Bytes of the float64/float32 K, V copies of the kv-heads whose chunks the forward runs
#: in one parallel region.
HEAD_BYTES = 64 * 2**20

#: Bytes the backward may spend on per-worker float64 dK/dV accumulators of one kv-head;
#: beyond it the workers share one pair, behind a lock.
ACCUMULATOR_BYTES = 512 * 2**20


def attention_forward(backend, q, k, v, spec):
    """Chunked fused forward (see the module docstring); the NumPy driver's outputs and
    conventions (out in q's dtype, float64 theta and skew, int64 support)."""
    from .._base import AttentionForward

    if spec.key_mask is not None:  # the backend routes key masks (key runs, or the NumPy driver)
        return backend.attention_forward(q, k, v, spec)
    f64 = np.float64
    q, k, v = (_writable(np.asarray(a)) for a in (q, k, v))
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    offset = key_offset(Nq, Nk)
    bounds = [_head_items(spec, b, Nq, Nk, group) for b in range(B)]  # the chunks of each batch
    blank = np.ones((B, Hq, Nq), bool)  # the rows no chunk runs
    for b, chunks in enumerate(bounds):
        for i0, i1, _ in chunks:
            blank[b, :, i0:i1] = False
    keep = spec.residual  # off: no skewed output or support keys formed (no backward follows)
    (out, theta, support, skew, row_max, edge, edge_p, support_keys), (skew_w, keys_w) = \
        empty_kernel_forward(B, Hq, Nq, Dv, q.dtype, keep, blank)
    causal, scale = bool(spec.causal), float(spec.scale)
    workers = numba.get_num_threads()
    state = {"filter": FILTER_FRACTION > 0}  # the float32 filter, while it pays (alpha > 1 only)
    heads = _Heads(k, v)

    def work(slot, item, probe=False):
        b, hk, i0, i1, key_end = item
        h0 = hk * group
        head = heads.get(b, hk)
        nc = i1 - i0
        qsl = q[b, h0:h0 + group, i0:i1]
        qc = np.ascontiguousarray(np.asarray(qsl, f64).reshape(-1, D))
        rs = _row_scale(spec, b, h0, group, i0, i1)
        alphas = _group_alphas(spec, h0, group)
        filt, err = _filter_bound(state["filter"] and bool(np.all(alphas > 1.0)), qc, head.kn, key_end, scale,
                                  rs)
        kk, vv = head.rows(filt, key_end)
        rows = qc.shape[0]
        o = np.empty((rows, Dv), f64)  # the output rows in float64; the rest goes to its place
        ncand = np.empty(rows, np.int64)
        bad = np.empty(rows, np.int8)
        slopes = _group_slopes(spec, h0, group)
        if filt:  # the float32 product a block at a time (FILTER_BLOCK_BYTES)
            q32 = np.asarray(qsl, np.float32).reshape(rows, D)
            # at least D rows: a block reads the keys once (D floats a key), and fewer rows
            # than D would read more bytes of K than they write scores (N = 65,536: 16-row
            # chunks, whose 4-row blocks read 4x the keys and took 4x the forward's time)
            step = max(1, min(rows, max(FILTER_BLOCK_BYTES // (4 * key_end), D)))
            buf = np.empty(step * key_end, np.float32)
        else:
            step = rows
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the kernel's to report
            for a in range(0, rows, step):
                e = min(rows, a + step)
                if filt:
                    # the keys the block's rows see: with a causal mask, up to its last query's
                    # (when the block lies within one query head)
                    kend = key_end
                    if causal and a // nc == (e - 1) // nc:
                        kend = min(key_end, visible_keys_end(i0 + (e - 1) % nc + 1, offset, key_end, True))
                    g = np.matmul(q32[a:e], head.k32t[:, :kend], out=buf[:(e - a) * kend].reshape(e - a, kend))
                else:
                    g = _product(qc, kk.T, None)  # head.rows gave the float64 keys
                fwd_rows(g, a, filt, qc[a:e], kk, err[a:e], b, h0, nc, i0, offset, causal, scale, rs, slopes, alphas,
                         vv, o[a:e], skew_w, theta, support, row_max, edge, edge_p, ncand[a:e], bad[a:e], keys_w,
                         keep)
        if bad.any():
            raise ValueError(_OVERFLOW)
        if probe and filt and ncand.sum() > FILTER_FRACTION * rows * key_end:
            state["filter"] = False
        out[b, h0:h0 + group, i0:i1] = o.reshape(group, nc, Dv)

    # kv-heads in batches whose copies take at most HEAD_BYTES; the chunks of a batch run
    # in one parallel region (largest first), so that no worker idles at a head's end
    per_head = 20 * Nk * max(D, Dv) + 1
    step = max(1, HEAD_BYTES // per_head)
    pairs = [(b, hk) for b in range(B) for hk in range(Hkv)]
    with _single_threaded_blas():
        for p0 in range(0, len(pairs), step):
            batch = pairs[p0:p0 + step]
            heads.clear()
            items = [(b, hk) + it for b, hk in batch for it in bounds[b]]
            items.sort(key=lambda t: -_chunk_cost(*t[2:]))
            _run_chunks(items, work, workers, setup=[functools.partial(heads.get, b, hk) for b, hk in batch])
    return AttentionForward(out, theta, support, skew, row_max, edge, edge_p,
                            trimmed_keys(support_keys, support))


def empty_kernel_forward(B, Hq, Nq, Dv, out_dtype, keep, blank=None):
    """The arrays the numba forwards fill (chunked and decoding): the
    :class:`~entmax_ref.backends._base.AttentionForward` of
    :func:`~entmax_ref.backends.attention_driver.empty_forward` with the support keys
    (:func:`empty_support_keys`), and the kernels' ``skew`` and ``keys`` arguments.
    Without ``keep`` (``spec.residual`` off) skew and the keys are None, and the kernels get
    zero-size stand-ins of the same types, which they, told so, never index."""
    fwd = empty_forward(B, Hq, Nq, Dv, out_dtype, blank, keep)
    if not keep:
        return fwd, (np.empty((0, 0, 0, 0)), np.empty((0, 0, 0, 0), np.int32))
    keys = empty_support_keys(B, Hq, Nq, Dv, blank)
    return fwd._replace(support_keys=keys), (fwd.skew, keys)


def keys_width(Dv):
    """Support keys the forward keeps room for per row: :data:`SUPPORT_KEYS`, or ``2 Dv``
    when that is more (4 bytes a key: never more than the float64 skewed output)."""
    return max(SUPPORT_KEYS, 2 * Dv)


def empty_support_keys(B, Hq, Nq, Dv, blank=None):
    """The forward's ``support_keys`` as a row that sees no key leaves them (all -1); with
    ``blank`` ((B, Hq, Nq) bool) those rows only, the others left for the kernels to
    write (as :func:`~entmax_ref.backends.attention_driver.empty_forward`)."""
    if blank is None:
        return np.full((B, Hq, Nq, keys_width(Dv)), -1, np.int32)
    keys = np.empty((B, Hq, Nq, keys_width(Dv)), np.int32)
    keys[blank] = -1
    return keys


def trimmed_keys(keys, support):
    """``keys`` cut to the most keys a row holds (at least one column): the keys of every
    row that has them, and the -2 of those that do not.  A row holds its ``support`` keys
    when they fit (:func:`_store_keys`), none otherwise, so the width comes from the
    support counts, not from a pass over the keys.  None stays None."""
    if keys is None:
        return None
    fits = support[support <= keys.shape[3]]
    width = max(1, int(fits.max(initial=0)))
    return keys if width == keys.shape[3] else np.ascontiguousarray(keys[..., :width])


def _support_keys(res):
    """The forward's support keys in ``res`` when they are this backend's (a NumPy array;
    the public layer checked dtype and shape), else None."""
    keys = getattr(res, "support_keys", None)
    return np.ascontiguousarray(keys) if isinstance(keys, np.ndarray) else None


def attention_backward(backend, do, q, k, v, res, skew, spec):
    """Chunked support-only backward from the forward's residual ``res`` (theta; for
    alpha > 2 also row_max, edge, edge_p; with alpha per head, for the rows of heads with
    alpha > 2) (see the module docstring); the NumPy driver's outputs and conventions."""
    from .._base import AttentionGrads
    from ..numpy_attention import attention_backward as numpy_backward

    heads_alpha = np.asarray([spec.alpha] if spec.head_alpha is None else spec.head_alpha, np.float64)
    if bool(np.any(heads_alpha == 1.0)):  # a softmax head: the NumPy driver
        return numpy_backward(backend, do, q, k, v, res, skew, spec)
    if spec.key_mask is not None:
        return backward_by_key_runs(lambda *a: attention_backward(backend, *a), do, q, k, v, res, skew, spec,
                                    lambda: numpy_backward(backend, do, q, k, v, res, skew, spec))
    theta = _writable(np.asarray(res.theta))
    if bool(np.any(heads_alpha > 2.0)):
        if res.row_max is None or res.edge is None or res.edge_p is None:
            raise ValueError("alpha > 2 needs the forward's row_max, edge and edge_p to rebuild p exactly")
        resid = tuple(_writable(np.asarray(a)) for a in (res.row_max, res.edge, res.edge_p))
    else:
        resid = None
    do, q, k, v = (_writable(np.asarray(a)) for a in (do, q, k, v))
    skew = None if skew is None else _writable(np.asarray(skew))
    f64 = np.float64
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    offset = key_offset(Nq, Nk)
    dq = np.zeros((B, Hq, Nq, D), f64)
    dk = np.zeros((B, Hkv, Nk, D), f64)
    dv = np.zeros((B, Hkv, Nk, Dv), f64)
    ds = np.zeros((B, Hq, Nq), f64) if spec.row_scale is not None else None
    dalpha = np.zeros((B, Hq, Nq), f64) if spec.alpha_grad else None
    no_dal = np.empty(0, f64)
    no_skew = np.empty((0, Dv), f64)
    keys_all = _support_keys(res)
    all_stored = keys_all is not None and bool(np.all(keys_all[..., 0] != -2))
    no_keys = np.empty((0, 1), np.int32)
    no_g = np.empty((0, 0), np.float32)
    causal, scale = bool(spec.causal), float(spec.scale)
    workers = numba.get_num_threads()
    # per-worker accumulators of one kv-head (worker 0 uses dk, dv themselves), or one
    # shared pair behind a lock when that would take too much memory
    shared = workers > 1 and (workers - 1) * 8 * Nk * (D + Dv) > ACCUMULATOR_BYTES
    extra = [] if shared else [(np.empty((Nk, D), f64), np.empty((Nk, Dv), f64)) for _ in range(workers - 1)]
    state = {"filter": FILTER_FRACTION > 0}
    with _single_threaded_blas():
        for b in range(B):
            items = _head_items(spec, b, Nq, Nk, group)
            for hk in range(Hkv):
                h0 = hk * group
                head = _Head(k, v, b, hk)
                slopes = _group_slopes(spec, h0, group)
                accs = [(dk[b, hk], dv[b, hk])]
                for dk_w, dv_w in extra:
                    dk_w[:] = 0.0
                    dv_w[:] = 0.0
                    accs.append((dk_w, dv_w))

                def work(slot, item, probe=False, b=b, h0=h0, head=head, slopes=slopes, accs=accs,
                         in_order=_InOrder()):
                    n, (i0, i1, key_end) = item
                    nc = i1 - i0
                    sl = (b, slice(h0, h0 + group), slice(i0, i1))
                    qc = np.ascontiguousarray(np.asarray(q[sl], f64).reshape(-1, D))
                    doc = np.ascontiguousarray(np.asarray(do[sl], f64).reshape(-1, Dv))
                    rs = _row_scale(spec, b, h0, group, i0, i1)
                    rows = group * nc
                    kc = no_keys if keys_all is None else np.ascontiguousarray(keys_all[sl]).reshape(rows, -1)
                    need = None if keys_all is None else kc[:, 0] == -2  # rows that find their support again
                    stored = need is not None and not need.any()
                    if stored:  # every row has its support's keys: no product, no filter pass
                        g, err, filt = no_g, np.zeros(rows), True
                    else:  # the product of the rows without keys only
                        g, err, filt = _scores(state["filter"], q[sl], qc, head, key_end, scale, rs, need)
                    kk, vv = head.rows(filt, key_end)
                    th = np.ascontiguousarray(np.asarray(theta[sl], f64).reshape(-1))
                    if resid is None:
                        rm = ce = qe = th  # not read for alpha <= 2
                    else:
                        rm, ce, qe = (np.ascontiguousarray(np.asarray(a[sl], f64).reshape(-1)) for a in resid)
                    sk = no_skew if skew is None else np.ascontiguousarray(np.asarray(skew[sl], f64).reshape(-1, Dv))
                    width = kc.shape[1] if stored else key_end
                    idx = np.empty((rows, width), np.int32)
                    pb = np.empty((rows, width), f64)
                    ub = np.empty((rows, width), f64)
                    cnt = np.empty(rows, np.int64)
                    dqc = np.empty((rows, D), f64)
                    dsc = np.empty(rows, f64)
                    bad = np.empty(rows, np.int8)
                    dal = no_dal if dalpha is None else np.empty(rows, f64)
                    bwd_rows(g, filt, qc, kk, err, nc, i0, offset, causal, scale, rs, slopes,
                             _group_alphas(spec, h0, group), th, rm, ce, qe, doc, sk, vv, idx, pb, ub, cnt, dqc, dsc,
                             bad, dal, kc)
                    if (bad == 2).any():
                        raise ValueError("support_keys do not belong to this call (a key out of order or not "
                                         "visible to its row): pass the residual of this problem's forward")
                    if bad.any():
                        raise ValueError(_OVERFLOW)
                    if probe and filt and not stored and cnt.sum() > FILTER_FRACTION * rows * key_end:
                        state["filter"] = False
                    dq[sl] = dqc.reshape(group, nc, D)
                    if ds is not None:
                        ds[sl] = dsc.reshape(group, nc)
                    if dalpha is not None:
                        dalpha[sl] = dal.reshape(group, nc)
                    dk_acc, dv_acc = accs[0 if shared else slot]
                    dk_acc, dv_acc = dk_acc[:key_end], dv_acc[:key_end]
                    if cnt.sum() > DENSE_FRACTION * rows * key_end:
                        P = np.empty((rows, key_end), f64)
                        U = g if g.dtype == f64 else np.empty((rows, key_end), f64)  # g is done with
                        expand(idx, pb, ub, cnt, P, U)
                        dv_part = P.T @ doc
                        dk_part = scale * (U.T @ qc)

                        def add():
                            np.add(dv_acc, dv_part, out=dv_acc)
                            np.add(dk_acc, dk_part, out=dk_acc)
                    else:
                        def add():
                            bwd_scatter(idx, pb, ub, cnt, doc, qc, scale, dv_acc, dk_acc)
                    if shared:
                        in_order(n, add)  # one accumulator: the chunks' sums in chunk order
                    else:
                        add()

                numbered = list(enumerate(items))
                if all_stored:  # no filter to probe; a chunk's work is its rows' supports
                    _run_parallel(numbered, work, workers, cost=lambda it: it[1][1] - it[1][0])
                else:
                    _run_chunks(numbered, work, workers, cost=lambda it: _chunk_cost(*it[1]))
                for dk_w, dv_w in accs[1:]:
                    dk[b, hk] += dk_w
                    dv[b, hk] += dv_w
    return AttentionGrads(
        dq.astype(q.dtype, copy=False), dk.astype(k.dtype, copy=False),
        dv.astype(v.dtype, copy=False), ds, dalpha,
    )
