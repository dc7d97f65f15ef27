"""Where the numba kernels' compiled code is cached, and whether caching is on, found
without importing numba.

The folder is ``<cache root>/numba/<KEY>``: the cache root is the platform's per-user cache
directory (``platformdirs.user_cache_dir("entmax-ref")``, e.g. ``~/.cache/entmax-ref`` on
Linux) or ``ENTMAX_REF_CACHE_DIR``, and :data:`KEY` one hash of every kernel source (all
``.py`` files of ``backends/numba``, and any module of the package they import from), the
numba version (read from its installed metadata) and the Python ABI.  The numba engine
(:mod:`entmax_ref.backends.numba._cache`) keeps its compiled kernels there; the
``"auto"`` rule (:mod:`entmax_ref.backends.auto`) looks there, so that a call made while
nothing is compiled answers on the NumPy reference without importing numba.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

_OFF = ("0", "false", "no", "off")


def _numba_version() -> str:
    try:
        return metadata.version("numba")
    except metadata.PackageNotFoundError:
        return ""


#: the installed numba's version ("" without numba)
NUMBA_VERSION: str = _numba_version()

#: the kernels' folder: every kernel module lives there (subfolders included)
KERNEL_DIR = Path(__file__).resolve().parent / "numba"
#: the package folder that relative imports of the kernel modules resolve in
PACKAGE_DIR = KERNEL_DIR.parent


def _imported_files(path: Path, package_dir: Path) -> set[Path]:
    """The package's source files that ``path`` imports with relative imports
    (``from . import x``, ``from ..y import z``), resolved to files that exist: the
    submodules named (``from .. import geometry``: ``geometry.py``, not the package's
    ``__init__.py``), else the module the names are taken from."""
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
        modules = [m for a in node.names for m in (target / f"{a.name}.py", target / a.name / "__init__.py")
                   if m.is_file()]
        if len(modules) < len(node.names):  # names defined in the module itself, not submodules
            modules += [p for p in (target / "__init__.py", target.with_suffix(".py")) if p.is_file()]
        found.update(p.resolve() for p in modules)
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
    h.update(f"numba {NUMBA_VERSION}; python {sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}".encode())
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


def writable(path: Path) -> bool:
    """Whether ``path`` can be created (if need be) and written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


#: the numba releases (major, minor), first and last, that the kernels' cache classes (which
#: subclass numba's, :mod:`entmax_ref.backends.numba._cache`) and their BLAS binding
#: (:mod:`entmax_ref.backends.numba.products`) are tested on: pyproject.toml's bound on
#: numba; ``tests/test_install.py`` installs the first
TESTED_NUMBA = ((0, 59), (0, 68))


def tested(version: str) -> bool:
    """Whether numba ``version`` is within :data:`TESTED_NUMBA`."""
    try:
        major_minor = tuple(int(v) for v in version.split(".")[:2])
    except ValueError:
        return False
    return TESTED_NUMBA[0] <= major_minor <= TESTED_NUMBA[1]


def _enabled() -> bool:
    return (os.environ.get("ENTMAX_REF_NUMBA_CACHE", "1").strip().lower() not in _OFF
            and tested(NUMBA_VERSION))


#: the key of the current kernel sources
KEY: str = source_key()
#: the folder the compiled kernels are cached in (whether or not caching is on)
CACHE_DIR: Path = cache_root() / "numba" / KEY
#: whether the kernels are cached on disk: ``ENTMAX_REF_NUMBA_CACHE=0`` turns it off, and
#: so do a cache folder that cannot be written and a numba outside :data:`TESTED_NUMBA`
CACHE: bool = _enabled() and writable(CACHE_DIR)
