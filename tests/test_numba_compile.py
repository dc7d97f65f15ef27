"""Compile cost of the numba backend: one specialization per kernel and input
dtype whatever the flags of the caller's arrays, and the ahead-of-time ``entmax-ref
compile`` (worker processes filling the disk cache)."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
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
import importlib, json
import numpy as np
import entmax_ref as er
from entmax_ref.backends.numba_precompile import kernels

def ro(a):
    a = np.array(a)
    a.flags.writeable = False
    return a

rng = np.random.default_rng(0)
for dt in (np.float64, np.float32):
    x = rng.standard_normal((6, 9)).astype(dt)
    for a in (1.0, 1.25, 1.5, 2.0, 3.0, np.array([1.5, 3.0, 1.0, 2.0, 1.25, 1.5])):
        er.entmax(x, a, backend="numba")
        p = er.entmax(x, a, backend="numpy")
        er.entmax_vjp(p, x, a, backend="numba")
        er.entmax_alpha_vjp(p, x, a, backend="numba")
    for m in ("newton", "bisect"):
        er.entmax(x, 1.5, method=m, backend="numba")
    er.entmax(ro(x), 1.5, backend="numba")                      # read-only input
    er.entmax(np.asfortranarray(x), 1.5, backend="numba")        # another layout
    er.entmax(x, ro(np.full(6, 1.5)), backend="numba")           # read-only per-row alpha
    p = er.entmax(x, 1.5, backend="numpy")
    g = rng.standard_normal(x.shape).astype(dt)
    er.entmax_vjp(ro(p), ro(g), ro(np.full(6, 1.5)), backend="numba")
    er.normmax_vjp(er.normmax(x, 2.0, backend="numba"), g, 2.0, backend="numba")
    er.budget_sparsemax_vjp(er.budget_sparsemax(x, 2.0, backend="numba"), g, 2.0, backend="numba")
    er.budget_sparsemax(ro(x), ro(np.full(6, 2.0)), backend="numba")
    # attention: every solver path, both score products (the float32 filter and float64
    # scores), causal chunks that stop short of the last key, the dense backward, the
    # decoding path, read-only inputs
    for Nq, Nk, spread, kw in ((8, 8, 1.0, {}), (40, 40, 1.0, dict(causal=True, chunk=8)),
                               (2, 64, 20.0, {}), (4, 64, 0.01, {}), (1, 2048, 1.0, {})):
        q = (spread * rng.standard_normal((1, 2, Nq, 4))).astype(dt)
        k, v = (rng.standard_normal((1, 2, Nk, 4)).astype(dt) for _ in range(2))
        for a in (1.0, 1.25, 1.5, 2.0, 3.0, np.array([1.5, 3.0])):
            o, info = er.attention(q, k, v, alpha=a, backend="numba", return_info=True, **kw)
            er.attention_vjp(np.ones_like(o), q, k, v, info=info, alpha=a, backend="numba", **kw)
            er.attention(ro(q), ro(k), ro(v), alpha=a, beta=0.5, gamma=1.0, backend="numba", **kw)
out = {k.name: [[str(t) for t in sig] for sig in k.dispatcher.signatures if tuple(sig) not in [s for _, s in k.signatures]]
       for k in kernels()}
print(json.dumps({"undeclared": {k: v for k, v in out.items() if v},
                  "ran": sorted(k.name for k in kernels() if k.dispatcher.signatures)}))
"""


def test_every_specialization_a_call_compiles_is_declared():
    """A broad set of calls (every operation, both dtypes, read-only inputs, another
    layout, every solver path, both attention score products, causal chunks, the dense
    backward, the decoding path) compiles no kernel signature that its kernel does not
    declare: ``entmax-ref compile`` then covers every call, and one specialization serves
    whatever flags the caller's arrays carry."""
    r = _run(SIGNATURES)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["undeclared"] == {}
    from entmax_ref.backends.numba_precompile import kernels

    assert set(out["ran"]) == {k.name for k in kernels()}  # every declared kernel ran


