"""Python worker threads for the drivers of the numba backend.

The row kernels are sequential ``nogil`` compiled functions over a range of rows; a
call splits its rows into blocks and ``numba.get_num_threads()`` worker threads take the
blocks from a shared counter, each running the kernel with the GIL released (the attention
drivers run their chunks the same way, :func:`run_on_workers`).  Unlike a
``parallel=True`` ``prange`` driver, this needs no parallel-accelerator passes or gufunc
outlining at compile time, launches no parallel region on Numba's threading layer (so the
``workqueue`` layer's abort on concurrent parallel launches cannot arise), and keeps the
results deterministic: every row is solved by the same code whatever block or thread it
lands on.

The worker threads outlive a call: they wait for the next one on a queue of their own
(waking a waiting thread costs less than starting one).  One call uses the pool at a
time; a call made meanwhile (from another thread of the caller, or from inside a worker)
runs on threads started for it.  A forked child starts a pool of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading

import numba

#: below this many entries a call runs on the calling thread alone (starting threads
#: costs more than it saves)
SEQUENTIAL_MAX = 1 << 15


def _serve(inbox):
    """A pool thread: run each ``fn(slot)`` that arrives, and report its exception (or None)."""
    while True:
        fn, slot, done = inbox.get()
        done.put(_outcome(fn, slot))


def _outcome(fn, slot):
    try:
        fn(slot)
    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
        return exc
    return None


class _Pool:
    """Worker threads, each waiting on its own inbox; ``busy`` is held by the call using them."""

    def __init__(self):
        self.inboxes: list[queue.SimpleQueue] = []
        self.busy = threading.Lock()

    def run(self, fn, workers):
        while len(self.inboxes) < workers:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(inbox,), daemon=True,
                             name=f"entmax-ref-worker-{len(self.inboxes)}").start()
            self.inboxes.append(inbox)
        done: queue.SimpleQueue = queue.SimpleQueue()
        for slot in range(workers):
            self.inboxes[slot].put((fn, slot, done))
        return [done.get() for _ in range(workers)]


_POOL = _Pool()


def _new_pool_in_child():
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_pool_in_child)


def run_on_workers(fn, workers):
    """``fn(slot)`` for ``slot = 0 .. workers - 1``, each on a worker thread of its own, the
    calling thread waiting; re-raises the first exception.  The calling thread is never a
    worker: after an idle spell the scheduler may keep a woken worker on the caller's core,
    and a caller that works too then shares that core with it.  Each worker runs ``fn`` in a
    copy of the caller's context (its context variables: :func:`._jit.compiled_only`)."""
    contexts = [contextvars.copy_context() for _ in range(workers)]
    fn = (lambda f: lambda slot: contexts[slot].run(f, slot))(fn)
    pool = _POOL
    if pool.busy.acquire(blocking=False):
        try:
            errors = pool.run(fn, workers)
        finally:
            pool.busy.release()
    else:
        errors = [None] * workers

        def one(slot):
            errors[slot] = _outcome(fn, slot)

        threads = [threading.Thread(target=one, args=(slot,), daemon=True) for slot in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for exc in errors:
        if exc is not None:
            raise exc


def run_items(work, workers, items=None, plans=None):
    """``work(slot, item)`` on ``workers`` worker threads (:func:`run_on_workers`): every
    item of ``items``, taken in order from one shared queue by whichever worker is free,
    or, given ``plans`` (one list per slot), each slot's own items in order.  After an
    exception no worker takes another item, and the first exception is re-raised.  Items
    are never None."""
    if plans is not None:
        queues = [iter(p) for p in plans]
        lock = contextlib.nullcontext()
    else:
        queues = [iter(items)] * workers
        lock = threading.Lock()
    failed = []

    def loop(slot):
        while not failed:
            with lock:
                item = next(queues[slot], None)
            if item is None:
                return
            try:
                work(slot, item)
            except BaseException:
                failed.append(True)  # the others stop taking items
                raise

    run_on_workers(loop, workers)


def run_blocks(kernel, args, shape, nblk):
    """``kernel(*args, r0, r1)`` over the rows ``0 .. shape[0] - 1`` in ``nblk`` blocks on
    up to ``numba.get_num_threads()`` worker threads; re-raises the first exception."""
    rows = shape[0]
    if rows == 0:
        return
    workers = min(numba.get_num_threads(), rows)
    if workers <= 1 or rows * shape[1] <= SEQUENTIAL_MAX:
        kernel(*args, 0, rows)
        return
    nblk = max(workers, min(rows, nblk))
    bounds = [(b * rows) // nblk for b in range(nblk + 1)]
    run_items(lambda slot, b: kernel(*args, bounds[b], bounds[b + 1]), workers, items=range(nblk))
