"""Every public function with ``backend="cupy"``, end to end on the emulated GPU.

The CuPy stand-in (tests/cuda_emu/) is installed as ``cupy``; inputs are moved to it, the
public layer dispatches to the unchanged cupy backend, whose kernels run under emulation,
and the results come back through ``.get()``.  The oracle assertions of
:mod:`entmax_ref.testing` check the row transforms and attention (formula 5 budgets);
the other functions are checked against the NumPy engine's answer, within the agreement
budget of two engines that each solve to a few ulps per entry of the row
(:func:`_agreement`).  Every test runs with the default launch parameters and with
block-per-row kernels for every row (``CupyTuning(warp_max_n=0, block=64)``).  Small
shapes: the emulator runs every CUDA thread.

The CUDA engine scores attention as the CPU engines do, in float64, so the supports are
theirs for every input dtype: rows with a key within 4e-8 of the support's edge, in
float32, give the NumPy engine's supports on every row (:func:`test_near_tie_supports`);
``CUPY_TF32=1`` changes nothing, and the backward keeps the edge of an alpha > 2 row when
it scores the keys an ulp differently from the forward.
"""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as er
from conftest import BackendName
from cuda_cases import near_tie_problem, threshold_rows
from cuda_emu import stand_in_cupy
from entmax_ref.testing import (assert_attention_close, assert_attention_grads_close, assert_entmax_close,
                                assert_entmax_vjp_close)
from entmax_ref.testing.tolerance import unit_roundoff

pytestmark = pytest.mark.cuda_emu

NUMPY = BackendName("numpy")


#: the launch parameters of each run of this file (CupyTuning's fields)
TUNINGS = {"default": None, "block": dict(warp_max_n=0, block=64)}


@pytest.fixture(scope="module", params=["default", "block"])
def gpu(request):
    with stand_in_cupy(tuning=TUNINGS[request.param]) as cupy:
        yield BackendName("cupy")
        launched = {n for m in cupy.MODULES.values() for n in m.launched}
        assert launched, "no kernel was launched"
        if request.param == "block":
            assert not any("_warp" in n for n in launched), sorted(launched)


def _agreement(want, n: int) -> np.ndarray:
    """Two engines' float64 answers differ by at most a few ulps per entry of a row of n
    (each sums n terms in its own order) relative to the answer's size."""
    return 16 * n * unit_roundoff(np.float64) * (1.0 + np.abs(want))


def _same(got, want, n):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    live = np.isfinite(want)
    assert (np.abs(got[live] - want[live]) <= _agreement(want[live], n)).all(), np.abs(got - want)[live].max()


RNG = np.random.default_rng(17)
X = RNG.standard_normal((3, 4, 20)) * 2
X[0, 1, ::3] = -np.inf
X[2, 3] = -np.inf
G = RNG.standard_normal(X.shape)
TARGET = np.eye(20)[RNG.integers(0, 20, (3, 4))]


def test_row_transforms_and_vjps(gpu):
    for dtype in (np.float64, np.float32):
        x = X.astype(dtype)
        for fn, alpha in ((er.softmax, 1.0), (er.entmax15, 1.5), (er.sparsemax, 2.0)):
            assert_entmax_close(gpu.call(fn, x), x, alpha)
        for alpha in (1.25, 3.0):
            p = gpu.call(er.entmax, x, alpha=alpha)
            assert p.dtype == dtype
            assert_entmax_close(p, x, alpha)
    x = X[1]
    alpha = np.array([1.0, 1.5, 2.0, 2.5])  # one alpha per row
    assert_entmax_close(gpu.call(er.entmax, x, alpha=alpha), x, alpha)
    assert_entmax_vjp_close(gpu.call(er.entmax_vjp, er.entmax(x, alpha=alpha), G[1], alpha=alpha), x, G[1], alpha)
    tau = gpu.call(er.entmax_threshold, X, alpha=1.5)
    _same(tau, er.entmax_threshold(X, alpha=1.5, backend="numpy"), X.shape[-1])
    for name in ("entmax_alpha_vjp",):
        a3 = np.full((3, 4), 1.7)
        p = er.entmax(X, alpha=a3, backend="numpy")
        _same(gpu.call(getattr(er, name), p, G, alpha=a3), getattr(er, name)(p, G, alpha=a3, backend="numpy"), 20)
    jac = gpu.call(er.entmax_jacobian, X[0, 0], alpha=1.5)
    _same(jac, er.entmax_jacobian(X[0, 0], alpha=1.5, backend="numpy"), 20)


