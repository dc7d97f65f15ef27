"""Row solvers of the numba backend: alpha-entmax of every row of a (rows, n) array.

Units are those of :mod:`entmax_ref.backends._base`: with ``y = x - max(x)`` and
``a1 = alpha - 1`` each row solves for ``A >= 0`` in

    f(A) = sum_i e_alpha(y_i - A) - 1 = 0,   e_alpha(d) = [1 + a1 d]_+ ** (1 / a1)  (exp(d) at a1 = 0),

and returns ``theta = max(x) + A``.  Everything is computed in float64 whatever the
input dtype; only the probabilities are rounded to the input dtype when stored.  Sums of
probabilities use Neumaier's compensated summation.  float32 rows (but softmax's) are then
tested, each right after its solver, for whether that float64 answer decides every
float32 rounding, and rewritten correctly rounded where it does
(:mod:`.round32`; :func:`entmax_rows`).

Per row (the solvers below; each run of rows on one solver path goes through that path's
driver, :func:`entmax_rows`):

1. One pass finds ``m = max(x)`` and gathers a superset of the entries within the
   support window ``1/a1`` of it (an all ``-inf`` row, or ``n = 0``, gives p = 0,
   theta = -inf); the candidates are then the ``y_i`` for which the output pass's own
   test ``a1 * y > -1`` holds at ``A = 0`` (rounding is monotone, so a dropped entry is
   zero for every ``A >= 0``, and ``A >= 0`` because the maximum alone has mass 1 there).
   Sparsemax, 1.5-entmax and 1 < alpha < 2 find the maximum in a vectorised pass first
   and then apply the same tests in a branch-free gather with the candidates' columns
   (:func:`.candidates.gather_alive`; on long rows the test is one comparison with the
   row's edge value in the input's precision): the same candidates, fewer mispredicted
   branches, and an output pass that visits the candidates alone.  Softmax
   gathers nothing (every finite entry is in its support): a vectorised maximum, then
   log-sum-exp over the row (:mod:`.softmax`); a float64 batch stops at the maximum
   (:func:`_rows_softmax64`: the finishing stage computes those rows).
2. The threshold, by alpha (``method=None``):

   * alpha = 1: ``A = log1p(sum_{i != argmax} exp(y_i))`` (the max term separated out,
     as scipy's logsumexp does); ``p_i = exp(y_i) / (1 + s)``.  float32 rows are
     correctly rounded by a shorter computation with a rounding test against the exact
     value (:mod:`.softmax`).
   * alpha = 2: Condat's (2016) algorithm finds the support S in expected O(k); the
     closed form ``A = (sum_S y + |S| - 1) / |S|`` with a compensated sum.
   * alpha = 1.5: a randomised pivot (quickselect-like, expected O(k)) on
     ``f(t) = sum_{y > t} (y - t)^2 / 4 - 1``, keeping count, mean and centred sum of
     squares of the entries known to be in the support (Chan's merge, no cancellation),
     then the left root of the quadratic on that support.  On long rows the pivot runs
     first on the entries within 1 of the maximum: its root is a lower bound (a subset
     has less mass), often the answer itself, else the candidates alive at it are
     pivoted.  Both closed forms are polished by Newton on their support until a step no
     longer changes ``A``.
   * 1 < alpha < 2, other: a lower bound that prunes the candidates to a thin shell
     (1 < alpha < 1.5: rough Newton steps on alpha's own mass over the entries within
     1.25 of the maximum, while that mass is certainly above 1; 1.5 < alpha < 2: the
     exact sparsemax threshold, ``e_alpha(d)`` being nonincreasing in alpha); then
     safeguarded Newton from that bound on
     ``phi(A) = ((f + 1)^a1 - 1) / a1``, the (1/a1)-norm of the ``[1 + a1 (y - A)]_+``:
     convex and nearly linear, so the steps from the left are monotone and few (5-7 on
     random rows).  A step that leaves the bracket, or a computed f that did not change
     (flat at this resolution), falls back to bisection; candidates that are zero at the
     lower bound are dropped as it grows.  It stops when a step no longer changes ``A``,
     ``f(A) == 0``, or the bracket cannot be split (then the end with the smaller |f|).
   * alpha > 2: ``dp/dA = p^(2 - alpha)`` is unbounded at the support's edge, so, as in
     the reference, the answer is written relative to the smallest support entry cv:
     ``p_i = (a1 (y_i - cv) + q^a1)^(1/a1)`` with ``q = (a1 delta)^(1/a1)`` the edge
     probability, ``delta = cv - T``, evaluated in log space (``q^a1`` is below the
     float64 range once q < ~1e-308^(1/a1): 8e-4 at alpha = 100).  A randomised pivot on
     the entries themselves (f evaluated exactly at entry values, expected O(k + s log k)
     powers) finds cv, then Newton on q (the mass is increasing and convex in q, so Newton
     from the right is monotone), and the float nearest it whose mass is closest to 1 is
     kept.
   * ``method="newton"``: the safeguarded Newton iteration for alpha <= 2 (from A = 0,
     no closed form or bound); alpha > 2 as above.
   * ``method="bisect"``: the reference's bisection on the same bracket
     ``[0, (1 - nf^(-a1)) / a1]`` (``[0, log nf]`` at alpha = 1, nf = finite entries),
     two-stage (T, then the edge probability q) for alpha > 2, until the midpoint equals an endpoint;
     then the endpoint with the smaller |f|.
3. Output pass: ``p_i = e_alpha(y_i - A)`` with the reference's formula
   ``exp(log1p(a1 d) / a1)`` (``1 + d`` at alpha = 2 and ``(1 + d/2)^2`` at 1.5, the same
   function with fewer roundings); support = ``#{p_i > 0}`` counted in float64 before the
   rounding to the output dtype.  1 < alpha < 2 with ``method=None`` runs its Newton and
   output pass on the compacted candidates with their columns, with the vectorisable
   ``vlog1p`` and ``vexp`` in place of libm's (:mod:`.gen`; each within 0.8 ulp).

Every solver counts the row's NaN and +inf entries in its maximum pass (the public layer's
``check_finite``, with no pass of its own) and leaves a row holding one with p = NaN,
theta = NaN and ``n_iter = -1`` (:func:`.elementwise.settled_row`): the scanned calls raise on
that mark, and with the check off it is the (unspecified) answer.

``n_iter`` counts f evaluations of the iterative solvers (pivot steps included for
alpha > 2, bisection halvings for ``"bisect"``) and is 0 for the closed forms.

The pieces live in modules by concern: :mod:`.elementwise` (the map e_alpha, its kinds, the
method codes, the output pass), :mod:`.candidates` (maximum and candidate passes),
:mod:`.softmax` (alpha = 1), :mod:`.threshold` (Newton, bisection, Condat, the 1.5 pivot),
:mod:`.big_alpha` (alpha > 2); this module holds the per-path row solvers and the drivers.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from ._jit import b1, f64, i64, jit, kernel, record
from .paths import SOLVER_PATHS, by_runs, row_runs
from ._threads import run_blocks
from .big_alpha import solve_big, solve_big_bisect
from .candidates import MASK_MIN, count_finite, gather_alive, max_zeroing, window_candidates
from .elementwise import (K_15, K_EXP, K_GEN, K_SPARSE, METHOD_BISECT,
                          METHOD_DEFAULT, METHOD_NEWTON, bound_above, bound_below, write_output,
                          write_output_at, settled_row, uniform_bound)
from .gen import finish_gen, subset_bound_gen
from .softmax import softmax32_rows, softmax64_rows, solve_softmax
from .threshold import bisect_row, condat, newton_row, pivot15
from .round32 import round32


@jit
def _finish(row, m, k, a1, kind, start, sup, idx):
    """Newton from ``A0`` in ``[0, hi]`` (``start = (A0, closed)``; on the identified support
    ``sup`` when ``closed``: a closed form is only polished), then the output pass of
    ``row = (x, out)``, over the candidates' columns ``idx[:k]`` alone unless ``idx`` is
    empty.  ``k`` is the number of candidates (for the bound), ``closed`` a run-time bool
    (a literal would compile a second copy)."""
    x, out = row
    A0, closed = start
    ns = sup.shape[0]
    lo = 0.0  # the maximum alone has mass 1 at A = 0
    hi = bound_above(k, a1)
    if not (A0 >= lo):
        A0 = lo
    if A0 > hi:
        A0 = hi
    if hi > lo:
        # a closed form is polished by Newton on its identified support (an entry that
        # rounding puts on the other side of the edge carries a probability at the
        # rounding level either way); the candidates c[:k] are sup[:ns] otherwise
        A, it, ok = newton_row(sup, ns, a1, kind, A0, lo, hi)
        if closed:
            it = 0
    else:  # a single candidate: the row maximum carries all the mass
        A, it, ok = lo, 0, True
    if idx.shape[0] > 0:
        cnt = write_output_at(x, out, m, A, a1, kind, idx, k)
    else:
        cnt = write_output(x, out, m, A, a1, kind)
    return m + A, cnt, it, ok


@jit
def _max_settled(x, out, aux, aux2):
    """The row maximum with the output zeroed (:func:`.candidates.max_zeroing`, its lanes in
    ``aux``, ``aux2``) and the row's answer when that settles it (NaN/+inf, an empty or
    all ``-inf`` row: :func:`.elementwise.settled_row`): (m, settled, answer)."""
    m, bad = max_zeroing(x, out, aux, aux2)
    settled, res = settled_row(out, m, bad)
    return m, settled, res


# One solver per path, so that a call compiles only the paths it takes (the drivers below
# are chosen in Python from alpha and the method, per run of rows); ``_rows_any`` picks
# among the bisection and Newton solvers per row at run time.


@jit
def _solve_bisect(x, out, a1, c):
    """``method="bisect"``, alpha <= 2."""
    kind = K_EXP if a1 == 0.0 else K_GEN
    m, k, bad = window_candidates(x, a1, kind, c)
    settled, res = settled_row(out, m, bad)
    if settled:
        return res
    nf = count_finite(x)
    A, it, ok = bisect_row(c, k, a1, kind, 0.0, uniform_bound(nf, a1))
    cnt = write_output(x, out, m, A, a1, kind)
    return m + A, cnt, it, ok


@jit
def kind_of(a1):
    if a1 == 0.0:
        return K_EXP
    elif a1 == 1.0:
        return K_SPARSE
    elif a1 == 0.5:
        return K_15
    return K_GEN


@jit
def _solve_newton(x, out, a1, c):
    """``method="newton"``, alpha <= 2: safeguarded Newton from A = 0."""
    kind = kind_of(a1)
    m, k, bad = window_candidates(x, a1, kind, c)
    settled, res = settled_row(out, m, bad)
    if settled:
        return res
    closed = np.bool_(False)
    return _finish((x, out), m, k, a1, kind, (0.0, closed), c[:k], c.view(np.int64)[:0])


@jit(_nrt=True)  # allocates: also when called from code compiled without NRT
def solve_sparse(x, out, c, aux, aux2):
    """alpha = 2, ``method=None``: Condat's algorithm (which consumes the candidates),
    polished by Newton; the output pass visits the candidates' columns.  Returns the
    answer and the candidates' columns (:func:`solve_on_path`)."""
    idx = aux2.view(np.int64)
    m, settled, res = _max_settled(x, out, aux, aux2)
    if settled:
        return res, (idx[:0], m, 0.0, 1.0)
    k = gather_alive(x, m, 1.0, K_SPARSE, 0.0, c, idx)
    A0, ns = condat(c, k, aux, c)
    closed = np.bool_(True)
    return _finish((x, out), m, k, 1.0, K_SPARSE, (A0, closed), aux[:ns], idx), (idx[:k], m, 0.0, 1.0)


