"""Tensors to the arrays the engines read, and back; operations made differentiable.

A CPU tensor is viewed as a NumPy array without a copy (:mod:`entmax_ref._interop`: detached,
bfloat16 through ``ml_dtypes``); a CUDA tensor goes to CuPy through DLPack when the cupy
backend can run, and is refused with a TypeError otherwise.  Results come back as new,
contiguous tensors on the input's device, and the fake (shape-only) implementations that
``torch.compile`` traces return contiguous tensors too: the same strides as the real ones.

An operation is made differentiable by a ``torch.autograd.Function`` with a separate
``setup_context`` (:func:`differentiable`), so that ``torch.func.grad``, ``jacrev`` and
``vmap`` take it as autograd does; every operation has a vmap rule that runs it once per
element of the mapped dimension (:func:`sequential_vmap`).  Gradients are first order
only: a backward's results are differentiable only to refuse a double backward
(:func:`first_order`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a venv without torch
    raise ImportError(
        "entmax_ref.torch needs PyTorch: pip install torch (or pip install \"entmax-ref[torch]\")",
        name="torch",
    ) from exc

from .. import _interop

#: The namespace of every operation registered with torch.library.
NS = "entmax_ref"


def _cupy_usable() -> bool:
    from ..backends import available_backends

    return "cupy" in available_backends()


def host(t: Any, name: str) -> Any:
    """The array the engines read for tensor ``t`` (``name`` for errors); None stays None."""
    if t is None:
        return None
    if t.device.type == "cpu":
        return _interop.to_numpy(t)
    if t.device.type == "cuda" and _cupy_usable():
        import cupy

        return cupy.from_dlpack(t.detach())
    raise TypeError(
        f"{name} is a tensor on {t.device}: entmax_ref.torch computes on CPU tensors, and on CUDA "
        f"tensors only where the cupy backend runs (pip install \"entmax-ref[cuda]\" and a visible "
        f"GPU); pass {name}.cpu()"
    )


def tensor(a: Any, like: Any) -> Any:
    """A new contiguous tensor holding the engine's result ``a`` on ``like``'s device."""
    if a is None:
        return None
    if isinstance(a, (np.ndarray, np.generic)):
        # a fresh array of the engine (read-only ones are copied), in C order as the fakes say
        a = np.asarray(a)
        return _interop._to_torch(a if a.flags.c_contiguous else a.copy(order="C"))
    out = torch.from_dlpack(a).contiguous()
    return out if out.device == like.device else out.to(like.device)


def empty(*shape: Any, like: Any, dtype: Any = torch.float64) -> Any:
    """A contiguous tensor of ``shape`` on ``like``'s device: what :func:`tensor` returns."""
    return torch.empty(shape, dtype=dtype, device=like.device)



def promote(*dtypes: Any) -> Any:
    """The dtype the library returns for inputs of these dtypes (see ``_validate.result_dtype``)."""
    if len(set(dtypes)) == 1 and dtypes[0].is_floating_point:
        return dtypes[0]
    if any(not d.is_floating_point or d == torch.float64 for d in dtypes):
        return torch.float64
    return torch.float32


def out_dtype(x: Any) -> Any:
    """A transform's output dtype: x's, float64 for integer x."""
    return x.dtype if x.dtype.is_floating_point else torch.float64


def without_dim(shape: Any, dim: int) -> list:
    d = dim % len(shape) if len(shape) else 0
    return [s for i, s in enumerate(shape) if i != d]


def _refuse_double_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError(
        "entmax_ref.torch computes first derivatives only: the backward of its operations has no "
        "backward itself (double backward, torch.autograd.gradgradcheck, create_graph=True "
        "Hessians, nested torch.func.grad are not supported)"
    )


def _first_order_setup(ctx: Any, inputs: Any, output: Any) -> None:
    pass


#: the identity on a backward's results, whose own backward refuses (see :func:`first_order`)
_FirstOrder = type("FirstOrder", (torch.autograd.Function,), {
    "generate_vmap_rule": True,
    "forward": staticmethod(lambda n, *tensors: tuple(t.clone() for t in tensors[:n])),
    "setup_context": staticmethod(_first_order_setup),
    "backward": staticmethod(lambda ctx, *grads: _refuse_double_backward(ctx)),
})


def first_order(grads: Any, *inputs: Any) -> tuple:
    """The gradients ``grads`` (tensors or None) that a backward computed from ``inputs``
    (the tensors it read), differentiable only so that differentiating them again raises a
    clear RuntimeError instead of giving zeros.  Nothing is recorded when autograd records
    nothing (a plain ``.backward()``)."""
    grads = tuple(grads)
    if not torch.is_grad_enabled():
        return grads
    present = [g for g in grads if g is not None]
    anchors = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    marked = iter(_FirstOrder.apply(len(present), *present, *anchors))
    return tuple(None if g is None else next(marked) for g in grads)


def differentiable(name: str, forward: Callable, setup: Callable, backward: Callable) -> Callable:
    """``forward`` (a module's function calling its custom operations, which
    ``torch.compile`` then finds by name) made differentiable: the ``apply`` of a
    ``torch.autograd.Function`` whose ``setup_context`` is ``setup(ctx, inputs, output)`` and
    whose backward is ``backward(ctx, *grads)``.  ``backward`` calls the backward operations
    on detached tensors and returns :func:`first_order` gradients."""
    return type(name, (torch.autograd.Function,), {
        "generate_vmap_rule": True,
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup),
        "backward": staticmethod(backward),
    }).apply


def _element(arg: Any, dim: Any, i: int) -> Any:
    if isinstance(dim, int):
        return arg.select(dim, i)
    if isinstance(dim, (list, tuple)):  # a list of tensors
        return type(arg)(_element(a, d, i) for a, d in zip(arg, dim))
    return arg


def sequential_vmap(op: Any, adjust: Callable | None = None) -> Any:
    """Register for ``op`` a vmap rule that calls it once per element of the mapped
    dimension and stacks the results (the library's functions take any batch shape, but a
    ``dim`` or a per-row parameter does not follow a mapped axis: one call per element keeps
    their meaning).  ``adjust`` maps each element's results first (to drop a part whose
    shape varies between elements).  Returns ``op``."""
    def rule(info: Any, in_dims: Any, *args: Any) -> Any:
        outs = [op(*(_element(a, d, i) for a, d in zip(args, in_dims))) for i in range(info.batch_size)]
        if adjust is not None:
            outs = [adjust(o) for o in outs]
        if isinstance(outs[0], torch.Tensor):
            return torch.stack(outs), 0
        parts = [torch.stack(p) for p in zip(*outs)]
        return type(outs[0])(parts), type(outs[0])(0 for _ in parts)

    torch.library.register_vmap(op, rule)
    return op


def sum_to(g: Any, like: Any) -> Any:
    """Per-row gradient ``g`` summed back to the shape of the parameter ``like`` it was
    broadcast from, in ``like``'s dtype."""
    if tuple(g.shape) != tuple(like.shape):
        lead = g.dim() - like.dim()
        if lead > 0:
            g = g.sum(dim=tuple(range(lead)))
        dims = tuple(i for i, s in enumerate(like.shape) if s == 1 and g.shape[i] != 1)
        if dims:
            g = g.sum(dim=dims, keepdim=True)
    return g.to(like.dtype)
