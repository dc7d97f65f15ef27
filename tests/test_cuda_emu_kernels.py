"""Every CUDA kernel, executed on the CPU under emulation (tests/cuda_emu/).

The unchanged ``backends/cupy_backend.py`` runs on the CuPy stand-in: every kernel
template of ``backends/cuda/`` in float and double, with warp-per-row and block-per-row
teams (a small ``CupyTuning.warp_max_n`` sends short rows to the block kernels), on small
inputs checked against the NumPy reference with the project's tolerances; the emulated
teams agree bit for bit with the g++ harness's HostTeam<32> and HostTeam<256>, which
reproduce the warp's and the block's reduction orders; and the launcher refuses what a
GPU would get wrong (host arrays, argument kinds and sizes, blocks above
``__launch_bounds__``).
"""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cases import build_harness, family_rows, rows, tool_missing
from cuda_emu import stand_in_cupy
from cuda_emu.launcher import LaunchError
from entmax_ref.backends import AttentionSpec, _cuda_loader, get_backend
from entmax_ref.backends.numpy_family import budget_rows, budget_vjp_rows, normmax_rows, normmax_vjp_rows
from agreement import budget_agreement_tolerance, core_alpha_vjp_tolerance, core_vjp_tolerance
from agreement import core_p_tolerance as p_tol
from agreement import core_theta_tolerance as theta_tol
from agreement import family_threshold_agreement
from test_cuda_core import Harness

pytestmark = pytest.mark.cuda_emu

EPS = {np.float64: float(np.finfo(np.float64).eps), np.float32: float(np.finfo(np.float32).eps)}


@pytest.fixture(scope="module")
def cupy():
    with stand_in_cupy() as module:
        yield module


def _engine(team: str, block: int = 64):
    """The cupy backend with warp-per-row kernels for rows up to 1024 entries ("warp"), or
    block-per-row kernels of ``block`` threads for every row ("block")."""
    from entmax_ref.backends.cupy_backend import CupyBackend, CupyTuning

    if team == "warp":
        return CupyBackend(CupyTuning(warps_per_block=2))
    return CupyBackend(CupyTuning(warp_max_n=0, block=block))


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy")


X = rows(1, seed=11)[::5]  # random, tied, masked, offset and all -inf rows, up to 300 wide
#: one alpha per solver mode of the core (softmax, general below 2, 1.5, sparsemax, general
#: above 2); the core's sweep over alpha near 1 and large alphas is tests/test_cuda_core.py's
MODES = (1.0, 1.25, 1.5, 2.0, 3.0)


def _forward_ok(got, want, x, alpha):
    p, theta, support, _, conv = (a.get() for a in got)
    assert conv.all()
    np.testing.assert_array_equal(support, want.support)
    live = np.isfinite(want.theta)
    np.testing.assert_array_equal(np.isfinite(theta), live)
    x64 = x.astype(np.float64)
    assert (np.abs(theta[live] - want.theta[live]) <= theta_tol(x64, want.theta)[live]).all()
    p_ref = want.p.astype(np.float64)
    err = np.abs(p.astype(np.float64) - p_ref)
    assert (err <= p_tol(x64, want.theta, p_ref, alpha, x.dtype)).all(), err.max()


