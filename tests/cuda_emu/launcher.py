"""Launch the kernels of an emulation library (:mod:`.build`) from Python.

A :class:`Module` loads the library with ctypes and gives each exported kernel as a
:class:`Kernel`, called like ``cupy.RawKernel``: ``kernel(grid, block, args)``.  The
arguments follow cuLaunchKernel's convention (an array of pointers to the argument
values): a device array is passed as its data pointer (``.data.ptr``, what the CuPy
stand-in's arrays give), a NumPy scalar by value, and a NumPy array of one element by
value (CuPy's rule; a record of a structured dtype is how a kernel's parameter struct is
passed).

The launcher checks what a GPU does not: the number of arguments, each argument's kind
(pointer, floating point, signed, unsigned, bool, record) and size against the kernel's
parameter (a Python int or float, which cupy passes as a 64-bit value, is refused: a
kernel's ``int`` parameter would read half of it), ``blockDim`` against the kernel's
``__launch_bounds__``, and that every array argument is C-contiguous.  A failed launch
(a barrier misuse, a race on shared memory, an index out of a shared array, an access
outside the memory the kernel was given, a deadlock) raises :class:`LaunchError` naming
the kernel, the launch shape and the call site in the source.
"""

from __future__ import annotations

import collections
import ctypes
import threading

import numpy as np

from .build import Built

MAX_PARAMS = 40


class LaunchError(RuntimeError):
    """A launch that the emulator stopped (the message names the call site)."""


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("fn", ctypes.c_void_p), ("launch", ctypes.c_void_p),
                ("nparams", ctypes.c_int), ("sizes", ctypes.c_size_t * MAX_PARAMS),
                ("kinds", ctypes.c_char * MAX_PARAMS)]


_KINDS = {"f": "f", "i": "i", "u": "u", "b": "b"}
_lock = threading.Lock()  # the emulator's scheduler is process-global: one launch at a time


def _argument(a, index: int, where: str):
    """(kind, size, ctypes object holding the value) of one kernel argument."""
    if hasattr(a, "data") and hasattr(a.data, "ptr"):  # a device array
        if not a.flags.c_contiguous:
            raise TypeError(f"{where}: argument {index} is an array that is not C-contiguous "
                            f"(shape {a.shape}, strides {a.strides})")
        return "p", 8, ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.ndarray):  # one element, by value
        if a.size != 1:
            raise TypeError(f"{where}: argument {index} is a NumPy array of shape {a.shape}; only a one-element "
                            "NumPy array is passed (by value), data goes in device arrays")
        kind = "s" if a.dtype.names else _KINDS.get(a.dtype.kind)
        if kind is None:
            raise TypeError(f"{where}: argument {index} has dtype {a.dtype}, not a kernel parameter type")
        return kind, a.dtype.itemsize, ctypes.create_string_buffer(a.tobytes(), a.dtype.itemsize)
    if isinstance(a, np.generic):
        kind = _KINDS.get(a.dtype.kind)
        if kind is None:
            raise TypeError(f"{where}: argument {index} has dtype {a.dtype}, not a kernel parameter type")
        return kind, a.dtype.itemsize, ctypes.create_string_buffer(a.tobytes(), a.dtype.itemsize)
    raise TypeError(f"{where}: argument {index} is a {type(a).__name__}; pass an array or a NumPy scalar "
                    "of the parameter's type")


class Kernel:
    """One kernel of a :class:`Module` (see the module docstring)."""

    def __init__(self, module: "Module", index: int, entry: _Entry, bound: int | None):
        self.module, self.index = module, index
        self.name = entry.name.decode()
        self.kinds = entry.kinds[:entry.nparams].decode()
        self.sizes = tuple(entry.sizes[:entry.nparams])
        self.launch_bound = bound

    def __call__(self, grid, block, args) -> None:
        g = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
        b = tuple(int(v) for v in block) + (1,) * (3 - len(block))
        where = f"{self.name}<<<{g}, {b}>>>"
        if len(args) != len(self.kinds):
            raise TypeError(f"{where}: {len(args)} arguments for {len(self.kinds)} parameters")
        threads = b[0] * b[1] * b[2]
        if self.launch_bound is not None and threads > self.launch_bound:
            raise LaunchError(f"{where}: {threads} threads per block, above the kernel's "
                              f"__launch_bounds__({self.launch_bound})")
        if min(g) < 1 or min(b) < 1:
            raise LaunchError(f"{where}: an empty grid or block")
        keep = []
        pointers = (ctypes.c_void_p * max(1, len(args)))()
        for i, a in enumerate(args):
            kind, size, obj = _argument(a, i, where)
            want_kind, want_size = self.kinds[i], self.sizes[i]
            null = want_kind == "p" and kind == "u" and size == 8 and int(a) == 0  # a null pointer
            if not null and (kind != want_kind or size != want_size):
                raise TypeError(f"{where}: argument {i} is {kind}{size * 8}, the parameter "
                                f"{want_kind}{want_size * 8} (p pointer, f float, i signed, u unsigned, b bool, "
                                "s record)")
            keep.append(obj)
            pointers[i] = ctypes.addressof(obj)
        with _lock:
            rc = self.module.lib.emu_launch(self.index, *g, *b, pointers)
            message = self.module.lib.emu_error().decode() if rc else ""
        self.module.launched[self.name] += 1
        if rc:
            raise LaunchError(f"{where}: {message}")


class Module:
    """The kernels of one emulation library, by name expression (``kernel<double>``)."""

    def __init__(self, built: Built):
        lib = self.lib = ctypes.CDLL(str(built.library))
        lib.emu_entry.restype = ctypes.POINTER(_Entry)
        lib.emu_error.restype = ctypes.c_char_p
        lib.emu_launch.argtypes = [ctypes.c_int] + [ctypes.c_uint] * 6 + [ctypes.c_void_p]
        #: launches so far, by name expression (what a test has exercised)
        self.launched: collections.Counter = collections.Counter()
        self.kernels: dict[str, Kernel] = {}
        for i in range(lib.emu_count()):
            entry = lib.emu_entry(i).contents
            name = entry.name.decode()
            self.kernels[name] = Kernel(self, i, entry, built.launch_bounds.get(name.split("<")[0]))

    def get_function(self, expr: str) -> Kernel:
        try:
            return self.kernels[expr]
        except KeyError:
            raise KeyError(f"no kernel {expr!r} in this module (name expressions: {sorted(self.kernels)})") from None
