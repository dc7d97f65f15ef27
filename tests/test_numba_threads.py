"""The numba row engine's drivers: one compiled path per call, Python worker threads.

Compile cost: the row operations used ``prange`` drivers whose bodies held
every solver path, so any first call compiled all of them through Numba's parallel
pipeline.  Now a call compiles the driver of the one path it takes, and the drivers are
sequential ``nogil`` kernels run on worker threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import entmax_ref as er  # noqa: E402
from entmax_ref.backends.numba import paths as engine  # noqa: E402
from entmax_ref.backends.numba import _threads, budget, grads, rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _dispatchers(mod):
    return {n: f for n, f in vars(mod).items() if isinstance(f, numba.core.registry.CPUDispatcher)}


@pytest.mark.parametrize("mod", [rows, grads, budget], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_row_kernel_is_a_parallel_kernel(mod):
    kernels = _dispatchers(mod)
    assert kernels
    assert [n for n, f in kernels.items() if f.targetoptions.get("parallel")] == []


_ONE_CALL = """
    import json, numpy as np, entmax_ref as er
    from entmax_ref.backends.numba import big_alpha, candidates, grads, rows, softmax, threshold
    x = np.random.default_rng(0).standard_normal((300, 200))
    p = er.entmax15(x, backend="numba")
    er.entmax_vjp(p, x, 1.5, backend="numba")
    mods = (rows, softmax, candidates, threshold, big_alpha, grads)
    print(json.dumps({n: len(f.signatures) for m in mods for n, f in vars(m).items()
                      if hasattr(f, "signatures")}))
"""


def test_a_call_compiles_only_the_path_it_takes():
    env = {**os.environ}
    env.pop("NUMBA_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(_ONE_CALL)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    sig = json.loads(res.stdout.strip().splitlines()[-1])
    # the drivers only: from a warm cache their callees load inside them, uncompiled
    assert sig["_rows_15"] == 1 and sig["_vjp_cr"] == 1
    other = ["_rows_softmax", "_rows_sparse", "_rows_gen", "_rows_big", "_rows_any",
             "solve_gen", "solve_big", "solve_big_bisect", "_solve_bisect", "condat", "_pivot_big", "bisect_row",
             "_vjp_small"]
    assert {n: sig[n] for n in other} == dict.fromkeys(other, 0)


_ATTENTION_CALL = """
    import json, numpy as np, entmax_ref as er
    from entmax_ref.backends.numba import big_alpha, rows, threshold
    q = np.random.default_rng(0).standard_normal((1, 2, 64, 16))
    o, info = er.attention(q, q, q, alpha=1.5, return_info=True, backend="numba")
    er.attention_vjp(np.ones_like(o), q, q, q, out=o, info=info, alpha=1.5, backend="numba")
    mods = (rows, threshold, big_alpha)
    print(json.dumps({n: len(f.signatures) for m in mods for n, f in vars(m).items()
                      if hasattr(f, "signatures")}))
"""


@pytest.mark.slow
def test_attention_compiles_only_the_default_solvers(tmp_path):
    """The attention kernels solve rows with ``method=None`` only: with a cold cache (a warm
    one loads the kernels without compiling their callees), the bisection and
    Newton-from-zero solvers stay uncompiled."""
    env = {**os.environ, "ENTMAX_REF_CACHE_DIR": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(_ATTENTION_CALL)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    sig = json.loads(res.stdout.strip().splitlines()[-1])
    unused = ["_solve_bisect", "_solve_newton", "solve_big_bisect", "bisect_row", "_bisect_big"]
    assert {n: sig[n] for n in unused} == dict.fromkeys(unused, 0)
    assert sig["solve_15"] == 1


def _solve(x, alpha, nblk):
    n = x.shape[0]
    # p zeroed: float64 softmax rows leave it to the finishing stage (rows._rows_softmax64)
    res = [np.zeros_like(x)] + [np.empty(n, t) for t in (np.float64, np.int64, np.int64, np.bool_)]
    rows.entmax_rows(x, alpha, rows.METHOD_DEFAULT, rows.Solved(*res), nblk)
    return res


def test_float32_rows_take_the_row_drivers_with_the_default_method_up_to_alpha_2():
    """float32 rows above alpha = 2, or with another method, are solved as float64 rows by
    the NumPy-level driver (for those rows alone); the row drivers refuse them."""
    x = np.random.default_rng(3).standard_normal((4, 300)).astype(np.float32)
    for alpha, method in ((np.array([1.5, 3.0, 2.0, 1.5]), rows.METHOD_DEFAULT), (np.full(4, 1.5), rows.METHOD_BISECT)):
        with pytest.raises(ValueError, match="method=None and alpha <= 2"):
            res = [np.empty_like(x)] + [np.empty(4, t) for t in (np.float64, np.int64, np.int64, np.bool_)]
            rows.entmax_rows(x, alpha, method, rows.Solved(*res), 4)


def test_rows_do_not_depend_on_threads_or_blocks():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((257, 300)) * 3  # above SEQUENTIAL_MAX entries: threaded
    assert x.size > _threads.SEQUENTIAL_MAX
    alpha = np.full(x.shape[0], 1.5)
    want = _solve(x, alpha, 16)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        got = [_solve(x, alpha, 16)]
    finally:
        numba.set_num_threads(before)
    got += [_solve(x, alpha, nblk) for nblk in (1, 7, 1000)]
    for res in got:
        for a, b in zip(want, res):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_of_several_alphas_take_each_paths_driver(monkeypatch, dtype):
    """Rows of several alphas run as runs of rows on one solver path, each through that
    path's driver over its own rows (none through ``_rows_any``): every row gets the bits
    of the call with its alpha alone, whatever the blocks and threads."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((257, 300)) * 3).astype(dtype)
    # float32 rows above alpha = 2 are the NumPy-level driver's (numba_backend._rows32)
    big = 3.0 if dtype == np.float64 else 1.75
    alpha = np.repeat([1.5, 1.25, 1.0, big, 1.5, 2.0, 1.7], [40, 50, 7, 60, 50, 49, 1])
    want = [np.empty_like(a) for a in _solve(x, alpha[:1].repeat(257), 16)]
    for a in np.unique(alpha):
        for w, got in zip(want, _solve(x, np.full(257, a), 16)):
            w[alpha == a] = got[alpha == a]
    seen = []

    def spy(name, driver):
        def run(*args):
            seen.append((name, args[-2], args[-1]))
            return driver(*args)
        return run

    spies = {}
    for p, driver in rows._PATH_DRIVERS.items():
        spies[driver] = spy(p, driver)
        monkeypatch.setitem(rows._PATH_DRIVERS, p, spies[driver])
    paths = {d: p for p, d in rows._PATH_DRIVERS.items()}
    # float32: the drivers with the rounding test
    monkeypatch.setattr(rows, "_ROUNDED32", {spies[d]: spy(paths[spies[d]], r) for d, r in rows._ROUNDED32.items()})
    monkeypatch.setattr(rows, "_rows_big", spies[rows._rows_big])
    monkeypatch.setattr(rows, "_rows_softmax64", spy(rows.PATH_SOFTMAX, rows._rows_softmax64))
    monkeypatch.setattr(rows, "_rows_any", None)  # never called
    path = np.array([engine.solver_path(a) for a in alpha])
    for nblk, threads in ((16, 2), (1, 2), (7, 1), (1000, 2)):
        before = numba.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        try:
            seen.clear()
            got = _solve(x, alpha, nblk)
        finally:
            numba.set_num_threads(before)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
        # each row once, by its own path's driver
        assert all((path[r0:r1] == p).all() for p, r0, r1 in seen), seen
        rows_seen = np.concatenate([np.arange(r0, r1) for _, r0, r1 in seen])
        assert np.array_equal(np.sort(rows_seen), np.arange(257))


