"""The public surface: names, errors, dtypes, no mutation, backend selection, imports."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends import BackendUnavailableError

ROW_FUNCS = [
    ("softmax", lambda x, **kw: er.softmax(x, **kw)),
    ("sparsemax", lambda x, **kw: er.sparsemax(x, **kw)),
    ("entmax15", lambda x, **kw: er.entmax15(x, **kw)),
    ("entmax", lambda x, **kw: er.entmax(x, 1.3, **kw)),
    ("threshold", lambda x, **kw: er.entmax_threshold(x, 1.3, **kw)),
    ("loss", lambda x, **kw: er.entmax_loss(x, np.zeros(x.shape[:-1], int), 1.3, **kw)),
]


def test_import_does_not_load_numba_or_cupy():
    """Nor torch, JAX or ml_dtypes: framework arrays are recognised by their type's module."""
    code = "import sys, numpy as np, entmax_ref as er; er.softmax([1.0, 2.0], backend='numpy'); " \
           "er.attention(*[np.ones((1, 1, 1, 1))] * 3, backend='numpy'); " \
           "print(sorted(m for m in ('numba', 'cupy', 'torch', 'jax', 'ml_dtypes') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name,fn", ROW_FUNCS)
@pytest.mark.parametrize("bad,where", [(np.nan, "NaN"), (np.inf, "+inf")])
def test_nan_and_posinf_rejected_with_location(backend, name, fn, bad, where):
    x = np.zeros((2, 4))
    x[1, 2] = bad
    x[1, 3] = bad
    with pytest.raises(ValueError, match=r"contains 2 NaN or \+inf values; the first is x\[1, 2\]"):
        fn(backend.asarray(x), backend=backend)


@pytest.mark.parametrize("alpha", [np.nan, np.inf, 0.999, -1.0])
def test_bad_alpha(backend, alpha):
    with pytest.raises(ValueError, match="alpha must be"):
        er.entmax(backend.asarray(np.zeros(3)), alpha, backend=backend)


def test_alpha_shape_mismatch(backend):
    with pytest.raises(ValueError, match=r"alpha of shape \(3,\) does not broadcast to the row shape \(2,\)"):
        er.entmax(backend.asarray(np.zeros((2, 4))), np.full(3, 1.5), backend=backend)


