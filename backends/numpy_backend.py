"""The NumPy reference backend: every row solved at once, in float64.

The definition of what this engine computes is :func:`.numpy_threshold.solve_row`, the
literal per-row solver (sort for alpha in {1, 1.5, 2}, bisection to adjacent floats
otherwise): read that first.  This module is its accelerated, vectorised form, shown to give
the same probabilities, thresholds and supports within the float64 budgets of
:mod:`entmax_ref.testing.tolerance` (``tests/test_numpy_threshold.py``); the 50-digit twin
of both is :mod:`entmax_ref.testing.oracle`.

Every row is shifted by its maximum first (so the largest entry is 0 and the support lies
in a bounded window below it), solved in float64 whatever the input dtype, and only the
final probabilities are rounded to the input dtype.  Thresholds are x-space thresholds
``theta`` (see :mod:`entmax_ref.backends._base`): ``p_i = e_alpha(x_i - theta)``.

Solvers (``method``):

``None`` / ``"sort"``
    alpha = 1: ``theta = logsumexp(x)`` (scipy).  alpha = 2: the sort-based sparsemax
    threshold (Held et al. 1974).  alpha = 1.5: the sort-based threshold of Peters et
    al. (2019).  Both sort solutions are then polished by Newton steps on the exact
    support and the support is re-identified from the polished threshold until it is
    stable, so the result does not rest on the clamped-discriminant rule.
``None`` for any other alpha / ``"bisect"``
    Bisection on ``f(A) = sum_i e_alpha(y_i - A) - 1`` (``y = x - max x``) over the
    bracket ``[0, (1 - n^(1-alpha)) / (alpha - 1)]`` (``[0, log n]`` at alpha = 1) until
    the midpoint equals an endpoint, i.e. to the last bit of float64; the endpoint with
    the smaller ``|f|`` is returned.  No renormalisation.  ``None`` first narrows the
    bracket by safeguarded Newton steps (:func:`_newton_bracket`), which ends the
    bisection at the same pair of floats: the same bits as ``"bisect"`` in a fifth to
    a half of the evaluations (``n_iter`` counts both kinds).  Entries that cannot reach the
    support anywhere in the bracket (``e_alpha`` is exactly 0 there) are skipped when they
    are most of the row, which changes no bit of any sum (:func:`_on_candidates`).
"""

from __future__ import annotations

import numpy as np

from . import exact_rows as _exact
from . import exact_sums as _sums
from .exact_budget import budget_finish
from .exact_normmax import normmax_rows, normmax_vjp_rows
from . import numpy_family as _family
from ._base import AttentionForward, AttentionGrads, AttentionSpec, ExactRowSolve, RowSolve
from .capabilities import require
from .constants import CANDIDATE_MARGIN, EDGE_ULPS, MAX_ITER, POLISH_STEPS, SERIES_TERMS
from .numpy_elementwise import e_alpha, skew_weights
from .numpy_elementwise import edge_p as _edge_p

_F64 = np.float64
_FLOOR = 1e100  # see entmax_forward: entries further than this below the row maximum get p = 0

#: The default solver's Newton phase (:func:`_newton_bracket`): at most NEWTON_STEPS
#: evaluations per row; a bracket narrower than NEWTON_DONE ulps goes to the bisection; a
#: step under NEWTON_CLOSE ulps counts as converged and the next point goes NEWTON_PROBE
#: steps past it.
NEWTON_STEPS = 40
NEWTON_DONE = 64.0
NEWTON_CLOSE = 4.0
NEWTON_PROBE = 4.0


