"""The ``entmax-ref check`` command: --impl, --json, exit status, and bad usage."""

from __future__ import annotations

import json
import textwrap

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
    assert {"max_abs", "max_ulps", "props_passed", "verdict", "notes"} <= set(data["rows"][0])


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


def test_command_line_errors_exit_2(capsys):
    assert main(["--features", "nonsense"]) == 2
    assert main(["--op", "nonsense"]) == 2
    capsys.readouterr()


def test_backend_run_reports_every_operation(capsys):
    code, out, _ = run(capsys, "--backends", "numpy", "--no-peers", "--seed", "3")
    assert code == 0, out
    for op in ("entmax a=1.25", "threshold a=3", "vjp a=2", "loss a=1", "asentmax a=1.5", "attention a=1.5",
               "attention vjp a=3"):
        assert op in out, op
    assert "wall time" in out
