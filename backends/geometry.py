"""Which keys a query may see: the one definition of the attention geometry.

Causal masking is bottom-right aligned (FlashAttention's convention): with ``Nq`` queries
and ``Nk`` keys, query ``i`` sits at absolute position ``i + offset``, ``offset = Nk - Nq``,
and sees keys ``j <= i + offset``.  Padding keeps the first ``key_lengths[b]`` keys of
batch ``b`` (a prefix).  A query sees keys ``[0, visible_count)``, a prefix, unless a
``key_padding_mask`` (any subset of the keys per batch) is given.

The public layer (:func:`entmax_ref.keys_visible`, the ASEntmax ``n``), the NumPy driver
(masks and chunk bounds), the Numba driver (chunk bounds, the query offset), the CuPy
adaptor (chunk bounds) and the key-mask runs all three drivers take
(:func:`~entmax_ref.backends.attention_driver.key_runs`) use these functions; the compiled
per-row code of numba compiles :func:`visible_count` itself (``_visible``); the CUDA
kernels compute the same ``min(length, i + offset + 1)`` and are tested against it.
Every function works on Python integers and NumPy arrays of positions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["attendable_keys", "chunk_bounds", "key_offset", "keys_visible", "sees", "visible_count", "visible_counts",
           "visible_keys_end"]


def key_offset(nq: int, nk: int) -> int:
    """Absolute position of query 0 (bottom-right alignment): ``nk - nq``."""
    return nk - nq


def visible_count(i_abs: int, length: int, causal: bool) -> int:
    """The causal rule: the query at absolute position ``i_abs`` sees keys ``[0, n)`` of the
    ``length`` it may attend, ``n = min(length, i_abs + 1)`` (at least 0) under the causal
    mask, else ``length``.  Plain integer arithmetic on Python or NumPy integers: the
    numba kernels compile this very function (``numba.attention_rows._visible_count``)."""
    return max(0, min(length, i_abs + 1)) if causal else length


def visible_counts(i_abs, length, causal: bool) -> np.ndarray:
    """:func:`visible_count` of arrays of positions and lengths (broadcast), int64."""
    i_abs, length = np.asarray(i_abs, np.int64), np.asarray(length, np.int64)
    if not causal:
        return np.broadcast_to(length, np.broadcast(i_abs, length).shape).copy()
    return np.maximum(np.minimum(length, i_abs + 1), 0)


def visible_keys_end(i1: int, offset: int, length: int, causal: bool) -> int:
    """Keys ``[0, end)`` that some query ``i < i1`` sees (the last one sees the most)."""
    return max(0, visible_count(i1 - 1 + offset, length, causal))


def sees(i_abs, j, causal: bool):
    """Whether the query at absolute position ``i_abs`` may see key ``j`` under the causal
    mask (broadcasts; padding is a prefix, applied by cutting the keys at the length)."""
    return j <= i_abs if causal else np.ones(np.broadcast(i_abs, j).shape, bool)


def attendable_keys(nk: int, key_mask, key_lengths=None) -> np.ndarray:
    """Which keys each batch may attend, whatever the query: ``(batch, nk)`` bool, the
    ``key_mask`` (True where a key may be seen) within the first ``key_lengths[b]`` keys."""
    keep = np.asarray(key_mask, bool)
    if key_lengths is not None:
        keep = keep & (np.arange(nk)[None, :] < np.asarray(key_lengths, np.int64)[:, None])
    return keep


def keys_visible(nq: int, nk: int, *, causal: bool = False, key_lengths=None, batch: int = 1,
                 key_mask=None) -> np.ndarray:
    """Number of keys each query may see, shape ``(batch, 1, nq)`` int64 (``key_lengths``:
    a NumPy int array of shape ``(batch,)`` or None; ``key_mask``: a NumPy bool array of
    shape ``(batch, nk)``, True where a key may be seen, or None).  With a key mask the
    visible keys are no longer a prefix: the count is that of the mask's True entries
    among the keys the causal mask and the length leave."""
    if key_mask is not None:
        keep = attendable_keys(nk, key_mask, key_lengths)
        # before[b, e] = number of attendable keys among 0 .. e-1
        before = np.concatenate([np.zeros((keep.shape[0], 1), np.int64), np.cumsum(keep, axis=1, dtype=np.int64)],
                                axis=1)
        ends = visible_counts(np.arange(nq) + key_offset(nq, nk), nk, causal)
        return np.ascontiguousarray(before[:, None, ends], dtype=np.int64)
    lengths = np.full(batch, nk, np.int64) if key_lengths is None else np.asarray(key_lengths, np.int64)
    n = visible_counts((np.arange(nq) + key_offset(nq, nk))[None, None, :], lengths[:, None, None], causal)
    return np.ascontiguousarray(n, dtype=np.int64)


def chunk_bounds(length: int, nq: int, nk: int, chunk: int, causal: bool) -> list[tuple[int, int, int]]:
    """``(i0, i1, key_end)`` of every chunk of ``chunk`` queries that sees a key, for one
    batch entry with ``length`` valid keys: queries ``i0 .. i1 - 1`` see at most keys
    ``0 .. key_end - 1``.  Chunks that see nothing are left out."""
    offset = key_offset(nq, nk)
    bounds = []
    for i0 in range(0, nq, chunk):
        i1 = min(nq, i0 + chunk)
        key_end = visible_keys_end(i1, offset, length, causal)
        if key_end:
            bounds.append((i0, i1, key_end))
    return bounds
