"""The chunk driver of the CPU attention engines: how a problem is cut into work.

Every engine walks the same pieces, so that each solves the same rows on the same keys:

* a problem is taken over ``(batch, kv-head)`` pairs, and inside each over chunks of
  query rows (:func:`batch_chunks`); a chunk takes the rows of *all* query heads that
  share the kv-head (grouped-query attention) and only the keys its rows may see (the
  geometry is :mod:`entmax_ref.backends.geometry`), so a score block is
  ``(group * chunk, key_end)`` and holds complete score rows;
* the chunk is chosen so that one float64 score block stays within :data:`BLOCK_BYTES`
  (``spec.chunk`` overrides it, :func:`choose_chunk`);
* a key mask whose attendable keys form one run per batch is the key-sliced problem of
  each batch without a mask (:func:`key_runs`, :func:`run_spec`,
  :func:`forward_by_key_runs`, :func:`backward_by_key_runs`);
* :func:`empty_forward` gives the arrays a forward fills, as rows that see no key leave
  them.

The NumPy reference (:mod:`entmax_ref.backends.numpy_attention`), the numba kernels'
drivers (:mod:`entmax_ref.backends.numba.attention`, :mod:`entmax_ref.backends.numba.decode`)
and the CuPy adaptor import these; nothing here computes a score.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import geometry
from ._base import AttentionForward, AttentionGrads, AttentionResidual, AttentionSpec, xp_of

__all__ = ["BLOCK_BYTES", "backward_by_key_runs", "batch_chunks", "choose_chunk", "concat_keys", "empty_forward",
           "forward_by_key_runs", "key_runs", "run_spec"]

_F64 = np.float64

#: Bytes of one float64 ``(rows, keys)`` score block when the chunk is chosen
#: automatically.  The row solver and the backward hold about 10-20 such blocks at once,
#: so the working set is about 20 x this (~160 MiB), independent of Nq.
BLOCK_BYTES = 8 * 2**20



def choose_chunk(spec: AttentionSpec, group: int, n_keys: int, n_queries: int) -> int:
    """Query rows per chunk: ``spec.chunk``, or the most rows whose ``(group * rows,
    n_keys)`` float64 block fits in :data:`BLOCK_BYTES` (at least 1)."""
    if spec.chunk is not None:
        return max(1, int(spec.chunk))
    per_row = 8 * group * max(n_keys, 1)
    return int(max(1, min(max(n_queries, 1), BLOCK_BYTES // per_row)))


def batch_chunks(spec: AttentionSpec, b: int, Nq: int, Nk: int, group: int) -> list:
    """(i0, i1, key_end) of every query chunk of batch b that sees a key: rows i0..i1 of
    each query head attend at most keys 0..key_end (causal structure and padding)."""
    length = Nk if spec.key_lengths is None else int(spec.key_lengths[b])
    if spec.key_mask is not None:  # no key after the last attendable one is visible
        kept = np.flatnonzero(np.asarray(spec.key_mask[b, :length]))
        length = int(kept[-1]) + 1 if kept.size else 0
    return geometry.chunk_bounds(length, Nq, Nk, choose_chunk(spec, group, length, Nq), spec.causal)


def key_runs(spec: AttentionSpec, Nk: int):
    """``[(lo, hi)]`` per batch when the keys each batch may attend (``key_mask`` and
    ``key_lengths`` together) form one contiguous run ``lo <= j < hi`` (left or right
    padding, or both), else None (a mask with holes, or no batch)."""
    keep = geometry.attendable_keys(Nk, spec.key_mask, spec.key_lengths)
    runs = []
    for row in keep:
        idx = np.flatnonzero(row)
        if idx.size and idx[-1] - idx[0] + 1 != idx.size:
            return None
        runs.append((int(idx[0]), int(idx[-1]) + 1) if idx.size else (0, 0))
    return runs or None


def run_spec(spec: AttentionSpec, b: int, lo: int, hi: int) -> AttentionSpec:
    """The problem of batch b restricted to its keys lo .. hi-1, as a key-sliced problem
    without a mask: with ``k[b, :, lo:]`` (Nk - lo keys, the first hi - lo valid) the
    bottom-right causal offset, the visible keys and the ALiBi distances |i_abs - j| are
    all shifted by lo, i.e. unchanged."""
    rs = None if spec.row_scale is None else spec.row_scale[b:b + 1]
    return replace(spec, key_mask=None, key_lengths=np.array([hi - lo], np.int64), row_scale=rs)


def forward_by_key_runs(forward, q, k, v, spec: AttentionSpec, otherwise):
    """A masked forward as one unmasked ``forward(q, k, v, spec)`` per batch on its run
    of keys (:func:`key_runs`); ``otherwise()`` when the mask has holes.  Works on the
    backend's array type.  The residual fields (theta, row_max, edge, edge_p, support_keys) are
    per query row, so the per-batch pieces concatenate into the whole problem's."""
    runs = key_runs(spec, k.shape[2])
    if runs is None:
        return otherwise()
    xp = xp_of(q)
    parts = [forward(q[b:b + 1], k[b:b + 1, :, lo:], v[b:b + 1, :, lo:], run_spec(spec, b, lo, hi))
             for b, (lo, hi) in enumerate(runs)]
    fields = {name: [getattr(p, name) for p in parts] for name in AttentionForward._fields}
    return AttentionForward(**{name: concat_keys(field) if name == "support_keys" else
                               None if field[0] is None else xp.concatenate(field) for name, field in fields.items()})


