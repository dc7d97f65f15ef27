"""Where the kernels' compiled code is stored: a cache object of this package's own, set on
its own dispatchers (:mod:`._jit`), that leaves numba's classes as they are.

Numba's ``cache=True`` writes next to the source file (``__pycache__`` inside the installed
package, which ``pip uninstall`` then leaves behind) and checks only the source file of
the function itself, so a kernel that calls a helper from another file keeps its stale
machine code after the helper changes.  :class:`KernelCache` instead (the folder and the
key are :mod:`entmax_ref.backends.cache_folder`'s, found without importing numba):

* lives in the platform's per-user cache directory (``~/.cache/entmax-ref`` on Linux, or
  ``ENTMAX_REF_CACHE_DIR``), never in ``site-packages``;
* is stamped with one hash of every kernel source, the numba version and the Python ABI:
  any change gives a new, empty folder, so nothing stale is ever loaded;
* saves an entry's code before its index line, under a lock file in the folder
  (:func:`file_lock`: the ``entmax-ref compile`` workers save concurrently, and numba's
  own index update is a read-modify-write), so an entry is in the index only once its
  code is on disk: a save that fails (a full disk, an unwritable folder) leaves the index
  as it was, and the kernel is simply not cached;
* treats a damaged entry (a truncated ``.nbc``, a corrupt or empty ``.nbi``) as a miss:
  the kernel compiles again and the save replaces it.

Only numba's documented-by-use extension points are subclassed here (the cache, its
implementation, locator and index file classes, all in ``numba.core.caching``), on the
numba versions of :data:`~entmax_ref.backends.cache_folder.TESTED_NUMBA`; on any other the
kernels run uncached (:data:`CACHE` is False).  Every other numba function of the process
keeps numba's own behaviour: nothing of numba is patched, no environment variable is set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from numba.core import caching as _caching

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: saves are not serialised
    fcntl = None

from ..cache_folder import (CACHE, CACHE_DIR, KERNEL_DIR, KEY, TESTED_NUMBA, cache_root, kernel_sources,
                            source_key)

_LOG = logging.getLogger("entmax_ref")

#: numba's compile-result cache implementation (renamed from ``_CompileResultCacheImpl``)
_ResultImpl = getattr(_caching, "CompileResultCacheImpl", None) or getattr(_caching, "_CompileResultCacheImpl")


class KernelCacheLocator(_caching._CacheLocator):
    """Where a kernel of :data:`~entmax_ref.backends.cache_folder.KERNEL_DIR` is cached:
    :data:`CACHE_DIR` (a subfolder per kernel subfolder), stamped with :data:`KEY`."""

    def __init__(self, py_func, py_file):
        self._lineno = py_func.__code__.co_firstlineno
        rel = Path(py_file).resolve().parent.relative_to(KERNEL_DIR)
        self._cache_path = str(CACHE_DIR.joinpath(*rel.parts))

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return KEY

    def get_disambiguator(self):
        return str(self._lineno)

    def ensure_cache_path(self):
        """Create the folder if it can; an unwritable one fails the save, which is then a
        miss (:meth:`KernelCache.save_overload`)."""
        os.makedirs(self._cache_path, exist_ok=True)

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            path = Path(py_file).resolve()
        except (OSError, TypeError, ValueError):
            return None
        if KERNEL_DIR not in path.parents or not path.is_file():
            return None
        return cls(py_func, py_file)


class _KernelCacheImpl(_ResultImpl):
    """numba's compile-result cache, located by :class:`KernelCacheLocator` alone."""

    _locator_classes = [KernelCacheLocator]


@contextlib.contextmanager
def file_lock(path):
    """An exclusive lock, across processes, on the file ``path`` (created if missing; its
    folder too), held for the ``with`` block; nothing where ``fcntl`` is missing (then
    concurrent processes may repeat each other's work)."""
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class _IndexDataFile(_caching.IndexDataCacheFile):
    """numba's index and data files of one kernel, saved code first: the index names an
    entry only once its code is written (numba writes the index first, so a failed data
    write left an entry that pointed at nothing); an index that cannot be read is
    replaced rather than failing the save."""

    def save(self, key, data):
        with file_lock(os.path.join(self._cache_path, ".index.lock")):
            try:
                overloads = self._load_index()
            except Exception:  # noqa: BLE001 - any unreadable index: start a new one
                _LOG.debug("entmax-ref kernel cache: replacing the unreadable %s", self._index_path)
                overloads = {}
            name = overloads.get(key)
            if name is None:
                used = set(overloads.values())
                name = next(n for n in map(self._data_name, range(1, len(used) + 2)) if n not in used)
            self._save_data(name, data)
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)


class KernelCache(_caching.FunctionCache):
    """The disk cache of one dispatcher of this package (:class:`._jit.Dispatcher` sets it):
    :class:`KernelCacheLocator`'s folder and stamp, :class:`_IndexDataFile`'s order of
    writes, and every failure to read or write an entry a cache miss, never an error of
    the call."""

    _impl_class = _KernelCacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _IndexDataFile(self._cache_path, self._impl.filename_base,
                                          self._impl.locator.get_source_stamp())

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # noqa: BLE001 - a damaged entry is a miss
            _LOG.debug("entmax-ref kernel cache: unreadable entry of %s (%s: %s); compiling again",
                       self._name, type(exc).__name__, exc)
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001 - not saved: the next process compiles it
            _LOG.debug("entmax-ref kernel cache: %s not saved (%s: %s)", self._name, type(exc).__name__, exc)


def cached(py_func) -> bool:
    """Whether ``py_func`` can be cached here: the cache is on and the function is defined
    in a file of :data:`KERNEL_DIR`."""
    return CACHE and KernelCacheLocator.from_function(py_func, py_func.__code__.co_filename) is not None


def package_root() -> str:
    """The folder this process imports entmax_ref from: a helper process started there
    (``python -c`` puts its working folder first on ``sys.path``) imports the same one,
    not another checkout's that the caller's working folder may hold."""
    return str(Path(sys.modules["entmax_ref"].__file__).resolve().parent.parent)


def child_env() -> dict[str, str]:
    """The environment of a helper process (an ``entmax-ref compile`` worker) that must
    import this same entmax_ref and use this same kernel cache: the caller's, with the
    package's folder first on ``PYTHONPATH`` and ``ENTMAX_REF_CACHE_DIR`` set."""
    root = package_root()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["ENTMAX_REF_CACHE_DIR"] = str(CACHE_DIR.parent.parent)  # this process's, whatever the variable says now
    return env


__all__ = ["CACHE", "CACHE_DIR", "KEY", "TESTED_NUMBA", "KernelCache", "KernelCacheLocator", "cache_root",
           "cached", "child_env", "file_lock", "kernel_sources", "package_root", "source_key"]
