"""Attention (padded and packed) as a torch operation with the library's exact backward.

The forward runs :func:`entmax_ref.attention` (or :func:`entmax_ref.attention_varlen` when
``cu_seqlens`` are given) with ``return_info=True`` and returns, beside the output, the
residual its backward needs: the fields of :class:`entmax_ref.AttentionInfo` (theta, row_max,
edge, edge_p, the skewed output, the keys per row, and the support keys the numba engine
keeps: a data-dependent width, empty where none were kept).  The backward rebuilds the
:class:`entmax_ref.AttentionInfo` from them and runs
:func:`entmax_ref.attention_vjp` (``attention_varlen_vjp``): nothing is solved again and the
gradients are those of the library, bit for bit, for q, k, v, alpha (a tensor), beta, gamma
and delta.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

import entmax_ref as er

from ._torch_host import NS, backward_only, empty, host, promote, tensor

#: The fields of :class:`entmax_ref.AttentionInfo` the forward returns after the output, in
#: order (all of them: the packed backward checks every one's shape).
RESIDUAL = ("tau", "support", "s", "n", "skew", "theta", "row_max", "edge", "edge_p", "support_keys")


def _kwargs(alpha, alpha_t, scale, causal, key_lengths, key_padding_mask, alibi_slopes, beta, gamma, delta,
            offset, chunk, backend, cu_q):
    """The keyword arguments of the library call (host arrays)."""
    kw = dict(alpha=alpha if alpha_t is None else host(alpha_t, "alpha"), scale=scale, causal=causal,
              alibi_slopes=host(alibi_slopes, "alibi_slopes"), offset=offset, chunk=chunk, backend=backend)
    if beta is not None or gamma is not None:
        kw.update(beta=host(beta, "beta"), gamma=host(gamma, "gamma"), delta=host(delta, "delta"))
    if cu_q is None:
        kw.update(key_lengths=host(key_lengths, "key_lengths"),
                  key_padding_mask=host(key_padding_mask, "key_padding_mask"))
    return kw


def _positional(q, k, v, cu_q, cu_k):
    arrays = (host(q, "q"), host(k, "k"), host(v, "v"))
    if cu_q is None:
        return er.attention, er.attention_vjp, arrays
    return er.attention_varlen, er.attention_varlen_vjp, (*arrays, host(cu_q, "cu_seqlens_q"),
                                                          host(cu_k, "cu_seqlens_k"))


@custom_op(f"{NS}::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, cu_q: Optional[Tensor], cu_k: Optional[Tensor], alpha: float,
                 alpha_t: Optional[Tensor], scale: Optional[float], causal: bool, key_lengths: Optional[Tensor],
                 key_padding_mask: Optional[Tensor], alibi_slopes: Optional[Tensor], beta: Optional[Tensor],
                 gamma: Optional[Tensor], delta: Optional[Tensor], offset: float, chunk: Optional[int],
                 backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                  Tensor, Tensor, Tensor]:
    fwd, _, arrays = _positional(q, k, v, cu_q, cu_k)
    kw = _kwargs(alpha, alpha_t, scale, causal, key_lengths, key_padding_mask, alibi_slopes, beta, gamma, delta,
                 offset, chunk, backend, cu_q)
    out, info = fwd(*arrays, return_info=True, **kw)
    keys = info.support_keys
    if keys is None:  # this engine keeps none: an empty last axis says so
        keys = torch.empty((*info.theta.shape, 0), dtype=torch.int32, device=q.device)
    else:
        keys = tensor(keys, q)
    return (tensor(out, q), *(tensor(getattr(info, name), q) for name in RESIDUAL[:-1]), keys)


@attention_op.register_fake
def _(q, k, v, cu_q, cu_k, alpha, alpha_t, scale, causal, key_lengths, key_padding_mask, alibi_slopes, beta, gamma,
      delta, offset, chunk, backend):
    rows = tuple(q.shape[:3]) if cu_q is None else tuple(q.shape[:2])  # (B, Hq, Nq) or (total_q, Hq)
    dv = v.shape[-1]
    out = empty(*rows, dv, like=q, dtype=promote(q.dtype, k.dtype, v.dtype))
    width = torch.library.get_ctx().new_dynamic_size()
    i64 = torch.int64
    return (out, empty(*rows, like=q), empty(*rows, like=q, dtype=i64), empty(*rows, like=q),
            empty(*rows, like=q, dtype=i64), empty(*rows, dv, like=q), *(empty(*rows, like=q) for _ in range(4)),
            empty(*rows, width, like=q, dtype=torch.int32))


@custom_op(f"{NS}::attention_vjp", mutates_args=())
def attention_vjp_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, residual: list[Tensor],
                     cu_q: Optional[Tensor], cu_k: Optional[Tensor], alpha: float, alpha_t: Optional[Tensor],
                     scale: Optional[float], causal: bool, key_lengths: Optional[Tensor],
                     key_padding_mask: Optional[Tensor], alibi_slopes: Optional[Tensor], beta: Optional[Tensor],
                     gamma: Optional[Tensor], delta: Optional[Tensor], offset: float, chunk: Optional[int],
                     backend: Optional[str]) -> list[Tensor]:
    _, vjp, arrays = _positional(q, k, v, cu_q, cu_k)
    kw = _kwargs(alpha, alpha_t, scale, causal, key_lengths, key_padding_mask, alibi_slopes, beta, gamma, delta,
                 offset, chunk, backend, cu_q)
    res = {name: host(t, name) for name, t in zip(RESIDUAL, residual)}
    if res["support_keys"].shape[-1] == 0:
        res["support_keys"] = None
    info_alpha = alpha if alpha_t is None else tuple(float(a) for a in host(alpha_t, "alpha").reshape(-1))
    info = er.AttentionInfo(alpha=info_alpha, **res)
    g = vjp(host(grad_out, "grad_out"), *arrays, info=info, **kw)
    like = (q, k, v, beta, gamma, delta, alpha_t)
    return [torch.empty(0, device=q.device) if a is None else tensor(a, q).reshape(t.shape)
            for a, t in zip(g, like)]


@attention_vjp_op.register_fake
def _(grad_out, q, k, v, residual, cu_q, cu_k, alpha, alpha_t, scale, causal, key_lengths, key_padding_mask,
      alibi_slopes, beta, gamma, delta, offset, chunk, backend):
    grads = [torch.empty_like(t) for t in (q, k, v)]
    for t in (beta, gamma, delta, alpha_t):
        grads.append(torch.empty(0, device=q.device) if t is None else empty(*t.shape, like=q))
    return grads


_PARAMS = ("cu_q", "cu_k", "alpha", "alpha_t", "scale", "causal", "key_lengths", "key_padding_mask",
           "alibi_slopes", "beta", "gamma", "delta", "offset", "chunk", "backend")


def _setup(ctx, inputs, output):
    q, k, v, *params = inputs
    ctx.save_for_backward(q, k, v, *output[1:], *(p if isinstance(p, Tensor) else None for p in params))
    ctx.consts = [None if isinstance(p, Tensor) else p for p in params]
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_out, *unused):
    saved = ctx.saved_tensors
    q, k, v = saved[:3]
    residual = list(saved[3:3 + len(RESIDUAL)])
    params = [t if c is None else c for t, c in zip(saved[3 + len(RESIDUAL):], ctx.consts)]
    named = dict(zip(_PARAMS, params))
    dq, dk, dv, dbeta, dgamma, ddelta, dalpha = attention_vjp_op(grad_out.contiguous(), q, k, v, residual, *params)
    grads = {"alpha_t": dalpha, "beta": dbeta, "gamma": dgamma, "delta": ddelta}
    needs = dict(zip(_PARAMS, ctx.needs_input_grad[3:]))
    out = [dq, dk, dv]
    for name in _PARAMS:
        g = grads.get(name)
        out.append(g.to(named[name].dtype) if g is not None and needs[name] else None)
    return tuple(out)


attention_op.register_autograd(_backward, setup_context=_setup)
backward_only(attention_vjp_op)
