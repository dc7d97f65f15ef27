"""The numba backward's handling of long problems: the support-only scatter into dK, dV
(with its prefetch of the rows ahead), the merged chunks of a backward whose rows all have
the forward's support keys, and gradients written in the inputs' dtype."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import attention_driver
from test_attention import dense, grad_tols
from test_attention import problem as _problem

pytestmark = pytest.mark.numba


def problem(*args, dtype=np.float32, **kw):
    """The attention tests' problems in float32: the fused kernels' inputs (float64
    attention runs the NumPy reference's driver on the numba engine)."""
    return _problem(*args, dtype=dtype, **kw)


nbwd = pytest.importorskip("entmax_ref.backends.numba.attention_backward")
nrows = pytest.importorskip("entmax_ref.backends.numba.attention_rows")


@pytest.mark.parametrize("counts", [[0, 0, 0], [1], [0, 3, 0, 0, 12, 1, 0, 9], [20, 0, 0, 0, 0, 0, 0, 0, 0, 2]])
def test_scatter_adds_every_entry_once(counts):
    """``bwd_scatter`` against ``np.add.at`` on chunks with empty rows, fewer entries than
    the prefetch distance, and rows shorter than it: the look-ahead cursor skips empty rows
    and every entry is added once."""
    rng = np.random.default_rng(len(counts))
    cnt = np.array(counts, np.int64)
    rows, width, nk, D, Dv = len(counts), max(counts) + 1, 40, 5, 3
    idx = np.full((rows, width), -1, np.int32)
    for r, c in enumerate(counts):
        idx[r, :c] = np.sort(rng.choice(nk, c, replace=False))
    pb, ub = rng.uniform(0, 1, (rows, width)), rng.standard_normal((rows, width))
    doc, qc = rng.standard_normal((rows, Dv)), rng.standard_normal((rows, D))
    dv, dk = np.zeros((nk, Dv)), np.zeros((nk, D))
    nrows.bwd_scatter((idx, pb, ub, cnt), doc, qc, 0.5, (dv, dk))
    want_v, want_k = np.zeros((nk, Dv)), np.zeros((nk, D))
    for r, c in enumerate(counts):
        np.add.at(want_v, idx[r, :c], pb[r, :c, None] * doc[r])
        np.add.at(want_k, idx[r, :c], 0.5 * ub[r, :c, None] * qc[r])
    # the same products added in the same order per key: the same bits
    np.testing.assert_array_equal(dv, want_v)
    np.testing.assert_array_equal(dk, want_k)


def test_merged_chunks():
    """Consecutive chunks are merged up to the row count, in query order, each run seeing its
    widest chunk's keys; a chunk larger than the count stays whole; largest first."""
    chunks = [(8, 12, 12), (0, 4, 4), (4, 8, 8), (12, 30, 30), (30, 33, 33)]
    assert nbwd.merged_chunks(chunks, 8) == [(12, 30, 30), (30, 33, 33), (0, 8, 8), (8, 12, 12)]
    assert nbwd.merged_chunks(chunks, 100) == [(0, 33, 33)]
    assert nbwd.merged_chunks([], 8) == []


@pytest.mark.parametrize("dtype", [np.float32])
def test_backward_from_stored_keys_runs_merged_chunks(monkeypatch, dtype):
    """Where every row has its support keys and ``chunk`` is the driver's, the backward
    runs its rows in merged chunks (fewer kernel calls) and gives the dQ of the unmerged
    chunks bit for bit, dK and dV within the rounding bounds of the dense formula, all in
    the inputs' dtype; one row without keys (a score block per chunk) keeps the driver's
    chunks."""
    rng, q, k, v = problem(5, B=1, Hq=2, Hkv=1, Nq=96, Nk=96, D=6, Dv=4, spread=2.0)
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    g_out = rng.standard_normal((1, 2, 96, 4)).astype(dtype)
    kw = dict(alpha=1.5, causal=True, backend="numba")
    # the driver's chunks: 8 query rows of the 2 heads (2 x 8 rows x 96 keys float64)
    monkeypatch.setattr(attention_driver, "BLOCK_BYTES", 8 * 2 * 8 * 96)
    monkeypatch.setattr(nbwd, "STORED_CHUNK_ROWS", 32)
    out, info = er.attention(q, k, v, return_info=True, **kw)
    assert (info.support_keys[..., 0] != -2).all()
    calls = []
    real = nbwd.bwd_rows

    def spy(scores, *rest):
        calls.append(scores.qc.shape[0])
        return real(scores, *rest)

    monkeypatch.setattr(nbwd, "bwd_rows", spy)
    g = er.attention_vjp(g_out, q, k, v, info=info, **kw)
    assert sorted(calls) == [64] * 3  # 96 rows in 3 merged chunks of 32 rows x 2 heads
    calls.clear()
    g8 = er.attention_vjp(g_out, q, k, v, info=info, chunk=8, **kw)
    assert sorted(calls) == [16] * 12
    assert g.dq.dtype == g.dk.dtype == g.dv.dtype == dtype
    assert np.array_equal(g.dq, g8.dq)
    up = [a.astype(np.float64) for a in (q, k, v)]
    tols = grad_tols(dense(*up, alpha=1.5, causal=True), *up, g_out, 1.5)
    g_ref = er.attention_vjp(g_out.astype(np.float64), *up, alpha=1.5, causal=True, backend="numpy")
    rounding = 0.0 if dtype == np.float64 else float(np.finfo(np.float32).eps)  # the one rounding to float32
    for name, a, b_, t in zip(("dq", "dk", "dv"), g, g_ref, tols):
        np.testing.assert_allclose(a, b_, rtol=0, atol=rounding * np.abs(b_).max() + t, err_msg=name)
    calls.clear()
    keys = info.support_keys.copy()
    keys[0, 1, 50, 0] = -2
    er.attention_vjp(g_out, q, k, v, info=dataclasses.replace(info, support_keys=keys), **kw)
    assert sorted(calls) == [16] * 12
