"""The one definition of which keys a query sees (backends/geometry.py) and its users."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import constants, geometry
from helper_entry import entry


def _dense_visible(nq, nk, causal, lengths):
    """(B, Nq, Nk) bool: the definition written out entry by entry."""
    out = np.zeros((len(lengths), nq, nk), bool)
    for b, i, j in itertools.product(range(len(lengths)), range(nq), range(nk)):
        out[b, i, j] = j < lengths[b] and (not causal or j <= i + nk - nq)
    return out


@pytest.mark.parametrize("nq,nk", [(1, 1), (3, 5), (5, 3), (4, 4), (7, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_counts_chunks_and_masks_agree_with_the_definition(nq, nk, causal):
    lengths = np.array([nk, 0, max(nk - 2, 0), 1][: 3 if nk > 1 else 2], np.int64)
    dense = _dense_visible(nq, nk, causal, lengths)
    counts = geometry.keys_visible(nq, nk, causal=causal, key_lengths=lengths, batch=len(lengths))
    np.testing.assert_array_equal(counts[:, 0], dense.sum(axis=2))
    np.testing.assert_array_equal(er.keys_visible(nq, nk, causal=causal, key_lengths=lengths), counts)
    # a query sees a prefix of the keys
    np.testing.assert_array_equal(dense, np.arange(nk)[None, None, :] < counts[:, 0, :, None])
    i_abs = np.arange(nq)[:, None] + geometry.key_offset(nq, nk)
    padded = np.arange(nk) < lengths[:, None, None]
    np.testing.assert_array_equal(geometry.sees(i_abs, np.arange(nk)[None, :], causal) & padded, dense)
    for b, chunk in itertools.product(range(len(lengths)), (1, 2, 3, nq)):
        bounds = geometry.chunk_bounds(int(lengths[b]), nq, nk, chunk, causal)
        covered = set()
        for i0, i1, key_end in bounds:
            assert key_end == counts[b, 0, i0:i1].max() > 0, (b, chunk, i0, i1)
            covered.update(range(i0, i1))
        # every query that sees a key is in a chunk (a chunk may hold rows that see none)
        assert {i for i in range(nq) if counts[b, 0, i] > 0} <= covered, (b, chunk)


def test_key_masks_with_lengths_agree_with_the_definition():
    """attendable_keys (the key mask within the length) and its users: the counts of
    keys_visible with a key mask, and the runs of keys the mask-free drivers take."""
    from entmax_ref.backends._base import AttentionSpec
    from entmax_ref.backends.attention_driver import key_runs

    rng = np.random.default_rng(7)
    nq, nk = 4, 9
    mask = rng.random((5, nk)) < 0.6
    mask[3] = False
    mask[4] = np.arange(nk) >= 2  # left padding: one run
    lengths = np.array([nk, 5, 0, nk, 7], np.int64)
    keep = geometry.attendable_keys(nk, mask, lengths)
    for b, j in itertools.product(range(5), range(nk)):
        assert keep[b, j] == (mask[b, j] and j < lengths[b]), (b, j)
    np.testing.assert_array_equal(geometry.attendable_keys(nk, mask), mask)
    for causal in (False, True):
        counts = geometry.keys_visible(nq, nk, causal=causal, key_lengths=lengths, key_mask=mask)
        dense = _dense_visible(nq, nk, causal, np.full(5, nk))
        np.testing.assert_array_equal(counts[:, 0], (dense & keep[:, None, :]).sum(axis=2))
    spec = AttentionSpec(alpha=1.5, scale=1.0, causal=False, key_lengths=lengths[3:], key_mask=mask[3:])
    assert key_runs(spec, nk) == [(0, 0), (2, 7)]


def test_cuda_defines_carry_every_constant_the_sources_use():
    defines = dict(d[2:].split("=") for d in constants.cuda_defines())
    assert defines == {"ER_MAX_BLOCK": "512", "ER_SERIES_TERMS": str(constants.SERIES_TERMS),
                       "ER_EDGE_ULPS": repr(constants.EDGE_ULPS), "ER_EDGE_TIE_ULPS": repr(constants.EDGE_TIE_ULPS)}
    from entmax_ref.backends import _cuda_loader as L

    src = (L.cuda_dir() / "entmax_core.cuh").read_text()
    assert "k < ER_SERIES_TERMS" in src and "ER_EDGE_ULPS *" in src and "ER_EDGE_TIE_ULPS *" in src
    assert set(constants.cuda_defines()) <= set(L.OPTIONS)


def test_the_causal_rule_and_its_compiled_twin_agree():
    """The causal rule is :func:`geometry.visible_count`; its array form, the chunk ends
    and the numba kernels' per-row count (that very function, compiled) agree with it and
    with the definition written out, for every position, length and mask."""
    rows = pytest.importorskip("entmax_ref.backends.numba.attention_rows")
    assert rows._visible_count.py_func is geometry.visible_count
    positions, lengths = np.arange(-4, 12), np.arange(0, 9)
    for causal in (False, True):
        want = np.array([[sum(1 for j in range(n) if not causal or j <= i) for n in lengths] for i in positions])
        got = np.array([[geometry.visible_count(int(i), int(n), causal) for n in lengths] for i in positions])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(geometry.visible_counts(positions[:, None], lengths[None, :], causal), want)
        for i, n in itertools.product(positions, lengths):
            assert entry(rows._visible_count)(int(i), int(n), causal) == want[i - positions[0], n]
            # the row kernels' helper: head 0 of a chunk starting at query 0, offset i
            assert entry(rows._visible)(0, 1, 0, int(i), int(n), causal) == (0, i, want[i - positions[0], n])
        ends = [geometry.visible_keys_end(int(i) + 1, 0, int(n), causal) for i in positions for n in lengths]
        np.testing.assert_array_equal(np.array(ends).reshape(want.shape), want)