@jit(_nrt=True)  # allocates: also when called from code compiled without NRT
def solve_15(x, out, c, aux, seed):
    """alpha = 1.5, ``method=None``: randomised pivot, polished by Newton.  The maximum first
    (vectorised), then the entries alive at a lower bound ``lo`` of A in one masked pass
    with their columns (the output pass visits those alone): the candidates that gathering
    the window and filtering it at ``lo`` give.  On long rows ``lo`` is
    :func:`_subset_bound15`'s, which on a normal row of 8192 leaves some 35 candidates
    instead of the 340 alive at A = 0, and is often the answer itself; short rows (the
    attention's candidates) take ``lo = 0``.  Returns the answer and the candidates'
    columns (:func:`solve_on_path`)."""
    idx = aux.view(np.int64)
    m, settled, res = _max_settled(x, out, c, aux)
    if settled:
        return res, (idx[:0], m, 0.0, 0.5)
    lo = 0.0
    if x.shape[0] >= MASK_MIN:
        A0, s0, k, exact = _subset_bound15(x, m, c, idx, seed)
        if exact:  # the candidates of sparsemax's window (y > -1)
            return _finish((x, out), m, k, 0.5, K_15, (A0, np.bool_(True)), c[s0:k], idx), (idx[:k], m, 0.0, 1.0)
        lo = bound_below(A0)
    k = gather_alive(x, m, 0.5, K_15, lo, c, idx)
    A0, s0 = pivot15(c, k, seed)
    closed = A0 >= 0.0
    if not closed:
        s0 = 0
    return _finish((x, out), m, k, 0.5, K_15, (A0, closed), c[s0:k], idx), (idx[:k], m, lo, 0.5)