def vjp_float64(p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """:meth:`NumpyBackend.entmax_vjp` of float64 rows (see there): rows with alpha <= 2 by
    :func:`.exact_sums.vjp_rows`, the others by :func:`.exact_sums.vjp_big_rows`; the same
    bits as the numba engine's kernels."""
    a = alpha[:, None]
    big = alpha > 2.0
    dx = np.zeros(p.shape)
    if (~big).any():
        dx[~big] = _sums.vjp_rows(p[~big], g[~big], 2.0 - a[~big])
    if big.any():
        dx[big] = _sums.vjp_big_rows(p[big], g[big], 2.0 - a[big])
    return dx


def alpha_vjp_float64(p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """:meth:`NumpyBackend.entmax_alpha_vjp` of float64 rows: alpha <= 2 by
    :func:`alpha_vjp_rows`, the others by :func:`.exact_sums.alpha_vjp_big_rows`; the same
    bits as the numba engine's kernels."""
    a = alpha[:, None]
    big = alpha > 2.0
    out = np.zeros(len(p))
    if (~big).any():
        out[~big] = alpha_vjp_rows(p[~big], g[~big], a[~big] - 1.0)
    if big.any():
        out[big] = _sums.alpha_vjp_big_rows(p[big], g[big], a[big] - 1.0)
    return out


def alpha_vjp_rows(p: np.ndarray, g: np.ndarray, a1: np.ndarray) -> np.ndarray:
    """:meth:`NumpyBackend.entmax_alpha_vjp` on float64 rows with alpha in [1, 2] (``a1 =
    alpha - 1``, shape (rows, 1)): ``log p``, ``exp`` in :func:`_h` and ``u`` correctly
    rounded, the four sums correctly rounded (:mod:`.exact_sums`), and the same operations
    around them as the numba engine's, so both give the same bits."""
    on = p > 0
    L = np.zeros_like(p)
    L[on] = _sums.log_rows(p[on])
    with np.errstate(invalid="ignore", over="ignore"):
        pc = np.where(on, -p * L * L * _h(-a1 * L), 0.0)
    u = _sums.skew_rows(p, 1.0 - a1)
    su = _sums.dot_rows(u)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(su > 0, _sums.dot_rows(u, g) * _sums.dot_rows(pc) / np.where(su > 0, su, 1.0), 0.0)
    return _sums.dot_rows(g, pc) - corr


def _h(w: np.ndarray) -> np.ndarray:
    """``(exp(w) - 1 - w) / w**2`` without cancellation (1/2 at w = 0): its Taylor series
    for ``|w| < 1``, else ``(e - 1 - w) / w**2`` with ``e`` the correctly rounded
    ``exp(w)`` (+inf above :data:`.exact_sums.EXP_OVER`); the same operations in the numba engine."""
    small = np.abs(w) < 1.0
    ws = np.where(small, w, 0.0)
    series = np.zeros_like(ws)
    term = np.full_like(ws, 0.5)  # w^k / (k + 2)!
    for k in range(SERIES_TERMS):
        series = series + term
        term = term * ws / (k + 3)
    wl = w[~small]
    e = np.full(wl.shape, np.inf)
    fin = wl <= _sums.EXP_OVER
    e[fin] = _sums.exp_rows(wl[fin])
    out = series.copy()
    out[~small] = (e - 1.0 - wl) / (wl * wl)
    return out


# --------------------------------------------------------------------------- row solvers
def _softmax(y: np.ndarray):
    from scipy.special import logsumexp  # imported here: scipy.special takes ~0.5-1 s to import

    theta = logsumexp(y, axis=1)
    return theta, np.zeros(len(y), np.int64), np.ones(len(y), bool)


def _polish(y: np.ndarray, alpha: float, A: np.ndarray) -> np.ndarray:
    """Newton steps on f(A) = sum e_alpha(y - A) - 1 (f' = -sum p^(2-alpha)) until the
    support is stable and the step no longer changes A."""
    for _ in range(POLISH_STEPS):
        p = e_alpha(y - A[:, None], alpha)
        f = p.sum(axis=1) - 1.0
        fprime = skew_weights(p, alpha).sum(axis=1)
        A_new = A + f / fprime
        if np.array_equal(A_new, A):
            break
        A = A_new
    return A


def _sparsemax(y: np.ndarray):
    """Sort-based sparsemax in A-units (p = [1 + y - A]_+, so A = tau + 1)."""
    n = y.shape[1]
    ys = -np.sort(-y, axis=1)
    finite = np.isfinite(ys)
    k = np.arange(1, n + 1)
    cs = np.cumsum(np.where(finite, ys, 0.0), axis=1)
    in_support = finite & (1.0 + k * ys > cs)
    ks = in_support.sum(axis=1)
    tau = (cs[np.arange(len(y)), ks - 1] - 1.0) / ks
    A = _polish(y, 2.0, tau + 1.0)
    return A, np.zeros(len(y), np.int64), np.ones(len(y), bool)


def _entmax15(y: np.ndarray):
    """Sort-based 1.5-entmax (Peters et al. 2019) in A-units: with z = y / 2,
    p = [z - tau]_+^2 and A = 2 (tau + 1)."""
    n = y.shape[1]
    zs = -np.sort(-y, axis=1) / 2.0
    finite = np.isfinite(zs)
    zf = np.where(finite, zs, 0.0)
    k = np.arange(1, n + 1)
    # Squares overflow only for z < -1e154, far below the support window (z > max z - 1):
    # the prefixes that reach them give inf/NaN candidates, which the test below rejects.
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.cumsum(zf, axis=1) / k
        meansq = np.cumsum(zf * zf, axis=1) / k
        delta = (1.0 - k * (meansq - mean * mean)) / k
    with np.errstate(invalid="ignore"):
        tau_k = mean - np.sqrt(np.maximum(delta, 0.0))
        ks = (finite & (tau_k <= zs)).sum(axis=1)
    tau = tau_k[np.arange(len(y)), ks - 1]
    A = _polish(y, 1.5, 2.0 * (tau + 1.0))
    return A, np.zeros(len(y), np.int64), np.ones(len(y), bool)


def _last_bit(excess, lo: np.ndarray, hi: np.ndarray):
    """Bisect every row's bracket until its midpoint equals an endpoint.

    ``excess(idx, mid)`` is the increasing-in-lo-direction residual of rows ``idx`` at
    ``mid``: the root lies above ``mid`` when it is >= 0.  Returns lo, hi, iterations and
    a converged flag per row; lo and hi bracket the root and are adjacent floats."""
    lo, hi = lo.copy(), hi.copy()
    n_iter = np.zeros(len(lo), np.int64)
    active = hi > lo
    for _ in range(MAX_ITER):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        mid = 0.5 * (lo[idx] + hi[idx])
        done = (mid <= lo[idx]) | (mid >= hi[idx])
        up = excess(idx, mid) >= 0.0
        lo[idx[up & ~done]] = mid[up & ~done]
        hi[idx[~up & ~done]] = mid[~up & ~done]
        n_iter[idx[~done]] += 1
        active[idx[done]] = False
    return lo, hi, n_iter, ~active


def _newton_bracket(evaluate, lo: np.ndarray, hi: np.ndarray, x: np.ndarray, scale):
    """Shrink every row's bracket ``[lo, hi]`` of a decreasing ``f`` (``f(lo) >= 0 >
    f(hi)``) with safeguarded Newton steps, before :func:`_last_bit` finishes it.

    ``evaluate(idx, x)`` returns ``f`` of rows ``idx`` at ``x`` (the very function the
    bisection then uses) and a Newton increment.  Each evaluation only moves an end of
    the bracket to a point whose sign of ``f`` it has just computed, as a bisection step
    does; steps that would leave the bracket are replaced by its midpoint, and once a
    step is below :data:`NEWTON_CLOSE` ulps (of ``max(|x|, scale)``, ``scale`` being
    the size below which ``x`` no longer changes ``f``) the next point is put past the
    root, at :data:`NEWTON_PROBE` times the step, to close the other end (each probe
    that does not cross goes :data:`NEWTON_PROBE` times further).  Where ``f`` is
    monotone in float64, the largest float with ``f >= 0``, which the bisection's
    last-bit bracket ends at, is unique, so the result is the same, bit for bit, as
    bisecting the whole bracket (``method="bisect"``), in a fifth to a half of the
    evaluations (tests/test_oracle.py checks both).  ``x`` (the first point) must lie
    inside the bracket, or at an end where the sign of ``f`` is known (the bisection
    never evaluates the ends).  Rows still wider than :data:`NEWTON_DONE` ulps after
    :data:`NEWTON_STEPS` evaluations are left to the bisection, with their bracket
    narrowed.  Returns lo, hi and the evaluations per row."""
    lo, hi, x = lo.copy(), hi.copy(), x.copy()
    scale = np.broadcast_to(scale, lo.shape)
    probe = np.zeros(len(lo))  # the last probe's width, 0 after a Newton step
    n_eval = np.zeros(len(lo), np.int64)
    active = hi > lo
    for _ in range(NEWTON_STEPS):
        active &= (hi - lo) > NEWTON_DONE * np.spacing(np.maximum(np.abs(lo), np.abs(hi)))
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xi = x[idx]
        f, step = evaluate(idx, xi)
        n_eval[idx] += 1
        up = f >= 0.0
        lo[idx[up]] = xi[up]
        hi[idx[~up]] = xi[~up]
        floor = NEWTON_CLOSE * np.spacing(np.maximum(np.abs(xi), scale[idx]))
        close = ~(np.abs(step) > floor)  # NaN steps too
        width = np.fmax(NEWTON_PROBE * np.abs(step), np.maximum(floor, NEWTON_PROBE * probe[idx]))  # fmax: NaN -> floor
        probe[idx] = np.where(close, width, 0.0)
        step = np.where(close, np.where(up, width, -width), step)
        nxt = xi + step
        li, hi_ = lo[idx], hi[idx]
        x[idx] = np.where((nxt > li) & (nxt < hi_), nxt, 0.5 * (li + hi_))
    return lo, hi, n_eval


def _root(excess, newton, lo: np.ndarray, hi: np.ndarray, x: np.ndarray, scale, newton_start: bool):
    """The last-bit bracket of a decreasing ``excess`` on ``[lo, hi]``: bisected by
    :func:`_last_bit`, after :func:`_newton_bracket` (from ``x``, with ``newton``) when
    ``newton_start``.  Returns lo, hi, the evaluations of both kinds and convergence."""
    n0 = 0
    if newton_start:
        lo, hi, n0 = _newton_bracket(newton, lo, hi, x, scale)
    lo, hi, it, conv = _last_bit(excess, lo, hi)
    return lo, hi, it + n0, conv


def _log_mass_step(p: np.ndarray, slope) -> tuple[np.ndarray, np.ndarray]:
    """``sum p - 1`` per row of ``p`` (rows, n), and the Newton increment of ``log(sum p)``
    for a mass that decreases in the variable: ``F log F / S`` with ``F = sum p`` and ``S``
    the row sums of ``slope(r, c)`` (``-dp/dvariable`` at the nonzero entries ``r, c``)."""
    F = p.sum(axis=1)
    r, c = np.nonzero(p)
    S = np.bincount(r, slope(r, c), minlength=len(p))
    with np.errstate(divide="ignore", invalid="ignore"):
        return F - 1.0, F * np.log1p(F - 1.0) / S


def _closest(p_lo: np.ndarray, p_hi: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Of the two bracket ends, the one whose probabilities sum closer to 1."""
    pick_hi = np.abs(p_hi.sum(axis=1) - 1.0) < np.abs(p_lo.sum(axis=1) - 1.0)
    return np.where(pick_hi, hi, lo), np.where(pick_hi[:, None], p_hi, p_lo)


def _power(t: np.ndarray, a: np.ndarray) -> np.ndarray:
    """t_+ ** (1/(a - 1)) for a > 1."""
    with np.errstate(divide="ignore"):
        return np.exp(np.log(np.maximum(t, 0.0)) / (a - 1.0))


#: the bisection computes only the entries that can reach the support when they are at
#: most this share of the active rows' entries (gathering them costs more than it saves
#: when they are most of them)
CANDIDATE_SHARE = 0.5


def _on_candidates(f, cand: np.ndarray, idx: np.ndarray, entries: tuple, per_row: tuple) -> np.ndarray:
    """``f(*entries, *per_row)`` on the rows ``idx`` of the (rows, n) ``entries``, with
    ``per_row`` one value per row of ``idx``, computed only where ``cand`` is set (0
    elsewhere) when that is at most :data:`CANDIDATE_SHARE` of the entries.

    ``f`` must be exactly 0 wherever ``cand`` is not set: the array is then the same, bit
    for bit, as computing ``f`` everywhere, and so are its row sums (same positions, same
    order of summation); only the work on entries that cannot reach the support goes."""
    if len(idx) == len(cand):  # every row still active: idx is 0..rows-1, views instead of copies
        on = cand
    else:
        on = cand[idx]
        entries = tuple(e[idx] for e in entries)
    if np.count_nonzero(on) > CANDIDATE_SHARE * on.size:
        return f(*entries, *(v[:, None] for v in per_row))
    r, c = np.nonzero(on)
    out = np.zeros(on.shape)
    out[r, c] = f(*(e[r, c] for e in entries), *(v[r] for v in per_row))
    return out


def _bisect(y: np.ndarray, alpha: np.ndarray, newton_start: bool = True):
    """Bisection to the last bit (see the module docstring); alpha is (rows,);
    ``newton_start`` (``method=None``): each bracket is narrowed first by
    :func:`_newton_bracket`, which ends at the same floats in fewer evaluations.

    alpha <= 2: bisect A, p = e_alpha(y - A) (accurate down to alpha -> 1).
    alpha > 2: p_i = ((alpha - 1)(y_i - T))_+ ** (1/(alpha - 1)) with T = A - 1/(alpha-1)
    the support threshold.  dp/dT grows like p^(2-alpha) at the support's edge, so T is
    found in two stages: last-bit bisection of T, which fixes the support
    ``{y > lo}`` with smallest entry c, then last-bit bisection of the edge probability
    q = (a1 delta)^(1/a1), delta = c - T, on ``[0, q(lo)]``: with d_i = y_i - c >= 0,
    p_i = (a1 d_i + q^a1)^(1/a1) (:func:`.numpy_elementwise.edge_p`, computed in log
    space; p = q exactly at the edge).  The mass is increasing in q with slope >= 1, so q, and every p_i, is
    found to full precision even where T cannot resolve it and where delta itself is below
    the float64 range (edge p < ~1e-308^(1/(alpha-1)), i.e. 8e-4 at alpha = 100, 0.5 at
    alpha = 1000).  The lower end q = 0 has the mass at T = c, which is < 1 (c is in the
    support).  Returns A (theta = max + A), iterations, convergence and p."""
    a = alpha[:, None]
    nf = np.isfinite(y).sum(axis=1).astype(_F64)
    a1 = alpha - 1.0
    big = alpha > 2.0
    A = np.zeros(len(y))
    p = np.zeros_like(y)
    n_iter = np.zeros(len(y), np.int64)
    ok = np.ones(len(y), bool)
    small = ~big
    if small.any():
        ys, ass, a1s = y[small], a[small], a1[small]
        with np.errstate(divide="ignore", invalid="ignore"):
            top = np.where(a1s == 0.0, np.log(nf[small]), -np.expm1(-a1s * np.log(nf[small])) / np.where(a1s == 0.0, 1.0, a1s))

        al = alpha[small]
        with np.errstate(divide="ignore"):  # e_alpha(y - A) = 0 for every A >= 0 below -1/a1
            cand = ys > -(1.0 + CANDIDATE_MARGIN) / a1s[:, None]

        def mass(idx, A):
            return _on_candidates(lambda yy, A, a: e_alpha(yy - A, a), cand, idx, (ys,), (A, al[idx]))

        def excess(idx, mid):
            return mass(idx, mid).sum(axis=1) - 1.0

        def newton(idx, A):  # dp_i/dA = -p_i^(2-alpha) = -p_i / (1 + a1 (y_i - A))
            p_ = mass(idx, A)
            return _log_mass_step(p_, lambda r, c: p_[r, c] / (1.0 + a1s[idx[r]] * (ys[idx[r], c] - A[r])))

        zero = np.zeros(len(ys))
        lo, hi, it, conv = _root(excess, newton, zero, top, zero, 1.0, newton_start)
        A[small], p[small] = _closest(e_alpha(ys - lo[:, None], ass), e_alpha(ys - hi[:, None], ass), lo, hi)
        n_iter[small], ok[small] = it, conv
    if big.any():
        yb, a1b = y[big], a1[big]

        alb = alpha[big]
        T0 = -1.0 / a1b
        candT = yb > T0[:, None]  # p = 0 for every T >= T0 at or below it

        def mass_T(idx, T):
            return _on_candidates(lambda yy, T, a1_, a: _power(a1_ * (yy - T), a), candT, idx, (yb,),
                                  (T, a1b[idx], alb[idx]))

        def excess_T(idx, mid):
            return mass_T(idx, mid).sum(axis=1) - 1.0

        def newton_T(idx, T):  # dp_i/dT = -p_i / (a1 (y_i - T))
            p_ = mass_T(idx, T)
            return _log_mass_step(p_, lambda r, c: p_[r, c] / (a1b[idx[r]] * (yb[idx[r], c] - T[r])))

        lo, hi, it1, conv1 = _root(excess_T, newton_T, T0, -np.exp(-a1b * np.log(nf[big])) / a1b,
                                   np.nextafter(T0, np.inf), 1.0 / a1b, newton_start)
        c = np.where(yb > lo[:, None], yb, np.inf).min(axis=1)  # smallest support entry
        d = yb - c[:, None]
        on = d > 0
        Ld = np.where(on, np.log(np.where(on, a1b[:, None] * d, 1.0)), -np.inf)  # log(a1 d) (unused where d <= 0)

        candq = d >= 0  # the support (p = 0 below its edge)

        def edge_mass(idx, q):
            return _on_candidates(_edge_p, candq, idx, (Ld, d), (q, a1b[idx]))

        def excess_q(idx, mid):  # increasing in q: the root is above mid when mass < 1
            return 1.0 - edge_mass(idx, mid).sum(axis=1)

        def newton_q(idx, q):  # the mass is convex in q: Newton from qtop comes down monotonically
            p_ = edge_mass(idx, q)
            f = 1.0 - p_.sum(axis=1)
            r, c = np.nonzero(p_)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                slope = np.exp((a1b[idx[r]] - 1.0) * np.log(q[r] / p_[r, c]))  # dp_i/dq = (q / p_i)^(a1 - 1)
                return f, f / np.bincount(r, slope, minlength=len(idx))

        qtop = _power(a1b * (c - lo) * (1 + EDGE_ULPS * np.finfo(_F64).eps), alpha[big])
        qlo, qhi, it2, conv2 = _root(excess_q, newton_q, np.zeros(len(yb)), qtop, np.nextafter(qtop, 0.0), 1.0,
                                     newton_start)
        q, p[big] = _closest(_edge_p(Ld, d, qlo[:, None], a1b[:, None]), _edge_p(Ld, d, qhi[:, None], a1b[:, None]),
                             qlo, qhi)
        with np.errstate(divide="ignore"):
            delta = np.exp(a1b * np.log(q)) / a1b  # may underflow to 0: theta does not need it
        A[big] = c - delta + 1.0 / a1b
        n_iter[big], ok[big] = it1 + it2, conv1 & conv2
    return A, n_iter, ok, p


class NumpyBackend:
    """The readable float64 reference (always available)."""

    name = "numpy"

    def owns(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def entmax_forward(self, x: np.ndarray, alpha: np.ndarray, method: str | None) -> RowSolve:
        """Every row's threshold and probabilities: :func:`.numpy_threshold.solve_row` (the
        definition) computed for all rows at once, by the solvers of this module."""
        require(self.name, "entmax_forward", method)
        rows, n = x.shape
        x64 = x.astype(_F64)
        theta = np.full(rows, -np.inf)
        shift = np.full(rows, -np.inf)  # theta - max x, before its rounding into theta
        n_iter = np.zeros(rows, np.int64)
        converged = np.ones(rows, bool)
        p = np.zeros((rows, n))
        m = x64.max(axis=1, initial=-np.inf)
        live = np.isfinite(m)
        if method == "sort":
            bad = ~np.isin(alpha, (1.0, 1.5, 2.0))
            if bad.any():
                raise NotImplementedError(
                    f"method='sort' exists only for alpha in {{1, 1.5, 2}}, got alpha={alpha[bad][0]!r}; "
                    "use method=None or 'bisect'"
                )
        exact = np.isin(alpha, (1.0, 1.5, 2.0)) if method != "bisect" else np.zeros(rows, bool)
        groups = [(live & exact & (alpha == a), a) for a in (1.0, 1.5, 2.0)]
        groups.append((live & ~exact, None))
        for rows_mask, a in groups:
            if not rows_mask.any():
                continue
            with np.errstate(over="ignore"):
                y = x64[rows_mask] - m[rows_mask, None]
            if a != 1.0:
                # Entries more than _FLOOR below the maximum are outside every support window
                # (at most log n wide) and e_alpha gives them exactly 0 either way; flooring
                # them keeps the solvers' sums and products inside float64's range (a gap
                # beyond it would otherwise overflow to -inf and read as a masked entry).
                y = np.where(np.isfinite(x64[rows_mask]), np.maximum(y, -_FLOOR), -np.inf)
            if a == 1.0:
                A, it, ok = _softmax(y)
            elif a == 1.5:
                A, it, ok = _entmax15(y)
            elif a == 2.0:
                A, it, ok = _sparsemax(y)
            else:
                A, it, ok, p_rows = _bisect(y, alpha[rows_mask], newton_start=method != "bisect")
            if a is not None:
                p_rows = e_alpha(y - A[:, None], a)
            theta[rows_mask] = m[rows_mask] + A
            shift[rows_mask] = A
            p[rows_mask] = p_rows
            n_iter[rows_mask] = it
            converged[rows_mask] = ok
        # correctly rounded, with the exact support and tau (:mod:`.exact_rows`); float32 rows
        # where the float64 answer decides them, the others finished
        if x.dtype == _F64:
            p, tau, theta, support = _exact.finish(x64, alpha, shift, p, x.dtype)
            return ExactRowSolve(p, theta, support, n_iter, converged, tau)
        p32, tau, support, bad = _exact.float32_rows(x64, alpha, shift, p)
        if bad.any():
            p32[bad], tau[bad], theta[bad], support[bad] = _exact.finish(x64[bad], alpha[bad], shift[bad], p[bad],
                                                                         x.dtype)
        return ExactRowSolve(p32, theta, support, n_iter, converged, tau)

    def entmax_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """dx = u (g - r), r = (u . g) / sum u, u = p^(2 - alpha) on the support.

        alpha > 2: u is unbounded at the support's edge (u = 1e323 for p = 5e-4 at
        alpha = 100) and may overflow.  With w = u / max u (computed as
        exp(log u - max log u)), S = sum w and, for each i, S_i = sum_{j != i} w_j,
        G_i = sum_{j != i} w_j g_j, the factor ``g_i - r = (g_i S_i - G_i) / S`` is
        finite and free of the cancellation of ``g_i - r`` (S_i = S - w_i).  The entry m
        of largest u,
        whose u_m (g_m - r) multiplies a tiny difference by a huge factor, is computed
        as ``sum_{j != m} u_j (g_m - g_j) / S``, which is finite whenever its true value
        is, e.g. when m alone has an overflowing u (the Jacobian's row m is then bounded:
        J_mm ~ sum_{j != m} u_j; the true value's rounding, +-inf, otherwise).
        Every other entry is ``u_i (g_i - r)``: the float64 rounding of the true value,
        +-inf where that exceeds float64's range (the Jacobian is genuinely unbounded
        there: several entries with huge u, e.g. tied edge entries), 0 where the factor
        g_i - r is 0.  No floating-point warnings are raised.  Rows with alpha <= 2 are
        computed as ``u (g - r)`` directly.  float64 rows by :func:`vjp_float64`: u (or
        log p and the exponentials above alpha = 2) and every sum correctly rounded
        (:mod:`.exact_sums`), so that every engine gives the same bits; float32 rows with
        alpha > 2 are its float32 rounding."""
        p64, g64 = p.astype(_F64), g.astype(_F64)
        if p.dtype == _F64 and g.dtype == _F64:
            return vjp_float64(p64, g64, alpha)
        a = alpha[:, None]
        big = alpha > 2.0
        u = skew_weights(p64, a)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            su = u.sum(axis=1, keepdims=True)
            ug = (u * g64).sum(axis=1, keepdims=True)
            dx = np.where(u > 0, u * (g64 - np.where(su > 0, ug / su, 0.0)), 0.0)
            if big.any():
                dx[big] = _sums.vjp_big_rows(p64[big], g64[big], 2.0 - a[big])
            return dx.astype(np.result_type(p.dtype, g.dtype), copy=False)

    def entmax_alpha_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """sum_i g_i dp_i/dalpha with dp_i/dalpha = p_i c_i - u_i (sum_j p_j c_j) / sum_j u_j,
        c_i = -log(p_i)^2 h(-(alpha - 1) log p_i), h(w) = (e^w - 1 - w)/w^2 (the derivative
        of log p_i at fixed x - theta); equal to Correia et al.'s formula, without its
        1/(alpha-1)^2 cancellation, and p_i (K - log(p_i)^2)/2 at alpha = 1.

        alpha > 2: the same value as ``sum_i p_i c_i (g_i - r)`` (r = u.g / sum u) plus
        ``sum_i u_i (g_i - r) / (alpha-1)^2 = 0``, i.e. ``sum_i p_i (1 - (alpha-1) log p_i)
        (g_i - r) / (alpha-1)^2``: p_i c_i = -(u_i - p_i (1 - (alpha-1) log p_i)) /
        (alpha-1)^2 carries the unbounded u_i, whose terms cancel exactly, so this form is
        finite (and free of that cancellation) where u overflows; r as in entmax_vjp.
        Every row in float64 by :func:`alpha_vjp_float64` (the same bits on every engine)."""
        return alpha_vjp_float64(p.astype(_F64), g.astype(_F64), alpha)

    def normmax_forward(self, x: np.ndarray, alpha: np.ndarray) -> RowSolve:
        """Correctly rounded rows with the exact support
        (:func:`entmax_ref.backends.exact_normmax.normmax_rows`)."""
        return normmax_rows(x, alpha)

    def normmax_vjp(self, p: np.ndarray, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        return normmax_vjp_rows(p, g, alpha)

    def budget_forward(self, x: np.ndarray, budget: np.ndarray) -> RowSolve:
        """Binary search over the sorted breakpoints, then the closed form on the
        bracketing piece (:mod:`entmax_ref.backends.numpy_family`)."""
        res = _family.budget_rows(x, budget)
        p, tau, support = budget_finish(x, budget, res.p, res.theta, x.dtype)  # correctly rounded
        return res._replace(p=p, theta=tau, support=support)

    def budget_vjp(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        return _family.budget_vjp_rows(p, g)

    def add_products(self, st: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Add the exact terms of ``a @ b`` (float64) to the sum states ``st``
        (:func:`entmax_ref.backends.exact_sums.add_products`): the float64 attention's
        correctly rounded sums."""
        from .exact_sums import add_products

        add_products(st, a, b)

    def round_products(self, st: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The sums of the states ``st`` of at most ``n`` terms, correctly rounded where
        proven, and where (:func:`entmax_ref.backends.exact_sums.round_products`)."""
        from .exact_sums import round_products

        return round_products(st, n)

    def attention_forward(self, q, k, v, spec: AttentionSpec) -> AttentionForward:
        from .numpy_attention import attention_forward

        return attention_forward(self, q, k, v, spec)

    def attention_backward(self, do, q, k, v, res, skew, spec: AttentionSpec) -> AttentionGrads:
        from .numpy_attention import attention_backward

        return attention_backward(self, do, q, k, v, res, skew, spec)
