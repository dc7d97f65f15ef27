"""Short reprs for result objects: dtype, shape and a few leading values per array field,
never whole arrays (an attention info holds (B, H, Nq) arrays and a (B, H, Nq, Dv) one)."""

from __future__ import annotations

from typing import Any

_SHOW = 3


def _field(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None or getattr(value, "ndim", 0) == 0:
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()
        return repr(value)
    flat = value.reshape(-1)[:_SHOW]
    if hasattr(flat, "get"):  # CuPy: copy the few values shown, nothing else
        flat = flat.get()
    vals = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in flat.tolist())
    more = ", ..." if value.size > _SHOW else ""
    return f"{getattr(value.dtype, 'name', value.dtype)}{tuple(shape)} [{vals}{more}]"


def short_repr(self: Any) -> str:
    """``Name(field=dtype(shape) [first values, ...], ...)`` for a dataclass or NamedTuple
    (dataclass fields declared with ``repr=False``, such as a backward's residual, are left out)."""
    names = getattr(self, "_fields", None) or tuple(
        name for name, f in getattr(self, "__dataclass_fields__", {}).items() if f.repr)  # repr=False: left out
    parts = ", ".join(f"{n}={_field(getattr(self, n))}" for n in names)
    return f"{type(self).__name__}({parts})"
