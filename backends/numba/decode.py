"""Decoding: a few queries over a long key cache, split over the keys across threads.

The chunked forward of :mod:`entmax_ref.backends.numba.attention` parallelises over query
chunks and copies each kv-head's K to float64 (and float32) first; with one query (or a
few) per head and tens of thousands of cached keys there is one chunk per head, and the
copies and the score block cost more than the attention itself.  This path computes the same
quantities (the same float64 scores of every key that can carry mass, the same compiled
row solver, the same residual) in two phases, with no float64 copy of K or V and no BLAS:

phase 1 (per block of keys, on every worker)
    ``g[r, j] = fl(q_r . k_j)`` for every row r of the kv-head (the rows of all its query
    heads) in the input precision, summed in any order (``fastmath`` reassociation: the
    loop vectorises), stored as float32; the row maximum of the approximate scores
    ``z(g)`` over the block, a count of non-finite or huge ones, and the largest key norm
    ``||k_j||^2`` (float64, from the exact float64 squares).  K is read once, in place.
    When the call scans its inputs (:func:`scans_inputs`: ``check_finite`` on) the block's
    V rows are summed too, to detect a NaN/inf entry; with ``check_finite=False`` V is
    not read here at all (phase 2 reads it on the support only).

phase 2 (per row; when each kv-head is one block of phase 1, right after its block in
the same work item, with no barrier between the phases)
    the rigorous bound ``err`` of :func:`entmax_ref.backends.numba.attention.score_errors`
    (``gamma_{D+3} ||q|| max ||k||``, float32 unit roundoff whatever the input) makes the
    float32 scores a filter, exactly as in the chunked forward's ``_candidates``: keys
    within ``window + 3 err`` of the row maximum (into a buffer, shared by the rows of a
    work item, that starts at :data:`KEY_BUDGET` keys and grows only when a row has more
    candidates), a lower bound ``t`` of the threshold (Newton from the left on the
    approximate scores), then the exact float64 score (``dot64``, the chunked forward's own
    product) of the keys above ``t - window - 2 err`` only, the compiled row solver on
    those, and the output and skewed output from V on the support only.  A row whose
    approximate scores are suspect (non-finite, huge, or a non-finite error bound) takes
    every visible key exactly, with the reference's overflow check.

The candidates hold every key with ``p > 0`` and their exact float64 scores (bit for bit
those of the chunked forward's filter path), so theta, the support, the outputs and the
residual (row max, edge, edge probability) follow the same contract; the row solver is
seeded with the row's index in the chunked forward's chunk (``h * Nq + i``).  Overflow is
checked on the keys ``j < key_end`` of the row's chunk in the reference's chunking
(:func:`entmax_ref.backends.attention_driver.batch_chunks`), as the other drivers do.

Taken for ``Nq <= DECODE_MAX_QUERIES``, at most :data:`DECODE_MAX_ROWS` rows per kv-head,
at least :data:`DECODE_MIN_KEYS` keys per 4 queries, float32 or float64 inputs and every alpha > 1 (a
softmax head has no window: every key carries mass); key masks reach it per batch through
the key runs of the numba backend's ``attention_forward`` (which routes between this path
and the chunked forward).  Memory: the float32 ``(rows, keys)`` block of each
kv-head in flight (at most :data:`BLOCK_BYTES` of them at once) and, per phase-2 work
item, the candidate and row-solver buffers (:data:`KEY_BUDGET` keys, grown to the most
candidates of a row).
"""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np
from numba import njit

from . import CACHE
from ..attention_driver import batch_chunks
from ..engine import path_runs
from ..geometry import key_offset, visible_counts
from .attention_chunks import (OVERFLOW, group_alphas, group_slopes, chunk_row_scale, run_parallel, writable_copy,
                               empty_kernel_forward, trimmed_keys)
from .attention_filter import (PREFETCH_AHEAD, dot64, g_cut, max_cut, prefetch_row, score_at, theta_cut, theta_lower,
                               z_range, score_errors)
from .attention_rows import ForwardArrays, row_result, chunk_rows
from .rows import N_PATHS, solve_on_path, solver_scratch as _solver_scratch

#: Per row of a kv-head, what phase 2 takes from the geometry and from phase 1: the
#: visible keys ``nvis``, the keys checked for overflow ``nchk``, the largest approximate
#: score ``lmax``, the count of suspect scores ``suspect`` and the score error bound ``err``.
DecodeBounds = namedtuple("DecodeBounds", "nvis nchk lmax suspect err")