@jit
def _subset_bound15(x, m, c, idx, seed):
    """The exact 1.5-entmax threshold ``A_S`` of the entries within 1 of the maximum (the
    sparsemax window ``y > -1``: some 28 of a normal row of 8192), gathered into ``c`` (and
    their columns into ``idx``) and pivoted there (:func:`.threshold.pivot15`).  A
    subset's mass is at most the row's at every A, so its root is at most the row's: a
    lower bound of the 1.5-entmax threshold, on normal rows within 2% of it.  When ``A_S``
    is certainly at least 1, every entry outside the window (``y <= -1``) is zero there,
    so ``A_S`` is the row's 1.5-entmax threshold and ``c[s0:k]`` its support.  Returns
    (A_S, s0, k, exact); ``A_S`` is -1.0 when rounding left no usable support
    (:func:`.threshold.pivot15`)."""
    k = gather_alive(x, m, 1.0, K_SPARSE, 0.0, c, idx)
    A, s0 = pivot15(c, k, seed)
    return A, s0, k, bound_below(A) >= 1.0


@jit(_nrt=True)  # allocates: also when called from code compiled without NRT
def solve_gen(x, out, a1, c, aux, aux2, seed):
    """1 < alpha < 2 (not 1.5), ``method=None``: lower bound, then Newton.  The row is read
    three times with its maximum known (a vectorised maximum, the bound's candidates, the
    candidates above the bound with their columns) instead of gathering the whole window
    ``y > -1/a1`` (a third of a normal row at alpha = 1.33); the sets are those of the
    gather-then-filter steps.  Newton and the output pass then run on the compacted
    candidates with a vectorised map (:mod:`.gen`).  Returns the answer and the columns of
    the candidates that Newton kept (:func:`solve_on_path`)."""
    idx = aux2.view(np.int64)
    m, settled, res = _max_settled(x, out, aux, aux2)
    if settled:
        return res, (idx[:0], m, 0.0, a1)
    # a lower bound that prunes the candidates to a thin shell, from a few dozen entries
    # of a normal row: rough Newton steps on alpha's own mass over the entries within
    # 1.25 of the maximum (alpha < 1.5; its evaluations count in n_iter), or the exact
    # sparsemax threshold (1.5 < alpha < 2: e_alpha(d) is nonincreasing in alpha)
    it_b = 0
    if a1 < 0.5:
        Ab, it_b = subset_bound_gen(x, m, a1, aux, idx)
    else:
        kb = gather_alive(x, m, 1.0, K_SPARSE, 0.0, aux, idx[:0])
        Ab = condat(aux, kb, aux2, aux)[0]  # aux is consumed in place (Condat's trick)
    lo = bound_below(Ab)
    # the candidates above the bound with their columns; Newton and the output pass work on
    # them alone (:mod:`.gen`: vectorised log1p and exp on a contiguous array)
    k = gather_alive(x, m, a1, K_GEN, lo, c, idx)
    (theta, cnt, it, ok), (k, last_lo) = finish_gen(x, out, m, a1, lo, (c, idx), k, aux)
    return (theta, cnt, it + it_b, ok), (idx[:k], m, last_lo, a1)


