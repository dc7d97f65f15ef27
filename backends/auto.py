"""Which engine answers ``backend="auto"``: the rule, written once (:func:`auto_backend`).

* CuPy arrays: ``cupy``.
* NumPy arrays: ``numba`` when every kernel the call runs is compiled, in this process or
  in the disk cache (``entmax-ref compile`` puts them all there, and so does any
  ``backend="numba"`` call); the ``numpy`` reference when one is not.  Compiled, the two
  give the same answers, so the choice is a matter of speed only, at every size.

"Compiled" has one meaning, numba's: the call runs on the numba engine with compiling
refused (:func:`entmax_ref.backends.numba._jit.compiled_only`); a kernel whose
specialization is neither in this process nor in the disk cache raises ``NotCompiled``
before it runs, and the call is answered by the reference instead (inputs are never
modified, so nothing of the attempt remains).  The first time in a process that this
happens, the ``entmax_ref`` logger says so (level INFO), naming ``entmax-ref compile``.
While numba is not imported and the disk cache holds no compiled kernel at all, the
call goes to the reference without importing numba.

A call made with ``"auto"`` never compiles and starts no process or thread of its own;
the choice depends on the call and the state of the cache, never on a clock.  No kernel
imports this module, so changing the rule leaves the kernel cache valid.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Iterable

import numpy as np

from ._base import Backend, NonFiniteInput, is_cupy
from .capabilities import methods

_LOG = logging.getLogger("entmax_ref")
_said = [False]
_lock = threading.Lock()
_found = [False]  # compiled kernels seen in the cache folder (then numba is imported)


def _say() -> None:
    with _lock:
        say, _said[0] = not _said[0], True
    if say:
        from .cache_folder import CACHE, CACHE_DIR

        where = f"cache: {CACHE_DIR}" if CACHE else "the kernel cache is off: ENTMAX_REF_NUMBA_CACHE=0 or unwritable"
        _LOG.info("entmax-ref: a numba kernel this call needs is not compiled, so backend='auto' answered on the "
                  "NumPy reference (exact, slower on large inputs); run `entmax-ref compile` once to put every "
                  "kernel in the cache (%s)", where)


def _numba_may_answer() -> bool:
    """Whether the numba engine may have a compiled kernel: it is imported already, or the
    disk cache holds a kernel index (found without importing numba)."""
    if _found[0] or "entmax_ref.backends.numba_backend" in sys.modules:
        return True
    from .cache_folder import CACHE, CACHE_DIR

    if CACHE and CACHE_DIR.is_dir() and next(CACHE_DIR.rglob("*.nbi"), None) is not None:
        _found[0] = True
    return _found[0]


class AutoCPU:
    """``backend="auto"`` on NumPy arrays: each member of the backend contract runs on
    ``fast`` (the numba engine) when the kernels it reaches are compiled, else on
    ``reference``; same answers either way."""

    name = "auto"

    def __init__(self, fast: Backend, reference: Backend):
        self.fast, self.reference = fast, reference

    def owns(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def _run(self, member: str, args: tuple, otherwise: Callable[[], Any]):
        from .numba._jit import NotCompiled, compiled_only

        try:
            with compiled_only():
                return getattr(self.fast, member)(*args)
        except NotCompiled:
            _say()
        return otherwise()

    def __getattr__(self, member: str):
        if member.startswith("_") or not callable(getattr(self.reference, member, None)):
            raise AttributeError(member)

        def call(*args):
            return self._run(member, args, lambda: getattr(self.reference, member)(*args))

        return call

    def entmax_forward(self, x, alpha, method):
        if method not in methods(self.fast.name, "entmax_forward"):  # a method of the reference alone
            return self.reference.entmax_forward(x, alpha, method)
        return self._run("entmax_forward", (x, alpha, method),
                         lambda: self.reference.entmax_forward(x, alpha, method))

    def entmax_forward_scanned(self, x, alpha, method):
        """The fast engine's scanned forward, or the reference's forward after a scan of
        ``x`` (the public layer skipped its own: it raises on this hook's
        :class:`~entmax_ref.backends._base.NonFiniteInput`)."""
        def otherwise():
            if np.isnan(x).any() or np.isposinf(x).any():  # -inf masks an entry: allowed
                raise NonFiniteInput("x has a NaN or +inf entry")
            return self.reference.entmax_forward(x, alpha, method)

        if method not in methods(self.fast.name, "entmax_forward"):
            return otherwise()
        return self._run("entmax_forward_scanned", (x, alpha, method), otherwise)

    def attention_scans_inputs(self, q, k, v, spec) -> bool:
        return bool(self.fast.attention_scans_inputs(q, k, v, spec))

    def attention_forward(self, q, k, v, spec):
        def otherwise():
            if self.fast.attention_scans_inputs(q, k, v, spec) and not (np.isfinite(k).all() and np.isfinite(v).all()):
                raise NonFiniteInput("k or v has a NaN or infinite entry")
            return self.reference.attention_forward(q, k, v, spec)

        return self._run("attention_forward", (q, k, v, spec), otherwise)


_auto: list[AutoCPU] = []


def auto_backend(arrays: tuple[Any, ...], get: Callable[[str], Backend], cpu: Iterable[str]) -> Backend:
    """The backend ``backend="auto"`` runs a call on (see the module docstring): ``cupy``
    for CuPy arrays, else the best usable engine of ``cpu`` (names, best first, built by
    ``get``), as :class:`AutoCPU` over the reference when it is ``numba``."""
    if any(is_cupy(a) for a in arrays):
        return get("cupy")
    name = next(iter(cpu))
    if name != "numba":
        return get(name)
    if not _numba_may_answer():
        _say()
        return get("numpy")
    fast, reference = get("numba"), get("numpy")
    if not _auto or _auto[0].fast is not fast or _auto[0].reference is not reference:
        _auto[:] = [AutoCPU(fast, reference)]
    return _auto[0]
