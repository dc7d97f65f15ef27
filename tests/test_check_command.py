"""The ``entmax-ref check`` command: --impl, --json, exit status, and bad usage."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from entmax_ref.testing.command import main

USER_MODULE = textwrap.dedent('''
    import numpy as np
    import entmax_ref as er

    def good(x, alpha):
        return er.entmax(x, alpha, backend="numpy")

    def sparsemax_only(x):
        return er.sparsemax(x, backend="numpy")

    def raises(x, alpha):
        raise ValueError("my kernel does not like this")

    def nan_rows(x, alpha):
        p = er.entmax(x, alpha, backend="numpy")
        p[::7] = np.nan
        return p

    def no_masked_rows(x, alpha):
        if np.isneginf(np.asarray(x)).all(axis=-1).any():
            raise IndexError("index -1 is out of bounds for dimension 1")
        return er.entmax(x, alpha, backend="numpy")

    def wrong_shape(x, alpha):
        return np.asarray(x)[:, :-1]

    def three_args(x, y, z):
        return x

    def shifted(x, alpha):
        return er.entmax(np.asarray(x) * 1.001, alpha, backend="numpy")

    def attention(q, k, v, *, alpha=1.5, causal=False):
        return er.attention(q, k, v, alpha=alpha, causal=causal, backend="numpy")

    def attention_vjp(do, q, k, v, *, alpha=1.5, causal=False):
        return er.attention_vjp(do, q, k, v, alpha=alpha, causal=causal, backend="numpy")[:3]

    def returns_none(*args, **kwargs):
        return None

    def exits(*args, **kwargs):
        import sys
        sys.exit(3)
''')


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_impl.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_impl"


def run(capsys, *argv):
    code = main(["--quick", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_impl_passes_and_writes_json(user_module, capsys, tmp_path):
    path = tmp_path / "report.json"
    code, out, _ = run(capsys, "--impl", f"{user_module}:good", "--op", "entmax", "--alpha", "1.5", "--alpha", "3",
                       "--json", str(path))
    assert code == 0, out
    assert "entmax a=1.5" in out and "entmax a=3" in out and "PASS" in out
    data = json.loads(path.read_text())
    assert data["ok"] and data["exit_status"] == 0 and len(data["rows"]) == 4
    assert {"max_abs", "max_ulps", "props_passed", "verdict", "notes", "cases"} <= set(data["rows"][0])
    # one record per compared case: its id, verdict, the output, the worst entry, error and bound
    cases = data["rows"][0]["cases"]
    assert [c["tcId"] for c in cases] == ["random", "ties", "masks", "all-masked", "extreme", "tiny n=1",
                                          "tiny n=2", "long"]
    for c in cases:
        assert c["verdict"] == "PASS" and c["field"] == "p" and 0 <= c["error"] <= c["bound"], c
        assert len(c["worst"]) == 2
    assert data["counts"] == {"entmax": {"pass": 4 * len(cases), "fail": 0, "skip": 0}}


def test_impl_without_alpha_parameter(user_module, capsys):
    code, out, _ = run(capsys, "--impl", f"{user_module}:sparsemax_only", "--alpha", "2")
    assert code == 0, out


def test_inaccurate_impl_fails_with_exit_1(user_module, capsys):
    code, out, _ = run(capsys, "--impl", f"{user_module}:shifted", "--alpha", "1.5")
    assert code == 1
    assert "FAIL" in out and "failures:" in out and "out of tolerance" in out


@pytest.mark.parametrize("target,needle", [
    ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
    ("my_impl:missing", "has no attribute 'missing'"),
    ("my_impl", "must look like package.module:function"),
    ("my_impl:three_args", "wrong signature"),
    ("my_impl:raises", "raised ValueError: my kernel does not like this"),
    ("my_impl:wrong_shape", "has shape"),
])
def test_bad_usage_is_a_failing_row_not_a_traceback(user_module, capsys, target, needle):
    code, out, err = run(capsys, "--impl", target, "--alpha", "1.5", "--alpha", "2")
    assert code == 1
    assert needle in out
    assert "Traceback" not in out + err
    if ":" in target and target.startswith("my_impl:") and target != "my_impl:missing":
        # the remaining checks still ran: both alphas and both dtypes have rows
        assert out.count("entmax a=1.5") >= 2 and out.count("entmax a=2") >= 2


def test_attention_impl_and_its_vjp(user_module, capsys):
    code, out, _ = run(capsys, "--impl", f"{user_module}:attention", "--op", "attention", "--features", "causal",
                       "--alpha", "1.5", "--dtype", "float64")
    assert code == 0, out
    code, out, _ = run(capsys, "--impl", f"{user_module}:attention_vjp", "--op", "attention_vjp",
                       "--features", "causal", "--alpha", "2", "--dtype", "float64")
    assert code == 0, out
    assert "attention vjp a=2" in out


@pytest.mark.parametrize("argv", [["--features", "nonsense"], ["--op", "nonsense"], ["--alpha", "nan"],
                                  ["--alpha", "0.5"], ["--alpha", "inf"], ["--seed", "-1"], ["--backends", "bogus"],
                                  ["--budget", "-1"], ["--jobs", "-2"], ["--op", "normmax", "--alpha", "1"]])
def test_bad_option_values_are_one_line_usage_errors_with_exit_2(capsys, argv):
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("entmax-ref check: error: ") and out.err.count("\n") == 1, out.err


def test_json_to_a_missing_folder_is_refused_before_the_run(user_module, capsys, tmp_path):
    code = main(["--impl", f"{user_module}:good", "--json", str(tmp_path / "no" / "such" / "report.json")])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""  # no table: nothing ran
    assert "does not exist" in out.err and out.err.count("\n") == 1 and "Traceback" not in out.err
    assert main(["--impl", f"{user_module}:good", "--json", str(tmp_path)]) == 2  # a folder is no file
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("op,extra", [("entmax", []), ("threshold", []), ("entmax_vjp", []),
                                      ("attention", ["--features", "causal"]),
                                      ("attention_vjp", ["--features", "causal"]), ("normmax", ["--alpha", "2"]),
                                      ("budget_sparsemax", [])])
def test_an_implementation_returning_none_fails_every_op(user_module, capsys, op, extra):
    code, out, _ = run(capsys, "--impl", f"{user_module}:returns_none", "--op", op, "--dtype", "float64", *extra)
    assert code == 1, out
    rows = _table_rows(out)
    assert rows and all(cells[-2:] == ["FAIL", "None"] for cells in rows), out
    assert "returned None instead of an array" in out


def test_a_corpus_replay_of_an_implementation_returning_none_fails(user_module, capsys, shared_tmp):
    from entmax_ref.testing.conformance import generate_corpus

    corpus = shared_tmp("scale-corpus", lambda d: generate_corpus(d, seed=0, ops=("asentmax_scale",)))
    code = main(["--corpus", str(corpus), "--impl", f"{user_module}:returns_none", "--op", "asentmax_scale"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL None" in out and "returned None instead of an array" in out, out
    code = main(["--corpus", str(corpus), "--impl", f"{user_module}:exits", "--op", "asentmax_scale"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL exit" in out and "called sys.exit(3)" in out, out


def test_corpus_out_to_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    import os

    from entmax_ref.cli import main as cli_main

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # a folder this user may not write in (the test may run as root, whom permissions do not bind)
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).startswith(str(locked)) and real_access(p, mode))
    assert cli_main(["corpus", "--out", str(locked / "corpus"), "--ops", "asentmax_scale"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("entmax-ref corpus: error: argument --out: ")
    assert "cannot write in " in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (locked / "corpus").exists()
    assert main(["--impl", "my_impl:good", "--json", str(locked / "report.json")]) == 2
    assert "permission denied" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert cli_main(["corpus", "--out", str(tmp_path / "a_file" / "corpus"), "--ops", "asentmax_scale"]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_sys_exit_inside_an_implementation_is_its_failure_and_the_report_prints(user_module, capsys):
    code, out, _ = run(capsys, "--impl", f"{user_module}:exits", "--alpha", "1.5", "--alpha", "2")
    assert code == 1
    assert out.count("FAIL exit") == 4 and "called sys.exit(3)" in out and "wall time" in out


def test_backend_run_reports_every_operation(capsys):
    code, out, _ = run(capsys, "--backends", "numpy", "--no-peers", "--seed", "3")
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 100
    for op in ("entmax a=1.25", "threshold a=3", "vjp a=2", "loss a=1", "asentmax a=1.5", "attention a=1.5",
               "attention vjp a=3"):
        assert op in out, op
    assert "wall time" in out


def test_impl_module_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """Like ``python -m``: ``--impl mod:fn`` finds mod.py in the working directory even
    when the console script's sys.path does not contain it."""
    (tmp_path / "cwd_impl.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    code, out, _ = run(capsys, "--impl", "cwd_impl:good", "--alpha", "2", "--dtype", "float64")
    assert code == 0, out
    assert str(tmp_path) not in __import__("sys").path  # nothing left behind


def test_table_has_an_error_over_tolerance_column_a_legend_and_progress_on_stderr(user_module, capsys):
    code, out, err = run(capsys, "--impl", f"{user_module}:good", "--alpha", "1.5", "--dtype", "float32")
    assert code == 0, out
    head = out.splitlines()[0].split()
    assert head == ["operation", "implementation", "dtype", "abs", "err", "ulps", "err/tol", "props", "verdict"]
    row = next(ln for ln in out.splitlines() if ln.startswith("entmax a=1.5"))
    used = float(row.split()[6])
    assert 0 < used <= 1  # float32 rounds: an error, within its budget
    assert "abs err: largest |actual - expected| (float64 reference)" in out
    assert "ulps: that over eps * max(1, |expected|)" in out
    assert "err/tol: largest error over its own budget" in out and "props: passed/run" in out
    # stdout is not a terminal here: progress is one plain line per job, on stderr
    assert err.startswith("[1/1 ") and "entmax [" in err and "\r" not in err
    code, out, err = run(capsys, "--impl", f"{user_module}:good", "--alpha", "2", "--no-progress")
    assert err == ""


def test_top_level_help_version_and_module_entry_point():
    import subprocess
    import sys

    from entmax_ref.cli import main as cli_main

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "entmax_ref", "--help"], capture_output=True, text=True, cwd=root,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: entmax-ref ")
    assert "``" not in res.stdout and "check " in res.stdout and 'pip install "entmax-ref[bench]"' in res.stdout
    res = subprocess.run([sys.executable, "-m", "entmax_ref", "--version"], capture_output=True, text=True, cwd=root,
                         timeout=120)
    import entmax_ref

    assert res.returncode == 0 and res.stdout.startswith(f"entmax-ref {entmax_ref.__version__}")
    assert cli_main(["nonsense"]) == 2
    for sub in ("check", "bench", "demo"):
        try:
            code = cli_main([sub, "--help"])
        except SystemExit as exc:  # argparse's own exit
            code = exc.code
        assert code == 0, sub


