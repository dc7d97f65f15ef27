"""Compile cost of the numba backend: one specialization per kernel and input
dtype whatever the flags of the caller's arrays, and the ahead-of-time ``entmax-ref
compile`` (worker processes filling the disk cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

from entmax_ref.backends import numba_precompile as pc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=e, capture_output=True,
                          text=True, timeout=timeout)


SIGNATURES = """
import importlib, json, pkgutil
import numpy as np
import entmax_ref as er
import entmax_ref.backends.numba as kernels

def ro(a):
    a = np.array(a)
    a.flags.writeable = False
    return a

rng = np.random.default_rng(0)
for dt in (np.float64, np.float32):
    x = rng.standard_normal((6, 9)).astype(dt)
    er.entmax(x, 1.5, backend="numba")
    er.entmax(ro(x), 1.5, backend="numba")                      # read-only input
    er.entmax(np.asfortranarray(x), 1.5, backend="numba")        # another layout
    er.entmax(x, ro(np.full(6, 1.5)), backend="numba")           # read-only per-row alpha
    p = er.entmax(x, 1.5, backend="numpy")
    g = rng.standard_normal(x.shape).astype(dt)
    er.entmax_vjp(p, g, 1.5, backend="numba")
    er.entmax_vjp(ro(p), ro(g), ro(np.full(6, 1.5)), backend="numba")
x = rng.standard_normal((6, 9))
er.budget_sparsemax(x, ro(np.full(6, 2.0)), backend="numba")
er.budget_sparsemax(ro(x), 2.0, backend="numba")
# (p, g) of two dtypes: computed as the wider one
p32 = er.entmax(x.astype(np.float32), 1.5, backend="numpy")
er.entmax_vjp(p32, rng.standard_normal(p32.shape), 1.5, backend="numba")
q = rng.standard_normal((1, 2, 8, 4))
for qkv in ((q, q, q), (ro(q), ro(q), ro(q))):
    o, info = er.attention(*qkv, alpha=1.5, backend="numba", return_info=True)
    er.attention_vjp(np.ones_like(o), *qkv, out=o, tau=info.tau, alpha=1.5, backend="numba")
    er.attention(*qkv, alpha=ro(np.array([1.5, 1.25])), beta=0.5, gamma=1.0, backend="numba")
qd, kd = rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 2, 2048, 4))  # the decoding path
for qkv in ((qd, kd, kd), (ro(qd), ro(kd), ro(kd))):
    er.attention(*qkv, alpha=1.5, backend="numba")
out = {}
for info in pkgutil.iter_modules(kernels.__path__, kernels.__name__ + "."):
    mod = importlib.import_module(info.name)
    for name in dir(mod):
        found = getattr(mod, name)
        # the kernels the Python drivers call (nogil drivers, alone or one per solver path
        # in a tuple), not their inner helpers
        for i, d in enumerate(found if isinstance(found, tuple) else (found,)):
            if hasattr(d, "signatures") and d.targetoptions.get("nogil") and d.py_func.__module__ == mod.__name__:
                key = mod.__name__.rsplit(".", 1)[1] + "." + name + (f"[{i}]" if isinstance(found, tuple) else "")
                out[key] = [[[str(t.dtype), t.layout, t.mutable] if hasattr(t, "layout") else str(t) for t in sig]
                            for sig in d.signatures]