#: The solver paths of the attention kernels, in the order of
#: :data:`.paths.SOLVER_PATHS` (whose :func:`.paths.solver_path` gives the path of a head's alpha): one row solver each
#: (:func:`solve_on_path`).
PATH_SOFTMAX, PATH_SPARSE, PATH_15, PATH_GEN, PATH_BIG = range(len(SOLVER_PATHS))
N_PATHS = len(SOLVER_PATHS)


@jit(inline="always")
def solve_on_path(x, out, a1, c, aux, aux2, seed, path):
    """The row solver of solver path ``path`` (``PATH_*``), as ``method=None`` takes it:
    returns ((theta, support, n_iter, converged), gathered); writes ``out``.  ``gathered =
    (cols, m, lo, a1g)``: the columns, in row order, of the candidates that the solver's
    last gather kept (:func:`.candidates.gather_alive` at ``lo`` with the row maximum
    ``m`` and the kind of ``a1g``, :func:`kind_of`), which the float32 rounding test
    reuses (:func:`.round32.round32`); softmax and alpha > 2 keep none (``lo`` infinite).  ``path`` is a constant
    of the calling kernel's code: numba inlines this function into the kernel and prunes
    the chain to the one branch, so the kernel links that solver alone, at one level of
    calls (numba optimises and emits a callee's code again in every compiled function
    that links it).  The caller guarantees that every row's ``a1`` is of that path
    (:func:`.paths.solver_path`)."""
    none = (aux2.view(np.int64)[:0], 0.0, np.inf, a1)
    if path == PATH_SOFTMAX:
        return solve_softmax(x, out, c), none
    if path == PATH_SPARSE:
        return solve_sparse(x, out, c, aux, aux2)
    if path == PATH_15:
        return solve_15(x, out, c, aux, seed)
    if path == PATH_GEN:
        return solve_gen(x, out, a1, c, aux, aux2, seed)
    return solve_big(x, out, a1, c, seed), none


