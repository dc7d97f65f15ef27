"""Attention of the numba backend: the support-only chunked backward.

Per chunk of the driver (:attr:`~.attention_chunks.Problem.chunks`; merged into runs of
:data:`STORED_CHUNK_ROWS` query rows when every row has its support keys), on a worker
thread: the rows' candidates (the forward's support keys, or the float32 filter against
the forward's theta, or a float64 score product), then the row kernel ``bwd_rows``
(:mod:`.attention_rows`: p rebuilt from the forward's residual, dZ on the support only,
dQ, ds and dalpha per row), then the chunk's part of dK and dV: ``bwd_scatter`` over the
compacted support, or, for a dense support (above :data:`DENSE_FRACTION` of the block),
BLAS on the expanded blocks.  Each worker adds into its own dK, dV accumulator of the
kv-head (the items given to the workers in advance, so the sums do not depend on thread
timing), or all into one in chunk order beyond :data:`ACCUMULATOR_BYTES`.  Softmax heads
(alpha = 1, a dense support) use the NumPy reference's backward with the compiled row
VJP.  Key masks are routed by the numba backend, once, before this driver
(:mod:`entmax_ref.backends.attention_driver`).
"""

from __future__ import annotations

import numba
import numpy as np

from . import attention_chunks as shared
from .attention_chunks import (OVERFLOW, Head, InOrder, Problem, chunk_cost, chunk_scores, own_support_keys,
                               run_chunks, run_parallel, writable_copy)
from .attention_records import BackwardOut, BackwardRows, KeysValues, pair, scores_of
from .attention_rows import bwd_rows, bwd_scatter, expand
from .products import matmul_into

#: Support density of a chunk (nonzeros / block size) above which the backward forms
#: dK and dV with BLAS on dense blocks instead of the support-only scatter.
DENSE_FRACTION = 0.125

#: Bytes the backward may spend on per-worker float64 dK/dV accumulators of one kv-head;
#: beyond it the workers share one pair, behind a lock.
ACCUMULATOR_BYTES = 512 * 2**20

#: Query rows (of each query head) of a chunk when every row has the forward's support
#: keys and the caller left ``chunk`` to the driver: no score block is formed then, so
#: the driver's chunks (sized for one: 64 rows at 16,384 keys) are merged into runs of
#: this many rows, and the per-chunk work in Python (about 0.1 ms a chunk) is paid fewer
#: times.  A chunk's memory is then O(rows x support keys + keys).
STORED_CHUNK_ROWS = 512

_NO_KEYS = np.empty((0, 1), np.int32)
_NO_G = np.empty((0, 0), np.float32)


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
        raise ValueError("the chunked backward takes problems without a key mask: the backend routes key masks "
                         "(attention_driver.backward_by_key_runs)")
    call = _Backward(do, q, k, v, res, skew, Problem(spec, q.shape, k.shape), bool(np.any(heads_alpha > 2.0)),
                     bool(spec.alpha_grad))
    for b in range(call.B):
        chunks = call.prob.chunks[b]
        if call.all_stored and not call.prob.chunk_given:
            chunks = merged_chunks(chunks, STORED_CHUNK_ROWS)
        items = list(enumerate(chunks))
        for hk in range(call.Hkv):
            call.head(b, hk, items)
    return AttentionGrads(call.dq, call.dk, call.dv,
                          call.ds, call.dalpha)


def merged_chunks(chunks, rows):
    """The chunks ``(i0, i1, key_end)`` merged, in query order, into runs of consecutive
    chunks of at most ``rows`` query rows (a longer chunk stays whole); each run sees the
    keys of its widest chunk.  Largest first, as :attr:`.attention_chunks.Problem.chunks`."""
    out = []
    for i0, i1, key_end in sorted(chunks):
        if out and out[-1][1] == i0 and i1 - out[-1][0] <= rows:
            out[-1] = (out[-1][0], i1, max(out[-1][2], key_end))
        else:
            out.append((i0, i1, key_end))
    return sorted(out, key=lambda t: -chunk_cost(*t))


