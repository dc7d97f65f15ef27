"""entmax-ref inside PyTorch's autograd: the library's functions as differentiable operations.

Each function here computes exactly what the function of the same name in :mod:`entmax_ref`
computes (the same engines, bit for bit, float16/bfloat16 computed in float32 and returned in
the input's dtype) and is differentiable: its backward is the library's own VJP of the
forward's output (for attention: of its lossless residual), so gradients reach the scores,
a tensor ``alpha``, the ASEntmax parameters ``beta``, ``gamma``, ``delta``, and q, k, v.

The operations are registered with ``torch.library.custom_op`` (namespace ``entmax_ref``)
with shape-only fake implementations (with the real ones' strides), so they also run inside
``torch.compile`` (``aot_eager`` and ``inductor``) without a graph break, and they are
differentiable through ``torch.autograd.Function`` classes, so ``torch.func.grad``, ``vjp``,
``jacrev`` and ``vmap`` take them too (``vmap`` calls the library once per mapped element;
forward mode, ``jvp`` and ``jacfwd``, is not implemented).  They work on CPU tensors (and on
CUDA tensors where the cupy backend runs; otherwise a CUDA tensor is a TypeError).  Only first
derivatives exist: a double backward (``torch.autograd.gradgradcheck``, ``create_graph=True``
Hessians, ``torch.func.grad`` of ``torch.func.grad``) raises a RuntimeError.

``import entmax_ref`` does not import torch; this module does (an ImportError says how to
install it).  The functions of :mod:`entmax_ref` itself take tensors too, but return
tensors that autograd cannot follow.

Examples
--------
>>> import torch
>>> import entmax_ref.torch as ert
>>> x = torch.tensor([-2.0, 0.0, 0.5], requires_grad=True)
>>> p = ert.sparsemax(x)
>>> p.tolist()
[0.0, 0.25, 0.75]
>>> p[1].backward()
>>> x.grad.tolist()
[0.0, 0.5, -0.5]
"""

from __future__ import annotations

from typing import Any

from ._validate import real_array
from .adapters import number
from .adapters._torch_host import torch
from .adapters.torch_attention import attention_apply
from .adapters.torch_rows import asentmax_fn, budget_fn, entmax_fn, loss_fn, normmax_fn

__all__ = ["attention", "attention_varlen", "asentmax", "budget_sparsemax", "entmax", "entmax15", "entmax_loss",
           "normmax", "normmax_loss", "softmax", "sparsemax", "ssmax"]


def _tensor(x: Any, name: str) -> Any:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__} (the functions of entmax_ref "
                        "itself take any array)")
    return x


def _param(v: Any, like: Any, name: str) -> Any:
    """A parameter (a number, an array or a tensor) as a tensor: numbers and arrays in
    float64, as the library reads them (a bool or a string is refused as it refuses it)."""
    if v is None or isinstance(v, torch.Tensor):
        return v
    return torch.as_tensor(real_array(v, name), device=like.device)


def entmax(x, alpha=1.5, dim=-1, *, method=None, backend=None):
    """alpha-entmax along ``dim``, differentiable in x and in a tensor ``alpha``
    (:func:`entmax_ref.entmax`).

    ``alpha`` is a number (a constant) or a tensor broadcastable to x's shape without
    ``dim`` (one per row, per head, ...), or of x's shape with size 1 along ``dim`` (the
    ``entmax`` package's form); its gradient is the library's
    :func:`entmax_ref.entmax_alpha_vjp` summed over the rows that share each entry.

    >>> import torch, entmax_ref.torch as ert
    >>> ert.entmax(torch.tensor([-2.0, 0.0, 0.5]), alpha=2).tolist()
    [0.0, 0.25, 0.75]
    """
    x = _tensor(x, "x")
    if isinstance(alpha, torch.Tensor):
        if alpha.dim() == x.dim() > 0 and alpha.shape[dim] == 1:
            alpha = alpha.squeeze(dim)  # the keepdims form: autograd sums its gradient back
        return entmax_fn(x, 1.5, alpha, dim, method, backend)
    return entmax_fn(x, number(alpha, "alpha"), None, dim, method, backend)


def softmax(x, dim=-1, *, backend=None):
    """Softmax (alpha = 1) along ``dim``, differentiable (:func:`entmax_ref.softmax`)."""
    return entmax_fn(_tensor(x, "x"), 1.0, None, dim, None, backend)


def entmax15(x, dim=-1, *, backend=None):
    """1.5-entmax along ``dim``, differentiable (:func:`entmax_ref.entmax15`)."""
    return entmax_fn(_tensor(x, "x"), 1.5, None, dim, None, backend)


