"""The alpha-entmax family: softmax, sparsemax, 1.5-entmax, any alpha >= 1, and thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._repr import short_repr
from . import _validate as V
from ._interop import public
from .backends import resolve_backend
from .backends._base import NonFiniteInput, theta_to_tau, xp_of


@dataclass(frozen=True)
class EntmaxInfo:
    """Per-row solver diagnostics; every field has the input's shape with the axis removed.

    Attributes
    ----------
    tau : threshold in the units p = [(alpha-1) x - tau]_+ ** (1/(alpha-1)) (logsumexp at
        alpha = 1); -inf for a row with nothing to attend.
    support : number of nonzero probabilities of the returned array, i.e.
        ``(p > 0).sum(axis)`` (int64).
    n_iter : iterations of the iterative solver (0 for the closed forms).
    converged : whether the solver reached full working precision.
    support_exact : size of the exact-arithmetic support {i : (alpha - 1) x_i > tau}
        (x_i > -inf at alpha = 1), which the solver found in float64.  It can exceed
        ``support`` when the input dtype is narrower than float64 and a tiny
        probability rounds to 0 (float32 x = [0, -120, -1e-3] at alpha = 1:
        support_exact 3, support 2).
    """

    tau: Any
    support: Any
    n_iter: Any
    converged: Any
    support_exact: Any = None

    __repr__ = short_repr


@public
def entmax(x, alpha=1.5, axis=-1, *, method=None, backend=None, return_info=False, check_finite=True):
    r"""alpha-entmax along ``axis``: the maximiser over the simplex of ``<p, x> + H_alpha(p)``.

    H_alpha is the Tsallis alpha-entropy (Shannon at alpha = 1), so alpha = 1 is softmax,
    alpha = 2 sparsemax and alpha -> inf argmax.  The solution has the threshold form
    p_i = [(alpha - 1) x_i - tau]_+ ** (1 / (alpha - 1)) with tau chosen so sum p = 1;
    entries with (alpha - 1) x_i <= tau are exactly 0.

    Parameters
    ----------
    x : array_like
        Scores; -inf masks an entry (probability exactly 0).  An all -inf row gives zeros.
    alpha : float or array_like
        Any finite alpha >= 1: a scalar, or one per row (x's shape without ``axis``, or
        broadcastable to it).
    axis : int
        The axis that sums to 1.
    method : {None, "sort", "bisect", "newton"}
        The algorithm; one name means one algorithm on every backend.  None: the
        backend's exact default (closed form / sort for alpha in {1, 1.5, 2}; a
        full-precision root finder otherwise).  "sort": the sort-based threshold, for
        alpha in {1, 1.5, 2} (numpy).  "bisect" halves the threshold bracket
        [max x - 1/(alpha-1) ..] to the last bit (every backend).  "newton": safeguarded
        Newton for every alpha (numba).  Which backend has which method is the table in
        :mod:`entmax_ref.backends.capabilities`: an unknown name is a ValueError listing
        the backend's methods, a method the backend lacks a NotImplementedError naming
        the backends that have it.
    backend : str or None
        "numpy", "numba", "cupy", "auto" or None (see :func:`entmax_ref.use_backend`).
    return_info : bool
        Also return an :class:`EntmaxInfo` (tau, support, n_iter, converged per row).
    check_finite : bool
        Reject NaN and +inf in x (ValueError naming the first).  Turn off only for speed
        on inputs known to be clean.

    Returns
    -------
    p : array, x's shape and dtype (float16/bfloat16 are computed in float32; integers
        become float64; a 0-d x gives a 0-d p), in the caller's array type (a torch
        tensor for a torch tensor, see docs/conventions.md).  ``(p, info)`` when
        ``return_info``.

    Raises
    ------
    ValueError
        NaN/+inf in x, alpha NaN/inf/< 1 or not broadcastable, axis out of range, an
        unknown ``method``.
    TypeError
        Complex, bool, object or string input; a NumPy masked array; a ``backend`` that is
        neither a name nor a backend.
    NotImplementedError
        ``method`` exists, but not on this backend (or "sort" with another alpha).

    Notes
    -----
    No output is renormalised: p is exactly the threshold form at the returned tau,
    which the backend solved to full working precision.

    Examples
    --------
    >>> import entmax_ref as er
    >>> er.entmax([-2.0, 0.0, 0.5], alpha=2).tolist()
    [0.0, 0.25, 0.75]
    >>> p, info = er.entmax([-2.0, 0.0, 0.5], alpha=1.5, return_info=True)
    >>> p.round(4).tolist(), int(info.support)
    ([0.0, 0.326, 0.674], 2)
    """
    rows = V.to_rows(x, axis, "x", finite=False)
    be = resolve_backend(backend, rows.data)
    # a backend whose kernels read every entry anyway (numba) scans x in that pass: one
    # pass over the input instead of two
    scanned = getattr(be, "entmax_forward_scanned", None) if check_finite else None
    if check_finite and scanned is None:
        V.check_finite(rows.source, "x", allow_neg_inf=True)
    a = V.alpha_rows(alpha, rows, xp_of(rows.data))
    if scanned is None:
        res = be.entmax_forward(rows.data, a, method)
    else:
        try:
            res = scanned(rows.data, a, method)
        except NonFiniteInput:
            V.check_finite(rows.source, "x", allow_neg_inf=True)  # raises, naming the entry
            raise
    p = rows.restore(res.p)
    if not return_info:
        return p
    tau = getattr(res, "tau", None)  # an ExactRowSolve's correctly rounded tau
    if tau is None:  # converted from theta; a float32 row's rounded to float32, as its p
        tau = theta_to_tau(res.theta, a)
        xp = xp_of(res.p)
        if res.p.dtype == xp.float32:
            with np.errstate(over="ignore"):  # beyond float32's range: +-inf, its nearest
                tau = tau.astype(xp.float32).astype(xp.float64)
    support = (res.p.astype(rows.out_dtype, copy=False) > 0).sum(axis=1)  # what the caller counts
    fields = (tau, support.astype(res.support.dtype), res.n_iter, res.converged, res.support)
    return p, EntmaxInfo(*(rows.per_row(f) for f in fields))


@public
def softmax(x, axis=-1, *, backend=None, return_info=False, check_finite=True):
    """Softmax, alpha-entmax at alpha = 1 (tau = logsumexp).

    >>> import entmax_ref as er
    >>> er.softmax([0.0, 0.0]).tolist()
    [0.5, 0.5]
    """
    return entmax(x, 1.0, axis, backend=backend, return_info=return_info, check_finite=check_finite)


@public
def sparsemax(x, axis=-1, *, backend=None, return_info=False, check_finite=True):
    """Sparsemax, alpha-entmax at alpha = 2: the Euclidean projection of x onto the simplex.

    >>> import entmax_ref as er
    >>> er.sparsemax([-2.0, 0.0, 0.5]).tolist()
    [0.0, 0.25, 0.75]
    """
    return entmax(x, 2.0, axis, backend=backend, return_info=return_info, check_finite=check_finite)


@public
def entmax15(x, axis=-1, *, backend=None, return_info=False, check_finite=True):
    """1.5-entmax (Peters et al. 2019): p = [x/2 - tau]_+ ** 2.

    >>> import entmax_ref as er
    >>> er.entmax15([-2.0, 0.0, 0.5]).round(4).tolist()
    [0.0, 0.326, 0.674]
    """
    return entmax(x, 1.5, axis, backend=backend, return_info=return_info, check_finite=check_finite)


@public
def entmax_threshold(x, alpha=1.5, axis=-1, *, method=None, backend=None, check_finite=True):
    """The threshold tau of :func:`entmax` per row (x's shape without ``axis``), float64.

    p = [(alpha - 1) x - tau]_+ ** (1/(alpha - 1)); at alpha = 1, tau = logsumexp(x).

    >>> import entmax_ref as er
    >>> float(er.entmax_threshold([-2.0, 0.0, 0.5], alpha=2))
    -0.25
    """
    _, info = entmax(x, alpha, axis, method=method, backend=backend, return_info=True, check_finite=check_finite)
    return info.tau
