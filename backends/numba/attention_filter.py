"""The float32 filter of the numba attention: which keys of a row can carry probability.

For alpha > 1 a row's support lies within ``W = 1/(alpha - 1)`` of its
threshold (``p_j > 0`` only if ``z_j > theta - W``), so most keys carry nothing.  Per
chunk, one *float32* BLAS product ``g32 = q.k`` serves as a filter: with the rigorous
bound ``|z(g32) - z| <= err_i`` (:func:`score_errors`; Higham's ``gamma_{D+3} ||q|| ||k||``
scaled by ``scale |s_i|``), a key whose approximate score is below ``theta_lb - W -
2 err`` (``theta_lb`` a lower bound of the threshold: four Newton steps, from the left,
on the approximate scores, :func:`theta_lower`) certainly has ``p = 0``; the other keys
(the candidates, about the support size) get their exact float64 score by a dot product.
The row solver then runs on the candidates only, which gives the threshold and support of
the whole row (the others contribute exactly 0 at every threshold at or above it).  A
row whose float32 scores are not finite or huge, alpha = 1 (no window), and chunks where
the candidates exceed :data:`~.attention_chunks.FILTER_FRACTION` of the keys use a float64 BLAS product
instead.  The reference's overflow check (any non-finite score in the block raises) is
kept: exactly where the float32 scores are suspect.  The forward forms the float32 product
a block of a chunk's rows at a time (:data:`~.attention.FILTER_BLOCK_BYTES`), up to the last key the
block's rows see, and runs ``fwd_rows`` on each block while its scores are in cache.

Compile cost.  The helpers are plain ``@njit`` functions, not ``inline="always"``:
numba's IR-level inlining types every inlined body again at each call site (``_candidates``
three times in each direction, ``score_at`` a dozen times), most of the attention units'
compile time, while LLVM inlines the small helpers into their callers anyway at no cost
in run time.  Constants
that reach a callee are run-time values (``np.int64(0)``, ``np.bool_(True)``): numba
compiles a separate copy of the callee for each literal argument, the forward's and the
backward's ``_candidates`` were two copies (``use_max`` True and False), and a counter
that starts at a literal ``0`` and is passed on (``m = 0; ...; f(m)``) compiles the callee
twice, once for the ``Literal[int](0)`` that type inference sees first and once for int64.

Reference counts.  numba increfs every array argument of a compiled function on entry
and decrefs it on return (an atomic add each, on a counter the threads share): about 60
pairs a forward row, through the per-row helpers, were 4-5% of a forward's time.  The
per-row helpers of both directions (:func:`candidates_fast` and what it calls,
:mod:`.attention_rows`' ``row_result``, ``_weigh``, the backward's row helpers) allocate nothing
and return no array, so they are compiled without reference counting (``_nrt=False``):
they borrow the arrays of the kernel that calls them, which holds them for the call.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._jit import f64, jit, kernel

#: the operations whose calls run this module's kernels
_ATTENTION = ("attention_forward", "attention_backward")
from ..constants import FILTER_MARGIN, FILTER_SLACK, G_CUT_MARGIN, G_CUT_TINY
from .candidates import MASK_MIN, set_bits as _set_bits


@jit
def candidate_buffers(key_end):
    """Scratch of :func:`_candidates` for rows of up to ``key_end`` keys: the approximate
    scores ``za`` and the candidates' key ``idx``, exact score ``zc`` and exact q.k ``gx``."""
    return (np.empty(key_end, np.float64), np.empty(key_end, np.int64), np.empty(key_end, np.float64),
            np.empty(key_end, np.float64))


@jit
def score_at(gv, sc, j):
    """The reference's z of key ``j`` from its q.k ``gv`` (``sc`` a row's
    :data:`~.attention_records.RowScore`): ``a = scale * g``, ``z = a * s``, ``z = z - slope
    * |i_abs - j|``."""
    z = sc.scale * gv
    if sc.has_s:
        z = z * sc.s
    if sc.slope != 0.0:
        z = z - sc.slope * np.float64(abs(sc.i_abs - j))
    return z


@jit(fastmath={"reassoc", "contract"})
def dot64(qc, r, kv, j):
    """q_r . k_j (``qc[r] . k[j]``; the backward's dO_r . v_j too) in float64, summed in
    the order the compiler vectorises (``fastmath`` reassociation and fused multiply-adds:
    any order is as exact as BLAS's, and vector lanes are not one serial chain of D
    additions; twice as fast as four explicit partial sums).  ``kv`` is a pair of
    :data:`~.attention_records.KeysValues`: the keys in float64, or the float32 input
    itself (converted exactly).  The order depends on the rows' precision and the machine
    only, so every driver passes K (and V) as the others do: the chunked forward, the
    decoding path and the backward then get the same bits."""
    a = 0.0
    k32, k64 = kv
    if k64.shape[0] > 0:
        for d in range(qc.shape[1]):
            a += qc[r, d] * k64[j, d]
    else:
        for d in range(qc.shape[1]):
            a += qc[r, d] * k32[j, d]
    return a


