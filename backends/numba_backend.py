"""The numba backend: the fast CPU engine, with the NumPy reference's answers.

Row operations run as compiled Numba kernels (:mod:`entmax_ref.backends.numba`), in
float64 whatever the storage dtype, in parallel over blocks of rows on Python worker
threads (``nogil`` kernels, no ``prange``).  The algorithms are exact: the support is
identified exactly and the threshold is solved to full float64 precision, so the results
agree with the NumPy reference to a few ulps (identical supports).  See
:mod:`entmax_ref.backends.numba.rows` (and the modules it names) for the solvers:

``method=None``
    alpha = 1: log-sum-exp.  alpha = 2: Condat's algorithm (expected O(n)).  alpha = 1.5:
    randomised pivot with running mean / centred sum of squares (expected O(n)).  Both
    closed forms are polished by Newton on their support.  1 < alpha < 2: the 1.5 or 2
    threshold as a lower bound, then safeguarded Newton on the (1/a1)-norm form of the
    mass, to full precision, on the compacted candidates above the bound with a
    vectorised log1p and exp (:mod:`entmax_ref.backends.numba.gen`).  alpha > 2: pivot on the entries for the support's edge,
    then Newton on the edge probability (edge-relative, as the reference).
``"newton"``
    the safeguarded Newton iteration for every alpha (no closed forms, no bound).
``"bisect"``
    the reference's bisection to the last bit, on the same bracket.

Attention (:mod:`entmax_ref.backends.numba.attention`) walks the query chunks of
:mod:`entmax_ref.backends.attention_driver` (only the keys a causal chunk can see) on
worker threads.  Per chunk one float32 BLAS product serves as a rigorous filter (an error
bound on its scores rules out the keys that cannot reach the support window); the keys
left get their exact float64 scores, and one ``nogil`` kernel per chunk applies scale,
ALiBi and masks, solves each row with the compiled row solver and forms the output and
skewed output from the support only.  The backward rebuilds p on the same candidates from
the forward's residual (theta; for alpha > 2 the support's edge, as the row solvers write
it) and works on the support only (dO.v, dQ, and a scatter into dK, dV, and the row alpha
VJP when dalpha is asked for).  Alpha per head is per row in both kernels (each row rebuilt
by its own alpha's rule); a key mask that is one run of keys per batch runs them on the
key-sliced problem, a mask with holes (and the backward with a softmax head) the NumPy
driver with the compiled row solver.  Decoding (a few queries per head over a long key
cache, :mod:`entmax_ref.backends.numba.decode`) splits each kv-head's keys across the
workers instead: the float32 filter scores of every key in place (no float64 copy of K or
V, no BLAS), with the NaN/inf scan of K and V that the public layer then skips (none with
``check_finite=False``: V is then read on the support only), and per row the same exact
solve on the candidates and the output from V on the support only.

Threads: no kernel of this backend is a ``parallel=True`` (``prange``) kernel, so no
parallel region is ever launched on numba's threading layer and concurrent calls from
several Python threads are safe whatever the layer (``workqueue``, numba's fallback where
neither TBB nor OpenMP is installed, aborts the process on concurrent parallel launches;
no lock is needed).  Each row call runs its ``nogil`` kernels on worker threads that wait
between calls (:func:`entmax_ref.backends.numba._threads.run_blocks`; a call made while
another uses them starts threads of its own); the attention's workers run only ``nogil``
serial kernels and BLAS products cut into calls that BLAS runs on the calling thread
(:mod:`entmax_ref.backends.numba.products`), so BLAS's own settings are never touched.

Compiled code is cached on disk in the per-user cache directory (``ENTMAX_REF_CACHE_DIR``
moves it), keyed on a hash of all kernel sources (:mod:`entmax_ref.backends.numba._cache`);
``ENTMAX_REF_NUMBA_CACHE=0`` (set before first use) turns the cache off.  A row call compiles
only the solver path it takes (each of softmax, sparsemax, 1.5-entmax, 1 < alpha < 2,
alpha > 2 and the VJPs has its own driver, chosen in Python from alpha and the method);
the attention forward's one row kernel, ``fwd_rows``, links every path's row solver (its
code around the solver compiles once; the decoding path runs it too), in the calling
process; from then on ``backend="auto"`` runs it on numba too, in this process and,
through the cache, in the next.  Each entry kernel declares the signatures it is
compiled for (:mod:`entmax_ref.backends.numba._jit`) and the methods below pass exactly
those types (C-contiguous, writable arrays: read-only is part of a numba array type; see
:func:`writable`); ``entmax-ref compile`` compiles the declared list ahead of time, in
parallel worker processes (:mod:`entmax_ref.backends.numba_precompile`).  The first-call
times are in ``docs/guides/backends.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from ._base import AttentionForward, AttentionGrads, AttentionSpec, ExactRowSolve, NonFiniteInput, RowSolve
from .capabilities import require
from .exact_normmax import normmax_rows, normmax_vjp_rows
from .numba import exact_finish as _exact
from .numba import grads as _grads
from .numba import rows as _rows

_METHODS = {None: _rows.METHOD_DEFAULT, "bisect": _rows.METHOD_BISECT, "newton": _rows.METHOD_NEWTON}


def writable(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or a copy when it is read-only.

    Every array a kernel receives is C-contiguous and writable (numba compiles one
    specialization per array type, and read-only is part of the type), so each kernel
    compiles once per input dtype whatever flags the caller's arrays carry; a read-only
    input costs one copy, never a second compile."""
    return a if a.flags.writeable else a.copy()