@pytest.mark.parametrize("team", ["warp", "block"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_entmax_row_kernels(cupy, launches, ref, team, dtype):
    gpu = _engine(team)
    with np.errstate(over="ignore"):
        x = X.astype(dtype)
    for alpha in MODES:
        a = np.full(len(x), alpha)
        bisect = alpha == 3.0 or (alpha == 1.25 and dtype == np.float64)
        for method in (None, "bisect") if bisect else (None,):
            want = ref.entmax_forward(x, a, method)
            _forward_ok(gpu.entmax_forward(cupy.asarray(x), a, method), want, x, a)
    a = np.full(len(x), 1.5)
    p = ref.entmax_forward(x.astype(np.float64), a, None).p
    g = np.random.default_rng(5).standard_normal(p.shape)
    dx = gpu.entmax_vjp(cupy.asarray(p.astype(dtype)), cupy.asarray(g.astype(dtype)), a).get()
    tol = core_vjp_tolerance(p, g, a) * (1.0 if dtype == np.float64 else EPS[np.float32] / EPS[np.float64])
    assert dx.dtype == dtype
    assert (np.abs(dx - ref.entmax_vjp(p, g, a)) <= tol).all()
    da = gpu.entmax_alpha_vjp(cupy.asarray(p.astype(dtype)), cupy.asarray(g.astype(dtype)), a).get()
    if dtype == np.float64:
        assert (np.abs(da - ref.entmax_alpha_vjp(p, g, a)) <= core_alpha_vjp_tolerance(p, g, a)).all()


def _family_batch(seed, dtype):
    return family_rows(seed, 12, 40).astype(dtype).astype(np.float64)


@pytest.mark.parametrize("team", ["warp", "block"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_family_row_kernels(cupy, launches, team, dtype):
    gpu = _engine(team)
    x = _family_batch(1, dtype)
    rtol = 1e-12 if dtype == np.float64 else 8 * EPS[np.float32]
    alpha = np.random.default_rng(2).uniform(1.1, 5.0, len(x))
    got = gpu.normmax_forward(cupy.asarray(x.astype(dtype)), alpha)
    want = normmax_rows(x, alpha)
    p, tau, sup, _, conv = (a.get() for a in got)
    assert conv.all() and p.dtype == dtype
    np.testing.assert_array_equal(sup, want.support)
    live = np.isfinite(want.theta)
    if dtype == np.float64:
        assert (np.abs(tau[live] - want.theta[live]) <= family_threshold_agreement(want.theta[live])).all()
    np.testing.assert_allclose(p, want.p, rtol=rtol, atol=rtol * 1e-2)
    g = np.random.default_rng(3).standard_normal(x.shape)
    dx = gpu.normmax_vjp(cupy.asarray(want.p.astype(dtype)), cupy.asarray(g.astype(dtype)), alpha).get()
    d0 = normmax_vjp_rows(want.p.astype(dtype).astype(np.float64), g.astype(dtype).astype(np.float64), alpha)
    np.testing.assert_allclose(dx, d0, rtol=rtol, atol=rtol * np.abs(d0).max())
    budget = np.random.default_rng(5).uniform(0, 40, len(x))
    budget[:4] = [0.0, 1.0, 2.0, 40.0]
    got = gpu.budget_forward(cupy.asarray(x.astype(dtype)), budget)
    want = budget_rows(x, budget)
    p, tau, sup, _, conv = (a.get() for a in got)
    assert conv.all()
    np.testing.assert_array_equal(np.isfinite(tau), np.isfinite(want.theta))
    tol = budget_agreement_tolerance(x, budget) * (1.0 if dtype == np.float64 else EPS[np.float32] / EPS[np.float64])
    assert (np.abs(p - want.p) <= np.maximum(tol, EPS[dtype] * 4)).all()
    dx = gpu.budget_vjp(cupy.asarray(want.p.astype(dtype)), cupy.asarray(g.astype(dtype))).get()
    np.testing.assert_allclose(dx, budget_vjp_rows(want.p.astype(dtype).astype(np.float64), g.astype(dtype)),
                               rtol=0, atol=1e-13 if dtype == np.float64 else 8 * EPS[np.float32])


def _attn_tol(q, k, v, spec, eps):
    """Bound on |output error| (as tests/test_cupy_backend.py derives it): a score is a
    length-D dot product, the threshold moves with the scores, a probability moves by at
    most u (dz + dtheta), and each output sums Nk products."""
    D, Nk = q.shape[-1], k.shape[-2]
    s = 1.0 if spec.row_scale is None else float(np.max(np.abs(spec.row_scale)))
    z = spec.scale * s * D * float(np.abs(q).max()) * float(np.abs(k).max())
    return 8 * eps * (D * z + Nk) * float(np.abs(v).max())


ATTN_CASES = {
    "1.5-causal-alibi-lengths-rowscale": dict(alpha=1.5, causal=True, alibi=True, lengths=True, row_scale=True),
    "softmax": dict(alpha=1.0),
    "3-edge": dict(alpha=3.0, causal=True),
}


@pytest.mark.parametrize("team", ["warp", "block"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_kernels(cupy, launches, ref, team, dtype):
    """attn_forward and attn_backward, and (backward without the kept skewed output)
    attn_probs_from_theta (alpha <= 2) and attn_probs_from_edge (alpha > 2)."""
    gpu = _engine(team)
    rng = np.random.default_rng(7)
    B, Hq, Hkv, Nq, Nk, D = 2, 4, 2, 9, 13, 8
    q = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, Nk, D)).astype(dtype) for _ in range(2))
    do = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    eps = EPS[dtype]
    for name, cfg in ATTN_CASES.items():
        spec = AttentionSpec(alpha=cfg["alpha"], scale=D ** -0.5, causal=cfg.get("causal", False),
                             key_lengths=np.array([Nk, 6]) if cfg.get("lengths") else None,
                             alibi_slopes=np.array([0.0, 0.25, 0.5, 1.0]) if cfg.get("alibi") else None,
                             row_scale=1.0 + rng.random((B, Hq, Nq)) if cfg.get("row_scale") else None, chunk=4)
        want = ref.attention_forward(q, k, v, spec)
        dev = [cupy.asarray(a) for a in (q, k, v, do)]
        got = gpu.attention_forward(*dev[:3], spec)
        tol = _attn_tol(q, k, v, spec, eps)
        np.testing.assert_array_equal(got.support.get(), want.support, err_msg=name)
        assert np.abs(got.out.get().astype(np.float64) - want.out).max() <= tol, name
        gw = ref.attention_backward(do, q, k, v, want, want.skew, spec)
        for skew in (got.skew, None):
            gg = gpu.attention_backward(dev[3], *dev[:3], got, skew, spec)
            for part in ("dq", "dk", "dv"):
                err = np.abs(getattr(gg, part).get().astype(np.float64) - getattr(gw, part)).max()
                assert err <= tol * max(1.0, float(np.abs(do).max()) * Nq), (name, part, err)
            if spec.row_scale is not None:
                assert np.abs(gg.drow_scale.get() - gw.drow_scale).max() <= tol * max(1.0, Nk * D), name


#: the kernels each test above must launch, by (test, team); {T} is the scalar type
EXPECTED = {
    ("rows", "warp"): ("entmax_forward_warp", "entmax_vjp_warp", "entmax_alpha_vjp_warp"),
    ("rows", "block"): ("entmax_forward_block", "entmax_vjp_block", "entmax_alpha_vjp_block"),
    ("family", "warp"): ("normmax_forward_warp", "normmax_vjp_warp", "budget_forward_warp", "budget_vjp_warp"),
    ("family", "block"): ("normmax_forward_block", "normmax_vjp_block", "budget_forward_block", "budget_vjp_block"),
    ("attention", "warp"): ("attn_forward_warp", "attn_backward_warp", "attn_probs_from_theta_block",
                            "attn_probs_from_edge_block"),
    ("attention", "block"): ("attn_forward_block", "attn_backward_block", "attn_probs_from_theta_block",
                             "attn_probs_from_edge_block"),
}


def test_every_kernel_template_is_exercised():
    """The tests above launch, between them, every kernel the loader can compile, in
    both scalar types (each test asserts its own launches, so this holds under
    pytest-xdist too)."""
    exercised = {f"{k}<{t}>" for ks in EXPECTED.values() for k in ks for t in _cuda_loader.SCALARS}
    everything = {e for s in _cuda_loader.KERNELS for e in _cuda_loader.name_expressions(s)}
    assert exercised == everything, sorted(everything ^ exercised)


@pytest.fixture
def launches(cupy, request):
    """Asserts, after the test, that it launched its EXPECTED kernels in its dtype."""
    before = {path: dict(m.launched) for path, m in cupy.MODULES.items()}
    yield
    launched = {name for path, m in cupy.MODULES.items() for name, count in m.launched.items()
                if count > before.get(path, {}).get(name, 0)}
    what = request.node.originalname.split("_")[1]
    what = {"entmax": "rows"}.get(what, what)
    team, dtype = request.node.callspec.params["team"], request.node.callspec.params["dtype"]
    scalar = "double" if dtype == np.float64 else "float"
    want = {f"{k}<{scalar}>" for k in EXPECTED[(what, team)]}
    assert want <= launched, sorted(want - launched)


# ---------------------------------------------------------------------- the g++ harness
@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    return Harness(build_harness(tmp_path_factory, "harness.cpp"))


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("team,lanes", [("warp", 32), ("block", 256)])
def test_teams_match_the_harness_bit_for_bit(cupy, harness, team, lanes):
    """The warp (32 lanes) and a 256-thread block reduce in the orders HostTeam<32> and
    HostTeam<256> reproduce: forward, VJP and alpha-VJP give the same bits."""
    gpu = _engine(team, block=256)
    x = np.ascontiguousarray(X[::2])
    g = np.random.default_rng(9).standard_normal(x.shape)
    for alpha in (1.0, 1.5, 2.0, 3.0):
        a = np.full(len(x), alpha)
        got = gpu.entmax_forward(cupy.asarray(x), a, None)
        p, theta, support, n_iter, conv = harness.forward(x, a, 0, lanes)
        assert _same_bits(got.p.get(), p) and _same_bits(got.theta.get(), theta)
        assert _same_bits(got.support.get(), support) and _same_bits(got.n_iter.get(), n_iter)
        assert _same_bits(got.converged.get(), conv)
        assert _same_bits(gpu.entmax_vjp(got.p, cupy.asarray(g), a).get(), harness.vjp(p, g, a, lanes))
        assert _same_bits(gpu.entmax_alpha_vjp(got.p, cupy.asarray(g), a).get(), harness.alpha_vjp(p, g, a, lanes))


# ---------------------------------------------------------------------- the launcher's checks
def test_launcher_refuses_what_a_gpu_gets_wrong(cupy):
    kernel = cupy.RawModule(code=_cuda_loader.read_source("entmax_rows.cu"),
                            options=(*_cuda_loader.OPTIONS, f"-I{_cuda_loader.cuda_dir()}"),
                            name_expressions=list(_cuda_loader.name_expressions("entmax_rows.cu"))
                            ).get_function("entmax_forward_block<double>")
    rows, n = 2, 5
    x, alpha = cupy.zeros((rows, n)), cupy.full(rows, 1.5)
    outs = (cupy.empty((rows, n)), cupy.empty(rows), cupy.empty(rows, np.int64), cupy.empty(rows, np.int64),
            cupy.empty(rows, np.bool_))

    def args(**change):
        a = dict(x=x, rows=np.int64(rows), n=np.int32(n), alpha=alpha, method=np.int32(0), max_iter=np.int32(50))
        a.update(change)
        return (*a.values(), *outs)

    kernel((rows,), (64,), args())  # a valid launch
    np.testing.assert_allclose(outs[0].get(), np.full((rows, n), 1 / n), rtol=4 * EPS[np.float64])
    with pytest.raises(TypeError, match="host NumPy array"):
        kernel((rows,), (64,), args(x=np.zeros((rows, n))))
    with pytest.raises(TypeError, match="argument 2 is i64, the parameter i32"):
        kernel((rows,), (64,), args(n=np.int64(n)))
    with pytest.raises(TypeError, match="argument 1 is a int"):
        kernel((rows,), (64,), args(rows=rows))
    with pytest.raises(TypeError, match="argument 3 is f64, the parameter p64"):
        kernel((rows,), (64,), args(alpha=np.float64(1.5)))
    with pytest.raises(TypeError, match="not C-contiguous"):
        kernel((rows,), (64,), args(x=cupy.zeros((n, rows)).T))
    with pytest.raises(TypeError, match="10 arguments for 11 parameters"):
        kernel((rows,), (64,), args()[:-1])
    with pytest.raises(LaunchError, match=r"1024 threads per block, above the kernel's __launch_bounds__\(512\)"):
        kernel((rows,), (1024,), args())
    assert all(k.launch_bound == 512 for m in cupy.MODULES.values() for k in m.kernels.values())


def test_the_emulator_compiles_with_the_options_cupy_gives_nvrtc(cupy):
    """The stand-in's RawModule appends what CuPy 14's does, and that is what the loader
    declares NVRTC receives (the list the NVRTC test compiles with)."""
    module = cupy.RawModule(code=_cuda_loader.read_source("family_rows.cu"),
                            options=(*_cuda_loader.OPTIONS, f"-I{_cuda_loader.cuda_dir()}"),
                            name_expressions=list(_cuda_loader.name_expressions("family_rows.cu")))
    assert module.nvrtc_options == _cuda_loader.nvrtc_options("sm_90")
    with pytest.raises(TypeError, match="options must be a tuple"):
        cupy.RawModule(code="", options=["-std=c++17"])


def test_a_required_compiler_that_is_missing_fails(monkeypatch):
    monkeypatch.setenv("ENTMAX_REF_REQUIRE_TOOLS", "g++,nvcc")
    with pytest.raises(pytest.fail.Exception, match="nvcc is required"):
        tool_missing("nvcc", "nvcc is not on PATH")
    monkeypatch.delenv("ENTMAX_REF_REQUIRE_TOOLS")
    with pytest.raises(pytest.skip.Exception, match="nvcc is not on PATH"):
        tool_missing("nvcc", "nvcc is not on PATH")
