"""Per-row diagnostics of attention distributions: the quantities the paper's claims use.

Normalised entropy H(p) / log n (1 = uniform over all n candidates, 0 = one-hot), support
size, largest probability and the mass on a set of positions (e.g. the "relevant" keys).
``n`` is the number of candidates of the row: the finite entries of the scores the row
came from (pass ``scores=``), an explicit ``n=``, or by default the length of the axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._repr import short_repr
from . import _validate as V
from ._interop import public


@dataclass(frozen=True)
class RowDiagnostics:
    """Per-row diagnostics, each shaped like p without ``axis``.

    Attributes
    ----------
    entropy : Shannon entropy H(p) = -sum p log p in nats (float64).
    normalized_entropy : H(p) / log n (0 where n <= 1).
    support : number of nonzero probabilities (int64).
    max_prob : largest probability (float64).
    n : number of candidates used for the normalisation (int64).
    mass : mass on ``positions`` (float64), or None when no positions were given.
    """

    entropy: Any
    normalized_entropy: Any
    support: Any
    max_prob: Any
    n: Any
    mass: Any = None

    __repr__ = short_repr


def _prob_rows(p: Any, axis: int) -> V.Rows:
    """p as float64 rows, checked to be distributions: entries >= 0, each row summing to 1
    within 4 n eps of p's own dtype, or all zero (a row with nothing to attend)."""
    rows = V.to_rows(p, axis, "p", allow_neg_inf=False, dtype=np.dtype(np.float64))
    xp = V.namespace(rows.data)
    if bool(xp.any(rows.data < 0)):
        raise ValueError("p must be non-negative (a probability distribution per row)")
    n = rows.data.shape[1]
    total = rows.data.sum(axis=1)
    tol = 4 * max(n, 1) * V.eps_of(rows.out_dtype)
    bad = (xp.abs(total - 1.0) > tol) & (total != 0.0)
    if bool(xp.any(bad)):
        i = int(xp.argmax(bad))
        raise ValueError(
            f"p must hold a probability distribution per row (summing to 1 within {tol:.1e}, or all "
            f"zero for a row with nothing to attend); row {i} sums to {float(total[i])!r}"
        )
    return rows


def _candidates(rows: V.Rows, n: Any, scores: Any, axis: int) -> np.ndarray:
    if n is not None and scores is not None:
        raise ValueError("give n or scores, not both")
    xp = V.namespace(rows.data)
    if scores is not None:
        rs = V.to_rows(scores, axis, "scores")
        V.same_shape(rows, rs, ("p", "scores"))
        return xp.isfinite(rs.data).sum(axis=1).astype(np.int64)
    if n is None:
        return xp.full(rows.data.shape[0], rows.data.shape[1], np.int64)
    arr = xp.asarray(n)
    if arr.dtype.kind not in "iu" or bool(xp.any(arr < 0)):
        raise ValueError(f"n must be non-negative integers, got {arr!r}")
    try:
        return xp.ascontiguousarray(xp.broadcast_to(arr, rows.batch_shape), np.int64).reshape(-1)
    except ValueError:
        raise ValueError(f"n of shape {arr.shape} does not broadcast to the row shape {rows.batch_shape}") from None


def _entropy(p2: np.ndarray) -> np.ndarray:
    xp = V.namespace(p2)
    logp = xp.log(xp.where(p2 > 0, p2, 1.0))
    return 0.0 - (p2 * logp).sum(axis=1)  # 0.0 - 0.0 = +0.0 for one-hot rows


@public
def normalized_entropy(p, *, n=None, scores=None, axis=-1):
    """H(p) / log n per row, in [0, 1] when p has at most n nonzeros; 0 where n <= 1.

    ``n`` (the number of candidates) is the number of finite ``scores`` of the row when
    they are given, else ``n``, else the length of ``axis``.

    >>> import numpy as np, entmax_ref as er
    >>> er.normalized_entropy([[0.25] * 4, [1.0, 0, 0, 0]]).tolist()
    [1.0, 0.0]
    >>> float(er.normalized_entropy([0.5, 0.5, 0, 0]))  # log 2 / log 4
    0.5
    """
    rows = _prob_rows(p, axis)
    nn = _candidates(rows, n, scores, axis)
    return rows.per_row(_normalised(_entropy(rows.data), nn))