def _as_rows(a: np.ndarray) -> np.ndarray:
    if a.dtype not in (np.float32, np.float64) or a.ndim != 2:
        raise TypeError(f"the numba backend takes 2-D float32/float64 arrays, got {a.dtype} with shape {a.shape}")
    return writable(np.ascontiguousarray(a))


def _as_alpha(alpha: np.ndarray, rows: int) -> np.ndarray:
    alpha = np.array(alpha, dtype=np.float64, order="C")  # a fresh (writable) copy: one kernel type
    if alpha.shape != (rows,):
        raise ValueError(f"alpha must have shape ({rows},), got {alpha.shape}")
    return alpha


def _pair(p: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, g) as rows of one shape and one dtype (float32 only when both are; the
    kernels compute in float64, so the widening is exact)."""
    p, g = _as_rows(p), _as_rows(g)
    if p.shape != g.shape:
        raise ValueError(f"p and g must have the same shape, got {p.shape} and {g.shape}")
    dt = np.result_type(p.dtype, g.dtype)
    return p.astype(dt, copy=False), g.astype(dt, copy=False)


def _solve_buffers(x: np.ndarray):
    """The outputs a row solver fills: p (x's dtype), threshold, support, iterations, converged."""
    rows, n = x.shape
    return (np.empty((rows, n), x.dtype), np.empty(rows, np.float64), np.empty(rows, np.int64),
            np.empty(rows, np.int64), np.empty(rows, np.bool_))


def _row_forward(kernel, x: np.ndarray, alpha: np.ndarray, *options) -> RowSolve:
    """A row solver's kernel ``kernel(x, alpha, *options, outputs, blocks)`` on checked
    rows (``alpha`` one float64 per row) into :func:`_solve_buffers` (the kernels'
    :data:`~entmax_ref.backends.numba.rows.Solved` record)."""
    x = _as_rows(x)
    alpha = _as_alpha(alpha, x.shape[0])
    bufs = _solve_buffers(x)
    if x.shape[0]:
        kernel(x, alpha, *options, _rows.Solved(*bufs), 8 * numba.get_num_threads())
    return RowSolve(*bufs)


def _exact_softmax32(x: np.ndarray, rows: np.ndarray, res: RowSolve, tau: np.ndarray | None = None) -> None:
    """The float32 softmax rows ``rows`` that the row kernel's compiled finishing stage left
    undecided (an output within about 2^-100 of a float32 rounding boundary), solved
    exactly (:func:`.exact_rows.entmax_row`) into ``res`` (and ``tau``, where given), with
    a ``theta`` whose float32 rounding is their ``tau``."""
    from .exact_rows import entmax_row

    for r in rows:
        p, t, theta, k = entmax_row(x[r].astype(np.float64), 1.0, np.float32)
        theta = theta if np.float32(theta) == np.float32(t) else t
        res.p[r], res.theta[r], res.support[r], res.converged[r] = p, theta, k, True
        if tau is not None:
            tau[r] = t


def _entmax_rows(x: np.ndarray, alpha: np.ndarray, method: int) -> RowSolve:
    """The row solvers (:func:`.numba.rows.entmax_rows`); float64 rows then finished correctly
    rounded (:func:`.numba.exact_finish.finish_rows`), and finished again
    (:func:`_finish_left`) where that stage leaves them undecided or where alpha - 1 is not
    a float64 (alpha >= 2^52).  float32 rows: :func:`_rows32`."""
    x = _as_rows(x)
    if x.dtype == np.float32 and x.shape[0]:
        return _rows32(x, _as_alpha(alpha, x.shape[0]), method)
    res = _row_forward(_rows.entmax_rows, x, alpha, method)
    if not x.shape[0]:
        return res
    alpha = _as_alpha(alpha, x.shape[0])
    tau = np.empty(x.shape[0], np.float64)
    ok = np.empty(x.shape[0], np.bool_)
    _exact.finish_rows(x, alpha, res.p, res.theta, tau, res.support, ok, 8 * numba.get_num_threads())
    left = np.flatnonzero(~ok | ((alpha >= 2.0 ** 52) & (res.n_iter >= 0)))
    if left.size:
        res.p[left], tau[left], res.theta[left], res.support[left] = _finish_left(x[left], alpha[left],
                                                                                  res.theta[left], np.float64)
    return ExactRowSolve(*res, tau)


def _finish_left(x: np.ndarray, alpha: np.ndarray, theta: np.ndarray, dtype):
    """The float64 rows ``x`` (float32 rows exactly widened) that the compiled finishing
    stage left undecided, correctly rounded to ``dtype`` from the estimate ``theta``: rows at
    alpha <= 2 with a finite ``theta`` through the NumPy engine's finishing stage
    (:func:`.exact_rows.finish`, which solves the rows it leaves exactly), the others by the
    exact solver (:func:`.exact_rows.entmax_row`).  The NumPy stage's vectorised double-word
    rows decide most of the compiled stage's rare leftovers in milliseconds, where the exact
    solver takes seconds on a long row with a large support (alpha 1.33, 8192 scores of
    standard deviation 0.01 or 0.1: 8-20 s a row).  Every route gives the correctly rounded
    row: the same bits.  Returns (p, tau, theta, support)."""
    from .exact_rows import entmax_row, finish

    rows, n = x.shape
    p, tau, th, support = np.zeros((rows, n), dtype), np.empty(rows), theta.copy(), np.empty(rows, np.int64)
    staged = (alpha <= 2.0) & np.isfinite(theta)
    if staged.any():
        sel = np.flatnonzero(staged)
        xs = x[sel]
        A0 = theta[sel] - xs.max(axis=1)
        p[sel], tau[sel], th[sel], support[sel] = finish(xs, alpha[sel], A0, np.zeros(xs.shape), dtype)
    for r in np.flatnonzero(~staged):
        hint = float(theta[r]) if np.isfinite(theta[r]) else None
        p[r], tau[r], th[r], support[r] = entmax_row(x[r], alpha[r], dtype, hint)
    return p, tau, th, support


def _rows32(x: np.ndarray, alpha: np.ndarray, method: int) -> RowSolve:
    """Correctly rounded float32 rows, with the real-number support and tau, as the NumPy
    engine's (so the same bits).  ``method=None``: the float32 kernels, each row then
    through the rounding test (:func:`.numba.rows.entmax_rows`: the solver's float64 answer
    is kept where it decides every float32 rounding), the undecided rows finished by the
    compiled finishing stage on the float32 grid (:func:`_finish32`); softmax rows alone keep
    their own kernel's rounding (:mod:`.numba.softmax`; the rare row it leaves undecided is
    solved exactly, :func:`_exact_softmax32`).  Rows with an alpha > 2 (where a score
    difference far below float32's resolution can decide the support) are solved in that
    batch at alpha 2 (so no other row's index, or pivot seed, moves) and replaced by their
    correctly rounded float64 rows, exactly widened, rounded by :func:`_narrow`; other
    methods take that route for the whole batch."""
    big = alpha > 2.0
    if method != _rows.METHOD_DEFAULT or big.all():
        return _narrow(x, _entmax_rows(x.astype(np.float64), alpha, method), alpha)
    if bool((alpha == 1.0).all()):
        res = _row_forward(_rows.entmax_rows, x, alpha, method)
        _exact_softmax32(x, np.flatnonzero(~res.converged & (res.n_iter == 0)), res)
        return res
    bufs = _solve_buffers(x)
    tau, ok = np.empty(x.shape[0]), np.empty(x.shape[0], np.bool_)
    _rows.entmax_rows(x, np.where(big, 2.0, alpha), method, _rows.Solved(*bufs), 8 * numba.get_num_threads(),
                      (tau, ok))
    res = ExactRowSolve(*bufs, tau)
    _exact_softmax32(x, np.flatnonzero(~ok & (alpha == 1.0)), res, tau)
    bad = np.flatnonzero(~ok & ~big & (alpha != 1.0))
    if bad.size:
        res.p[bad], tau[bad], res.theta[bad], res.support[bad] = _finish32(x[bad], alpha[bad], res.theta[bad])
    if big.any():
        wide = _narrow(x[big], _entmax_rows(x[big].astype(np.float64), alpha[big], method), alpha[big])
        for f, w in zip((*res, tau), (*wide, wide.tau)):
            f[big] = w
    return res


def _finish32(x: np.ndarray, alpha: np.ndarray, theta: np.ndarray):
    """float32 rows ``x`` at 1 < alpha <= 2 that the rounding test left undecided, from
    their solver's ``theta``: the compiled finishing stage on the rows exactly widened,
    rounding to float32 (:func:`.numba.exact_finish.finish_rows` with ``f32``), and the rows
    it leaves by :func:`_finish_left`.  Returns (p float32, tau, theta, support)."""
    x64 = x.astype(np.float64)
    out = np.zeros(x64.shape)
    tau, support, ok = np.empty(len(x)), np.empty(len(x), np.int64), np.empty(len(x), np.bool_)
    _exact.finish_rows(x64, alpha, out, theta, tau, support, ok, 8 * numba.get_num_threads(), True)
    p = out.astype(np.float32)
    left = np.flatnonzero(~ok)
    if left.size:
        p[left], tau[left], theta[left], support[left] = _finish_left(x64[left], alpha[left], theta[left], np.float32)
    return p, tau, theta, support


def _narrow(x: np.ndarray, wide: ExactRowSolve, alpha: np.ndarray) -> ExactRowSolve:
    """The float32 rows of the correctly rounded float64 rows ``wide`` of float32 ``x``:
    each value (p, tau) rounded to float32 is the exact value rounded once, except where the
    float64 value is itself a float32 rounding midpoint (the exact value may lie on either
    side of it): those rows are finished on the float32 grid (:func:`.exact_rows.finish`).
    The support is the float64 rows' (the real-number support does not depend on the
    output's dtype)."""
    from .exact_rows import finish, float32_midpoints

    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, its nearest
        p = wide.p.astype(np.float32)
        tau = wide.tau.astype(np.float32).astype(np.float64)
    theta, support = wide.theta.copy(), wide.support.copy()
    mid = np.flatnonzero(float32_midpoints(wide.p).any(axis=1) | float32_midpoints(wide.tau))
    if mid.size:
        x64 = x[mid].astype(np.float64)
        A0 = wide.theta[mid] - x64.max(axis=1)
        p[mid], tau[mid], theta[mid], support[mid] = finish(x64, alpha[mid], A0, wide.p[mid], np.float32)
    return ExactRowSolve(p, theta, support, wide.n_iter, wide.converged, tau)


def _row_vjp(kernel, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """A row VJP kernel ``kernel(p, g, alpha, dx)`` on a checked (p, g) pair (:func:`_pair`)."""
    p, g = _pair(p, g)
    dx = np.empty(p.shape, p.dtype)
    alpha = _as_alpha(alpha, p.shape[0])
    if p.shape[0]:
        kernel(p, g, alpha, dx)
    return dx


class NumbaBackend:
    """Compiled CPU kernels (Numba), parallel over blocks of rows; same answers as ``numpy``."""

    name = "numba"

    def owns(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def entmax_forward(self, x: np.ndarray, alpha: np.ndarray, method: str | None) -> RowSolve:
        require(self.name, "entmax_forward", method)
        res = _entmax_rows(x, alpha, _METHODS[method])
        return res

    def entmax_forward_scanned(self, x: np.ndarray, alpha: np.ndarray, method: str | None) -> RowSolve:
        """:meth:`entmax_forward` that also checks ``x`` for NaN and +inf: every row solver
        counts them in its maximum pass and marks such a row ``n_iter = -1``, so the public
        layer skips its separate scan of the whole input.  Raises
        :class:`~entmax_ref.backends._base.NonFiniteInput` when a row holds one; the public
        layer then scans x itself to raise its usual error."""
        require(self.name, "entmax_forward", method)
        res = _entmax_rows(x, alpha, _METHODS[method])
        if (res.n_iter < 0).any():
            raise NonFiniteInput("x has a NaN or +inf entry")
        return res

    def entmax_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        dx = _row_vjp(_grads.entmax_vjp_rows, p, g, alpha)
        return dx

    def entmax_alpha_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        p, g = _pair(p, g)
        alpha = _as_alpha(alpha, p.shape[0])
        out = np.empty(p.shape[0], np.float64)
        if p.shape[0]:
            _grads.entmax_alpha_vjp_rows(p, g, alpha, out)
        return out

    def normmax_forward(self, x: np.ndarray, alpha: np.ndarray) -> RowSolve:
        """The NumPy engine's correctly rounded rows (one algorithm for both engines:
        :func:`entmax_ref.backends.exact_normmax.normmax_rows`)."""
        x = _as_rows(x)
        return normmax_rows(x, _as_alpha(alpha, x.shape[0]))

    def normmax_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """The NumPy engine's deterministic VJP (:func:`entmax_ref.backends.exact_normmax.normmax_vjp_rows`)."""
        p, g = _pair(p, g)
        return normmax_vjp_rows(p, g, _as_alpha(alpha, p.shape[0]))

    def budget_forward(self, x: np.ndarray, budget: np.ndarray) -> RowSolve:
        """Sorted row, one merged walk over the breakpoints, closed form on the crossing
        piece (:mod:`entmax_ref.backends.numba.budget`)."""
        from .numba import budget as _bs

        x = _as_rows(x)
        rows, n = x.shape
        budget = np.array(budget, dtype=np.float64, order="C")
        if budget.shape != (rows,):
            raise ValueError(f"budget must have shape ({rows},), got {budget.shape}")
        out = np.empty((rows, n), x.dtype)
        tau = np.empty(rows, np.float64)
        support = np.empty(rows, np.int64)
        if rows:
            _bs.budget_rows(x, budget, out, tau, support, 8 * numba.get_num_threads())  # correctly rounded
        return RowSolve(out, tau, support, np.zeros(rows, np.int64), np.ones(rows, np.bool_))

    def budget_vjp(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        from .numba import budget as _bs

        p, g = _pair(p, g)
        dx = np.empty(p.shape, p.dtype)
        if p.shape[0]:
            _bs.budget_vjp_rows(p, g, dx)
        return dx

    def attention_scans_inputs(self, q, k, v, spec: AttentionSpec) -> bool:
        """Whether :meth:`attention_forward` reads every entry of k and v (the decoding path
        of :mod:`entmax_ref.backends.numba.decode`) and raises
        :class:`~entmax_ref.backends._base.NonFiniteInput` on a NaN or infinite one; False
        when ``spec.check_finite`` is off (the public layer then does not ask)."""
        from .numba.decode import scans_inputs

        return q.dtype != np.float64 and scans_inputs(q, k, v, spec)

    def add_products(self, st: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """:func:`entmax_ref.backends.exact_sums.add_products` compiled
        (:func:`.numba.exact_sums.add_products`, rows on worker threads), into the same
        sum states (:meth:`round_products` rounds them)."""
        from .numba._threads import run_blocks
        from .numba.exact_sums import add_products

        a, b = (np.require(x, np.float64, ("C", "W")) for x in (a, b))  # the declared signature's arrays
        run_blocks(add_products, (a, b, st), (a.shape[0], a.shape[1] * b.shape[1]), 8 * numba.get_num_threads())

    def round_products(self, st: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`entmax_ref.backends.exact_sums.round_products` compiled
        (:func:`.numba.exact_sums.round_products`): each proven sum its correctly rounded
        value, as the NumPy engine's."""
        from .exact_sums import STATE_FIELDS
        from .numba.exact_sums import round_products

        k = st.shape[-1]
        flat = np.ascontiguousarray(st).reshape(-1, STATE_FIELDS, k)
        v, ok = np.empty((flat.shape[0], k)), np.empty((flat.shape[0], k), np.bool_)
        round_products(flat, n, v, ok)
        return v.reshape(st.shape[:-2] + (k,)), ok.reshape(st.shape[:-2] + (k,))

    def attention_forward(self, q, k, v, spec: AttentionSpec) -> AttentionForward:
        """The fused chunked forward of :mod:`entmax_ref.backends.numba.attention` (BLAS
        score products, then one row kernel: masks, bias, row solve, support-only output),
        or for decoding (a few queries over a long key cache) the key-split forward of
        :mod:`entmax_ref.backends.numba.decode`.  Key masks are routed here, once: a mask
        that is one run of keys per batch runs per batch on its key-sliced problem (either
        of the two), a mask with holes on the NumPy reference's driver with the compiled
        row solver (:mod:`entmax_ref.backends.attention_driver`).  float64 attention runs
        on the NumPy reference's driver with this engine's correctly rounded row solver and
        sums (:meth:`add_products`): the same bits as the NumPy engine's."""
        if q.dtype == np.float64:
            from .numpy_attention import attention_forward as numpy_forward

            return numpy_forward(self, q, k, v, spec)
        if spec.key_mask is not None:
            from .attention_driver import forward_by_key_runs
            from .numpy_attention import attention_forward as numpy_forward

            return forward_by_key_runs(self._unmasked_forward, q, k, v, spec,
                                       lambda: numpy_forward(self, q, k, v, spec))
        return self._unmasked_forward(q, k, v, spec)

    def _unmasked_forward(self, q, k, v, spec: AttentionSpec) -> AttentionForward:
        from .numba import decode
        from .numba.attention import attention_forward

        if decode.eligible(q, k, v, spec):
            return decode.decode_forward(q, k, v, spec)
        return attention_forward(self, q, k, v, spec)

    def attention_backward(self, do, q, k, v, res, skew, spec: AttentionSpec) -> AttentionGrads:
        """The support-only chunked backward of :mod:`entmax_ref.backends.numba.attention_backward`
        (the NumPy reference's driver at alpha = 1, where the support is dense); key masks
        are routed as in :meth:`attention_forward`, float64 to the NumPy reference's driver."""
        from .numba.attention_backward import attention_backward

        if q.dtype == np.float64:
            from .numpy_attention import attention_backward as numpy_backward

            return numpy_backward(self, do, q, k, v, res, skew, spec)
        if spec.key_mask is not None:
            from .attention_driver import backward_by_key_runs
            from .numpy_attention import attention_backward as numpy_backward

            return backward_by_key_runs(lambda *a: attention_backward(self, *a), do, q, k, v, res, skew, spec,
                                        lambda: numpy_backward(self, do, q, k, v, res, skew, spec))
        return attention_backward(self, do, q, k, v, res, skew, spec)
