"""Ahead-of-time compilation of the numba kernels into the disk cache, in parallel.

Numba compiles a kernel on its first call, one kernel at a time (compilation holds the
GIL), and most of a cold ``entmax-ref check`` or test run is spent there.  The kernels are
cached on disk (:mod:`entmax_ref.backends.numba._cache`) and every process shares that
cache, so they can be compiled *beforehand* by several worker processes at once: each
worker makes the small call of a *unit* (one solver path or kernel, one input dtype) on
the ``numba`` backend, which compiles exactly the specialization a real call of that path
uses and writes it to the cache; later calls, in any process, load it.

Units share kernels: the attention kernels solve their rows with the row solvers and
compute dalpha with the row alpha VJPs, the decoding path shares the forward's row code,
and a unit's float64 and float32 specializations are two entries of each kernel's one
cache index.  The work is therefore a graph (:data:`_NEEDS`): a task (one unit, one
dtype) starts only after the tasks whose kernels it calls are in the cache, so it loads
them instead of compiling them a second time in another process (the attention forward
compiles in about a third of the time with the row solvers cached).  Free workers take
the ready task with the longest chain of work behind it (:class:`_Schedule`).  Workers
that save one kernel's cache index at the same time (numba reads it, adds an entry and
writes it back) are serialised by a lock file (:mod:`entmax_ref.backends.numba._cache`).  A unit that succeeded
leaves a marker in the cache folder (the folder changes with the kernel sources), so
compiling again is free; ``force=True`` redoes it.

Used by ``entmax-ref compile`` (:func:`main`), at the start of ``entmax-ref check``
(:data:`CHECK_UNITS`, one worker per CPU) and at the start of the test session: commands,
never a library call (a call with ``backend="auto"`` answers on the NumPy reference while
the kernels it needs are not compiled, :mod:`entmax_ref.backends.engine`, whose unit
markers these are).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from . import engine as _engine

#: the input dtypes a unit is compiled for by default
DTYPES = _engine.DTYPES

_X = np.array([[0.5, -1.0, 0.25, 2.0, -0.5, 1.5, 0.0, -2.0],
               [1.0, 0.75, -0.25, 0.5, 3.0, -1.5, 2.5, 0.125]])


def _x(dt):
    return _X.astype(dt)


def _pg(alpha, dt, fn="entmax"):
    import entmax_ref as er

    p = getattr(er, fn)(_X, alpha, backend="numpy")
    return np.asarray(p, dt), np.asarray(_X[::-1], dt)


def _rows(alpha, method=None):
    def run(dt):
        import entmax_ref as er

        er.entmax(_x(dt), alpha, method=method, backend="numba")

    return run


#: one alpha per row of ``_X``, on both sides of 2 (the kernels that take either)
_MIXED = np.array([1.5, 3.0])


def _rows_mixed(dt):
    import entmax_ref as er

    er.entmax(_x(dt), _MIXED, method="newton", backend="numba")


def _vjp(alpha, which="entmax_vjp"):
    def run(dt):
        import entmax_ref as er

        getattr(er, which)(*_pg(alpha, dt), alpha, backend="numba")

    return run


def _normmax(dt):
    import entmax_ref as er

    er.normmax(_x(dt), 2.0, backend="numba")


def _normmax_vjp(dt):
    import entmax_ref as er

    er.normmax_vjp(*_pg(2.0, dt, "normmax"), 2.0, backend="numba")


def _budget(dt):
    import entmax_ref as er

    er.budget_sparsemax(_x(dt), 2.0, backend="numba")


def _budget_vjp(dt):
    import entmax_ref as er

    p = er.budget_sparsemax(_X, 2.0, backend="numpy")
    er.budget_sparsemax_vjp(np.asarray(p, dt), np.asarray(_X[::-1], dt), 2.0, backend="numba")


def _qkv(nq, nk, spread=1.0):
    rng = np.random.default_rng(0)
    q = spread * rng.standard_normal((1, 1, nq, 4))
    k = rng.standard_normal((1, 1, nk, 4))
    return q, k, rng.standard_normal((1, 1, nk, 4))


def _attention(alpha):
    """The chunked forward kernels of one solver path: with the float32 filter's scores
    (alpha > 1; its kernels read K and V in the input dtype) and with float64 scores
    (alpha = 1, and any chunk where the filter is off; float64 K and V whatever the input
    dtype)."""
    def run(dt):
        import entmax_ref as er
        from entmax_ref.backends.numba import attention_chunks as _att

        q, k, v = (a.astype(dt) for a in _qkv(4, 8))
        er.attention(q, k, v, alpha=alpha, backend="numba")
        saved = _att.FILTER_FRACTION
        _att.FILTER_FRACTION = 0.0  # this worker process only: the float64-score forward
        try:
            er.attention(q, k, v, alpha=alpha, backend="numba")
        finally:
            _att.FILTER_FRACTION = saved

    return run


def _decode(dt):
    """The decoding forward (one query over a long key cache, alpha 1.5) in the input
    dtype: its phase-1 kernels, the same for every solver path (the row kernels of phase 2
    are the chunked forward's, of ``attention_<path>``)."""
    import entmax_ref as er
    from entmax_ref.backends.numba import decode as _dec

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 4)).astype(dt) for n in (1, _dec.DECODE_MIN_KEYS, _dec.DECODE_MIN_KEYS))
    er.attention(q, k, v, alpha=1.5, backend="numba")