def test_bench_without_peers_names_the_extra(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name in ("torch", "entmax"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    from entmax_ref import bench

    assert bench.main([]) == 2
    assert 'pip install "entmax-ref[bench]"' in capsys.readouterr().err


@pytest.mark.numba
def test_bench_json_has_the_decoding_rows(tmp_path, monkeypatch, capsys):
    """The decoding case as a user calls it (checked) against its floor, one read of K and
    V (target <= 1.1x), and against SDPA (no target), and with check_finite=False against
    SDPA (<= 0.7x), in the table and the --json output (tiny sizes, two runs); every
    printed line at most 100 columns; the float32 matmul precision pinned while it runs,
    printed, and the caller's settings restored."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("entmax")
    import numba

    from entmax_ref import bench

    monkeypatch.setattr(bench, "GAP", bench.GAP)  # main() sets it from --gap
    before = numba.get_num_threads(), torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    path = tmp_path / "bench.json"
    try:
        assert bench.main(["--attention-only", "--no-eager", "--quick", "--attention-n", "32", "--decode-keys", "64",
                           "--gap", "0", "--runs", "2", "--threads", "1", "--json", str(path)]) == 0
        assert torch.get_float32_matmul_precision() == "medium"  # restored
        assert (numba.get_num_threads(), torch.get_num_threads()) == before[:2]
    finally:
        numba.set_num_threads(before[0])
        torch.set_num_threads(before[1])
        torch.set_float32_matmul_precision(before[2])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("entmax-ref bench on ") and max(map(len, lines)) <= 100, max(lines, key=len)
    assert "float32 matmul precision highest" in " ".join(lines[:4])
    data = json.loads(path.read_text())
    assert data["meta"]["float32_matmul_precision"] == "highest" and data["meta"]["runs"] == 2
    rows = {(r["case"], r["baseline"]): r for r in data["results"]}
    case = "decoding 1 query x 64 keys H=8 D=64 float32 alpha=1.5"
    floor = rows[case, "its floor: one read of K and V"]
    assert floor["target"] == "<= 1.1x floor time" and floor["met"] == (floor["time_ratio"] <= 1.1)
    sdpa = rows[case, "torch SDPA (softmax)"]
    assert sdpa["limit"] is None and sdpa["met"] is None
    assert sdpa["floor"].startswith("one read of K and V") and sdpa["floor_ms"] > 0
    assert sdpa["ours_over_floor"] > 0 and sdpa["baseline_over_floor"] > 0
    unchecked = rows[case + " check_finite=False", "torch SDPA (softmax)"]
    assert unchecked["target"] == "<= 0.7x SDPA time" and unchecked["met"] == (unchecked["time_ratio"] <= 0.7)
    assert "floor" not in unchecked
    for r in data["results"]:  # two runs each, the verdict on their median
        assert len(r["runs"]) == 2 and r["time_ratio"] == pytest.approx(sum(r["runs"]) / 2)
        assert r["spread"][0] <= min(r["runs"]) and max(r["runs"]) <= r["spread"][1]
    assert any(line.strip().startswith("runs: ") for line in lines)


@pytest.mark.numba
def test_bench_floors_compute_what_they_say():
    """The bench's floor kernels: the float64 exponentials of softmax (vexp_neg(x - max),
    the bits of vexp there), one read of every entry, and one read of every entry with one
    write of every output."""
    from entmax_ref import bench
    from numba_arrays import vexp_array

    exp_rows, read_rows, read_write_rows = bench._floors()
    x = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    m = x.max(axis=1).astype(np.float64)
    want = np.empty(300)
    vexp_array(x[4].astype(np.float64) - m[4], want)
    np.testing.assert_array_equal(exp_rows(x, m, 0, 5), want)  # the scratch holds the last row
    # a float32 sum of n terms in any order: within gamma_{n-1} sum |x| (u = 2^-24) of the exact one
    part = x[1:3].astype(np.float64)
    n, u = part.size, np.finfo(np.float32).eps / 2
    bound = (n - 1) * u / (1 - (n - 1) * u) * np.abs(part).sum()
    assert abs(read_rows(x, np.float32(0), 1, 3) - part.sum()) <= bound
    out = np.full_like(x, np.nan)
    read_write_rows(x, out, 1, 3)
    assert np.isnan(out[[0, 3, 4]]).all() and (out[1:3, 1:] == 0).all()  # rows 1, 2 written, zeros but one
    row = x[1].astype(np.float64)
    assert abs(out[1, 0] - row.sum()) <= (row.size - 1) * u / (1 - (row.size - 1) * u) * np.abs(row).sum()


def _rows(report):
    return [(r.op, r.impl, r.dtype, r.verdict, r.max_abs, r.max_ulps, r.props_passed, r.props_total, r.peer)
            for r in report.rows]


def test_peers_in_a_parallel_process_give_the_inline_rows():
    """With two CPUs the peers run in a child process (``check --backends ''``) beside the
    backends' rows; its rows are those of the peers run in the calling process."""
    pytest.importorskip("torch")
    pytest.importorskip("entmax")
    from entmax_ref.testing import peers
    from entmax_ref.testing.checks import CheckReport

    label, finish = peers.peers_in_a_process(2, "quick")
    inline = CheckReport()
    for _, job in peers.peer_jobs("quick", 2):
        inline.extend(job())
    child = finish()
    assert label == "peers (in a parallel process)"
    assert len(child.rows) > 10 and all(r.peer for r in child.rows)
    assert _rows(child) == _rows(inline)


def test_a_failed_peers_process_is_a_failing_peer_row(monkeypatch):
    from entmax_ref.testing import peers

    monkeypatch.setattr(peers.sys, "executable", "false")  # exits 1 at once, writes no report
    _, finish = peers.peers_in_a_process(0, "default")
    (row,) = finish().rows
    assert row.failed and row.peer and row.op == "peers"
    assert "ended with status 1 and no report" in row.notes[0]


def _table_rows(out):
    """The table's rows (before its legend) as lists of cells."""
    body = out.split("\n\n")[0].splitlines()[2:]
    return [line.split() for line in body if not line.startswith("peers ")]


def test_table_shows_nan_dashes_and_error_over_tolerance(user_module, capsys):
    """A newcomer reads the table right: NaN where the implementation returns NaN, '-'
    where nothing was measured, and each error as a fraction of its own tolerance."""
    code, out, _ = run(capsys, "--impl", f"{user_module}:good", "--alpha", "1.5")
    assert code == 0
    head = out.splitlines()[0].split()
    assert "err/tol" in head and "(ulps)" not in head
    for cells in _table_rows(out):
        used = float(cells[-3])  # err/tol of a passing row: at most 1
        assert 0 <= used <= 1 and cells[-1] == "PASS", cells
    code, out, _ = run(capsys, "--impl", f"{user_module}:nan_rows", "--alpha", "1.5")
    assert code == 1
    for cells in _table_rows(out):
        assert cells[4:7] == ["NaN", "NaN", "NaN"] and cells[-2:] == ["FAIL", "NaN"], cells
    code, out, _ = run(capsys, "--impl", f"{user_module}:missing", "--alpha", "1.5")
    assert code == 1
    (cells,) = _table_rows(out)
    assert cells[2:] == ["-", "-", "-", "-", "-", "FAIL", "import"], cells  # dtype, the figures, props


def test_an_implementation_failing_on_all_masked_rows_is_told_the_case_and_the_flag(user_module, capsys):
    code, out, _ = run(capsys, "--impl", f"{user_module}:no_masked_rows", "--alpha", "1.5")
    assert code == 1
    # the row says why it failed, beside its passing figures
    assert all(cells[-2:] == ["FAIL", "raised"] and float(cells[-4]) <= 1 for cells in _table_rows(out))
    out = " ".join(out.split())  # the failures block wraps its lines
    assert "[all-masked] raised IndexError: index -1 is out of bounds" in out
    assert "rows that are entirely -inf" in out and "--no-masked-rows" in out
    code, out, _ = run(capsys, "--impl", f"{user_module}:no_masked_rows", "--alpha", "1.5", "--no-masked-rows")
    assert code == 0, out


def test_the_reference_rows_run_while_the_kernels_compile_and_the_numba_rows_after(monkeypatch, capsys):
    """A cold check starts the numba kernels' compile in the background and runs the rows
    that need no kernel meanwhile; the numba rows wait for the compile to end."""
    import threading

    from entmax_ref.backends import numba_precompile
    from entmax_ref.testing import command
    from entmax_ref.testing.checks import CheckReport

    pytest.importorskip("numba")
    events: list[str] = []
    compiling = threading.Event()

    def compile_kernels(ops, jobs=None, methods=None, progress=None):
        compiling.wait(10)  # the compile ends only once a reference row has run
        events.append("compiled")
        return {"compiled": {}, "seconds": 0.0, "jobs": 1}

    def jobs(backend, size, seed):
        def job(i):
            events.append(f"{backend} {i}")
            compiling.set()
            return CheckReport()
        return [(f"{backend} {i}", lambda i=i: job(i)) for i in range(2)]

    monkeypatch.setattr(numba_precompile, "compile_kernels", compile_kernels)
    monkeypatch.setattr(command, "backend_jobs", jobs)
    assert main(["--quick", "--backends", "numpy,numba", "--no-peers", "--no-progress"]) == 0
    capsys.readouterr()
    assert events == ["numpy 0", "numpy 1", "compiled", "numba 0", "numba 1"]


def test_the_check_compiles_operations_the_kernels_declare():
    """Every operation whose kernels the check compiles first is one a kernel declares (an
    unknown one is an error, which the check raises after its reference rows)."""
    pytest.importorskip("numba")
    from entmax_ref.backends.numba_precompile import tasks
    from entmax_ref.testing.command import CHECK_OPS

    assert tasks(CHECK_OPS)


def test_a_compile_that_raises_stops_the_check_before_its_numba_rows(monkeypatch):
    """An error of the background compile is raised in the check's own thread when its
    numba rows start, not lost with the thread."""
    from entmax_ref.backends import numba_precompile
    from entmax_ref.testing import command
    from entmax_ref.testing.checks import CheckReport

    pytest.importorskip("numba")

    def compile_kernels(ops, jobs=None, methods=None, progress=None):
        raise ValueError("ops: unknown operation")

    monkeypatch.setattr(numba_precompile, "compile_kernels", compile_kernels)
    monkeypatch.setattr(command, "backend_jobs", lambda b, size, seed: [(b, CheckReport)])
    with pytest.raises(ValueError, match="unknown operation"):
        main(["--quick", "--backends", "numpy,numba", "--no-peers", "--no-progress"])