#: the decoding path is taken up to this many queries per head ...
DECODE_MAX_QUERIES = 16
#: ... and this many score rows per kv-head (query heads of a group x queries) ...
DECODE_MAX_ROWS = 128
#: ... from this many keys on per 4 queries (below it the chunked forward's copies and
#: BLAS products are cheaper: the chunked forward is 1.3x faster at 16 queries over 2,048 keys;
#: this path takes 0.26x its time at 4 queries over 8,192 keys, 0.67x at 1 over 2,048)
DECODE_MIN_KEYS = 2048
#: initial candidate buffer of a row (grows when a row has more candidates)
KEY_BUDGET = 4096
#: keys of one phase-1 work item (the kv-heads are split into at least this many keys)
KEY_BLOCK = 8192
#: bytes of the float32 score blocks of the kv-heads processed together
BLOCK_BYTES = 64 * 2**20


@njit(nogil=True, cache=CACHE, fastmath={"reassoc", "contract"})
def _dots(qf, kf, vf, scan_v, j0, j1, g, zero):
    """``g[r, j] = q_r . k_j`` (input precision, any order of summation, rounded to float32)
    for ``j0 <= j < j1``; returns the largest ``||k_j||^2`` of those keys (float64, from
    the exact squares of float32 entries) and the sum of those squares and (with
    ``scan_v``) of the entries of the ``v_j``: NaN or infinite when an entry is (or when
    finite entries overflow the sum: the caller then checks the entries themselves).
    The V rows are summed as one flat run after the keys, not key by key: a sum per key
    cost a horizontal reduction a key, and the separate run streams V by itself (phase 1
    of 65,536 keys x 8 heads, two threads: 9.7-10.7 -> 8.6-8.8 ms, against 8.4-8.6 for a
    plain read of K and V)."""
    R, D = qf.shape
    kn = 0.0
    tot = 0.0
    for j in range(j0, j1):
        s2 = 0.0
        for d in range(D):
            x = np.float64(kf[j, d])
            s2 += x * x
        kn = max(kn, s2)
        tot += s2  # a sum keeps NaN (a vectorised max may not)
        for r in range(R):
            acc = zero
            for d in range(D):
                acc += qf[r, d] * kf[j, d]
            g[r, j] = acc
    if scan_v:
        run = vf[j0:j1].reshape(-1)  # C-contiguous rows: one run of entries
        tv = zero
        for i in range(run.shape[0]):
            tv += run[i]  # input precision: an overflow only sends it to the exact check
        tot += tv
    return kn, tot


@njit(nogil=True, cache=CACHE)
def scan_block(qf, kf, vf, scan_v, j0, j1, blk, g, zero, nq, nvis, nchk, offset, scale, row_scale, slopes, lmax,
               suspect):
    """Phase 1 on keys ``j0 .. j1 - 1`` of one kv-head: the float32 scores ``g``, and per
    row the largest approximate score ``lmax[r, blk]`` over its visible keys and
    ``suspect[r, blk]``, nonzero when one among its checked keys (``nchk``) is non-finite
    or huge.
    Returns the largest ``||k_j||^2`` and the sum of squares of the block (see :func:`_dots`)."""
    R = g.shape[0]
    has_s = row_scale.shape[0] > 0
    kn, vn = _dots(qf, kf, vf, scan_v, j0, j1, g, zero)
    for r in range(R):
        h = r // nq
        i_abs = (r - h * nq) + offset
        s = row_scale[r] if has_s else 1.0
        slope = slopes[h]
        n = max(j0, min(nvis[r], j1))
        e = max(n, min(nchk[r], j1))
        if slope == 0.0 and scale * s > 0.0:
            # z(g) is nondecreasing in g: the extremes of the float32 g give those of z
            L, bad = z_range(g, r, j0, n, scale, s, has_s, i_abs)
            bad += z_range(g, r, n, e, scale, s, has_s, i_abs)[1]
        else:
            L = -np.inf
            bad = 0
            gv = g[r, j0:n]  # slices: no wraparound test of a run-time start in the loops
            for jj in range(gv.shape[0]):
                z = score_at(np.float64(gv[jj]), scale, s, has_s, slope, i_abs, j0 + jj)
                L = max(L, z)
                bad += not (abs(z) < 1e300)
            gc = g[r, n:e]
            for jj in range(gc.shape[0]):
                bad += not (abs(score_at(np.float64(gc[jj]), scale, s, has_s, slope, i_abs, n + jj)) < 1e300)
        lmax[r, blk] = L
        suspect[r, blk] = bad
    return kn, vn