@pytest.mark.parametrize("axis", [-1, 0])
def test_alpha_per_row_in_the_keepdims_shape(axis):
    """alpha of x's shape with size 1 along the axis (``x.sum(axis, keepdims=True)``'s shape,
    as the entmax package takes it) is one alpha per row, like the row shape itself."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 6) if axis == -1 else (6, 3))
    rows = np.array([1.2, 1.5, 2.5])
    keep = rows[:, None] if axis == -1 else rows[None, :]
    g = rng.standard_normal(x.shape)
    p = er.entmax(x, rows, axis=axis)
    assert np.array_equal(er.entmax(x, keep, axis=axis), p)
    assert np.array_equal(er.entmax_vjp(p, g, keep, axis=axis), er.entmax_vjp(p, g, rows, axis=axis))
    assert np.array_equal(er.entmax_alpha_vjp(p, g, keep, axis=axis), er.entmax_alpha_vjp(p, g, rows, axis=axis))
    target = np.zeros(3, int)
    assert np.array_equal(er.entmax_loss(x, target, keep, axis=axis), er.entmax_loss(x, target, rows, axis=axis))
    assert np.array_equal(er.normmax(x, keep, axis=axis), er.normmax(x, rows, axis=axis))
    assert np.array_equal(er.budget_sparsemax(x, keep + 0.5, axis=axis), er.budget_sparsemax(x, rows + 0.5, axis=axis))
    assert np.array_equal(er.asentmax(x, keep, beta=0.5, gamma=1.0, axis=axis),
                          er.asentmax(x, rows, beta=0.5, gamma=1.0, axis=axis))
    with pytest.raises(ValueError, match="nor has the input's shape with size 1 along the axis"):
        er.entmax(x, np.repeat(keep, 2, axis=axis), axis=axis)


@pytest.mark.parametrize("backend_name", ["numpy", "numba", "auto"])
@pytest.mark.parametrize("dtype", [">f8", ">f4"])
def test_non_native_byte_order_is_computed_as_its_values(backend_name, dtype):
    """A big-endian (non-native) float64 is float64 for every function: the same bits as the
    native array, returned natively; 65 rows of 64 send ``auto`` to numba."""
    if backend_name == "numba":
        pytest.importorskip("numba")
    native = np.dtype(dtype).newbyteorder("=")
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((65, 64)), rng.standard_normal((65, 64))
    q, k, v, do = (rng.standard_normal((1, 2, 9, 4)) for _ in range(4))
    kw = dict(alpha=1.5, causal=True, backend=backend_name)

    def run(t):
        p = er.entmax(t(x), 1.5, backend=backend_name)
        out, info = er.attention(t(q), t(k), t(v), return_info=True, **kw)
        return (p, er.entmax_vjp(p, t(g), 1.5, backend=backend_name), er.entmax_threshold(t(x), 1.25),
                er.entmax_loss(t(x), np.zeros(65, int), 2.0), out,
                *er.attention_vjp(t(do), t(q), t(k), t(v), info=info, **kw)[:3])

    for got, want in zip(run(lambda a: a.astype(dtype)), run(lambda a: a.astype(native)), strict=True):
        assert got.dtype == want.dtype and got.dtype.isnative
        assert np.array_equal(got, want)


def test_error_messages_show_numbers_not_numpy_reprs():
    x = np.zeros((2, 3))
    cases = [(lambda: er.entmax(x, np.array([0.5, 2.0])), "got 0.5"),
             (lambda: er.entmax(x, np.array([np.nan, 2.0])), "got nan"),
             (lambda: er.entmax(np.array([1.0, np.nan], np.float32)), "x[1] = nan"),
             (lambda: er.budget_sparsemax(x, np.float64(9.0)), "budget = 9.0"),
             (lambda: er.attention(*[np.ones((1, 1, 2, 2))] * 3, alpha=np.True_), "got True"),
             (lambda: er.attention(*[np.ones((1, 1, 2, 2))] * 3, scale=np.ones(2)), "got array("),
             (lambda: er.attention(*[np.ones((1, 1, 2, 2))] * 3, causal=np.int64(1)), "got 1"),
             (lambda: er.attention(*[np.ones((1, 1, 2, 2))] * 3, chunk=np.int64(0)), "got 0")]
    for call, shown in cases:
        with pytest.raises((ValueError, TypeError)) as exc:
            call()
        assert shown in str(exc.value) and "np." not in str(exc.value), str(exc.value)


def test_axis_out_of_range(backend):
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        er.entmax(backend.asarray(np.zeros((2, 4))), 1.5, axis=2, backend=backend)


def test_vjp_shape_mismatch_names_shapes(backend):
    with pytest.raises(ValueError, match=r"p has shape \(2, 3\) but grad has shape \(2, 4\)"):
        er.entmax_vjp(backend.asarray(np.zeros((2, 3))), backend.asarray(np.zeros((2, 4))), backend=backend)


@pytest.mark.parametrize("dtype", [np.complex128, np.bool_, object, "U3"])
def test_bad_dtypes(dtype):
    with pytest.raises(TypeError):
        er.entmax(np.zeros(3, dtype=dtype), backend="numpy")


@pytest.mark.parametrize("dtype,out", [(np.float64, np.float64), (np.float32, np.float32),
                                       (np.float16, np.float16), (np.int32, np.float64), (np.int64, np.float64)])
def test_dtype_policy(backend, dtype, out):
    x = np.array([[1, 2, 3, -1]], dtype=dtype)
    p = er.entmax15(backend.asarray(x), backend=backend)
    assert p.dtype == out
    ref = er.entmax15(x.astype(np.float64), backend="numpy")
    np.testing.assert_allclose(backend.numpy(p).astype(np.float64), ref, rtol=0, atol=float(np.finfo(out).eps) * 4)


def test_bfloat16_when_available(backend):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed")
    x = np.array([0.5, 0.0, -2.0], dtype=ml_dtypes.bfloat16)
    p = er.sparsemax(backend.asarray(x), backend=backend)
    assert p.dtype == x.dtype
    np.testing.assert_allclose(backend.numpy(p).astype(np.float64), [0.75, 0.25, 0.0])


@pytest.mark.parametrize("name,fn", ROW_FUNCS)
def test_inputs_never_written_read_only_included(backend, name, fn):
    x = np.random.default_rng(0).standard_normal((3, 5))
    x[0, 1] = -np.inf
    x.setflags(write=False)
    before = x.copy()
    fn(backend.asarray(x), backend=backend)
    np.testing.assert_array_equal(x, before)


def test_gradients_do_not_write_inputs(backend):
    p = er.entmax15(np.random.default_rng(1).standard_normal((2, 5)))
    g = np.random.default_rng(2).standard_normal((2, 5))
    p.setflags(write=False)
    g.setflags(write=False)
    pc, gc = p.copy(), g.copy()
    er.entmax_vjp(backend.asarray(p), backend.asarray(g), 1.5, backend=backend)
    er.entmax_alpha_vjp(backend.asarray(p), backend.asarray(g), 1.5, backend=backend)
    np.testing.assert_array_equal(p, pc)
    np.testing.assert_array_equal(g, gc)


def test_info_fields_have_row_shape(backend):
    x = np.random.default_rng(0).standard_normal((2, 3, 7))
    _, info = er.entmax(backend.asarray(x), 1.7, axis=1, backend=backend, return_info=True)
    for field in ("tau", "support", "n_iter", "converged"):
        assert getattr(info, field).shape == (2, 7), field


def test_all_masked_row_conventions(backend):
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    for alpha in (1.0, 1.5, 2.0, 3.0):
        p, info = er.entmax(backend.asarray(x), alpha, backend=backend, return_info=True)
        p = backend.numpy(p)
        assert p.tolist() == [[0.0, 0.0], [1.0, 0.0]]
        assert np.isneginf(backend.numpy(info.tau)[0]) and backend.numpy(info.support).tolist() == [0, 1]
        g = er.entmax_vjp(backend.asarray(p), backend.asarray(np.ones_like(p)), alpha, backend=backend)
        assert np.all(backend.numpy(g) == 0)


# ------------------------------------------------------------------ backend selection
def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="unknown backend 'nope'; valid names: cupy, numba, numpy"):
        er.entmax([1.0], backend="nope")
    with pytest.raises(ValueError, match="unknown backend"):
        with er.use_backend("nope"):
            pass


def test_unavailable_backend_is_an_import_error_with_reason():
    if "cupy" in er.available_backends():
        pytest.skip("cupy is available here")
    with pytest.raises(BackendUnavailableError, match="backend 'cupy' is unavailable: ") as exc:
        er.entmax([1.0], backend="cupy")
    assert isinstance(exc.value, ImportError)


def test_use_backend_context_and_env(monkeypatch):
    seen = []

    class Spy:
        name = "spy"

        def owns(self, x):
            return isinstance(x, np.ndarray)

        def entmax_forward(self, x, alpha, method):
            seen.append("spy")
            return er.get_backend("numpy").entmax_forward(x, alpha, method)

    er.backends.register_backend("spy", Spy)
    try:
        with er.use_backend("spy"):
            er.sparsemax([1.0, 2.0])
        assert seen == ["spy"]
        er.sparsemax([1.0, 2.0])  # outside the context: not the spy
        assert seen == ["spy"]
        monkeypatch.setenv("ENTMAX_REF_BACKEND", "spy")
        er.sparsemax([1.0, 2.0])
        assert seen == ["spy", "spy"]
        er.sparsemax([1.0, 2.0], backend="numpy")  # the argument beats the environment
        assert seen == ["spy", "spy"]
    finally:
        er.backends._REGISTRY.pop("spy")
        er.backends._instances.pop("spy", None)


def test_use_backend_is_thread_local():
    results = {}
    barrier = threading.Barrier(2)

    def worker(name):
        with er.use_backend(name):
            barrier.wait()
            results[name] = er.backends._current.get()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("numpy", "auto")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"numpy": "numpy", "auto": "auto"}


def test_auto_picks_a_cpu_backend_for_numpy():
    # at every size: numba where its kernels are compiled, else the reference
    # (tests/test_autocompile.py), or the reference alone without numba
    names = ("auto", "numpy") if "numba" in er.available_backends() else ("numpy",)
    for arrays in ((np.zeros(3),), (np.zeros(3), np.zeros((2, 8192)))):
        assert er.backends.resolve_backend(None, *arrays).name in names
    assert er.backends.resolve_backend("numba", np.zeros(2)).name == "numba"


def test_a_first_small_call_compiles_nothing(tmp_path):
    """The first call of a transform after install takes seconds, not minutes."""
    import subprocess
    import sys
    import time

    code = ("import time, sys; t = time.perf_counter(); import entmax_ref as er; "
            "p = er.entmax15([[1.0, 2.0, 0.5]] * 8); "
            "print(time.perf_counter() - t, 'numba' in sys.modules, p[0].tolist())")
    env = {**__import__("os").environ, "ENTMAX_REF_CACHE_DIR": str(tmp_path)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]), timeout=300)
    assert out.returncode == 0, out.stderr
    seconds, numba_imported, row = out.stdout.split(" ", 2)
    assert numba_imported == "False"
    assert float(seconds) < 5.0, f"first call took {seconds} s (wall {time.perf_counter() - t0:.1f} s)"
    assert abs(sum(__import__("ast").literal_eval(row)) - 1.0) < 1e-15


def test_arrays_are_never_moved_between_devices():
    class GpuOnly:
        name = "gpu-only"

        def owns(self, x):
            return False

    with pytest.raises(TypeError, match="backend 'gpu-only' cannot compute on numpy.ndarray arrays"):
        er.backends.resolve_backend(GpuOnly(), np.zeros(2))


def test_method_errors():
    with pytest.raises(NotImplementedError, match="method='sort' exists only for alpha in"):
        er.entmax([1.0, 2.0], 1.3, method="sort", backend="numpy")
    with pytest.raises(ValueError, match="unknown method 'halley' for entmax_forward on the numpy backend"):
        er.entmax([1.0, 2.0], 1.3, method="halley", backend="numpy")


def test_public_names():
    for name in er.__all__:
        assert hasattr(er, name), name
    assert {"softmax", "sparsemax", "entmax15", "entmax", "entmax_threshold", "entmax_vjp",
            "entmax_alpha_vjp", "entmax_jacobian", "entmax_loss", "entmax_loss_grad",
            "available_backends", "use_backend"} <= set(er.__all__)


def test_env_var_unknown_backend(monkeypatch, capsys):
    monkeypatch.setenv("ENTMAX_REF_BACKEND", "bogus")
    want = r"ENTMAX_REF_BACKEND='bogus' names no backend; valid values: auto, cupy, numba, numpy"
    with pytest.raises(ValueError, match=want) as err:
        er.entmax([1.0])
    assert "\n" not in str(err.value)
    from entmax_ref.cli import main

    for argv in ([], ["example"], ["check", "--quick"]):
        assert main(argv) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and "Traceback" not in out.err
        assert re.search(want, out.err), out.err
    assert main(["check", "--help"]) == 0  # help needs no engine
    capsys.readouterr()


def test_unknown_command_lists_every_command(capsys):
    from entmax_ref.cli import _SUBCOMMANDS, main

    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'; choose from: example, " in err
    assert all(name in err for name in _SUBCOMMANDS)


def test_finite_inputs_near_the_float_max_raise_no_warning():
    """check_finite's one-pass scan may overflow on valid input: no warning, no error
    (pyproject turns warnings into errors)."""
    big = np.array([1e308, 1e308])
    np.testing.assert_array_equal(er.entmax_vjp([0.5, 0.5], big), [0.0, 0.0])
    np.testing.assert_array_equal(er.normmax_vjp([0.5, 0.5], big), [0.0, 0.0])
    q = np.zeros((1, 1, 2, 2), np.float16)
    v = np.full((1, 1, 3, 2), 60000.0, np.float16)  # sums beyond float16's 65504
    out = er.attention(q, np.zeros((1, 1, 3, 2), np.float16), v, backend="numpy")
    assert out.dtype == np.float16 and (out == np.float16(60000.0)).all()
    g = er.attention_vjp(np.full((1, 1, 2, 2), 1e307), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 2)),
                         np.ones((1, 1, 3, 2)), backend="numpy")
    # p = 1/3 rebuilt from the rounded tau: within an ulp of it, dv within two of 2e307/3
    np.testing.assert_allclose(g.dv, np.full((1, 1, 3, 2), 2e307 / 3), rtol=2 * np.finfo(np.float64).eps, atol=0)
    with pytest.raises(ValueError, match=r"x\[0, 1\] = "):  # a real +inf is still found
        er.softmax(np.array([[1e308, np.inf, 1e308]]))
