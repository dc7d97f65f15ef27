"""Attention (padded and packed) as a torch operation with the library's exact backward.

The operation takes q, k, v, the packed batch's offsets (None for padded attention) and the
call's :class:`~entmax_ref._attention_options.AttentionOptions`, encoded as the options that
are tensors and one string of the others.  Its forward runs
:func:`entmax_ref.attention` (or :func:`entmax_ref.attention_varlen`) with
``return_info=True`` and returns, beside the output, the residual its backward needs: the
fields of :class:`entmax_ref.AttentionInfo` (theta, row_max, edge, edge_p, the skewed
output, the keys per row, and the support keys the numba engine keeps: a data-dependent
width, empty where none were kept).  The backward rebuilds the
:class:`entmax_ref.AttentionInfo` from them and runs :func:`entmax_ref.attention_vjp`
(``attention_varlen_vjp``): nothing is solved again and the gradients are those of the
library, bit for bit, for q, k, v and the tensor options alpha, beta, gamma and delta.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor
from torch.library import custom_op

import entmax_ref as er

from .._attention_options import AttentionOptions
from ..attention import attention_of, attention_vjp_of
from ..varlen import attention_varlen_of, attention_varlen_vjp_of
from ._torch_host import NS, differentiable, empty, first_order, host, promote, sequential_vmap, tensor

#: The fields of :class:`entmax_ref.AttentionInfo` the forward returns after the output, in
#: order (all of them: the packed backward checks every one's shape).
RESIDUAL = ("tau", "support", "s", "n", "skew", "theta", "row_max", "edge", "edge_p", "support_keys")


def _options(arrays: list, options: str) -> AttentionOptions:
    """The call's options record, its tensor options on the host."""
    names = AttentionOptions.arrays_of(options)
    return AttentionOptions.join(options, [host(t, n) for t, n in zip(arrays, names)])


def _qkv(q, k, v, cu_q, cu_k) -> tuple:
    arrays = (host(q, "q"), host(k, "k"), host(v, "v"))
    return arrays if cu_q is None else (*arrays, host(cu_q, "cu_seqlens_q"), host(cu_k, "cu_seqlens_k"))


@custom_op(f"{NS}::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, cu_q: Optional[Tensor], cu_k: Optional[Tensor],
                 arrays: list[Tensor], options: str) -> list[Tensor]:
    fwd = attention_of if cu_q is None else attention_varlen_of
    out, info = fwd(*_qkv(q, k, v, cu_q, cu_k), _options(arrays, options), return_info=True)
    keys = info.support_keys
    if keys is None:  # this engine keeps none: an empty last axis says so
        keys = torch.empty((*info.theta.shape, 0), dtype=torch.int32, device=q.device)
    else:
        keys = tensor(keys, q)
    return [tensor(out, q), *(tensor(getattr(info, name), q) for name in RESIDUAL[:-1]), keys]


@attention_op.register_fake
def _(q, k, v, cu_q, cu_k, arrays, options):
    rows = tuple(q.shape[:3]) if cu_q is None else tuple(q.shape[:2])  # (B, Hq, Nq) or (total_q, Hq)
    dv = v.shape[-1]
    out = empty(*rows, dv, like=q, dtype=promote(q.dtype, k.dtype, v.dtype))
    width = torch.library.get_ctx().new_dynamic_size()
    i64 = torch.int64
    return [out, empty(*rows, like=q), empty(*rows, like=q, dtype=i64), empty(*rows, like=q),
            empty(*rows, like=q, dtype=i64), empty(*rows, dv, like=q), *(empty(*rows, like=q) for _ in range(4)),
            empty(*rows, width, like=q, dtype=torch.int32)]


def _gradient_of(name: str, a: Any, like: Any) -> Any:
    """The library's gradient of option ``name`` shaped like its tensor ``like``; an empty
    tensor for an option that has none."""
    if a is None or name not in AttentionOptions.DIFFERENTIABLE:
        return empty(0, like=like)
    return tensor(a, like).reshape(like.shape)


