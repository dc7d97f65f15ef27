"""Attention of the numba backend: the fused, support-only chunked forward.

Both directions walk the query chunks of the NumPy driver
(:mod:`entmax_ref.backends.attention_driver`: the same chunk sizes, the same causal key
ranges ``[0, key_end)`` per chunk, rows of all query heads of a kv-head together) and
compute the same quantities in float64 (every score that can carry mass is the float64
``s_i * (scale * q_i.k_j) - slope_h |i_abs - j|`` of the reference, operation by
operation); only the organisation of the work differs.

The modules of the engine, one idea each: the float32 filter and exact scores
(:mod:`.attention_filter`), the row kernels (:mod:`.attention_rows`), what the drivers
share (:mod:`.attention_chunks`: worker threads, kv-heads, score products, the forward's
arrays), this forward's driver, the backward's (:mod:`.attention_backward`) and the
decoding path (:mod:`.decode`).

Alpha per head: every row takes its head's alpha (window, solver, weights); the float32
filter is used only in chunks without a softmax head.  Key masks: when the keys a batch
may attend form one run ``lo <= j < hi``, the batch runs as the key-sliced problem
``k[b, :, lo:]`` with ``hi - lo`` valid keys (:func:`entmax_ref.backends.attention_driver.
forward_by_key_runs`, ``backward_by_key_runs``); masks with holes use the NumPy driver with
the compiled row solver.  The routing (key runs, then the decoding path of
:mod:`entmax_ref.backends.numba.decode` or this chunked forward) is the numba backend's
``attention_forward`` and ``attention_backward``, done once: the drivers here take
problems without a key mask.

The forward, per chunk: the float32 filter product a block of rows at a time
(:data:`FILTER_BLOCK_BYTES`), up to the last key the block's rows see, and ``fwd_rows``
on each block while its scores are in cache; or one float64 product of the chunk.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from . import attention_chunks as shared
from ..geometry import visible_keys_end
from .attention_chunks import (OVERFLOW, Heads, Problem, chunk_cost, chunk_product, empty_kernel_forward,
                               filter_bound, run_chunks, trimmed_keys, writable_copy)
from .attention_records import ForwardArrays, KeysValues, RowsOut, pair
from .attention_rows import fwd_runs
from .products import matmul_into


#: Bytes of a chunk's float32 filter product formed at a time: the forward forms it and
#: runs the row kernel on it block by block, so that the scores the kernel reads are
#: still in the core's cache (L2: 1 MiB on the bench machine) rather than in memory.
#: A block has at least D rows (each block reads the keys once).
#: The blocks change nothing in the results (the filter only selects candidates; the
#: pivots keep their seed, the row's index in the chunk).  With a causal mask a block's
#: product stops at the last key its rows see, so the scores of masked keys are checked
#: for overflow up to the block's last visible key, not the chunk's (docs/attention.md).
FILTER_BLOCK_BYTES = 2**20


#: Bytes of the float64/float32 K, V copies of the kv-heads whose chunks the forward runs
#: in one parallel region.
HEAD_BYTES = 64 * 2**20



def attention_forward(backend, q, k, v, spec):
    """Chunked fused forward (see the module docstring); the NumPy driver's outputs and
    conventions (out in q's dtype, float64 theta and skew, int64 support)."""
    from .._base import AttentionForward

    if spec.key_mask is not None:
        raise ValueError("the chunked forward takes problems without a key mask: the backend routes key masks "
                         "(attention_driver.forward_by_key_runs)")
    f64 = np.float64
    q, k, v = (writable_copy(np.asarray(a)) for a in (q, k, v))
    prob = Problem(spec, q.shape, k.shape)
    keep = spec.residual  # off: no skewed output or support keys formed (no backward follows)
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group, offset, causal = prob.group, prob.offset, prob.causal
    bounds = prob.chunks  # the chunks of each batch
    blank = np.ones((B, Hq, Nq), bool)  # the rows no chunk runs
    for b, chunks in enumerate(bounds):
        for i0, i1, _ in chunks:
            blank[b, :, i0:i1] = False
    (out, theta, support, skew, row_max, edge, edge_p, support_keys), (skew_w, keys_w) = \
        empty_kernel_forward(B, Hq, Nq, Dv, q.dtype, keep, blank)
    fwd = ForwardArrays(skew_w, theta, support, row_max, edge, edge_p, keys_w, bool(keep))
    workers = numba.get_num_threads()
    state = {"filter": shared.FILTER_FRACTION > 0}  # the float32 filter, while it pays (alpha > 1 only)
    heads = Heads(k, v)

    def work(slot, item, probe=False):
        b, hk, i0, i1, key_end = item
        h0 = hk * group
        head = heads.get(b, hk)
        nc = i1 - i0
        qsl = q[b, h0:h0 + group, i0:i1]
        qc = np.ascontiguousarray(np.asarray(qsl, f64).reshape(-1, D))
        rows_rec = prob.rows(b, h0, i0, i1)
        filt, err = filter_bound(state["filter"] and bool(np.all(rows_rec.alphas > 1.0)), qc, head.kn, key_end,
                                  prob.scale, rows_rec.row_scale)
        kk, vv = head.rows(filt, key_end)
        kv = KeysValues(pair(kk), pair(vv))
        rows = qc.shape[0]
        o = np.empty((rows, Dv), f64)  # the output rows in float64; the rest goes to its place
        ncand = np.empty(rows, np.int64)
        bad = np.empty(rows, np.int8)
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
                    g = buf[:(e - a) * kend].reshape(e - a, kend)
                    matmul_into(q32[a:e], head.k32t[:, :kend], g, 0.0)
                else:
                    g = chunk_product(qc, head.kkt[:, :key_end], None)
                fwd_runs(g, a, a, e, (err, qc), kv, rows_rec, fwd, RowsOut(o, ncand, bad))
        if bad.any():
            raise ValueError(OVERFLOW)
        if probe and filt and ncand.sum() > shared.FILTER_FRACTION * rows * key_end:
            state["filter"] = False
        out[b, h0:h0 + group, i0:i1] = o.reshape(group, nc, Dv)

    # kv-heads in batches whose copies take at most HEAD_BYTES; the chunks of a batch run
    # in one parallel region (largest first), so that no worker idles at a head's end
    per_head = 20 * Nk * max(D, Dv) + 1
    step = max(1, HEAD_BYTES // per_head)
    pairs = [(b, hk) for b in range(B) for hk in range(Hkv)]
    for p0 in range(0, len(pairs), step):
        batch = pairs[p0:p0 + step]
        heads.clear()
        items = [(b, hk) + it for b, hk in batch for it in bounds[b]]
        items.sort(key=lambda t: -chunk_cost(*t[2:]))
        run_chunks(items, work, workers, setup=[functools.partial(heads.get, b, hk) for b, hk in batch])
    return AttentionForward(out, theta, support, skew, row_max, edge, edge_p,
                            trimmed_keys(support_keys, support))