def test_worker_exceptions_reach_the_caller():
    def kernel(marks, r0, r1):
        marks[r0:r1] += 1
        if r0 <= 100 < r1:
            raise RuntimeError("row 100")

    marks = np.zeros(1000)
    with pytest.raises(RuntimeError, match="row 100"):
        _threads.run_blocks(kernel, (marks,), (1000, 1000), 16)
    marks = np.zeros(1000)
    _threads.run_blocks(lambda m, r0, r1: m.__setitem__(slice(r0, r1), m[r0:r1] + 1), (marks,), (1000, 1000), 16)
    assert (marks == 1).all()


def test_workers_wait_between_calls_and_a_busy_pool_is_not_waited_for():
    """The worker threads outlive a call (two calls run on the same threads); a call made
    while another uses them (here from inside a worker, which would deadlock on the pool)
    runs on threads started for it; an exception leaves the workers serving."""
    import threading

    idents = []

    def record(slot):
        idents.append((slot, threading.get_ident()))

    _threads.run_on_workers(record, 2)
    first = set(idents)
    idents.clear()
    _threads.run_on_workers(record, 2)
    assert set(idents) == first and len({i for _, i in first}) == 2

    inner = []

    def nested(slot):
        _threads.run_on_workers(lambda s: inner.append((slot, s, threading.get_ident())), 2)

    _threads.run_on_workers(nested, 2)
    assert sorted((a, b) for a, b, _ in inner) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert not {i for _, _, i in inner} & {i for _, i in first}  # threads of their own

    def fail(slot):
        if slot == 1:
            raise KeyError("slot 1")

    with pytest.raises(KeyError, match="slot 1"):
        _threads.run_on_workers(fail, 2)
    idents.clear()
    _threads.run_on_workers(record, 2)
    assert set(idents) == first


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_has_workers_of_its_own():
    """After a fork the parent's worker threads do not exist in the child: its calls start a
    pool of their own and give the parent's answers.  In a fresh interpreter (a test process
    may hold libraries, JAX among them, that warn on fork)."""
    script = textwrap.dedent("""
        import os
        import numpy as np
        from entmax_ref.backends.numba import _threads, rows

        def solve(x, alpha):
            n = x.shape[0]
            res = [np.empty_like(x)] + [np.empty(n, t) for t in (np.float64, np.int64, np.int64, np.bool_)]
            rows.entmax_rows(x, alpha, rows.METHOD_DEFAULT, rows.Solved(*res), 16)
            return res[0]

        x = np.random.default_rng(9).standard_normal((257, 300))
        alpha = np.full(x.shape[0], 1.5)
        want = solve(x, alpha)  # the parent's pool is up
        assert len(_threads._POOL.inboxes) >= 1
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ok = len(_threads._POOL.inboxes) == 0 and np.array_equal(solve(x, alpha), want)
            # no process started, and no thread beyond the pool its call used
            ok = ok and not any(f.read_text().split() for f in __import__("pathlib").Path("/proc/self/task").glob("*/children"))
            ok = ok and __import__("threading").active_count() == 1 + len(_threads._POOL.inboxes)
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 1) == b"1", "the child's answer or pool"
        print("ok")
    """)
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_idle_workers_take_no_cpu():
    """Between calls the pool's threads block on their inboxes: no spinning, so not one
    clock tick of CPU while idle."""
    import threading
    import time

    _threads.run_on_workers(lambda slot: None, 2)
    tids = [t.native_id for t in threading.enumerate() if t.name.startswith("entmax-ref-worker-")]
    assert len(tids) >= 2

    def ticks():
        total = 0
        for tid in tids:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        return total

    before = ticks()
    time.sleep(1.0)
    assert ticks() == before