def sparsemax(x, dim=-1, *, backend=None):
    """Sparsemax (alpha = 2) along ``dim``, differentiable (:func:`entmax_ref.sparsemax`)."""
    return entmax_fn(_tensor(x, "x"), 2.0, None, dim, None, backend)


def normmax(x, alpha=2.0, dim=-1, *, backend=None):
    """alpha-normmax along ``dim``, differentiable in x (:func:`entmax_ref.normmax`)."""
    return normmax_fn(_tensor(x, "x"), number(alpha, "alpha"), dim, backend)


def budget_sparsemax(x, budget=2.0, dim=-1, *, backend=None):
    """budget-sparsemax along ``dim``, differentiable in x (:func:`entmax_ref.budget_sparsemax`)."""
    return budget_fn(_tensor(x, "x"), number(budget, "budget"), dim, backend)


def _target(target: Any, x: Any) -> Any:
    return target if isinstance(target, torch.Tensor) else torch.as_tensor(target, device=x.device)


def entmax_loss(x, target, alpha=1.5, dim=-1, *, backend=None):
    """The alpha-entmax Fenchel-Young loss per row (float64), differentiable in x
    (:func:`entmax_ref.entmax_loss`; the gradient is :func:`entmax_ref.entmax_loss_grad`
    times the upstream gradient).  ``target``: class indices or probabilities; it is not
    differentiated (a target that requires grad is a RuntimeError in the backward).

    >>> import torch, entmax_ref.torch as ert
    >>> ert.entmax_loss(torch.tensor([-2.0, 0.0, 0.5]), torch.tensor(2), alpha=2).item()
    0.0625
    """
    x = _tensor(x, "x")
    return loss_fn(x, _target(target, x), "entmax", number(alpha, "alpha"), dim, backend)


def normmax_loss(x, target, alpha=2.0, dim=-1, *, backend=None):
    """The alpha-normmax Fenchel-Young loss per row (float64), differentiable in x
    (:func:`entmax_ref.normmax_loss`)."""
    x = _tensor(x, "x")
    return loss_fn(x, _target(target, x), "normmax", number(alpha, "alpha"), dim, backend)


def asentmax(x, alpha=1.5, *, beta, gamma, delta=1.0, offset=1.0, dim=-1, backend=None):
    """ASEntmax along ``dim`` (:func:`entmax_ref.asentmax`), differentiable in x and in
    tensors ``beta``, ``gamma``, ``delta`` (numbers are constants); their gradients are
    :func:`entmax_ref.asentmax_vjp`'s, shaped like them."""
    x = _tensor(x, "x")
    b, g, d = (_param(v, x, n) for v, n in ((beta, "beta"), (gamma, "gamma"), (delta, "delta")))
    return asentmax_fn(x, number(alpha, "alpha"), b, g, d, number(offset, "offset"), dim, backend)


def ssmax(x, *, beta, offset=1.0, dim=-1, backend=None):
    """Scalable softmax (:func:`entmax_ref.ssmax`): ASEntmax with alpha = 1, gamma = 1,
    delta = 0, differentiable in x and a tensor ``beta``."""
    return asentmax(x, 1.0, beta=beta, gamma=1.0, delta=0.0, offset=offset, dim=dim, backend=backend)


def attention(q, k, v, *, alpha=1.5, scale=None, causal=False, key_lengths=None, key_padding_mask=None,
              alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None, backend=None):
    """alpha-entmax attention (:func:`entmax_ref.attention`, the same arguments),
    differentiable in q, k, v and in tensors ``alpha`` (shape () or (Hq,)), ``beta``,
    ``gamma`` and ``delta``.

    The forward keeps the library's lossless residual (theta, the support's edge, the
    skewed output, the support keys), and the backward is :func:`entmax_ref.attention_vjp`
    of it: no row is solved twice.  Returns the output, (B, Hq, Nq, Dv).

    >>> import torch, entmax_ref.torch as ert
    >>> q = torch.ones(1, 1, 1, 1); k = torch.tensor([[[[0.0], [1.0]]]]); v = torch.eye(2)[None, None]
    >>> ert.attention(q, k, v, alpha=2, scale=1.0).tolist()
    [[[[0.0, 1.0]]]]
    """
    q, k, v = (_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    return attention_apply(q, k, v, None, None, locals())


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, alpha=1.5, scale=None, causal=False,
                     alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None, backend=None):
    """alpha-entmax attention of packed variable-length sequences
    (:func:`entmax_ref.attention_varlen`: q (total_q, Hq, D), k and v (total_k, Hkv, .)),
    differentiable like :func:`attention`."""
    q, k, v = (_tensor(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    return attention_apply(q, k, v, cu_seqlens_q, cu_seqlens_k, locals())
