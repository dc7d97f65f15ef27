"""Rows shared by the CPU harness tests (test_cuda_core.py, test_cuda_family_core.py), the
emulated tests and the GPU test (test_cupy_backend.py) of the CUDA kernels and the GPU
check (scripts/gpu_bench.py), the one g++ build of a harness, and the rule that turns a
missing compiler into a failure in CI.  Their error budgets are in agreement.py (engine
agreement)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cuda_emu.build import cache_dir, locked
from entmax_ref.backends import _cuda_loader, get_backend
from entmax_ref.backends.constants import cuda_defines

#: the g++ drivers of the CUDA cores (test code: never shipped with the package)
HARNESS_DIR = Path(__file__).resolve().parent / "cuda_harness"
EPS64 = np.finfo(np.float64).eps
ALPHAS = (1.0, 1.0 + 1e-6, 1.25, 1.5, 2.0, 3.0, 10.0)
#: Large alphas, where an edge entry's p^(alpha-1) is below the float64 range (p < 8e-4 at
#: alpha = 100, p < 0.5 at alpha = 1000) and u = p^(2-alpha) overflows (edge_rows).
BIG_ALPHAS = (20.0, 100.0, 1000.0)


def family_rows(seed: int, n_rows: int, n: int, huge_row: bool = False) -> np.ndarray:
    """Float64 rows for the normmax and budget-sparsemax kernels: random scales, scattered
    -inf, an all -inf row (3), a row with ties at its maximum (4), one far from 0 (5), and
    with ``huge_row`` one of +-1e300 (6: entries free relative to each other)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n)) * rng.choice([0.05, 0.5, 2.0, 8.0], size=(n_rows, 1))
    x[rng.random(x.shape) < 0.05] = -np.inf
    x[3] = -np.inf
    x[4, :10] = x[4, 0]
    x[5] = 50.0 + rng.standard_normal(n)
    if huge_row:
        x[6] = -np.inf
        x[6, :4] = [1e300, -1e300, 0.0, 0.25]
    return x


def tool_missing(tool: str, reason: str):
    """Skip a test whose compiler or library ``tool`` (``g++``, ``nvcc``, ``nvrtc``; the
    corpus readers' ``cc``, ``node``, ``cargo``) is missing here, saying why; fail it instead
    where ``ENTMAX_REF_REQUIRE_TOOLS`` (a comma-separated list, set by .ci/run) names the
    tool, so that CI cannot pass a compile check it did not run."""
    required = {s.strip() for s in os.environ.get("ENTMAX_REF_REQUIRE_TOOLS", "").split(",")}
    if tool in required:
        pytest.fail(f"{tool} is required (ENTMAX_REF_REQUIRE_TOOLS) and missing: {reason}")
    pytest.skip(reason)