LITERAL_TWINS = """
import importlib, json, pkgutil
from numba.core import types
from entmax_ref.backends.numba_precompile import tasks
from entmax_ref.backends.numba._jit import Dispatcher
import entmax_ref.backends.numba as kernels

# the attention forward's rows reach softmax's per-row path (_softmax_finish)
for t in tasks(["entmax_forward", "budget_forward", "attention_forward"]):
    if t.kernel in ("rows._rows_softmax", "rows._rows_big", "budget._forward_blk", "attention_rows.fwd_rows"):
        t.compile()
twins, seen, ran = [], set(), set()
for info in pkgutil.iter_modules(kernels.__path__, kernels.__name__ + "."):
    mod = importlib.import_module(info.name)
    for name in dir(mod):
        d = getattr(mod, name)
        if not isinstance(d, Dispatcher) or id(d) in seen:
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
    assert {"_softmax_finish", "_mass_T", "_first_over", "_sift", "select"} <= set(ran), ran
    assert twins == []


def test_compile_validates_its_arguments():
    with pytest.raises(ValueError, match="unknown operation 'nope'"):
        pc.compile_kernels(["nope"])
    with pytest.raises(ValueError, match="dtypes"):
        pc.compile_kernels(["entmax_vjp"], dtypes=["float16"])
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        pc.compile_kernels(["entmax_vjp"], jobs=0)


def test_compile_command_fills_the_cache_that_a_new_process_then_loads(tmp_path):
    """``entmax-ref compile`` in worker processes; a second run finds it done (numba's
    cache, no marker file); a new process's calls compile nothing (numba's compile event
    never fires)."""
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path)}
    cmd = "import sys; from entmax_ref.cli import main; sys.exit(main({!r}))"
    r = _run(cmd.format(["compile", "--ops", "entmax_vjp", "--dtypes", "float32", "--jobs", "2"]), env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    # float32 rows above alpha = 2 run the float64 kernel (its one signature serves both dtypes)
    for name in ("grads._vjp_small (float32", "grads._vjp_cr (any"):
        assert f"compiled {name}, signature " in r.stderr, r.stderr
    assert "2 compiled, 0 already cached, 0 failed of 2 kernel signatures; 2 processes" in r.stdout
    assert not list(tmp_path.rglob("compiled"))
    r = _run(cmd.format(["compile", "--ops", "entmax_vjp", "--dtypes", "float32"]), env)
    assert r.returncode == 0 and "0 compiled, 2 already cached" in r.stdout, r.stdout + r.stderr[-2000:]
    r = _run(cmd.format(["compile", "--ops", "entmax_vjp,entmax_alpha_vjp", "--list"]), env)
    assert r.stdout.count("compiled ") == 2 and r.stdout.count("pending ") == 2, r.stdout
    r = _run("""
        from numba.core import event
        compiled = []
        class L(event.Listener):
            def on_start(self, ev): compiled.append(ev.data["dispatcher"].py_func.__qualname__)
            def on_end(self, ev): pass
        event.register("numba:compile", L())
        import numpy as np, entmax_ref as er
        x = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
        for a in (1.5, 3.0, np.linspace(1.5, 3.0, 300)):
            er.entmax_vjp(er.entmax(x, a, backend="numpy"), x, a, backend="numba")
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
        rep = compile_kernels(["entmax_vjp"], dtypes=["float64"])
        print(rep["cache"], rep["compiled"], len(rep["skipped"]))
        """, {"ENTMAX_REF_NUMBA_CACHE": "0", "ENTMAX_REF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "None {} 1"


def test_check_rejects_negative_jobs(capsys):
    from entmax_ref.testing.command import main

    assert main(["--backends", "numpy", "--jobs", "-1", "--no-peers"]) == 2
    assert "--jobs" in capsys.readouterr().err


def _run_schedule(todo, jobs, cost):
    """Run ``pc._Schedule(todo)`` on ``jobs`` threads whose work is a sleep of ``cost(task)``
    seconds; returns {task: (start, end)} in a shared monotonic order."""
    import threading
    import time

    sched = pc._Schedule(todo)
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
    return sched, spans


def test_the_schedule_comes_from_the_kernels_code():
    """Every declared kernel signature is a task; the attention forward waits for the row
    drivers of the solver paths (their solvers are in the forward's reach), a kernel's
    second signature for its first; no task starts before
    the tasks it waits for have ended, and both workers keep busy."""
    todo = pc.tasks()
    assert len(todo) == sum(len(k.signatures) for k in pc.kernels())
    sched, spans = _run_schedule(todo, 2, lambda t: 0.0005 * len(pc.reach(t.entry.dispatcher)))
    assert set(spans) == set(todo)
    for t, waits in sched.waits.items():
        for u in waits:
            assert spans[u][1] <= spans[t][0], f"{t.label} started before {u.label} ended"
    by = {(t.kernel, t.index): t for t in todo}
    assert by[("rows._rows_15", 0)] in sched.waits[by[("attention_rows.fwd_rows", 0)]]
    assert by[("rows._rows_sparse", 0)] in sched.waits[by[("attention_rows.fwd_rows", 0)]]
    assert by[("grads._alpha_vjp", 0)] in sched.waits[by[("grads._alpha_vjp", 1)]]
    from entmax_ref.backends.numba import rows

    assert rows.solve_15 in pc.reach(rows._rows_15) and rows.solve_15 not in pc.reach(rows._rows_sparse)


def test_compile_kernels_runs_the_schedule_in_the_workers(tmp_path, monkeypatch):
    """``compile_kernels`` hands the workers the tasks in the schedule's order, one
    ``kernel index`` per line, and waits for a task's waits to end before it hands it out:
    a stand-in worker logs when each task starts and ends."""
    log = tmp_path / "log"
    fake = textwrap.dedent(f"""
        import sys, time
        for line in sys.stdin:
            with open({str(log)!r}, "a") as f:
                f.write(f"start {{line.strip()}} {{time.time()!r}}\\n")
            time.sleep(0.05)
            with open({str(log)!r}, "a") as f:
                f.write(f"end {{line.strip()}} {{time.time()!r}}\\n")
            print("ok 0.1 0.1", flush=True)
        """)
    monkeypatch.setattr(pc, "_WORKER_CODE", fake)
    monkeypatch.setattr(pc.Task, "compiled", lambda self: False)  # every task to do
    todo = [t for t in pc.tasks(["entmax_forward", "attention_forward", "budget_forward"], ["float64"])
            if t.kernel in ("rows._rows_15", "attention_rows.fwd_rows", "budget._forward_blk", "rows._rows_big")]
    monkeypatch.setattr(pc, "tasks", lambda *a, **k: todo)
    rep = pc.compile_kernels(jobs=2)
    if rep["cache"] is None:
        pytest.skip("the kernel cache is off")
    assert not rep["failed"], rep["failed"]
    assert len(rep["compiled"]) == len(todo) and rep["jobs"] == 2
    ev = {}
    for line in log.read_text().splitlines():
        kind, kernel, index, t = line.split()
        ev[(kind, kernel)] = float(t)
    assert ev[("end", "rows._rows_15")] <= ev[("start", "attention_rows.fwd_rows")]


def test_workers_import_the_callers_entmax_ref_from_any_working_folder(tmp_path, monkeypatch):
    """A worker imports the entmax_ref its caller runs, even from a working folder that
    holds another one (a second checkout): ``python -c`` puts the working folder first on
    ``sys.path``, so the workers start in the caller's package folder."""
    import entmax_ref

    other = tmp_path / "entmax_ref"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('another checkout')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pc, "_WORKER_CODE", textwrap.dedent("""
        import sys, entmax_ref
        for line in sys.stdin:
            print("ok 0 0" if entmax_ref.__file__ == %r else "error " + entmax_ref.__file__, flush=True)
        """ % entmax_ref.__file__))
    monkeypatch.setattr(pc.Task, "compiled", lambda self: False)
    todo = [t for t in pc.tasks(["attention_backward"]) if t.kernel == "attention_rows.expand"]
    monkeypatch.setattr(pc, "tasks", lambda *a, **k: todo)
    rep = pc.compile_kernels(jobs=1)
    if rep["cache"] is None:
        pytest.skip("the kernel cache is off")
    assert not rep["failed"] and len(rep["compiled"]) == 1, rep


