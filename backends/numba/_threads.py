"""Python worker threads for the row drivers of the numba backend.

The row kernels are sequential ``@njit(nogil=True)`` functions over a range of rows; a
call splits its rows into blocks and ``numba.get_num_threads()`` Python threads take the
blocks from a shared counter, each running the kernel with the GIL released.  Compared
with an ``@njit(parallel=True)`` ``prange`` driver this compiles several times faster (no
parallel-accelerator passes, no gufunc outlining), launches no parallel region on Numba's
threading layer (so the ``workqueue`` layer's abort on concurrent parallel launches cannot
arise, and no lock is needed), and keeps the results deterministic: every row is solved by the
same code whatever block or thread it lands on.  The threads live for one call only.
"""

from __future__ import annotations

import threading

import numba

#: below this many entries a call runs on the calling thread alone (starting threads
#: costs more than it saves)
SEQUENTIAL_MAX = 1 << 15


def run_blocks(kernel, args, shape, nblk):
    """``kernel(*args, r0, r1)`` over the rows ``0 .. shape[0] - 1`` in ``nblk`` blocks on
    up to ``numba.get_num_threads()`` threads; re-raises the first exception."""
    rows = shape[0]
    if rows == 0:
        return
    workers = min(numba.get_num_threads(), rows)
    if workers <= 1 or rows * shape[1] <= SEQUENTIAL_MAX:
        kernel(*args, 0, rows)
        return
    nblk = max(workers, min(rows, nblk))
    bounds = [(b * rows) // nblk for b in range(nblk + 1)]
    lock = threading.Lock()
    nxt = [0]
    failed: list[BaseException] = []

    def loop():
        while not failed:
            with lock:
                b = nxt[0]
                nxt[0] = b + 1
            if b >= nblk:
                return
            try:
                kernel(*args, bounds[b], bounds[b + 1])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                failed.append(exc)
                return

    # every worker a new thread, the calling thread waiting.  With the calling thread as one
    # of the workers, a call made after an idle spell (the bench's 50 ms pause) ran both
    # workers on one core of the 2-core VM for most of the call: 512 x 8192 float32
    # softmax 12.6-13.0 ms against 7.5-7.8 with this, 1.5-entmax 7.4 against 4.7 (back to
    # back, no pause, the two are the same)
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
