"""Ahead-of-time compilation of the numba kernels into the disk cache, in parallel.

Numba compiles a kernel on its first call, one kernel at a time (compilation holds the
GIL), and most of a cold ``entmax-ref check`` or test run is spent there.  The kernels are
cached on disk (:mod:`entmax_ref.backends.numba._cache`) and every process shares that
cache, so they can be compiled *beforehand* by several worker processes at once: each
worker makes the small call of a *unit* (one solver path or kernel, one input dtype) on
the ``numba`` backend, which compiles exactly the specialization a real call of that path
uses and writes it to the cache; later calls, in any process, load it.

Units never share a compiled kernel (every kernel belongs to one unit, all dtypes of a
unit run in one worker), so no two workers write the same cache index.  A unit that
succeeded leaves a marker in the cache folder (the folder changes with the kernel
sources), so compiling again is free; ``force=True`` redoes it.

Used by ``entmax-ref compile`` (:func:`main`), at the start of ``entmax-ref check``
(:data:`CHECK_UNITS`, one worker per CPU) and at the start of the test session.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

#: the input dtypes a unit is compiled for by default
DTYPES = ("float64", "float32")

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


def _rows_mixed(dt):
    import entmax_ref as er

    er.entmax(_x(dt), np.array([1.5, 3.0]), method="newton", backend="numba")


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


def _attention(dt):
    """The fused forward with the float32 filter's scores (alpha > 1) and with float64
    scores (alpha = 1, and any chunk where the filter is off): its two specializations
    (the attention kernels compute in float64 whatever the input dtype)."""
    import entmax_ref as er

    q, k, v = _qkv(4, 8)
    er.attention(q, k, v, alpha=1.5, backend="numba")
    er.attention(q, k, v, alpha=1.0, backend="numba")


def _attention_vjp(dt):
    """The backward on float32-filtered and on float64 scores, with a sparse support
    (the scatter) and a dense one (the expanded blocks)."""
    import entmax_ref as er
    from entmax_ref.backends.numba import attention as _att

    for q, k, v in (_qkv(4, 8), _qkv(2, 64, spread=20.0)):
        o, info = er.attention(q, k, v, alpha=1.5, backend="numpy", return_info=True)
        er.attention_vjp(np.ones_like(o), q, k, v, out=o, tau=info.tau, alpha=1.5, backend="numba")
    saved = _att.FILTER_FRACTION
    _att.FILTER_FRACTION = 0.0  # this worker process only: the float64-score backward
    try:
        er.attention_vjp(np.ones_like(o), q, k, v, out=o, tau=info.tau, alpha=1.5, backend="numba")
    finally:
        _att.FILTER_FRACTION = saved


def _decode(dt):
    """The decoding path (one query over a long key cache) in the input dtype."""
    import entmax_ref as er
    from entmax_ref.backends.numba import decode as _dec

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 4)).astype(dt) for n in (1, _dec.DECODE_MIN_KEYS, _dec.DECODE_MIN_KEYS))
    er.attention(q, k, v, alpha=1.5, backend="numba")


#: unit name -> (what it compiles, the call that compiles it for one dtype); attention
#: units are dtype-independent (one compile whatever the dtype list)
UNITS: dict[str, tuple[str, Callable[[str], None]]] = {
    "softmax": ("entmax forward, alpha = 1", _rows(1.0)),
    "sparsemax": ("entmax forward, alpha = 2", _rows(2.0)),
    "entmax15": ("entmax forward, alpha = 1.5", _rows(1.5)),
    "entmax": ("entmax forward, 1 < alpha < 2", _rows(1.25)),
    "entmax_big": ("entmax forward, alpha > 2", _rows(3.0)),
    "entmax_any": ("entmax forward, mixed alphas or method='newton'/'bisect'", _rows_mixed),
    "entmax_vjp": ("entmax VJP, alpha <= 2", _vjp(1.5)),
    "entmax_vjp_big": ("entmax VJP, alpha > 2", _vjp(3.0)),
    "entmax_alpha_vjp": ("entmax VJP with respect to alpha, alpha <= 2", _vjp(1.5, "entmax_alpha_vjp")),
    "entmax_alpha_vjp_big": ("entmax VJP with respect to alpha, alpha > 2", _vjp(3.0, "entmax_alpha_vjp")),
    "normmax": ("normmax forward", _normmax),
    "normmax_vjp": ("normmax VJP", _normmax_vjp),
    "budget": ("budget-sparsemax forward", _budget),
    "budget_vjp": ("budget-sparsemax VJP", _budget_vjp),
    "attention": ("attention forward (float32-filtered and float64 scores)", _attention),
    "attention_vjp": ("attention backward (float32-filtered and float64 scores)", _attention_vjp),
    "decode": ("attention forward, decoding (few queries over a long key cache)", _decode),
}
_DTYPE_FREE = {"attention", "attention_vjp"}

#: the units ``entmax-ref check`` runs (everything but the mixed-alpha solver, the alpha
#: VJPs and the decoding path, which check does not call)
CHECK_UNITS = tuple(u for u in UNITS if u not in ("entmax_any", "entmax_alpha_vjp", "entmax_alpha_vjp_big", "decode"))

#: rough relative compile cost of each unit (the largest are started first)
_COST = {"attention": 10, "attention_vjp": 8, "entmax_any": 6, "decode": 5, "entmax_big": 4, "entmax": 4, "budget": 4,
         "normmax": 3, "sparsemax": 3, "entmax15": 2}


def _tasks(units: Iterable[str], dtypes: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
    dtypes = tuple(dtypes)
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    out = []
    for u in units:
        if u not in UNITS:
            raise ValueError(f"ops: unknown unit {u!r}; choose from {', '.join(UNITS)}")
        out.append((u, ("float64",) if u in _DTYPE_FREE else dtypes))
    return sorted(out, key=lambda t: -_COST.get(t[0], 1) * len(t[1]))


def _marker(unit: str, dtype: str) -> Path:
    from .numba._cache import CACHE_DIR

    return CACHE_DIR / "compiled" / f"{unit}-{dtype}"


def _run_unit(unit: str, dtypes: tuple[str, ...]) -> None:
    """Compile ``unit`` for ``dtypes`` in this process and leave its markers."""
    for dt in dtypes:
        UNITS[unit][1](dt)
        m = _marker(unit, dt)
        m.parent.mkdir(parents=True, exist_ok=True)
        m.touch()


def _worker() -> None:  # pragma: no cover - runs in the worker processes
    """Worker loop: one ``unit dtype,dtype`` per line on stdin, one result line each."""
    for line in sys.stdin:
        unit, dts = line.split()
        t0 = time.perf_counter()
        try:
            _run_unit(unit, tuple(dts.split(",")))
            msg = f"ok {time.perf_counter() - t0:.3f}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            msg = "error " + repr(f"{type(exc).__name__}: {exc}") + " " + repr(traceback.format_exc(limit=3))
        print(msg.replace("\n", " "), flush=True)


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def pending(units: Iterable[str] | None = None, dtypes: Iterable[str] = DTYPES) -> list[tuple[str, tuple[str, ...]]]:
    """The (unit, dtypes) of ``units`` (default: all) not yet compiled into the current cache."""
    out = []
    for u, dts in _tasks(UNITS if units is None else units, dtypes):
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
        ``{"compiled": {unit: seconds}, "failed": {unit: message}, "skipped": [units],
        "seconds": wall time, "jobs": workers, "cache": folder}``; ``cache`` is None and
        nothing runs when the disk cache is off (``ENTMAX_REF_NUMBA_CACHE=0`` or an
        unwritable folder).

    Raises
    ------
    ValueError
        An unknown unit or dtype, or ``jobs < 1``.
    """
    from .numba._cache import CACHE, CACHE_DIR

    t0 = time.perf_counter()
    names = list(UNITS if units is None else units)
    todo_all = _tasks(names, dtypes)
    if jobs is None:
        jobs = _default_jobs()
    if int(jobs) < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    report: dict[str, object] = {"compiled": {}, "failed": {}, "skipped": [], "seconds": 0.0, "jobs": 0,
                                 "cache": str(CACHE_DIR) if CACHE else None}
    if not CACHE:
        report["skipped"] = names
        return report
    todo = todo_all if force else pending(names, dtypes)
    done = {u for u, _ in todo}
    report["skipped"] = [u for u, _ in todo_all if u not in done]
    if not todo:
        report["seconds"] = time.perf_counter() - t0
        return report
    jobs = min(int(jobs), len(todo))
    report["jobs"] = jobs
    work: queue.Queue = queue.Queue()
    for t in todo:
        work.put(t)
    lock = threading.Lock()
    import entmax_ref

    root = str(Path(entmax_ref.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["ENTMAX_REF_CACHE_DIR"] = str(CACHE_DIR.parent.parent)
    code = "from entmax_ref.backends.numba_precompile import _worker; _worker()"
    procs: list[subprocess.Popen] = []

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
            while True:
                try:
                    unit, dts = work.get_nowait()
                except queue.Empty:
                    return
                proc.stdin.write(f"{unit} {','.join(dts)}\n")
                proc.stdin.flush()
                line = proc.stdout.readline().strip()
                with lock:
                    if line.startswith("ok "):
                        report["compiled"][unit] = float(line.split()[1])
                        msg = f"compiled {unit} ({', '.join(dts)}) in {float(line.split()[1]):.1f}s"
                    else:
                        report["failed"][unit] = line[6:] if line else "the worker process ended"
                        msg = f"could not compile {unit}: {report['failed'][unit]}"
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
          f"{rep['jobs']} processes, {rep['seconds']:.1f}s; cache: {rep['cache']}")
    return 1 if rep["failed"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
