"""Input checks and the canonical (rows, n) layout shared by every public function.

Public functions validate here, once, and hand backends C-contiguous float32/float64
``(rows, n)`` arrays.  Nothing here writes to its inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _interop
from .backends._base import xp_of

_LOW_PRECISION = ("float16", "bfloat16")


def as_array(x: Any, name: str = "x") -> Any:
    """``x`` as a CuPy array if it is one, else as a NumPy array (lists, scalars, framework
    arrays through :mod:`entmax_ref._interop` and other ``__array__`` objects are converted;
    NumPy arrays are not copied).  NumPy masked arrays are rejected (TypeError)."""
    _interop.reject_masked(x, name)
    x = _interop.to_numpy(x)
    return xp_of(x).asarray(x)


def namespace(*objs: Any) -> Any:
    """The array namespace of the first of ``objs`` whose namespace is not NumPy's (a CuPy
    array, or an array type declaring ``__array_namespace__``), else numpy.  Python
    scalars, lists and NumPy arrays among ``objs`` are then moved there explicitly by the
    caller (``xp.asarray``): small parameters may come from the host."""
    for obj in objs:
        xp = xp_of(obj)
        if xp is not np:
            return xp
    return np


def to_host(a: Any) -> Any:
    """A small parameter array on the host: NumPy input as it is, a device array through
    its explicit ``.get()`` (CuPy's device-to-host copy), never an implicit conversion."""
    if xp_of(a) is not np and hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


def is_real_dtype(dt: Any) -> bool:
    """Real floating (float16/32/64, bfloat16) or integer, not bool."""
    dt = np.dtype(dt)
    return dt.name in _LOW_PRECISION or dt.kind in "fiu"


def shown(value: Any) -> Any:
    """``value`` as an error message shows it: a NumPy scalar as the Python number it holds
    (``0.5``, not NumPy 2's ``np.float64(0.5)``), anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def eps_of(dt: Any) -> float:
    """Machine epsilon of a floating dtype (bfloat16 included); float64's for integers."""
    dt = np.dtype(dt)
    if dt.name == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(dt if dt.kind == "f" else np.float64).eps)


def result_dtype(*dts: Any) -> np.dtype:
    """The dtype a result combining inputs of these storage dtypes is returned in: the
    widest float among them (float16 with bfloat16 gives float32; integers count as
    float64)."""
    dts = [np.dtype(d) for d in dts]
    if len(set(dts)) == 1 and (dts[0].kind == "f" or dts[0].name in _LOW_PRECISION):
        return dts[0]
    if any(d.kind in "iu" or d == np.float64 for d in dts):
        return np.dtype(np.float64)
    if any(d == np.float32 for d in dts) or len(set(dts)) > 1:
        return np.dtype(np.float32)
    return dts[0]


def cast(a: Any, dtype: Any) -> Any:
    """``a`` in ``dtype``; values beyond a narrow dtype's range round to +-inf, as any
    rounding does, without a warning (a float16 VJP at large alpha may exceed 65504)."""
    with np.errstate(over="ignore"):
        return a.astype(dtype, copy=False)


def real_array(a: Any, name: str) -> np.ndarray:
    """A real scalar or array parameter (alpha, beta, scale, ...) as float64 NumPy."""
    _interop.reject_masked(a, name)
    arr = np.asarray(a.get() if hasattr(a, "get") else _interop.to_numpy(a))
    if not is_real_dtype(arr.dtype) or arr.dtype.kind == "b":
        raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def compute_dtype(arr: Any, name: str) -> tuple[np.dtype, np.dtype]:
    """(dtype to compute in, dtype to return) under design.md's dtype policy.  Both are
    in the machine's byte order: a big-endian float64 (``>f8``) is computed and returned
    as float64 (``astype`` to them converts the bytes)."""
    dt = np.dtype(arr.dtype)
    if dt.byteorder not in "=|":  # a non-native byte order: the same values, natively stored
        dt = dt.newbyteorder("=")
    if dt.name in _LOW_PRECISION:
        return np.dtype(np.float32), dt
    if dt.kind == "f":
        if dt.itemsize > 8:
            raise TypeError(f"{name} has dtype {dt}; use float64 or narrower")
        return dt, dt
    if dt.kind in "iu":
        return np.dtype(np.float64), np.dtype(np.float64)
    raise TypeError(f"{name} has unsupported dtype {dt}; expected a real floating or integer array")


