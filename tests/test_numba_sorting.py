"""backends/numba/sorting.py: the in-place selection and sort that replace numba's np.partition
and np.sort in the budget-sparsemax kernels (a tenth of their compile time)."""

from __future__ import annotations

import numpy as np
import pytest

from entmax_ref.backends import unavailable_reason
from helper_entry import entry

pytestmark = [pytest.mark.numba,
              pytest.mark.skipif(unavailable_reason("numba") is not None, reason="numba is not installed")]


def _arrays():
    rng = np.random.default_rng(0)
    yield np.array([1.0])
    yield np.array([2.0, 1.0])
    yield np.zeros(7)
    yield np.array([0.0, -0.0, 0.0, -1.0, 1.0, -0.0])
    yield np.array([3.0, -np.inf, 1.0, np.inf, -2.0])
    for n in (3, 10, 33, 257, 1000):
        yield rng.standard_normal(n)
        yield rng.integers(-3, 4, n).astype(np.float64)  # many ties
        yield np.sort(rng.standard_normal(n))  # sorted, and reversed
        yield np.sort(rng.standard_normal(n))[::-1].copy()


def test_sort_matches_numpy():
    from entmax_ref.backends.numba.sorting import sort
    sort = entry(sort)

    for a in _arrays():
        got = a.copy()
        sort(got)
        assert np.array_equal(got, np.sort(a)), a


def test_select_matches_numpy_partition_at_every_rank():
    from entmax_ref.backends.numba.sorting import select
    select = entry(select)

    for a in _arrays():
        n = len(a)
        for t in range(n) if n <= 40 else (0, 1, n // 3, n // 2, n - 2, n - 1):
            work = np.concatenate([a, [np.nan, np.nan]])  # entries past n are never read
            assert select(work, n, t) == np.partition(a, t)[t], (a, t)
            assert np.array_equal(np.sort(work[:n]), np.sort(a))  # only reordered
