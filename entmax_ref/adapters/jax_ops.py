"""The library's functions as JAX functions with ``jax.custom_vjp`` rules.

Every forward and backward runs on the host: at once when its arrays are concrete (an
eager call, or ``jax.grad`` without ``jit``: the library's own errors then reach the caller
as they are, a ``ValueError`` naming a NaN), else through ``jax.pure_callback`` with
declared result shapes (``jax.ShapeDtypeStruct``), so the functions work under ``jit``,
``grad`` and ``vmap`` (where an error of the library surfaces as JAX's runtime error).  Row transforms batch with ``vmap_method="broadcast_all"`` (a vmapped axis is one
more leading row axis: the row axis is kept negative and a per-row alpha is broadcast to the
rows first); ASEntmax and attention, whose parameters broadcast against their own axes,
run the callback once per vmapped element (``"sequential"``).

Attention's residual is the forward's :class:`entmax_ref.AttentionInfo` (without the numba
engine's optional support keys, which change no bit of the gradients), carried as its
8-byte entries' uint32 halves, so that it stays exact with or without ``jax_enable_x64``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - exercised in a venv without jax
    raise ImportError("entmax_ref.jax needs JAX: pip install jax (or pip install \"entmax-ref[jax]\")",
                      name="jax") from exc

import entmax_ref as er

SymbolicZero = jax.custom_derivatives.SymbolicZero


def _float64() -> Any:
    """float64 where JAX has it (``jax_enable_x64``), else float32."""
    return jax.dtypes.canonicalize_dtype(np.float64)


def host_call(fn: Any, shapes: Any, *args: Any, vmap: str = "broadcast_all") -> Any:
    """``fn(*host arrays)``, its results cast to the declared dtypes: called now when the
    arguments are concrete arrays, else through pure_callback."""

    def host(*a):
        # the engines get NumPy arrays: a JAX array would make the library answer in JAX
        # arrays, float32 where x64 is off
        res = fn(*jax.tree.map(np.asarray, a))
        return jax.tree.map(lambda r, s: np.asarray(r).astype(s.dtype, copy=False), res, shapes)

    try:
        concrete = jax.tree.map(np.asarray, args)
    except jax.errors.TracerArrayConversionError:  # traced (jit, vmap): the host runs later
        return jax.pure_callback(host, shapes, *args, vmap_method=vmap)
    return jax.tree.map(jnp.asarray, host(*concrete))


def shape_spec(shape: Any, dtype: Any) -> Any:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def spec_of(t: Any) -> Any:
    """The shape and dtype of an argument: an array, or the plain number that ``jax.grad``
    hands a custom rule for a differentiated Python float."""
    return shape_spec(jnp.shape(t), jnp.result_type(t))


def rows_shape(x: Any, axis: int) -> tuple:
    return tuple(s for i, s in enumerate(x.shape) if i != axis % x.ndim)


def negative_axis(x: Any, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for x of shape {tuple(x.shape)}")
    return axis - x.ndim if axis >= 0 else axis


# ---------------------------------------------------------------- a transform with a constant parameter

_TRANSFORMS = {"entmax": (er.entmax, er.entmax_vjp), "normmax": (er.normmax, er.normmax_vjp),
               "budget_sparsemax": (er.budget_sparsemax, er.budget_sparsemax_vjp)}


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def transform(x, kind, param, axis, opts):
    """``kind``'s forward of x along ``axis`` with the constant ``param`` (alpha or budget)."""
    fwd = _TRANSFORMS[kind][0]
    return host_call(lambda a: fwd(a, param, axis, **dict(opts)), shape_spec(x.shape, x.dtype), x)


def _transform_fwd(x, kind, param, axis, opts):
    p = transform(x, kind, param, axis, opts)
    return p, p


def _transform_bwd(kind, param, axis, opts, p, g):
    vjp = _TRANSFORMS[kind][1]
    backend = dict(opts).get("backend")
    return (host_call(lambda a, b: vjp(a, b, param, axis, backend=backend), shape_spec(p.shape, p.dtype), p, g),)


transform.defvjp(_transform_fwd, _transform_bwd)


