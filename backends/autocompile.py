"""What ``backend="auto"`` does while the numba kernels are not compiled yet.

A large NumPy input on ``"auto"`` runs on numba, whose kernels compile on their first call:
with an empty cache (a new install, a new version, a CI runner) that is seconds for one
transform and tens of seconds for attention, paid by whoever calls first.  Instead, while
the disk cache is not complete, ``"auto"`` answers on the NumPy reference (exact too, a
few times slower on large inputs) and starts ``entmax-ref compile`` in a background
process of low priority; once that process has put every kernel in the cache, ``"auto"``
runs on numba.  So the first call takes the reference's run time, never a compile.

* One background compile per cache folder, whatever the number of processes asking (a
  lock file in the cache folder, holding the compiling process's id; a dead holder's lock
  is taken over).  It outlives the caller, so that the next run finds the cache complete,
  and runs in its own session, so the caller's Ctrl-C does not kill it; its output goes to
  ``background.log`` in the cache folder.
* ``ENTMAX_REF_BACKGROUND_COMPILE=0`` turns this off: ``"auto"`` then runs on numba at
  once and compiles on the first call, in the calling process, as ``backend="numba"``
  always does.  So does a disk cache that is off (nothing to wait for), and a background
  compile that ended with units it could not compile (they compile on first use).
* Until the switch, which engine answers a large ``"auto"`` call depends on how far the
  compile has got; both are exact to a few ulps of float64 and agree to the tolerances in
  :mod:`entmax_ref.testing.tolerance`, but not always bit for bit.  Pass ``backend="numba"``
  (or ``"numpy"``) when bitwise reproducibility across runs matters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

#: the environment variable that turns the background compile off (0, false, no, off)
ENV = "ENTMAX_REF_BACKGROUND_COMPILE"
#: file names in the cache folder: every unit compiled; the compile's lock; units that failed; its output
COMPLETE, LOCK, FAILED, LOG = "complete", "background.lock", "background.failed", "background.log"
#: a lock older than this (seconds) is taken for a dead compile
STALE_S = 3600.0
#: the cache folder is looked at no more often than this (seconds)
RECHECK_S = 0.5

_state: dict[str, object] = {"ready": False, "proc": None, "checked": None}
_lock = threading.Lock()


def folder() -> Path:
    """The folder of the compile markers (:mod:`.numba_precompile`: one per unit and dtype,
    and :data:`COMPLETE`): ``compiled/`` in the current kernel cache."""
    from .numba._cache import CACHE_DIR

    return CACHE_DIR / "compiled"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError):  # someone else's process, or no such probe on this platform
        return True
    return True


def _claim(lock: Path) -> bool:
    """Create ``lock`` unless a live background compile holds it."""
    for _ in range(2):
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            try:
                age = time.time() - lock.stat().st_mtime
                text = lock.read_text().strip()
            except OSError:
                return False
            held = _alive(int(text)) if text.isdigit() else age < 60.0  # just created: pid not yet written
            if held and age < STALE_S:
                return False
            try:
                lock.unlink()  # its compile died: take over
            except OSError:
                return False
        except OSError:
            return False
    return False


def start() -> subprocess.Popen | None:
    """Start the background compile, unless one is running on this cache folder (or the
    folder cannot be written): the process, or None."""
    where = folder()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    lock = where / LOCK
    if not _claim(lock):
        return None
    from .numba._cache import child_env

    code = "from entmax_ref.backends.numba_precompile import _background; _background()"
    try:
        with open(where / LOG, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=child_env(), cwd=str(where), start_new_session=True)
    except OSError:
        lock.unlink(missing_ok=True)
        return None
    try:
        lock.write_text(str(proc.pid))
    except OSError:
        pass
    return proc


def ready() -> bool:
    """Whether ``backend="auto"`` runs a large NumPy input on numba now.

    True when the disk cache holds every kernel (:data:`COMPLETE`, left by
    ``entmax-ref compile``), and also when waiting cannot help (see the module docstring);
    otherwise starts the background compile (if none is running) and returns False.  Once
    True, stays True in this process."""
    if _state["ready"]:
        return True
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return True
    from .numba._cache import CACHE

    with _lock:
        now = time.monotonic()
        if _state["checked"] is not None and now - float(_state["checked"]) < RECHECK_S:
            return False
        _state["checked"] = now
        where = folder()
        if not CACHE or (where / COMPLETE).exists() or (where / FAILED).exists():
            _state["ready"] = True
            return True
        proc = _state["proc"]
        if not proc:  # none started here yet, or another process's (which may have died since)
            _state["proc"] = start() or False
        elif proc.poll() is not None and not (where / COMPLETE).exists():  # ours ended short (killed?)
            _state["ready"] = True
        return bool(_state["ready"])
