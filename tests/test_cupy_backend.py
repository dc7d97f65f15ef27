"""The cupy backend's kernels on a GPU, against the NumPy reference.

Skipped with a reason without CuPy or a CUDA device; ``--require-backends cupy`` (see
conftest.py) is how a GPU job makes sure this file did not silently skip.  The numerical
core of every kernel is also tested on the CPU (test_cuda_core.py); this file catches what
only a GPU can: indexing, shared memory, warp/block reductions, launches, the chunked
attention driver around cuBLAS.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cases import ALPHAS, EPS64, rows
from entmax_ref.backends import AttentionSpec, get_backend, unavailable_reason
from agreement import core_alpha_vjp_tolerance, core_vjp_tolerance, float64_support
from agreement import core_p_tolerance as p_tol
from agreement import core_theta_tolerance as theta_tol

pytestmark = pytest.mark.cuda

cupy = None  # imported by the gpu fixture, so that collection works without cupy

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module", autouse=True)
def gpu(request):
    """The cupy backend; skipped with the reason when it cannot run here, a failure
    instead when cupy is in --require-backends."""
    global cupy
    reason = unavailable_reason("cupy")
    if reason is not None:
        required = {s.strip() for s in request.config.getoption("--require-backends").split(",")}
        if "cupy" in required:
            pytest.fail(f"required backend 'cupy' is unavailable: {reason}")
        pytest.skip(f"cupy: {reason}")
    import cupy as cupy_module

    cupy = cupy_module
    return get_backend("cupy")


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy")


X = rows(3, seed=7)
LONG = np.random.default_rng(3).standard_normal((6, 5000))  # block-per-row kernels
LONG[1, ::3] = -np.inf
LONG[2] += 1e6


def _check_forward(gpu, ref, x, alpha, method=None):
    want = ref.entmax_forward(x, alpha, method)
    got = gpu.entmax_forward(cupy.asarray(x), cupy.asarray(alpha), method)
    assert all(isinstance(a, cupy.ndarray) for a in got)
    p, theta, support, _, conv = (a.get() for a in got)
    assert p.dtype == x.dtype and theta.dtype == np.float64 and support.dtype == np.int64
    assert conv.all()
    np.testing.assert_array_equal(support, float64_support(want, x, alpha))
    live = np.isfinite(want.theta)
    np.testing.assert_array_equal(np.isfinite(theta), live)
    x64 = x.astype(np.float64)
    assert (np.abs(theta - want.theta)[live] <= theta_tol(x64, want.theta)[live]).all()
    p_ref = want.p.astype(np.float64)
    err = np.abs(p.astype(np.float64) - p_ref)
    assert (err <= p_tol(x64, want.theta, p_ref, alpha, x.dtype)).all(), err.max()


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("data", ["rows", "long"])
def test_forward_f64(gpu, ref, alpha, data):
    x = X if data == "rows" else LONG
    _check_forward(gpu, ref, x, np.full(len(x), alpha))


@pytest.mark.parametrize("alpha", (1.0, 1.25, 1.5, 2.0, 3.0))
def test_forward_f32(gpu, ref, alpha):
    with np.errstate(over="ignore"):
        x = X.astype(np.float32)
    _check_forward(gpu, ref, x, np.full(len(x), alpha))


@pytest.mark.parametrize("alpha", (1.25, 3.0))
def test_forward_bisect(gpu, ref, alpha):
    x = X[::4]
    _check_forward(gpu, ref, x, np.full(len(x), alpha), "bisect")


def test_forward_per_row_alpha_and_float16(gpu, ref):
    alpha = np.resize(np.array(ALPHAS), len(X))
    _check_forward(gpu, ref, X, alpha)
    x16 = cupy.asarray(np.clip(X[:40], -100, 100).astype(np.float16))
    got = gpu.entmax_forward(x16, cupy.full(40, 1.5), None)
    assert got.p.dtype == np.float16
    want = ref.entmax_forward(x16.get().astype(np.float32), np.full(40, 1.5), None)
    np.testing.assert_array_equal(got.support.get(), want.support)


def test_sort_and_newton_are_not_gpu_methods(gpu):
    for method in ("sort", "newton"):
        with pytest.raises(NotImplementedError, match=f"'{method}' exists on: "):
            gpu.entmax_forward(cupy.zeros((1, 3)), cupy.ones(1), method)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("data", ["rows", "long"])
def test_vjps(gpu, ref, alpha, data):
    x = X if data == "rows" else LONG
    a = np.full(len(x), alpha)
    p = ref.entmax_forward(x, a, None).p
    g = np.random.default_rng(5).standard_normal(p.shape)
    dx = gpu.entmax_vjp(cupy.asarray(p), cupy.asarray(g), cupy.asarray(a)).get()
    assert (np.abs(dx - ref.entmax_vjp(p, g, a)) <= core_vjp_tolerance(p, g, a)).all()
    da = gpu.entmax_alpha_vjp(cupy.asarray(p), cupy.asarray(g), cupy.asarray(a)).get()
    assert (np.abs(da - ref.entmax_alpha_vjp(p, g, a)) <= core_alpha_vjp_tolerance(p, g, a)).all()


# ---------------------------------------------------------------------- attention
def _problem(rng, B, Hq, Hkv, Nq, Nk, D, dtype):
    q = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    do = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    return q, k, v, do


def _attn_tol(q, k, v, spec, eps):
    """Bound on |output error|: each score is a length-D dot product (error <= D eps times
    sum |q_d k_d|), the threshold moves with the scores, a probability moves by at most
    u (dz + dtheta) with u <= max p^(2-alpha), and each output sums Nk products."""
    D, Nk = q.shape[-1], k.shape[-2]
    s = 1.0 if spec.row_scale is None else float(np.max(np.abs(spec.row_scale)))
    z = spec.scale * s * D * float(np.abs(q).max()) * float(np.abs(k).max())
    u_max = 1.0 if spec.alpha <= 2 else 1.0 / eps  # alpha > 2: not exercised here
    return 8 * eps * (D * z * u_max + Nk) * float(np.abs(v).max())


SPECS = {
    "plain-1.5": dict(alpha=1.5),
    "causal-2-gqa": dict(alpha=2.0, causal=True),
    "softmax-alibi": dict(alpha=1.0, alibi=True),
    "1.25-lengths-rowscale": dict(alpha=1.25, lengths=True, row_scale=True),
    "causal-1.5-all": dict(alpha=1.5, causal=True, alibi=True, lengths=True, row_scale=True),
}


@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("case", sorted(SPECS))
@pytest.mark.parametrize("Nk", (48, 1500))  # warp- and block-per-row kernels
def test_attention_forward_backward(gpu, ref, case, Nk, dtype):
    cfg = SPECS[case]
    rng = np.random.default_rng(11)
    B, Hq, Hkv, Nq, D = 2, 4, 2, 37, 16
    q, k, v, do = _problem(rng, B, Hq, Hkv, Nq, Nk, D, dtype)
    spec = AttentionSpec(
        alpha=cfg["alpha"], scale=D ** -0.5, causal=cfg.get("causal", False),
        key_lengths=np.array([Nk, Nk // 2 + 1]) if cfg.get("lengths") else None,
        alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0]) if cfg.get("alibi") else None,
        row_scale=1.0 + rng.random((B, Hq, Nq)) if cfg.get("row_scale") else None,
        chunk=10,  # several chunks, the last one short
    )
    want = ref.attention_forward(q, k, v, spec)
    dev = [cupy.asarray(a) for a in (q, k, v, do)]
    got = gpu.attention_forward(*dev[:3], spec)
    eps = EPS64 if dtype == np.float64 else EPS32
    tol = _attn_tol(q, k, v, spec, eps)
    np.testing.assert_array_equal(got.support.get(), want.support)
    assert np.abs(got.out.get().astype(np.float64) - want.out.astype(np.float64)).max() <= tol
    assert np.abs(got.skew.get() - want.skew).max() <= tol
    live = np.isfinite(want.theta)
    np.testing.assert_array_equal(np.isfinite(got.theta.get()), live)
    gw = ref.attention_backward(do, q, k, v, want, want.skew, spec)
    for skew in (got.skew, None):  # with the kept skewed output, and recomputing it
        gg = gpu.attention_backward(dev[3], *dev[:3], got, skew, spec)
        for name in ("dq", "dk", "dv"):
            a, b = getattr(gg, name).get().astype(np.float64), getattr(gw, name).astype(np.float64)
            scale = max(1.0, float(np.abs(do).max()) * Nq)
            assert np.abs(a - b).max() <= tol * scale, name
        if spec.row_scale is not None:
            assert np.abs(gg.drow_scale.get() - gw.drow_scale).max() <= tol * max(1.0, Nk * D)


def test_attention_empty_rows(gpu, ref):
    """Causal with fewer keys than queries and a zero key length: empty rows are zeros."""
    rng = np.random.default_rng(2)
    q, k, v, do = _problem(rng, 2, 2, 2, 20, 8, 8, np.float64)
    spec = AttentionSpec(alpha=1.5, scale=0.3, causal=True, key_lengths=np.array([8, 0]))
    got = gpu.attention_forward(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), spec)
    want = ref.attention_forward(q, k, v, spec)
    np.testing.assert_array_equal(got.support.get(), want.support)
    assert np.isneginf(got.theta.get()[1]).all() and (got.out.get()[1] == 0).all()


def test_attention_key_padding_runs(gpu, ref):
    """A key mask with one run of keys per batch (left padding, left and right, none
    left) runs per batch on the key-sliced problem: the reference's answers, gradients
    included; a mask with holes is a ValueError."""
    rng = np.random.default_rng(5)
    B, Hq, Hkv, Nq, Nk, D = 3, 4, 2, 21, 30, 16
    q, k, v, do = _problem(rng, B, Hq, Hkv, Nq, Nk, D, np.float64)
    mask = np.ones((B, Nk), bool)
    mask[0, :7] = False
    mask[1, :3] = False
    mask[1, 25:] = False
    mask[2, :] = False
    spec = AttentionSpec(alpha=1.5, scale=D ** -0.5, causal=True, key_lengths=np.array([Nk, 28, Nk]),
                         alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0]), key_mask=mask, chunk=8)
    want = ref.attention_forward(q, k, v, spec)
    dev = [cupy.asarray(a) for a in (q, k, v, do)]
    got = gpu.attention_forward(*dev[:3], spec)
    tol = _attn_tol(q, k, v, spec, EPS64)
    np.testing.assert_array_equal(got.support.get(), want.support)
    assert np.abs(got.out.get() - want.out).max() <= tol
    gw = ref.attention_backward(do, q, k, v, want, want.skew, spec)
    gg = gpu.attention_backward(dev[3], *dev[:3], got, got.skew, spec)
    for name in ("dq", "dk", "dv"):
        assert np.abs(getattr(gg, name).get() - getattr(gw, name)).max() <= tol * max(1.0, float(np.abs(do).max()) * Nq)
    holes = mask.copy()
    holes[0, 12] = False
    from dataclasses import replace

    with pytest.raises(ValueError, match="holes"):
        gpu.attention_forward(*dev[:3], replace(spec, key_mask=holes))


def test_no_silent_transfers(gpu):
    """NumPy arrays are not accepted as data: the registry refuses them for cupy."""
    from entmax_ref.backends import resolve_backend

    with pytest.raises(TypeError, match="move the data explicitly"):
        resolve_backend("cupy", np.zeros((2, 3)))


def test_warmup_compiles_everything(gpu):
    gpu.warmup()


def test_cupy_gives_nvrtc_the_options_the_loader_declares(gpu, monkeypatch):
    """What NVRTC receives through the installed CuPy's RawModule is
    ``_cuda_loader.nvrtc_options`` (the list the NVRTC test and the emulator compile with),
    apart from the include folders of CuPy's own headers."""
    from cupy.cuda import compiler

    from entmax_ref.backends import _cuda_loader as L

    seen = []
    real = compiler._NVRTCProgram.compile

    def spy(self, options=(), *args, **kwargs):
        seen.append(tuple(options))
        return real(self, options, *args, **kwargs)

    monkeypatch.setattr(compiler._NVRTCProgram, "compile", spy)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")  # compile now, not from CuPy's disk cache
    source = "family_rows.cu"
    cupy.RawModule(code=L.read_source(source), options=(*L.OPTIONS, f"-I{L.cuda_dir()}"),
                   name_expressions=list(L.name_expressions(source))).compile()
    (options,) = seen
    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    assert f"-I{L.cuda_dir()}" in options
    assert [o for o in options if not o.startswith("-I")] == [o for o in L.nvrtc_options(arch) if not o.startswith("-I")]
