"""The solver paths of the numba engine: which row solver a row's alpha takes.

With ``method=None`` each alpha takes one solver (:mod:`.rows`): softmax at alpha = 1,
sparsemax at 2, 1.5-entmax at 1.5, the general solver for other 1 < alpha < 2, and the
edge-relative solver above 2.  A kernel links the solver of one path only, so a call
compiles the paths its rows take; rows (or heads) of several alphas run as runs of
consecutive rows on one path (:func:`row_runs`, :func:`path_runs`; :func:`by_runs` runs
blocks of rows through the driver of each run).  Adding a path is one
entry of :data:`SOLVER_PATHS` and :data:`_PATH_TESTS` here, and its solver and driver in
:mod:`.rows`.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

#: The solver paths, by index (``PATH_*`` of :mod:`.rows`).
SOLVER_PATHS = ("softmax", "sparsemax", "entmax15", "entmax", "big")

#: The row solver that ``method=None`` takes for an alpha: the first path whose test holds
#: (the tests take a float or a float64 array), else ``entmax`` (1 < alpha < 2).
_PATH_TESTS = (("big", lambda a: a > 2.0), ("softmax", lambda a: a == 1.0), ("sparsemax", lambda a: a == 2.0),
               ("entmax15", lambda a: a == 1.5))


def _alphas(alpha: Any) -> np.ndarray:
    return np.asarray(alpha, dtype=np.float64).ravel()


def _paths(a: np.ndarray) -> np.ndarray:
    """The index in :data:`SOLVER_PATHS` of each float64 alpha (:data:`_PATH_TESTS`)."""
    return np.select([test(a) for _, test in _PATH_TESTS], [SOLVER_PATHS.index(p) for p, _ in _PATH_TESTS],
                     SOLVER_PATHS.index("entmax"))


def solver_path(alpha: float) -> int:
    """The index in :data:`SOLVER_PATHS` of rows with this alpha (:data:`_PATH_TESTS`; in
    Python on the float: the drivers ask it per head and block)."""
    a = float(alpha)
    return SOLVER_PATHS.index(next((p for p, test in _PATH_TESTS if test(a)), "entmax"))


def row_runs(alphas: Any) -> list[tuple[int, int, int]]:
    """Rows with these alphas (one each) as runs ``(lo, hi, path)`` of consecutive rows
    that take one solver path, in row order."""
    a = _alphas(alphas)
    if a.size == 0:
        return []
    if (a == a[0]).all():  # one alpha (the common case): one pass over the alphas
        return [(0, a.size, solver_path(a[0]))]
    paths = _paths(a)
    bounds = [0, *(np.flatnonzero(paths[1:] != paths[:-1]) + 1).tolist(), paths.size]
    return [(lo, hi, int(paths[lo])) for lo, hi in zip(bounds[:-1], bounds[1:])]


def path_runs(alphas: Any, per_head: int, r0: int, r1: int) -> list[tuple[int, int, int]]:
    """The rows ``r0 .. r1 - 1`` of a kv-head group (query head ``h`` holds rows ``h *
    per_head`` to ``(h + 1) * per_head - 1``; ``alphas`` one per head) as runs ``(lo, hi,
    path)`` of consecutive rows whose heads take one solver path, in row order."""
    runs: list[tuple[int, int, int]] = []
    for h, a in enumerate(_alphas(alphas).tolist()):
        lo, hi = max(r0, h * per_head), min(r1, (h + 1) * per_head)
        if lo >= hi:
            continue
        p = solver_path(a)
        if runs and runs[-1][2] == p and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi, p)
        else:
            runs.append((lo, hi, p))
    return runs


def by_runs(runs):
    """A driver ``(*args, r0, r1)`` over rows whose driver changes along them (``runs``:
    ``(lo, hi, driver)`` in row order, from :func:`row_runs`): a block's rows go through the
    driver of each run they overlap, keeping their row index (so their pivots' seeds)."""
    starts = [lo for lo, _, _ in runs]

    def kernel(*args):
        *args, r0, r1 = args
        i = bisect.bisect_right(starts, r0) - 1
        while r0 < r1:
            hi = min(r1, runs[i][1])
            runs[i][2](*args, r0, hi)
            r0, i = hi, i + 1

    return kernel