def test_progress_is_a_bar_on_a_terminal_and_one_line_per_unit_otherwise():
    """``entmax-ref compile`` and ``check`` show units done / total and the elapsed time: a
    bar redrawn in place on a terminal, one plain line per unit in a log."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    bar = pc.Progress(3, stream=tty)
    bar.step("rows._rows_15 (float64)")
    bar.step("rows._rows_15 (float32)")
    bar.close()
    drawn = tty.getvalue().split("\r")
    assert drawn[1].startswith("[" + "#" * 10 + "." * 20 + "] 1/3 ") and "rows._rows_15 (float64)" in drawn[1]
    assert drawn[2].startswith("[" + "#" * 20 + "." * 10 + "] 2/3 ") and "\n" not in tty.getvalue()
    log = io.StringIO()
    lines = pc.Progress(2, stream=log)
    lines.step("compiled grads._vjp_small (float64, signature 1 of 2) in 0.4s")
    lines.close()
    (line,) = log.getvalue().splitlines()
    assert line.startswith("[1/2 ") and line.endswith("s] compiled grads._vjp_small (float64, signature 1 of 2) in 0.4s")


WIDTHS = """
import re, numba, numpy as np
import entmax_ref as er
from entmax_ref.backends.numba import rows
from entmax_ref.backends.numba.vexp import vexp_neg

