"""A CPU stand-in for the part of CuPy 14 that entmax-ref uses, loaded as the module ``cupy``.

It is as strict as CuPy where a GPU would differ from the host:

* :class:`ndarray` is not a NumPy array: ``np.asarray(device_array)`` (any implicit
  conversion to the host) raises TypeError as CuPy's ``__array__`` does; the host copy is
  ``.get()``.  NumPy functions and ufuncs called on device arrays run this module's
  function of the same name (CuPy's ``__array_function__`` / ``__array_ufunc__``), and a
  NumPy array mixed with device arrays is a TypeError.
* The module exposes only names CuPy 14 has (``cupy14_names.txt``, the public names of
  cupy-cuda12x 14.2; tests/test_cuda_emu_kernels.py checks the subset), and of those only
  the ones the library and its tests use.
* Float32 elementwise work, casts and reductions flush float32 subnormals to zero, inputs
  and results: CuPy compiles its own kernels with ``-ftz=true``.  Products (``matmul``,
  cuBLAS) do not.
* Device memory is host memory that ends at an inaccessible page: a kernel that reads or
  writes past the end of an array faults, and the emulator fails the launch with the
  address (:class:`RawKernel` names the array).  The bytes before an array are filled
  with a pattern that each launch checks, so a write before an array is seen too.
  ``empty`` memory is filled with 0xff bytes (NaN), as uninitialised as on a GPU.

:class:`RawModule` compiles the CUDA source with the emulation header (:mod:`.build`,
cached by content), with the options CuPy appends to the given ones, and launches its
kernels on the CPU (:mod:`.launcher`).  Which build (fibers, OS threads, a sanitizer) is
:data:`VARIANT`, set by :func:`tests.cuda_emu.stand_in_cupy`.  ``matmul`` is NumPy's
(cuBLAS is not emulated), in TF32 precision for float32 when ``CUPY_TF32=1`` is set (as
CuPy reads it at its first float32 product).  Use it through :func:`cuda_emu.stand_in_cupy`,
which installs and removes it.
"""

from __future__ import annotations

import builtins
import ctypes
import mmap
import operator
import os
import threading
import weakref
from pathlib import Path

import numpy as _np

from cuda_emu import build as _build
from cuda_emu import launcher as _launcher

#: the build variant RawModule compiles (see cuda_emu.build.VARIANTS)
VARIANT = "fibers"
#: every Module loaded, by library path (so that all launches can be inspected)
MODULES: dict[str, _launcher.Module] = {}
#: every product's operand dtypes, in order (which products the engine computes in what)
PRODUCTS: list = []
_lock = threading.Lock()


def _read_api() -> dict:
    """{name: (parameter names, takes *args) or None} of CuPy 14 (cupy14_api.txt): module
    names as they are, the array's methods as ``ndarray.<name>``."""
    api = {}
    for line in (Path(__file__).with_name("cupy14_api.txt")).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, params = line.partition("(")
        if not params:
            api[name] = None
            continue
        names = [q.strip().rstrip("=") for q in params.rstrip(")").split(",") if q.strip() not in ("", "/", "*")]
        api[name] = ([q for q in names if not q.startswith("*")], any(q.startswith("*") and not q.startswith("**")
                                                                       for q in names))
    return api


#: CuPy 14's public names and the parameters of its callables
CUPY_API = _read_api()


def _checked(qualname: str, fn):
    """``fn`` refusing the keywords and extra positionals CuPy's ``qualname`` does not take
    (TypeError, as CuPy raises)."""
    spec = CUPY_API[qualname]
    if spec is None:
        return fn
    names, star = spec
    method = qualname.startswith("ndarray.")

    def call(*args, **kwargs):
        extra = [k for k in kwargs if k not in names]
        given = len(args) - method
        if extra or (given > len(names) and not star):
            raise TypeError(f"cupy's {qualname}() takes {names}, not "
                            f"{extra or f'{given} positional arguments'}")
        return fn(*args, **kwargs)

    call.__name__ = fn.__name__
    return call

# ------------------------------------------------------------------------ device memory
_PAGE = mmap.PAGESIZE
_POISON = 0xA5  # the bytes before an array's data
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_LIVE: "weakref.WeakValueDictionary[int, _Memory]" = weakref.WeakValueDictionary()


