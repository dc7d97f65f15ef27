"""Fenchel-Young losses of alpha-entmax (the Tsallis losses of Blondel et al. 2020)."""

from __future__ import annotations

import numpy as np

from . import _validate as V
from ._interop import public
from .backends import resolve_backend
from .backends._base import xp_of


def _tsallis_omega(p, alpha, xp):
    """Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1)) (sum p log p at alpha = 1), per row.

    Written as sum_i p_i expm1((alpha - 1) log p_i) / (alpha (alpha - 1)) so that alpha -> 1
    has no cancellation."""
    a = alpha[:, None]
    on = p > 0
    logp = xp.log(xp.where(on, p, 1.0))
    a1 = a - 1.0
    ratio = xp.where(a1 == 0.0, logp, xp.expm1(a1 * logp) / xp.where(a1 == 0.0, 1.0, a1))
    return xp.where(on, p * ratio, 0.0).sum(axis=1) / alpha


def target_rows(target, rows: V.Rows, xp):
    """The target as a float64 (rows, n) probability array, in x's namespace (host lists and
    NumPy arrays are moved there explicitly)."""
    t = xp.asarray(V.as_array(target, "target")) if V.xp_of(target) is np else target
    rows_n, n = rows.data.shape
    if t.dtype.kind in "iu" and tuple(t.shape) == rows.batch_shape:
        idx = t.reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise ValueError(f"target holds class index {bad}, outside [0, {n}) for rows of length {n}")
        q = xp.zeros((rows_n, n), dtype=np.float64)
        q[xp.arange(rows_n), idx] = 1.0
        return q
    x_shape = () if rows.scalar else rows.shape  # x as given (a 0-d x is one row of one score)
    if tuple(t.shape) != x_shape:
        raise ValueError(
            f"target has shape {tuple(t.shape)}; expected class indices of shape {rows.batch_shape} "
            f"(integer) or probabilities of shape {x_shape} like x"
        )
    if n == 0 and rows_n:
        raise ValueError(
            f"target is a probability array over 0 classes (x has shape {x_shape}, the axis has length 0): "
            "no row of it can sum to 1; a loss needs at least one class"
        )
    rt = V.to_rows(t, rows.axis, "target", allow_neg_inf=False, dtype=np.dtype(np.float64))
    q = rt.data
    if bool((q < 0).any()):
        raise ValueError("target probabilities must be >= 0")
    eps = V.eps_of(t.dtype)  # the target's own precision (bfloat16: 2**-7)
    err = xp.abs(q.sum(axis=1) - 1.0)
    if err.size and float(err.max()) > 4 * n * eps:
        raise ValueError(f"target rows must sum to 1 (within {4 * n * eps:.1e}); worst row is off by {float(err.max()):.3g}")
    return q


def _prediction_and_target(x, target, alpha, axis, backend):
    """Validated rows of x, their namespace, alpha per row, p = entmax(x) and q (float64)."""
    rows = V.to_rows(x, axis, "x")
    xp = xp_of(rows.data)
    be = resolve_backend(backend, rows.data)
    a = V.alpha_rows(alpha, rows, xp)
    q = target_rows(target, rows, xp)
    p = be.entmax_forward(rows.data, a, None).p.astype(np.float64)
    return rows, xp, a, p, q


@public
def entmax_loss(x, target, alpha=1.5, axis=-1, *, backend=None):
    """The Fenchel-Young loss L(x; q) = Omega(q) - Omega(p) + <p - q, x>, per row.

    p = entmax(x, alpha), Omega is the negative Tsallis entropy
    (sum p^alpha - 1)/(alpha (alpha - 1)) (sum p log p at alpha = 1; so alpha = 1 is the
    cross-entropy and alpha = 2 the sparsemax loss).  ``target`` is class indices (x's
    shape without ``axis``) or probabilities shaped like x.  L >= 0 with equality iff
    p == q; rounding cannot make it negative (it is clipped at 0).  A target with mass
    on a masked (-inf) entry gives +inf.  Returned in float64, x's shape without ``axis``.

    >>> import entmax_ref as er
    >>> float(er.entmax_loss([-2.0, 0.0, 0.5], 2, alpha=2))  # p = [0, .25, .75]
    0.0625
    """
    rows, xp, a, p, q = _prediction_and_target(x, target, alpha, axis, backend)
    x64 = rows.data.astype(np.float64)
    m = x64.max(axis=1, keepdims=True) if x64.shape[1] else xp.zeros((len(x64), 1))
    diff = p - q
    # a gap beyond float64's range rounds to -inf, and the loss then to +inf: its true value
    with np.errstate(over="ignore"):
        shifted = x64 - xp.where(xp.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        lin = xp.where(diff != 0, diff * shifted, 0.0).sum(axis=1)
    loss = _tsallis_omega(q, a, xp) - _tsallis_omega(p, a, xp) + lin
    return rows.per_row(xp.maximum(loss, 0.0))


@public
def entmax_loss_grad(x, target, alpha=1.5, axis=-1, *, backend=None):
    """Gradient of :func:`entmax_loss` w.r.t. x: entmax(x, alpha) - target, formed in float64
    and returned in x's shape and dtype (float64 for integer x), like every gradient w.r.t. x.

    >>> import entmax_ref as er
    >>> er.entmax_loss_grad([-2.0, 0.0, 0.5], 2, alpha=2).tolist()
    [0.0, 0.25, -0.25]
    """
    rows, xp, a, p, q = _prediction_and_target(x, target, alpha, axis, backend)
    return rows.restore(p - q)
