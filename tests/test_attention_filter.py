"""The numba attention's float32 filter pass on the float32 scores (``candidates_fast``)
against the float64 pass it replaces (``_candidates``): the same candidates, in the same
order, with the same scores, bit for bit, for the forward (row maximum) and the backward
(threshold) cuts, rows with ties, rows whose float32 scores overflow or are NaN, masked
(causal) tails, and the cases it hands back (an ALiBi slope, a negative scale)."""

from __future__ import annotations

import numpy as np
import pytest
from helper_entry import entry

pytestmark = pytest.mark.numba

nfilter = pytest.importorskip("entmax_ref.backends.numba.attention_filter")


def _run(fn, g, r, n, qc, kk, scale, s, slope, err, window, use_max, t):
    from entmax_ref.backends.numba.attention_records import Cut, RowScore, pair

    key_end = g.shape[1]
    bufs = (np.full(key_end, np.nan), np.zeros(key_end, np.int64), np.full(key_end, np.nan),
            np.full(key_end, np.nan))
    row = RowScore(qc, r, pair(kk), float(scale), float(s), bool(s != 1.0), float(slope), key_end - 1)
    m, ok = fn(g, n, row, Cut(float(err), float(window), bool(use_max), float(t)), bufs)
    _, idx, zc, gx = bufs
    return m, ok, idx[:m].copy(), zc[:m].copy(), gx[:m].copy()


def _same(*args):
    a = _run(entry(nfilter._candidates), *args)
    b = _run(entry(nfilter.candidates_fast), *args)
    assert a[0] == b[0] and a[1] == b[1]
    if a[1]:  # the candidates of a finite row (a row with a non-finite score raises in the driver)
        for x, y in zip(a[2:], b[2:]):
            np.testing.assert_array_equal(x, y)
    return b


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("scale", [0.125, 1.0, -0.5])
@pytest.mark.parametrize("s", [1.0, 0.7])
@pytest.mark.parametrize("slope", [0.0, 0.25])
def test_fast_filter_keeps_the_same_candidates(alpha, scale, s, slope):
    rng = np.random.default_rng(int(alpha * 100) + int(scale * 8) + int(s * 10) + int(slope * 4))
    R, N, D = 6, 301, 8
    qc = rng.standard_normal((R, D)) * 2.0
    kk = rng.standard_normal((N, D))
    kk[40] = kk[41]  # a tie
    g = (qc.astype(np.float32) @ kk.astype(np.float32).T).astype(np.float32)
    err = 2.0 * abs(scale) * s * 1e-5 * np.sqrt((qc * qc).sum(1)) * np.sqrt((kk * kk).sum(1)).max()
    window = 1.0 / (alpha - 1.0)
    for r in range(R):
        for n in (N, N - 37, 1):
            m, ok, idx, zc, _ = _same(g, r, n, qc, kk, scale, s, slope, err[r], window, True, 0.0)
            assert ok and m >= 1 and np.all(np.diff(idx) > 0)
            theta = zc.max() - 0.5 * window  # a threshold inside the window: the backward's cut
            _same(g, r, n, qc, kk, scale, s, slope, err[r], window, False, theta)
            _same(g, r, n, qc, kk, scale, s, slope, err[r], window, False, -np.inf)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("where", ["visible", "tail"])
def test_fast_filter_suspect_rows_take_the_float64_pass(bad, where):
    rng = np.random.default_rng(5)
    N, D = 64, 4
    qc = rng.standard_normal((1, D))
    kk = rng.standard_normal((N, D))
    g = (qc @ kk.T).astype(np.float32)
    g[0, 10 if where == "visible" else 60] = bad
    for use_max in (True, False):
        m, ok, *_ = _same(g, 0, 50, qc, kk, 0.125, 1.0, 0.0, 1e-6, 2.0, use_max, 0.1)
        assert m == 50  # every visible key, exactly


def test_prefetch_row_compiles_to_prefetches_and_never_faults():
    """``prefetch_row`` compiles to prefetch instructions (the loops that read K and V rows
    in candidate order rely on them) and, being a hint, is harmless for any row index."""
    from numba import njit

    @njit
    def touch(a, rows):
        s = 0.0
        for j in rows:
            nfilter.prefetch_row(a, j)
            s += 1.0
        return s

    for dt in (np.float32, np.float64):
        a = np.zeros((16, 64), dt)
        rows = np.array([0, 15, -1, 1 << 40, -(1 << 40)])
        assert touch(a, rows) == rows.size
        asm = touch.inspect_asm(touch.signatures[-1])
        assert "prefetcht0" in asm