def test_losses_normmax_budget(gpu):
    for fn, kw in ((er.entmax_loss, dict(alpha=1.5)), (er.entmax_loss_grad, dict(alpha=1.5)),
                   (er.normmax_loss, dict(alpha=2.0)), (er.normmax_loss_grad, dict(alpha=3.0))):
        _same(gpu.call(fn, X, TARGET, **kw), fn(X, TARGET, backend="numpy", **kw), 20)
    for alpha in (1.5, 2.0, 4.0):
        p = gpu.call(er.normmax, X, alpha=alpha)
        want = er.normmax(X, alpha=alpha, backend="numpy")
        _same(p, want, 20)
        _same(gpu.call(er.normmax_vjp, want, G, alpha=alpha), er.normmax_vjp(want, G, alpha=alpha, backend="numpy"), 20)
    for budget in (1.0, 3.0, 20.0):
        want = er.budget_sparsemax(X, budget=budget, backend="numpy")
        _same(gpu.call(er.budget_sparsemax, X, budget=budget), want, 20)
        _same(gpu.call(er.budget_sparsemax_vjp, want, G, budget=budget),
              er.budget_sparsemax_vjp(want, G, budget=budget, backend="numpy"), 20)


def test_asentmax_ssmax(gpu):
    kw = dict(alpha=1.5, beta=0.7, gamma=1.3)
    _same(gpu.call(er.asentmax, X, **kw), er.asentmax(X, backend="numpy", **kw), 20)
    p = er.asentmax(X, backend="numpy", **kw)
    got, want = gpu.call(er.asentmax_vjp, G, X, p=p, **kw), er.asentmax_vjp(G, X, p=p, backend="numpy", **kw)
    for a, b in zip(got, want):
        _same(a, b, 20 * X.size)
    _same(gpu.call(er.ssmax, X, beta=0.8), er.ssmax(X, beta=0.8, backend="numpy"), 20)


def _qkv(rng, B=2, Hq=4, Hkv=2, Nq=7, Nk=11, D=8):
    return (rng.standard_normal((B, Hq, Nq, D)), rng.standard_normal((B, Hkv, Nk, D)),
            rng.standard_normal((B, Hkv, Nk, D)), rng.standard_normal((B, Hq, Nq, D)))


ATTENTION = {
    "plain-gqa": dict(alpha=1.5),
    "causal-alibi": dict(alpha=2.0, causal=True, alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0])),
    "softmax-lengths": dict(alpha=1.0, key_lengths=np.array([11, 5])),
    "asentmax": dict(alpha=1.5, causal=True, beta=np.array([[0.5], [1.0], [1.5], [2.0]]), gamma=1.2),
    "alpha3-padding-mask": dict(alpha=3.0, key_padding_mask=np.arange(11)[None, :] >= np.array([[0], [4]])),
}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_attention_and_vjp(gpu, case):
    kw = ATTENTION[case]
    q, k, v, do = _qkv(np.random.default_rng(3))
    out, info = gpu.call(er.attention, q, k, v, return_info=True, chunk=3, **kw)
    assert_attention_close(out, q, k, v, **kw)
    grads = gpu.call(er.attention_vjp, do, q, k, v, chunk=3, **kw)
    assert_attention_grads_close(grads, do, q, k, v, **kw)


def test_attention_alpha_per_head(gpu):
    """Heads grouped by alpha (two groups read both key/value heads), with what is per head
    (ALiBi slope, ASEntmax beta) and a padding mask, against the NumPy engine."""
    kw = dict(alpha=np.array([1.5, 3.0, 1.0, 1.5]), causal=True, alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0]),
              beta=np.array([[0.5], [1.0], [1.5], [2.0]]), gamma=1.2,
              key_padding_mask=np.arange(11)[None, :] < np.array([[11], [8]]))
    q, k, v, do = _qkv(np.random.default_rng(5))
    _same(gpu.call(er.attention, q, k, v, chunk=3, **kw), er.attention(q, k, v, backend="numpy", **kw), 11 * 8)
    got = gpu.call(er.attention_vjp, do, q, k, v, chunk=3, **kw)
    want = er.attention_vjp(do, q, k, v, backend="numpy", **kw)
    for a, b in zip(got[:3], want[:3]):
        _same(a, b, 11 * 8 * 8)
    _same(got.dalpha, want.dalpha, 11 * 8 * 2 * 7)  # per head: a sum over 2 batches of 7 query rows