def check_finite(arr: Any, name: str, *, allow_neg_inf: bool, locate: Any = None) -> None:
    """ValueError naming how many bad values there are and where the first one is
    (``locate`` maps that index in ``arr`` to the one the message names, for an ``arr``
    gathered from a larger array; by default the index in ``arr``)."""
    xp = xp_of(arr)
    if arr.size == 0:
        return
    # Fast paths.  One pass: a sum is finite only when every entry is (NaN propagates,
    # +inf and -inf give an infinite or NaN sum).  Finite entries may overflow it, which
    # is no error of the input: that is silenced here, and an infinite sum falls through
    # to the max (NaN when any entry is NaN, +inf when one is) and min.  (A sum is a
    # quarter faster than np.isfinite(arr).all(), which writes a boolean array.)
    if not allow_neg_inf and arr.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            total = float(xp.sum(arr))
        if abs(total) < np.inf:
            return
    top = float(xp.max(arr))
    if top < np.inf and (allow_neg_inf or float(xp.min(arr)) > -np.inf):
        return
    bad = xp.isnan(arr) | (arr == np.inf) if allow_neg_inf else ~xp.isfinite(arr)
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad.ravel())), arr.shape))
        where = first if locate is None else tuple(locate(first))
        what = "NaN or +inf" if allow_neg_inf else "NaN or infinite"
        hint = "; use -inf to mask an entry" if allow_neg_inf else ""
        raise ValueError(
            f"{name} contains {count} {what} value{'s' if count > 1 else ''}; the first is "
            f"{name}[{', '.join(map(str, where))}] = {shown(arr[first])!r}{hint}"
        )


def normalize_axis(axis: int, ndim: int, name: str = "x") -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} is out of range for {name} with {ndim} dimension(s)")
    return int(axis) % max(ndim, 1)


@dataclass(frozen=True)
class Rows:
    """An input laid out as C-contiguous (rows, n), with what is needed to undo it."""

    data: Any  #: (rows, n) in the compute dtype
    shape: tuple  #: the input's shape (0-d inputs are treated as shape (1,))
    axis: int
    out_dtype: np.dtype
    scalar: bool = False  #: the input was 0-d: results come back 0-d (per-row results too)
    #: the validated input before the layout (for :func:`check_finite`'s messages, which name
    #: entries by their index in it); None when the Rows was not built by :func:`to_rows`
    source: Any = None

    @property
    def batch_shape(self) -> tuple:
        return self.shape[: self.axis] + self.shape[self.axis + 1 :]

    def restore(self, a2d: Any) -> Any:
        """(rows, n) back to the input's shape and dtype."""
        if not self.scalar and self.axis == len(self.shape) - 1 and a2d.dtype == self.out_dtype:
            return a2d.reshape(self.shape)  # along the last axis in its own dtype: a reshape
        xp = xp_of(a2d)
        moved = a2d.reshape(self.batch_shape + (self.shape[self.axis],))
        out = cast(xp.moveaxis(moved, -1, self.axis), self.out_dtype)
        return out.reshape(()) if self.scalar else out

    def per_row(self, a1d: Any) -> Any:
        """(rows,) back to the batch shape (the input's shape without the axis)."""
        return a1d.reshape(self.batch_shape)

    def like(self, out_dtype: Any) -> "Rows":
        """The same layout, returned in another dtype."""
        return Rows(self.data, self.shape, self.axis, np.dtype(out_dtype), self.scalar, self.source)


