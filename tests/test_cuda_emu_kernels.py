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
from entmax_ref.backends.exact_normmax import normmax_rows, normmax_vjp_rows
from entmax_ref.backends.numpy_family import budget_rows, budget_vjp_rows
from agreement import budget_agreement_tolerance, core_alpha_vjp_tolerance, core_vjp_tolerance
from agreement import core_p_tolerance as p_tol
from agreement import core_theta_tolerance as theta_tol
from agreement import family_threshold_agreement, float64_support
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
    np.testing.assert_array_equal(support, float64_support(want, x, alpha))
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
    # the CPU engines' tolerance: the free entries lie within 1 of each other, whatever the magnitude
    tol = budget_agreement_tolerance(np.ones((1, 1)), budget) * (EPS[dtype] / EPS[np.float64])
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


def test_block_kernels_at_the_most_threads(cupy, ref):
    """Every block-per-row kernel with the most threads a launch may have
    (constants.MAX_BLOCK, 16 warps), on a few short rows (most threads idle, the teams'
    reductions and shared scratch at full width), against the NumPy engine."""
    from entmax_ref.backends.constants import MAX_BLOCK
    from entmax_ref.backends.cupy_backend import CupyBackend, CupyTuning

    gpu = CupyBackend(CupyTuning(warp_max_n=0, block=MAX_BLOCK))
    before = {path: dict(m.launched) for path, m in cupy.MODULES.items()}
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 40))
    x[1, ::3] = -np.inf
    g = rng.standard_normal(x.shape)
    for alpha in (1.5, 3.0):
        a = np.full(2, alpha)
        got, want = gpu.entmax_forward(cupy.asarray(x), a, None), ref.entmax_forward(x, a, None)
        _forward_ok(got, want, x, a)
        p = cupy.asarray(want.p)
        np.testing.assert_allclose(gpu.entmax_vjp(p, cupy.asarray(g), a).get(), ref.entmax_vjp(want.p, g, a),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gpu.entmax_alpha_vjp(p, cupy.asarray(g), a).get(),
                                   ref.entmax_alpha_vjp(want.p, g, a), rtol=1e-12, atol=1e-12)
    xf = np.where(np.isfinite(x), x, -np.inf)
    nm = gpu.normmax_forward(cupy.asarray(xf), np.full(2, 2.5))
    np.testing.assert_allclose(nm.p.get(), normmax_rows(xf, np.full(2, 2.5)).p, rtol=1e-12, atol=1e-14)
    gpu.normmax_vjp(nm.p, cupy.asarray(g), np.full(2, 2.5))
    bs = gpu.budget_forward(cupy.asarray(xf), np.array([3.0, 7.5]))
    np.testing.assert_allclose(bs.p.get(), budget_rows(xf, np.array([3.0, 7.5])).p, rtol=0, atol=1e-14)
    gpu.budget_vjp(bs.p, cupy.asarray(g))
    q, k, v, do = (rng.standard_normal(s) for s in ((1, 2, 3, 4), (1, 1, 9, 4), (1, 1, 9, 4), (1, 2, 3, 4)))
    for alpha in (1.5, 3.0):
        spec = AttentionSpec(alpha=alpha, scale=0.5, causal=True)
        got, want = gpu.attention_forward(*(cupy.asarray(t) for t in (q, k, v)), spec), ref.attention_forward(
            q, k, v, spec)
        np.testing.assert_allclose(got.out.get(), want.out, rtol=1e-12, atol=1e-13)
        gw = ref.attention_backward(do, q, k, v, want, want.skew, spec)
        for skew in (got.skew, None):
            gg = gpu.attention_backward(*(cupy.asarray(t) for t in (do, q, k, v)), got, skew, spec)
            np.testing.assert_allclose(gg.dq.get(), gw.dq, rtol=1e-11, atol=1e-12)
    launched = {name for path, m in cupy.MODULES.items() for name, count in m.launched.items()
                if count > before.get(path, {}).get(name, 0)}
    blocks = {e for s in _cuda_loader.KERNELS for e in _cuda_loader.name_expressions(s)
              if "_block" in e and "<float>" not in e}
    assert blocks <= launched, sorted(blocks - launched)


#: the row kernel templates of each test above
ROW_KERNELS = {"rows": ("entmax_forward", "entmax_vjp", "entmax_alpha_vjp"),
               "family": ("normmax_forward", "normmax_vjp", "budget_forward", "budget_vjp")}