def test_attention_key_mask_with_holes(gpu):
    """A key_padding_mask with holes: without a causal bound or ALiBi the attendable keys
    move to the front (with ASEntmax, alpha per head, GQA), against the NumPy engine; with
    either, a ValueError that says so and where to go."""
    q, k, v, do = _qkv(np.random.default_rng(8))
    mask = np.ones((2, 11), bool)
    mask[0, [2, 3, 7]] = False
    mask[1, [0, 5, 10]] = False
    kw = dict(alpha=np.array([1.5, 3.0, 1.0, 1.5]), key_padding_mask=mask, key_lengths=np.array([11, 9]),
              beta=np.array([[0.5], [1.0], [1.5], [2.0]]), gamma=1.2)
    _same(gpu.call(er.attention, q, k, v, chunk=3, **kw), er.attention(q, k, v, backend="numpy", **kw), 11 * 8)
    got = gpu.call(er.attention_vjp, do, q, k, v, chunk=3, **kw)
    want = er.attention_vjp(do, q, k, v, backend="numpy", **kw)
    for a, b in zip(got, want):
        if b is not None:
            _same(a, b, 11 * 8 * 8 * 2 * 7)
    for bad in (dict(causal=True), dict(alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0]))):
        with pytest.raises(ValueError, match="with holes together with causal or ALiBi"):
            gpu.call(er.attention, q, k, v, alpha=1.5, key_padding_mask=mask, **bad)


def test_attention_varlen(gpu):
    rng = np.random.default_rng(6)
    cu_q, cu_k = np.array([0, 3, 8]), np.array([0, 5, 12])
    q, k, v = (rng.standard_normal((n, 2, 8)) for n in (8, 12, 12))
    do = rng.standard_normal(q.shape)
    for causal in (False, True):
        kw = dict(alpha=1.5, causal=causal)
        out = gpu.call(er.attention_varlen, q, k, v, cu_q, cu_k, **kw)
        want = er.attention_varlen(q, k, v, cu_q, cu_k, backend="numpy", **kw)
        _same(out, want, 12 * 8)
        got = gpu.call(er.attention_varlen_vjp, do, q, k, v, cu_q, cu_k, **kw)
        want = er.attention_varlen_vjp(do, q, k, v, cu_q, cu_k, backend="numpy", **kw)
        for a, b in zip(got[:3], want[:3]):
            _same(a, b, 12 * 8 * 8)


def test_device_parameters_and_diagnostics(gpu):
    """alpha as a device array, and the diagnostics of device probabilities (CuPy's
    reductions take no ``initial``)."""
    import cupy

    a = np.array([1.0, 1.5, 2.0, 2.5])
    p = er.entmax(cupy.asarray(X[1]), alpha=cupy.asarray(a), backend="cupy")
    _same(p.get(), er.entmax(X[1], alpha=a, backend="numpy"), 20)
    q = er.entmax(X[1], alpha=a, backend="numpy")
    _same(er.max_probability(cupy.asarray(q)).get(), er.max_probability(q), 20)
    d, want = er.row_diagnostics(cupy.asarray(q), positions=[1]), er.row_diagnostics(q, positions=[1])
    for name in ("normalized_entropy", "support", "max_prob", "mass"):
        _same(getattr(d, name).get(), getattr(want, name), 20)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(p)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_near_tie_supports(gpu, alpha):
    """400 float32 rows with a key within 4e-8 of the support's edge: the same support as
    the NumPy engine on every row (scores formed as float32 products differ on about one
    row in five)."""
    import cupy

    q, k, v, scale = near_tie_problem(alpha, seed=int(alpha * 10))
    _, want = er.attention(q, k, v, alpha=alpha, scale=scale, return_info=True, backend="numpy")
    _, info = er.attention(*(cupy.asarray(t) for t in (q, k, v)), alpha=alpha, scale=scale, return_info=True,
                           backend="cupy")
    differ = int((info.support.get() != want.support).sum())
    assert differ == 0, f"{differ} of {want.support.size} rows have another support than the NumPy engine's"


def test_tf32_changes_nothing(gpu, monkeypatch):
    """CUPY_TF32=1 makes CuPy's float32 products TF32 (10 mantissa bits; the stand-in
    rounds their operands so): the engine's products are all float64, so the near-tie rows
    keep the NumPy engine's supports and the outputs their bits."""
    import cupy

    q, k, v, scale = near_tie_problem(2.0, seed=3, B=20)
    dev = [cupy.asarray(t) for t in (q, k, v)]
    before = er.attention(*dev, alpha=2.0, scale=scale, backend="cupy").get()
    monkeypatch.setenv("CUPY_TF32", "1")
    del cupy.PRODUCTS[:]
    out, info = er.attention(*dev, alpha=2.0, scale=scale, return_info=True, backend="cupy")
    assert cupy.PRODUCTS and all(a == np.float64 and b == np.float64 for a, b in cupy.PRODUCTS), cupy.PRODUCTS
    assert out.get().tobytes() == before.tobytes()
    _, want = er.attention(q, k, v, alpha=2.0, scale=scale, return_info=True, backend="numpy")
    np.testing.assert_array_equal(info.support.get(), want.support)