@jit(inline="always")
def solver_scratch(n):
    """The row solvers' scratch for rows of up to ``n`` entries: the candidates
    ``c`` and the closed forms' and lower bounds' ``aux``, ``aux2``."""
    return np.empty(n, np.float64), np.empty(n, np.float64), np.empty(n, np.float64)


#: What a row driver writes per row (one record, which numba passes as a tuple): ``p`` (the
#: input's dtype), ``theta`` (float64), ``support``, ``n_iter`` (int64), ``converged`` (bool).
Solved = namedtuple("Solved", "p theta support n_iter converged")


def solved_type(x):
    """The numba type of a :data:`Solved` of rows of dtype ``x``."""
    return record(Solved, x[:, ::1], f64[::1], i64[::1], i64[::1], b1[::1])


#: the drivers' signature for input dtype ``x``: (x, alpha, method, res, r0, r1), ``res`` a
#: :data:`Solved`
def _ROWS(x):
    return x[:, ::1], f64[::1], i64, solved_type(x), i64, i64


# Every driver solves rows r0 .. r1 - 1 of ``x`` with the GIL released (``nogil``); the
# threads of :func:`entmax_rows` each run one on its own blocks of rows.  A row's answer
# depends only on the row (its random pivots are seeded with the row index), never on
# the block or the thread.


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float32",))
def _rows_softmax(x, alpha, method, res, r0, r1):
    out, theta, support, n_iter, converged = res
    softmax32_rows(x, out, theta, support, n_iter, converged, r0, r1)


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float64",))
def _rows_softmax64(x, alpha, method, res, r0, r1):
    """Settles the rows that need no solve and marks the others (their maximum as
    ``theta``) for the finishing stage, which writes their ``p``, ``tau`` and support
    (:func:`.softmax.softmax64_rows`)."""
    out, theta, support, n_iter, converged = res
    softmax64_rows(x, out, theta, support, n_iter, converged, r0, r1)


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float64",))
def _rows_sparse(x, alpha, method, res, r0, r1):
    out, theta, support, n_iter, converged = res
    c, aux, aux2 = solver_scratch(x.shape[1])
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = solve_sparse(x[r], out[r], c, aux, aux2)[0]


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float64",))
def _rows_15(x, alpha, method, res, r0, r1):
    out, theta, support, n_iter, converged = res
    c = np.empty(x.shape[1], np.float64)
    aux = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = solve_15(x[r], out[r], c, aux, r)[0]


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float64",))
def _rows_gen(x, alpha, method, res, r0, r1):
    out, theta, support, n_iter, converged = res
    c, aux, aux2 = solver_scratch(x.shape[1])
    for r in range(r0, r1):
        th, sup, it, ok = solve_gen(x[r], out[r], alpha[r] - 1.0, c, aux, aux2, r)[0]
        theta[r], support[r], n_iter[r], converged[r] = th, sup, it, ok


