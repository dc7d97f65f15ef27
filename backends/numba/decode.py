"""Decoding: a few queries over a long key cache, split over the keys across threads.

The chunked forward of :mod:`entmax_ref.backends.numba.attention` parallelises over query
chunks and copies each kv-head's K to float64 (and float32) first; with one query (or a
few) per head and tens of thousands of cached keys there is one chunk per head, and the
copies and the score block cost more than the attention itself.  This path computes the
float32 filter scores itself, with no copy of K or V and no BLAS, split over the keys, and
then runs the chunked forward's own row kernel on them:

phase 1 (per block of keys, on every worker)
    ``g[r, j] = fl(q_r . k_j)`` for every row r of the kv-head (the rows of all its query
    heads) in the input precision, summed in any order (``fastmath`` reassociation: the
    loop vectorises), stored as float32, and the largest key norm ``||k_j||^2`` (float64,
    from the exact float64 squares).  K is read once, in place.  When the call scans its
    inputs (:func:`scans_inputs`: ``check_finite`` on) the block's V rows are summed too,
    to detect a NaN/inf entry; with ``check_finite=False`` V is not read here at all
    (phase 2 reads it on the support only).

phase 2 (per run of rows; when each kv-head is one block of phase 1, right after its
block in the same work item, with no barrier between the phases)
    the rigorous bound ``err`` of :func:`~.attention_filter.score_errors` (``gamma_{D+3}
    ||q|| max ||k||``, float32 unit roundoff whatever the input) makes the float32 scores
    a filter, and the chunked forward's row kernel with the heads' solver path
    (:func:`~.attention_rows.fwd_rows`, with the same K and V arrays the chunked forward
    passes it) does the rest, as on a chunk of the filter path: the candidates, their
    exact float64 scores, the row solver and the output from V on the support only; a row
    whose approximate scores are suspect (non-finite, huge, or a non-finite error bound)
    takes every key exactly, with the reference's overflow check.

The candidates hold every key with ``p > 0`` and their exact float64 scores, bit for bit
those of the chunked forward's filter path, so theta, the support, the outputs and the
residual (row max, edge, edge probability) are the chunked forward's; the row solver is
seeded with the row's index in the chunked forward's chunk (``h * Nq + i``).  Overflow is
checked on the keys up to the last key end of the batch's chunks in the reference's
chunking (:func:`entmax_ref.backends.attention_driver.batch_chunks`).  The path compiles
no row kernel of its own: its phase-1 kernels are the same for every solver path.

Taken for ``Nq <= DECODE_MAX_QUERIES``, at most :data:`DECODE_MAX_ROWS` rows per kv-head,
at least :data:`DECODE_MIN_KEYS` keys per 4 queries, float32 inputs (float64 attention runs on
the NumPy reference's driver, :mod:`entmax_ref.backends.numpy_attention`) and every alpha > 1 (a
softmax head has no window: every key carries mass); key masks reach it per batch through
the key runs of the numba backend's ``attention_forward`` (which routes between this path
and the chunked forward).  Memory: the float32 ``(rows, keys)`` block of each
kv-head in flight (at most :data:`BLOCK_BYTES` of them at once) and, per phase-2 call,
the row kernel's candidate and row-solver buffers (a few float64 arrays of the keys).
"""

from __future__ import annotations

import numba
import numpy as np

from ._jit import b1, f32, f64, i64, kernel
from .attention_chunks import OVERFLOW, Problem, empty_kernel_forward, run_parallel, trimmed_keys, writable_copy
from .attention_filter import score_errors
from .attention_records import ForwardArrays, KeysValues, RowsOut, pair
from .attention_rows import fwd_runs

#: the decoding path is taken up to this many queries per head ...
DECODE_MAX_QUERIES = 16
#: ... and this many score rows per kv-head (query heads of a group x queries) ...
DECODE_MAX_ROWS = 128
#: ... from this many keys on per 4 queries (below it the chunked forward, whose copies
#: and BLAS products then cost little, is the faster of the two)
DECODE_MIN_KEYS = 2048
#: keys of one phase-1 work item (the kv-heads are split into at least this many keys)
KEY_BLOCK = 8192
#: bytes of the float32 score blocks of the kv-heads processed together
BLOCK_BYTES = 64 * 2**20


@kernel(lambda x: (x[:, ::1], x[:, ::1], x[:, ::1], b1, i64, i64, f32[:, ::1], x), ops=("attention_forward",),
        dtypes=("float32",), fastmath={"reassoc", "contract"})
def scan_block(qf, kf, vf, scan_v, j0, j1, g, zero):
    """Phase 1 on keys ``j0 .. j1 - 1`` of one kv-head: ``g[r, j] = q_r . k_j`` (input
    precision, any order of summation, rounded to float32) for every row r.  Returns the
    largest ``||k_j||^2`` of those keys (float64, from the exact squares of float32
    entries) and the sum of those squares and (with ``scan_v``) of the entries of the
    ``v_j``: NaN or infinite when an entry is (or when finite entries overflow the sum:
    the caller then checks the entries themselves).  The V rows are summed as one flat
    run after the keys, not key by key: a sum per key costs a horizontal reduction a key,
    and the separate run streams V by itself, at about the speed of a plain read."""
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