@jit(_nrt=False)
def add_row(acc, w, kv, j):
    """``acc += w * kv[j]`` (``kv`` a pair of :data:`~.attention_records.KeysValues`; a
    float32 entry converted exactly), entry by entry in order."""
    k32, k64 = kv
    if k64.shape[0] > 0:
        for d in range(acc.shape[0]):
            acc[d] += w * k64[j, d]
    else:
        for d in range(acc.shape[0]):
            acc[d] += w * np.float64(k32[j, d])


@jit(_nrt=False)
def prefetch_pair(kv, j):
    """:func:`prefetch_row` of row ``j`` of the pair ``kv`` (its empty stand-in has no bytes)."""
    prefetch_row(kv[0], j)
    prefetch_row(kv[1], j)


#: How many candidates ahead the loops that read K or V rows in candidate order ask for a
#: row (:func:`prefetch_row`): the rows come in random order from L2 or L3, where one
#: row's latency is longer than its dot product.
PREFETCH_AHEAD = 8


@intrinsic
def prefetch_row(typingctx, a, j):
    """Ask the CPU to bring row ``j`` of the C-contiguous 2-D array ``a`` into L1, one
    prefetch instruction per 64-byte line (``llvm.prefetch``: a hint, never a fault, so
    any ``j`` is safe)."""
    if not (isinstance(a, types.Array) and a.ndim == 2 and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        from numba.core import cgutils

        aty = signature.args[0]
        arr = context.make_array(aty)(context, builder, args[0])
        stride = cgutils.unpack_tuple(builder, arr.strides)[0]
        jj = context.cast(builder, args[1], signature.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        base = builder.gep(builder.bitcast(arr.data, i8p), [builder.mul(jj, stride)])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        nbytes = builder.mul(cgutils.unpack_tuple(builder, arr.shape)[1],
                             context.get_constant(types.intp, aty.dtype.bitwidth // 8))
        with cgutils.for_range_slice(builder, context.get_constant(types.intp, 0), nbytes,
                                     context.get_constant(types.intp, 64)) as (off, _):
            # read (0), keep in all levels (3), data cache (1)
            builder.call(fn, [builder.gep(base, [off]), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(a, j), codegen


@jit(fastmath={"reassoc", "contract"}, _nrt=False)
def theta_lower(zc, m, L, a1):
    """A lower bound of the threshold of the scores ``zc[:m]`` (maximum ``L``; every key
    that can carry mass is among them).  For alpha <= 2 the mass ``f(A) = sum_j
    [1 + a1 (z_j - L - A)]_+^(1/a1) - 1`` is convex and decreasing in A, so Newton's
    iterates from A = 0 (where f >= 0) increase and stay below the root; four steps (a
    tighter bound saves more exact dot products and solver work than a step costs, up to
    the fourth), then a relative margin for rounding.
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
    return (L + A) - FILTER_MARGIN * (1.0 + abs(L) + A)


@jit
def max_cut(L, window, err):
    """The first cut of the float32 filter: a key whose approximate score is at most this
    line, below the row maximum ``L`` of the approximate scores by the window and ``3 err``
    (with margins for rounding), has ``p = 0``.  Shared by every filter pass (the chunked
    forward's and the decoding path's) so that they keep the same keys."""
    return L - (window * (1.0 + FILTER_MARGIN) + 3.0 * err + FILTER_SLACK) - FILTER_SLACK * abs(L)


@jit
def theta_cut(t, window, err):
    """The second cut: below ``t - window - 2 err`` (``t`` the threshold or a lower bound of
    it, with margins for rounding) a key's approximate score leaves ``p = 0``."""
    return t - window * (1.0 + FILTER_MARGIN) - 2.0 * err - FILTER_SLACK * (1.0 + abs(t))


@jit(_nrt=False)
def _score_over_cut(z, keyed, m1, cut, sc, buf):
    """The keys ``i < m1`` whose approximate score ``z[i]`` is over ``cut`` (key ``idx[i]``,
    or ``i`` itself unless ``keyed``), gathered in order into ``idx[:m]`` with no branch on
    the data, then their exact q.k (``gx[:m]``) and score (``zc[:m]``) for the row ``sc``;
    returns m (``buf = (za, idx, zc, gx)``, :func:`candidate_buffers`).  ``z`` may be ``zc``
    itself: the gather reads every entry before any is written.  The K rows come from L2
    or L3 in random order, so each is asked for :data:`PREFETCH_AHEAD` gathered keys before
    its dot product (the first ones before the loop); among the cut's input, most of which
    the cut drops, the requests would come too late for the rows that are read
    (docs/performance.md)."""
    _, idx, zc, gx = buf
    m = np.int64(0)
    for i in range(m1):
        idx[m] = idx[i] if keyed else i
        m += z[i] > cut
    for i in range(min(m, PREFETCH_AHEAD)):
        prefetch_pair(sc.keys, idx[i])
    for i in range(m):
        if i + PREFETCH_AHEAD < m:
            prefetch_pair(sc.keys, idx[i + PREFETCH_AHEAD])
        j = idx[i]
        gv = dot64(sc.qc, sc.r, sc.keys, j)
        gx[i] = gv
        zc[i] = score_at(gv, sc, j)
    return m


@jit(_nrt=False)
def all_keys(g, n, sc, buf):
    """Every visible key of row ``sc.r`` as a candidate, with its score from the float64
    q.k ``g`` (the product without the filter): writes ``idx[:n]`` (key), ``zc[:n]`` (z),
    ``gx[:n]`` (q.k); returns (n, whether every score of the row up to ``g.shape[1]`` is
    finite)."""
    _, idx, zc, gx = buf
    r = sc.r
    key_end = g.shape[1]
    nonfinite = 0
    for j in range(n):
        z = score_at(g[r, j], sc, j)
        idx[j] = j
        zc[j] = z
        gx[j] = g[r, j]
        nonfinite += (z - z) != 0.0
    for j in range(n, key_end):
        z = score_at(g[r, j], sc, j)
        nonfinite += (z - z) != 0.0
    return n, nonfinite == 0


@jit(_nrt=False)
def _candidates(g, n, sc, cut, buf):
    """The keys of row ``sc.r`` that can carry probability, with their exact float64 scores.

    ``g`` holds a float32 q.k, within ``cut.err`` of the exact score after
    :func:`score_at` (a rigorous bound, see :func:`score_errors`).  A key whose exact score
    is at most ``m - window`` (``m`` the row maximum: forward, ``cut.use_max``) or
    ``t - window`` (``t = theta``: backward) gets ``p = 0`` exactly; it is dropped when
    even its approximate score plus the error cannot reach that line.  The exact score of
    each candidate is then the float64 dot product.  Rows whose approximate scores are
    not finite (or huge) take every key, exactly.  Writes ``idx[:m]`` (key), ``zc[:m]``
    (exact z), ``gx[:m]`` (exact q.k); returns (m, whether every score of the row up to
    ``g.shape[1]`` is finite, checked on the exact scores as the reference does)."""
    za, idx, zc, gx = buf
    r = sc.r
    key_end = g.shape[1]
    window, err = cut.window, cut.err
    t = cut.t
    suspect = 0
    L = -np.inf
    m1 = np.int64(0)  # run-time values, not literals: see "Compile cost" above
    if cut.use_max:
        # the scores and their maximum L (four running maxima: no serial dependency),
        # then, branch-free, every key within the window (+ 3 err) of L
        L0 = -np.inf
        L1 = -np.inf
        L2 = -np.inf
        L3 = -np.inf
        j = np.int64(0)
        while j + 4 <= n:
            z0 = score_at(np.float64(g[r, j]), sc, j)
            z1 = score_at(np.float64(g[r, j + 1]), sc, j + 1)
            z2 = score_at(np.float64(g[r, j + 2]), sc, j + 2)
            z3 = score_at(np.float64(g[r, j + 3]), sc, j + 3)
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
            z0 = score_at(np.float64(g[r, j]), sc, j)
            za[j] = z0
            L0 = max(L0, z0)
            j += 1
        L = max(max(L0, L1), max(L2, L3))
        suspect += not (abs(L) < 1e300) and n > 0
        line = max_cut(L, window, err)
        for j in range(n):
            zj = za[j]
            suspect += not (zj > -1e300)
            idx[m1] = j
            zc[m1] = zj
            m1 += zj > line
    else:
        for j in range(n):
            z = score_at(np.float64(g[r, j]), sc, j)
            za[j] = z
            suspect += not (abs(z) < 1e300)
    for j in range(n, key_end):
        z = score_at(np.float64(g[r, j]), sc, j)
        suspect += not (abs(z) < 1e300)
    if suspect == 0:
        if cut.use_max:
            # a lower bound of the threshold of the approximate scores, which is within
            # err of the exact one (theta is 1-Lipschitz in the max norm of the scores)
            t = theta_lower(zc, m1, L, 1.0 / window)
        else:
            m1 = n
        line = theta_cut(t, window, err)
        m = _score_over_cut(zc if cut.use_max else za, cut.use_max, m1, line, sc, buf)
        return m, True
    # the float32 product overflowed or is near the float64 range: everything exactly
    nonfinite = 0
    for j in range(key_end):
        gv = dot64(sc.qc, r, sc.keys, j)
        z = score_at(gv, sc, j)
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


@jit(_nrt=False)
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


@jit(_nrt=False)
def z_range(g, j0, j1, sc):
    """For row ``sc.r``, whose ``z(g)`` is nondecreasing in g (no ALiBi slope, ``scale s >
    0``): the largest ``z`` of the keys ``j0 <= j < j1`` (-inf when there are none) and
    whether one of them is non-finite or huge (``|z| >= 1e300``, or a NaN ``g``), from the
    float32 range of ``g`` (:func:`_g_range`, a loop LLVM vectorises) in place of a
    float64 score of every key.  Without a NaN, that largest z is bit for bit the largest
    score (a monotone rounding keeps the order); with one the row is suspect and its
    largest z is not used."""
    if j1 <= j0:
        return -np.inf, 0
    lo, hi, nan = _g_range(g, sc.r, j0, j1)
    L = score_at(np.float64(hi), sc, j0)
    z_lo = score_at(np.float64(lo), sc, j0)
    return L, int(nan > 0 or not (z_lo > -1e300 and L < 1e300))


@jit
def g_cut(cut, scale, s):
    """A float32 line below which no ``g`` has ``z(g) = (scale g) s > cut`` (``scale s > 0``):
    ``cut / (scale s)`` lowered by far more than the roundings of z and of float32."""
    x = cut / (scale * s)
    return np.float32(x - abs(x) * G_CUT_MARGIN - G_CUT_TINY)


@jit(_nrt=False)
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


@jit(_nrt=False)
def candidates_fast(g, n, sc, cut, buf):
    """:func:`_candidates`, the same keys in the same order with the same scores, when
    ``z(g)`` is nondecreasing in g (no ALiBi slope, ``scale s > 0``): the row's range,
    maximum and the window's line are taken on the float32 ``g`` itself (no float64
    score of every key), and only the keys above a float32 line just below the float64
    cut get their approximate float64 score, compared with the cut exactly as
    :func:`_candidates` does.  Anything else (and a suspect row) is :func:`_candidates`."""
    za, idx, zc, gx = buf
    r = sc.r
    key_end = g.shape[1]
    if sc.slope != 0.0 or not (sc.scale * sc.s > 0.0) or n == 0:
        return _candidates(g, n, sc, cut, buf)
    j0 = np.int64(0)  # run-time values, not literals: see "Compile cost" above
    L, bad = z_range(g, j0, n, sc)  # L = max_j z(g_j): z is monotone
    if not bad:  # the keys checked for overflow beyond the visible ones
        bad = z_range(g, n, key_end, sc)[1]
    if bad:  # the row's float64 path (:func:`_candidates`)
        return _candidates(g, n, sc, cut, buf)
    if cut.use_max:
        line = max_cut(L, cut.window, cut.err)
    else:
        line = theta_cut(cut.t, cut.window, cut.err)
    gc = g_cut(line, sc.scale, sc.s)
    m1 = _above(g, r, n, gc, idx, za)  # za is free on this path
    m = np.int64(0)
    for i in range(m1):  # the approximate float64 scores of the survivors, the exact cut
        j = idx[i]
        z = score_at(np.float64(g[r, j]), sc, j)
        if z > line:
            idx[m] = j
            zc[m] = z
            m += 1
    if cut.use_max:
        # the lower bound of the threshold and the second cut of _candidates
        t = theta_lower(zc, m, L, 1.0 / cut.window)
        line = theta_cut(t, cut.window, cut.err)
    m = _score_over_cut(zc, np.bool_(True), m, line, sc, buf)
    return m, True


_U32 = 2.0**-24


@kernel(lambda x: (f64[:, ::1], f64, f64, f64[::1], f64[::1]), ops=_ATTENTION, dtypes=("float64",))
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


@kernel(lambda x: (x[:, ::1],), ops=_ATTENTION, dtypes=("float32",))
def key_norms(kk):
    """``||k_j||`` of every float32 key (row of ``kk``: float64 attention runs on the NumPy
    driver), from float64 sums of the exact float64 squares.  Any order of summation is
    inside :func:`score_errors`' factor 2 for the rounding of the norms."""
    n = np.empty(kk.shape[0])
    for j in range(kk.shape[0]):
        a = 0.0
        for d in range(kk.shape[1]):
            x = np.float64(kk[j, d])
            a += x * x
        n[j] = math.sqrt(a)
    return n
