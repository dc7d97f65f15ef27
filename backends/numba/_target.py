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

What is emitted.  numba links each callee's LLVM module into its caller's and optimises
it there again, so the machine code of a function that is only called from compiled code
is never run.  A :attr:`TargetDispatcher.linked` function (every helper of the package) is
compiled linked-only (:class:`LinkedLibrary`): its own passes at level 1, its IR kept for
the callers, no machine code; the entry kernels that link it optimise it at numba's
level and emit it.  The kernels compute the same bits either way.
"""

from __future__ import annotations

import contextvars

from llvmlite import binding as ll
from numba.core import config
from numba.core import target_extension as _ext
from numba.core.codegen import JITCodeLibrary, JITCPUCodegen
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


class LinkedLibrary(JITCodeLibrary):
    """numba's JIT code library.  The library of a :attr:`TargetDispatcher.linked`
    function (the one numba makes for the function itself, named by its qualified name;
    not those of the overloads it uses, nor numba's runtime) is *linked-only*: its LLVM
    module is optimised and kept as IR for its callers to link, and no machine code is
    emitted for it; its functions have no address (:meth:`get_pointer_to_function` returns
    0, as numba does for a function a library does not define).  It is saved to the disk
    cache as that IR (kind ``"linked"``), the form a caller links.  It overrides numba's
    own library steps (``_finalize_final_module``, ``_unserialize``) as the releases of
    :data:`~entmax_ref.backends.cache_folder.TESTED_NUMBA` define them; the numba pin in
    pyproject.toml holds installs to those releases."""

    def __init__(self, codegen, name, **kwargs):
        super().__init__(codegen, name, **kwargs)
        self.linked = name == _linked.get()

    def _finalize_final_module(self):
        if not self.linked:
            return super()._finalize_final_module()
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        self._finalized = True

    def get_pointer_to_function(self, name):
        if self.linked:
            self._ensure_finalized()
            return 0
        return super().get_pointer_to_function(name)

    def serialize_using_object_code(self):
        if not self.linked:
            return super().serialize_using_object_code()
        return self.name, "linked", self._get_module_for_linking().as_bitcode()

    @classmethod
    def _unserialize(cls, codegen, state):
        name, kind, data = state
        if kind != "linked":
            return super()._unserialize(codegen, state)
        self = codegen.create_library(name)
        self.linked = True
        self._final_module = self._shared_module = ll.parse_bitcode(data)
        self._finalize_final_module()
        return self


class WideCodegen(JITCPUCodegen):
    """numba's JIT code generator with the host's features through :func:`full_width`,
    whose libraries are :class:`LinkedLibrary`."""

    _library_class = LinkedLibrary

    def _customize_tm_features(self):
        return full_width(super()._customize_tm_features())

    def _pass_builder(self, **kwargs):
        # the module and function passes made while a linked function compiles run at
        # level 1 (numba's cheap pre-inlining pass names its own level)
        if _linked.get() is not None and "opt" not in kwargs:
            kwargs["opt"] = min(LINKED_OPT, int(config.OPT))
        return super()._pass_builder(**kwargs)

    def set_env(self, env_name, env):
        if self._engine.get_global_value_address(env_name):  # none for a linked library's function
            super().set_env(env_name, env)


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


#: the qualified name of the :attr:`TargetDispatcher.linked` function compiling now (None:
#: the function compiling now is not linked)
_linked: contextvars.ContextVar[str | None] = contextvars.ContextVar("entmax_ref_linked", default=None)
#: the LLVM optimisation level of the passes made while a linked function compiles (at
#: most numba's ``NUMBA_OPT``)
LINKED_OPT = 1


class TargetDispatcher(CPUDispatcher):
    """A numba CPU dispatcher that compiles on :data:`TARGET` (module docstring).

    A ``linked`` dispatcher's functions are only called from other compiled functions,
    which link its code: its libraries are linked-only (:class:`LinkedLibrary`), their own
    LLVM passes at level :data:`LINKED_OPT`; a caller's passes (numba's level 3)
    optimise that code again once it is linked in and inlined."""

    targetdescr = TARGET
    linked = False

    def compile(self, sig):
        token = _linked.set(self.py_func.__qualname__ if self.linked else None)
        try:
            with _ext.target_override(NAME):
                return super().compile(sig)
        finally:
            _linked.reset(token)

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