def build_harness(tmp_path_factory, source: str) -> ctypes.CDLL:
    """tests/cuda_harness/<source> (the CPU driver of a CUDA core) compiled by g++ into a
    shared library and loaded: C++17, the -D defines of backends/constants.py (the ones
    NVRTC gets), no FMA contraction (as _cuda_loader asks of NVRTC), every warning an
    error.  Skips without a C++ compiler.  The library is cached beside the emulation's
    builds (cuda_emu.build.cache_dir), named by a hash of the command, every file of
    backends/cuda/ and tests/cuda_harness/ and the compiler's version, so that the test
    files that load one harness share one build."""
    cxx = shutil.which("g++")
    if cxx is None:
        tool_missing("g++", "no g++ to build the CPU harness of the CUDA core")
    src = _cuda_loader.cuda_dir()
    flags = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-shared", "-fPIC",
             *cuda_defines(), f"-I{src}", f"-I{HARNESS_DIR}"]
    h = hashlib.sha256(repr((flags, source)).encode())
    h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
    for f in sorted([*src.glob("*"), *HARNESS_DIR.glob("*")]):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    stem = f"harness-{source.rsplit('.', 1)[0]}-{h.hexdigest()[:24]}"
    folder = cache_dir()
    out = folder / f"{stem}.so"
    with locked(folder / f"{stem}.lock"):
        if not out.exists():
            tmp = tmp_path_factory.mktemp(source.replace(".", "_")) / "harness.so"
            cmd = [cxx, *flags, str(HARNESS_DIR / source), "-o", str(tmp)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
            shutil.copyfile(tmp, folder / f"{stem}.tmp")
            os.replace(folder / f"{stem}.tmp", out)
    return ctypes.CDLL(str(out))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    """The address of a contiguous array, for a harness entry point."""
    return a.ctypes.data_as(ctypes.c_void_p)


def forward_outputs(rows: int) -> tuple:
    """(threshold, support, n_iter, converged) buffers of a harness forward, in the layout of
    harness_rows.cuh's RowOutputs."""
    return np.empty(rows), np.empty(rows, np.int64), np.empty(rows, np.int64), np.empty(rows, np.uint8)


def rows(n_random: int, seed: int) -> np.ndarray:
    """Seeded random and adversarial rows, padded with -inf to a common length."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1, 2, 3, 7, 50, 300):
        for scale in (0.1, 1.0, 10.0):
            rows += list(rng.standard_normal((n_random, n)) * scale)
    rows += [
        np.array([0.0]), np.array([5.0, 5.0]), np.zeros(8), np.full(40, -3.25),  # constant rows
        np.array([1.0, 1.0, 1.0, 0.0]), np.array([2.0, 2.0, -1.0, -1.0, -1.0]),  # ties
        np.array([0.0, 1.0, 1.5]), np.array([-2.0, 0.0, 0.5]), np.array([1.0, 0.0, 0.0]),
        np.array([3.0, 1.0, 1.0, 1.0]), np.arange(20.0) / 10, np.arange(200.0)[::-1] / 50,
        rng.integers(-2, 3, 64).astype(float) / 4,  # many exact ties on a grid
        rng.standard_normal(30) + 1e6, rng.standard_normal(30) * 1e-3 + 1e6,  # large offsets
        rng.standard_normal(30) - 1e6, rng.standard_normal(30) * 1e-9,  # nearly uniform
        np.array([0.0, -1e-300, 1e-300]), np.array([1e3, -1e3, 0.0]),  # extreme spreads
    ]
    width = max(len(r) for r in rows)
    x = np.full((len(rows), width), -np.inf)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    # Masks: -inf inside rows, all -inf rows, and shuffled columns.
    masked = x[rng.integers(0, len(x), 40)].copy()
    masked[rng.random(masked.shape) < 0.3] = -np.inf
    x = np.vstack([x, masked, np.full((2, width), -np.inf)])
    perm = rng.permutation(width)
    return np.vstack([x, x[:50, perm]])


def _pad(rows: list) -> np.ndarray:
    width = max(len(r) for r in rows)
    x = np.full((len(rows), width), -np.inf)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    return x


def threshold_rows(alpha: float, n_rows: int, seed: int) -> np.ndarray:
    """float32 rows on the support's edge: a random row of 10 entries and, added to it,
    the float32 values nearest its threshold ``T`` (``p_i = ((alpha-1)(x_i - T))_+^(1/(alpha-1))``,
    ``(alpha-1) T`` the NumPy engine's threshold), one and two float32 ulps either side, and
    a tie of the maximum one ulp below it: exact probabilities of 0 and tiny ones."""
    import entmax_ref as er

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_rows):
        x = (rng.standard_normal(10) * rng.choice([0.3, 1.0, 3.0])).astype(np.float32)
        x = np.append(x, np.nextafter(x.max(), np.float32(-np.inf)))
        T = np.float32(er.entmax_threshold(x.astype(np.float64), alpha=alpha, backend="numpy") / (alpha - 1.0))
        near = [T, *(np.nextafter(T, d * np.float32(np.inf)) for d in (1, -1))]
        near += [np.nextafter(v, v + (v - T)) for v in near[1:]]
        out.append(np.concatenate([x, near]).astype(np.float32))
    return np.stack(out)


def edge_rows(alpha: float, n_random: int, seed: int) -> np.ndarray:
    """Rows whose support has small-p edge entries at a large alpha, padded with -inf.

    At alpha = 100 an entry's p is ~(99 gap)^(1/99): p = 5e-4 needs a gap ~1e-330 to the
    threshold, so small edge probabilities come from entries (exactly) at the support's
    smallest value c: [0, -0.009617] (p_2 = 4.96e-4 at alpha = 100), rows [0, -c x k]
    with c = (1 - k q)^(alpha-1) / (alpha-1), so the k tied edge entries get p ~ q, random
    rows of levels (a top entry, middle entries, k tied edge entries, entries below the
    support, shuffled, some with an offset), and nearly uniform rows scaled by
    (1/n)^(alpha-1)/(alpha-1) (where that is above the float64 range's floor), whose
    entries spread over the whole range of p."""
    rng = np.random.default_rng(seed)
    a1 = alpha - 1.0
    rows = [np.array([0.0, -0.009617]), np.array([0.0, -0.0095]), np.array([0.0, -0.009617, -0.009617]),
            np.array([3.5, 3.5 - 0.009617]), np.array([0.0, -0.009617, -0.5, -np.inf])]
    for q in (1e-2, 1e-4, 1e-6, 1e-9):
        for k in (1, 3, 8):
            c = (1.0 - k * q) ** a1 / a1
            rows.append(np.concatenate([[0.0], np.full(k, -c)]))
            rows.append(rng.permutation(np.concatenate([[0.0], np.full(k, -c), -c * (1 + rng.random(4))])))
    for _ in range(n_random):
        q = 10.0 ** rng.uniform(-9, -2)
        k = int(rng.integers(2, 7))
        mid = rng.uniform(0.2, 0.8, int(rng.integers(0, 3)))  # middle entries: p ~ mid
        top = 1.0 - k * q - mid.sum() if mid.sum() + k * q < 1 else 0.5
        # a level with probability p sits at -(1 - p^a1) ... written relative to the edge:
        # p_i^a1 = a1 (y_i - T), so y_i = y_edge + p_i^a1 / a1 up to the edge's q^a1 / a1.
        c = 1.0 / a1
        levels = np.concatenate([[max(top, 1e-3) ** a1 / a1], mid ** a1 / a1]) - c
        row = np.concatenate([levels, np.full(k, -c), -c - rng.random(int(rng.integers(0, 5)))])
        row = row - row.max()
        if rng.random() < 0.3:
            row = row + rng.uniform(-10, 10)
        rows.append(rng.permutation(row))
    for n in (3, 7, 50):
        s = (1.0 / n) ** a1 / a1
        if s > 1e-290:
            rows += list(s * rng.standard_normal((n_random, n)))
    return _pad(rows)


def near_tie_problem(alpha: float, seed: int, B: int = 100, H: int = 4, Nk: int = 17, D: int = 16):
    """float32 q, k, v of B x H one-query problems whose last key's score (in float64, as
    the CPU engines score) lies within 4e-8 of the support's edge of the row, on either
    side: p > 0 exactly when the score exceeds theta - 1 / (alpha - 1), and a score
    rounded by a float32 product lands on the other side about as often as not."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    k = (rng.standard_normal((B, H, Nk, D)) * 0.5).astype(np.float32)
    v = rng.standard_normal((B, H, Nk, 4)).astype(np.float32)
    scale = D ** -0.5
    ref = get_backend("numpy")
    for b in range(B):
        for h in range(H):
            qq = q[b, h, 0].astype(np.float64)
            z = scale * (k[b, h, :-1].astype(np.float64) @ qq)
            theta = ref.entmax_forward(z[None], np.array([alpha]), None).theta[0]
            target = theta - 1.0 / (alpha - 1.0) + rng.uniform(-4e-8, 4e-8)
            d = int(np.argmax(np.abs(qq)))
            for _ in range(3):  # move the key along its largest coordinate onto the target
                score = scale * (k[b, h, -1].astype(np.float64) @ qq)
                k[b, h, -1, d] = np.float32(k[b, h, -1, d] + (target - score) / (scale * qq[d]))
    return q, k, v, scale