@kernel(_ROWS, ops=("entmax_forward",), dtypes=("float64",))
def _rows_big(x, alpha, method, res, r0, r1):
    """alpha > 2.  Compiled for float64 rows only, as :func:`_rows_any`: float32 rows at
    alpha > 2 are solved widened
    (:func:`entmax_ref.backends.numba_backend._rows32`)."""
    out, theta, support, n_iter, converged = res
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        th, sup, it, ok = solve_big(x[r], out[r], alpha[r] - 1.0, c, r)
        theta[r], support[r], n_iter[r], converged[r] = th, sup, it, ok


@kernel(_ROWS, ops=("entmax_forward",), methods=("bisect", "newton"), dtypes=("float64",))
def _rows_any(x, alpha, method, res, r0, r1):
    out, theta, support, n_iter, converged = res
    """``method="bisect"`` (any alphas) and ``method="newton"`` (alphas on both sides of
    2), the solver picked per row.  Compiled for float64 rows only: float32 rows reach it
    widened (exactly; its solvers read every entry as float64) and their p rounded back
    once (:func:`entmax_ref.backends.numba_backend._rows32`), the bits of a float32 kernel
    without its compile."""
    c = np.empty(x.shape[1], np.float64)
    for r in range(r0, r1):
        a1 = alpha[r] - 1.0
        # one call level: the solvers are linked into this kernel alone (numba optimises a
        # callee's code again in every compiled function that links it)
        if method == METHOD_BISECT:
            if a1 > 1.0:
                res = solve_big_bisect(x[r], out[r], a1, c)
            else:
                res = _solve_bisect(x[r], out[r], a1, c)
        elif a1 > 1.0:  # "newton" for alpha > 2 is the default solver
            res = solve_big(x[r], out[r], a1, c, r)
        else:
            res = _solve_newton(x[r], out[r], a1, c)
        theta[r], support[r], n_iter[r], converged[r] = res


#: the float32 drivers' signature: :func:`_ROWS`'s with the rows' ``tau`` and ``ok`` before
#: (r0, r1)
def _ROWS32(x):
    return x[:, ::1], f64[::1], i64, solved_type(x), f64[::1], b1[::1], i64, i64


def _rows32(path):
    """The float32 driver of solver path ``path`` (sparsemax, 1.5-entmax, 1 < alpha < 2)
    with ``method=None``: each row's solver (:func:`solve_on_path`), then at once, with the
    row in cache, its rounding test (:func:`.round32.round32`), which fills ``tau`` and
    ``ok`` (and rewrites ``theta`` and ``support`` where it decides the row)."""

    @kernel(_ROWS32, ops=("entmax_forward",), dtypes=("float32",), name=f"rows._rows32[{path}]")
    def rows32(x, alpha, method, res, tau, ok, r0, r1):
        out, theta, support, n_iter, converged = res
        c, aux, aux2 = solver_scratch(x.shape[1])
        for r in range(r0, r1):
            a1 = alpha[r] - 1.0
            (th, sup, it, cv), gathered = solve_on_path(x[r], out[r], a1, c, aux, aux2, r, path)
            n_iter[r], converged[r] = it, cv
            tau[r], theta[r], support[r], ok[r] = round32(x[r], out[r], a1, (th, gathered), (c, aux, aux2), path,
                                                          PATH_SPARSE)
            if not ok[r]:
                theta[r], support[r] = th, sup

    return rows32


def _unrounded(driver):
    """``driver`` (float32 softmax's, which has no rounding test here) with the float32
    drivers' arguments: ``tau`` and ``ok`` are left to :func:`entmax_rows`."""

    def run(x, alpha, method, res, tau, ok, r0, r1):
        driver(x, alpha, method, res, r0, r1)
        ok[r0:r1] = False

    return run


#: the driver of rows that all take one solver path with ``method=None`` (float32 softmax;
#: float64 softmax is :func:`_rows_softmax64`)
_PATH_DRIVERS = {PATH_SOFTMAX: _rows_softmax, PATH_SPARSE: _rows_sparse, PATH_15: _rows_15, PATH_GEN: _rows_gen,
                 PATH_BIG: _rows_big}
