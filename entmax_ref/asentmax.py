"""ASEntmax and SSMax: alpha-entmax with a length-dependent temperature.

The scale of a row that may attend ``n`` positions is

    s = delta + beta * log(n + offset) ** gamma

(Vasylenko et al., "Long-Context Generalization with Sparse Attention"): with the default
``offset = 1`` a causal row at 0-based position i (n = i + 1) uses log(i + 2), as the
paper's code does.  ASEntmax is alpha-entmax of ``s * x``; SSMax (Nakanishi 2025) is
softmax of ``beta * log(n + offset) * x``, i.e. delta = 0, gamma = 1, alpha = 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import _validate as V
from ._repr import short_repr
from ._interop import public
from .gradients import entmax_vjp
from .transforms import entmax


class ScaleGrads(NamedTuple):
    """Gradients of a loss with respect to the scale parameters, each shaped as given."""

    dbeta: Any
    dgamma: Any
    ddelta: Any

    __repr__ = short_repr


class ASEntmaxGrads(NamedTuple):
    """Gradients of :func:`asentmax`: dx has x's shape, the others the shapes given."""

    dx: Any
    dbeta: Any
    dgamma: Any
    ddelta: Any

    __repr__ = short_repr


class SSMaxGrads(NamedTuple):
    """Gradients of :func:`ssmax`: dx has x's shape, dbeta the shape of beta."""

    dx: Any
    dbeta: Any

    __repr__ = short_repr


@dataclass(frozen=True)
class ASEntmaxInfo:
    """Per-row facts of an :func:`asentmax` call (x's shape without the axis).

    Attributes
    ----------
    tau : threshold of the scaled row s * x, in :func:`entmax_ref.entmax`'s units.
    support : number of nonzero probabilities.
    s : the scale of the row (NaN for a row with no finite entry, where it is undefined).
    n : number of finite entries of the row.
    """

    tau: Any
    support: Any
    s: Any
    n: Any

    __repr__ = short_repr


def real_param(a: Any, name: str, xp: Any = np) -> Any:
    """A real float64 parameter in namespace ``xp`` (host values are moved there explicitly)."""
    if xp is np:
        arr = V.real_array(a, name)
    else:
        arr = xp.asarray(a)
        if not V.is_real_dtype(arr.dtype) or arr.dtype.kind == "b":
            raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    V.check_finite(arr, name, allow_neg_inf=False)
    return arr


def broadcast_params(named: dict[str, np.ndarray], target: tuple | None = None) -> tuple:
    """The common shape of the named arrays (and ``target``, which must not grow)."""
    shapes = [a.shape for a in named.values()]
    try:
        shape = np.broadcast_shapes(*shapes, *([target] if target is not None else []))
    except ValueError:
        parts = ", ".join(f"{k} {a.shape}" for k, a in named.items())
        extra = f" and the row shape {target}" if target is not None else ""
        raise ValueError(f"shapes do not broadcast: {parts}{extra}") from None
    if target is not None and shape != tuple(target):
        parts = ", ".join(f"{k} {a.shape}" for k, a in named.items())
        raise ValueError(f"{parts} must broadcast to the row shape {tuple(target)}, not grow it to {shape}")
    return shape


