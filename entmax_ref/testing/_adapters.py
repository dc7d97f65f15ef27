"""Moving test data between NumPy and the array type a user's function speaks.

Nothing here imports a framework unless the caller's objects (or an explicit
``framework=`` request) need it: results are recognised by the module of their type
(the einops / array-api-compat ``sys.modules`` rule), so checking a NumPy function never
imports torch, jax or cupy.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

FRAMEWORKS = ("numpy", "torch", "jax", "cupy")


def _root(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def to_numpy(obj: Any, name: str = "result") -> np.ndarray:
    """``obj`` (NumPy, CuPy, PyTorch, JAX, anything with ``__dlpack__`` or ``__array__``,
    nested lists, Python scalars) as a NumPy array on the host, without copying NumPy input.

    bfloat16 tensors come back as float32 (NumPy has no bfloat16); the dtype to judge
    them by is reported by :func:`dtype_of`.  Raises TypeError naming the type when the
    object cannot be converted.
    """
    if isinstance(obj, np.ndarray):
        return obj
    root = _root(obj)
    try:
        if root == "torch":
            t = obj.detach()
            if str(t.dtype) == "torch.bfloat16":
                t = t.float()
            return t.cpu().numpy()
        if root == "cupy":
            return obj.get()
        if root in ("jax", "jaxlib"):
            return np.asarray(obj)
        if hasattr(obj, "__array__") or isinstance(obj, (list, tuple, float, int, np.generic)):
            return np.asarray(obj)
        if hasattr(obj, "__dlpack__"):
            return np.from_dlpack(obj)
    except Exception as exc:  # noqa: BLE001 - reported as a clear message
        raise TypeError(f"{name} of type {type(obj).__module__}.{type(obj).__name__} could not be "
                        f"converted to a NumPy array: {exc}") from None
    raise TypeError(f"{name} has type {type(obj).__module__}.{type(obj).__name__}, which is not an "
                    "array (expected NumPy, CuPy, PyTorch, JAX, DLPack or __array__)")


def dtype_of(obj: Any) -> np.dtype | str:
    """The floating dtype of ``obj`` as NumPy spells it ('bfloat16' as a string)."""
    dt = getattr(obj, "dtype", None)
    if dt is not None and "bfloat16" in str(dt):
        return "bfloat16"
    try:
        return np.dtype(dt) if dt is not None else to_numpy(obj).dtype
    except TypeError:
        return to_numpy(obj).dtype


def from_numpy(a: np.ndarray, framework: str = "numpy", device: Any = None) -> Any:
    """A copy of ``a`` as an array of ``framework`` ('numpy', 'torch', 'jax', 'cupy').

    The framework is imported here, so only when asked for.  JAX arrays keep float64
    only when ``jax_enable_x64`` is on (JAX's own rule); the check then compares in the
    dtype JAX actually returned.
    """
    a = np.array(a, copy=True)
    if framework == "numpy":
        return a
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}")
    mod = importlib.import_module("jax.numpy" if framework == "jax" else framework)
    if framework == "torch":
        t = mod.from_numpy(a)
        return t.to(device) if device is not None else t
    if framework == "cupy":
        if device is not None:
            with mod.cuda.Device(device):
                return mod.asarray(a)
        return mod.asarray(a)
    return mod.asarray(a)
