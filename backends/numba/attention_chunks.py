"""What the numba attention drivers share: worker threads, kv-heads, score products.

Threads.  ``numba.get_num_threads()`` Python worker threads take chunks (largest first)
from a queue (the backward: each from its own list, fixed in advance); each runs a BLAS
product and a ``nogil`` kernel (no ``prange``) on its chunk, so the kernels need no
thread-safe numba threading layer.  Results do not depend on thread timing
(:func:`run_parallel`).  The products run on the worker's own thread, in BLAS calls small
enough that BLAS starts no threads of its own (:mod:`.products`): the caller's BLAS
settings are never changed.
Each worker accumulates dK, dV of the current kv-head in its own float64 buffer, summed in
worker order at the head's end (one shared buffer, the chunks' parts added in chunk order,
when those would exceed :data:`~.attention_backward.ACCUMULATOR_BYTES`).

Memory of the drivers: per worker, one ``(rows, key_end)`` score block (float32 on the filter path) and
in the backward three more of the compacted support (int32 key, float64 ``p`` and
``u`` / ``s dZ``; ``(rows, width)`` and no score block where the chunk's rows have
their keys); the chunk is the driver's (a float64 block of ~8 MiB).  The forward's
support keys take at most 4 bytes x :func:`keys_width` a row (no more than the float64
skewed output), and are trimmed to the largest support when the forward ends.
"""

from __future__ import annotations

import threading

import numpy as np

from ..attention_driver import batch_chunks, empty_forward
from ..geometry import key_offset
from .attention_records import chunk_rows
from ._threads import run_items
from .attention_filter import key_norms, score_errors
from .products import matmul_into


#: The fewest support keys the forward keeps room for per row (``AttentionForward.support_keys``,
#: int32; :func:`keys_width`); a row with a larger support has it found again by the
#: backward's filter.
SUPPORT_KEYS = 64

#: The float32 filter is kept while the candidates it leaves are at most this fraction of
#: the visible keys (beyond it, one float64 product per chunk is cheaper than the exact
#: dot products of the candidates); 0 turns the filter off.
FILTER_FRACTION = 0.25

OVERFLOW = ("attention scores overflowed (non-finite s * scale * q.k + bias); "
             "rescale q, k, the scale or the ASEntmax scale")


def run_parallel(items, work, workers, cost=None):
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


def run_chunks(items, work, workers, cost=None, setup=()):
    """A driver's chunks, largest first: the first, as the probe that decides whether the
    float32 filter pays (``work(0, item, probe=True)``, on slot 0; see
    :func:`run_parallel`), while the other workers run the callables of ``setup`` (the
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
    run_parallel(items[1:], work, workers, cost)


class InOrder:
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


def chunk_cost(i0, i1, key_end):
    """A chunk's work, for "largest first" and the backward's static plan: its scores."""
    return (i1 - i0) * key_end


def writable_copy(a):
    """``a`` itself, or a copy when it is read-only (the kernels get writable arrays only:
    numba compiles one specialization per argument type, and read-only is part of it)."""
    return a if a is None or a.flags.writeable else a.copy()


class Problem:
    """What the numba attention drivers read of one call: its shapes and its
    :class:`~entmax_ref.backends._base.AttentionSpec`, read once where the call enters a
    driver.  Every later step (the chunks, their rows' records) takes this, never the spec:
    the spec goes down, not back and forth.  Each query head's alpha and ALiBi slope and
    the rows' ASEntmax scales are float64 arrays here; :meth:`rows` gives a chunk's fresh,
    C-contiguous, writable copies (one specialization per kernel argument type)."""

    def __init__(self, spec, q_shape, k_shape):
        self.B, self.Hq, self.Nq, self.D = q_shape
        self.Hkv, self.Nk = k_shape[1], k_shape[2]
        self.group = self.Hq // self.Hkv
        self.offset = key_offset(self.Nq, self.Nk)
        self.causal, self.scale = bool(spec.causal), float(spec.scale)
        self.alphas = (np.full(self.Hq, float(spec.alpha)) if spec.head_alpha is None else
                       np.array(spec.head_alpha, np.float64))
        self.slopes = np.zeros(self.Hq) if spec.alibi_slopes is None else np.array(spec.alibi_slopes, np.float64)
        self.row_scale = None if spec.row_scale is None else np.asarray(spec.row_scale, np.float64)
        #: the driver's chunks (i0, i1, key_end) of each batch, largest first
        self.chunks = [sorted(batch_chunks(spec, b, self.Nq, self.Nk, self.group), key=lambda t: -chunk_cost(*t))
                       for b in range(self.B)]
        self.chunk_given = spec.chunk is not None

    def rows(self, b, h0, i0, i1):
        """The :data:`~.attention_records.ChunkRows` of query rows ``i0 .. i1 - 1`` of the
        query heads ``h0 ..`` of one kv-head group of batch ``b``."""
        g = self.group
        rs = (np.empty(0) if self.row_scale is None else
              np.array(self.row_scale[b, h0:h0 + g, i0:i1], np.float64, order="C").reshape(-1))
        return chunk_rows(b, h0, i1 - i0, i0, self.offset, self.causal, self.scale, rs,
                          np.array(self.slopes[h0:h0 + g]), np.array(self.alphas[h0:h0 + g]))


class Head:
    """One kv-head's K and V as the drivers' chunks use them: the float32 keys transposed
    (``k32t``, (D, Nk) C-contiguous: the filter product's right operand, see
    :func:`chunk_product`), the keys and values in the input's precision (``kx``, ``vx``:
    what the filtered chunks' kernels read, the same arrays the decoding path passes, so
    that :func:`dot64` rounds the same way in both; the float32 input is converted
    exactly where it is read), the float64 key norms ``kn`` (a float32 overflow only
    turns the filter off) and, made by the first chunk that needs them (the float64
    product), the float64 keys ``kk`` and values; :meth:`rows` gives a chunk's pair."""

    def __init__(self, k, v, b, hk):
        with np.errstate(over="ignore", invalid="ignore"):
            self.k32t = np.ascontiguousarray(k[b, hk].T, np.float32)
        self.kx = writable_copy(np.ascontiguousarray(k[b, hk]))
        self.kn = key_norms(self.kx)
        self.vx = writable_copy(np.ascontiguousarray(v[b, hk]))
        self._kk = self.kx if k.dtype == np.float64 else None
        self._kkt = None
        self._v64 = self.vx if v.dtype == np.float64 else None
        self.lock = threading.Lock()

    @property
    def kk(self):
        """The float64 keys (a copy of a float32 input, made once)."""
        with self.lock:
            if self._kk is None:
                self._kk = np.ascontiguousarray(self.kx, np.float64)
        return self._kk

    @property
    def kkt(self):
        """The float64 keys transposed ((D, Nk) C-contiguous, made once): the right operand
        of the float64 product (:func:`chunk_product`)."""
        kk = self.kk
        with self.lock:
            if self._kkt is None:
                self._kkt = np.ascontiguousarray(kk.T)
        return self._kkt

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