def concat_keys(parts):
    """Support keys of several batches as one array (each piece widened with -1 to the
    widest one's keys per row); None when a piece has none."""
    if not parts or any(p is None for p in parts):
        return None
    xp = xp_of(parts[0])
    width = max(p.shape[-1] for p in parts)
    return xp.concatenate([p if p.shape[-1] == width else
                           xp.concatenate([p, xp.full(p.shape[:-1] + (width - p.shape[-1],), -1, p.dtype)], axis=-1)
                           for p in parts])


def backward_by_key_runs(backward, do, q, k, v, res, skew, spec: AttentionSpec, otherwise):
    """The backward of :func:`forward_by_key_runs`: ``backward(do, q, k, v, res_b, skew_b,
    spec_b)`` per batch on its run of keys (``res_b`` the batch's slice of the
    :class:`~entmax_ref.backends._base.AttentionResidual`), dK and dV scattered back (0 off
    the run)."""
    runs = key_runs(spec, k.shape[2])
    if runs is None:
        return otherwise()
    xp = xp_of(q)
    parts = []
    for b, (lo, hi) in enumerate(runs):
        res_b = AttentionResidual(*(None if f is None else f[b:b + 1]
                                    for f in (getattr(res, name, None) for name in AttentionResidual._fields)))
        parts.append(backward(do[b:b + 1], q[b:b + 1], k[b:b + 1, :, lo:], v[b:b + 1, :, lo:], res_b,
                              None if skew is None else skew[b:b + 1], run_spec(spec, b, lo, hi)))
    dk = xp.zeros(k.shape, parts[0].dk.dtype)
    dv = xp.zeros(v.shape, parts[0].dv.dtype)
    for (lo, _), g, b in zip(runs, parts, range(len(runs))):
        dk[b, :, lo:] = g.dk[0]
        dv[b, :, lo:] = g.dv[0]

    def cat(name):
        fields = [getattr(g, name) for g in parts]
        return None if fields[0] is None else xp.concatenate(fields)

    return AttentionGrads(cat("dq"), dk, dv, cat("drow_scale"), cat("dalpha"))


def empty_forward(B: int, Hq: int, Nq: int, Dv: int, out_dtype=_F64, blank=None, skew=True) -> AttentionForward:
    """The arrays a chunked forward fills, as a row that sees no key leaves them: out
    (``out_dtype``: a driver whose chunks are float64 scratch gives q's dtype, so that no
    float64 copy of the whole output is made and converted) and skew 0 ((B, Hq, Nq, Dv);
    skew float64), theta, row_max and edge -inf, support and edge_p 0 ((B, Hq, Nq)), no
    support keys; the fields of :class:`~entmax_ref.backends._base.AttentionForward`.

    ``blank`` ((B, Hq, Nq) bool), for a driver that writes out and skew on every other
    row itself: only those rows are zeroed (the rest of the two large arrays is left
    uninitialised, its memory first touched by the driver's workers).  ``skew=False`` (a
    forward that keeps no residual, ``AttentionSpec.residual`` off): skew is None."""
    rows = (B, Hq, Nq)
    if blank is None:
        out, sk = np.zeros(rows + (Dv,), out_dtype), np.zeros(rows + (Dv,), _F64) if skew else None
    else:
        out, sk = np.empty(rows + (Dv,), out_dtype), np.empty(rows + (Dv,), _F64) if skew else None
        out[blank] = 0
        if skew:
            sk[blank] = 0.0
    return AttentionForward(out, np.full(rows, -np.inf), np.zeros(rows, np.int64), sk, np.full(rows, -np.inf),
                            np.full(rows, -np.inf), np.zeros(rows, _F64))
