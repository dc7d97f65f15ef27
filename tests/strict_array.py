"""A CPU stand-in for a device array type, and a backend that computes on it.

:class:`StrictArray` behaves like a CuPy array where it matters to the public layer: it
refuses implicit conversion to NumPy (``np.asarray(x)`` raises TypeError, as CuPy does),
refuses to mix with NumPy arrays in arithmetic and in its namespace's functions, and leaves
the device only through the explicit ``.get()``.  Its namespace (``x.__array_namespace__()``)
mirrors NumPy's functions on StrictArrays, the way CuPy mirrors them on the GPU; its
``asarray`` / ``array`` accept NumPy input (the explicit host-to-device transfer).

:class:`StrictBackend` (registered as ``"strict"``) computes on StrictArrays by unwrapping
them to NumPy inside the backend methods, calling the NumPy reference and wrapping the
results, as the CuPy backend's kernels would.  Running every public function with
``backend="strict"`` on StrictArray inputs therefore fails wherever the public layer calls
NumPy on an array it was given: CI catches such a leak without a GPU.
"""

from __future__ import annotations

import operator
import types
from typing import Any

import numpy as np

from entmax_ref.backends import AttentionForward, AttentionGrads, RowSolve, capabilities, get_backend, register_backend
from entmax_ref.backends._base import ExactRowSolve
from entmax_ref.backends._base import AttentionResidual

NAME = "strict"


class StrictConversionError(TypeError):
    pass


def _refuse(what: str):
    raise StrictConversionError(
        f"implicit conversion of a StrictArray to {what} is not allowed (use .get(), as with CuPy)"
    )


def _unwrap(obj: Any, *, allow_numpy: bool = False) -> Any:
    """StrictArray -> its ndarray (recursively in tuples/lists); NumPy arrays are refused
    unless ``allow_numpy`` (mixing host and device arrays is an error on CuPy)."""
    if isinstance(obj, StrictArray):
        return obj._a
    if isinstance(obj, np.ndarray) and not allow_numpy:
        raise TypeError(f"a NumPy array of shape {obj.shape} was mixed with StrictArrays (a host/device mix)")
    if isinstance(obj, (tuple, list)):
        return type(obj)(_unwrap(o, allow_numpy=allow_numpy) for o in obj)
    return obj


def _wrap(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return StrictArray(obj)
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


class StrictArray:
    """An ndarray in a box that, like a CuPy array, will not become a NumPy array implicitly."""

    __slots__ = ("_a",)
    __array_ufunc__ = None  # numpy binary operators defer to ours (which refuse ndarrays)

    def __init__(self, data: np.ndarray):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"StrictArray wraps an ndarray, got {type(data).__name__}")
        self._a = data

    # --- the explicit ways out, and the refused implicit ones
    def get(self) -> np.ndarray:
        """The data as a NumPy array (the explicit device-to-host copy, like cupy's)."""
        return self._a.copy()

    def __array__(self, dtype=None, copy=None):
        _refuse("a NumPy array")

    def __len__(self) -> int:
        return len(self._a)

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __bool__(self):
        return bool(self._a)

    def __index__(self):
        return operator.index(self._a)

    def __repr__(self) -> str:
        return f"StrictArray({self._a!r})"

    def __array_namespace__(self, api_version=None):
        return namespace

    # --- array attributes and methods: delegated, results wrapped (see __getattr__)
    @property
    def T(self):
        return StrictArray(self._a.T)

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__, __array_struct__, __dlpack__: no way into NumPy
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

        return method

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)


def _binary(op):
    def forward(self, other):
        return _wrap(op(self._a, _unwrap(other)))

    def reverse(self, other):
        return _wrap(op(_unwrap(other), self._a))

    return forward, reverse


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "matmul"):
    _f, _r = _binary(getattr(operator, _name + "_" if _name in ("and", "or") else _name))
    setattr(StrictArray, f"__{_name}__", _f)
    setattr(StrictArray, f"__r{_name}__", _r)
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(StrictArray, f"__{_name}__", _binary(getattr(operator, _name))[0])
for _name in ("neg", "pos", "abs", "invert"):
    setattr(StrictArray, f"__{_name}__", (lambda op: lambda self: StrictArray(op(self._a)))(getattr(operator, _name)))
StrictArray.__hash__ = None


