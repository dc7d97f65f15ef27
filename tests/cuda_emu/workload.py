"""A small run of every kernel of one CUDA source through the cupy backend, checked.

``python tests/cuda_emu/workload.py VARIANT SOURCE [CUDA_DIR] [--seeds=S1,S2,...]`` (run
from the project root) installs the CuPy stand-in with the build ``VARIANT``
(cuda_emu.build.VARIANTS), optionally compiling the sources of ``CUDA_DIR`` instead of the
package's (a mutant), and launches every kernel of ``SOURCE`` with warp and block teams in
both dtypes on tiny inputs (in fiber mode also with blocks of the most threads a launch
may have, and the row kernels against the g++ harness, bit for bit), once per fiber
schedule seed of ``--seeds`` (``EMU_SEED``; 0 is the threads
in order), or once with the environment's ``EMU_SEED``.  Each answer is compared with the
NumPy engine; a disagreement or a failed launch exits with status 3 and says what.  The
exhaustive tier runs it under the sanitizers (their runtime preloaded), with shuffled
fiber orders, and on mutants.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from cuda_emu import stand_in_cupy  # noqa: E402
from entmax_ref.backends import AttentionSpec, _cuda_loader, get_backend  # noqa: E402
from entmax_ref.backends.exact_normmax import normmax_rows  # noqa: E402
from entmax_ref.backends.numpy_family import budget_rows  # noqa: E402

#: two engines' answers agree to this, relative to the row's scale, in the dtype (the
#: default tier's tests hold the kernels to the formula tolerances; here a mutant's damage
#: is large, a NaN or a wrong reduction)
AGREE = {np.float64: 1e-9, np.float32: 1e-4}


def _engines(widest: bool = False):
    """Warp-per-row and 64-thread block-per-row kernels, and with ``widest`` also blocks of
    the most threads a launch may have (in fiber mode only: an OS thread each is too many)."""
    from entmax_ref.backends.constants import MAX_BLOCK
    from entmax_ref.backends.cupy_backend import CupyBackend, CupyTuning

    engines = {"warp": CupyBackend(CupyTuning(warps_per_block=2)),
               "block": CupyBackend(CupyTuning(warp_max_n=0, block=64))}
    if widest:
        engines["widest"] = CupyBackend(CupyTuning(warp_max_n=0, block=MAX_BLOCK))
    return engines


def _close(what, got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.array_equal(np.isfinite(got), np.isfinite(want)):
        raise AssertionError(f"{what}: finite entries differ")
    live = np.isfinite(want)
    err = np.abs(got[live] - want[live])
    if (err > AGREE[dtype] * (1.0 + np.abs(want[live]))).any():
        raise AssertionError(f"{what}: off by {err.max():.3g}")


def _harness():
    """The g++ harness of the package's sources (HostTeam<32> and <256> reproduce the warp's
    and a 256-thread block's reduction orders), built before a mutant's sources are put in."""
    from cuda_cases import build_harness
    from test_cuda_core import Harness

    class Folders:  # what build_harness asks of pytest's tmp_path_factory
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name))

    return Harness(build_harness(Folders(), "harness.cpp"))


def _same_bits(what, got, want):
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.dtype != want.dtype or got.tobytes() != want.tobytes():
        raise AssertionError(f"{what}: not the harness's bits")


def rows_bits(cupy, harness):
    """Forward, VJP and alpha-VJP give the harness's bits (a reduction order or a
    compensation term changed by one ulp is seen here, not within a tolerance)."""
    from entmax_ref.backends.cupy_backend import CupyBackend, CupyTuning

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 70)) * 2
    x[1, ::4] = -np.inf
    g = rng.standard_normal(x.shape)
    for lanes, gpu in ((32, CupyBackend(CupyTuning(warps_per_block=2))),
                       (256, CupyBackend(CupyTuning(warp_max_n=0, block=256)))):
        for alpha in (1.0, 1.5, 2.0, 3.0):
            a = np.full(3, alpha)
            got = gpu.entmax_forward(cupy.asarray(x), a, None)
            p, theta = harness.forward(x, a, 0, lanes)[:2]
            _same_bits(f"entmax_forward {lanes} lanes {alpha}", got.p.get(), p)
            _same_bits(f"entmax_forward theta {lanes} lanes {alpha}", got.theta.get(), theta)
            _same_bits(f"entmax_vjp {lanes} lanes {alpha}", gpu.entmax_vjp(got.p, cupy.asarray(g), a).get(),
                       harness.vjp(p, g, a, lanes))
            _same_bits(f"entmax_alpha_vjp {lanes} lanes {alpha}",
                       gpu.entmax_alpha_vjp(got.p, cupy.asarray(g), a).get(), harness.alpha_vjp(p, g, a, lanes))


def rows(cupy, dtype, widest):
    ref = get_backend("numpy")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 70)) * 2).astype(dtype)
    x[1, ::4] = -np.inf
    g = rng.standard_normal(x.shape).astype(dtype)
    for team, gpu in _engines(widest).items():
        for alpha in (1.0, 1.5, 2.0, 3.0):
            a = np.full(3, alpha)
            got, want = gpu.entmax_forward(cupy.asarray(x), a, None), ref.entmax_forward(x, a, None)
            _close(f"entmax_forward {team} {alpha}", got.p.get(), want.p, dtype)
            _close(f"entmax_vjp {team} {alpha}", gpu.entmax_vjp(got.p, cupy.asarray(g), a).get(),
                   ref.entmax_vjp(want.p, g, a), dtype)
            _close(f"entmax_alpha_vjp {team} {alpha}", gpu.entmax_alpha_vjp(got.p, cupy.asarray(g), a).get(),
                   ref.entmax_alpha_vjp(want.p.astype(np.float64), g.astype(np.float64), a), dtype)


def family(cupy, dtype, widest):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 70)) * 2).astype(dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    x64 = x.astype(np.float64)
    for team, gpu in _engines(widest).items():
        a = np.full(3, 2.5)
        got = gpu.normmax_forward(cupy.asarray(x), a)
        _close(f"normmax_forward {team}", got.p.get(), normmax_rows(x64, a).p, dtype)
        gpu.normmax_vjp(got.p, cupy.asarray(g), a)
        b = np.array([1.0, 2.5, 7.0])
        got = gpu.budget_forward(cupy.asarray(x), b)
        _close(f"budget_forward {team}", got.p.get(), budget_rows(x64, b).p, dtype)
        gpu.budget_vjp(got.p, cupy.asarray(g))


def attention(cupy, dtype, widest):
    ref = get_backend("numpy")
    rng = np.random.default_rng(3)
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 6, 9, 4
    q = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, Nk, D)).astype(dtype) for _ in range(2))
    do = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    for team, gpu in _engines(widest).items():
        for alpha, causal in ((1.5, True), (3.0, True), (1.0, False)):
            spec = AttentionSpec(alpha=alpha, scale=0.5, causal=causal, alibi_slopes=np.array([0.0, 0.5]), chunk=4)
            got, want = gpu.attention_forward(*(cupy.asarray(t) for t in (q, k, v)), spec), ref.attention_forward(
                q, k, v, spec)
            _close(f"attention out {team} {alpha}", got.out.get(), want.out, dtype)
            gw = ref.attention_backward(do, q, k, v, want, want.skew, spec)
            for skew in (got.skew, None):
                gg = gpu.attention_backward(*(cupy.asarray(t) for t in (do, q, k, v)), got, skew, spec)
                _close(f"attention dq {team} {alpha}", gg.dq.get(), gw.dq, dtype)


WORKLOADS = {"entmax_rows.cu": rows, "family_rows.cu": family, "entmax_attention.cu": attention}


def main(argv) -> int:
    seeds = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--seeds=")]
    argv = [a for a in argv if not a.startswith("--seeds=")]
    variant, source = argv[1], argv[2]
    # bit for bit in fiber mode (a mutant's one-ulp change); the sanitizers look for races
    harness = _harness() if source == "entmax_rows.cu" and variant == "fibers" else None
    if len(argv) > 3:  # a mutant's folder of sources
        mutant = Path(argv[3])
        _cuda_loader.cuda_dir = lambda: mutant
    with stand_in_cupy(variant) as cupy:
        for seed in seeds[0] if seeds else [None]:
            if seed is not None:  # read by the emulator at every block
                os.environ["EMU_SEED"] = seed
            try:
                for dtype in (np.float64, np.float32):
                    WORKLOADS[source](cupy, dtype, variant == "fibers")
                if harness is not None:
                    rows_bits(cupy, harness)
            except Exception as e:  # noqa: BLE001 - the report of a run, for the caller
                print(f"workload failed (EMU_SEED={os.environ.get('EMU_SEED', '0')}): {type(e).__name__}: {e}",
                      flush=True)
                return 3
        launched = sorted(n for m in cupy.MODULES.values() for n in m.launched)
    missing = set(_cuda_loader.name_expressions(source)) - set(launched)
    if missing:
        print(f"not launched: {sorted(missing)}")
        return 4
    print(f"ok: {len(launched)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
