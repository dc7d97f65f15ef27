"""Concurrent calls from several Python threads: never an abort, the same answers, and no
process-wide setting changed (numba backend).

Each check runs in a fresh interpreter (``subprocess``): numba's threading layer is chosen
once per process, at the first parallel launch, and the BLAS thread count is process-wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")
pytest.importorskip("threadpoolctl")

ROOT = Path(__file__).resolve().parents[1]

_CONCURRENT = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    import entmax_ref as er

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 200))
    q, k, v = (rng.standard_normal((1, 2, 48, 8)) for _ in range(3))
    do = rng.standard_normal((1, 2, 48, 8))

    def job():
        out = []
        for alpha in (1.5, 1.3, 3.0):
            p = er.entmax(x, alpha=alpha, backend="numba")
            out += [p, er.entmax_vjp(p, x, alpha=alpha, backend="numba"),
                    er.entmax_alpha_vjp(p, x, alpha=alpha, backend="numba")]
        for alpha in (1.0, 1.5, 10.0):
            o, info = er.attention(q, k, v, alpha=alpha, causal=True, return_info=True, backend="numba")
            out += [o, *er.attention_vjp(do, q, k, v, alpha=alpha, causal=True, info=info, backend="numba")]
        return out

    want = job()  # single-threaded first (also compiles)
    import numba
    layer = numba.threading_layer()
    got, errors = {}, []

    def run(i):
        try:
            for _ in range(3):
                got[i] = job()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for res in got.values():
        for a, b in zip(res, want):
            assert np.array_equal(a, b)
    print("OK", layer, len(got))
    """
)


def _run(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_eight_threads_never_abort(layer):
    """8 threads call the row transforms, their VJPs and the attention at once; with the
    workqueue layer (not thread-safe) the parallel launches must be serialised, not abort."""
    env = {} if layer == "default" else {"NUMBA_THREADING_LAYER": layer}
    res = _run(_CONCURRENT, env)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert "OK" in res.stdout and " 8" in res.stdout
    if layer != "default":
        assert f"OK {layer}" in res.stdout


_BLAS = textwrap.dedent(
    """
    import threading, time
    import numpy as np
    import threadpoolctl
    import entmax_ref as er

    def blas_threads():
        return {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    import scipy.linalg.cython_blas  # noqa: F401 - load every BLAS the library will load
    threadpoolctl.threadpool_limits(limits=2, user_api="blas")  # the caller's choice (>= 2 to be testable)
    before = blas_threads()
    assert len(before) >= 1 and all(n == 2 for n in before.values()), before
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 1024, 32)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((1, 4, 1024, 32)).astype(np.float32)
    seen, done = [], threading.Event()

    def watch():  # another thread's view of the BLAS settings while the calls run
        while not done.is_set():
            seen.append(blas_threads())
            time.sleep(0.005)

    def call():
        for alpha in (1.5, 1.01):  # the float32 filter, and the float64 product
            o, info = er.attention(q, k, v, alpha=alpha, causal=True, return_info=True, backend="numba")
            er.attention_vjp(do, q, k, v, alpha=alpha, causal=True, info=info, backend="numba")

    call()  # compiles
    watcher = threading.Thread(target=watch)
    watcher.start()
    call()
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert len(seen) >= 10, len(seen)
    changed = [s for s in seen if s != before]
    assert not changed, (before, changed[:3])
    after = blas_threads()
    assert after == before, (before, after)
    print("OK", len(seen), before)
    """
)

_PRODUCTS = textwrap.dedent(
    """
    import time
    import numpy as np
    import threadpoolctl
    from entmax_ref.backends.numba.products import matmul_into

    threadpoolctl.threadpool_limits(limits=2, user_api="blas")
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        q = rng.standard_normal((256, 64)).astype(dt)
        kt = rng.standard_normal((64, 4096)).astype(dt)
        out = np.empty((256, 4096), dt)
        matmul_into(q, kt, out, 0.0)  # compiles
        assert np.allclose(out, q.astype(np.float64) @ kt, rtol=1e-4, atol=1e-3)
        wall, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - wall < 1.0:
            matmul_into(q, kt, out, 0.0)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        # one thread cannot use more CPU time than wall time; a BLAS pool would
        assert cpu < 1.15 * wall, (dt, cpu, wall)
    print("OK")
    """
)


def test_blas_settings_unchanged_during_and_after_attention():
    """Seen from another thread, the process's BLAS thread counts (threadpoolctl) stay what
    the caller set, during attention calls (one, then three at once) and after them."""
    res = _run(_BLAS, {})
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert "OK" in res.stdout


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs: a BLAS pool is then 2 threads")
def test_products_run_on_the_calling_thread():
    """The attention's products (``products.matmul_into``) wake no BLAS thread: with BLAS
    allowed 2 threads, a second of products takes no more CPU time than wall time."""
    res = _run(_PRODUCTS, {})
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert "OK" in res.stdout
