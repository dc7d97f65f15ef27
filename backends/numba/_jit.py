"""How the kernel package compiles: every compiled function of ``backends/numba`` is made
by one of two decorators, and the entry kernels say what they compile.

``@jit(**options)``
    a helper: ``numba.njit`` with the package's disk cache (:mod:`._cache`), compiled for
    whatever types its callers give it.

``@kernel(signatures, **options)``
    an *entry kernel*, one that the Python side calls: ``nogil`` (the worker threads of
    :mod:`._threads` run it with the GIL released) and cached, with the argument types it
    is compiled for declared next to it.  ``signatures`` is a function of the input's
    numba dtype (``float64`` or ``float32``) that returns the tuple of argument types
    (or None: none for that dtype), compiled for every dtype of ``dtypes`` (both by
    default), or a tuple of such functions (one signature each per dtype).  The Python side passes exactly these
    types (C-contiguous, writable arrays; int64, float64 and bool scalars), so a call
    never compiles a signature that is not declared (``tests/test_numba_compile.py``).

:data:`KERNELS` lists every entry kernel, in the order their modules define them: what
``entmax-ref compile`` compiles, what ``entmax-ref cache info`` reports, what the
progress counts.  Whether a declared signature is compiled has one answer, numba's:
:meth:`Dispatcher.load` (in this process, or in the disk cache, from which it is then
loaded).

``with compiled_only():`` refuses to compile: a kernel called in the block whose
signature is neither in this process nor in the disk cache raises :class:`NotCompiled`
instead (the worker threads of :mod:`._threads` inherit the block).  ``backend="auto"``
runs the numba engine this way (:mod:`entmax_ref.backends.auto`).

A compile that is interrupted (Ctrl-C during the first call) leaves no specialization
behind that was made during it: the next call compiles them again.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

from numba.core import config, sigutils, types
from numba.core.compiler_lock import global_compiler_lock

from ._cache import KernelCache, cached
from ._target import TargetDispatcher

#: the input dtypes the entry kernels are compiled for, by default
DTYPES = ("float64", "float32")
#: ``dtypes`` of a kernel whose one signature serves every input dtype (its signature
#: function is called with None)
ANY = ("any",)


class NotCompiled(RuntimeError):
    """A kernel was called inside :func:`compiled_only` with a signature that is not
    compiled (neither in this process nor in the disk cache)."""


_refuse: contextvars.ContextVar[bool] = contextvars.ContextVar("entmax_ref_compiled_only", default=False)


@contextlib.contextmanager
def compiled_only():
    """Within the block (and the worker threads its calls start), a kernel that would have
    to be compiled raises :class:`NotCompiled` instead."""
    token = _refuse.set(True)
    try:
        yield
    finally:
        _refuse.reset(token)


#: every dispatcher of the package (helpers and kernels), for :meth:`Dispatcher.compile`'s
#: clean-up of an interrupted compile
_ALL: list["Dispatcher"] = []
#: the dispatchers compiling now, outermost first (under numba's compiler lock)
_compiling: list["Dispatcher"] = []


class Dispatcher(TargetDispatcher):
    """numba's CPU dispatcher on the package's target (:mod:`._target`: full-width vectors
    where the CPU has AVX-512) with the package's disk cache (:class:`._cache.KernelCache`),
    :func:`compiled_only`, and a clean slate after an interrupted compile."""

    def enable_caching(self):
        self._cache = KernelCache(self.py_func)

    def load(self, sig) -> bool:
        """Whether ``sig`` is compiled: in this process, or in the disk cache, from which
        it is then loaded (as :meth:`compile` would); never compiles."""
        args, _ = sigutils.normalize_signature(sig)
        if tuple(args) in self.overloads:
            return True
        with global_compiler_lock:
            if tuple(args) in self.overloads:
                return True
            cres = self._cache.load_overload(sig, self.targetctx)
            if cres is None:
                return False
            self._cache_hits[sig] += 1
            self.targetctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
            self.add_overload(cres)
            return True

    def compile(self, sig):
        if _refuse.get() and not self.load(sig):
            raise NotCompiled(f"{self.py_func.__module__}.{self.py_func.__qualname__}{tuple(sig)} is not compiled")
        with global_compiler_lock:  # numba's own lock (re-entrant): no other thread compiles meanwhile
            outermost = not _compiling
            before = {d: set(d.overloads) for d in _ALL} if outermost else None
            _compiling.append(self)
            try:
                return super().compile(sig)
            except BaseException:
                if outermost:  # an interrupted or failed compile: drop what it added, half-made or not
                    for d, had in before.items():
                        if set(d.overloads) != had:
                            kept = [cres for key, cres in d.overloads.items() if key in had]
                            d._reset_overloads()
                            for cres in kept:
                                d.add_overload(cres)
                raise
            finally:
                _compiling.pop()


class Helper(Dispatcher):
    """A helper compiled for numba callers only: numba's ``no_cpython_wrapper`` and
    ``no_cfunc_wrapper``: each specialization is lowered, optimised and emitted without the
    code that unboxes Python arguments.  A call from Python raises :class:`TypeError`: the
    compiled function has no Python entry to run.

    Its code runs only as linked into its callers, so it is compiled linked-only
    (:attr:`._target.TargetDispatcher.linked`): optimised at level 1 and kept as LLVM IR,
    with no machine code of its own; the entry kernels that link it optimise it at
    numba's level 3 and emit it."""

    linked = True

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.py_func.__module__}.{self.py_func.__qualname__} is a compiled helper with no "
                        "Python entry: call it from a function compiled with "
                        "entmax_ref.backends.numba._jit.jit, or call an entry kernel")