class _Namespace(types.ModuleType):
    """NumPy's functions on StrictArrays (CuPy's role); NumPy arrays are refused except by
    the explicit transfers ``asarray`` and ``array``."""

    _TRANSFERS = frozenset({"asarray", "array"})

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, types.ModuleType):
            raise AttributeError(f"the strict namespace has no submodule {name!r}")
        if not callable(attr) or isinstance(attr, type):
            return attr  # constants, dtypes and scalar types

        allow = name in self._TRANSFERS

        def function(*args, **kwargs):
            args = _unwrap(args, allow_numpy=allow)
            kwargs = {k: _unwrap(v, allow_numpy=allow) for k, v in kwargs.items()}
            return _wrap(attr(*args, **kwargs))

        function.__name__ = name
        return function


namespace = _Namespace("strict_namespace")


def asarray(a) -> StrictArray:
    """Host data to a StrictArray (a copy, as a transfer to a device would be)."""
    return StrictArray(np.array(a))


def to_numpy(a):
    return a.get() if isinstance(a, StrictArray) else a


# ----------------------------------------------------------------------------- the backend
def _host(a):
    return a._a if isinstance(a, StrictArray) else a


def _delegate(op: str, n_arrays: int, fields=None):
    """A backend method: checks that its first ``n_arrays`` arguments are StrictArrays,
    runs the reference's ``op`` on the host data and wraps the result (field by field into
    the tuple type ``fields`` when given)."""

    def method(self, *args):
        self._check(*args[:n_arrays])
        res = getattr(self._ref, op)(*(_host(a) for a in args))
        if fields is None:
            return _wrap(res)
        if isinstance(res, ExactRowSolve):  # correctly rounded rows carry their tau
            return ExactRowSolve(*(_wrap(f) for f in res), _wrap(res.tau))
        return fields(*(_wrap(f) for f in res))

    method.__name__ = op
    return method


class StrictBackend:
    """Computes on StrictArrays: unwraps them inside each method, runs the NumPy reference,
    wraps the results.  Small parameter arrays of the contract may be NumPy (as on cupy)."""

    name = NAME

    def __init__(self):
        self._ref = get_backend("numpy")

    def owns(self, x) -> bool:
        return isinstance(x, StrictArray)

    def _check(self, *arrays):
        for a in arrays:
            if a is not None and not isinstance(a, StrictArray):
                raise TypeError(f"the strict backend got a {type(a).__name__} where its contract wants its own arrays")

    def entmax_forward(self, x, alpha, method):
        capabilities.require(self.name, "entmax_forward", method)
        return self._entmax_forward(x, alpha, method)

    _entmax_forward = _delegate("entmax_forward", 1, RowSolve)
    entmax_vjp = _delegate("entmax_vjp", 2)
    entmax_alpha_vjp = _delegate("entmax_alpha_vjp", 2)
    normmax_forward = _delegate("normmax_forward", 1, RowSolve)
    normmax_vjp = _delegate("normmax_vjp", 2)
    budget_forward = _delegate("budget_forward", 1, RowSolve)
    budget_vjp = _delegate("budget_vjp", 2)

    def _spec(self, spec):
        from dataclasses import replace

        return replace(spec, row_scale=_host(spec.row_scale))

    def attention_forward(self, q, k, v, spec):
        self._check(q, k, v)
        res = self._ref.attention_forward(_host(q), _host(k), _host(v), self._spec(spec))
        return AttentionForward(*(_wrap(f) for f in res))

    def attention_backward(self, do, q, k, v, res, skew, spec):
        self._check(do, q, k, v, res.theta, skew)
        host_res = AttentionResidual(*(_host(f) for f in (res.theta, res.row_max, res.edge, res.edge_p)))
        res = self._ref.attention_backward(_host(do), _host(q), _host(k), _host(v), host_res, _host(skew),
                                           self._spec(spec))
        return AttentionGrads(*(_wrap(f) for f in res))


def register() -> None:
    """Register the ``"strict"`` backend (idempotent)."""
    register_backend(NAME, StrictBackend, capabilities={
        "entmax_forward": (None, "sort", "bisect"),
        "entmax_vjp": (None,), "entmax_alpha_vjp": (None,), "attention_forward": (None,), "attention_backward": (None,),
        "normmax_forward": (None,), "normmax_vjp": (None,), "budget_forward": (None,), "budget_vjp": (None,),
    })


def unregister() -> None:
    """Remove the ``"strict"`` backend again, so that it never shows in other tests' views of
    the registry (e.g. the list of valid names in an error message)."""
    from entmax_ref import backends

    backends._REGISTRY.pop(NAME, None)
    backends._instances.pop(NAME, None)
    capabilities.remove_backend(NAME)