@njit(nogil=True, cache=CACHE)
def rows_inputs(qc, kn, lmax, suspect, scale, row_scale, err, lrow, srow):
    """Phase 2's inputs for one kv-head from its blocks' phase-1 results (``kn`` (blocks,),
    ``lmax`` and ``suspect`` (rows, blocks)): the score error bound ``err`` of every row
    from the largest key norm (:func:`~.attention.score_errors`; a bound that is not
    finite, from a NaN/inf norm, becomes inf), and per row the largest approximate score
    ``lrow`` (NaN when one block's is) and the count of suspect scores ``srow``.  One
    compiled call with the GIL released: in a fused work item (:func:`decode_forward`) the
    other worker's calls are not kept waiting on this one's NumPy steps."""
    score_errors(qc, np.sqrt(_max_or_nan(kn)), scale, row_scale, err)
    for r in range(err.shape[0]):
        if not (abs(err[r]) < np.inf):
            err[r] = np.inf
        lrow[r] = _max_or_nan(lmax[r])
        srow[r] = suspect[r].sum()


@njit(inline="always", cache=CACHE)
def _max_or_nan(a):
    """The largest entry of a non-empty 1-D ``a``, NaN when one is (as ``np.max``)."""
    m = a[0]
    nan = False
    for j in range(a.shape[0]):
        nan = nan or a[j] != a[j]
        m = max(m, a[j])
    return np.nan if nan else m


@njit(cache=CACHE)
def _grown(a, m):
    b = np.empty(2 * a.shape[0], a.dtype)
    for i in range(m):  # a loop, not a slice assignment: no shape-error formatting to compile
        b[i] = a[i]
    return b


@njit(cache=CACHE)
def _gather(g, r, j0, j1, cut, scale, s, has_s, slope, i_abs, idx, zc, m):
    """Append the keys ``j0 <= j < j1`` whose approximate score exceeds ``cut`` (at most
    ``j1 - j0`` of them: the caller leaves that much room) to ``idx``, ``zc[m:]``.  When
    ``z(g)`` is nondecreasing in g (no ALiBi slope, ``scale s > 0``) a key's float32 ``g``
    is first compared with a line below which no z exceeds the cut
    (:func:`~.attention.g_cut`), and only the keys above it are scored: the same keys,
    scores and order.  The loops run over a slice of the row (no wraparound test of a
    run-time start)."""
    gr = g[r, j0:j1]
    if slope == 0.0 and scale * s > 0.0:
        gc = g_cut(cut, scale, s)
        for jj in range(gr.shape[0]):
            if gr[jj] > gc:
                z = score_at(np.float64(gr[jj]), scale, s, has_s, 0.0, i_abs, j0)
                if z > cut:
                    idx[m] = j0 + jj
                    zc[m] = z
                    m += 1
        return m
    for jj in range(gr.shape[0]):
        z = score_at(np.float64(gr[jj]), scale, s, has_s, slope, i_abs, j0 + jj)
        if z > cut:
            idx[m] = j0 + jj
            zc[m] = z
            m += 1
    return m