def expected(what: str, team: str, dtype) -> set:
    """The name expressions of the kernels a test above must launch: the rows' on the
    input's storage type; attention in float64, the result rounded by narrow_to_float for
    float32."""
    if what == "attention":
        names = {f"attn_forward_{team}", f"attn_backward_{team}", "attn_probs_from_theta_block",
                 "attn_probs_from_edge_block"}
        return names | ({"narrow_to_float"} if dtype == np.float32 else set())
    scalar = "double" if dtype == np.float64 else "float"
    return {f"{k}_{team}<{scalar}>" for k in ROW_KERNELS[what]}


def test_every_kernel_is_exercised():
    """The tests above launch, between them, every kernel the loader can compile, in
    every scalar type (each test asserts its own launches, so this holds under
    pytest-xdist too)."""
    exercised = {e for what in ("rows", "family", "attention") for team in ("warp", "block")
                 for dtype in (np.float64, np.float32) for e in expected(what, team, dtype)}
    everything = {e for s in _cuda_loader.KERNELS for e in _cuda_loader.name_expressions(s)}
    assert exercised == everything, sorted(everything ^ exercised)


@pytest.fixture
def launches(cupy, request):
    """Asserts, after the test, that it launched its expected kernels."""
    before = {path: dict(m.launched) for path, m in cupy.MODULES.items()}
    yield
    launched = {name for path, m in cupy.MODULES.items() for name, count in m.launched.items()
                if count > before.get(path, {}).get(name, 0)}
    what = request.node.originalname.split("_")[1]
    what = {"entmax": "rows"}.get(what, what)
    want = expected(what, request.node.callspec.params["team"], request.node.callspec.params["dtype"])
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
    from entmax_ref.backends.cupy_backend import ROW_FORWARD, ROW_VJP, _args

    kernel = cupy.RawModule(code=_cuda_loader.read_source("entmax_rows.cu"),
                            options=(*_cuda_loader.OPTIONS, f"-I{_cuda_loader.cuda_dir()}"),
                            name_expressions=list(_cuda_loader.name_expressions("entmax_rows.cu"))
                            ).get_function("entmax_forward_block<double>")
    rows, n = 2, 5
    x, alpha = cupy.zeros((rows, n)), cupy.full(rows, 1.5)
    outs = dict(p=cupy.empty((rows, n)), threshold=cupy.empty(rows), support=cupy.empty(rows, np.int64),
                n_iter=cupy.empty(rows, np.int64), converged=cupy.empty(rows, np.bool_))
    record = _args(ROW_FORWARD, x=x, prm=alpha, rows=rows, n=n, method=0, max_iter=50, **outs)
    kernel((rows,), (64,), (record,))  # a valid launch
    np.testing.assert_allclose(outs["p"].get(), np.full((rows, n), 1 / n), rtol=4 * EPS[np.float64])
    with pytest.raises(TypeError, match="host NumPy array"):
        kernel((rows,), (64,), (np.zeros((rows, n)),))
    with pytest.raises(TypeError, match="argument 0 is s448, the parameter s640"):
        kernel((rows,), (64,), (_args(ROW_VJP, rows=rows, n=n),))
    with pytest.raises(TypeError, match="argument 0 is i64, the parameter s640"):
        kernel((rows,), (64,), (np.int64(rows),))
    with pytest.raises(TypeError, match="argument 0 is a int"):
        kernel((rows,), (64,), (rows,))
    with pytest.raises(TypeError, match="not C-contiguous"):
        kernel((rows,), (64,), (cupy.zeros((n, rows)).T,))
    with pytest.raises(TypeError, match="2 arguments for 1 parameters"):
        kernel((rows,), (64,), (record, record))
    with pytest.raises(LaunchError, match=r"1024 threads per block, above the kernel's __launch_bounds__\(512\)"):
        kernel((rows,), (1024,), (record,))
    assert all(k.launch_bound == 512 for m in cupy.MODULES.values() for k in m.kernels.values())