class _Backward:
    """One backward call: its inputs as the kernels take them, its outputs, and the work
    of one chunk (:meth:`work`, on a worker thread)."""

    def __init__(self, do, q, k, v, res, skew, prob, big, alpha_grad):
        f64 = np.float64
        self.theta = writable_copy(np.asarray(res.theta))
        if big:
            if res.row_max is None or res.edge is None or res.edge_p is None:
                raise ValueError("alpha > 2 needs the forward's row_max, edge and edge_p to rebuild p exactly")
            self.resid = tuple(writable_copy(np.asarray(a)) for a in (res.row_max, res.edge, res.edge_p))
        else:
            self.resid = None
        self.do, self.q, self.k, self.v = (writable_copy(np.asarray(a)) for a in (do, q, k, v))
        self.skew = None if skew is None else writable_copy(np.asarray(skew))
        self.prob = prob
        self.B, Hq, self.Nq, self.D = self.q.shape
        self.Hkv, self.Nk, self.Dv = self.v.shape[1], self.v.shape[2], self.v.shape[3]
        self.group = Hq // self.Hkv
        # the gradients in the inputs' dtypes: dQ rows are written as their chunks finish,
        # dK, dV of a kv-head when its float64 sums are complete (rounded once, as ``_base.narrow``)
        self.dq = np.zeros((self.B, Hq, self.Nq, self.D), self.q.dtype)
        self.dk = np.zeros((self.B, self.Hkv, self.Nk, self.D), self.k.dtype)
        self.dv = np.zeros((self.B, self.Hkv, self.Nk, self.Dv), self.v.dtype)
        # worker 0's float64 sums of a kv-head: the outputs themselves when they are float64
        self.sums = tuple(None if a.dtype == f64 else np.empty(a.shape[2:], f64) for a in (self.dk, self.dv))
        self.ds = np.zeros((self.B, Hq, self.Nq), f64) if prob.row_scale is not None else None
        self.dalpha = np.zeros((self.B, Hq, self.Nq), f64) if alpha_grad else None
        self.keys_all = own_support_keys(res)
        self.all_stored = self.keys_all is not None and bool(np.all(self.keys_all[..., 0] != -2))
        self.scale = prob.scale
        self.workers = numba.get_num_threads()
        # per-worker accumulators of one kv-head (worker 0 uses dk, dv themselves), or one
        # shared pair, its additions in chunk order, when those would take too much memory
        self.shared = self.workers > 1 and (self.workers - 1) * 8 * self.Nk * (self.D + self.Dv) > ACCUMULATOR_BYTES
        self.extra = [] if self.shared else [(np.empty((self.Nk, self.D), f64), np.empty((self.Nk, self.Dv), f64))
                                             for _ in range(self.workers - 1)]
        self.filter = shared.FILTER_FRACTION > 0

    def head(self, b, hk, items):
        """dQ (ds, dalpha) of the chunks ``items`` of kv-head ``hk`` of batch ``b``, and
        that kv-head's dK, dV."""
        h0 = hk * self.group
        self.at = (b, h0, Head(self.k, self.v, b, hk))
        own = tuple(out[b, hk] if acc is None else acc for out, acc in zip((self.dk, self.dv), self.sums))
        for acc in self.sums:
            if acc is not None:
                acc[:] = 0.0
        self.accs = [own]
        for dk_w, dv_w in self.extra:
            dk_w[:] = 0.0
            dv_w[:] = 0.0
            self.accs.append((dk_w, dv_w))
        self.in_order = InOrder()
        if self.all_stored:  # no filter to probe; a chunk's work is its rows' supports
            run_parallel(items, self.work, self.workers, cost=lambda it: it[1][1] - it[1][0])
        else:
            run_chunks(items, self.work, self.workers, cost=lambda it: chunk_cost(*it[1]))
        for dk_w, dv_w in self.accs[1:]:
            own[0][:] += dk_w
            own[1][:] += dv_w
        with np.errstate(over="ignore"):  # beyond float32's range: +-inf, as ``_base.narrow``
            for out, acc in zip((self.dk, self.dv), self.sums):
                if acc is not None:
                    out[b, hk] = acc

    def rows(self, sl, key_end, head):
        """A chunk's rows as the kernel takes them (``sl`` its (batch, heads, queries)
        slice): q, dO, the rows' :data:`~.attention_records.ChunkRows`, the forward's
        support keys and whether every row has them, the score product (``g``, ``err``,
        ``filt``), theta and the residual of alpha > 2 (row max, edge, edge p), the skewed
        output (or an empty stand-in)."""
        f64, D, Dv = np.float64, self.D, self.Dv
        b, h0 = sl[0], sl[1].start
        qc = np.ascontiguousarray(np.asarray(self.q[sl], f64).reshape(-1, D))
        doc = np.ascontiguousarray(np.asarray(self.do[sl], f64).reshape(-1, Dv))
        rec = self.prob.rows(b, h0, sl[2].start, sl[2].stop)
        rows = qc.shape[0]
        kc = _NO_KEYS if self.keys_all is None else np.ascontiguousarray(self.keys_all[sl]).reshape(rows, -1)
        need = None if self.keys_all is None else kc[:, 0] == -2  # rows that find their support again
        stored = need is not None and not need.any()
        if stored:  # every row has its support's keys: no product, no filter pass
            g, err, filt = _NO_G, np.zeros(rows), True
        else:  # the product of the rows without keys only
            g, err, filt = chunk_scores(self.filter, self.q[sl], qc, head, key_end, self.scale, rec.row_scale, need)
        th = np.ascontiguousarray(np.asarray(self.theta[sl], f64).reshape(-1))
        if self.resid is None:
            resid = (th, th, th)  # not read for alpha <= 2
        else:
            resid = tuple(np.ascontiguousarray(np.asarray(a[sl], f64).reshape(-1)) for a in self.resid)
        sk = (np.empty((0, Dv), f64) if self.skew is None else
              np.ascontiguousarray(np.asarray(self.skew[sl], f64).reshape(-1, Dv)))
        return qc, doc, rec, kc, stored, g, err, filt, th, resid, sk

    def work(self, slot, item, probe=False):
        """Chunk ``item = (n, (i0, i1, key_end))`` on worker ``slot``: the row kernel, dQ,
        ds, dalpha, and its part of dK, dV (:meth:`add`)."""
        f64, (b, h0, head), group = np.float64, self.at, self.group
        n, (i0, i1, key_end) = item
        nc = i1 - i0
        sl = (b, slice(h0, h0 + group), slice(i0, i1))
        qc, doc, rec, kc, stored, g, err, filt, th, (rm, ce, qe), sk = self.rows(sl, key_end, head)
        kk, vv = head.rows(filt, key_end)
        rows = qc.shape[0]
        width = kc.shape[1] if stored else key_end
        idx = np.empty((rows, width), np.int32)
        pb = np.empty((rows, width), f64)
        ub = np.empty((rows, width), f64)
        cnt = np.empty(rows, np.int64)
        dqc = np.empty((rows, self.D), f64)
        dsc = np.empty(rows, f64)
        bad = np.empty(rows, np.int8)
        dal = np.empty(0, f64) if self.dalpha is None else np.empty(rows, f64)
        bwd_rows(scores_of(g, filt, err, qc), KeysValues(pair(kk), pair(vv)), rec,
                 BackwardRows(th, rm, ce, qe, doc, sk, kc), BackwardOut(idx, pb, ub, cnt, dqc, dsc, bad, dal))
        if (bad == 2).any():
            raise ValueError("support_keys do not belong to this call (a key out of order or not "
                             "visible to its row): pass the residual of this problem's forward")
        if bad.any():
            raise ValueError(OVERFLOW)
        if probe and filt and not stored and cnt.sum() > shared.FILTER_FRACTION * rows * key_end:
            self.filter = False
        with np.errstate(over="ignore"):  # float32 dQ: rounded once, +-inf beyond its range, as ``_base.narrow``
            self.dq[sl] = dqc.reshape(group, nc, self.D)
        if self.ds is not None:
            self.ds[sl] = dsc.reshape(group, nc)
        if self.dalpha is not None:
            self.dalpha[sl] = dal.reshape(group, nc)
        self.add(slot, n, key_end, g, qc, doc, (idx, pb, ub, cnt))

    def add(self, slot, n, key_end, g, qc, doc, support):
        """Chunk ``n``'s part of dK, dV into the accumulator of ``slot`` (the shared one in
        chunk order): BLAS on dense blocks when its support is dense, else the scatter."""
        f64 = np.float64
        dk_acc, dv_acc = self.accs[0 if self.shared else slot]
        dk_acc, dv_acc = dk_acc[:key_end], dv_acc[:key_end]
        idx, pb, ub, cnt = support
        rows = qc.shape[0]
        if cnt.sum() > DENSE_FRACTION * rows * key_end:
            P = np.empty((rows, key_end), f64)
            U = g if g.dtype == f64 else np.empty((rows, key_end), f64)  # g is done with
            expand(support, P, U)
            dv_part = np.empty((key_end, doc.shape[1]), f64)
            dk_part = np.empty((key_end, qc.shape[1]), f64)
            matmul_into(P.T, doc, dv_part, 0.0)
            matmul_into(U.T, qc, dk_part, 0.0)
            dk_part *= self.scale

            def add():
                np.add(dv_acc, dv_part, out=dv_acc)
                np.add(dk_acc, dk_part, out=dk_acc)
        else:
            def add():
                bwd_scatter(support, doc, qc, self.scale, (dv_acc, dk_acc))
        if self.shared:
            self.in_order(n, add)  # one accumulator: the chunks' sums in chunk order
        else:
            add()