# ---------------------------------------------------------------- alpha-entmax with alpha per row


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def entmax_rows(x, alpha, axis, opts):
    """alpha-entmax with ``alpha`` one per row (x's shape without ``axis``), differentiable."""
    return host_call(lambda a, al: er.entmax(a, al, axis, **dict(opts)), shape_spec(x.shape, x.dtype), x, alpha)


def _entmax_rows_fwd(x, alpha, axis, opts):
    p = entmax_rows(x, alpha, axis, opts)
    return p, (p, alpha)


def _entmax_rows_bwd(axis, opts, res, g):
    p, alpha = res
    backend = dict(opts).get("backend")
    dx = host_call(lambda a, b, al: er.entmax_vjp(a, b, al, axis, backend=backend), shape_spec(p.shape, p.dtype), p, g, alpha)
    da = host_call(lambda a, b, al: er.entmax_alpha_vjp(a, b, al, axis, backend=backend), shape_spec(alpha.shape, alpha.dtype),
               p, g, alpha)
    return dx, da


entmax_rows.defvjp(_entmax_rows_fwd, _entmax_rows_bwd)


# ---------------------------------------------------------------- Fenchel-Young losses

_LOSSES = {"entmax": (er.entmax_loss, er.entmax_loss_grad), "normmax": (er.normmax_loss, er.normmax_loss_grad)}


@partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def loss(x, target, kind, alpha, axis, backend):
    """The Fenchel-Young loss per row (float64 under x64, else float32), differentiable in x;
    differentiating it in target is a ValueError (a custom JVP, whose tangent of target is
    a symbolic zero exactly when target is not differentiated, under ``jit`` too)."""
    fn = _LOSSES[kind][0]
    return host_call(lambda a, t: fn(a, t, alpha, axis, backend=backend), shape_spec(rows_shape(x, axis), _float64()),
                     x, target)


def _loss_jvp(kind, alpha, axis, backend, primals, tangents):
    x, target = primals
    dx, dtarget = tangents
    if not isinstance(dtarget, SymbolicZero):
        raise ValueError("the losses of entmax_ref.jax differentiate the scores x, not the target; "
                         "pass jax.lax.stop_gradient(target)")
    out = loss(x, target, kind, alpha, axis, backend)
    if isinstance(dx, SymbolicZero):
        return out, jnp.zeros_like(out)
    fn = _LOSSES[kind][1]
    grad = host_call(lambda a, t: fn(a, t, alpha, axis, backend=backend), shape_spec(x.shape, x.dtype), x, target)
    return out, jnp.sum(grad * dx, axis=axis).astype(out.dtype)


loss.defjvp(_loss_jvp, symbolic_zeros=True)


# ---------------------------------------------------------------- ASEntmax


@partial(jax.custom_vjp, nondiff_argnums=(1, 5, 6, 7))
def asentmax(x, alpha, beta, gamma, delta, offset, axis, backend):
    """ASEntmax of x along ``axis``, differentiable in x, beta, gamma and delta."""
    def fwd(a, b, g, d):
        return er.asentmax(a, alpha, beta=b, gamma=g, delta=d, offset=offset, axis=axis, backend=backend)

    return host_call(fwd, shape_spec(x.shape, x.dtype), x, beta, gamma, delta, vmap="sequential")


def _asentmax_fwd(x, alpha, beta, gamma, delta, offset, axis, backend):
    p = asentmax(x, alpha, beta, gamma, delta, offset, axis, backend)
    return p, (x, p, beta, gamma, delta)


def _asentmax_bwd(alpha, offset, axis, backend, res, g):
    x, p, beta, gamma, delta = res

    def vjp(gr, a, pp, b, gm, d):
        return tuple(er.asentmax_vjp(gr, a, alpha, beta=b, gamma=gm, delta=d, offset=offset, p=pp, axis=axis,
                                     backend=backend))

    shapes = tuple(spec_of(t) for t in (x, beta, gamma, delta))
    return host_call(vjp, shapes, g, x, p, beta, gamma, delta, vmap="sequential")


asentmax.defvjp(_asentmax_fwd, _asentmax_bwd)
