"""The machine code the kernels compile to: numba's CPU target, with full-width vectors
where the CPU has AVX-512.

LLVM picks the vector width of the loops it vectorises from the CPU's *tuning*, not only
from its instruction set: for the Intel server cores with AVX-512 (Skylake-SP through
Sapphire Rapids and later) the tuning ``prefer-256-bit`` holds the vectoriser to 256-bit
registers, so every vectorised loop (the float64 exponentials of softmax, the maxima, the
filter's passes, the dot products) runs at half the width the instructions allow, and
on cores with two 512-bit FMA units at half their arithmetic rate.  AMD's Zen 4 tuning
has no such preference.  The kernels are arithmetic-dense loops over data in cache, the
work for which those units exist (the BLAS libraries use them), so they are compiled with
``-prefer-256-bit`` added to the host's features wherever the host has ``avx512f``: the
same 512-bit registers on every AVX-512 CPU.

Where it is decided.  :class:`TargetDispatcher` compiles on a target of its own
(:data:`TARGET`, named :data:`NAME` in numba's target registry, a kind of CPU), whose
context's code generator (:class:`WideCodegen`) takes those features.  The features are
part of numba's cache key (``magic_tuple``), so cached code of another width is never
loaded.  Nothing else in the process changes: other numba functions compile as numba
compiles them, and no environment variable is read or set for this.

How it stays compatible with numba's own functions.  The overloads a kernel uses
(``np.empty``, ``np.sort``, ...) are compiled for the target of the function being
typed; :class:`TargetDispatcher` compiles under ``target_override(NAME)``, so they are
compiled, and lowered, on :data:`TARGET` as well.  Each function the package compiles is
also made known to numba's own CPU context, so a plain ``numba.njit`` function may call
a package helper (the tests do): the caller links the helper's code and compiles it
with its own features, as numba does for any callee.
"""

from __future__ import annotations

import contextvars

from numba.core import config
from numba.core import target_extension as _ext
from numba.core.codegen import JITCPUCodegen
from numba.core.cpu import CPUContext
from numba.core.registry import CPUDispatcher, CPUTarget, cpu_target
from numba.core.utils import threadsafe_cached_property

#: the target's name in numba's target registry
NAME = "entmax_ref_cpu"


def full_width(features: str) -> str:
    """The LLVM feature string ``features`` with the 256-bit preference turned off where
    it has ``+avx512f`` (unchanged otherwise)."""
    names = features.split(",")
    return features + ",-prefer-256-bit" if "+avx512f" in names and "-prefer-256-bit" not in names else features


class WideCodegen(JITCPUCodegen):
    """numba's JIT code generator with the host's features through :func:`full_width`."""

    def _customize_tm_features(self):
        return full_width(super()._customize_tm_features())

    def _pass_builder(self, **kwargs):
        # the module and function passes of the function compiling now run at its
        # dispatcher's level (numba's cheap pre-inlining pass names its own level)
        level = _opt_level.get()
        if level is not None and "opt" not in kwargs:
            kwargs["opt"] = min(level, int(config.OPT))
        return super()._pass_builder(**kwargs)


class WideContext(CPUContext):
    """numba's CPU target context with :class:`WideCodegen`."""

    def init(self):
        super().init()
        self._internal_codegen = WideCodegen("numba.exec")


class WideCPU(_ext.CPU):
    """The target's kind in numba's target hierarchy: a CPU (every CPU overload applies)."""


class WideTarget(CPUTarget):
    """The target descriptor: :class:`WideContext` for code, numba's CPU typing context
    for types (the types, and which functions exist, are the CPU's)."""

    @threadsafe_cached_property
    def _toplevel_target_context(self):
        return WideContext(self.typing_context, self._target_name)

    @property
    def typing_context(self):
        return cpu_target.typing_context


_ext.target_registry[NAME] = WideCPU
TARGET = WideTarget(NAME)


#: the LLVM optimisation level of the dispatcher compiling now (None: numba's, ``NUMBA_OPT``)
_opt_level: contextvars.ContextVar[int | None] = contextvars.ContextVar("entmax_ref_opt_level", default=None)


class TargetDispatcher(CPUDispatcher):
    """A numba CPU dispatcher that compiles on :data:`TARGET` (module docstring), its
    LLVM passes at level :attr:`opt` (at most numba's ``NUMBA_OPT``; None: numba's)."""

    targetdescr = TARGET
    opt: int | None = None

    def compile(self, sig):
        token = _opt_level.set(self.opt)
        try:
            with _ext.target_override(NAME):
                return super().compile(sig)
        finally:
            _opt_level.reset(token)

    def add_overload(self, cres):
        super().add_overload(cres)
        if not cres.objectmode and cres.entry_point not in _KNOWN:  # callable from numba's CPU functions too
            _KNOWN.add(cres.entry_point)
            cpu_target.target_context.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])


#: the compiled functions made known to numba's CPU context (each once)
_KNOWN: set = set()


def _overload_jit(*args, **options):
    """numba's ``jit`` on :data:`TARGET`: what compiles the overloads a package function uses."""
    from numba import jit

    return jit(*args, _target=NAME, **options)


_ext.dispatcher_registry[WideCPU] = TargetDispatcher
_ext.jit_registry[WideCPU] = _overload_jit