@kernel(lambda x: (f64[:, ::1], f64[::1], f64, f64[::1], f64[::1]), ops=("attention_forward",),
        dtypes=("float64",))
def score_bounds(qc, kn, scale, row_scale, err):
    """The score error bound ``err`` of every row of a kv-head (:func:`~.attention_filter.
    score_errors`) from the largest squared key norm of its blocks ``kn`` (phase 1); a
    bound that is not finite (a NaN/inf norm) becomes inf, which leaves the row kernel no
    key to drop.  One compiled call with the GIL released: in a fused work item
    (:func:`decode_forward`) the other worker's calls are not kept waiting on this one's
    NumPy steps."""
    m = kn[0]
    nan = False
    for j in range(kn.shape[0]):
        nan = nan or kn[j] != kn[j]
        m = max(m, kn[j])
    score_errors(qc, np.sqrt(np.nan if nan else m), scale, row_scale, err)
    for r in range(err.shape[0]):
        if not (abs(err[r]) < np.inf):
            err[r] = np.inf


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


def _keys_seen(prob, b):
    """The keys the rows of batch b score: up to the last key end of its chunks in the
    reference's chunking (:func:`~entmax_ref.backends.attention_driver.batch_chunks`),
    whose overflow checks reach that far; 0 when no row sees a key."""
    return max((key_end for _, _, key_end in prob.chunks[b]), default=0)


def _head_inputs(q, qd, k, v, prob, heads, nblks):
    """Per kv-head in flight (``heads``: (b, hk, key end)) the arrays its kernels take (its
    rows' queries in the input dtype ``qf`` and in float64 ``qc``, its keys and values,
    the float32 score block ``g``, its rows' :data:`~.attention_records.ChunkRows`), and the
    phase-1 work items (kv-head, block, first key, end key) of its ``nblks`` blocks."""
    Hq, Nq, D = q.shape[1], q.shape[2], q.shape[3]
    group = Hq // k.shape[1]
    R = group * Nq
    hds, items = [], []
    for i, (b, hk, kend) in enumerate(heads):
        h0 = hk * group
        # C-contiguous and writable (a read-only view is copied): numba compiles one
        # specialization per argument type, and read-only is part of the type
        qf = writable_copy(np.ascontiguousarray(q[b, h0:h0 + group].reshape(R, D)))
        hds.append(dict(b=b, h0=h0, qf=qf, qc=qd[b, h0:h0 + group].reshape(R, D),
                        kf=writable_copy(np.ascontiguousarray(k[b, hk])), vf=writable_copy(np.ascontiguousarray(v[b, hk])),
                        g=np.empty((R, kend), np.float32), rows=prob.rows(b, h0, 0, Nq)))
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
    prob = Problem(spec, q.shape, k.shape)
    group = prob.group
    R = group * Nq
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
    seen = {}  # per batch: the keys its rows score (its kv-heads share them)
    qd = writable_copy(np.ascontiguousarray(q, f64))  # the queries in float64 (B, Hq, Nq, D: small), writable
    step = max(1, BLOCK_BYTES // (4 * R * Nk + 1))
    for p0 in range(0, len(pairs), step):
        heads = []
        for b, hk in pairs[p0:p0 + step]:
            if b not in seen:
                seen[b] = _keys_seen(prob, b)
            kend = seen[b]
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
        kn = np.zeros((H, nb))
        vn = np.zeros((H, nb))
        hds, items = _head_inputs(q, qd, k, v, prob, heads, nblks)

        err = np.empty((H, R))
        o = np.empty((H, R, Dv))
        ncand = np.empty((H, R), np.int64)
        bad = np.zeros((H, R), np.int8)
        # every kv-head one block of phase 1 (twice as many kv-heads as threads or more, or few keys): a
        # kv-head's rows follow its scan in the same work item, with no barrier between the
        # phases and no second round of the threads
        fused = nb == 1

        def between(i):
            score_bounds(hds[i]["qc"], kn[i], prob.scale, hds[i]["rows"].row_scale, err[i])

        def phase2(slot, item):
            i, r0, r1 = item
            hd = hds[i]
            # the chunked forward's row kernels on the float32 scores of phase 1 (every row's
            # keys in one block: the kv-head is one chunk)
            fwd_runs(hd["g"], 0, r0, r1, (err[i], hd["qc"]), KeysValues(pair(hd["kf"]), pair(hd["vf"])), hd["rows"],
                     fwd, RowsOut(o[i], ncand[i], bad[i]))

        def phase1(slot, item):
            i, j, j0, j1 = item
            hd = hds[i]
            kn[i, j], vn[i, j] = scan_block(hd["qf"], hd["kf"], hd["vf"], scan, j0, j1, hd["g"], zero)
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
