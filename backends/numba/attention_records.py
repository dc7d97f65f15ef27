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


def scored(g, kv):
    """The row kernels' (scores, keys and values) types: the float32 filter's scores with K
    and V in the input dtype, or float64 scores with float64 K and V."""
    return g[:, ::1], kv[:, ::1]


def fwd_signature(g, kv):
    g, kv = scored(g, kv)
    return (g, i64, b1, f64[:, ::1], kv, f64[::1], kv, CHUNK_ROWS, FORWARD_ARRAYS, f64[:, ::1], i64[::1], i8[::1])


def bwd_signature(g, kv):
    g, kv = scored(g, kv)
    return g, b1, f64[:, ::1], kv, f64[::1], kv, CHUNK_ROWS, BACKWARD_ROWS, BACKWARD_OUT


#: the row kernels' signatures for input dtype ``x``: float32-filtered scores (K and V in
#: ``x``), and float64 scores (float64 K and V)
FWD_SIGNATURES = (lambda x: fwd_signature(f32, x), lambda x: fwd_signature(f64, f64))

#: the backward's row kernel's signatures, as :data:`FWD_SIGNATURES`
BWD_SIGNATURES = (lambda x: bwd_signature(f32, x), lambda x: bwd_signature(f64, f64))


def chunk_rows(b, h0, nc, i0, offset, causal, scale, row_scale, slopes, alphas):
    """A :data:`ChunkRows` whose scalar fields have the types the kernels are compiled
    for (int64, bool, float64), whatever integer or float types the caller has: one
    specialization per array type."""
    return ChunkRows(int(b), int(h0), int(nc), int(i0), int(offset), bool(causal), float(scale), row_scale, slopes,
                     alphas)