def _attention_vjp(dt):
    """The backward on float32-filtered and on float64 scores, with a sparse support
    (the scatter) and a dense one (the expanded blocks)."""
    import entmax_ref as er
    from entmax_ref.backends.numba import attention_chunks as _att

    for q, k, v in (_qkv(4, 8), _qkv(2, 64, spread=20.0)):
        q, k, v = (a.astype(dt) for a in (q, k, v))
        o, info = er.attention(q, k, v, alpha=1.5, backend="numpy", return_info=True)
        er.attention_vjp(np.ones_like(o), q, k, v, out=o, tau=info.tau, alpha=1.5, backend="numba")
    saved = _att.FILTER_FRACTION
    _att.FILTER_FRACTION = 0.0  # this worker process only: the float64-score backward
    try:
        er.attention_vjp(np.ones_like(o), q, k, v, out=o, tau=info.tau, alpha=1.5, backend="numba")
    finally:
        _att.FILTER_FRACTION = saved


#: unit name -> (what it compiles, the call that compiles it for one dtype)
_CALLS: dict[str, tuple[str, Callable[[str], None]]] = {
    "softmax": ("entmax forward, alpha = 1", _rows(1.0)),
    "sparsemax": ("entmax forward, alpha = 2", _rows(2.0)),
    "entmax15": ("entmax forward, alpha = 1.5", _rows(1.5)),
    "entmax": ("entmax forward, 1 < alpha < 2", _rows(1.25)),
    "entmax_big": ("entmax forward, alpha > 2", _rows(3.0)),
    "entmax_any": ("entmax forward, method='newton'/'bisect'", _rows_mixed),
    "entmax_vjp": ("entmax VJP, alpha <= 2", _vjp(1.5)),
    "entmax_vjp_big": ("entmax VJP, alpha > 2", _vjp(3.0)),
    "entmax_vjp_any": ("entmax VJP, alphas on both sides of 2", _vjp(_MIXED)),
    "entmax_alpha_vjp": ("entmax VJP with respect to alpha, alpha <= 2", _vjp(1.5, "entmax_alpha_vjp")),
    "entmax_alpha_vjp_big": ("entmax VJP with respect to alpha, alpha > 2", _vjp(3.0, "entmax_alpha_vjp")),
    "entmax_alpha_vjp_any": ("entmax VJP with respect to alpha, alphas on both sides of 2",
                             _vjp(_MIXED, "entmax_alpha_vjp")),
    "normmax": ("normmax forward", _normmax),
    "normmax_vjp": ("normmax VJP", _normmax_vjp),
    "budget": ("budget-sparsemax forward", _budget),
    "budget_vjp": ("budget-sparsemax VJP", _budget_vjp),
    "attention_softmax": ("attention forward, alpha = 1", _attention(1.0)),
    "attention_sparsemax": ("attention forward, alpha = 2", _attention(2.0)),
    "attention_entmax15": ("attention forward, alpha = 1.5", _attention(1.5)),
    "attention_entmax": ("attention forward, 1 < alpha < 2", _attention(1.25)),
    "attention_big": ("attention forward, alpha > 2", _attention(3.0)),
    "decode": ("attention decoding (few queries over a long key cache): its scores, alpha > 1", _decode),
    "attention_vjp": ("attention backward (float32-filtered and float64 scores)", _attention_vjp),
}
#: every unit of :data:`entmax_ref.backends.engine.UNITS` (the names the "auto" rule counts
#: in), in that order, with its description and call
UNITS: dict[str, tuple[str, Callable[[str], None]]] = {u: _CALLS[u] for u in _engine.UNITS}

