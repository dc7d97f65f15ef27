"""Backward passes of alpha-entmax, from its output p alone (no autograd state)."""

from __future__ import annotations

from . import _validate as V
from ._interop import public
from .backends import resolve_backend
from .backends._base import xp_of


def pair_rows(p, grad, axis, names=("p", "grad")):
    rp = V.to_rows(p, axis, names[0], allow_neg_inf=False)
    rg = V.to_rows(grad, axis, names[1], allow_neg_inf=False)
    V.same_shape(rp, rg, names)
    dt = V.common_dtype(rp.data.dtype, rg.data.dtype)
    out = rp.like(V.result_dtype(rp.out_dtype, rg.out_dtype))
    return out, rp.data.astype(dt, copy=False), rg.data.astype(dt, copy=False)


@public
def entmax_vjp(p, grad, alpha=1.5, axis=-1, *, backend=None):
    """dL/dx of alpha-entmax, given its output ``p`` and the upstream ``grad`` = dL/dp.

    With u = p ** (2 - alpha) on the support of p (0 elsewhere), the Jacobian is
    diag(u) - u u^T / sum(u), so dL/dx = u * (grad - (u . grad) / sum(u)); it is zero off
    the support and on all-masked rows.  Returned in p's shape and in the wider dtype of
    p and grad (float16/bfloat16 kept, computed in float32 or wider).

    >>> import entmax_ref as er
    >>> er.entmax_vjp([0.0, 0.25, 0.75], [1.0, 0.0, 0.0], alpha=2).tolist()
    [0.0, 0.0, 0.0]
    >>> er.entmax_vjp([0.0, 0.25, 0.75], [0.0, 1.0, 0.0], alpha=2).tolist()
    [0.0, 0.5, -0.5]
    """
    rp, p2, g2 = pair_rows(p, grad, axis)
    be = resolve_backend(backend, p2, g2)
    a = V.alpha_rows(alpha, rp, xp_of(p2))
    # rows of length 0 have nothing to differentiate (engines are not asked about them)
    dx = be.entmax_vjp(p2, g2, a) if p2.shape[1] else xp_of(p2).zeros(p2.shape, p2.dtype)
    return rp.restore(dx)


@public
def entmax_alpha_vjp(p, grad, alpha=1.5, axis=-1, *, backend=None):
    """dL/dalpha per row (``p``'s shape without ``axis``), float64.

    With u = p ** (2 - alpha) and l_i = log p_i on the support,
    dp_i/dalpha = p_i c_i - u_i (sum_j p_j c_j) / sum_j u_j where
    c_i = -l_i**2 * h(-(alpha - 1) l_i) and h(w) = (exp(w) - 1 - w) / w**2.  This equals
    Correia et al. (2019)'s (p - p~)/(alpha-1)**2 - (p log p - p~ H)/(alpha-1) but has no
    cancellation, and is continuous through alpha = 1, where dp_i/dalpha =
    p_i (sum_j p_j l_j**2 - l_i**2) / 2.

    >>> import entmax_ref as er
    >>> float(er.entmax_alpha_vjp([0.5, 0.5], [1.0, 0.0], alpha=1.5))
    0.0
    """
    rp, p2, g2 = pair_rows(p, grad, axis)
    be = resolve_backend(backend, p2, g2)
    a = V.alpha_rows(alpha, rp, xp_of(p2))
    da = be.entmax_alpha_vjp(p2, g2, a) if p2.shape[1] else xp_of(p2).zeros(p2.shape[0])
    return rp.per_row(da)


@public
def entmax_jacobian(p, alpha=1.5, axis=-1, *, backend=None):
    """The explicit Jacobian dp/dx, shape p's batch shape + (n, n).

    J = diag(u) - u u^T / sum(u), u = p ** (2 - alpha) on the support: symmetric, with
    J 1 = 0.  Built from the VJP (row i of J is the VJP of the i-th unit vector), so it
    is exactly what :func:`entmax_vjp` computes.  Returned in p's dtype (float16/bfloat16
    kept); a 0-d p gives a 0-d J.

    >>> import entmax_ref as er
    >>> er.entmax_jacobian([0.0, 0.25, 0.75], alpha=2).tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.5, -0.5], [0.0, -0.5, 0.5]]
    """
    rp = V.to_rows(p, axis, "p", allow_neg_inf=False)
    xp = xp_of(rp.data)
    rows, n = rp.data.shape
    be = resolve_backend(backend, rp.data)
    a = V.alpha_rows(alpha, rp, xp)
    p_rep = xp.ascontiguousarray(xp.repeat(rp.data, n, axis=0))
    eye = xp.ascontiguousarray(xp.tile(xp.eye(n, dtype=rp.data.dtype), (rows, 1)))
    jac = be.entmax_vjp(p_rep, eye, xp.repeat(a, n)) if n else p_rep
    jac = jac.reshape(() if rp.scalar else rp.batch_shape + (n, n))
    return V.cast(jac, rp.out_dtype)
