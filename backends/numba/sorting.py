"""In-place selection and sorting of float64 scratch arrays for the family kernels.

Numba's own ``np.sort`` and ``np.partition`` compile its generic quicksort and introselect
machinery, about 80 functions per kernel that uses them: most of the budget-sparsemax
unit's compile time.  The kernels need less: the value of one rank among the finite
entries of a row (budget's prefilter) and an ascending sort of a short candidate list
(budget's breakpoints).  These two small functions do that in
place, with no NaN among the entries (the rows are checked finite; -inf entries are left
out by the callers).  Equal values are interchangeable, so the results are the same as
NumPy's except, at most, where -0.0 and +0.0 sit among equal entries.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit


@jit
def select(a, n, t):
    """The value of ascending rank ``t`` (0-based) among ``a[:n]``: ``np.partition(a[:n],
    t)[t]``.  Reorders ``a[:n]`` (quickselect, Hoare partition around a median of three)."""
    lo = 0
    hi = n - 1
    while hi > lo:
        x, y, z = a[lo], a[(lo + hi) // 2], a[hi]
        pivot = max(min(x, y), min(max(x, y), z))  # the median of the three
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if t <= j:
            hi = j
        elif t >= i:
            lo = i
        else:  # j < t < i: a[t] equals the pivot
            break
    return a[t]


@jit
def sort(a):
    """Sort the 1-D ``a`` in place, ascending (heapsort: no recursion, O(n log n))."""
    n = a.shape[0]
    for start in range(n // 2 - 1, -1, -1):
        _sift(a, start, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift(a, np.int64(0), end)  # not a literal: see the package docstring


@jit
def _sift(a, root, n):
    while True:
        child = 2 * root + 1
        if child >= n:
            return
        if child + 1 < n and a[child] < a[child + 1]:
            child += 1
        if a[root] < a[child]:
            a[root], a[child] = a[child], a[root]
            root = child
        else:
            return
