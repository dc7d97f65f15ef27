"""The backward's residual from a forward: an :class:`~entmax_ref.AttentionInfo` passed as
``info=`` (checked against the call: the same alpha, masks and shapes) or the forward's
``tau`` (converted to the backends' x-space threshold)."""

from __future__ import annotations

import numpy as np

from . import _validate as V
from .backends._base import AttentionResidual, tau_to_theta


def info_alpha(prob):
    """AttentionInfo.alpha: the call's alpha as a float, or per query head as a tuple of
    Hq floats when the heads' alphas differ (host values, like alpha itself)."""
    if prob.spec.head_alpha is None:
        return prob.spec.alpha
    return tuple(float(a) for a in prob.spec.head_alpha)


def residual_from_info(info, prob, shape: tuple):
    """(AttentionResidual, skew) of a forward's :class:`~entmax_ref.AttentionInfo`, checked
    against the problem (the attention's validated call): the same alpha, the same keys per row (masks), arrays of the right shape."""
    if info.theta is None or info.alpha is None:
        raise ValueError("info has no residual (theta, edge); pass the AttentionInfo returned by er.attention")
    Hq = shape[1]
    given = info_alpha(prob)
    try:
        same = bool(np.array_equal(np.broadcast_to(np.asarray(info.alpha, np.float64), (Hq,)),
                                   np.broadcast_to(np.asarray(given, np.float64), (Hq,))))
    except ValueError:  # not broadcastable to the heads of this call
        same = False
    if not same:
        raise ValueError(f"info comes from a forward with alpha={info.alpha!r}, but alpha={given!r} was given")
    fields = {"theta": info.theta, "row_max": info.row_max, "edge": info.edge, "edge_p": info.edge_p}
    for name, a in fields.items():
        if a is None or tuple(a.shape) != shape:
            got = None if a is None else tuple(a.shape)
            raise ValueError(f"info.{name} must have shape {shape} (the rows of this call), got {got}")
    if tuple(getattr(info.n, "shape", ())) != shape or not bool(V.namespace(prob.n).all(info.n == prob.n)):
        raise ValueError("info.n (keys per row) differs from this call's: causal / key_lengths differ from the forward's")
    skew = info.skew
    B, Hq, Nq = shape
    if skew is None or tuple(skew.shape)[:3] != shape or tuple(skew.shape)[3] != prob.v.shape[3]:
        raise ValueError(f"info.skew must have shape {shape + (prob.v.shape[3],)}")
    keys = info.support_keys
    if keys is not None and (getattr(keys, "ndim", 0) != 4 or tuple(keys.shape)[:3] != shape
                             or keys.shape[3] < 1 or getattr(keys, "dtype", None) != np.int32):
        raise ValueError(f"info.support_keys must be None or int32 of shape {shape} + (width >= 1,), got "
                         f"{getattr(keys, 'dtype', type(keys).__name__)} {tuple(getattr(keys, 'shape', ()))}")
    return AttentionResidual(info.theta, info.row_max, info.edge, info.edge_p, keys), skew


def any_big(prob) -> bool:
    """Whether some head has alpha > 2 (its rows need the edge, which tau does not carry)."""
    if prob.spec.head_alpha is None:
        return prob.spec.alpha > 2.0
    return bool(np.any(np.asarray(prob.spec.head_alpha) > 2.0))


def check_tau(tau, prob, shape: tuple):
    """theta from a forward's tau (validated: shape, NaN, -inf only on empty rows)."""
    t = V.as_array(tau, "tau")
    if tuple(t.shape) != shape:
        raise ValueError(f"tau must have shape {shape}, got {tuple(t.shape)}")
    V.check_finite(t, "tau", allow_neg_inf=True)
    t = t.astype(np.float64)
    xp = V.namespace(t)
    empty = prob.n == 0
    if bool(xp.any(xp.isneginf(t) & ~empty)):
        raise ValueError("tau is -inf on a row that has keys to attend; pass the forward's info.tau")
    return xp.ascontiguousarray(xp.where(empty, -np.inf, tau_to_theta(t, prob.alpha_b)))