print(json.dumps(out))
"""


def test_each_kernel_compiles_once_per_input_dtype_whatever_the_array_flags():
    """Read-only inputs and alphas, another memory layout, mixed (p, g) dtypes: every kernel
    that ran has one signature per dtype of its first argument (numba compiles a new
    specialization for each distinct argument type, and read-only is part of the type;
    before the arguments were normalised each row kernel compiled twice per dtype)."""
    r = _run(SIGNATURES)
    assert r.returncode == 0, r.stderr[-3000:]
    sigs = json.loads(r.stdout.strip().splitlines()[-1])
    ran = {k: v for k, v in sigs.items() if v}
    def find(name):  # "module.function", whichever kernel module defines it
        hits = [k for k in ran if k.endswith("." + name) or k == name]
        assert len(hits) == 1, f"{name}: {hits} in {sorted(ran)}"
        return ran[hits[0]]

    for kernel in ("_rows_15", "_vjp_small", "budget._forward_blk", "FWD_ROWS[2]", "FWD_ROWS[3]", "bwd_rows",
                   "scan_block", "matmul_into"):
        find(kernel)
    # a call compiles the row kernels of its heads' solver paths only: 1.5 (path 2), and the
    # kv-heads of alpha 1.5 and of 1.25 (path 3; one query head each); the decoding path
    # runs the same kernels
    assert {k.rsplit(".", 1)[1] for k in ran if "_ROWS[" in k} == {"FWD_ROWS[2]", "FWD_ROWS[3]"}
    # the products take views (slices, transposes) of one dtype: one specialization per
    # kind of operand, whatever the caller's arrays
    assert len(find("matmul_into")) <= 6, find("matmul_into")
    for kernel, lst in ran.items():
        if kernel.endswith("matmul_into"):
            continue
        for sig in lst:
            arrays = [t for t in sig if isinstance(t, list)]
            assert arrays and all(t[1:] == ["C", True] for t in arrays), f"{kernel}: {sig}"
        firsts = [sig[0][0] for sig in lst]
        assert len(firsts) == len(set(firsts)), f"{kernel} compiled more than once for one input dtype: {lst}"
    # the row kernels: float64 and float32; attention: float32-filtered or float64 scores
    assert sorted(s[0][0] for s in find("_rows_15")) == ["float32", "float64"]
    assert len(find("budget._forward_blk")) == 1


LITERAL_TWINS = """
import importlib, json, pkgutil
from numba.core import types
from entmax_ref.backends import numba_precompile as pc
import entmax_ref.backends.numba as kernels

for unit in ("softmax", "budget", "normmax", "entmax_big"):
    for dt in ("float64", "float32"):
        pc.UNITS[unit][1](dt)
twins, seen, ran = [], set(), set()
for info in pkgutil.iter_modules(kernels.__path__, kernels.__name__ + "."):
    mod = importlib.import_module(info.name)
    for name in dir(mod):
        d = getattr(mod, name)
        if not hasattr(d, "signatures") or id(d) in seen:
            continue
        seen.add(id(d))
        sigs = [tuple(s) for s in d.signatures]
        if sigs:
            ran.add(name)
        for s in sigs:
            for i, a in enumerate(s):
                if isinstance(a, types.Literal) and s[:i] + (types.unliteral(a),) + s[i + 1:] in sigs:
                    twins.append(f"{name} argument {i}: {a}")