def _decode_kernel(path):
    """Phase 2's kernel of solver path ``path`` (as :func:`~.attention_rows._fwd_kernel`)."""

    @njit(nogil=True, cache=CACHE)
    def decode_rows(g, qc, kf, vf, r0, r1, rows, bounds, fwd, out, ncand, bad):
        """Phase 2 on rows ``r0 .. r1 - 1`` of one kv-head (see the module docstring): ``rows``
        the kv-head's :data:`~.attention_rows.ChunkRows` (its query heads ``h0 ..`` of batch
        ``b``, ``nc`` = Nq queries each); ``bounds`` (:data:`DecodeBounds`): per row the
        visible keys, the keys checked for overflow, phase 1's largest approximate score and
        suspect count over all blocks, and the score error bound; writes the outputs as
        :func:`~.attention_rows.fwd_rows` does (``out``, ``ncand``: exact dot products, and
        ``bad`` per row of the kv-head; the rest into the forward's arrays ``fwd``)."""
        nvis, nchk, lmax, suspect, err = bounds
        b, h0, nq, offset, scale, row_scale = rows.b, rows.h0, rows.nc, rows.offset, rows.scale, rows.row_scale
        slopes, alphas = rows.slopes, rows.alphas
        dv = vf.shape[1]
        has_s = row_scale.shape[0] > 0
        cap = KEY_BUDGET
        idx = np.empty(cap, np.int64)
        zc = np.empty(cap, np.float64)
        # the solver's scratch and the probabilities, grown with the candidate buffers
        pc = np.empty(cap, np.float64)
        c, aux, aux2 = _solver_scratch(cap)
        o = np.empty(dv, np.float64)
        sk = np.empty(dv, np.float64)
        for r in range(r0, r1):
            h = r // nq
            i_abs = (r - h * nq) + offset
            n = nvis[r]
            a1 = alphas[h] - 1.0
            a2 = 2.0 - alphas[h]
            big = alphas[h] > 2.0
            window = 1.0 / a1
            s = row_scale[r] if has_s else 1.0
            slope = slopes[h]
            e = err[r]
            L = lmax[r]
            ok = True
            if suspect[r] == 0 and e < 1e290 and (n == 0 or abs(L) < 1e300):
                cut = max_cut(L, window, e)
                m1 = np.int64(0)  # run-time values, not literals (the attention module's "Compile cost")
                j = np.int64(0)
                while j < n:  # stretches that cannot overflow the buffer (one key at most per key)
                    if idx.shape[0] - m1 < KEY_BUDGET // 4:
                        idx = _grown(idx, m1)
                        zc = _grown(zc, m1)
                    j1 = min(n, j + (idx.shape[0] - m1))
                    m1 = _gather(g, r, j, j1, cut, scale, s, has_s, slope, i_abs, idx, zc, m1)
                    j = j1
                t = theta_lower(zc, m1, L, 1.0 / window)
                cut = theta_cut(t, window, e)
                m = 0
                for i in range(m1):
                    if i + PREFETCH_AHEAD < m1:
                        prefetch_row(kf, idx[i + PREFETCH_AHEAD])
                    if zc[i] > cut:
                        j = idx[i]
                        idx[m] = j
                        zc[m] = score_at(dot64(qc, r, kf, j), scale, s, has_s, slope, i_abs, j)
                        m += 1
            else:  # every key exactly, with the reference's overflow check
                while idx.shape[0] < n:
                    idx = _grown(idx, np.int64(0))
                    zc = _grown(zc, np.int64(0))
                nonfinite = 0
                for j in range(nchk[r]):
                    z = score_at(dot64(qc, r, kf, j), scale, s, has_s, slope, i_abs, j)
                    nonfinite += (z - z) != 0.0
                    if j < n:
                        idx[j] = j
                        zc[j] = z
                m = n
                ok = nonfinite == 0
            if pc.shape[0] < m:
                pc = np.empty(idx.shape[0], np.float64)
                c, aux, aux2 = _solver_scratch(idx.shape[0])
            th, cnt = -np.inf, np.int64(0)
            if m > 0 and ok:  # as the chunked forward's rows (seeded with the row's index in its chunk, h * Nq + i)
                th, cnt, _, _ = solve_on_path(zc[:m], pc[:m], a1, c, aux, aux2, r, path)
            row_result(r, (b, h0 + h, r - h * nq), m, ok, (th, cnt), (zc, pc, idx), (a1, a2, big), vf, (o, sk),
                       fwd, out, bad, ncand)

    return decode_rows


#: Phase 2's kernel of each solver path (``DECODE_ROWS[path](g, qc, ...)``: :func:`_decode_kernel`
#: with ``path`` a compile-time constant), as ``FWD_ROWS``.
DECODE_ROWS = tuple(_decode_kernel(p) for p in range(N_PATHS))