def _make(fn, options) -> Dispatcher:
    if config.DISABLE_JIT:  # pragma: no cover - NUMBA_DISABLE_JIT: plain Python, as numba does
        return fn
    cls = Helper if options.get("no_cpython_wrapper") else Dispatcher
    disp = cls(py_func=fn, locals={}, targetoptions={"nopython": True, "boundscheck": None, **options})
    if cached(fn):
        disp.enable_caching()
    _ALL.append(disp)
    return disp


#: a helper's options unless it names them: no Python entry (:class:`Helper`)
HELPER_OPTIONS = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def jit(fn=None, **options):
    """``@jit`` or ``@jit(**options)``: a helper of the package (numba's ``njit`` options:
    ``forceinline``, ``fastmath``, ``_nrt``, ...), cached on disk, called from compiled code
    only (:class:`Helper`); ``no_cpython_wrapper=False`` gives a function that Python calls
    too (the bench's floors, a test's entry to a helper).

    ``forceinline=True`` marks the helper ``alwaysinline`` for LLVM: it is typed once per
    signature and LLVM inlines it into every caller, before the loop vectoriser runs.
    ``inline="always"`` (numba's own inlining, which copies and types the body again at
    every call site) is kept for the dispatching helpers whose callers pass a constant
    (a solver path, a finishing stage) that numba prunes to one branch."""
    options = {**HELPER_OPTIONS, **options}
    if fn is not None:
        return _make(fn, options)
    return lambda f: _make(f, options)


Signature = Callable[[types.Type], tuple]


@dataclass(frozen=True)
class Kernel:
    """An entry kernel: its dispatcher, the signatures it is compiled for (with the dtype
    of the input each serves), the operations (backend members of the capability table)
    whose calls run it and the ``method=`` values they run it for."""

    name: str
    dispatcher: Dispatcher
    signatures: tuple[tuple[str, tuple], ...]  # (dtype name, argument types)
    ops: tuple[str, ...]
    methods: tuple[str | None, ...]

    def compiled(self, sig: tuple) -> bool:
        """Whether ``sig`` is compiled (:meth:`Dispatcher.load`)."""
        return self.dispatcher.load(sig)

    def compile(self, sig: tuple) -> None:
        """Compile ``sig`` (or load it from the disk cache); saves it there."""
        self.dispatcher.compile(sig)


#: every entry kernel of the package, in the order their modules define them
KERNELS: list[Kernel] = []


def kernel(signatures: Signature | tuple[Signature, ...], ops: tuple[str, ...], dtypes: tuple[str, ...] = DTYPES,
           methods: tuple[str | None, ...] = (None,), name: str | None = None, **options):
    """``@kernel(lambda x: (x[:, ::1], ...), ops=("entmax_forward",))``: an entry kernel
    (``nogil``, cached), compiled for the signatures ``signatures`` gives for each dtype of
    ``dtypes``, run by the operations ``ops`` with the methods ``methods``, and listed in
    :data:`KERNELS` (``name``: its name there, by default ``module.function``)."""
    makers = signatures if isinstance(signatures, tuple) else (signatures,)

    def wrap(fn):
        disp = _make(fn, {"nogil": True, "no_cfunc_wrapper": True, **options})
        sigs: list[tuple[str, tuple]] = []
        for dt in dtypes:
            for make in makers:
                sig = make(None if dt == "any" else getattr(types, dt))
                if sig is not None and all(s != tuple(sig) for _, s in sigs):
                    sigs.append((dt, tuple(sig)))
        label = name or f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        KERNELS.append(Kernel(label, disp, tuple(sigs), tuple(ops), tuple(methods)))
        return disp

    return wrap


def record(cls, *fields) -> types.Type:
    """The numba type of the named tuple ``cls`` whose fields have the types ``fields``."""
    return types.BaseTuple.from_types(fields, cls)


#: argument types the declarations use
i8, i32, i64, f32, f64, b1 = types.int8, types.int32, types.int64, types.float32, types.float64, types.boolean