def _normalised(h: Any, nn: Any) -> Any:
    """H / log n, 0 where n <= 1."""
    xp = V.namespace(h)
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.where(nn > 1, h / xp.log(xp.maximum(nn, 2)), 0.0)


@public
def support_size(p, *, axis=-1):
    """Number of nonzero probabilities per row (int64).

    >>> import entmax_ref as er
    >>> er.support_size([[0.0, 0.25, 0.75]]).tolist()
    [2]
    """
    rows = _prob_rows(p, axis)
    return rows.per_row((rows.data > 0).sum(axis=1).astype(np.int64))


@public
def max_probability(p, *, axis=-1):
    """The largest probability of each row (float64).

    >>> import entmax_ref as er
    >>> float(er.max_probability([0.0, 0.25, 0.75]))
    0.75
    """
    rows = _prob_rows(p, axis)
    return rows.per_row(_max_prob(rows.data))


def _max_prob(data):
    """The largest entry of each row of probabilities, 0 for rows of length 0 (without
    ``max(initial=)``, which CuPy's arrays do not take)."""
    return data.max(axis=1) if data.shape[1] else V.namespace(data).zeros(len(data))


def _position_mask(rows: V.Rows, positions: Any) -> np.ndarray:
    """positions as a boolean (rows, n) mask: a boolean array broadcastable to p, or
    integer indices along the axis (negative ones count from the end)."""
    xp = V.namespace(rows.data)
    pos = xp.asarray(positions)
    n = rows.shape[rows.axis]
    if pos.dtype == bool:
        try:
            full = xp.broadcast_to(pos, rows.shape)
        except ValueError:
            raise ValueError(f"positions mask of shape {pos.shape} does not broadcast to p's shape {rows.shape}") from None
        return xp.ascontiguousarray(xp.moveaxis(full, rows.axis, -1)).reshape(-1, n)
    if pos.dtype.kind not in "iu" or pos.ndim > 1:
        raise ValueError("positions must be a boolean mask or a 1-D sequence of integer indices")
    if bool(xp.any((pos < -n) | (pos >= n))):
        raise ValueError(f"positions {pos.tolist()} out of range for an axis of length {n}")
    mask = xp.zeros(n, bool)
    mask[pos] = True
    return xp.broadcast_to(mask, rows.data.shape)


@public
def mass_on(p, positions, *, axis=-1):
    """Total probability on ``positions`` per row (float64).

    ``positions`` is a 1-D sequence of indices along ``axis`` (the same for every row)
    or a boolean mask broadcastable to p (per row).

    >>> import entmax_ref as er
    >>> float(er.mass_on([0.25, 0.25, 0.5], [0, 2]))
    0.75
    """
    rows = _prob_rows(p, axis)
    mask = _position_mask(rows, positions)
    return rows.per_row(V.namespace(rows.data).where(mask, rows.data, 0.0).sum(axis=1))


@public
def row_diagnostics(p, *, n=None, scores=None, positions=None, axis=-1) -> RowDiagnostics:
    """All diagnostics of :class:`RowDiagnostics` at once (see the single functions).

    >>> import entmax_ref as er
    >>> d = er.row_diagnostics([0.5, 0.5, 0.0, 0.0], positions=[1])
    >>> float(d.normalized_entropy), int(d.support), float(d.max_prob), float(d.mass)
    (0.5, 2, 0.5, 0.5)
    """
    rows = _prob_rows(p, axis)
    nn = _candidates(rows, n, scores, axis)
    h = _entropy(rows.data)
    hn = _normalised(h, nn)
    mass = None
    if positions is not None:
        mass = rows.per_row(V.namespace(rows.data).where(_position_mask(rows, positions), rows.data, 0.0).sum(axis=1))
    return RowDiagnostics(
        rows.per_row(h), rows.per_row(hn), rows.per_row((rows.data > 0).sum(axis=1).astype(np.int64)),
        rows.per_row(_max_prob(rows.data)), rows.per_row(nn), mass,
    )