@numba.njit
def plain(d, out):  # the softmax pass's exponential loop, compiled as numba compiles it
    for i in range(d.shape[0]):
        out[i] = vexp_neg(np.float64(d[i]))

x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
er.softmax(x, backend="numba")
plain(x[0], np.empty(256))
for name, disp in (("package", rows._rows_softmax), ("plain", plain)):
    asm = "".join(cres.library.get_asm_str() for cres in disp.overloads.values())
    print(name, len(re.findall(r"%zmm", asm)), len(re.findall(r"%ymm", asm)))
"""


def test_kernels_use_512_bit_vectors_on_an_intel_target():
    """On an x86 CPU with AVX-512 the kernels vectorise to 512-bit registers whatever the
    CPU's tuning: compiled for an Intel server core (``NUMBA_CPU_NAME=icelake-server`` in
    a child process, the codegen LLVM gives that CPU: all its instructions run on any
    AVX-512 host), the float32 softmax kernel uses zmm registers, where the same
    exponential loop compiled as plain numba code uses ymm registers only (LLVM's
    ``prefer-256-bit`` tuning for those cores, which ``backends/numba/_target.py``
    turns off for the package's functions)."""
    from llvmlite import binding as ll

    if "+avx512f" not in ll.get_host_cpu_features().flatten().split(","):
        pytest.skip("the host has no AVX-512")
    res = _run(WIDTHS, env={"NUMBA_CPU_NAME": "icelake-server", "ENTMAX_REF_NUMBA_CACHE": "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    counts = {name: (int(z), int(y)) for name, z, y in (line.split() for line in res.stdout.splitlines())}
    assert counts["plain"][0] == 0 and counts["plain"][1] > 0, counts  # the proxy prefers 256 bits
    assert counts["package"][0] > 0, counts


INTEL_BITS = """
import sys
import numpy as np
import entmax_ref as er

rng = np.random.default_rng(3)
q, k, v = (rng.standard_normal((1, 2, 96, 32)) for _ in range(3))
out, info = er.attention(q, k, v, alpha=1.5, causal=True, return_info=True, backend="numba")
x = rng.standard_normal((8, 1000)).astype(np.float32)
np.savez(sys.argv[1], out=out, theta=info.theta, softmax=er.softmax(x, backend="numba"))
"""


@pytest.mark.slow
def test_an_intel_target_computes_the_bits_of_this_host(tmp_path):
    """The kernels compiled for an Intel server core (``NUMBA_CPU_NAME=sapphirerapids`` in
    a child process with a cache folder of its own: the codegen LLVM gives that CPU, whose
    instructions all run on an AVX-512 host) return the bits the host's own build returns,
    here the float64 attention forward, whose exact dot products sum in the order of the
    vector lanes (:func:`~entmax_ref.backends.numba.attention_filter.dot64`), and float32
    softmax: with the same vector width on every AVX-512 CPU
    (``backends/numba/_target.py``) the same order, where 256-bit code rounded some
    attention outputs differently."""
    from llvmlite import binding as ll

    if "+avx512f" not in ll.get_host_cpu_features().flatten().split(","):
        pytest.skip("the host has no AVX-512")
    here, intel = tmp_path / "here.npz", tmp_path / "intel.npz"
    for path, env in ((here, {}), (intel, {"NUMBA_CPU_NAME": "sapphirerapids",
                                           "ENTMAX_REF_CACHE_DIR": str(tmp_path / "cache")})):
        res = _run(f"import sys; sys.argv[1:] = [{str(path)!r}]\n" + INTEL_BITS, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
    a, b = np.load(here), np.load(intel)
    for name in a.files:
        assert a[name].tobytes() == b[name].tobytes(), name


def test_numba_inlines_only_the_dispatching_helpers():
    """A helper inlined at numba's level (``inline="always"``) is copied and typed again at
    every call site, which once made most of a cold compile; the vectorised loops' helpers
    are ``forceinline`` instead (LLVM inlines them, typed once).  Only the helpers whose
    callers pass a constant that numba prunes to one branch stay inlined at numba's level."""
    import entmax_ref.backends.numba as package
    from entmax_ref.backends.numba import _jit

    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
    ir_inlined = {d.py_func.__name__ for d in _jit._ALL if d.targetoptions.get("inline") == "always"}
    assert ir_inlined == {"solve_on_path", "solver_scratch", "_finish_stage", "round32"}
    assert sum(bool(d.targetoptions.get("forceinline")) for d in _jit._ALL) > 50


def test_only_the_entry_kernels_have_a_python_entry():
    """Every compiled function of the package other than an entry kernel is a helper
    compiled without numba's Python and C wrappers; calling one from Python raises a
    ``TypeError`` that names it (the compiled code has no Python entry to run), and a
    compiled caller runs it."""
    import entmax_ref.backends.numba as package
    from entmax_ref.backends.numba import _jit
    from entmax_ref.backends.numba.candidates import _row_max
    from helper_entry import entry

    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
    kernels = {k.dispatcher for k in _jit.KERNELS}
    for d in _jit._ALL:
        name = f"{d.py_func.__module__}.{d.py_func.__qualname__}"
        if d in kernels:
            assert not isinstance(d, _jit.Helper) and not d.targetoptions.get("no_cpython_wrapper"), name
        elif d.py_func.__module__.startswith(package.__name__ + "."):
            assert isinstance(d, _jit.Helper), name
            assert d.targetoptions["no_cpython_wrapper"] and d.targetoptions["no_cfunc_wrapper"], name
    x = np.array([1.0, 3.0, 2.0])
    with pytest.raises(TypeError, match=r"candidates\._row_max is a compiled helper with no Python entry"):
        _row_max(x)
    assert entry(_row_max)(x) == 3.0


def test_a_helper_is_ir_that_its_callers_link_with_no_machine_code_of_its_own():
    """A helper's own library is linked-only: its optimised LLVM IR, which the callers link
    (and emit as part of their own machine code), saved to the disk cache as that IR; no
    machine code is emitted for it and its functions have no address.  The caller's
    library is emitted and runs it."""
    from llvmlite import binding as ll

    from entmax_ref.backends.numba.candidates import _row_max
    from helper_entry import entry

    call = entry(_row_max)
    assert call(np.array([1.0, 3.0, 2.0])) == 3.0
    assert _row_max.overloads
    for cres in _row_max.overloads.values():
        lib, fn = cres.library, cres.fndesc.llvm_func_name
        assert lib.linked and lib.get_pointer_to_function(fn) == 0
        state = lib.serialize_using_object_code()
        assert state[1] == "linked" and ll.parse_bitcode(state[2]).get_function(fn).name == fn
        again = lib.codegen.unserialize_library(state)  # as a process that loads it from the disk cache
        assert again.linked and again.get_pointer_to_function(fn) == 0
        assert again._get_module_for_linking().get_function(fn).name == fn
    for cres in call.overloads.values():
        assert not cres.library.linked
        assert cres.library.get_pointer_to_function(cres.fndesc.llvm_cpython_wrapper_name) != 0
