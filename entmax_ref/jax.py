"""entmax-ref inside JAX: the library's functions with custom VJP rules, under jit, grad and vmap.

Each function computes exactly what the function of the same name in :mod:`entmax_ref`
computes (bit for bit: the same engines run on the host, at once for concrete arrays and
through ``jax.pure_callback`` when traced) and differentiates through the library's own
VJPs: the scores, an array ``alpha``, the ASEntmax parameters ``beta``, ``gamma``,
``delta`` (arrays, or Python floats under ``jax.grad``), and q, k, v.  Only first
derivatives exist: the VJP rules are not themselves differentiable, and JAX refuses
forward mode (``jax.jvp``, ``jax.hessian``) of a custom-VJP function with a TypeError (the
losses, custom JVPs, have forward mode; differentiating them in the target is a
ValueError).  The library's errors (a ``ValueError`` naming a NaN, ...) reach an eager call
and ``jax.grad`` as they are; under ``jax.jit`` the host runs inside XLA, and JAX's runtime
error carries the library's message.  A 0-d input is one row of length 1.

Arrays are computed on the host (CPU); float64 needs ``jax_enable_x64`` as anywhere in JAX
(without it the losses, float64 in the library, are returned in float32).  ``import
entmax_ref`` does not import JAX; this module does (an ImportError says how to install it).

Examples
--------
>>> import jax, jax.numpy as jnp
>>> import entmax_ref.jax as erj
>>> erj.sparsemax(jnp.array([-2.0, 0.0, 0.5])).tolist()
[0.0, 0.25, 0.75]
>>> jax.grad(lambda x: erj.sparsemax(x)[1])(jnp.array([-2.0, 0.0, 0.5])).tolist()
[0.0, 0.5, -0.5]
"""

from __future__ import annotations

from typing import Any

from ._attention_options import AttentionOptions
from .adapters import jax_attention as _att
from .adapters import jax_ops as _ops
from .adapters import number
from .adapters.jax_ops import jax, jnp

__all__ = ["attention", "attention_varlen", "asentmax", "budget_sparsemax", "entmax", "entmax15", "entmax_loss",
           "normmax", "normmax_loss", "softmax", "sparsemax", "ssmax"]


def _floating(x: Any, name: str = "x") -> Any:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating JAX array, got {x.dtype}")
    return x


def _opts(method=None, backend=None) -> tuple:
    return tuple((k, v) for k, v in (("method", method), ("backend", backend)) if v is not None)


def _is_array(a: Any) -> bool:
    return isinstance(a, jax.Array) or hasattr(a, "shape") and hasattr(a, "dtype")


def _rows(x: Any, axis: int) -> tuple:
    """(x with a row axis, that axis as a negative number, whether x was 0-d): a 0-d x is one
    row of length 1, as the library takes it; the row axis stays negative, so that a vmapped
    axis (a leading one) is one more row axis."""
    x = _floating(x)
    if x.ndim == 0:
        if axis not in (-1, 0):
            raise ValueError(f"axis {axis} is out of range for x of shape ()")
        return x[None], -1, True
    return x, _ops.negative_axis(x, axis), False


def _unrow(p: Any, scalar: bool) -> Any:
    return p[..., 0] if scalar else p


def entmax(x, alpha=1.5, axis=-1, *, method=None, backend=None):
    """alpha-entmax along ``axis`` (:func:`entmax_ref.entmax`), differentiable in x and in an
    array ``alpha`` (broadcastable to x's shape without ``axis``, or of x's shape with size 1
    along ``axis``; its gradient is the library's :func:`entmax_ref.entmax_alpha_vjp` summed
    over the rows sharing an entry).  A Python number is a constant."""
    x, axis, scalar = _rows(x, axis)
    if not _is_array(alpha):
        return _unrow(_ops.transform(x, "entmax", number(alpha, "alpha"), axis, _opts(method, backend)), scalar)
    alpha = _floating(alpha, "alpha")
    if alpha.ndim == x.ndim and not scalar and alpha.shape[axis] == 1:
        alpha = jnp.squeeze(alpha, axis)  # the keepdims form (the entmax package's): one per row
    rows = jnp.broadcast_to(alpha, _ops.rows_shape(x, axis))
    return _unrow(_ops.entmax_rows(x, rows, axis, _opts(method, backend)), scalar)


def softmax(x, axis=-1, *, backend=None):
    """Softmax (alpha = 1), differentiable (:func:`entmax_ref.softmax`)."""
    return entmax(x, 1.0, axis, backend=backend)


def entmax15(x, axis=-1, *, backend=None):
    """1.5-entmax, differentiable (:func:`entmax_ref.entmax15`)."""
    return entmax(x, 1.5, axis, backend=backend)