#: the dtypes a NumPy input is computed in as it is (:func:`to_rows`'s direct path)
_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def to_rows(x: Any, axis: int, name: str, *, finite: bool = True, allow_neg_inf: bool = True,
            dtype: np.dtype | None = None) -> Rows:
    """Validate ``x`` and lay it out as (rows, n) along ``axis``.  A C-contiguous NumPy
    float32/float64 array along its last axis (the common call) is laid out by a reshape
    without the general path's conversions: the same Rows, at a tenth of the Python work
    (which runs with cold caches after each call over a large input: 0.12 ms of a 3 ms
    1.5-entmax call on 512 x 8192 float32)."""
    if (type(x) is np.ndarray and type(axis) is int and x.ndim >= 1 and axis in (-1, x.ndim - 1)
            and dtype is None and x.dtype in _NATIVE and x.flags.c_contiguous):
        if finite:
            check_finite(x, name, allow_neg_inf=allow_neg_inf)
        n = x.shape[-1]
        rows = x.size // n if n else int(np.prod(x.shape[:-1]))
        return Rows(x.reshape(rows, n), x.shape, x.ndim - 1, x.dtype, False, x)
    arr = as_array(x, name)
    cdt, odt = compute_dtype(arr, name)
    if dtype is not None:
        cdt = dtype
    shape0 = tuple(arr.shape)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    ax = normalize_axis(axis, arr.ndim, name)
    if finite:
        check_finite(arr, name, allow_neg_inf=allow_neg_inf)
    xp = xp_of(arr)
    n = arr.shape[ax]
    rows = int(np.prod(arr.shape)) // n if n else int(np.prod(arr.shape[:ax] + arr.shape[ax + 1 :]))
    data = xp.ascontiguousarray(xp.moveaxis(arr, ax, -1).astype(cdt, copy=False)).reshape(rows, n)
    return Rows(data, tuple(arr.shape), ax, odt, shape0 == (), arr)


def same_shape(a: Rows, b: Rows, names: tuple[str, str]) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} has shape {a.shape} but {names[1]} has shape {b.shape}; they must match")


def common_dtype(*dts: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dts) else np.dtype(np.float32)


def finite_real(a: Any, name: str) -> np.ndarray:
    """A real parameter as float64 NumPy, with a ValueError naming the first non-finite value."""
    arr = real_array(a, name)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {shown(arr.ravel()[~np.isfinite(arr.ravel())][0])!r}")
    return arr


def per_row(a: np.ndarray, name: str, rows: Rows, xp: Any = np) -> Any:
    """A validated float64 parameter, one value per row of ``rows``, as a (rows,) array of
    ``xp``: ``a`` broadcasts to the row shape (the input's shape without its axis), or has
    the input's shape with size 1 along the axis (the keepdims form, ``x.sum(axis,
    keepdims=True).shape``, which the ``entmax`` package takes)."""
    batch_shape = rows.batch_shape
    if not rows.scalar and a.ndim == len(rows.shape) and a.shape[rows.axis] == 1:
        a = a.reshape(a.shape[:rows.axis] + a.shape[rows.axis + 1:])  # the keepdims form
    try:
        a = np.broadcast_to(a, batch_shape)
    except ValueError:
        raise ValueError(
            f"{name} of shape {a.shape} does not broadcast to the row shape {batch_shape} "
            "(the input's shape with the axis removed), nor has the input's shape with size 1 "
            "along the axis"
        ) from None
    return xp.asarray(np.ascontiguousarray(a).reshape(-1))


def alpha_rows(alpha: Any, rows: Rows, xp: Any = np) -> Any:
    """alpha as a float64 (rows,) array: a scalar, or one value per row as :func:`per_row`
    takes it.  A Python float or int in ``[1, 1e300]`` is filled in directly (the checks
    below would pass it unchanged; a larger int takes them, which reject one past float64's
    range)."""
    if xp is np and type(alpha) in (float, int) and 1.0 <= alpha <= 1e300:
        return np.full(math.prod(rows.batch_shape), float(alpha))
    a = finite_real(alpha, "alpha")
    if np.any(a < 1.0):
        raise ValueError(f"alpha must be >= 1, got {shown(a.ravel()[a.ravel() < 1.0][0])!r}")
    return per_row(a, "alpha", rows, xp)
