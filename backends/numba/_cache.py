"""Where the numba kernels' compiled code is cached, and when it is stale.

Numba's own ``cache=True`` writes next to the source file (``__pycache__`` inside the
installed package, which ``pip uninstall`` then leaves behind) and only checks the source
file of the function itself, so a kernel that calls a helper from another file keeps its
stale machine code after the helper changes.  Here instead:

* the cache lives in the platform's per-user cache directory
  (``platformdirs.user_cache_dir("entmax-ref")``, e.g. ``~/.cache/entmax-ref`` on Linux),
  or in ``ENTMAX_REF_CACHE_DIR`` when that is set, never in ``site-packages``;
* its key is one hash of every kernel source (all ``.py`` files of this folder, and any
  module of the package they import from), the numba version and the Python ABI: any
  change to any of them gives a new, empty folder, so nothing stale is ever loaded.

The redirection is scoped: :class:`KernelCacheLocator` is put first in numba's list of
cache locators but only claims functions defined in files of this folder; every other
numba function in the process keeps numba's default behaviour, and no environment
variable is set.  When the cache directory cannot be created or written, caching is off
(:data:`CACHE` is False) rather than falling back to the package folder.  Saving into
this cache takes a lock file in its folder (:func:`_locked_save`), so processes that
compile kernels at the same time (the ``entmax-ref compile`` workers) cannot corrupt an
index; numba's saves elsewhere are unchanged.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numba
from numba.core import caching as _caching

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: numba's unlocked saves
    fcntl = None

#: this folder: every kernel module lives here (subfolders included)
KERNEL_DIR = Path(__file__).resolve().parent
#: the package folder that relative imports of the kernel modules resolve in
PACKAGE_DIR = KERNEL_DIR.parent

_OFF = ("0", "false", "no", "off")


def _imported_files(path: Path, package_dir: Path) -> set[Path]:
    """The package's source files that ``path`` imports with relative imports
    (``from . import x``, ``from ..y import z``), resolved to files that exist."""
    found: set[Path] = set()
    tree = ast.parse(path.read_bytes(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        if package_dir not in (base, *base.parents):
            continue
        parts = node.module.split(".") if node.module else []
        target = base.joinpath(*parts)
        names = [target / f"{a.name}.py" for a in node.names] + [target / "__init__.py", target.with_suffix(".py")]
        found.update(p.resolve() for p in names if p.is_file())
    return found


def kernel_sources(kernel_dir: Path = KERNEL_DIR, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every file the compiled kernels can depend on: all ``.py`` files under
    ``kernel_dir`` and, transitively, the package modules they import from."""
    todo = sorted(p.resolve() for p in kernel_dir.rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_imported_files(path, package_dir) - seen)
    return sorted(seen)


def source_key(kernel_dir: Path = KERNEL_DIR, package_dir: Path = PACKAGE_DIR) -> str:
    """A hash of the kernel sources (names relative to ``package_dir`` and contents), the
    numba version and the Python ABI; it changes whenever any of them does."""
    h = hashlib.sha256()
    h.update(f"numba {numba.__version__}; python {sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}".encode())
    for path in kernel_sources(kernel_dir, package_dir):
        rel = path.relative_to(package_dir) if package_dir in path.parents else Path(path.name)
        data = path.read_bytes()
        h.update(f"\0{rel.as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:20]


def cache_root() -> Path:
    """The folder that holds entmax-ref's compiled caches: ``ENTMAX_REF_CACHE_DIR`` when
    set, else the platform's per-user cache directory for ``entmax-ref``."""
    env = os.environ.get("ENTMAX_REF_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("entmax-ref", appauthor=False))


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _prune(parent: Path, keep: str, max_age_s: float = 14 * 86400.0) -> None:
    """Remove the caches of other source versions not used for ``max_age_s`` (old
    installs and edits leave one folder each; a fresh one may be in use elsewhere)."""
    now = time.time()
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            if entry.name != keep and entry.is_dir() and now - entry.stat().st_mtime > max_age_s:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def _enabled() -> bool:
    return os.environ.get("ENTMAX_REF_NUMBA_CACHE", "1").strip().lower() not in _OFF


#: the key of the current kernel sources
KEY: str = source_key()
#: the folder the compiled kernels are cached in (whether or not caching is on)
CACHE_DIR: Path = cache_root() / "numba" / KEY
#: whether the kernels are cached on disk: ``ENTMAX_REF_NUMBA_CACHE=0`` turns it off, and
#: so does a cache folder that cannot be written
CACHE: bool = _enabled() and _writable(CACHE_DIR)
_CACHE_DIR_STR = os.path.abspath(CACHE_DIR)
if CACHE:
    try:
        os.utime(CACHE_DIR)  # last use, which is what _prune goes by
    except OSError:
        pass
    _prune(CACHE_DIR.parent, KEY)


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
    """The environment of a helper process (a compile worker, the background compile) that
    must import this same entmax_ref and use this same kernel cache: the caller's, with the
    package's folder first on ``PYTHONPATH`` and ``ENTMAX_REF_CACHE_DIR`` set."""
    root = str(Path(sys.modules["entmax_ref"].__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["ENTMAX_REF_CACHE_DIR"] = str(CACHE_DIR.parent.parent)  # this process's, whatever the variable says now
    return env


def _locked_save(save):
    """Numba's ``IndexDataCacheFile.save``, under :func:`file_lock` for the files of
    :data:`CACHE_DIR`.  It reads the function's index, picks the first free data file
    number, writes the index back and then the data, with no lock: two processes that save
    two signatures of one kernel at once both take number 1, one index entry is lost and
    the other can point at the other signature's code (an error when it is loaded).  The
    precompile workers, a test session and the caller of a background compile do save
    concurrently; held for the milliseconds of a save, the lock makes it atomic.  Other
    numba caches are untouched."""

    def locked(self, key, data):
        path = os.path.abspath(self._cache_path)
        if path != _CACHE_DIR_STR and not path.startswith(_CACHE_DIR_STR + os.sep):
            return save(self, key, data)
        with file_lock(os.path.join(path, ".index.lock")):
            return save(self, key, data)

    locked._entmax_ref_locked = True
    return locked


def _install_index_lock() -> None:
    cls = _caching.IndexDataCacheFile
    if not getattr(cls.save, "_entmax_ref_locked", False):
        cls.save = _locked_save(cls.save)


def _install_locator() -> None:
    impl = getattr(_caching, "CacheImpl", None) or getattr(_caching, "_CacheImpl")
    if not any(c.__name__ == KernelCacheLocator.__name__ and c.__module__ == __name__ for c in impl._locator_classes):
        impl._locator_classes.insert(0, KernelCacheLocator)


_install_locator()
_install_index_lock()

__all__ = ["CACHE", "CACHE_DIR", "KEY", "KernelCacheLocator", "cache_root", "child_env", "file_lock",
           "kernel_sources", "source_key"]