class _Memory:
    """One device allocation: anonymous pages whose last one is inaccessible, the data
    ending where it begins; the bytes before the data hold :data:`_POISON`."""

    def __init__(self, nbytes: int):
        pages = builtins.max(1, -(-nbytes // _PAGE))
        self.map = mmap.mmap(-1, (pages + 1) * _PAGE)
        probe = (ctypes.c_char * 1).from_buffer(self.map)
        base = ctypes.addressof(probe)
        del probe
        if _libc.mprotect(base + pages * _PAGE, _PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of a device array's guard page failed")
        self.offset = pages * _PAGE - nbytes
        self.ptr, self.nbytes = base + self.offset, nbytes
        self.map[:self.offset] = bytes([_POISON]) * self.offset
        _LIVE[self.ptr] = self

    def view(self, shape, dtype) -> _np.ndarray:
        return _np.frombuffer(self.map, _np.uint8, self.nbytes, self.offset).view(dtype).reshape(shape)

    def slack_intact(self) -> bool:
        return self.map[:self.offset].count(_POISON) == self.offset


def _describe(address: int) -> str:
    """Which device array an address lies past, before or in (for a fault's message)."""
    for mem in list(_LIVE.values()):
        if mem.ptr + mem.nbytes <= address < mem.ptr + mem.nbytes + _PAGE:
            return (f"{address - (mem.ptr + mem.nbytes)} bytes past the end of a device array of "
                    f"{mem.nbytes} bytes")
    return "in no device array"


# ------------------------------------------------------------------------ float32 flush
def _ftz(a: _np.ndarray) -> _np.ndarray:
    """Float32 subnormals to signed zero (CuPy's kernels are compiled with -ftz=true)."""
    if a.dtype == _np.float32 and a.size:
        tiny = _np.finfo(_np.float32).tiny
        sub = (a != 0) & (_np.abs(a) < tiny)
        if sub.any():
            a = _np.where(sub, _np.copysign(_np.float32(0), a), a).astype(_np.float32)
    return a


# ------------------------------------------------------------------------ arrays
class _Pointer:
    """``ndarray.data``: CuPy's MemoryPointer, of which the library reads ``ptr``."""

    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray:  # noqa: N801 - CuPy's name
    """A device array (see the module docstring): ``a.get()`` is its host copy."""

    __array_priority__ = 100.0

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None or order != "C":
            raise NotImplementedError("the stand-in makes C-ordered arrays of its own memory only")
        shape = (shape,) if isinstance(shape, (int, _np.integer)) else tuple(shape)
        dtype = _np.dtype(dtype)
        self._mem = _Memory(int(_np.prod(shape, dtype=_np.int64)) * dtype.itemsize)
        self._a = self._mem.view(shape, dtype)

    @classmethod
    def _of(cls, view: _np.ndarray, mem: _Memory) -> "ndarray":
        """A device array over ``view``, memory of ``mem`` (a view of another device array)."""
        out = cls.__new__(cls)
        out._mem, out._a = mem, view
        return out

    # properties
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: self.transpose())
    data = property(lambda self: _Pointer(self._a.__array_interface__["data"][0]))

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or ufunc.__name__ not in _UFUNCS:
            return NotImplemented
        return _UFUNCS[ufunc.__name__](*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        impl = globals().get(func.__name__)
        if func.__name__ not in __all__ or not callable(impl):
            return NotImplemented
        return impl(*args, **kwargs)

    def __repr__(self):
        return f"array({self._a!r}, device stand-in)"

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # explicit or scalar host conversions, allowed as in CuPy
    def get(self, stream=None, order="C", out=None, blocking=True) -> _np.ndarray:
        """A host (NumPy) copy."""
        return _np.array(self._a, copy=True)

    def tolist(self):
        return self._a.tolist()

    def item(self):
        return self._a.item()

    # views and copies
    def reshape(self, *shape, order="C", copy=None):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        view = self._a.reshape(shape, order=order)
        return ndarray._of(view, self._mem) if _np.shares_memory(view, self._a) else _device(view)

    def transpose(self, *axes):
        return ndarray._of(self._a.transpose(*axes), self._mem)

    def swapaxes(self, a, b):
        return ndarray._of(self._a.swapaxes(a, b), self._mem)

    def ravel(self):
        return self.reshape(-1)

    def copy(self, order="C"):
        return _device(self._a)

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dtype = _np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        with _np.errstate(over="ignore", invalid="ignore"):
            return _device(_ftz(_ftz(self._a).astype(dtype)))

    def fill(self, value):
        self._a.fill(value)

    def __getitem__(self, key):
        out = self._a[_index(key)]
        if isinstance(out, _np.ndarray) and _np.may_share_memory(out, self._a):
            return ndarray._of(out, self._mem)
        return _device(_np.asarray(out))

    def __setitem__(self, key, value):
        # a NumPy value is copied to the device, as CuPy does
        self._a[_index(key)] = value._a if isinstance(value, ndarray) else value

    # reductions
    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return sum(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return max(self, axis=axis, out=out, keepdims=keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return min(self, axis=axis, out=out, keepdims=keepdims)

    def any(self, axis=None, out=None, keepdims=False):
        return any(self, axis=axis, out=out, keepdims=keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return all(self, axis=axis, out=out, keepdims=keepdims)

    def argmax(self, axis=None, out=None, dtype=None, keepdims=False):
        return argmax(self, axis=axis, out=out, keepdims=keepdims)

    def __matmul__(self, other):
        return matmul(self, other)


def _index(key):
    """An index: device integer or boolean arrays as host ones (CuPy indexes with them)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    return key._a if isinstance(key, ndarray) else key


def _host_operand(x, where: str):
    """An operand of a device computation as NumPy data: a device array's memory, a Python
    or NumPy scalar as it is; a NumPy array with dimensions is a TypeError, as in CuPy."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _np.ndarray) and x.ndim > 0:
        raise TypeError(f"cupy.{where}: Unsupported type <class 'numpy.ndarray'> (a NumPy array of shape "
                        f"{x.shape} mixed with device arrays; move it with cupy.asarray)")
    if isinstance(x, (list, tuple)):
        return type(x)(_host_operand(v, where) for v in x)
    return x


def _device(a) -> ndarray:
    """A new device array holding a copy of host data ``a``."""
    a = _np.asarray(a)
    out = ndarray(a.shape, a.dtype)
    out._a[...] = a
    return out


def _result(r, flush: bool = True):
    """NumPy results as new device arrays (float32 flushed when ``flush``)."""
    if isinstance(r, (_np.ndarray, _np.generic)):
        r = _np.asarray(r)
        return _device(_ftz(r) if flush else r)
    if isinstance(r, (tuple, list)):
        return type(r)(_result(x, flush) for x in r)
    return r


def _mirror(name: str, flush: bool = True):
    """cupy.<name>: NumPy's function of that name on the device arrays' memory (float32
    inputs and results flushed when ``flush``, as CuPy's -ftz=true kernels do)."""
    fn = getattr(_np, name)

    def mirrored(*args, **kwargs):
        args = [_host_operand(a, name) for a in args]
        if flush:
            args = [_ftz(a) if isinstance(a, _np.ndarray) else a for a in args]
        out = kwargs.pop("out", None)
        kwargs = {k: _host_operand(v, name) for k, v in kwargs.items()}
        r = fn(*args, **kwargs)
        if out is not None:
            out._a[...] = _ftz(_np.asarray(r)) if flush else r
            return out
        return _result(r, flush)

    mirrored.__name__ = name
    return mirrored


# ------------------------------------------------------------------------ the namespace
_ELEMENTWISE = ("abs", "exp", "expm1", "log", "log1p", "sqrt", "isfinite", "isnan", "isneginf", "isposinf", "isinf",
                "maximum", "minimum", "where", "sign", "signbit", "clip", "fmax", "fmin", "copysign", "power",
                "add", "subtract", "multiply", "divide", "true_divide", "negative", "positive", "equal", "not_equal",
                "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_not",
                "logical_xor", "floor", "ceil", "square", "bitwise_and", "bitwise_or", "bitwise_xor", "invert",
                "floor_divide", "remainder", "logaddexp", "nextafter")
_REDUCTIONS = ("sum", "max", "min", "any", "all", "argmax", "argmin", "prod", "count_nonzero", "cumsum", "mean")
_SHAPES = ("broadcast_to", "moveaxis", "repeat", "tile", "concatenate", "stack", "expand_dims", "squeeze",
           "swapaxes", "transpose", "reshape", "ravel", "flatnonzero", "nonzero", "take_along_axis", "atleast_1d",
           "unique", "einsum", "outer")
_CREATION = ("zeros", "ones", "full", "arange", "eye", "zeros_like", "ones_like", "full_like", "linspace")
_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "bool_", "complex64", "complex128", "dtype", "finfo", "iinfo", "result_type", "promote_types",
           "can_cast", "issubdtype", "floating", "integer", "signedinteger", "number", "inf", "nan", "pi", "e",
           "newaxis")

for _name in _ELEMENTWISE + _REDUCTIONS:
    globals()[_name] = _mirror(_name)
for _name in _SHAPES:
    globals()[_name] = _mirror(_name, flush=False)
for _name in _CREATION:
    globals()[_name] = _mirror(_name, flush=False)
for _name in _DTYPES:
    globals()[_name] = getattr(_np, _name)

#: the ufuncs a NumPy call on a device array dispatches to (__array_ufunc__)
_UFUNCS = {n: globals()[n] for n in _ELEMENTWISE if isinstance(getattr(_np, n), _np.ufunc)}

# the operators of ndarray, through the elementwise functions
for _op, _fn, _swap in (("add", "add", False), ("radd", "add", True), ("sub", "subtract", False),
                        ("rsub", "subtract", True), ("mul", "multiply", False), ("rmul", "multiply", True),
                        ("truediv", "true_divide", False), ("rtruediv", "true_divide", True),
                        ("floordiv", "floor_divide", False), ("mod", "remainder", False), ("pow", "power", False),
                        ("rpow", "power", True), ("lt", "less", False), ("le", "less_equal", False),
                        ("gt", "greater", False), ("ge", "greater_equal", False), ("eq", "equal", False),
                        ("ne", "not_equal", False), ("and", "bitwise_and", False), ("rand", "bitwise_and", True),
                        ("or", "bitwise_or", False), ("ror", "bitwise_or", True), ("xor", "bitwise_xor", False)):
    def _method(self, other, _f=globals()[_fn], _s=_swap):
        return _f(other, self) if _s else _f(self, other)

    setattr(ndarray, f"__{_op}__", _method)
for _op, _fn in (("neg", "negative"), ("pos", "positive"), ("abs", "abs"), ("invert", "invert")):
    setattr(ndarray, f"__{_op}__", lambda self, _f=globals()[_fn]: _f(self))
# a one-element array as a Python number (a synchronising copy in CuPy, allowed there too)
for _op, _fn in (("float", float), ("int", int), ("bool", bool), ("index", operator.index)):
    setattr(ndarray, f"__{_op}__", lambda self, _f=_fn: _f(self._a.item()) if self.size == 1 else _f(self._a))
for _op, _fn in (("iadd", "add"), ("isub", "subtract"), ("imul", "multiply"), ("itruediv", "true_divide")):
    def _inplace(self, other, _f=globals()[_fn]):
        return _f(self, other, out=self)

    setattr(ndarray, f"__{_op}__", _inplace)


def asarray(a, dtype=None, order=None):
    """``a`` as a device array: the same array if it is one already (and of ``dtype``),
    else a copy (the host-to-device transfer for NumPy data)."""
    if isinstance(a, ndarray):
        return a if dtype is None or _np.dtype(dtype) == a.dtype else a.astype(dtype)
    return _device(_np.asarray(a, dtype=dtype))


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray):
        return a.astype(dtype or a.dtype, copy=copy)
    return _device(_np.array(a, dtype=dtype))


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else _device(_np.ascontiguousarray(a._a))


def empty(shape, dtype=float, order="C"):
    """Uninitialised, as on a GPU: 0xff bytes (NaN as a float), so that a kernel that
    leaves an output entry unwritten is seen."""
    out = ndarray(shape, dtype)
    out._a.view(_np.uint8).fill(0xFF) if out.size else None
    return out


def empty_like(a, dtype=None):
    return empty(a.shape, dtype or a.dtype)


def _tf32(a: _np.ndarray) -> _np.ndarray:
    """Float32 values rounded to TF32 (10 explicit mantissa bits, nearest even)."""
    bits = a.view(_np.uint32).astype(_np.uint64)
    bits = (bits + 0x0FFF + ((bits >> 13) & 1)) & 0xFFFFE000
    return bits.astype(_np.uint32).view(_np.float32)


def matmul(a, b):
    """NumPy's product (cuBLAS is not emulated); float32 operands rounded to TF32 first
    when ``CUPY_TF32`` is set to a positive integer, as CuPy then asks cuBLAS to."""
    a, b = _host_operand(a, "matmul"), _host_operand(b, "matmul")
    PRODUCTS.append((a.dtype, b.dtype))
    if a.dtype == _np.float32 and b.dtype == _np.float32 and int(os.environ.get("CUPY_TF32", "0") or 0) > 0:
        a, b = _tf32(a), _tf32(b)
    return _device(_np.matmul(a, b))


def asnumpy(a):
    return a.get() if isinstance(a, ndarray) else _np.asarray(a)


def is_available() -> bool:
    return True


def get_array_module(*args):
    import sys

    return sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else _np


class _Device:
    """The emulated device: compute capability 9.0 (an H100's)."""

    compute_capability = "90"

    def __init__(self, device: int = 0):
        self.id = device


class cuda:  # noqa: N801 - CuPy's namespace
    Device = _Device


class RawModule:
    """``cupy.RawModule(code=, options=, name_expressions=)`` compiled for the emulator,
    with the options CuPy 14 appends to the given ones before NVRTC compiles
    (cupy/cuda/compiler.py: float32 flush-to-zero, the device's architecture, device code
    as the default execution space)."""

    def __init__(self, code: str, options: tuple = (), name_expressions=()):
        if not isinstance(options, tuple):  # a cdef ``tuple options`` parameter in CuPy
            raise TypeError(f"options must be a tuple, not {type(options).__name__}")
        arch = cuda.Device().compute_capability
        options = (*options, "-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space")
        built = _build.build(code, options, tuple(name_expressions), VARIANT)
        with _lock:
            module = MODULES.get(str(built.library))
            if module is None:
                module = MODULES[str(built.library)] = _launcher.Module(built)
        self._module = module
        #: the options NVRTC would have received
        self.nvrtc_options = options

    def get_function(self, name: str) -> "RawKernel":
        return RawKernel(self._module.get_function(name))


class RawKernel:
    """A kernel launched as ``kernel(grid, block, args)``: device arrays, NumPy scalars
    and one-element NumPy arrays (by value, as CuPy passes them)."""

    def __init__(self, kernel: _launcher.Kernel):
        self.kernel = kernel

    def __call__(self, grid, block, args) -> None:
        for i, a in enumerate(args):
            if isinstance(a, _np.ndarray) and a.size != 1:
                raise TypeError(f"{self.kernel.name}: argument {i} is a host NumPy array of shape {a.shape}; "
                                "kernels take device arrays (cupy.asarray)")
        try:
            self.kernel(grid, block, args)
        except _launcher.LaunchError as e:
            text = str(e)
            if "address 0x" in text:
                address = int(text.split("address 0x", 1)[1].split(",", 1)[0], 16)
                raise _launcher.LaunchError(f"{text} ({_describe(address)})") from None
            raise
        # the arrays the kernel was given: device array arguments and the pointer fields of
        # parameter records
        given = [a.data.ptr for a in args if isinstance(a, ndarray)]
        for a in args:
            if isinstance(a, _np.ndarray) and a.dtype.names:
                given += [int(a[f].item()) for f in a.dtype.names if a.dtype[f] == _np.uint64]
        spoilt = [m for m in list(_LIVE.values())
                  if builtins.any(m.ptr <= p <= m.ptr + m.nbytes for p in given) and not m.slack_intact()]
        if spoilt:
            raise _launcher.LaunchError(f"{self.kernel.name}: a write before the start of a device array of "
                                        f"{spoilt[0].nbytes} bytes")


__all__ = sorted({*_ELEMENTWISE, *_REDUCTIONS, *_SHAPES, *_CREATION, *_DTYPES, "ndarray", "asarray", "array",
                  "ascontiguousarray", "empty", "empty_like", "matmul", "asnumpy", "is_available",
                  "get_array_module", "cuda", "RawModule", "RawKernel"})

# every function and array method takes only what CuPy's does
for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj) and not isinstance(_obj, type) and _name in CUPY_API:
        globals()[_name] = _checked(_name, _obj)
for _name, _obj in list(vars(ndarray).items()):
    if callable(_obj) and f"ndarray.{_name}" in CUPY_API:
        setattr(ndarray, _name, _checked(f"ndarray.{_name}", _obj))
