"""Where the numba kernels' compiled code is cached, and when it is stale.

Numba's own ``cache=True`` writes next to the source file (``__pycache__`` inside the
installed package, which ``pip uninstall`` then leaves behind) and only checks the source
file of the function itself, so a kernel that calls a helper from another file keeps its
stale machine code after the helper changes.  Here instead (the folder and the key are
:mod:`entmax_ref.backends.cache_folder`'s, found without importing numba):

* the cache lives in the platform's per-user cache directory
  (``platformdirs.user_cache_dir("entmax-ref")``, e.g. ``~/.cache/entmax-ref`` on Linux),
  or in ``ENTMAX_REF_CACHE_DIR`` when that is set, never in ``site-packages``;
* its key is one hash of every kernel source (all ``.py`` files of this folder, and any
  module of the package they import from), the numba version and the Python ABI: any
  change to any of them gives a new, empty folder, so nothing stale is ever loaded.

Importing this module creates the current folder (when it can) and deletes nothing: the
folders of other versions stay until ``entmax-ref cache clear`` (which removes the current
one only) or the user deletes them.

What this module changes in numba, and only for the numba versions it is tested on
(:data:`TESTED_NUMBA`; elsewhere the kernels run uncached, :data:`CACHE` is False):

* :class:`KernelCacheLocator` is put first in numba's list of cache locators but claims
  only functions defined in files of this folder; every other numba function in the
  process keeps numba's default behaviour, and no environment variable is set;
* numba's index/data cache file gets two guards that act on files of :data:`CACHE_DIR`
  only (every other path goes straight to numba's own code): a save takes a lock file in
  the folder (:func:`file_lock`), so processes that compile at the same time (the
  ``entmax-ref compile`` workers) cannot corrupt an index; and a damaged entry (a
  truncated ``.nbc``, a corrupt or empty ``.nbi``) or an unwritable folder is a cache miss,
  never an error: the kernel compiles again, the damaged entry is replaced when the
  folder can be written, and the call runs uncached when it cannot.

When the cache directory cannot be created or written at import, caching is off
(:data:`CACHE` is False) rather than falling back to the package folder.
"""

from __future__ import annotations

import contextlib
import os
import logging
import sys
from pathlib import Path

import numba
from numba.core import caching as _caching

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: numba's unlocked saves
    fcntl = None

from ..cache_folder import (CACHE, CACHE_DIR, KERNEL_DIR, KEY, PACKAGE_DIR, TESTED_NUMBA, cache_root,
                            kernel_sources, source_key)

_CACHE_DIR_STR = os.path.abspath(CACHE_DIR)
_LOG = logging.getLogger("entmax_ref")


class KernelCacheLocator(_caching._CacheLocator):
    """Numba cache locator for the functions defined under :data:`KERNEL_DIR` (and only
    those): files go to :data:`CACHE_DIR` (a subfolder per kernel subfolder), stamped with
    :data:`KEY`, the hash of all kernel sources."""

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
        """Create the folder if it can; an unwritable one is left to the save, which then
        skips (:func:`_guarded_save`) instead of failing the call."""
        try:
            os.makedirs(self._cache_path, exist_ok=True)
        except OSError:
            pass

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            path = Path(py_file).resolve()
        except (OSError, TypeError, ValueError):
            return None
        if KERNEL_DIR not in path.parents or not path.is_file():
            return None
        return cls(py_func, py_file)


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


def child_env() -> dict[str, str]:
    """The environment of a helper process (an ``entmax-ref compile`` worker) that must
    import this same entmax_ref and use this same kernel cache: the caller's, with the
    package's folder first on ``PYTHONPATH`` and ``ENTMAX_REF_CACHE_DIR`` set."""
    root = str(Path(sys.modules["entmax_ref"].__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["ENTMAX_REF_CACHE_DIR"] = str(CACHE_DIR.parent.parent)  # this process's, whatever the variable says now
    return env


def _ours(cache_file) -> bool:
    """Whether a numba ``IndexDataCacheFile`` is one of this cache's (under :data:`CACHE_DIR`)."""
    path = os.path.abspath(cache_file._cache_path)
    return path == _CACHE_DIR_STR or path.startswith(_CACHE_DIR_STR + os.sep)


def _guarded_save(save):
    """Numba's ``IndexDataCacheFile.save`` for the files of :data:`CACHE_DIR`, under
    :func:`file_lock`, over a damaged index and into an unwritable folder.

    Numba reads the function's index, picks the first free data file number, writes the
    index back and then the data, with no lock: two processes that save two signatures of
    one kernel at once both take number 1, one index entry is lost and the other can point
    at the other signature's code.  The ``entmax-ref compile`` workers and a test session do
    save concurrently; held for the milliseconds of a save, the lock makes it atomic.  An
    index that cannot be read (truncated, corrupt, empty) is removed first, so the save
    writes a fresh one; a folder that cannot be written (``OSError``) leaves the kernel
    uncached.  Other numba caches are untouched."""

    def guarded(self, key, data):
        if not _ours(self):
            return save(self, key, data)
        try:
            with file_lock(os.path.join(self._cache_path, ".index.lock")):
                try:
                    self._load_index()
                except Exception:  # noqa: BLE001 - any unreadable index: start a new one
                    _LOG.debug("entmax-ref kernel cache: replacing the unreadable %s", self._index_path)
                    os.unlink(self._index_path)
                return save(self, key, data)
        except OSError as exc:
            _LOG.debug("entmax-ref kernel cache: not saved (%s)", exc)
            return None

    guarded._entmax_ref_guard = True
    return guarded


def _guarded_load(load):
    """Numba's ``IndexDataCacheFile.load`` for the files of :data:`CACHE_DIR`: an entry that
    cannot be read (a truncated ``.nbc``, a corrupt or empty ``.nbi``: numba's loader raises
    ``UnpicklingError``, ``EOFError``, ``MemoryError`` and others) is a cache miss, so the
    kernel compiles and :func:`_guarded_save` replaces the entry.  Other paths: numba's."""

    def guarded(self, key):
        if not _ours(self):
            return load(self, key)
        try:
            return load(self, key)
        except Exception as exc:  # noqa: BLE001 - a damaged entry is a miss, never an error
            _LOG.debug("entmax-ref kernel cache: unreadable entry in %s (%s: %s); compiling again",
                       self._index_path, type(exc).__name__, exc)
            return None

    guarded._entmax_ref_guard = True
    return guarded


def _install_guards() -> None:
    cls = _caching.IndexDataCacheFile
    if not getattr(cls.save, "_entmax_ref_guard", False):
        cls.save = _guarded_save(cls.save)
    if not getattr(cls.load, "_entmax_ref_guard", False):
        cls.load = _guarded_load(cls.load)


def _install_locator() -> None:
    impl = getattr(_caching, "CacheImpl", None) or getattr(_caching, "_CacheImpl")
    if not any(c.__name__ == KernelCacheLocator.__name__ and c.__module__ == __name__ for c in impl._locator_classes):
        impl._locator_classes.insert(0, KernelCacheLocator)


if CACHE:  # the kernels are compiled with cache=CACHE: nothing to place otherwise
    _install_locator()
    _install_guards()

__all__ = ["CACHE", "CACHE_DIR", "KEY", "TESTED_NUMBA", "KernelCacheLocator", "cache_root", "child_env",
           "file_lock", "kernel_sources", "source_key"]