#: the units ``entmax-ref check`` runs (everything but the mixed-alpha solvers, the alpha
#: VJPs and the decoding path, which check does not call)
CHECK_UNITS = tuple(u for u in UNITS if u not in ("entmax_any", "entmax_vjp_any", "entmax_alpha_vjp",
                                                   "entmax_alpha_vjp_big", "entmax_alpha_vjp_any", "decode"))

#: unit -> the units whose compiled kernels its own kernels call: the forward kernels of an
#: attention solver path solve their rows with that path's row solver, the decoding
#: forward runs the chunked forward's row kernels, the backward shares its helpers and
#: computes dalpha with the row alpha VJPs.  A unit starts only after these are in the
#: cache, so it loads their kernels instead of compiling them again.  (This order is for
#: speed only: the row units share small helpers among themselves too, and two workers
#: that save one kernel at once are serialised by the cache's lock.)
_NEEDS: dict[str, tuple[str, ...]] = {
    "attention_softmax": ("softmax",),
    "attention_sparsemax": ("sparsemax",),
    "attention_entmax15": ("entmax15",),
    "attention_entmax": ("entmax",),
    "attention_big": ("entmax_big",),
    "attention_vjp": ("attention_entmax15", "entmax_alpha_vjp", "entmax_alpha_vjp_big"),
    "decode": ("attention_entmax15",),  # its call runs the 1.5 path's row kernel
    "entmax_any": ("entmax_big",),  # its kernel calls the alpha > 2 solver
}

#: compile CPU seconds of each task (unit, dtype) with the tasks it needs cached, as
#: ``entmax-ref compile --jobs 2`` measured them on a cold cache (2-core Zen 4, load below
#: 1; a loaded machine inflates them, but the ratios are what the scheduler ranks by); 1
#: for a task not listed.  The first dtype of a row unit compiles the helpers both share.
_COST: dict[tuple[str, str], float] = {
    ("attention_entmax15", "float64"): 14.8, ("entmax", "float64"): 11.3, ("entmax_any", "float64"): 5.3,
    ("entmax", "float32"): 8.9, ("attention_vjp", "float64"): 8.0, ("entmax15", "float64"): 7.6,
    ("softmax", "float64"): 6.4, ("entmax_any", "float32"): 3.3, ("attention_entmax15", "float32"): 5.7,
    ("attention_entmax", "float64"): 4.6, ("attention_vjp", "float32"): 4.6, ("softmax", "float32"): 4.4,
    ("entmax15", "float32"): 4.2, ("attention_sparsemax", "float64"): 3.6, ("entmax_big", "float64"): 3.4,
    ("attention_big", "float64"): 3.1, ("sparsemax", "float64"): 2.3, ("budget", "float64"): 2.3,
    ("attention_entmax", "float32"): 2.2, ("normmax", "float64"): 2.2, ("budget", "float32"): 2.1,
    ("sparsemax", "float32"): 2.0, ("attention_sparsemax", "float32"): 2.0, ("attention_softmax", "float64"): 1.9,
    ("attention_big", "float32"): 1.5, ("entmax_vjp_big", "float32"): 1.5, ("entmax_big", "float32"): 1.4,
    ("normmax", "float32"): 1.3, ("normmax_vjp", "float64"): 1.0,
}