@custom_op(f"{NS}::attention_vjp", mutates_args=())
def attention_vjp_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, residual: list[Tensor],
                     cu_q: Optional[Tensor], cu_k: Optional[Tensor], arrays: list[Tensor],
                     options: str) -> list[Tensor]:
    opts = _options(arrays, options)
    res = {name: host(t, name) for name, t in zip(RESIDUAL, residual)}
    if res["support_keys"].shape[-1] == 0:
        res["support_keys"] = None
    alpha = opts.alpha  # AttentionInfo.alpha: a number, or one per head
    info = er.AttentionInfo(alpha=tuple(np.ravel(alpha).tolist()) if isinstance(alpha, np.ndarray) else alpha, **res)
    vjp = attention_vjp_of if cu_q is None else attention_varlen_vjp_of
    g = vjp(host(grad_out, "grad_out"), *_qkv(q, k, v, cu_q, cu_k), opts, info=info)
    grads = {"alpha": g.dalpha, "beta": g.dbeta, "gamma": g.dgamma, "delta": g.ddelta}
    names = AttentionOptions.arrays_of(options)
    return [tensor(g.dq, q), tensor(g.dk, q), tensor(g.dv, q),
            *(_gradient_of(name, grads.get(name), t) for name, t in zip(names, arrays))]


@attention_vjp_op.register_fake
def _(grad_out, q, k, v, residual, cu_q, cu_k, arrays, options):
    grads = [empty(*t.shape, like=q, dtype=t.dtype) for t in (q, k, v)]
    for name, t in zip(AttentionOptions.arrays_of(options), arrays):
        grads.append(empty(*t.shape, like=q) if name in AttentionOptions.DIFFERENTIABLE else empty(0, like=q))
    return grads


def _forward(q, k, v, cu_q, cu_k, options, *arrays):
    return tuple(attention_op(q, k, v, cu_q, cu_k, list(arrays), options))


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, options, *arrays = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output[1:], *arrays)
    ctx.options = options
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_out, *unused):
    q, k, v, cu_q, cu_k, *rest = ctx.saved_tensors
    residual, arrays = rest[:len(RESIDUAL)], rest[len(RESIDUAL):]
    detached = [t.detach() for t in arrays]
    grads = attention_vjp_op(grad_out.detach().contiguous(), q.detach(), k.detach(), v.detach(),
                             [t.detach() for t in residual], cu_q, cu_k, detached, ctx.options)
    wanted = [g.to(t.dtype) if need else None for g, t, need in zip(grads[3:], arrays, ctx.needs_input_grad[6:])]
    grads = first_order((*grads[:3], *wanted), q, k, v, grad_out, *arrays)
    return (*grads[:3], None, None, None, *grads[3:])


_attention = differentiable("Attention", _forward, _setup, _backward)
# under vmap the support keys of one element have another width than the next: the backward
# then finds each row's support itself (the keys change no bit of the gradients)
sequential_vmap(attention_op, adjust=lambda outs: [*outs[:-1], outs[-1][..., :0]])
sequential_vmap(attention_vjp_op)


def _as_tensor(value: Any, like: Any) -> Any:
    """An array option as a tensor on ``like``'s device (a list or NumPy array of floats
    in float64, as the library reads it)."""
    if isinstance(value, Tensor):
        return value
    return torch.as_tensor(np.asarray(value), device=like.device)


def attention_apply(q, k, v, cu_q, cu_k, names: Any):
    """The output of the attention whose options are among ``names`` (the adapter's
    keyword arguments; packed when ``cu_q`` is given), differentiable in q, k, v and the
    options alpha, beta, gamma, delta given as tensors."""
    arrays, static = AttentionOptions.encode(names)
    cu = [None if c is None else _as_tensor(c, q).to(torch.int64) for c in (cu_q, cu_k)]
    return _attention(q, k, v, *cu, static, *(_as_tensor(a, q) for a in arrays))[0]