def test_records_have_the_kernels_layouts():
    """Each argument record of cupy_backend.RECORDS has the size and the field offsets of the
    C++ struct it stands for (compiled by g++ with the loader's options: the same layout
    as on the device, where the ABI of these plain structs is the host's)."""
    import subprocess
    import tempfile
    from pathlib import Path

    from cuda_emu.build import compiler, gxx_options
    from entmax_ref.backends.cupy_backend import RECORDS

    lines, want = [], []
    for ctype, dtype in RECORDS.items():
        lines.append(f"sizeof({ctype})")
        want.append(dtype.itemsize)
        for name in dtype.names:
            lines.append(f"offsetof({ctype}, {name})")
            want.append(dtype.fields[name][1])
    probe = ('#include <cstddef>\n#include <cstdio>\n#include "cuda_emu.h"\n#include "entmax_attention.cu"\n'
             "int main() {\n" + "".join(f'    std::printf("%zu\\n", (size_t)({e}));\n' for e in lines) + "}\n")
    flags, _ = gxx_options(_cuda_loader.nvrtc_options("sm_90"))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "probe.cpp")
        src.write_text(probe)
        cmd = [compiler(), *flags, f"-I{Path(__file__).parent / 'cuda_emu'}", "-pthread", str(src), "-o",
               str(Path(tmp, "probe"))]
        built = subprocess.run(cmd, capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-3000:]
        got = subprocess.run([str(Path(tmp, "probe"))], capture_output=True, text=True, check=True).stdout.split()
    assert [int(v) for v in got] == want, [(e, g, w) for e, g, w in zip(lines, got, want) if int(g) != w]


#: kernels that each break one rule a GPU does not check (test_the_emulator_stops)
FAULTY = r"""
#define LOOP(N) for (int i = threadIdx.x; i < (N); i += blockDim.x)
__global__ void read_past_the_end(const double* x, double* out, int n) { LOOP(n + 1) out[0] = x[i]; }
__global__ void write_before_the_start(double* out, int n) { if (threadIdx.x == 0) out[-1] = 1.0; }
__global__ void shared_index_out_of_bounds(double* out) {
    ER_SHARED_ARRAY(double, 32, s);
    s[threadIdx.x] = 1.0;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
__global__ void read_without_barrier(double* out) {
    ER_SHARED_ARRAY(double, 64, s);
    s[threadIdx.x] = threadIdx.x;
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void write_over_a_read(double* out) {
    ER_SHARED_ARRAY(double, 1, s);
    if (threadIdx.x == 0) s[0] = 1.0;
    __syncthreads();
    out[threadIdx.x] = s[0];
    if (threadIdx.x == 33) s[0] = 2.0;
}
__global__ void with_barriers(double* out) {
    ER_SHARED_ARRAY(double, 64, s);
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
    s[threadIdx.x] = 0.0;
}
__global__ void into_the_next_block(double* out) {
    if (threadIdx.x == 0) { out[blockIdx.x] = blockIdx.x; out[blockIdx.x + 1] = -1.0; }
}
"""


@pytest.mark.parametrize("name, message", [
    ("read_past_the_end", r"a read of address 0x\w+, outside the memory the kernel was given \(0 bytes past the end "
                          r"of a device array of 256 bytes\)"),
    ("write_before_the_start", "a write before the start of a device array of 256 bytes"),
    ("shared_index_out_of_bounds", r"shared array 's' of 32 elements indexed at (3[2-9]|[4-6]\d) by thread \d+"),
    ("read_without_barrier", r"a race on shared array 's' element \d+: thread \d+ (reads the value written by|"
                             r"overwrites the value read by) thread \d+ with no __syncthreads\(\) between them"),
    ("write_over_a_read", "a race on shared array 's' element 0: thread 33 overwrites the value read by other threads"),
    ("with_barriers", None),
])
def test_the_emulator_stops(cupy, name, message):
    """What a GPU leaves undefined, each in a kernel of its own, fails the launch with what
    and where: an access past the end of a device array (it ends at an inaccessible page),
    a write before its start, a shared array's index out of range, a race on shared memory
    (a read of another thread's write, a write over another thread's read, with no barrier
    between them), whatever order the emulated threads run in; the same accesses with the
    barriers are fine."""
    module = cupy.RawModule(code=FAULTY, options=(*_cuda_loader.OPTIONS,), name_expressions=[
        "read_past_the_end", "write_before_the_start", "shared_index_out_of_bounds", "read_without_barrier",
        "write_over_a_read", "with_barriers", "into_the_next_block"])
    x, out = cupy.zeros(32), cupy.zeros(64)
    args = {"read_past_the_end": (x, out, np.int32(32)), "write_before_the_start": (x, np.int32(32))}.get(name, (out,))
    kernel = module.get_function(name)
    if message is None:
        kernel((1,), (64,), args)
        np.testing.assert_array_equal(out.get(), (np.arange(64) + 1) % 64)
    else:
        with pytest.raises(LaunchError, match=message):
            kernel((1,), (64,), args)


