"""Attention (padded and packed) as a JAX function whose VJP is the library's
:func:`entmax_ref.attention_vjp` of the forward's lossless residual (see
:mod:`entmax_ref.adapters.jax_ops` for how the residual travels).

The call's :class:`~entmax_ref._attention_options.AttentionOptions` travel encoded
(:meth:`~entmax_ref._attention_options.AttentionOptions.encode`): the options that are
arrays as JAX arrays (alpha, beta, gamma and delta among them are differentiated), the
others as one static string.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .._attention_options import AttentionOptions
from ..attention import attention_of, attention_vjp_of
from ..varlen import attention_varlen_of, attention_varlen_vjp_of
from .jax_ops import host_call, jax, jnp, shape_spec, spec_of

import entmax_ref as er

#: The residual's fields of :class:`entmax_ref.AttentionInfo` (8-byte entries), in order.
RESIDUAL = ("tau", "support", "s", "n", "skew", "theta", "row_max", "edge", "edge_p")
_INT_FIELDS = ("support", "n")


def _dtype(name: str) -> type:
    return np.int64 if name in _INT_FIELDS else np.float64


def _pack(a, name: str) -> np.ndarray:
    """A field in its 8-byte dtype (exact: float32 fields widen without rounding) as its
    uint32 halves (a trailing axis of 2), which JAX holds with or without x64."""
    a = np.ascontiguousarray(a, dtype=_dtype(name))
    return a.view(np.uint32).reshape(a.shape + (2,))


def _unpack(b, name: str) -> np.ndarray:
    return np.ascontiguousarray(b).view(_dtype(name)).reshape(b.shape[:-1])


def _call(fn_padded, fn_packed, lead, cu, arrays, static, **kw):
    """The library's attention function (padded, or packed when ``cu`` is given) of the host
    arrays ``lead`` ((q, k, v), or (grad_out, q, k, v)), with the options record of
    ``static`` and ``arrays``."""
    opts = AttentionOptions.join(static, arrays)
    return fn_padded(*lead, opts, **kw) if cu is None else fn_packed(*lead, *cu, opts, **kw)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention(q, k, v, cu, arrays, static):
    """The output of the library's attention; ``arrays`` (the array options, a tuple) are
    differentiated where the library has their gradient (alpha, beta, gamma, delta),
    ``cu`` (the packed batch's offsets, or None) is not."""
    return _forward(q, k, v, cu, arrays, static)[0]


def _forward(q, k, v, cu, arrays, static):
    rows = tuple(q.shape[:3]) if cu is None else tuple(q.shape[:2])
    dv = v.shape[-1]
    out = shape_spec(rows + (dv,), jnp.result_type(q.dtype, k.dtype, v.dtype))
    shapes = (out, *(shape_spec(rows + ((dv, 2) if name == "skew" else (2,)), jnp.uint32) for name in RESIDUAL))

    def host(q, k, v, cu, arrays):
        o, info = _call(attention_of, attention_varlen_of, (q, k, v), cu, arrays, static, return_info=True)
        return (o, *(_pack(getattr(info, name), name) for name in RESIDUAL))

    res = host_call(host, shapes, q, k, v, cu, arrays, vmap="sequential")
    return res[0], res[1:]


def _attention_fwd(q, k, v, cu, arrays, static):
    out, residual = _forward(q, k, v, cu, arrays, static)
    return out, (q, k, v, cu, arrays, residual)


def _attention_bwd(static, res, g):
    q, k, v, cu, arrays, residual = res
    names = AttentionOptions.arrays_of(static)
    wanted = [name in AttentionOptions.DIFFERENTIABLE for name in names]
    shapes = (*(spec_of(t) for t in (q, k, v)), tuple(spec_of(a) for a, want in zip(arrays, wanted) if want))

    def host(g, q, k, v, cu, arrays, residual):
        fields = {name: _unpack(r, name) for name, r in zip(RESIDUAL, residual)}
        opts = AttentionOptions.join(static, arrays)
        alpha = opts.alpha  # AttentionInfo.alpha: a number, or one per head
        info = er.AttentionInfo(alpha=tuple(np.ravel(alpha).tolist()) if isinstance(alpha, np.ndarray) else alpha,
                                **fields)
        gr = _call(attention_vjp_of, attention_varlen_vjp_of, (g, q, k, v), cu, arrays, static, info=info)
        grads = {"alpha": gr.dalpha, "beta": gr.dbeta, "gamma": gr.dgamma, "delta": gr.ddelta}
        return gr.dq, gr.dk, gr.dv, tuple(grads[name] for name, want in zip(names, wanted) if want)

    dq, dk, dv, option_grads = host_call(host, shapes, g, q, k, v, cu, arrays, residual, vmap="sequential")
    it = iter(option_grads)
    return dq, dk, dv, None, tuple(next(it) if want else None for want in wanted)


attention.defvjp(_attention_fwd, _attention_bwd)
