"""``entmax-ref compile``: the declared kernels into the disk cache, in parallel processes.

The work is exactly what the kernels declare (:data:`entmax_ref.backends.numba._jit.KERNELS`:
each entry kernel and the signatures it is compiled for): one *task* per kernel and
signature.  Numba compiles one function at a time per process (compilation holds the
GIL and numba's lock), so the tasks run in worker processes, one per CPU, which share the
disk cache: a task that finds a kernel or helper another process saved loads it instead
of compiling it.

The order also comes from the kernels: a kernel's *reach* is the set of the package's
compiled functions its code calls, directly or through its callees (read from the
functions' code, :func:`reach`).  A task waits for the tasks of the same input dtype (or
of any, for a signature that serves every dtype) whose kernel's reach is strictly inside
its own (their helpers are then in the cache when it starts: the attention forward of a
solver path waits for the row drivers whose solvers it links), and a kernel's later
signatures wait for its first; a free worker takes
the ready task with the most work behind it (its reach, plus the longest chain of tasks
that wait on it).  The lock of :mod:`entmax_ref.backends.numba._cache` serialises saves
into one index.

Whether a task is done has numba's answer (:meth:`~entmax_ref.backends.numba._jit.Kernel.
compiled`: in the cache, or not); there is no marker file.  ``entmax-ref check`` compiles
the kernels of the operations it runs with ``method=None`` (:func:`compile_kernels`'s
``ops``), a test session everything.  A command, never a library call: a call with
``backend="auto"`` answers on the reference while a kernel it needs is not compiled
(:mod:`entmax_ref.backends.auto`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Iterable

#: the input dtypes the kernels are compiled for
DTYPES = ("float64", "float32")


@dataclass(frozen=True)
class Task:
    """One signature of one entry kernel: the ``index``-th of the kernel named ``kernel``."""

    kernel: str
    index: int

    @property
    def entry(self):
        return next(k for k in kernels() if k.name == self.kernel)

    @property
    def dtype(self) -> str:
        return self.entry.signatures[self.index][0]

    @property
    def label(self) -> str:
        return f"{self.entry.name} ({self.dtype}, signature {self.index + 1} of {len(self.entry.signatures)})"

    def compile(self) -> None:
        self.entry.compile(self.entry.signatures[self.index][1])

    def compiled(self) -> bool:
        return self.entry.compiled(self.entry.signatures[self.index][1])


def kernels():
    """Every entry kernel (:data:`entmax_ref.backends.numba._jit.KERNELS`), after every
    kernel module is imported."""
    from . import numba as package
    from .numba import _jit

    if not _imported:
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)
        _imported.append(True)
    return _jit.KERNELS


_imported: list[bool] = []


def tasks(ops: Iterable[str] | None = None, dtypes: Iterable[str] = DTYPES,
          methods: Iterable[str | None] | None = None) -> list[Task]:
    """The tasks of the kernels run by ``ops`` (capability-table operation names; default
    all) with one of ``methods`` (default any), for the input ``dtypes``."""
    dtypes = tuple(dtypes)
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    every = kernels()
    known = sorted({op for k in every for op in k.ops})
    ops = None if ops is None else tuple(ops)
    for op in ops or ():
        if op not in known:
            raise ValueError(f"ops: unknown operation {op!r}; choose from {', '.join(known)}")
    methods = None if methods is None else tuple(methods)
    return [Task(k.name, j) for k in every
            if (ops is None or set(k.ops) & set(ops)) and (methods is None or set(k.methods) & set(methods))
            for j, (dt, _) in enumerate(k.signatures) if dt in dtypes or dt == "any"]


def reach(dispatcher, _seen=None) -> frozenset:
    """The package's compiled functions that ``dispatcher``'s code calls, directly or
    through them: the names its code reads (globals, and the free variables of a kernel
    made in a function) that are dispatchers of :mod:`entmax_ref.backends.numba._jit`."""
    from .numba._jit import Dispatcher

    seen = set() if _seen is None else _seen
    fn = dispatcher.py_func
    found = [fn.__globals__.get(n) for n in fn.__code__.co_names]
    found += [c.cell_contents for c in fn.__closure__ or () if c.cell_contents is not None]
    for d in found:
        if isinstance(d, Dispatcher) and d not in seen:
            seen.add(d)
            reach(d, seen)
    return frozenset(seen)


class _Schedule:
    """The order in which the workers take the tasks (see the module docstring): a task is
    *ready* when none of the tasks it waits for is still to run or running.  A free worker
    takes the ready task that would compile the fewest functions another worker is
    compiling right now (each process compiles what it needs itself, so two processes on
    one helper do its work twice), then the one with the most work behind it."""

    def __init__(self, todo: Iterable[Task]):
        self.tasks = list(todo)
        reaches = {t: reach(t.entry.dispatcher) for t in self.tasks}
        # what each task compiles: its kernel and helpers, in its input's precision (a
        # helper compiled for float32 rows is another function than for float64 ones; the
        # signatures that serve any input read float64 candidates)
        self.makes = {t: {(d, "float32" if t.dtype == "float32" else "float64")
                          for d in reaches[t] | {t.entry.dispatcher}} for t in self.tasks}
        self.made: set = set()
        first = {}
        for t in self.tasks:
            first.setdefault(t.kernel, t)
        self.waits = {t: {u for u in self.tasks if u is not t and (
            (u.dtype in (t.dtype, "any") or t.dtype == "any") and reaches[u] < reaches[t]
            or (u.kernel == t.kernel and first[t.kernel] is u))}
                      for t in self.tasks}
        after: dict[Task, list[Task]] = {t: [] for t in self.tasks}
        for t, ws in self.waits.items():
            for u in ws:
                after[u].append(t)
        self.rank: dict[Task, float] = {}

        def rank(t: Task) -> float:
            if t not in self.rank:
                self.rank[t] = len(reaches[t]) + 1 + max((rank(a) for a in after[t]), default=0.0)
            return self.rank[t]

        for t in self.tasks:
            rank(t)
        self.todo = list(self.tasks)
        self.running: set[Task] = set()
        self.cond = threading.Condition()

    def ready(self) -> list[Task]:
        """The tasks that could start now, best first."""
        busy = set(self.todo) | self.running
        making = set().union(*(self.makes[u] for u in self.running)) - self.made
        return sorted((t for t in self.todo if not self.waits[t] & busy),
                      key=lambda t: (len(self.makes[t] & making), -self.rank[t]))

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
            self.made |= self.makes[task]
            self.cond.notify_all()


def _worker() -> None:  # pragma: no cover - runs in the worker processes
    """Worker loop: one ``kernel index`` per line on stdin, one result line each
    (``ok <wall seconds> <CPU seconds>`` or ``error ...``)."""
    for line in sys.stdin:
        kernel, index = line.split()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            Task(kernel, int(index)).compile()
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


def pending(todo: Iterable[Task] | None = None) -> list[Task]:
    """The tasks of ``todo`` (default: every task) not compiled yet: in neither this process
    nor the disk cache (those in the cache are loaded into this process)."""
    return [t for t in (tasks() if todo is None else todo) if not t.compiled()]


class Progress:
    """Progress on stderr: a one-line bar (units done/total, elapsed) when stderr is a
    terminal, else one plain line per unit (a log or a piped run still shows where the run
    is)."""

    def __init__(self, total: int, enabled: bool = True, bar: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.perf_counter()
        self.bar = self.stream.isatty() if bar is None else bar
        self.lock = threading.Lock()  # the compile's feeding threads and the caller step it

    def grow(self, units: int) -> None:
        """``units`` more units to do (the kernels found not compiled yet)."""
        with self.lock:
            self.total += units

    def step(self, label: str) -> None:
        """One unit ``label`` done."""
        if not self.enabled:
            return
        with self.lock:
            self.done += 1
            elapsed = time.perf_counter() - self.t0
            if not self.bar:
                self.stream.write(f"[{self.done}/{self.total} {elapsed:6.1f}s] {label}\n")
            else:
                width = 30
                fill = int(width * self.done / max(self.total, 1))
                self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                                  f"{elapsed:5.1f}s  {label[:48]:<48}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.bar:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def compile_kernels(ops: Iterable[str] | None = None, dtypes: Iterable[str] = DTYPES, jobs: int | None = None,
                    methods: Iterable[str | None] | None = None, progress: Progress | None = None) -> dict[str, object]:
    """Compile the declared kernels of ``ops`` (default: all) for ``dtypes`` into the disk
    cache, in ``jobs`` worker processes (default: one per CPU); ``methods`` limits them to
    the kernels those ``method=`` values run; ``progress`` (a :class:`Progress`) grows by
    the tasks to compile and steps at each finished one.

    Returns ``{"compiled": {task label: seconds}, "cpu": CPU seconds of the workers'
    compiles, "failed": {task label: message}, "skipped": [task labels already cached],
    "total": tasks asked for, "seconds": wall time, "jobs": workers, "cache": folder}``;
    ``cache`` is None and nothing runs when the disk cache is off
    (``ENTMAX_REF_NUMBA_CACHE=0`` or an unwritable folder).  ValueError for an unknown
    operation or dtype, or ``jobs < 1``.
    """
    from .numba._cache import CACHE, CACHE_DIR, child_env, package_root

    t0 = time.perf_counter()
    asked = tasks(ops, dtypes, methods)
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    report: dict = {"compiled": {}, "cpu": 0.0, "failed": {}, "skipped": [], "total": len(asked), "seconds": 0.0,
                    "jobs": 0, "cache": str(CACHE_DIR) if CACHE else None}
    if not CACHE:
        report["skipped"] = [t.label for t in asked]
        return report
    todo = pending(asked)
    report["skipped"] = [t.label for t in asked if t not in todo]
    if todo:
        sched = _Schedule(todo)
        report["jobs"] = min(jobs, len(todo))
        if progress is not None:
            progress.grow(len(todo))
        _run_workers(sched, report["jobs"], child_env(), package_root(), report, progress)
    report["seconds"] = time.perf_counter() - t0
    return report


def _run_workers(sched: _Schedule, jobs: int, env: dict, cwd: str, report: dict, progress) -> None:
    """Feed the schedule's tasks to ``jobs`` worker processes started in ``cwd`` with
    ``env``; record each outcome in ``report`` and pass its line to ``progress``."""
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []

    def feed() -> None:
        try:
            proc = subprocess.Popen([sys.executable, "-c", _WORKER_CODE], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd, text=True,
                                    bufsize=1)
        except OSError as exc:  # no worker: the kernels compile on first use instead
            with lock:
                report["failed"].setdefault("worker", f"{type(exc).__name__}: {exc}")
            return
        with lock:
            procs.append(proc)
        try:
            while (task := sched.take()) is not None:
                line = ""
                try:
                    proc.stdin.write(f"{task.kernel} {task.index}\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline().strip()
                finally:
                    with lock:
                        if line.startswith("ok "):
                            wall, cpu = (float(f) for f in line.split()[1:3])
                            report["compiled"][task.label] = wall
                            report["cpu"] += cpu
                            msg = f"compiled {task.label} in {wall:.1f}s"
                        else:
                            report["failed"][task.label] = line[6:] if line else "the worker process ended"
                            msg = f"could not compile {task.label}: {report['failed'][task.label]}"
                    sched.done(task)  # whatever happened: the tasks that wait on it may go
                if progress is not None:
                    progress.step(msg)
                if not line:
                    return
        except OSError as exc:  # a worker that died: its task is reported, the rest go on
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


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref compile``: compile the declared numba kernels into the disk cache."""
    ap = argparse.ArgumentParser(
        prog="entmax-ref compile",
        description="Compile the numba kernels into the disk cache ahead of time, in parallel worker processes, "
                    "so that first calls (and entmax-ref check) load them instead of compiling.")
    ap.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: one per CPU)")
    ap.add_argument("--ops", default=None, metavar="OP,...",
                    help="comma-separated operations, e.g. entmax_forward,attention_forward (default: all)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated input dtypes (default: float64,float32)")
    ap.add_argument("--list", action="store_true", help="list the declared kernels and whether each is compiled")
    ap.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if importlib.util.find_spec("numba") is None:
        print("entmax-ref compile: numba is not installed (pip install numba)", file=sys.stderr)
        return 2
    ops = None if args.ops is None else [o for o in args.ops.split(",") if o]
    dtypes = [d for d in args.dtypes.split(",") if d]
    try:
        asked = tasks(ops, dtypes)
        if args.list:
            for t in asked:
                print(f"{'compiled' if t.compiled() else 'pending ':8} {t.label}")
            return 0
        bar = Progress(0, enabled=not args.no_progress)
        rep = compile_kernels(ops, dtypes, args.jobs, progress=bar)
        bar.close()
    except ValueError as exc:
        print(f"entmax-ref compile: {exc}", file=sys.stderr)
        return 2
    if rep["cache"] is None:
        print("entmax-ref compile: the kernel cache is off (ENTMAX_REF_NUMBA_CACHE=0, an unwritable folder or an "
              "untested numba); nothing to do", file=sys.stderr)
        return 1
    print(f"{len(rep['compiled'])} compiled, {len(rep['skipped'])} already cached, {len(rep['failed'])} failed "
          f"of {rep['total']} kernel signatures; {rep['jobs']} processes, {rep['seconds']:.1f}s "
          f"({rep['cpu']:.1f} CPU s compiling); cache: {rep['cache']}")
    for label, why in rep["failed"].items():
        print(f"  failed: {label}: {why}", file=sys.stderr)
    return 1 if rep["failed"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
