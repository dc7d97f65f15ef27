"""The row transforms and losses as torch operations (``torch.library.custom_op``).

Each forward runs the library's public function on the tensors' memory and each backward is
the library's VJP of the forward's output (``entmax_vjp`` and ``entmax_alpha_vjp`` of p,
``normmax_vjp``, ``budget_sparsemax_vjp``, the losses' gradients, ``asentmax_vjp``), itself
an operation with a fake (shape-only) implementation, so that ``torch.compile`` traces both
without a graph break.  The differentiable functions are ``torch.autograd.Function`` classes
around them (:func:`._torch_host.differentiable`), whose gradients are first order only.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch.library import custom_op

import entmax_ref as er

from ._torch_host import (NS, differentiable, empty, first_order, host, out_dtype, promote, sequential_vmap, sum_to,
                          tensor, without_dim)

# ---------------------------------------------------------------- alpha-entmax


@custom_op(f"{NS}::entmax", mutates_args=())
def entmax_op(x: Tensor, alpha: float, alpha_t: Optional[Tensor], dim: int, method: Optional[str],
              backend: Optional[str]) -> Tensor:
    a = alpha if alpha_t is None else host(alpha_t, "alpha")
    return tensor(er.entmax(host(x, "x"), a, dim, method=method, backend=backend), x)


@entmax_op.register_fake
def _(x, alpha, alpha_t, dim, method, backend):
    return empty(*x.shape, like=x, dtype=out_dtype(x))


@custom_op(f"{NS}::entmax_vjp", mutates_args=())
def entmax_vjp_op(p: Tensor, grad: Tensor, alpha: float, alpha_t: Optional[Tensor], dim: int,
                  backend: Optional[str]) -> Tensor:
    a = alpha if alpha_t is None else host(alpha_t, "alpha")
    return tensor(er.entmax_vjp(host(p, "p"), host(grad, "grad"), a, dim, backend=backend), p)


@entmax_vjp_op.register_fake
def _(p, grad, alpha, alpha_t, dim, backend):
    return empty(*p.shape, like=p, dtype=promote(p.dtype, grad.dtype))


@custom_op(f"{NS}::entmax_alpha_vjp", mutates_args=())
def entmax_alpha_vjp_op(p: Tensor, grad: Tensor, alpha_t: Tensor, dim: int, backend: Optional[str]) -> Tensor:
    da = er.entmax_alpha_vjp(host(p, "p"), host(grad, "grad"), host(alpha_t, "alpha"), dim, backend=backend)
    return tensor(da, p)


@entmax_alpha_vjp_op.register_fake
def _(p, grad, alpha_t, dim, backend):
    return empty(*without_dim(p.shape, dim), like=p)


def _entmax_setup(ctx, inputs, output):
    _, alpha, alpha_t, dim, _, backend = inputs
    ctx.save_for_backward(output, alpha_t)
    ctx.alpha, ctx.dim, ctx.backend = alpha, dim, backend


def _entmax_backward(ctx, grad):
    p, alpha_t = ctx.saved_tensors
    pd, gd, ad = p.detach(), grad.detach(), None if alpha_t is None else alpha_t.detach()
    dx = entmax_vjp_op(pd, gd, ctx.alpha, ad, ctx.dim, ctx.backend)
    dalpha = None
    if ctx.needs_input_grad[2]:
        dalpha = sum_to(entmax_alpha_vjp_op(pd, gd, ad, ctx.dim, ctx.backend), alpha_t)
    dx, dalpha = first_order((dx, dalpha), p, grad, alpha_t)
    return dx, None, dalpha, None, None, None


def _entmax(*args):
    return entmax_op(*args)


entmax_fn = differentiable("Entmax", _entmax, _entmax_setup, _entmax_backward)

# ---------------------------------------------------------------- normmax, budget-sparsemax


@custom_op(f"{NS}::normmax", mutates_args=())
def normmax_op(x: Tensor, alpha: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(er.normmax(host(x, "x"), alpha, dim, backend=backend), x)


@custom_op(f"{NS}::budget_sparsemax", mutates_args=())
def budget_op(x: Tensor, budget: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(er.budget_sparsemax(host(x, "x"), budget, dim, backend=backend), x)


@custom_op(f"{NS}::normmax_vjp", mutates_args=())
def normmax_vjp_op(p: Tensor, grad: Tensor, alpha: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(er.normmax_vjp(host(p, "p"), host(grad, "grad"), alpha, dim, backend=backend), p)


@custom_op(f"{NS}::budget_sparsemax_vjp", mutates_args=())
def budget_vjp_op(p: Tensor, grad: Tensor, budget: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(er.budget_sparsemax_vjp(host(p, "p"), host(grad, "grad"), budget, dim, backend=backend), p)


def _fake_like_x(x, param, dim, backend):
    return empty(*x.shape, like=x, dtype=out_dtype(x))


def _fake_vjp(p, grad, param, dim, backend):
    return empty(*p.shape, like=p, dtype=promote(p.dtype, grad.dtype))


def _param_setup(ctx, inputs, output):
    _, param, dim, backend = inputs
    ctx.save_for_backward(output)
    ctx.param, ctx.dim, ctx.backend = param, dim, backend


def _param_backward(vjp):
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        (dx,) = first_order((vjp(p.detach(), grad.detach(), ctx.param, ctx.dim, ctx.backend),), p, grad)
        return dx, None, None, None

    return backward


for _fwd, _vjp in ((normmax_op, normmax_vjp_op), (budget_op, budget_vjp_op)):
    _fwd.register_fake(_fake_like_x)
    _vjp.register_fake(_fake_vjp)


def _normmax(*args):
    return normmax_op(*args)


def _budget(*args):
    return budget_op(*args)


normmax_fn = differentiable("Normmax", _normmax, _param_setup, _param_backward(normmax_vjp_op))
budget_fn = differentiable("BudgetSparsemax", _budget, _param_setup, _param_backward(budget_vjp_op))

# ---------------------------------------------------------------- Fenchel-Young losses

_LOSSES = {"entmax": (er.entmax_loss, er.entmax_loss_grad), "normmax": (er.normmax_loss, er.normmax_loss_grad)}


@custom_op(f"{NS}::fy_loss", mutates_args=())
def loss_op(x: Tensor, target: Tensor, kind: str, alpha: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(np.asarray(_LOSSES[kind][0](host(x, "x"), host(target, "target"), alpha, dim, backend=backend)), x)


@loss_op.register_fake
def _(x, target, kind, alpha, dim, backend):
    return empty(*without_dim(x.shape, dim), like=x)


@custom_op(f"{NS}::fy_loss_grad", mutates_args=())
def loss_grad_op(x: Tensor, target: Tensor, kind: str, alpha: float, dim: int, backend: Optional[str]) -> Tensor:
    return tensor(_LOSSES[kind][1](host(x, "x"), host(target, "target"), alpha, dim, backend=backend), x)


@loss_grad_op.register_fake
def _(x, target, kind, alpha, dim, backend):
    return empty(*x.shape, like=x, dtype=out_dtype(x))


def _loss_setup(ctx, inputs, output):
    x, target, kind, alpha, dim, backend = inputs
    ctx.save_for_backward(x, target)
    ctx.args = (kind, alpha, dim, backend)


def _loss_backward(ctx, grad):
    x, target = ctx.saved_tensors
    if ctx.needs_input_grad[1]:
        raise RuntimeError("the losses of entmax_ref.torch differentiate the scores x, not the target; "
                           "pass target.detach()")
    g = loss_grad_op(x.detach(), target.detach(), *ctx.args)
    (dx,) = first_order(((g * grad.detach().unsqueeze(ctx.args[2])).to(g.dtype),), x, grad)
    return dx, None, None, None, None, None


def _loss(*args):
    return loss_op(*args)


loss_fn = differentiable("FenchelYoungLoss", _loss, _loss_setup, _loss_backward)

# ---------------------------------------------------------------- ASEntmax


@custom_op(f"{NS}::asentmax", mutates_args=())
def asentmax_op(x: Tensor, alpha: float, beta: Tensor, gamma: Tensor, delta: Tensor, offset: float, dim: int,
                backend: Optional[str]) -> Tensor:
    p = er.asentmax(host(x, "x"), alpha, beta=host(beta, "beta"), gamma=host(gamma, "gamma"),
                    delta=host(delta, "delta"), offset=offset, axis=dim, backend=backend)
    return tensor(p, x)


@asentmax_op.register_fake
def _(x, alpha, beta, gamma, delta, offset, dim, backend):
    return empty(*x.shape, like=x, dtype=out_dtype(x))


@custom_op(f"{NS}::asentmax_vjp", mutates_args=())
def asentmax_vjp_op(grad: Tensor, x: Tensor, p: Tensor, alpha: float, beta: Tensor, gamma: Tensor, delta: Tensor,
                    offset: float, dim: int, backend: Optional[str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = er.asentmax_vjp(host(grad, "grad"), host(x, "x"), alpha, beta=host(beta, "beta"),
                        gamma=host(gamma, "gamma"), delta=host(delta, "delta"), offset=offset,
                        p=host(p, "p"), axis=dim, backend=backend)
    return tuple(tensor(np.asarray(a), x) for a in g)


@asentmax_vjp_op.register_fake
def _(grad, x, p, alpha, beta, gamma, delta, offset, dim, backend):
    dx = empty(*x.shape, like=x, dtype=promote(out_dtype(x), grad.dtype))
    return dx, *(empty(*t.shape, like=x) for t in (beta, gamma, delta))


def _asentmax_setup(ctx, inputs, output):
    x, alpha, beta, gamma, delta, offset, dim, backend = inputs
    ctx.save_for_backward(x, output, beta, gamma, delta)
    ctx.args = (alpha, offset, dim, backend)


def _asentmax_backward(ctx, grad):
    x, p, beta, gamma, delta = ctx.saved_tensors
    alpha, offset, dim, backend = ctx.args
    dx, db, dg, dd = asentmax_vjp_op(grad.detach(), x.detach(), p.detach(), alpha, beta.detach(), gamma.detach(),
                                     delta.detach(), offset, dim, backend)
    grads = [None if not need else g.to(t.dtype)
             for need, g, t in zip(ctx.needs_input_grad[2:5], (db, dg, dd), (beta, gamma, delta))]
    dx, *grads = first_order((dx, *grads), x, p, grad, beta, gamma, delta)
    return dx, None, *grads, None, None, None


def _asentmax(*args):
    return asentmax_op(*args)


asentmax_fn = differentiable("ASEntmax", _asentmax, _asentmax_setup, _asentmax_backward)

for _op in (entmax_op, entmax_vjp_op, entmax_alpha_vjp_op, normmax_op, budget_op, normmax_vjp_op, budget_vjp_op,
            loss_op, loss_grad_op, asentmax_op, asentmax_vjp_op):
    sequential_vmap(_op)
