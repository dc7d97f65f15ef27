"""backend="auto" with an incomplete kernel cache: the NumPy reference answers while a
background process compiles every kernel (entmax_ref/backends/autocompile.py), then numba."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import autocompile, resolve_backend, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason("numba") is not None, reason="numba is not installed")

ROOT = Path(__file__).resolve().parents[1]
BIG = np.zeros((2, er.backends.AUTO_SMALL))


class FakeProc:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """The auto switch on an empty marker folder, with the process start recorded (and the
    disk cache on, whatever this machine's setting: with it off there is nothing to wait for)."""
    from entmax_ref.backends.numba import _cache

    monkeypatch.setattr(_cache, "CACHE", True)
    monkeypatch.setenv(autocompile.ENV, "1")
    monkeypatch.setattr(autocompile, "folder", lambda: tmp_path)
    monkeypatch.setattr(autocompile, "_state", {"ready": False, "proc": None, "checked": None})
    monkeypatch.setattr(autocompile, "RECHECK_S", 0.0)
    started = []

    def start():
        started.append(FakeProc())
        return started[-1]

    monkeypatch.setattr(autocompile, "start", start)
    return tmp_path, started


def test_auto_answers_on_the_reference_until_the_cache_is_complete(cold):
    folder, started = cold
    assert resolve_backend(None, BIG).name == "numpy"
    assert resolve_backend(None, BIG).name == "numpy"
    assert len(started) == 1  # one background compile, however many calls
    assert resolve_backend(None, np.zeros(4)).name == "numpy"
    assert resolve_backend("numba", BIG).name == "numba"  # a named engine is never replaced
    (folder / autocompile.COMPLETE).touch()
    assert resolve_backend(None, BIG).name == "numba"
    (folder / autocompile.COMPLETE).unlink()
    assert resolve_backend(None, BIG).name == "numba"  # once ready, stays ready
    assert len(started) == 1


def test_auto_stops_waiting_when_waiting_cannot_help(cold, monkeypatch):
    folder, started = cold
    (folder / autocompile.FAILED).write_text("attention\n")  # units the compile could not do
    assert resolve_backend(None, BIG).name == "numba"
    assert started == []


def test_auto_stops_waiting_when_its_compile_ends_short(cold):
    folder, started = cold
    assert resolve_backend(None, BIG).name == "numpy"
    started[0].code = -9  # killed, no marker written
    assert resolve_backend(None, BIG).name == "numba"


def test_the_switch_is_off_by_environment(cold, monkeypatch):
    folder, started = cold
    monkeypatch.setenv(autocompile.ENV, "0")
    assert resolve_backend(None, BIG).name == "numba"
    assert started == []


def test_a_running_compile_elsewhere_is_waited_for(cold, monkeypatch):
    folder, started = cold
    monkeypatch.setattr(autocompile, "start", lambda: None)  # the lock is held by another process
    assert resolve_backend(None, BIG).name == "numpy"
    assert resolve_backend(None, BIG).name == "numpy"
    (folder / autocompile.COMPLETE).touch()
    assert resolve_backend(None, BIG).name == "numba"


def test_the_lock_admits_one_compile_and_takes_over_a_dead_one(tmp_path):
    lock = tmp_path / autocompile.LOCK
    assert autocompile._claim(lock)
    assert not autocompile._claim(lock)  # just created, no pid yet: held
    lock.write_text(str(os.getpid()))
    assert not autocompile._claim(lock)  # a live holder
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(str(dead.pid))
    assert autocompile._claim(lock)  # its holder is gone
    lock.write_text(str(os.getpid()))
    old = time.time() - autocompile.STALE_S - 10
    os.utime(lock, (old, old))
    assert autocompile._claim(lock)  # held for too long: taken for dead


def _first_call(cache: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENTMAX_REF_CACHE_DIR": str(cache), autocompile.ENV: "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT),
                          timeout=600)


FIRST = """
import sys, time, numpy as np
t = time.perf_counter()
import entmax_ref as er
from entmax_ref.backends import autocompile
x = np.random.default_rng(0).standard_normal((512, 64))
p = er.entmax15(x)
took = time.perf_counter() - t
ref = er.entmax15(x, backend="numpy")
print(took, bool((p == ref).all()), "entmax_ref.backends.numba.rows" in sys.modules,
      (autocompile.folder() / autocompile.LOCK).read_text() or "-")
"""


def _stop(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the compile and its workers (their own session)
    except (ProcessLookupError, PermissionError):
        pass


def test_a_cold_first_call_compiles_nothing_in_the_caller(tmp_path):
    """The first large call after install answers in about a second (the
    reference's time), with the reference's numbers, and leaves the compile running."""
    out = _first_call(tmp_path, FIRST)
    assert out.returncode == 0, out.stderr
    took, same, loaded, pid = out.stdout.split()
    try:
        assert same == "True" and loaded == "False"
        assert pid.isdigit() and autocompile._alive(int(pid))  # the compile outlives the caller
        assert float(took) < 30.0  # generous: the point is no numba compile, which costs more even unloaded
    finally:
        if pid.isdigit():
            _stop(int(pid))


def test_the_background_compile_completes_and_auto_switches(tmp_path):
    """The whole round: the first call answers on the reference and starts the background
    compile, which compiles what is pending, marks the cache complete and releases its
    lock; the next process runs on numba.  Every unit but entmax15 is marked compiled
    beforehand (markers only), so the background compiles one unit, not all of them."""
    from entmax_ref.backends import numba_precompile as pc
    from entmax_ref.backends.numba._cache import KEY

    folder = tmp_path / "numba" / KEY / "compiled"
    folder.mkdir(parents=True)
    for unit, dtypes in pc._units_dtypes(pc.UNITS, pc.DTYPES):
        for dt in dtypes:
            if unit != "entmax15":
                (folder / f"{unit}-{dt}").touch()
    out = _first_call(tmp_path, FIRST)
    assert out.returncode == 0, out.stderr
    took, same, loaded, pid = out.stdout.split()
    assert same == "True" and loaded == "False" and pid.isdigit()
    try:
        t0 = time.monotonic()
        while not (folder / autocompile.COMPLETE).exists() and time.monotonic() - t0 < 900:
            time.sleep(1)
        log = (folder / autocompile.LOG).read_text()
        assert (folder / autocompile.COMPLETE).exists(), log
        assert "compiled entmax15" in log and "compiled entmax " not in log, log
        t0 = time.monotonic()
        while (folder / autocompile.LOCK).exists() and time.monotonic() - t0 < 60:
            time.sleep(0.2)
        assert not (folder / autocompile.LOCK).exists()
        after = _first_call(tmp_path, "import sys, numpy as np, entmax_ref as er\n"
                                      "x = np.random.default_rng(0).standard_normal((512, 64))\n"
                                      "print(er.backends.resolve_backend(None, x).name,"
                                      " bool((er.entmax15(x) == er.entmax15(x, backend='numba')).all()))")
        assert after.returncode == 0, after.stderr
        assert after.stdout.split() == ["numba", "True"]
    finally:
        _stop(int(pid))
