"""``entmax-ref cache info|clear``: the numba kernel cache folder of this version, shown or
deleted.

The cache (:mod:`entmax_ref.backends.cache_folder`) lives outside the package, in one
folder per kernel version; ``pip uninstall`` leaves it.  ``info`` prints the current
folder, its size, its entries and how many of the declared kernel signatures
(:func:`entmax_ref.backends.numba_precompile.tasks`) are compiled in it, and lists the
folders of other versions beside it; ``clear`` deletes the current folder and nothing
else.  These are the only ways entmax-ref deletes files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .numba_precompile import pending, tasks


def _size(folder: Path) -> tuple[int, int, int, int]:
    """(bytes, files, kernel indexes ``.nbi``, compiled specialisations ``.nbc``) under ``folder``."""
    total = files = nbi = nbc = 0
    for f in folder.rglob("*") if folder.is_dir() else ():
        try:
            if f.is_file():
                total += f.stat().st_size
                files += 1
                nbi += f.suffix == ".nbi"
                nbc += f.suffix == ".nbc"
        except OSError:
            pass
    return total, files, nbi, nbc


def cache_info() -> dict[str, object]:
    """What ``entmax-ref cache info`` prints: the current cache folder (``folder``), whether
    caching is on, its size in bytes, files, kernels (``.nbi`` indexes) and compiled
    specialisations (``.nbc``), the declared kernel signatures (``declared``) and those not
    compiled yet (``pending``, their labels), ``complete`` (every one compiled for this
    version), and the folders of other versions beside it (``others``: ``[path, bytes]``,
    left alone by ``cache clear``)."""
    from .cache_folder import CACHE, CACHE_DIR

    size, files, nbi, nbc = _size(CACHE_DIR)
    declared = tasks()
    todo = [t.label for t in pending(declared)] if CACHE else [t.label for t in declared]
    try:
        others = sorted(e for e in CACHE_DIR.parent.iterdir() if e.is_dir() and e.name != CACHE_DIR.name)
    except OSError:
        others = []
    return {"folder": str(CACHE_DIR), "cache": CACHE, "bytes": size, "files": files, "kernels": nbi,
            "specialisations": nbc, "declared": len(declared), "pending": todo, "complete": CACHE and not todo,
            "others": [[str(e), _size(e)[0]] for e in others]}


def cache_clear() -> tuple[str, int, int, int]:
    """Delete the current kernel cache folder (this version's, nothing else): (its path,
    the bytes freed, the files and bytes left: what a read-only folder, or another user's
    files, kept).  Kernels compile again on their next ``backend="numba"`` call or
    ``entmax-ref compile``."""
    import shutil

    from .cache_folder import CACHE_DIR, KEY

    if CACHE_DIR.name != KEY or CACHE_DIR.parent.name != "numba":  # pragma: no cover - never another folder
        raise RuntimeError(f"refusing to delete {CACHE_DIR}: not an entmax-ref kernel cache folder")
    before = _size(CACHE_DIR)[0]
    shutil.rmtree(CACHE_DIR, ignore_errors=True)
    left, files = _size(CACHE_DIR)[:2]
    return str(CACHE_DIR), before - left, files, left


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref cache info|clear``: show or delete the current kernel cache folder."""
    ap = argparse.ArgumentParser(
        prog="entmax-ref cache",
        description="Show (info) or delete (clear) the numba kernel cache of this version of entmax-ref. "
                    "clear removes this version's folder only; the folders of other versions, listed by "
                    "info, are left for you to delete.")
    ap.add_argument("action", choices=("info", "clear"))
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.action == "clear":
        where, freed, files, left = cache_clear()
        if files or Path(where).exists():  # the truth: a folder that stays was not removed
            print(f"entmax-ref cache clear: could not remove {where}: {files} file{'s' * (files != 1)} "
                  f"({left} bytes) left ({_mb(freed)} freed); check its permissions", file=sys.stderr)
            return 1
        print(f"removed {where} ({_mb(freed)})")
        return 0
    info = cache_info()
    state = "on" if info["cache"] else "off (ENTMAX_REF_NUMBA_CACHE=0, an unwritable folder or an untested numba)"
    n_tasks = info["declared"]
    print(f"kernel cache: {info['folder']}\n"
          f"  caching: {state}\n"
          f"  size: {_mb(info['bytes'])} in {info['files']} files ({info['kernels']} kernels, "
          f"{info['specialisations']} compiled specialisations)\n"
          f"  kernel signatures compiled: {n_tasks - len(info['pending'])} of {n_tasks}; complete: "
          + ("yes" if info["complete"] else "no (entmax-ref compile fills it)"))
    for path, size in info["others"]:
        print(f"  another version's folder (not used by this one): {path} ({_mb(size)})")
    return 0