def sparsemax(x, axis=-1, *, backend=None):
    """Sparsemax (alpha = 2), differentiable (:func:`entmax_ref.sparsemax`)."""
    return entmax(x, 2.0, axis, backend=backend)


def normmax(x, alpha=2.0, axis=-1, *, backend=None):
    """alpha-normmax, differentiable in x (:func:`entmax_ref.normmax`)."""
    x, axis, scalar = _rows(x, axis)
    return _unrow(_ops.transform(x, "normmax", number(alpha, "alpha"), axis, _opts(None, backend)), scalar)


def budget_sparsemax(x, budget=2.0, axis=-1, *, backend=None):
    """budget-sparsemax, differentiable in x (:func:`entmax_ref.budget_sparsemax`)."""
    x, axis, scalar = _rows(x, axis)
    return _unrow(_ops.transform(x, "budget_sparsemax", number(budget, "budget"), axis, _opts(None, backend)),
                  scalar)


def _loss(kind, x, target, alpha, axis, backend):
    x, axis, scalar = _rows(x, axis)
    target = jnp.asarray(target)
    if scalar and not jnp.issubdtype(target.dtype, jnp.integer):
        target = target[None]  # a probability target of a 0-d x: one row of length 1
    return _ops.loss(x, target, kind, number(alpha, "alpha"), axis, backend)


def entmax_loss(x, target, alpha=1.5, axis=-1, *, backend=None):
    """The alpha-entmax Fenchel-Young loss per row (:func:`entmax_ref.entmax_loss`),
    differentiable in x; differentiating it in ``target`` (class indices or probabilities)
    is a ValueError."""
    return _loss("entmax", x, target, alpha, axis, backend)


def normmax_loss(x, target, alpha=2.0, axis=-1, *, backend=None):
    """The alpha-normmax Fenchel-Young loss per row (:func:`entmax_ref.normmax_loss`),
    differentiable in x (not in ``target``)."""
    return _loss("normmax", x, target, alpha, axis, backend)


def _param(v: Any) -> Any:
    """A parameter as an array: a number in float64 (float32 without x64), as the library reads it."""
    return v if isinstance(v, jax.Array) else jnp.asarray(v, _ops._float64())


def asentmax(x, alpha=1.5, *, beta, gamma, delta=1.0, offset=1.0, axis=-1, backend=None):
    """ASEntmax (:func:`entmax_ref.asentmax`), differentiable in x, beta, gamma and delta
    (their gradients are :func:`entmax_ref.asentmax_vjp`'s)."""
    x, axis, scalar = _rows(x, axis)
    b, g, d = (_param(v) for v in (beta, gamma, delta))
    return _unrow(_ops.asentmax(x, number(alpha, "alpha"), b, g, d, number(offset, "offset"), axis, backend), scalar)


def ssmax(x, *, beta, offset=1.0, axis=-1, backend=None):
    """Scalable softmax (:func:`entmax_ref.ssmax`), differentiable in x and beta."""
    return asentmax(x, 1.0, beta=beta, gamma=1.0, delta=0.0, offset=offset, axis=axis, backend=backend)


def _attention(q, k, v, cu, names):
    """The attention of the options among ``names`` (packed when ``cu`` is given)."""
    q, k, v = (_floating(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    arrays, static = AttentionOptions.encode(names)
    cu = None if cu is None else tuple(jnp.asarray(c) for c in cu)
    return _att.attention(q, k, v, cu, tuple(jnp.asarray(a) for a in arrays), static)


def attention(q, k, v, *, alpha=1.5, scale=None, causal=False, key_lengths=None, key_padding_mask=None,
              alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None, backend=None):
    """alpha-entmax attention (:func:`entmax_ref.attention`, the same arguments),
    differentiable in q, k, v and in arrays ``alpha`` (shape () or (Hq,)), ``beta``, ``gamma``
    and ``delta``; the backward is :func:`entmax_ref.attention_vjp` of the forward's
    residual, so no row is solved twice.

    >>> import jax.numpy as jnp, entmax_ref.jax as erj
    >>> q = jnp.ones((1, 1, 1, 1)); k = jnp.array([[[[0.0], [1.0]]]]); v = jnp.eye(2)[None, None]
    >>> erj.attention(q, k, v, alpha=2, scale=1.0).tolist()
    [[[[0.0, 1.0]]]]
    """
    return _attention(q, k, v, None, locals())


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, alpha=1.5, scale=None, causal=False,
                     alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None, backend=None):
    """Attention of packed variable-length sequences (:func:`entmax_ref.attention_varlen`),
    differentiable like :func:`attention`."""
    return _attention(q, k, v, (cu_seqlens_q, cu_seqlens_k), locals())
