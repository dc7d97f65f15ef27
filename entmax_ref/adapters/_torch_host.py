"""Tensors to the arrays the engines read, and back; the double-backward guard.

A CPU tensor is viewed as a NumPy array without a copy (:mod:`entmax_ref._interop`: detached,
bfloat16 through ``ml_dtypes``); a CUDA tensor goes to CuPy through DLPack when the cupy
backend can run, and is refused with a TypeError otherwise.  Results come back as new
tensors on the input's device.
"""

from __future__ import annotations

from typing import Any

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
    """A new tensor holding the engine's result ``a`` on ``like``'s device."""
    if a is None:
        return None
    if isinstance(a, (np.ndarray, np.generic)):
        a = np.asarray(a)
        return _interop._to_torch(a)  # a fresh array of the engine (read-only ones are copied)
    out = torch.from_dlpack(a)
    return out if out.device == like.device else out.to(like.device)


def empty(*shape: Any, like: Any, dtype: Any = torch.float64) -> Any:
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
        "Hessians are not supported)"
    )


def backward_only(op: Any) -> Any:
    """Register ``op`` (a backward operation) as having no derivative of its own: autograd
    then raises a clear RuntimeError on a double backward instead of returning zeros."""
    op.register_autograd(_refuse_double_backward)
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