print(json.dumps([twins, sorted(ran)]))
"""


@pytest.mark.slow
def test_no_kernel_compiles_a_literal_twin_of_a_counter():
    """No helper is compiled a second time for a counter that reaches it as a literal 0
    (the package docstring of ``backends/numba``).  With the disk cache off, so that every
    helper is compiled here and keeps its signatures, the units whose helpers took such
    counters compile no specialization that differs from another only by a literal."""
    r = _run(LITERAL_TWINS, env={"ENTMAX_REF_NUMBA_CACHE": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    twins, ran = json.loads(r.stdout.strip().splitlines()[-1])
    # the helpers that took such counters were compiled here, so their signatures count
    assert {"_softmax_finish", "_mass_T", "_first_over", "_norm_slope", "_sift", "select"} <= set(ran), ran
    assert twins == []


def test_units_cover_the_named_kernels_and_validate_arguments():
    assert set(pc.CHECK_UNITS) < set(pc.UNITS)
    with pytest.raises(ValueError, match="unknown unit 'nope'"):
        pc.compile_kernels(["nope"])
    with pytest.raises(ValueError, match="dtypes"):
        pc.compile_kernels(["softmax"], dtypes=["float16"])
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        pc.compile_kernels(["softmax"], jobs=0)


def test_compile_command_fills_the_cache_that_a_new_process_then_loads(tmp_path):
    """``entmax-ref compile`` in worker processes; a second run finds it done; a new
    process's first large call compiles nothing (numba's compile event never fires)."""
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path)}
    cmd = "import sys; from entmax_ref.cli import main; sys.exit(main({!r}))"
    r = _run(cmd.format(["compile", "--ops", "softmax,entmax_vjp", "--dtypes", "float64", "--jobs", "2"]), env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "compiled softmax (float64)" in r.stdout and "compiled entmax_vjp (float64)" in r.stdout
    assert "2 compiled, 0 already cached, 0 failed, 2 processes" in r.stdout
    assert list(tmp_path.glob("numba/*/compiled/softmax-float64"))
    r = _run(cmd.format(["compile", "--ops", "softmax", "--dtypes", "float64"]), env)
    assert r.returncode == 0 and "0 compiled, 1 already cached" in r.stdout, r.stdout + r.stderr[-2000:]
    r = _run("""
        from numba.core import event
        compiled = []
        class L(event.Listener):
            def on_start(self, ev): compiled.append(ev.data["dispatcher"].py_func.__qualname__)
            def on_end(self, ev): pass
        event.register("numba:compile", L())
        import numpy as np, entmax_ref as er
        x = np.random.default_rng(0).standard_normal((300, 200))
        p = er.softmax(x, backend="numba")
        er.entmax_vjp(p, x, 1.5, backend="numba")
        print(compiled)
        """, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_compile_command_errors(tmp_path):
    from entmax_ref.cli import main

    assert main(["compile", "--ops", "nope"]) == 2
    assert main(["compile", "--dtypes", "int8"]) == 2
    assert main(["compile", "--jobs", "0"]) == 2
    assert main(["compile", "--help"]) == 0


def test_compile_is_a_no_op_when_the_cache_is_off(tmp_path):
    r = _run("""
        from entmax_ref.backends.numba_precompile import compile_kernels
        rep = compile_kernels(["softmax"])
        print(rep["cache"], rep["compiled"], rep["skipped"])
        """, {"ENTMAX_REF_NUMBA_CACHE": "0", "ENTMAX_REF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "None {} ['softmax']"


def test_check_rejects_negative_jobs(capsys):
    from entmax_ref.testing.command import main

    assert main(["--backends", "numpy", "--jobs", "-1", "--no-peers"]) == 2
    assert "--jobs" in capsys.readouterr().err


def _run_schedule(tasks, jobs, cost):
    """Run ``pc._Schedule(tasks)`` on ``jobs`` threads whose work is a sleep of ``cost(task)``
    seconds; returns {task: (start, end)} in a shared monotonic order."""
    import threading
    import time

    sched = pc._Schedule(tasks)
    spans = {}
    lock = threading.Lock()

    def worker():
        while (t := sched.take()) is not None:
            with lock:
                spans[t] = [time.perf_counter(), None]
            time.sleep(cost(t))
            with lock:
                spans[t][1] = time.perf_counter()
            sched.done(t)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    return spans


def test_schedule_starts_a_task_only_after_the_kernels_it_calls_are_cached():
    """The attention units call the row solvers' and the alpha VJPs' kernels (and the
    decoding path the forward's): they start only after those units' tasks have ended, so
    they load those kernels instead of compiling them again, and no two workers compile one
    kernel (write one cache index) at once; a unit's float32 task never overlaps its float64
    one.  The longest chain (the attention's) starts first."""
    tasks = [(u, d) for u, dts in pc._units_dtypes(pc.UNITS, pc.DTYPES) for d in dts]
    assert len(tasks) == len(set(tasks))
    spans = _run_schedule(tasks, 2, lambda t: 0.002 * pc._COST.get(t, 1.0))
    assert set(spans) == set(tasks)
    for t in tasks:
        for need in pc._task_needs(t):
            assert need in spans, (t, need)
            assert spans[need][1] <= spans[t][0], f"{t} started before {need} ended"
    for u, d in tasks:
        if d == "float32":
            assert spans[(u, "float64")][1] <= spans[(u, d)][0]
    for unit, needs in (("attention_big", ("entmax_big",)), ("decode", ("attention_entmax15",)),
                        ("attention_entmax15", ("entmax15",)), ("attention_vjp", ("attention_entmax15",))):
        assert set(needs) <= set(pc._NEEDS[unit])
        for v in needs:
            assert spans[(v, "float64")][1] <= spans[(unit, "float64")][0]
    # the first task started is one the longest chain (to the attention backward) needs
    first = min(spans, key=lambda t: spans[t][0])
    chain, todo = set(), ["attention_vjp"]
    while todo:
        for v in pc._NEEDS.get(todo.pop(), ()):
            chain.add(v)
            todo.append(v)
    assert first[0] in chain, first


def test_schedule_keeps_both_workers_busy_and_ignores_needs_outside_it():
    """A unit whose needs are not asked for (or already cached) starts at once; a task that
    waits on a running one does not hold back the ready ones."""
    spans = _run_schedule([("attention_entmax", "float64"), ("budget", "float64")], 2, lambda t: 0.5)
    a, b = spans[("attention_entmax", "float64")], spans[("budget", "float64")]
    assert a[0] < b[1] and b[0] < a[1]  # they ran at the same time
    order = pc._Schedule([(u, "float64") for u in ("normmax", "decode", "attention_entmax15", "entmax15")]).order()
    assert order.index(("entmax15", "float64")) < order.index(("attention_entmax15", "float64"))
    assert order.index(("attention_entmax15", "float64")) < order.index(("decode", "float64"))


def test_compile_kernels_runs_the_schedule_in_the_workers(tmp_path, monkeypatch):
    """``compile_kernels`` hands the workers the tasks in the schedule's order, one (unit,
    dtype) per line, and waits for a task's needs to end before it hands it out: a stand-in
    worker logs when each task starts and ends.  The entmax15 task lasts until normmax has
    started (60 s at most), so the other worker's overlap does not rest on a start-up time."""
    log = tmp_path / "log"
    fake = textwrap.dedent(f"""
        import os, sys, time
        def started(unit):
            return os.path.exists({str(log)!r}) and f"start {{unit}} " in open({str(log)!r}).read()
        for line in sys.stdin:
            with open({str(log)!r}, "a") as f:
                f.write(f"start {{line.strip()}} {{time.time()!r}}\\n")
            if line.startswith("entmax15"):
                t0 = time.time()
                while not started("normmax") and time.time() - t0 < 60:
                    time.sleep(0.02)
            else:
                time.sleep(0.05)
            with open({str(log)!r}, "a") as f:
                f.write(f"end {{line.strip()}} {{time.time()!r}}\\n")
            print("ok 0.1", flush=True)
        """)
    monkeypatch.setattr(pc, "_WORKER_CODE", fake)
    rep = pc.compile_kernels(["attention_entmax15", "entmax15", "normmax"], dtypes=["float64"], jobs=2, force=True)
    if rep["cache"] is None:
        pytest.skip("the kernel cache is off")
    assert not rep["failed"], rep["failed"]
    assert sorted(rep["compiled"]) == ["attention_entmax15", "entmax15", "normmax"] and rep["jobs"] == 2
    ev = {}
    for line in log.read_text().splitlines():
        kind, unit, dt, t = line.split()
        ev[(kind, unit)] = float(t)
    assert ev[("end", "entmax15")] <= ev[("start", "attention_entmax15")]
    assert ev[("start", "normmax")] < ev[("end", "entmax15")]  # the other worker did not wait


def test_each_attention_unit_runs_the_kernels_of_its_own_solver_path():
    """The call of ``attention_<path>`` runs the forward's row kernel of that path (the
    chunked forward and the decoding path both run it), and the call of ``decode`` the
    decoding path's own phase-1 kernels: what "auto" takes a unit's marker to mean.  In a
    fresh process, each unit in turn, so a kernel has signatures only when a unit run so
    far called it."""
    code = """
        import json
        from entmax_ref.backends import engine, numba_precompile as pc
        from entmax_ref.backends.numba.attention_rows import FWD_ROWS
        from entmax_ref.backends.numba.decode import scan_block, score_bounds
        missing = []
        for i, path in enumerate(engine.SOLVER_PATHS):
            pc.UNITS[f"attention_{path}"][1]("float64")
            if not FWD_ROWS[i].signatures:
                missing.append(path)
        pc.UNITS["decode"][1]("float64")
        missing += [f.__name__ for f in (scan_block, score_bounds) if not f.signatures]
        print(json.dumps(missing))
    """
    r = _run(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
