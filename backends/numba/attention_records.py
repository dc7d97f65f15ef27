"""The records the numba attention's row kernels take, and the signatures they are
compiled for.

A chunk's rows go down to the kernels as a few records (named tuples, which numba passes
as tuples) rather than dozens of positional arguments: what the rows are
(:data:`ChunkRows`), what a forward row writes (:data:`ForwardArrays`), what a backward
row reads and writes (:data:`BackwardRows`, :data:`BackwardOut`).  Their numba types, and
the kernels' signatures built from them, are declared here once.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import types

from ._jit import b1, f32, f64, i8, i32, i64, record

#: A chunk's place and its rows' parameters, as the row kernels take them (one record, which
#: numba passes as a tuple): batch ``b``, first query head ``h0``, queries per head ``nc``,
#: first query ``i0``, the absolute position of query 0 (``offset``), the causal flag, the
#: score scale, the rows' ASEntmax scales (``row_scale``, (rows,) or empty), and per query
#: head of the group the ALiBi ``slopes`` and ``alphas`` ((group,) float64).
ChunkRows = namedtuple("ChunkRows", "b h0 nc i0 offset causal scale row_scale slopes alphas")

#: The forward's arrays every row writes at its place ``[b, hq, i]`` (the whole
#: ``(B, Hq, Nq, ...)`` arrays): the skewed output, theta, the support, the residual (row
#: maximum, edge, edge probability) and the support keys; ``keep``: whether the skewed
#: output and the keys are formed (otherwise ``skew`` and ``keys`` are zero-size stand-ins).
ForwardArrays = namedtuple("ForwardArrays", "skew theta support rmax edge edge_p keys keep")

#: The backward's inputs per row of a chunk: theta, the residual of alpha > 2 (row max,
#: edge, edge probability; theta again where unused), dO, the forward's skewed output
#: ((rows, Dv) or (0, Dv)) and its support keys ((rows, cap) or (0, cap)).
BackwardRows = namedtuple("BackwardRows", "th rmax edge edge_p doc skew keys")

#: What the backward's row kernel writes per row of a chunk: the compacted support (key
#: ``idx``, ``pb`` = p, ``ub`` = s dZ, ``cnt`` entries), ``dq``, ``ds``, ``bad`` and
#: ``dal`` (dalpha, or empty).
BackwardOut = namedtuple("BackwardOut", "idx pb ub cnt dq ds bad dal")

#: the numba types of the records, as the drivers pass them (every array C-contiguous)
CHUNK_ROWS = record(ChunkRows, i64, i64, i64, i64, i64, b1, f64, f64[::1], f64[::1], f64[::1])
FORWARD_ARRAYS = record(ForwardArrays, f64[:, :, :, ::1], f64[:, :, ::1], i64[:, :, ::1], f64[:, :, ::1],
                        f64[:, :, ::1], f64[:, :, ::1], i32[:, :, :, ::1], b1)
BACKWARD_ROWS = record(BackwardRows, f64[::1], f64[::1], f64[::1], f64[::1], f64[:, ::1], f64[:, ::1], i32[:, ::1])
BACKWARD_OUT = record(BackwardOut, i32[:, ::1], f64[:, ::1], f64[:, ::1], i64[::1], f64[:, ::1], f64[::1], i8[::1],
                      f64[::1])


#: A block of a chunk's rows as the row kernels read their scores (:func:`scores_of`): the
#: float32 filter's product ``g32`` (``filt`` on; ``err`` its bound per row) or the float64
#: product ``g64`` (``filt`` off; ``err`` zeros), the other an empty stand-in, and the rows'
#: float64 queries ``qc``.  (The backward passes an empty ``g32`` with ``filt`` on when every
#: row reads its candidates from the forward's support keys.)
Scores = namedtuple("Scores", "g32 g64 filt err qc")

#: A kv-head's keys ``k`` and values ``v`` as the row kernels read them: each a pair
#: ``(float32, float64)`` of which one holds the rows (:func:`pair`) and the other is an empty
#: stand-in.  The kernels convert an entry to float64 where they read it (exactly), so one
#: compiled kernel serves both precisions with the bits of each.
KeysValues = namedtuple("KeysValues", "k v")

#: What a forward row kernel writes per row of its block, besides the forward's arrays: the
#: row's output in float64 (``out``, the driver converts it to q's dtype), its candidate
#: count ``ncand`` and ``bad`` (1 where a score overflowed).
RowsOut = namedtuple("RowsOut", "out ncand bad")

#: What scores row ``r`` of a block exactly (:func:`~.attention_filter.score_at`,
#: :func:`~.attention_filter.dot64`): the rows' float64 queries ``qc``, the keys (a pair), the
#: score scale, the row's ASEntmax scale ``s`` (``has_s``: whether there is one), its head's
#: ALiBi slope and its absolute query position ``i_abs``.
RowScore = namedtuple("RowScore", "qc r keys scale s has_s slope i_abs")

#: The float32 filter's cut of a row: its score error bound ``err``, the support window, and
#: the line it follows: the row's maximum (``use_max``: the forward) or the threshold ``t``
#: (the backward).
Cut = namedtuple("Cut", "err window use_max t")

_E32 = np.empty((0, 0), np.float32)
_E64 = np.empty((0, 0), np.float64)


def pair(a):
    """``a`` (C-contiguous float32 or float64 rows) as the (float32, float64) pair of
    :data:`KeysValues`."""
    return (a, _E64) if a.dtype == np.float32 else (_E32, a)


def scores_of(g, filt, err, qc):
    """The :data:`Scores` of a block: ``g`` float32 with ``filt`` (the filter), else float64."""
    return Scores(g, _E64, True, err, qc) if filt else Scores(_E32, g, False, err, qc)


PAIR = types.Tuple((f32[:, ::1], f64[:, ::1]))
SCORES = record(Scores, f32[:, ::1], f64[:, ::1], b1, f64[::1], f64[:, ::1])
KEYS_VALUES = record(KeysValues, PAIR, PAIR)
ROWS_OUT = record(RowsOut, f64[:, ::1], i64[::1], i8[::1])
#: the compacted support of a backward block: key ``idx``, p, s dZ, entries per row
SUPPORT = types.Tuple((i32[:, ::1], f64[:, ::1], f64[:, ::1], i64[::1]))

#: the forward's row kernel's signature (one for both input dtypes): (scores, keys and values,
#: first row, rows, the forward's arrays, the rows' outputs, the rows' solver path)
FWD_SIGNATURE = (SCORES, KEYS_VALUES, i64, CHUNK_ROWS, FORWARD_ARRAYS, ROWS_OUT, i64)

#: the backward's row kernel's signature: (scores, keys and values, rows, inputs, outputs)
BWD_SIGNATURE = (SCORES, KEYS_VALUES, CHUNK_ROWS, BACKWARD_ROWS, BACKWARD_OUT)

#: the backward's scatter into dV, dK: (support, dO, q, scale, (dV, dK) accumulators)
SCATTER_SIGNATURE = (SUPPORT, f64[:, ::1], f64[:, ::1], f64, types.UniTuple(f64[:, ::1], 2))

#: the backward's dense blocks: (support, P, U)
EXPAND_SIGNATURE = (SUPPORT, f64[:, ::1], f64[:, ::1])


def chunk_rows(b, h0, nc, i0, offset, causal, scale, row_scale, slopes, alphas):
    """A :data:`ChunkRows` whose scalar fields have the types the kernels are compiled
    for (int64, bool, float64), whatever integer or float types the caller has: one
    specialization per array type."""
    return ChunkRows(int(b), int(h0), int(nc), int(i0), int(offset), bool(causal), float(scale), row_scale, slopes,
                     alphas)