class Heads:
    """The :class:`Head` of each kv-head, made once (under that head's lock) by whichever
    worker first needs it: the other workers while the probe chunk runs
    (:func:`run_chunks`' ``setup``), or the first chunk of the head.  The copies and key
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
                entry[1] = Head(self.k, self.v, b, hk)
        return entry[1]

    def clear(self):
        self.made.clear()


def filter_bound(filt, qc, kn, key_end, scale, rs):
    """(filt, err): whether a chunk uses the float32 filter (``filt``: it is on and may be
    used for this chunk; and the error bound is finite) and the per-row bound (zeros
    without the filter)."""
    if filt:
        err = np.empty(qc.shape[0])
        if score_errors(qc, float(kn[:key_end].max()), scale, rs, err):
            return True, err
    return False, np.zeros(qc.shape[0])


def chunk_scores(filt, qsl, qc, head, key_end, scale, rs, need=None):
    """A chunk's score block for the row kernels: with ``filt`` (see :func:`filter_bound`)
    the float32 product of the chunk's queries ``qsl`` with the keys of ``head`` (a
    :class:`Head`) and its per-row error bound; else the float64 product of ``qc``
    (``qsl`` as float64 rows) and a zero bound (only this makes the float64 keys).
    With ``need`` (a bool mask of the rows) only those rows of the block are formed (the
    others are left unwritten: their kernel rows do not read them).  Returns (g, err,
    filt)."""
    filt, err = filter_bound(filt, qc, head.kn, key_end, scale, rs)
    if filt:
        g = chunk_product(np.ascontiguousarray(np.asarray(qsl, np.float32).reshape(-1, qc.shape[1])),
                          head.k32t[:, :key_end], need)
    else:
        g = chunk_product(qc, head.kkt[:, :key_end], need)
    return g, err, filt


def chunk_product(a, bt, need):
    """``a @ bt`` (:func:`~.products.matmul_into`, on this thread), or only its rows where
    ``need`` (the others unwritten).  ``bt`` is a slice of transposed keys stored
    C-contiguous (``Head.k32t``, ``Head.kkt``): from that layout the product runs 1.1-1.5x
    faster than from the transposed view of the row-major keys (64-512 rows x 4,096 keys
    x 64, one thread, AMD Zen 4).  Overflows are left to the kernels to report."""
    if need is not None and not need.all():
        g = np.empty((a.shape[0], bt.shape[1]), a.dtype)
        g[need] = chunk_product(np.ascontiguousarray(a[need]), bt, None)
        return g
    g = np.empty((a.shape[0], bt.shape[1]), a.dtype)
    matmul_into(a, bt, g, 0.0)
    return g


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


def own_support_keys(res):
    """The forward's support keys in ``res`` when they are this backend's (a NumPy array;
    the public layer checked dtype and shape), else None."""
    keys = getattr(res, "support_keys", None)
    return np.ascontiguousarray(keys) if isinstance(keys, np.ndarray) else None