#: the float32 drivers with the rounding test, by the driver they stand in for (:func:`entmax_rows`)
_ROUNDED32 = {_rows_sparse: _rows32(PATH_SPARSE), _rows_15: _rows32(PATH_15), _rows_gen: _rows32(PATH_GEN)}


def _runs(alpha, method, dtype):
    """The rows as runs ``(lo, hi, driver)``, each through the driver that compiles least for
    it: with ``method=None`` the driver of each run of rows on one solver path
    (:func:`~.paths.row_runs`), so that rows of several alphas get the
    bits that a call with each row's alpha alone gives; ``_rows_any`` for the other
    methods (``_rows_big`` when every alpha > 2 and the method is not bisection)."""
    if method != METHOD_DEFAULT:
        big = method != METHOD_BISECT and bool((alpha > 2.0).all())
        return [(0, alpha.shape[0], _rows_big if big else _rows_any)]
    return [(lo, hi, _rows_softmax64 if p == PATH_SOFTMAX and dtype == np.float64 else _PATH_DRIVERS[p])
            for lo, hi, p in row_runs(alpha)]


def entmax_rows(x, alpha, method, res, nblk, round32=None):
    """alpha-entmax of every row of ``x`` (rows, n) into ``res`` (a :data:`Solved`: ``p`` of
    x's shape and dtype; per-row ``theta`` (float64), ``support``, ``n_iter`` (int64),
    ``converged`` (bool)).
    A row holding NaN or +inf gets p = NaN and ``n_iter = -1`` (the module docstring).
    Rows are processed in ``nblk`` blocks (one scratch allocation per block) on
    ``numba.get_num_threads()`` Python threads (:func:`~._threads.run_blocks`).
    float64 softmax rows (``method=None``) are only settled or marked here: their ``p`` and
    ``support`` are the finishing stage's to write (:func:`_rows_softmax64`; the NumPy-level
    driver finishes every float64 row).

    float32 rows take ``method=None`` and alphas <= 2 alone (a ValueError otherwise: the
    NumPy-level driver, :func:`entmax_ref.backends.numba_backend._rows32`, solves the other
    float32 rows as float64 rows, exactly widened, allocating for those rows alone).
    Sparsemax, 1.5-entmax and 1 < alpha < 2 rows are tested right after their solver, while
    in cache (:data:`_ROUNDED32`), and rewritten correctly rounded where the solver's float64
    threshold decides them; ``round32``, ``(tau, ok)`` (rows,) float64 and bool arrays,
    receives each row's correctly rounded ``tau`` and whether it was decided (False: a row
    for the finishing stage, whose ``p`` is the float32 rounding of float64
    arithmetic).  Softmax rows keep their kernel's rounding, with ``tau`` its ``theta``
    rounded to float32, except a row the kernel left undecided (``converged`` False), whose
    ``ok`` is False."""
    runs = _runs(alpha, method, x.dtype)
    if not runs:
        return
    if x.dtype != np.float32:
        run_blocks(runs[0][2] if len(runs) == 1 else by_runs(runs), (x, alpha, method, res), x.shape, nblk)
        return
    if method != METHOD_DEFAULT or (alpha > 2.0).any():
        raise ValueError("float32 rows are solved here with method=None and alpha <= 2 only")
    tau, ok = round32 if round32 is not None else (np.empty(x.shape[0]), np.empty(x.shape[0], np.bool_))
    runs = [(lo, hi, _ROUNDED32.get(d) or _unrounded(d)) for lo, hi, d in runs]
    run_blocks(runs[0][2] if len(runs) == 1 else by_runs(runs), (x, alpha, method, res, tau, ok), x.shape, nblk)
    sm = alpha == 1.0
    if not sm.any():
        return
    with np.errstate(over="ignore"):  # +-inf beyond float32's range, its nearest
        tau[sm] = res.theta[sm].astype(np.float32)
    ok[sm] = True
    if round32 is not None:  # softmax rows its kernel's finishing stage left: finished by the caller
        und = sm & ~res.converged & (res.n_iter == 0)
        ok[und] = False
        res.converged[und] = True
