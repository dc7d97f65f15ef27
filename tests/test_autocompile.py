"""backend="auto" with a cold or warm kernel cache: one rule (entmax_ref/backends/auto.py),
no process started, nothing that depends on timing or size.

Regressions: a large default call started a detached compile process tree that outlived
the program, a forked child compiled in-process, which engine answered depended on how far
that background compile had got, and compiled kernels were not used for inputs of at most
4,096 elements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from entmax_ref.backends import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason("numba") is not None, reason="numba is not installed")

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cache: Path) -> dict:
    """Run ``code`` in a fresh interpreter as a new user would: no ``ENTMAX_REF_*`` setting
    but the cache folder ``cache``; its last line of output, as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTMAX_REF_")}
    env["ENTMAX_REF_CACHE_DIR"] = str(cache)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=900)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


#: which engine answers: every reference (NumPy backend) method a call reaches is recorded
WATCH = """
    import json, logging
    import numpy as np
    import entmax_ref as er
    from entmax_ref.backends.numpy_backend import NumpyBackend

    used = []
    for member in ("entmax_forward", "entmax_vjp"):
        def spy(self, *args, _real=getattr(NumpyBackend, member), _m=member):
            used.append(_m)
            return _real(self, *args)
        setattr(NumpyBackend, member, spy)

    def answered(call):
        used.clear()
        call()
        return list(used)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4096))  # worker threads run its blocks
"""


def test_auto_runs_numba_exactly_when_the_calls_kernels_are_compiled(tmp_path):
    """Cold: the reference, nothing compiled (not even in the worker threads that ran the
    blocks); the one kernel signature compiled: numba for that call at every size, the
    reference for another dtype or solver path; a new process loads it from the cache."""
    out = _python(WATCH + """
    from entmax_ref.backends.numba import rows
    from entmax_ref.backends.numba_precompile import tasks

    cold = answered(lambda: er.entmax15(x))
    nothing = rows._rows_15.signatures
    # the float64 rows' two kernels: the solver, and the correctly rounded finishing stage
    for task in tasks(["entmax_forward"], ["float64"]):
        if task.kernel in ("rows._rows_15", "exact_finish.alpha"):
            task.compile()
    print(json.dumps({"cold": cold, "compiled_by_auto": nothing, "warm": answered(lambda: er.entmax15(x)),
                      "small": answered(lambda: er.entmax15(x[:2, :5])),
                      "float32": answered(lambda: er.entmax15(x.astype(np.float32))),
                      "other_path": answered(lambda: er.entmax(x, 1.25)),
                      "vjp": answered(lambda: er.entmax_vjp(er.entmax15(x), x, 1.5))}))
    """, tmp_path)
    assert out == {"cold": ["entmax_forward"], "compiled_by_auto": [], "warm": [], "small": [],
                   "float32": ["entmax_forward"], "other_path": ["entmax_forward"], "vjp": ["entmax_vjp"]}
    again = _python(WATCH + """
    print(json.dumps({"warm": answered(lambda: er.entmax15(x)), "small": answered(lambda: er.entmax15(x[:1, :3]))}))
    """, tmp_path)
    assert again == {"warm": [], "small": []}


def test_a_numba_call_makes_its_kernels_available_to_auto(tmp_path):
    out = _python(WATCH + """
    before = answered(lambda: er.sparsemax(x))
    p = er.sparsemax(x, backend="numba")
    after = answered(lambda: er.sparsemax(x))
    print(json.dumps({"before": before, "after": after, "same": bool((er.sparsemax(x) == p).all())}))
    """, tmp_path)
    assert out == {"before": ["entmax_forward"], "after": [], "same": True}


def test_the_reference_answer_keeps_the_public_checks(tmp_path):
    """A call answered by the reference because a kernel is not compiled (another one is)
    still rejects NaN input (the numba engine folds that scan into its own pass) and
    still computes with the methods only the reference has."""
    out = _python(WATCH + """
    er.sparsemax(x, backend="numba")
    bad = x.copy()
    bad[3, 7] = np.nan
    try:
        er.entmax15(bad)
        nan = "accepted"
    except ValueError as exc:
        nan = "row 3" if "3" in str(exc) else str(exc)
    sort = answered(lambda: er.entmax(x, 1.5, method="sort"))
    print(json.dumps({"nan": nan, "sort": sort}))
    """, tmp_path)
    assert out == {"nan": "row 3", "sort": ["entmax_forward"]}


def test_a_cold_default_call_says_so_once_through_logging(tmp_path):
    out = _python(WATCH + """
    import io
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("entmax_ref").addHandler(handler)
    logging.getLogger("entmax_ref").setLevel(logging.INFO)
    er.entmax15(x)
    er.entmax15(x)
    er.sparsemax(x)
    print(json.dumps(log.getvalue().strip().splitlines()))
    """, tmp_path)
    assert len(out) == 1 and "entmax-ref compile" in out[0]


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
    the cache folder empty without it: backends/cache_folder.py)."""
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


def test_auto_gives_the_same_float64_bits_cold_and_warm_at_every_size(tmp_path):
    """float64 rows are correctly rounded on both engines, so ``auto`` returns the same
    bits whichever engine it picks: with a cold cache (the reference), after a numba call
    compiled the kernels (numba), on rows below and above the size at which the numba
    engine runs its blocks on worker threads."""
    out = _python(WATCH + """
    from entmax_ref.backends.numba._threads import SEQUENTIAL_MAX

    x[3, :7] = x[3, 7]  # ties of an entry
    x[5, 9] = -np.inf
    sizes = {"small": x[:3, :40], "threaded": x}
    assert sizes["small"].size <= SEQUENTIAL_MAX < sizes["threaded"].size
    cold = {k: (answered(lambda: er.sparsemax(a)), er.sparsemax(a)) for k, a in sizes.items()}
    er.sparsemax(x, backend="numba")
    warm = {k: (answered(lambda: er.sparsemax(a)), er.sparsemax(a)) for k, a in sizes.items()}
    print(json.dumps({k: [cold[k][0], warm[k][0], bool((cold[k][1].view(np.int64) == warm[k][1].view(np.int64)).all())]
                      for k in sizes}))
    """, tmp_path)
    assert out == {k: [["entmax_forward"], [], True] for k in ("small", "threaded")}