def test_alpha_above_2_backward_keeps_a_rescored_edge(gpu):
    """For alpha > 2 the backward rebuilds p from the edge (row max m, edge c, its p): an
    entry whose score the backward computes a few ulps off the forward's (another product,
    another rounding) is still the edge entry, with its p, as in the NumPy engine; scored
    exactly at c - 4 ulps it would otherwise leave the support."""
    import cupy

    from entmax_ref.backends.exact_sums import matmul_rows

    rng = np.random.default_rng(21)
    B, Nk, D = 6, 12, 8
    q, k, v, do = (rng.standard_normal(s) for s in ((B, 1, 1, D), (B, 1, Nk, D), (B, 1, Nk, 3), (B, 1, 1, 3)))
    kw = dict(alpha=3.0, scale=0.5)
    _, info = er.attention(*(cupy.asarray(t) for t in (q, k, v)), return_info=True, backend="cupy", **kw)
    _, want_info = er.attention(q, k, v, return_info=True, backend="numpy", **kw)
    moved = k.copy()
    for b in range(B):  # the edge key of each problem, its score lowered by a few ulps
        z = 0.5 * matmul_rows(k[b, 0], q[b, 0, 0][:, None])[:, 0]  # the NumPy engine's scores (q . k correctly rounded)
        j = int(np.flatnonzero((z - z.max()) == want_info.edge[b, 0, 0])[0])
        d = int(np.argmax(np.abs(q[b, 0, 0])))
        for _ in range(4):
            moved[b, 0, j, d] = np.nextafter(moved[b, 0, j, d], -np.inf * np.sign(q[b, 0, 0, d]))
    got = er.attention_vjp(*(cupy.asarray(t) for t in (do, q, moved, v)), info=info, backend="cupy", **kw)
    want = er.attention_vjp(do, q, moved, v, info=want_info, backend="numpy", **kw)
    for a, b in zip(got[:3], want[:3]):
        _same(a.get(), b, Nk * D)


def test_the_gpu_check_script_runs(gpu, tmp_path):
    """scripts/gpu_bench.py, which scripts/gpu_check.sh runs on a GPU, on the stand-in:
    its identity cases, small, have the NumPy engine's supports on every row and, where the
    device's math is the CPU's, its float32 bits (the results rounded once from float64), a
    JUnit report folds into its JSON, and the run's verdict names what must not happen."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = bench.identity(small=True)
    assert len(cases) == 38 and all(c["entries"] > 0 for c in cases.values())
    assert sum(c.get("support_differs", 0) for c in cases.values()) == 0, cases
    assert all(c["bits_differ"] == 0 for c in cases.values() if c["dtype"] == "float32"), cases
    report = tmp_path / "tests.xml"
    report.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="2.5">'
                      '<testcase classname="tests.test_x" name="test_a"><failure message="assert 1 == 2"/></testcase>'
                      '</testsuite></testsuites>')
    got = bench.tests(report)
    assert got["tests"] == 3 and got["failures"] == 1 and got["failed"][0]["test"] == "tests.test_x::test_a"
    assert bench.problems({"device": {}, "compile": 1.0, "identity": cases, "bench": []}) == []
    one = next(iter(cases))
    found = bench.problems({"identity": {one: dict(cases[one], support_differs=2)}, "tests": got,
                            "bench": {"error": "RuntimeError: out of memory"}})
    assert found == ["bench: RuntimeError: out of memory", "GPU tests: 1 failed, 0 erred of 3",
                     f"identity {one}: 2 of {cases[one]['rows']} rows with another support"], found


def test_float32_rows_on_the_support_edge(gpu):
    """float32 rows with entries at the support's threshold and one or two float32 ulps
    either side (:func:`cuda_cases.threshold_rows`; exact probabilities of 0 and down to
    about 1e-33): the CPU engines' supports.  (Not their bits: a probability is a power of
    ``x_i - T``, so its relative error grows as it vanishes, and a sparsemax entry can be
    a float32 rounding midpoint exactly; the device's float64 threshold, a few ulps from
    the CPU's, rounds a few such entries to the neighbouring float32 value, docs/cuda.md.)"""
    for alpha in (1.25, 1.5, 2.0, 3.0):
        x = threshold_rows(alpha, 30, seed=int(alpha * 8))
        got = np.asarray(gpu.call(er.entmax, x, alpha=alpha))
        want, other = (er.entmax(x, alpha=alpha, backend=b) for b in ("numpy", "numba"))
        assert (want[:, 11:] > 0).any() and (want[:, 11:] == 0).any(), alpha  # edge entries on both sides
        np.testing.assert_array_equal(other > 0, want > 0)
        np.testing.assert_array_equal(got > 0, want > 0)
