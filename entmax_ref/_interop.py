"""Arrays from other frameworks: in through DLPack (or NumPy's own protocols), out in the
caller's array type.

Every public function is wrapped by :func:`public`.  Before the call, each array argument
that is not a NumPy or CuPy array but comes from a framework (a torch tensor, a JAX array,
any object with ``__dlpack__``) is viewed as a NumPy array, without a copy where the memory
allows (DLPack, or torch's ``.numpy()``; a tensor that requires grad is detached first,
bfloat16 is viewed as ``ml_dtypes.bfloat16``).  After the call every array in the result
(plain, in a tuple or NamedTuple, or a field of an info dataclass) goes back into the type
of the first such argument: torch in, torch out (``torch.from_numpy``, zero-copy), JAX in,
JAX out, and any array-API array through its namespace's ``from_dlpack``.  An object with
``__dlpack__`` but no array namespace gets NumPy arrays back.

Frameworks are recognised from the type's module name: torch and jax are never imported
here unless the caller has already passed (and therefore imported) their arrays.
NumPy masked arrays are rejected (their mask would be silently ignored otherwise).

A torch tensor that requires grad is read detached, so the result is a tensor that autograd
does not follow; the first such call in a process warns (a UserWarning naming
:mod:`entmax_ref.torch`, whose functions are the same ones made differentiable).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from typing import Any, Callable

import numpy as np

_NATIVE_MODULES = ("numpy", "cupy", "builtins")


def _root(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def is_torch(x: Any) -> bool:
    return _root(x) == "torch" and hasattr(x, "detach")


def is_foreign(x: Any) -> bool:
    """True for a framework array this module converts (torch, JAX, any ``__dlpack__``)."""
    if isinstance(x, np.ndarray) or _root(x) in _NATIVE_MODULES:
        return False
    return is_torch(x) or hasattr(x, "__dlpack__")


def reject_masked(x: Any, name: str) -> None:
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a NumPy masked array, which entmax_ref does not accept (its mask would be "
            f"ignored); mask scores with -inf instead, e.g. np.ma.filled({name}, -np.inf)"
        )


def _bfloat16() -> Any:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes ships with jax and most torch stacks
        raise TypeError("bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)") from None
    return ml_dtypes.bfloat16


def _torch_to_numpy(t: Any) -> np.ndarray:
    torch = sys.modules["torch"]
    t = t.detach()
    if t.device.type != "cpu":
        raise TypeError(
            f"a torch tensor on {t.device} cannot be read by the CPU backends; pass t.cpu() "
            "(or a CuPy array for the cupy backend)"
        )
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bfloat16())
    return t.numpy()


def to_numpy(x: Any) -> Any:
    """A NumPy view of a framework array (unchanged for anything else)."""
    if not is_foreign(x):
        return x
    if is_torch(x):
        return _torch_to_numpy(x)
    if _root(x) in ("jax", "jaxlib"):
        return np.asarray(x)  # zero-copy on CPU, and knows JAX's bfloat16
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, RuntimeError, ValueError):
        if hasattr(x, "__array__"):
            return np.asarray(x)
        raise TypeError(
            f"cannot read a {type(x).__module__}.{type(x).__name__} through DLPack on the CPU; "
            "pass a NumPy array"
        ) from None


def _to_torch(a: np.ndarray) -> Any:
    torch = sys.modules["torch"]
    if not a.flags.writeable:
        a = a.copy()  # torch.from_numpy warns on read-only memory
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _converter(like: Any) -> Callable[[np.ndarray], Any]:
    if is_torch(like):
        return _to_torch
    if hasattr(like, "__array_namespace__"):
        ns = like.__array_namespace__()

        def via_namespace(a: np.ndarray) -> Any:
            if _root(like) in ("jax", "jaxlib"):
                return ns.asarray(a)  # jax copies what it cannot alias; no dlpack alignment rules
            try:
                return ns.from_dlpack(a)
            except (BufferError, TypeError, RuntimeError, ValueError):
                return ns.asarray(a)

        return via_namespace
    return lambda a: a


def _convert_out(res: Any, conv: Callable[[np.ndarray], Any]) -> Any:
    if isinstance(res, (np.ndarray, np.generic)):
        return conv(np.asarray(res))
    if isinstance(res, tuple):
        items = [_convert_out(r, conv) for r in res]
        return type(res)(*items) if hasattr(res, "_fields") else tuple(items)
    if _is_record(res):
        return dataclasses.replace(
            res, **{f.name: _convert_out(getattr(res, f.name), conv) for f in dataclasses.fields(res)}
        )
    return res


def _is_record(x: Any) -> bool:
    """An info dataclass instance (a forward's result passed back in, e.g. ``info=``)."""
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _foreign_in(x: Any) -> Any:
    """The first framework array of an argument: itself, or a field of an info record."""
    if _is_record(x):
        return next((f for f in (getattr(x, d.name) for d in dataclasses.fields(x)) if is_foreign(f)), None)
    return x if is_foreign(x) else None


def _arg_to_numpy(x: Any) -> Any:
    """:func:`to_numpy` of an argument, field by field for an info record."""
    if _is_record(x):
        return dataclasses.replace(x, **{f.name: to_numpy(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return to_numpy(x)


#: whether this process was told that a tensor requiring grad is read detached (once)
_told_detached = False


def _warn_detached(objs: Any) -> None:
    """The one warning of a process whose call passed a torch tensor that requires grad."""
    global _told_detached
    if _told_detached or not any(is_torch(o) and getattr(o, "requires_grad", False) for o in objs):
        return
    _told_detached = True
    warnings.warn(
        "entmax_ref's functions read a tensor that requires grad detached: the result is a tensor "
        "autograd does not follow. For gradients use entmax_ref.torch (the same functions, differentiable); "
        "this warning is given once per process",
        UserWarning, stacklevel=3)


def public(fn: Callable) -> Callable:
    """Decorate a public function: framework arrays in (arguments, and the fields of an
    info record passed back in), the same framework's arrays out."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        like = next((f for f in map(_foreign_in, (*args, *kwargs.values())) if f is not None), None)
        if like is None:
            return fn(*args, **kwargs)
        _warn_detached((*args, *kwargs.values()))
        args = tuple(_arg_to_numpy(a) for a in args)
        kwargs = {k: _arg_to_numpy(v) for k, v in kwargs.items()}
        return _convert_out(fn(*args, **kwargs), _converter(like))

    return wrapper
