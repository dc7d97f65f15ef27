"""backend="auto" with a cold or warm kernel cache: one rule (entmax_ref/backends/engine.py),
no process started, nothing that depends on timing.

Regressions: a large default call started a detached compile process tree that outlived
the program, a forked child compiled in-process, and which engine answered depended on
how far that background compile had got.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import engine, resolve_backend, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason("numba") is not None, reason="numba is not installed")

ROOT = Path(__file__).resolve().parents[1]
BIG = np.zeros((2, er.backends.AUTO_SMALL))


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """The rule over an empty marker folder, with nothing known compiled in this process
    (and the disk cache on, whatever this machine's setting)."""
    from entmax_ref.backends import cache_folder

    monkeypatch.setattr(cache_folder, "CACHE", True)
    monkeypatch.setattr(engine, "marker_folder", lambda: tmp_path)
    monkeypatch.setattr(engine, "_known", set())
    monkeypatch.setattr(engine, "_said", [False])
    return tmp_path


def _auto(x, need):
    return resolve_backend(None, x, need=need).name


def test_auto_runs_numba_exactly_when_the_calls_kernels_are_compiled(cold):
    need15 = lambda: engine.entmax_forward(1.5)  # noqa: E731
    assert _auto(BIG, need15) == "numpy"
    (cold / "entmax15-float64").touch()
    assert _auto(BIG, need15) == "numba"
    assert _auto(BIG.astype(np.float32), need15) == "numpy"  # another dtype, another specialisation
    assert _auto(BIG, lambda: engine.entmax_forward(1.25)) == "numpy"  # another solver path
    assert _auto(np.zeros(4), need15) == "numpy"  # small: the reference, compiled or not
    assert resolve_backend("numba", BIG).name == "numba"  # a named engine is never replaced
    assert _auto(BIG, None) == "numpy"  # needs not named: every unit must be compiled
    for unit in engine.all_units():
        (cold / f"{unit}-float64").touch()
    assert _auto(BIG, None) == "numba"


def test_the_units_of_a_call_follow_the_numba_drivers():
    f = engine.entmax_forward
    assert f(1.0) == ("softmax",) and f(2.0) == ("sparsemax",) and f(1.5) == ("entmax15",)
    assert f(1.3) == ("entmax",) and f(3.0) == ("entmax_big",) and f(3.0, "bisect") == ("entmax_any",)
    assert f(1.5, "newton") == ("entmax_any",) and f(np.array([1.5, 1.2]), "bisect") == ("entmax_any",)
    assert f(np.array([2.5, 3.0])) == ("entmax_big",) and f(np.array([2.5, 3.0]), "newton") == ("entmax_big",)
    # rows of several alphas: the unit of each solver path they take, as engine.row_runs groups them
    assert f(np.array([1.5, 1.2, 1.5, 3.0, 1.0])) == ("softmax", "entmax15", "entmax", "entmax_big")
    assert engine.row_runs(np.array([1.5, 1.5, 1.2, 1.3, 3.0, 1.5])) == [(0, 2, 2), (2, 4, 3), (4, 5, 4), (5, 6, 2)]
    assert engine.row_runs(np.array([])) == [] and engine.row_runs(2.0) == [(0, 1, 1)]
    # the scalar and the array forms of the path test agree, at and next to each breakpoint
    edges = np.array([1.0, 1.5, 2.0])
    alphas = np.concatenate([edges, np.nextafter(edges, 0.0), np.nextafter(edges, 3.0), [1.25, 3.0, 1e6]])
    per_row = [p for lo, hi, p in engine.row_runs(alphas) for _ in range(lo, hi)]
    assert per_row == [engine.solver_path(a) for a in alphas]
    assert engine.entmax_vjp(np.array([1.5, 3.0])) == ("entmax_vjp_any",)
    assert engine.entmax_alpha_vjp(4.0) == ("entmax_alpha_vjp_big",)
    assert set(engine.attention(1.5, forward=True)) <= set(engine.attention(1.5, forward=False))
    # the attention forward's units: one per row solver its heads take
    a = engine.attention
    assert a(1.5, True) == ("attention_entmax15", "decode", "entmax15")
    assert a(1.0, True) == ("attention_softmax", "softmax")  # softmax heads never take the decoding path
    assert a(2.0, True)[0] == "attention_sparsemax" and a(np.array([1.2, 1.7]), True)[0] == "attention_entmax"
    assert a(np.array([3.0, 40.0]), True)[0] == "attention_big"
    # heads on two solvers (1.5-entmax, alpha > 2) run each one's kernels
    assert a(np.array([1.5, 3.0]), True) == ("attention_entmax15", "attention_big", "decode", "entmax15", "entmax_big")
    assert a(np.array([1.0, 1.25]), True)[:2] == ("attention_softmax", "attention_entmax")  # no decoding: softmax
    assert "decode" not in a(np.array([1.0, 1.25]), True)
    from entmax_ref.backends import numba_precompile

    every = set(engine.all_units())
    assert set(numba_precompile._CALLS) == every  # each unit has the call that compiles it
    for units in (f(1.0), f(np.array([1.5, 3.0]), "newton"), engine.entmax_vjp(np.array([1.5, 3.0])),
                  engine.entmax_alpha_vjp(np.array([1.5, 3.0])), engine.attention(np.array([1.5, 3.0]), False),
                  *(engine.family(op) for op in ("normmax_forward", "normmax_vjp", "budget_forward", "budget_vjp"))):
        assert set(units) <= every  # entmax-ref compile compiles every unit a call can need


def test_path_runs_are_the_rows_of_consecutive_heads_on_one_path():
    """``engine.path_runs``: the rows of a block, cut where the solver path changes."""
    runs = engine.path_runs([1.5, 1.5, 3.0, 4.0, 1.25, 1.5], 10, 5, 55)
    assert [(lo, hi, engine.SOLVER_PATHS[p]) for lo, hi, p in runs] == [
        (5, 20, "entmax15"), (20, 40, "big"), (40, 50, "entmax"), (50, 55, "entmax15")]
    assert engine.path_runs([1.0, 2.0], 4, 4, 8) == [(4, 8, engine.SOLVER_PATHS.index("sparsemax"))]
    assert engine.path_runs([1.5, 1.5], 3, 0, 6) == [(0, 6, engine.SOLVER_PATHS.index("entmax15"))]


def test_a_numba_call_marks_its_unit_compiled(cold):
    x = np.random.default_rng(0).standard_normal((4, 2048))
    assert _auto(x, lambda: engine.entmax_forward(2.0)) == "numpy"
    p = er.sparsemax(x, backend="numba")
    assert (cold / "sparsemax-float64").exists()
    assert _auto(x, lambda: engine.entmax_forward(2.0)) == "numba"
    np.testing.assert_array_equal(er.sparsemax(x), p)


def test_a_cold_default_call_says_so_once_through_logging(cold, caplog):
    x = np.random.default_rng(0).standard_normal((4, 2048))
    with caplog.at_level(logging.INFO, logger="entmax_ref"):
        er.entmax15(x)
        er.entmax15(x)
        er.sparsemax(x)
    said = [r for r in caplog.records if r.name == "entmax_ref"]
    assert len(said) == 1 and "entmax-ref compile" in said[0].getMessage()


def _children(pid: int | str = "self") -> set[int]:
    out: set[int] = set()
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        out.update(int(c) for c in f.read_text().split())
    return out


def _with_env(cache: Path) -> list[int]:
    """The processes (other than this one) whose environment names ``cache``."""
    mark = f"ENTMAX_REF_CACHE_DIR={cache}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def _python(code: str, cache: Path) -> dict:
    """Run ``code`` in a fresh interpreter as a new user would: no ``ENTMAX_REF_*`` setting
    but the (empty) cache folder ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTMAX_REF_")}
    env["ENTMAX_REF_CACHE_DIR"] = str(cache)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


FIRST = """
    import json, sys, threading, time
    from pathlib import Path
    import numpy as np

    def children():
        return sorted(int(c) for f in Path("/proc/self/task").glob("*/children") for c in f.read_text().split())

    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(children())
            time.sleep(0.001)

    t = threading.Thread(target=watch)
    t.start()
    import entmax_ref as er
    x = np.random.default_rng(0).standard_normal((512, 64))
    p = er.entmax15(x)
    time.sleep(0.2)
    done.set()
    t.join()
    numba_imported = "numba" in sys.modules
    print(json.dumps({"during": sorted(seen), "after": children(),
                      "same": bool((p == er.entmax15(x, backend="numpy")).all()),
                      "compiled": "entmax_ref.backends.numba.rows" in sys.modules, "numba": numba_imported}))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_a_cold_default_call_starts_no_process(tmp_path):
    """A fresh interpreter, an empty cache, a call of 32,768 elements on the default
    backend: no child process during or after the call, none left after exit, the
    reference's numbers, nothing compiled, and numba not even imported (the rule finds
    the cache folder without it: backends/cache_folder.py)."""
    out = _python(FIRST, tmp_path)
    assert out == {"during": [], "after": [], "same": True, "compiled": False, "numba": False}
    assert _with_env(tmp_path) == []
    assert not list(tmp_path.rglob("*.nbi"))


FORK = """
    import json, os, sys
    from pathlib import Path
    import numpy as np
    import entmax_ref as er

    def children():
        return sorted(int(c) for f in Path("/proc/self/task").glob("*/children") for c in f.read_text().split())

    x = np.random.default_rng(0).standard_normal((512, 64))
    ref = er.entmax15(x, backend="numpy")
    parent_same = bool((er.entmax15(x) == ref).all())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        p = er.entmax15(x)
        report = {"same": bool((p == ref).all()), "children": children(),
                  "compiled": "entmax_ref.backends.numba.rows" in sys.modules}
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read())
    others = [c for c in children() if c != pid]
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"parent_same": parent_same, "child": child, "others": others,
                      "status": os.waitstatus_to_exitcode(status)}))
"""


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/task").is_dir(), reason="needs fork and /proc")
def test_a_forked_child_gets_the_same_answers_and_starts_nothing(tmp_path):
    out = _python(FORK, tmp_path)
    assert out == {"parent_same": True, "child": {"same": True, "children": [], "compiled": False},
                   "others": [], "status": 0}
    assert _with_env(tmp_path) == []
