"""Attention (padded and packed) as a JAX function whose VJP is the library's
:func:`entmax_ref.attention_vjp` of the forward's lossless residual (see
:mod:`entmax_ref.adapters.jax_ops` for how the residual travels)."""

from __future__ import annotations

from functools import partial

import numpy as np

from .jax_ops import host_call, shape_spec, jax, jnp

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


def _library(varlen: bool):
    return (er.attention_varlen, er.attention_varlen_vjp) if varlen else (er.attention, er.attention_vjp)


def _kwargs(static, alpha_t, params, aux):
    """The library call's keyword arguments from the static tuple and the host arrays."""
    alpha, scale, causal, offset, chunk, backend, varlen = static
    kw = dict(alpha=alpha if alpha_t is None else alpha_t, scale=scale, causal=causal, offset=offset, chunk=chunk,
              backend=backend, alibi_slopes=aux.get("alibi_slopes"))
    if params is not None:
        kw.update(zip(("beta", "gamma", "delta"), params))
    if not varlen:
        kw.update(key_lengths=aux.get("key_lengths"), key_padding_mask=aux.get("key_padding_mask"))
    return kw


def _positional(q, k, v, aux, varlen):
    return (q, k, v, aux["cu_seqlens_q"], aux["cu_seqlens_k"]) if varlen else (q, k, v)


@partial(jax.custom_vjp, nondiff_argnums=(6,))
def attention(q, k, v, alpha_t, params, aux, static):
    """The output of the library's attention; ``alpha_t`` (an array or None) and ``params``
    ((beta, gamma, delta) or None) are differentiated, ``aux`` (masks, slopes, offsets) not."""
    return _forward(q, k, v, alpha_t, params, aux, static)[0]


def _forward(q, k, v, alpha_t, params, aux, static):
    varlen = static[-1]
    rows = tuple(q.shape[:2]) if varlen else tuple(q.shape[:3])
    dv = v.shape[-1]
    out = shape_spec(rows + (dv,), jnp.result_type(q.dtype, k.dtype, v.dtype))
    shapes = (out, *(shape_spec(rows + ((dv, 2) if name == "skew" else (2,)), jnp.uint32) for name in RESIDUAL))

    def host(q, k, v, alpha_t, params, aux):
        fwd = _library(varlen)[0]
        o, info = fwd(*_positional(q, k, v, aux, varlen), return_info=True, **_kwargs(static, alpha_t, params, aux))
        return (o, *(_pack(getattr(info, name), name) for name in RESIDUAL))

    res = host_call(host, shapes, q, k, v, alpha_t, params, aux, vmap="sequential")
    return res[0], res[1:]


def _attention_fwd(q, k, v, alpha_t, params, aux, static):
    out, residual = _forward(q, k, v, alpha_t, params, aux, static)
    return out, (q, k, v, alpha_t, params, aux, residual)


def _attention_bwd(static, res, g):
    q, k, v, alpha_t, params, aux, residual = res
    alpha, varlen = static[0], static[-1]
    like = (q, k, v, alpha_t, params)
    shapes = jax.tree.map(lambda t: shape_spec(t.shape, t.dtype), like)

    def host(g, q, k, v, alpha_t, params, aux, residual):
        fields = {name: _unpack(r, name) for name, r in zip(RESIDUAL, residual)}
        info_alpha = alpha if alpha_t is None else tuple(float(a) for a in np.ravel(alpha_t))
        info = er.AttentionInfo(alpha=info_alpha, **fields)
        vjp = _library(varlen)[1]
        gr = vjp(g, *_positional(q, k, v, aux, varlen), info=info, **_kwargs(static, alpha_t, params, aux))
        return (gr.dq, gr.dk, gr.dv, gr.dalpha, None if params is None else (gr.dbeta, gr.dgamma, gr.ddelta))

    dq, dk, dv, dalpha, dparams = host_call(host, shapes, g, q, k, v, alpha_t, params, aux, residual, vmap="sequential")
    return dq, dk, dv, dalpha, dparams, None


attention.defvjp(_attention_fwd, _attention_bwd)
