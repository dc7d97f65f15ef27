"""A CPU stand-in for the part of CuPy that entmax-ref uses, loaded as the module ``cupy``.

Arrays are :class:`ndarray`, a NumPy subclass that plays a device array: it mixes with
NumPy arrays in neither arithmetic nor this namespace's functions (TypeError, as CuPy
raises), leaves "the device" only through ``.get()``, and is the only array type a kernel
accepts (a host NumPy array handed to a kernel is a TypeError, as CuPy's launcher raises).
``asarray`` of NumPy data is the explicit host-to-device copy.  Any other NumPy function
is mirrored on these arrays, the way CuPy mirrors NumPy on the GPU.

:class:`RawModule` compiles the CUDA source with the emulation header (:mod:`.build`,
cached by content) and launches its kernels on the CPU (:mod:`.launcher`).  Which build
(fibers, OS threads, a sanitizer) is :data:`VARIANT`, set by
:func:`tests.cuda_emu.stand_in_cupy`.  ``cupy.matmul`` is NumPy's matmul (cuBLAS is not
emulated).  Use it through :func:`cuda_emu.stand_in_cupy`, which installs and removes it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as _np

from cuda_emu import build as _build
from cuda_emu import launcher as _launcher

#: the build variant RawModule compiles (see cuda_emu.build.VARIANTS)
VARIANT = "fibers"
#: every Module loaded, by library path (so that all launches can be inspected)
MODULES: dict[str, _launcher.Module] = {}
_lock = threading.Lock()


def _is_host(a: Any) -> bool:
    return isinstance(a, _np.ndarray) and not isinstance(a, ndarray)


def _refuse_host(args, where: str) -> None:
    for a in args:
        if isinstance(a, (list, tuple)):
            _refuse_host(a, where)
        elif _is_host(a) and a.ndim > 0:
            raise TypeError(f"{where}: a NumPy array of shape {a.shape} mixed with device arrays "
                            "(move it with cupy.asarray)")


class ndarray(_np.ndarray):  # noqa: N801 - CuPy's name
    """A "device" array: NumPy memory that refuses to mix with host arrays."""

    def get(self) -> _np.ndarray:
        """A host (NumPy) copy."""
        return _np.array(self.view(_np.ndarray), copy=True)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out", ())
        _refuse_host(inputs, f"cupy.{ufunc.__name__}")
        _refuse_host(out, f"cupy.{ufunc.__name__}")
        if out:
            kwargs["out"] = tuple(_host_view(o) for o in out)
        result = getattr(ufunc, method)(*(_host_view(a) for a in inputs), **kwargs)
        if out:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(args, f"cupy.{func.__name__}")
        return super().__array_function__(func, types, args, kwargs)


def _host_view(a: Any) -> Any:
    return a.view(_np.ndarray) if isinstance(a, ndarray) else a


def _wrap(r: Any) -> Any:
    if isinstance(r, _np.ndarray) and not isinstance(r, ndarray):
        return r.view(ndarray)
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    if isinstance(r, list):
        return [_wrap(x) for x in r]
    return r


def asarray(a, dtype=None, order=None):
    """``a`` as a device array: the same array if it is one already (and of ``dtype``),
    else a copy (a host-to-device transfer for NumPy data)."""
    if isinstance(a, ndarray):
        return a.astype(dtype, copy=False) if dtype is not None else a
    return _np.array(a, dtype=dtype, order=order or "K", copy=True).view(ndarray)


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray) and not copy:
        return asarray(a, dtype)
    return _np.array(a.view(_np.ndarray) if isinstance(a, ndarray) else a, dtype=dtype, copy=True,
                     order=order).view(ndarray)


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else _np.ascontiguousarray(a).view(ndarray)


def empty(shape, dtype=float, order="C"):
    """Uninitialised, as on a GPU: filled with NaN (float) or 0xff bytes, so that a kernel
    that leaves an output entry unwritten is seen."""
    out = _np.empty(shape, dtype, order)
    out.view(_np.uint8).fill(0xFF) if out.size else None
    return out.view(ndarray)


def empty_like(a, dtype=None):
    return empty(a.shape, dtype or a.dtype)


def is_available() -> bool:
    return True


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
    """A kernel launched as ``kernel(grid, block, args)``; device arrays only."""

    def __init__(self, kernel: _launcher.Kernel):
        self.kernel = kernel

    def __call__(self, grid, block, args) -> None:
        for i, a in enumerate(args):
            if _is_host(a):
                raise TypeError(f"{self.kernel.name}: argument {i} is a host NumPy array "
                                f"(shape {a.shape}); kernels take device arrays (cupy.asarray)")
        self.kernel(grid, block, args)


def __getattr__(name: str) -> Any:
    """Every other NumPy name: constants and dtypes as they are, functions on device arrays."""
    attr = getattr(_np, name)
    if not callable(attr) or isinstance(attr, type):
        return attr

    def mirrored(*args, **kwargs):
        _refuse_host(args, f"cupy.{name}")
        return _wrap(attr(*args, **kwargs))

    mirrored.__name__ = name
    return mirrored