def reduce_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a broadcast gradient back to ``shape`` (the adjoint of np.broadcast_to)."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead > 0 else g
    axes = tuple(i for i, (gs, s) in enumerate(zip(g.shape, shape)) if s == 1 and gs != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _where(idx: tuple, what: str) -> str:
    return f"{what} {idx}"


def _scale_parts(n, beta, gamma, delta, offset, live=None, what="n at index"):
    """Validated float64 parameters and L = log(n + offset), broadcast together.

    ``live`` (a boolean mask broadcastable with n) marks the entries whose scale is used;
    the domain and overflow checks apply there only, and L is 1 elsewhere (a row with
    nothing to attend has no scale; its value must not fail the call)."""
    xp = V.namespace(n, beta, gamma, delta, offset, live)
    n = real_param(n, "n", xp)
    beta, gamma, delta = real_param(beta, "beta", xp), real_param(gamma, "gamma", xp), real_param(delta, "delta", xp)
    off = real_param(offset, "offset", xp)
    if off.ndim:
        raise ValueError(f"offset must be a scalar, got shape {off.shape}")
    if bool(xp.any(n < 0)):
        raise ValueError(f"n must be >= 0, got {float(n[n < 0].ravel()[0])!r}")
    shape = broadcast_params({"n": n, "beta": beta, "gamma": gamma, "delta": delta})
    use = xp.ones(shape, dtype=bool) if live is None else xp.broadcast_to(xp.asarray(live), shape)
    arg = xp.broadcast_to(n + off, shape)
    bad = use & (arg <= 1.0)  # log(n + offset) <= 0
    if bool(xp.any(bad)):
        idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad)), shape))
        raise ValueError(
            f"log(n + offset) must be > 0 for (log(n + offset)) ** gamma to be defined; got "
            f"n + offset = {float(arg[idx])!r} at {_where(idx, what)} (use offset > 1 - min(n))"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        log_n = xp.where(use, xp.log(xp.where(use, arg, np.e)), 1.0)
    return n, beta, gamma, delta, log_n, use


def _scale_of(n, beta, gamma, delta, log_n, use, what):
    """s = delta + beta * L ** gamma where ``use`` (1 elsewhere); ValueError naming the
    parameters and the first entry where it is not a finite float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = delta + beta * log_n ** gamma
    xp = V.namespace(s)
    s = xp.where(use, s, 1.0)
    bad = ~xp.isfinite(s)
    if bool(xp.any(bad)):
        idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad)), s.shape))

        def at(a):
            return float(xp.broadcast_to(a, s.shape)[idx])

        raise ValueError(
            f"the ASEntmax scale delta + beta * log(n + offset) ** gamma overflows float64 at "
            f"{_where(idx, what)}: beta = {at(beta)!r}, gamma = {at(gamma)!r}, delta = {at(delta)!r}, "
            f"n = {at(n)!r}; use smaller beta, gamma or delta"
        )
    return s


@public
def asentmax_scale(n, beta, gamma, delta=1.0, offset=1.0):
    """The ASEntmax scale ``s = delta + beta * log(n + offset) ** gamma``, float64.

    Parameters
    ----------
    n : array_like
        Number of positions a row may attend (>= 0), e.g. ``i + 1`` for a causal row at
        0-based position i.
    beta, gamma, delta : array_like
        Finite; all four arrays broadcast together (per head, per token, ...).
    offset : float
        The constant c in log(n + c); the paper's code uses 1, i.e. log(i + 2).

    Returns
    -------
    s : float64 array of the broadcast shape of n, beta, gamma and delta.

    Raises
    ------
    ValueError: NaN/inf inputs, n < 0, log(n + offset) <= 0 (the power is then undefined
    for real gamma), shapes that do not broadcast, and a scale that overflows float64
    (huge beta, gamma or delta: the message names them and the index); never returns inf.

    Examples
    --------
    >>> import numpy as np, entmax_ref as er
    >>> float(er.asentmax_scale(np.e - 1, beta=2.0, gamma=3.0))  # 1 + 2 * log(e) ** 3
    3.0
    >>> er.asentmax_scale([1, 3], beta=1.0, gamma=1.0, delta=0.0).round(4).tolist()  # log 2, log 4
    [0.6931, 1.3863]
    """
    n, beta, gamma, delta, log_n, use = _scale_parts(n, beta, gamma, delta, offset)
    return _scale_of(n, beta, gamma, delta, log_n, use, "n at index")


@public
def asentmax_scale_vjp(grad_s, n, beta, gamma, delta=1.0, offset=1.0):
    """Gradients of a loss through :func:`asentmax_scale`, given ``grad_s = dL/ds``.

    With L = log(n + offset): ds/dbeta = L ** gamma, ds/dgamma = beta * L ** gamma * log(L),
    ds/ddelta = 1.  Each gradient is summed over the axes its parameter was broadcast
    along, so it has the parameter's own shape.

    Returns
    -------
    ScaleGrads(dbeta, dgamma, ddelta), float64 arrays shaped as beta, gamma and delta.

    Examples
    --------
    >>> import numpy as np, entmax_ref as er
    >>> g = er.asentmax_scale_vjp([1.0, 1.0], [np.e - 1, np.e - 1], beta=2.0, gamma=3.0)
    >>> float(g.dbeta), float(g.dgamma), float(g.ddelta)  # L = 1: L**3 = 1, log L = 0
    (2.0, 0.0, 2.0)
    """
    return scale_vjp(grad_s, n, beta, gamma, delta, offset)


def scale_vjp(grad_s, n, beta, gamma, delta, offset, live=None, what="n at index", finite=True):
    """``finite=False``: grad_s is not checked for NaN/inf (attention_vjp with
    ``check_finite=False``, where a non-finite input reaches the scale's gradient)."""
    n, beta, gamma, delta, log_n, use = _scale_parts(n, beta, gamma, delta, offset, live, what)
    _scale_of(n, beta, gamma, delta, log_n, use, what)
    xp = V.namespace(log_n)
    g = real_param(grad_s, "grad_s", xp) if finite else xp.asarray(grad_s).astype(np.float64)
    shape = broadcast_params({"grad_s": g, "n": n, "beta": beta, "gamma": gamma, "delta": delta})
    g = xp.where(xp.broadcast_to(use, shape), xp.broadcast_to(g, shape), 0.0)
    power = log_n ** gamma
    return ScaleGrads(
        reduce_to(g * power, beta.shape),
        reduce_to(g * beta * power * xp.log(log_n), gamma.shape),
        reduce_to(g, delta.shape),
    )


def _row_setup(x, axis, beta, gamma, delta, offset):
    """x's rows (float64 view for the scaling), n per row, s per row (1 where n = 0)."""
    rows = V.to_rows(x, axis, "x")
    data = rows.data.astype(np.float64, copy=False)
    xp = V.namespace(data)
    n = xp.isfinite(data).sum(axis=1).reshape(rows.batch_shape)
    params = {"beta": real_param(beta, "beta", xp), "gamma": real_param(gamma, "gamma", xp), "delta": real_param(delta, "delta", xp)}
    broadcast_params(params, rows.batch_shape)
    live = n > 0
    s = row_scale(n, params, offset, live)
    return rows, data, n, live, params, s


def row_scale(n, params, offset, live, what="row"):
    """The scale of each row (``live``: rows with something to attend; 1 elsewhere),
    broadcast to n's shape; the domain and overflow checks name the row."""
    n, beta, gamma, delta, log_n, use = _scale_parts(n, params["beta"], params["gamma"], params["delta"],
                                                     offset, live, what)
    xp = V.namespace(log_n)
    return xp.ascontiguousarray(xp.broadcast_to(_scale_of(n, beta, gamma, delta, log_n, use, what), n.shape))


def _scaled(data: np.ndarray, s_rows: np.ndarray, batch_shape: tuple = ()) -> np.ndarray:
    """s * x per row with masked (-inf) entries kept -inf whatever the sign of s; a
    ValueError naming the row when the product overflows float64."""
    xp = V.namespace(data)
    finite = xp.isfinite(data)
    with np.errstate(invalid="ignore", over="ignore"):
        z = xp.where(finite, data * s_rows.reshape(-1, 1), -np.inf)
    bad = finite & ~xp.isfinite(z)
    if bool(xp.any(bad)):
        r = int(xp.argmax(bad.any(axis=1)))
        idx = tuple(int(i) for i in np.unravel_index(r, batch_shape)) if batch_shape else ()
        raise ValueError(
            f"s * x overflows float64 on {_where(idx, 'row')} (scale s = {float(s_rows.reshape(-1)[r])!r} "
            "from beta, gamma, delta); use smaller beta, gamma or delta"
        )
    return z


@public
def asentmax(x, alpha=1.5, *, beta, gamma, delta=1.0, offset=1.0, axis=-1, backend=None,
             return_info=False):
    """ASEntmax: alpha-entmax of ``s * x`` along ``axis``, with a length-dependent scale.

    Each row uses ``s = delta + beta * log(n + offset) ** gamma``
    (:func:`asentmax_scale`), where ``n`` is the number of finite entries of the row
    (-inf entries are masked and count as absent).  The transform itself is
    :func:`entmax_ref.entmax` on the scaled row, so it is exact in the same sense.

    Parameters
    ----------
    x : array_like
        Scores; -inf masks an entry.  float32 in gives float32 out (the scaled row is
        formed and solved in float64).
    alpha : float or array_like
        alpha >= 1, scalar or one per row (as in :func:`entmax_ref.entmax`).
    beta, gamma, delta : array_like
        Broadcast against the row shape (x's shape without ``axis``): a scalar, one per
        head, one per head and token, ...  They must not enlarge it.
    offset : float
        The c in log(n + c) (1 in the paper's code).
    axis : int
        The axis that sums to 1.
    backend : str or None
        See :func:`entmax_ref.use_backend`.
    return_info : bool
        Also return :class:`ASEntmaxInfo` (tau, support, s and n per row).

    Returns
    -------
    p : x's shape and dtype, or ``(p, info)``.

    Raises
    ------
    ValueError: NaN/+inf in x, NaN/inf in beta, gamma, delta, non-broadcastable
    parameters, log(n + offset) <= 0 on a row with n > 0 finite entries (rows with none
    are never evaluated: they give zeros), a scale or scaled row s * x that overflows
    float64 (the message names beta, gamma, delta and the row).

    Examples
    --------
    Two finite entries, so n = 2 and with offset = e - 2 the scale is
    1 + 1 * log(e) ** gamma = 2: sparsemax of (0, 0.5) scaled by 2 is (0.25, 0.75).

    >>> import numpy as np, entmax_ref as er
    >>> er.asentmax([0.0, 0.25, -np.inf], alpha=2, beta=1.0, gamma=0.5, offset=np.e - 2).tolist()
    [0.25, 0.75, 0.0]
    """
    rows, data, n, live, _, s = _row_setup(x, axis, beta, gamma, delta, offset)
    a = V.alpha_rows(alpha, rows)
    res = entmax(_scaled(data, s, rows.batch_shape), a, -1, backend=backend, return_info=return_info)
    p2, info = res if return_info else (res, None)
    p = rows.restore(p2)
    if not return_info:
        return p
    s_info = V.namespace(s).where(live, s, np.nan)
    support = rows.per_row((p2.astype(rows.out_dtype, copy=False) > 0).sum(axis=1))  # what the caller counts
    return p, ASEntmaxInfo(rows.per_row(info.tau), support, s_info, n)


@public
def asentmax_vjp(grad, x, alpha=1.5, *, beta, gamma, delta=1.0, offset=1.0, p=None, axis=-1,
                 backend=None):
    """Gradients of a loss through :func:`asentmax`, given ``grad = dL/dp``.

    With z = s * x and g_z = entmax_vjp(p, grad) (the alpha-entmax VJP at z):
    dL/dx = s * g_z, dL/ds = sum_j g_z,j x_j over the finite entries, and dL/ds goes
    through :func:`asentmax_scale_vjp` to beta, gamma and delta.  ``p`` is the forward's
    output; it is recomputed when omitted.  Masked entries and empty rows get 0.

    Returns
    -------
    ASEntmaxGrads(dx, dbeta, dgamma, ddelta): dx shaped and typed like x, the others
    float64 arrays shaped like beta, gamma and delta.

    Examples
    --------
    Sparsemax of 2 * (0, 0.25) is (0.25, 0.75), with Jacobian [[.5, -.5], [-.5, .5]]:
    grad (1, 0) gives dz = (.5, -.5), so dx = 2 * dz and ds = .5 * 0 - .5 * .25.

    >>> import numpy as np, entmax_ref as er
    >>> g = er.asentmax_vjp([1.0, 0.0], [0.0, 0.25], alpha=2, beta=1.0, gamma=0.5, offset=np.e - 2)
    >>> g.dx.tolist(), float(g.dbeta), float(g.ddelta)
    ([1.0, -1.0], -0.125, -0.125)
    """
    rows, data, n, live, params, s = _row_setup(x, axis, beta, gamma, delta, offset)
    a = V.alpha_rows(alpha, rows)
    if p is None:
        p2 = entmax(_scaled(data, s, rows.batch_shape), a, -1, backend=backend).astype(np.float64, copy=False)
    else:
        rp = V.to_rows(p, axis, "p", allow_neg_inf=False)
        V.same_shape(rows, rp, ("x", "p"))
        p2 = rp.data.astype(np.float64, copy=False)
    rg = V.to_rows(grad, axis, "grad", allow_neg_inf=False)
    V.same_shape(rows, rg, ("x", "grad"))
    dz = entmax_vjp(p2, rg.data.astype(np.float64, copy=False), a, -1, backend=backend)
    xp = V.namespace(data)
    finite = xp.isfinite(data)
    dx = xp.where(finite, dz * s.reshape(-1, 1), 0.0)
    ds = xp.where(finite, dz * xp.where(finite, data, 0.0), 0.0).sum(axis=1).reshape(rows.batch_shape)
    ds = xp.where(live, ds, 0.0)
    grads = scale_vjp(ds, n, params["beta"], params["gamma"], params["delta"], offset, live, "row")
    out = rows.like(V.result_dtype(rows.out_dtype, rg.out_dtype))
    return ASEntmaxGrads(out.restore(dx), *grads)


@public
def ssmax(x, *, beta, offset=1.0, axis=-1, backend=None, return_info=False):
    """Scalable softmax (SSMax, Nakanishi 2025): softmax of ``beta * log(n + offset) * x``.

    ``n`` is the number of finite entries of the row.  This is :func:`asentmax` with
    alpha = 1, gamma = 1 and delta = 0.

    >>> import numpy as np, entmax_ref as er
    >>> er.ssmax([0.0, 1.0], beta=1.0, offset=np.e - 2).round(4).tolist()  # softmax(0, 1)
    [0.2689, 0.7311]
    """
    return asentmax(x, 1.0, beta=beta, gamma=1.0, delta=0.0, offset=offset, axis=axis,
                    backend=backend, return_info=return_info)


@public
def ssmax_vjp(grad, x, *, beta, offset=1.0, p=None, axis=-1, backend=None):
    """Gradients of a loss through :func:`ssmax`: SSMaxGrads(dx, dbeta).

    >>> import numpy as np, entmax_ref as er
    >>> g = er.ssmax_vjp([1.0, 1.0], [0.0, 1.0], beta=1.0)  # dL/dp constant: no gradient
    >>> g.dx.tolist(), float(g.dbeta)
    ([0.0, 0.0], 0.0)
    """
    g = asentmax_vjp(grad, x, 1.0, beta=beta, gamma=1.0, delta=0.0, offset=offset, p=p,
                     axis=axis, backend=backend)
    return SSMaxGrads(g.dx, g.dbeta)