# --------------------------------------------------------------------------- the driver
def eligible(q, k, v, spec) -> bool:
    """Whether :func:`decode_forward` takes this (unmasked) problem."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if spec.key_mask is not None or Nq > DECODE_MAX_QUERIES or Nk < DECODE_MIN_KEYS * -(-Nq // 4):
        return False
    if (Hq // Hkv) * Nq > DECODE_MAX_ROWS or B * Hq * Nq == 0 or D == 0 or v.shape[3] == 0:
        return False
    dt = q.dtype
    if dt not in (np.float32, np.float64) or k.dtype != dt or v.dtype != dt:
        return False
    if spec.head_alpha is None:
        return spec.alpha > 1.0
    return bool(np.all(np.asarray(spec.head_alpha, np.float64) > 1.0))


def scans_inputs(q, k, v, spec) -> bool:
    """Whether :func:`decode_forward` reads every entry of k and v, and raises
    :class:`~entmax_ref.backends._base.NonFiniteInput` on a NaN or infinite one (then the
    public layer need not scan them first): decoding problems without key lengths, when
    ``spec.check_finite`` is on.  With it off nothing is scanned: phase 1 reads K (for the
    scores) but not V, and phase 2 reads V on the support only."""
    return _scans(spec) and eligible(q, k, v, spec)


def _scans(spec) -> bool:
    """Whether an eligible call scans k and v (:func:`scans_inputs`)."""
    return bool(spec.check_finite) and spec.key_lengths is None


def _row_geometry(spec, b, Nq, Nk, group):
    """Per row (``h * Nq + i``) the visible keys and the keys its chunk checks for overflow."""
    nchk_q = np.zeros(Nq, np.int64)
    for i0, i1, key_end in batch_chunks(spec, b, Nq, Nk, group):
        nchk_q[i0:i1] = key_end
    nvis_q = visible_counts(np.arange(Nq) + key_offset(Nq, Nk), nchk_q, spec.causal)
    return np.tile(nchk_q, group), np.ascontiguousarray(np.tile(nvis_q, group), np.int64)


def _head_inputs(q, qd, k, v, spec, heads, geometry, nblks):
    """Per kv-head in flight (``heads``: (b, hk, key end)) the arrays its kernels take (its
    rows' queries in the input dtype ``qf`` and in float64 ``qc``, its keys and values,
    the rows' geometry, the float32 score block ``g``, row scales, slopes, alphas), and
    the phase-1 work items (kv-head, block, first key, end key) of its ``nblks`` blocks."""
    Hq, Nq, D = q.shape[1], q.shape[2], q.shape[3]
    group = Hq // k.shape[1]
    R = group * Nq
    hds, items = [], []
    for i, (b, hk, kend) in enumerate(heads):
        h0 = hk * group
        nchk, nvis = geometry[b]
        # C-contiguous and writable (a read-only view is copied): numba compiles one
        # specialization per argument type, and read-only is part of the type
        qf = writable_copy(np.ascontiguousarray(q[b, h0:h0 + group].reshape(R, D)))
        hds.append(dict(b=b, h0=h0, qf=qf, qc=qd[b, h0:h0 + group].reshape(R, D),
                        kf=writable_copy(np.ascontiguousarray(k[b, hk])), vf=writable_copy(np.ascontiguousarray(v[b, hk])),
                        nchk=nchk, nvis=nvis, g=np.empty((R, kend), np.float32),
                        rs=chunk_row_scale(spec, b, h0, group, 0, Nq), slopes=group_slopes(spec, h0, group),
                        alphas=group_alphas(spec, h0, group)))
        bounds = [(kend * j) // nblks[i] for j in range(nblks[i] + 1)]
        items += [(i, j, bounds[j], bounds[j + 1]) for j in range(nblks[i])]
    return hds, items


def decode_forward(q, k, v, spec):
    """The two-phase forward of the module docstring; the outputs and conventions of
    :func:`entmax_ref.backends.numba.attention.attention_forward`."""
    from .._base import AttentionForward, NonFiniteInput

    f64 = np.float64
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    R = group * Nq
    offset = key_offset(Nq, Nk)
    scale = float(spec.scale)
    keep = spec.residual
    (out, theta, support, skew, row_max, edge, edge_p, support_keys), (skew_w, keys_w) = \
        empty_kernel_forward(B, Hq, Nq, Dv, q.dtype, keep)
    fwd = ForwardArrays(skew_w, theta, support, row_max, edge, edge_p, keys_w, bool(keep))
    workers = numba.get_num_threads()
    zero = q.dtype.type(0)
    # check_finite on: every key is read, so scan k and v for NaN/inf too.  Off: V is read
    # on the support only; a NaN/inf in K still makes its scores suspect (phase 2 then
    # takes the row exactly and raises the overflow error)
    scan = _scans(spec)  # the backend took this path: the call is eligible

    pairs = [(b, hk) for b in range(B) for hk in range(Hkv)]
    geometry = {}  # per batch: the kv-heads of a batch share their rows' geometry
    qd = writable_copy(np.ascontiguousarray(q, f64))  # the queries in float64 (B, Hq, Nq, D: small), writable
    step = max(1, BLOCK_BYTES // (4 * R * Nk + 1))
    for p0 in range(0, len(pairs), step):
        heads = []
        for b, hk in pairs[p0:p0 + step]:
            if b not in geometry:
                geometry[b] = _row_geometry(spec, b, Nq, Nk, group)
            kend = int(geometry[b][0].max())
            if kend:
                heads.append((b, hk, kend))
        if not heads:
            continue
        H = len(heads)
        nblks = [max(1, min(-(-kend // KEY_BLOCK), -(-2 * workers // min(len(pairs), 2 * workers))))
                 for _, _, kend in heads]
        # the per-row and per-block results of every kv-head in flight, one array each (a
        # kv-head's slice of it is contiguous: the kernels take it as they took its own)
        nb = max(nblks)
        lmax = np.full((H, R, nb), -np.inf)
        suspect = np.zeros((H, R, nb), np.int64)
        kn = np.zeros((H, nb))
        vn = np.zeros((H, nb))
        hds, items = _head_inputs(q, qd, k, v, spec, heads, geometry, nblks)

        err = np.empty((H, R))
        lrow = np.empty((H, R))
        srow = np.empty((H, R), np.int64)
        o = np.empty((H, R, Dv))
        ncand = np.empty((H, R), np.int64)
        bad = np.zeros((H, R), np.int8)
        # every kv-head one block of phase 1 (twice as many kv-heads as threads or more, or few keys): a
        # kv-head's rows follow its scan in the same work item, with no barrier between the
        # phases and no second round of the threads (0.3-0.5 ms of a 12 ms call)
        fused = nb == 1

        def between(i):
            rows_inputs(hds[i]["qc"], kn[i], lmax[i], suspect[i], scale, hds[i]["rs"], err[i], lrow[i], srow[i])

        def phase2(slot, item):
            i, r0, r1 = item
            hd = hds[i]
            rows = chunk_rows(hd["b"], hd["h0"], Nq, 0, offset, spec.causal, scale, hd["rs"], hd["slopes"],
                              hd["alphas"])
            bounds = DecodeBounds(hd["nvis"], hd["nchk"], lrow[i], srow[i], err[i])
            for lo, hi, path in path_runs(hd["alphas"], Nq, r0, r1):  # each run of heads through its path's kernel
                DECODE_ROWS[path](hd["g"], hd["qc"], hd["kf"], hd["vf"], lo, hi, rows, bounds, fwd, o[i], ncand[i],
                                  bad[i])

        def phase1(slot, item):
            i, j, j0, j1 = item
            hd = hds[i]
            kn[i, j], vn[i, j] = scan_block(hd["qf"], hd["kf"], hd["vf"], scan, j0, j1, j, hd["g"], zero, Nq,
                                            hd["nvis"], hd["nchk"], offset, scale, hd["rs"], hd["slopes"], lmax[i],
                                            suspect[i])
            if fused:  # a NaN/inf in K or V is still reported below, before any result is returned
                between(i)
                phase2(slot, (i, 0, R))

        run_parallel(items, phase1, workers)
        if scan and not np.isfinite(vn.sum()):  # a NaN/inf entry (or finite ones past 1e154)
            for hd in hds:
                if not (np.isfinite(hd["kf"]).all() and np.isfinite(hd["vf"]).all()):
                    raise NonFiniteInput("k or v has a NaN or infinite entry")
        if not fused:
            for i in range(H):
                between(i)
            per = max(1, -(-R * H // (4 * workers)))
            run_parallel([(i, r0, min(R, r0 + per)) for i in range(H) for r0 in range(0, R, per)], phase2, workers)
        if bad.any():
            raise ValueError(OVERFLOW)
        for i, hd in enumerate(hds):
            out[hd["b"], hd["h0"]:hd["h0"] + group] = o[i].reshape(group, Nq, Dv)
    return AttentionForward(out, theta, support, skew, row_max, edge, edge_p,
                            trimmed_keys(support_keys, support))
