"""Backend registry: lazy, string-named engines behind one small contract.

Choice of backend, highest priority first: the ``backend=`` argument of a public
function; :func:`use_backend` (a ContextVar, so it is thread- and task-safe); the
environment variable ``ENTMAX_REF_BACKEND`` (read at dispatch time); ``"auto"``, whose
choice is the one rule of :func:`entmax_ref.backends.auto.auto_backend` (CuPy arrays on
``cupy``; NumPy arrays on ``numba`` when the kernels the call runs are compiled, on the
``numpy`` reference otherwise).

Nothing here imports numba or cupy: a backend module is imported on first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from . import capabilities as _capabilities
from .auto import auto_backend
from ._base import AttentionForward, AttentionGrads, AttentionSpec, Backend, RowSolve

__all__ = [
    "AttentionForward",
    "AttentionGrads",
    "AttentionSpec",
    "Backend",
    "BackendUnavailableError",
    "RowSolve",
    "available_backends",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "use_backend",
]


class BackendUnavailableError(ImportError):
    """A known backend cannot be used here (package missing, no GPU, not implemented)."""


@dataclass(frozen=True)
class _Spec:
    factory: str | Callable[[], Backend]  # "module:attr" (relative to this package) or callable
    probe: Callable[[], str | None]  # None when usable, else the reason it is not
    hint: str  # how to get it


def _needs(module: str, extra: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'entmax-ref[{extra}]')"
        return None

    return probe


def _probe_cupy() -> str | None:
    reason = _needs("cupy", "cuda")()
    if reason:
        return reason
    import cupy  # only imported when the cupy backend is asked about

    if not cupy.is_available():
        return "cupy is installed but no CUDA device is available"
    return None


_REGISTRY: dict[str, _Spec] = {
    "numpy": _Spec(".numpy_backend:NumpyBackend", lambda: None, "always available"),
    "numba": _Spec(".numba_backend:NumbaBackend", _needs("numba", "numba"), "pip install numba"),
    "cupy": _Spec(".cupy_backend:CupyBackend", _probe_cupy, "pip install 'entmax-ref[cuda]'"),
}
#: CPU engines "auto" may pick for NumPy arrays, best first, once they are implemented.
_AUTO_CPU = ("numba", "numpy")

_instances: dict[str, Backend] = {}
_lock = threading.RLock()  # re-entrant: a factory may build the backend it wraps
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("entmax_ref_backend", default=None)


def register_backend(
    name: str,
    factory: Callable[[], Backend],
    *,
    probe: Callable[[], str | None] | None = None,
    capabilities: Mapping[str, tuple] | None = None,
) -> None:
    """Register a third-party backend under ``name`` (``factory()`` builds it lazily).

    ``capabilities`` (``{operation: methods}``, e.g. ``{"entmax_forward": (None, "bisect")}``)
    enters the backend into :mod:`entmax_ref.backends.capabilities`, whose dispatch errors
    then apply to it; without it the backend checks ``method=`` itself.
    """
    _REGISTRY[name] = _Spec(factory, probe or (lambda: None), "registered at run time")
    _instances.pop(name, None)
    _capabilities.remove_backend(name)
    if capabilities is not None:
        _capabilities.add_backend(name, capabilities)


def _implemented(name: str) -> bool:
    spec = _REGISTRY[name]
    if isinstance(spec.factory, str):
        module = spec.factory.split(":")[0]
        return importlib.util.find_spec(module, __name__) is not None
    return True


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot be used here, or None when it can."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; valid names: {', '.join(sorted(_REGISTRY))}")
    if not _implemented(name):
        return f"the {name} backend is not implemented in this version of entmax-ref"
    return _REGISTRY[name].probe()


def env_backend() -> str | None:
    """The backend named by the environment variable ``ENTMAX_REF_BACKEND`` (None when it
    is unset or empty); ValueError in one line naming the variable and the valid values
    when it names none."""
    name = os.environ.get("ENTMAX_REF_BACKEND") or None
    if name is not None and name != "auto" and name not in _REGISTRY:
        raise ValueError(f"the environment variable ENTMAX_REF_BACKEND={name!r} names no backend; "
                         f"valid values: auto, {', '.join(sorted(_REGISTRY))} (or unset it)")
    return name


def available_backends() -> list[str]:
    """Names of the backends that can run here, e.g. ``['numpy', 'numba']``."""
    return [name for name in _REGISTRY if unavailable_reason(name) is None]


def get_backend(name: str) -> Backend:
    """The (cached) backend instance called ``name``.

    Raises ValueError for an unknown name and BackendUnavailableError (an ImportError)
    naming the reason and the install hint when it cannot run here.
    """
    if name in _instances:
        return _instances[name]
    reason = unavailable_reason(name)
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} is unavailable: {reason}")
    with _lock:
        if name not in _instances:
            factory = _REGISTRY[name].factory
            if isinstance(factory, str):
                module, attr = factory.split(":")
                factory = getattr(importlib.import_module(module, __name__), attr)
            _instances[name] = factory()
    return _instances[name]


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[Backend]:
    """Context manager: run the enclosed calls on backend ``name`` (thread-safe).

    >>> import entmax_ref as er
    >>> with er.use_backend("numpy"):
    ...     er.sparsemax([0.0, 0.5]).tolist()
    [0.25, 0.75]
    """
    backend = get_backend(name) if name != "auto" else None
    token = _current.set(name)
    try:
        yield backend
    finally:
        _current.reset(token)


def resolve_backend(backend: str | Backend | None, *arrays: Any) -> Backend:
    """The backend a public call with these arrays runs on (see the module docstring)."""
    if backend is not None and not isinstance(backend, str):
        if not callable(getattr(backend, "owns", None)):
            raise TypeError(
                f"backend must be a backend name ({', '.join(repr(n) for n in ('auto', *sorted(_REGISTRY)))}) "
                f"or None (or a Backend instance), got {type(backend).__module__}.{type(backend).__qualname__} {backend!r}"[:300]
            )
        chosen = backend
    else:
        name = backend or _current.get() or env_backend() or "auto"
        if name == "auto":
            chosen = auto_backend(arrays, get_backend, (n for n in _AUTO_CPU if unavailable_reason(n) is None))
        else:
            chosen = get_backend(name)
    for a in arrays:
        if a is not None and not chosen.owns(a):
            raise TypeError(
                f"backend {chosen.name!r} cannot compute on {type(a).__module__}.{type(a).__name__} "
                "arrays; move the data explicitly (e.g. cupy.asarray / .get()) or pick another backend"
            )
    return chosen