def test_the_blocks_run_last_first(cupy, monkeypatch):
    """A block that writes into its successor's part of an output is seen: the blocks run
    in reverse order (without EMU_SEED, which shuffles them), so the successor has written
    before, and its value is lost."""
    monkeypatch.delenv("EMU_SEED", raising=False)
    module = cupy.RawModule(code=FAULTY, options=(*_cuda_loader.OPTIONS,), name_expressions=["into_the_next_block"])
    out = cupy.zeros(5)
    module.get_function("into_the_next_block")((4,), (32,), (out,))
    np.testing.assert_array_equal(out.get(), [0.0, -1.0, -1.0, -1.0, -1.0])


def test_the_emulator_compiles_with_the_options_cupy_gives_nvrtc(cupy):
    """The stand-in's RawModule appends what CuPy 14's does, and that is what the loader
    declares NVRTC receives (the list the NVRTC test compiles with)."""
    module = cupy.RawModule(code=_cuda_loader.read_source("family_rows.cu"),
                            options=(*_cuda_loader.OPTIONS, f"-I{_cuda_loader.cuda_dir()}"),
                            name_expressions=list(_cuda_loader.name_expressions("family_rows.cu")))
    assert module.nvrtc_options == _cuda_loader.nvrtc_options("sm_90")
    with pytest.raises(TypeError, match="options must be a tuple"):
        cupy.RawModule(code="", options=["-std=c++17"])


def test_the_stand_in_is_cupy_14(cupy):
    """The stand-in exposes only names CuPy 14 has (cupy14_api.txt), its functions and
    array methods take only CuPy's parameters, and a device array never becomes a NumPy
    array implicitly."""
    assert set(cupy.__all__) <= set(cupy.CUPY_API), sorted(set(cupy.__all__) - set(cupy.CUPY_API))
    methods = {f"ndarray.{n}" for n, v in vars(cupy.ndarray).items() if not n.startswith("_") and callable(v)}
    assert methods <= set(cupy.CUPY_API), sorted(methods - set(cupy.CUPY_API))
    assert not hasattr(cupy, "errstate")  # NumPy has it, CuPy does not
    x = cupy.zeros((2, 3))
    with pytest.raises(TypeError, match="takes"):
        x.max(axis=1, initial=0.0)
    with pytest.raises(TypeError, match="takes"):
        cupy.sum(x, axis=1, where=x > 0)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + np.ones(3)
    assert type(np.exp(x)) is cupy.ndarray and type(np.sum(x, axis=0)) is cupy.ndarray
    tiny = cupy.asarray(np.array([1e-40, -1e-40, 1.0], np.float32))  # CuPy's kernels flush float32 subnormals
    assert (tiny * 1.0).get().tolist() == [0.0, 0.0, 1.0]


def test_the_cupy_api_file_is_the_installed_cupys():
    """cupy14_api.txt is what tests/cuda_emu/cupy_api.py writes for the installed CuPy of
    its version (where cupy-cuda12x is installed; importing it needs no GPU)."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent / "cuda_emu"
    res = subprocess.run([sys.executable, str(here / "cupy_api.py")], capture_output=True, text=True)
    if res.returncode != 0 and "No module named 'cupy'" in res.stderr:
        pytest.skip("cupy is not installed here")
    assert res.returncode == 0, res.stderr[-2000:]
    recorded = (here / "cupy14_api.txt").read_text()
    if res.stdout.splitlines()[0] != recorded.splitlines()[0]:
        pytest.skip(f"another CuPy version is installed ({res.stdout.splitlines()[0]})")
    assert res.stdout == recorded


def test_a_required_compiler_that_is_missing_fails(monkeypatch):
    monkeypatch.setenv("ENTMAX_REF_REQUIRE_TOOLS", "g++,nvcc")
    with pytest.raises(pytest.fail.Exception, match="nvcc is required"):
        tool_missing("nvcc", "nvcc is not on PATH")
    monkeypatch.delenv("ENTMAX_REF_REQUIRE_TOOLS")
    with pytest.raises(pytest.skip.Exception, match="nvcc is not on PATH"):
        tool_missing("nvcc", "nvcc is not on PATH")
