"""The entry kernels of the finishing stage (:mod:`.exact_rows`), one per stage, and
:func:`finish_rows`, which runs each run of rows of one solver path through its stage's
kernel: a call compiles the stage of its own rows alone, and the compile workers share the
three.  The kernels take float64 rows; a run-time flag (``f32``) rounds the outputs and
``tau`` to float32 instead, for the float32 rows at 1 < alpha <= 2 that the float32 rounding
test leaves undecided (:func:`entmax_ref.backends.numba_backend._rows32`, which widens
them exactly): the same kernel, no second specialization.
"""

from __future__ import annotations

import math

import numpy as np

from ._jit import ANY, b1, f64, i64, jit, kernel
from ._threads import run_blocks
from .candidates import lane_max
from .exact_rows import KIND_15, KIND_GEN, KIND_SPARSE, SM_LANES, cr_alpha, cr_edge, cr_softmax
from .paths import by_runs, row_runs


@jit
def _row_max(x):
    """(max, index of the first maximum) of the float64 row ``x`` with a finite entry."""
    m = -np.inf
    top = np.int64(0)
    for i in range(x.shape[0]):
        if x[i] > m:
            m = x[i]
            top = i
    return m, top


@jit
def _finish_softmax(x, out, a1, idx, buf, lanes):
    """(tau, theta, support, ok) of the float64 softmax row ``x`` (a finite entry, none NaN
    or +inf); ``out`` rewritten correctly rounded (:func:`cr_softmax`, with the double-word
    exponential where the lean one leaves the row undecided)."""
    m = lane_max(x, lanes[0], lanes[1])[0]  # vectorised; no index wanted
    res = cr_softmax(x, out, m, buf[0], buf[1], lanes, np.bool_(False), np.bool_(False))
    if res[3]:
        return res
    return cr_softmax(x, out, m, buf[0], buf[1], lanes, np.bool_(False), np.bool_(True))


@jit
def _finish_alpha(x, out, a1, theta, idx, buf, f32):
    """:func:`_finish_softmax` at 1 < alpha = 1 + a1 <= 2 (:func:`cr_alpha`), from the
    threshold ``A0 = theta - m`` that the solver's largest output gives, p = e_alpha(-A0)
    (:mod:`.exact_rows`); with ``f32`` (float32 rows, whose outputs the solver rounded to
    float32) from the solver's ``theta`` itself, as the NumPy engine's stage starts, and
    rounded to float32."""
    m, top = _row_max(x)
    p = out[top]
    kind = KIND_SPARSE if a1 == 1.0 else (KIND_15 if a1 == 0.5 else KIND_GEN)
    if f32:
        A0 = theta - m
    elif kind == KIND_SPARSE:
        A0 = 1.0 - p
    elif kind == KIND_15:
        A0 = 2.0 - 2.0 * math.sqrt(p)
    else:
        A0 = -math.expm1(a1 * math.log(p)) / a1
    return cr_alpha(x, out, m, a1, kind, max(A0, 0.0), idx, buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6],
                    buf[7], buf[8], f32)


@jit
def _finish_edge(x, out, a1, idx, buf, lanes):
    """:func:`_finish_softmax` at alpha = 1 + a1 > 2 (:func:`cr_edge`), from the reference
    entry: the solver's smallest support entry."""
    m, top = _row_max(x)
    c = top
    for i in range(x.shape[0]):
        if out[i] > 0.0 and x[i] < x[c]:
            c = i
    return cr_edge(x, out, m, a1, x[c] - m, out[c], idx, buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6],
                   buf[7], False)


@jit(inline="always")
def _finish_stage(x, out, a1, theta, idx, buf, lanes, f32, stage):
    """The finishing of stage ``stage`` (``STAGE_*``), a constant of the calling kernel's
    code: numba inlines this function and prunes the chain to that branch, so the kernel
    links that stage alone.  ``f32`` reaches the alpha stage alone (the others finish
    float64 rows only)."""
    if stage == STAGE_SOFTMAX:
        return _finish_softmax(x, out, a1, idx, buf, lanes)
    if stage == STAGE_EDGE:
        return _finish_edge(x, out, a1, idx, buf, lanes)
    return _finish_alpha(x, out, a1, theta, idx, buf, f32)


#: the finishing stages: alpha = 1, 1 < alpha <= 2, alpha > 2
STAGE_SOFTMAX, STAGE_ALPHA, STAGE_EDGE = range(3)
#: the finishing kernels' signature: (x, alpha, out, theta, tau, support, ok, f32, r0, r1)
_FINISH = (f64[:, ::1], f64[::1], f64[:, ::1], f64[::1], f64[::1], i64[::1], b1[::1], b1, i64, i64)


def _finish_kernel(name, stage):
    """The entry kernel that finishes rows of stage ``stage`` (a kernel per stage, so that
    a call compiles the stage of its own rows alone)."""

    @kernel(lambda _: _FINISH, dtypes=ANY, name=f"exact_finish.{name}", ops=("entmax_forward",))
    def finish_rows(x, alpha, out, theta, tau, support, ok, f32, r0, r1):
        """Rows ``r0 .. r1 - 1`` of float64 ``x`` finished correctly rounded (the module
        docstring), from the solvers' ``out`` and ``theta`` (:func:`.rows.entmax_rows`),
        which it rewrites, with ``tau``, the exact ``support`` and ``ok`` (False: a row for
        :func:`entmax_ref.backends.exact_rows.entmax_row`); with ``f32`` (1 < alpha <= 2
        only) ``out`` and ``tau`` are rounded to float32, ``out`` holding 0 where it is not
        written."""
        n = x.shape[1]
        idx = np.empty(n, np.int64)
        buf = np.empty((9, n), np.float64)
        lanes = np.empty((3, SM_LANES), np.float64)
        for r in range(r0, r1):
            if theta[r] > -np.inf and theta[r] < np.inf:
                tau[r], theta[r], support[r], ok[r] = _finish_stage(x[r], out[r], alpha[r] - 1.0, theta[r], idx, buf,
                                                                     lanes, f32, stage)
            else:  # a settled row (NaN or +inf entries, or none finite) keeps the solver's answer
                tau[r], ok[r] = theta[r], True

    return finish_rows


_SOFTMAX_ROWS = _finish_kernel("softmax", STAGE_SOFTMAX)
_ALPHA_ROWS = _finish_kernel("alpha", STAGE_ALPHA)
_EDGE_ROWS = _finish_kernel("edge", STAGE_EDGE)
#: the finishing kernel of each solver path (:data:`.paths.SOLVER_PATHS`): softmax;
#: sparsemax, 1.5-entmax and 1 < alpha < 2 (:func:`cr_alpha`); alpha > 2 (:func:`cr_edge`)
FINISH_ROWS = (_SOFTMAX_ROWS, _ALPHA_ROWS, _ALPHA_ROWS, _ALPHA_ROWS, _EDGE_ROWS)


def finish_rows(x, alpha, out, theta, tau, support, ok, nblk, f32=False):
    """Rows of float64 ``x`` (one alpha each) finished correctly rounded, each run of rows
    of one solver path by that path's kernel (:data:`FINISH_ROWS`), in ``nblk`` blocks on
    the worker threads (:func:`._threads.run_blocks`); ``f32``: rounded to float32 (rows at
    1 < alpha <= 2 only)."""
    runs = [(lo, hi, FINISH_ROWS[path]) for lo, hi, path in row_runs(alpha)]
    if runs:
        run_blocks(runs[0][2] if len(runs) == 1 else by_runs(runs), (x, alpha, out, theta, tau, support, ok, f32),
                   x.shape, nblk)
