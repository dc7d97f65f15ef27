"""The rest of the ``entmax`` package's family: alpha-normmax and budget-sparsemax.

Both are solved exactly (the support from the sorted row, then the threshold to full
working precision), with VJPs from the output alone and, for normmax, its Fenchel-Young
loss.  The math is in ``docs/math/normmax.md`` and ``docs/math/budget_sparsemax.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _validate as V
from ._interop import public
from .backends import resolve_backend
from .backends._base import xp_of
from .gradients import pair_rows
from .losses import target_rows

__all__ = [
    "BudgetInfo",
    "NormmaxInfo",
    "budget_sparsemax",
    "budget_sparsemax_vjp",
    "normmax",
    "normmax_loss",
    "normmax_loss_grad",
    "normmax_vjp",
]


@dataclass(frozen=True)
class NormmaxInfo:
    """Per-row solver diagnostics of :func:`normmax` (x's shape without the axis).

    Attributes
    ----------
    tau : the threshold of p_i proportional to [x_i - tau]_+ ** (1/(alpha-1)), in x's
        units; -inf for an all -inf row.
    support : number of nonzero probabilities.
    n_iter : Newton steps taken after the support was identified.
    converged : whether Newton stopped because a step no longer increased tau.
    """

    tau: Any
    support: Any
    n_iter: Any
    converged: Any


@dataclass(frozen=True)
class BudgetInfo:
    """Per-row diagnostics of :func:`budget_sparsemax` (x's shape without the axis).

    Attributes
    ----------
    tau : the threshold of p = clip(x - tau, 0, 1): the smallest such tau when it is not
        unique (an integer budget with no fractional entry); -inf when every unmasked
        entry is 1 (budget >= number of unmasked entries, and all -inf rows).
    support : number of nonzero probabilities.
    n_iter : 0 (the solution is a closed form on the identified sets).
    converged : always True.
    """

    tau: Any
    support: Any
    n_iter: Any
    converged: Any


def _op(be, name: str):
    fn = getattr(be, name, None)
    if fn is None:
        raise NotImplementedError(f"backend {getattr(be, 'name', be)!r} does not implement {name}")
    return fn


def _normmax_alpha(alpha, rows, xp):
    a = V.alpha_rows(alpha, rows, xp)
    a_host = a.get() if hasattr(a, "get") else a
    if a_host.size and float(a_host.min()) <= 1.0:
        raise ValueError(
            f"alpha must be > 1 for normmax, got {float(a_host.min())!r} (at alpha = 1 the 1-norm is "
            "constant on the simplex and the maximiser is not unique)"
        )
    return a


def _budget_rows(budget, rows, n, xp):
    """budget as a float64 (rows,) array in [0, n]; a scalar or one per row of ``rows``
    (:func:`entmax_ref._validate.per_row`)."""
    b = V.finite_real(budget, "budget")
    bad = (b < 0) | (b > n)
    if np.any(bad):
        raise ValueError(f"budget must be in [0, n] = [0, {n}] for rows of length n = {n}, "
                         f"got budget = {V.shown(b.ravel()[bad.ravel()][0])!r}")
    return V.per_row(b, "budget", rows, xp)


def _solve(x, axis, backend, check_finite, return_info, op, param, info_cls):
    """The body of a family forward: (rows, n) layout, backend, the (rows,) parameter
    ``param(rows)``, the backend's ``op``, and ``p`` (with the per-row ``info_cls``)."""
    rows = V.to_rows(x, axis, "x", finite=check_finite)
    be = resolve_backend(backend, rows.data)
    res = _op(be, op)(rows.data, param(rows))
    p = rows.restore(res.p)
    if not return_info:
        return p
    return p, info_cls(*(rows.per_row(f) for f in (res.theta, res.support, res.n_iter, res.converged)))


# ----------------------------------------------------------------------------- normmax


@public
def normmax(x, alpha=2.0, axis=-1, *, backend=None, return_info=False, check_finite=True):
    r"""alpha-normmax along ``axis``: the maximiser over the simplex of <x, p> - ||p||_alpha.

    For alpha > 1, with beta = alpha / (alpha - 1), the solution is

        p_i = [x_i - tau]_+ ** (1/(alpha-1)) / sum_j [x_j - tau]_+ ** (1/(alpha-1)),

    where tau is the unique root of sum_i [x_i - tau]_+ ** beta = 1 (it lies in
    [max x - 1, max x - n ** (-1/beta)]).  The support is found exactly from the sorted
    row (a binary search over ranks), then tau by Newton on the beta-norm of the support,
    which is convex, so the iterates increase monotonically from the left; it stops when
    a step no longer increases tau (full working precision).  Unlike entmax it is not
    scale-free: scaling x changes the sparsity.  alpha = 2 is the 2-norm, alpha -> inf
    the infinity-norm (p uniform on the top entries within 1 of the max when they fit).

    Parameters
    ----------
    x : array_like
        Scores; -inf masks an entry (probability exactly 0).  An all -inf row gives zeros.
    alpha : float or array_like
        Finite alpha > 1: a scalar or one per row (x's shape without ``axis``, or
        broadcastable to it).
    axis : int
        The axis that sums to 1.
    backend : str or None
        "numpy", "numba", "cupy", "auto" or None (see :func:`entmax_ref.use_backend`).
    return_info : bool
        Also return a :class:`NormmaxInfo` (tau, support, n_iter, converged per row).
    check_finite : bool
        Reject NaN and +inf in x (ValueError naming the first).

    Returns
    -------
    p : array, x's shape and dtype (float32 is computed in float64 and rounded; integers
        become float64).  ``(p, info)`` when ``return_info``.

    Raises
    ------
    ValueError
        NaN/+inf in x; alpha NaN/inf/<= 1 or not broadcastable; axis out of range.
    TypeError
        Complex, bool, object or string input.

    Examples
    --------
    x = [0, -0.5, -2] at alpha = 2 (beta = 2): with tau on the top two,
    (0 - tau)^2 + (-0.5 - tau)^2 = 1 gives tau = -(0.5 + sqrt(1.75)) / 2, and
    p = [-tau, -0.5 - tau] / (-1 - 2 tau) = [0.5 + 0.25/sqrt(1.75), 0.5 - 0.25/sqrt(1.75)].

    >>> import entmax_ref as er
    >>> p = er.normmax([0.0, -0.5, -2.0], alpha=2)
    >>> p.round(6).tolist()
    [0.688982, 0.311018, 0.0]
    """
    return _solve(x, axis, backend, check_finite, return_info, "normmax_forward",
                  lambda rows: _normmax_alpha(alpha, rows, xp_of(rows.data)), NormmaxInfo)


@public
def normmax_vjp(p, grad, alpha=2.0, axis=-1, *, backend=None):
    r"""dL/dx of alpha-normmax, given its output ``p`` and the upstream ``grad`` = dL/dp.

    Differentiating the optimality conditions (implicit function theorem) gives the
    symmetric Jacobian J = (I - p 1^T) diag(v) (I - 1 p^T) with
    v_i = N (p_i / N) ** (2 - alpha) / (alpha - 1) on the support (0 elsewhere) and
    N = ||p||_alpha; so dL/dx = v * (g - <p, g>) - p * sum_j v_j (g_j - <p, g>).  It is
    zero off the support, on single-entry supports and on all-masked rows; J 1 = 0.
    Returned in p's shape and in the wider dtype of p and grad (float16/bfloat16 kept,
    computed in float32 or wider; a 0-d p gives a 0-d result).

    >>> import entmax_ref as er
    >>> er.normmax_vjp([0.5, 0.5, 0.0], [1.0, 0.0, 0.0], alpha=2).tolist()
    [0.3535533905932738, -0.3535533905932738, 0.0]
    """
    rp, p2, g2 = pair_rows(p, grad, axis)
    be = resolve_backend(backend, p2, g2)
    a = _normmax_alpha(alpha, rp, xp_of(p2))
    dx = _op(be, "normmax_vjp")(p2, g2, a)
    return rp.restore(dx)


def _alpha_norm(p, alpha, xp):
    """||p||_alpha per row of a nonnegative float64 (rows, n) array (scaled by the max)."""
    top = p.max(axis=1) if p.shape[1] else xp.zeros(len(p))
    safe = xp.where(top > 0, top, 1.0)
    r = p / safe[:, None]
    return top * ((r ** alpha[:, None]).sum(axis=1)) ** (1.0 / alpha)


def _normmax_pq(x, target, alpha, axis, backend):
    rows = V.to_rows(x, axis, "x")
    xp = xp_of(rows.data)
    be = resolve_backend(backend, rows.data)
    a = _normmax_alpha(alpha, rows, xp)
    q = target_rows(target, rows, xp)
    p = _op(be, "normmax_forward")(rows.data, a).p.astype(np.float64)
    return rows, xp, a, p, q


@public
def normmax_loss(x, target, alpha=2.0, axis=-1, *, backend=None):
    r"""The Fenchel-Young loss of alpha-normmax: L(x; q) = Omega(q) - Omega(p) + <p - q, x>.

    p = normmax(x, alpha) and Omega(p) = ||p||_alpha - 1 (0 on the vertices of the
    simplex), so for a one-hot target L = 1 - ||p||_alpha + <p - q, x>, the package's
    ``normmax_bisect_loss``.  ``target`` is class indices (x's shape without ``axis``) or
    probabilities shaped like x, as for :func:`entmax_loss`.  L >= 0 with equality iff
    p == q (clipped at 0 against rounding); a target with mass on a masked (-inf) entry
    gives +inf.  Returned in float64, x's shape without ``axis``.

    >>> import entmax_ref as er
    >>> float(er.normmax_loss([0.0, 0.0], 0, alpha=2))  # p = [.5, .5]: 1 - 1/sqrt(2)
    0.2928932188134524
    """
    rows, xp, a, p, q = _normmax_pq(x, target, alpha, axis, backend)
    x64 = rows.data.astype(np.float64)
    m = x64.max(axis=1, keepdims=True) if x64.shape[1] else xp.zeros((len(x64), 1))
    diff = p - q
    shifted = x64 - xp.where(xp.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        lin = xp.where(diff != 0, diff * shifted, 0.0).sum(axis=1)
    loss = _alpha_norm(q, a, xp) - _alpha_norm(p, a, xp) + lin
    return rows.per_row(xp.maximum(loss, 0.0))


@public
def normmax_loss_grad(x, target, alpha=2.0, axis=-1, *, backend=None):
    """Gradient of :func:`normmax_loss` w.r.t. x: normmax(x, alpha) - target (x's shape, float64;
    a 0-d x gives a 0-d result).

    >>> import entmax_ref as er
    >>> er.normmax_loss_grad([0.0, 0.0], 0, alpha=2).tolist()
    [-0.5, 0.5]
    """
    rows, xp, a, p, q = _normmax_pq(x, target, alpha, axis, backend)
    return rows.like(np.float64).restore(p - q)


# ----------------------------------------------------------------------------- budget


@public
def budget_sparsemax(x, budget=2.0, axis=-1, *, backend=None, return_info=False, check_finite=True):
    r"""budget-sparsemax along ``axis``: the Euclidean projection of x onto
    {0 <= p <= 1, sum p = budget}.

    The solution is p = clip(x - tau, 0, 1), with tau a root of the continuous,
    nonincreasing, piecewise-linear h(tau) = sum_i clip(x_i - tau, 0, 1) - budget.  Its
    breakpoints are the x_i (an entry leaves 0) and x_i - 1 (an entry reaches 1); the
    crossing piece is found exactly from the sorted breakpoints, and on it, with U the
    entries at 1 and F the fractional ones, tau = (|U| + sum_F x_i - budget) / |F|.
    budget = 1 is sparsemax; the package's ``budget_bisect`` solves the same problem by
    50 bisection steps.

    Parameters
    ----------
    x : array_like
        Scores; -inf masks an entry (probability exactly 0).
    budget : float or array_like
        The sum of each row, in [0, n] (n the length of ``axis``): a scalar or one per
        row.  A row with at most ``budget`` unmasked entries gets 1 on each of them (all
        -inf rows: zeros), the nearest point of the box.
    axis : int
        The axis that sums to ``budget``.
    backend : str or None
        "numpy", "numba", "cupy", "auto" or None.
    return_info : bool
        Also return a :class:`BudgetInfo` (tau, support, n_iter, converged per row).
    check_finite : bool
        Reject NaN and +inf in x.

    Returns
    -------
    p : array, x's shape and dtype.  ``(p, info)`` when ``return_info``.

    Raises
    ------
    ValueError
        budget outside [0, n], not finite or not broadcastable; NaN/+inf in x; bad axis.
    TypeError
        Non-real x or budget.

    Examples
    --------
    x = [1.5, 0.75, 0.25, -1], budget 2: U = {0} (1.5 - tau >= 1), F = {1, 2}, so
    tau = (1 + 0.75 + 0.25 - 2) / 2 = 0 and p = [1, 0.75, 0.25, 0].

    >>> import entmax_ref as er
    >>> er.budget_sparsemax([1.5, 0.75, 0.25, -1.0], budget=2).tolist()
    [1.0, 0.75, 0.25, 0.0]
    """
    return _solve(x, axis, backend, check_finite, return_info, "budget_forward",
                  lambda rows: _budget_rows(budget, rows, rows.data.shape[1], xp_of(rows.data)),
                  BudgetInfo)


@public
def budget_sparsemax_vjp(p, grad, budget=2.0, axis=-1, *, backend=None):
    r"""dL/dx of budget-sparsemax, given its output ``p`` and ``grad`` = dL/dp.

    On the free set F = {i : 0 < p_i < 1}, tau = (|U| + sum_F x - budget) / |F| moves
    with x, so the Jacobian is diag(1_F) - 1_F 1_F^T / |F|: dL/dx_i = g_i - mean_F(g) for
    i in F and 0 elsewhere; all zeros when F is empty (p is locally constant).  The
    budget does not enter; it is validated against n like :func:`budget_sparsemax`'s.
    Returned in p's shape and in the wider dtype of p and grad (float16/bfloat16 kept).

    >>> import entmax_ref as er
    >>> er.budget_sparsemax_vjp([1.0, 0.8, 0.2, 0.0], [3.0, 1.0, 0.0, 5.0], budget=2).tolist()
    [0.0, 0.5, -0.5, 0.0]
    """
    rp, p2, g2 = pair_rows(p, grad, axis)
    be = resolve_backend(backend, p2, g2)
    _budget_rows(budget, rp, p2.shape[1], xp_of(p2))
    dx = _op(be, "budget_vjp")(p2, g2)
    return rp.restore(dx)