Task = tuple[str, str]  # (unit, dtype)


def _units_dtypes(units: Iterable[str], dtypes: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(unit, the dtypes it compiles for) of ``units``, validated."""
    dtypes = tuple(dtypes)
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    out = []
    for u in units:
        if u not in UNITS:
            raise ValueError(f"ops: unknown unit {u!r}; choose from {', '.join(UNITS)}")
        out.append((u, dtypes))
    return out


def _task_needs(task: Task) -> list[Task]:
    """The tasks that must be cached before ``task`` starts: the same unit's float64 task
    (the helpers both dtypes share compile once; concurrent saves into one cache index are
    safe either way, under :func:`.numba._cache.file_lock`), and the tasks of the units it
    needs in its dtype and in float64."""
    unit, dt = task
    out = [(unit, "float64")] if dt != "float64" else []
    for v in _NEEDS.get(unit, ()):
        out += [(v, "float64")] + ([(v, dt)] if dt != "float64" else [])
    return out


class _Schedule:
    """The order in which the workers take the tasks: a task is *ready* when none of its
    needs (:func:`_task_needs`, those in this schedule) is still to run or running; a free
    worker takes the ready task with the longest chain of work behind it (its own cost
    plus the longest cost path through the tasks that need it), so the attention chain
    starts as early as its needs allow and the small row tasks fill the other worker.  A
    task whose need failed still runs (it compiles what it needs itself)."""

    def __init__(self, tasks: Iterable[Task]):
        self.tasks = list(tasks)
        ts = set(self.tasks)
        self.needs = {t: {n for n in _task_needs(t) if n in ts} for t in self.tasks}
        after: dict[Task, list[Task]] = {t: [] for t in self.tasks}
        for t, ns in self.needs.items():
            for n in ns:
                after[n].append(t)
        self.rank: dict[Task, float] = {}

        def rank(t: Task) -> float:
            if t not in self.rank:
                self.rank[t] = _COST.get(t, 1.0) + max((rank(a) for a in after[t]), default=0.0)
            return self.rank[t]

        for t in self.tasks:
            rank(t)
        self.todo = list(self.tasks)
        self.running: set[Task] = set()
        self.cond = threading.Condition()

    def ready(self) -> list[Task]:
        """The tasks that could start now, best first."""
        busy = set(self.todo) | self.running
        return sorted((t for t in self.todo if not self.needs[t] & busy), key=lambda t: -self.rank[t])

    def take(self) -> Task | None:
        """The next task for a free worker (waits while every task left waits on a running
        one); None when none is left."""
        with self.cond:
            while self.todo:
                ready = self.ready()
                if ready:
                    self.todo.remove(ready[0])
                    self.running.add(ready[0])
                    return ready[0]
                self.cond.wait()
            return None

    def done(self, task: Task) -> None:
        with self.cond:
            self.running.discard(task)
            self.cond.notify_all()

    def order(self) -> list[Task]:
        """The order one worker would run the tasks in (the tests read the ranking from it)."""
        out = []
        while (t := self.take()) is not None:
            out.append(t)
            self.done(t)
        return out


def _marker(unit: str, dtype: str) -> Path:
    return _engine.marker(unit, dtype)


def _run_unit(unit: str, dtypes: tuple[str, ...]) -> None:
    """Compile ``unit`` for ``dtypes`` in this process and leave its markers."""
    for dt in dtypes:
        UNITS[unit][1](dt)
        m = _marker(unit, dt)
        m.parent.mkdir(parents=True, exist_ok=True)
        m.touch()


def _worker() -> None:  # pragma: no cover - runs in the worker processes
    """Worker loop: one ``unit dtype,dtype`` per line on stdin, one result line each
    (``ok <wall seconds> <CPU seconds>`` or ``error ...``)."""
    for line in sys.stdin:
        unit, dts = line.split()
        t0 = time.perf_counter()
        c0 = time.process_time()
        try:
            _run_unit(unit, tuple(dts.split(",")))
            msg = f"ok {time.perf_counter() - t0:.3f} {time.process_time() - c0:.3f}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            msg = "error " + repr(f"{type(exc).__name__}: {exc}") + " " + repr(traceback.format_exc(limit=3))
        print(msg.replace("\n", " "), flush=True)


#: what a worker process runs (``python -c``)
_WORKER_CODE = "from entmax_ref.backends.numba_precompile import _worker; _worker()"


def default_jobs() -> int:
    """The CPUs this process may use (one compile worker each by default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def pending(units: Iterable[str] | None = None, dtypes: Iterable[str] = DTYPES) -> list[tuple[str, tuple[str, ...]]]:
    """The (unit, dtypes) of ``units`` (default: all) not yet compiled into the current cache."""
    out = []
    for u, dts in _units_dtypes(UNITS if units is None else units, dtypes):
        todo = tuple(d for d in dts if not _marker(u, d).exists())
        if todo:
            out.append((u, todo))
    return out


def compile_kernels(units: Iterable[str] | None = None, dtypes: Iterable[str] = DTYPES, jobs: int | None = None,
                    force: bool = False, progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Compile the numba kernels of ``units`` for ``dtypes`` into the disk cache, in
    ``jobs`` worker processes.

    Parameters
    ----------
    units : iterable of str, optional
        Names from :data:`UNITS` (default: all of them).
    dtypes : iterable of {"float64", "float32"}
        The input dtypes to compile for (attention units compile once whatever these are).
    jobs : int, optional
        Worker processes (default: the CPUs this process may use).
    force : bool
        Compile again units already marked as compiled in the current cache.
    progress : callable, optional
        Called with one line per finished unit.

    Returns
    -------
    dict
        ``{"compiled": {unit: seconds}, "cpu": {unit: CPU seconds}, "failed": {unit:
        message}, "skipped": [units], "seconds": wall time, "jobs": workers, "cache":
        folder}``; ``cache`` is None and
        nothing runs when the disk cache is off (``ENTMAX_REF_NUMBA_CACHE=0`` or an
        unwritable folder).

    Raises
    ------
    ValueError
        An unknown unit or dtype, or ``jobs < 1``.
    """
    from .numba._cache import CACHE, CACHE_DIR, child_env

    t0 = time.perf_counter()
    names = list(UNITS if units is None else units)
    todo_all = _units_dtypes(names, dtypes)
    if jobs is None:
        jobs = default_jobs()
    if int(jobs) < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    report: dict[str, object] = {"compiled": {}, "cpu": {}, "failed": {}, "skipped": [], "seconds": 0.0,
                                 "jobs": 0, "cache": str(CACHE_DIR) if CACHE else None}
    if not CACHE:
        report["skipped"] = names
        return report
    todo = todo_all if force else pending(names, dtypes)
    done = {u for u, _ in todo}
    report["skipped"] = [u for u, _ in todo_all if u not in done]
    if not todo:
        report["seconds"] = time.perf_counter() - t0
        return report
    sched = _Schedule((u, d) for u, dts in todo for d in dts)
    jobs = min(int(jobs), len(sched.tasks))
    report["jobs"] = jobs
    lock = threading.Lock()
    env = child_env()
    code = _WORKER_CODE
    procs: list[subprocess.Popen] = []
    seconds: dict[str, float] = {}

    def feed() -> None:
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        except OSError as exc:  # no worker: the kernels compile on first use instead
            with lock:
                report["failed"].setdefault("worker", f"{type(exc).__name__}: {exc}")
            return
        with lock:
            procs.append(proc)
        try:
            while (task := sched.take()) is not None:
                unit, dt = task
                line = ""
                try:
                    proc.stdin.write(f"{unit} {dt}\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline().strip()
                finally:
                    with lock:
                        if line.startswith("ok "):
                            wall, cpu = (float(f) for f in (line.split()[1:] + ["nan"])[:2])
                            seconds[unit] = seconds.get(unit, 0.0) + wall
                            report["cpu"][unit] = report["cpu"].get(unit, 0.0) + cpu
                            if unit not in report["failed"]:
                                report["compiled"][unit] = seconds[unit]
                            msg = f"compiled {unit} ({dt}) in {wall:.1f}s ({cpu:.1f} CPU s)"
                        else:
                            report["compiled"].pop(unit, None)
                            report["failed"][unit] = line[6:] if line else "the worker process ended"
                            msg = f"could not compile {unit} ({dt}): {report['failed'][unit]}"
                    sched.done(task)  # whatever happened: the tasks that wait on it may go
                if progress is not None:
                    progress(msg)
                if not line:
                    return
        except OSError as exc:  # a worker that died: its unit is reported, the rest go on
            with lock:
                report["failed"].setdefault("worker", f"{type(exc).__name__}: {exc}")
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threads = [threading.Thread(target=feed, daemon=True) for _ in range(jobs)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:  # interrupted: stop the workers now, not after their compiles
        for proc in list(procs):
            proc.kill()
        raise
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
    report["seconds"] = time.perf_counter() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref compile``: compile the numba kernels into the disk cache."""
    ap = argparse.ArgumentParser(
        prog="entmax-ref compile",
        description="Compile the numba kernels into the disk cache ahead of time, in parallel worker "
                    "processes, so that first calls (and entmax-ref check) load them instead of compiling.",
        epilog="units: " + "; ".join(f"{u} ({d})" for u, (d, _) in UNITS.items()))
    ap.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: one per CPU)")
    ap.add_argument("--ops", default=None, metavar="UNIT,...", help="comma-separated units (default: all)")
    ap.add_argument("--check-set", action="store_true", help="the units entmax-ref check uses")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated input dtypes (default: float64,float32)")
    ap.add_argument("--force", action="store_true", help="compile again units already in the cache")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    import importlib.util

    if importlib.util.find_spec("numba") is None:
        print("entmax-ref compile: numba is not installed (pip install numba)", file=sys.stderr)
        return 2
    units = CHECK_UNITS if args.check_set else (
        None if args.ops is None else [u for u in args.ops.split(",") if u])
    try:
        rep = compile_kernels(units, [d for d in args.dtypes.split(",") if d], args.jobs, force=args.force,
                              progress=lambda m: print(m, flush=True))
    except ValueError as exc:
        print(f"entmax-ref compile: {exc}", file=sys.stderr)
        return 2
    if rep["cache"] is None:
        print("entmax-ref compile: the kernel cache is off (ENTMAX_REF_NUMBA_CACHE=0 or an unwritable folder); "
              "nothing to do", file=sys.stderr)
        return 1
    print(f"{len(rep['compiled'])} compiled, {len(rep['skipped'])} already cached, {len(rep['failed'])} failed, "
          f"{rep['jobs']} processes, {rep['seconds']:.1f}s ({sum(rep['cpu'].values()):.1f} CPU s compiling); "
          f"cache: {rep['cache']}")
    return 1 if rep["failed"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
