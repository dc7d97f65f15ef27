"""The cupy backend on a GPU: engine identity with the CPU reference, then speed.

``python scripts/gpu_bench.py --json gpu_check.json --parts compile,identity,bench
[--tests tests.xml] [--budget S]`` (run by scripts/gpu_check.sh from a checkout, in steps,
each with its own time limit; installs nothing) writes one JSON, which each step after
``compile`` adds its parts to:

* ``device``: the GPU, the CUDA driver and runtime, CuPy and NVRTC, torch and AdaSplash;
* ``compile``: seconds to compile every kernel (NVRTC, cold unless CuPy's disk cache
  ``CUPY_CACHE_DIR`` already holds them);
* ``identity``: the cupy engine against the NumPy engine on the same inputs, per case:
  rows whose support differs (the contract: none), float32 entries whose bits differ
  (the CPU engines' float32 outputs are correctly rounded: the device's should be those
  bits too), the largest float64 difference in units of the reference's magnitude;
  row transforms (alpha 1, 1.25, 1.5, 2, 3; warp- and block-per-row lengths), the
  near-tie attention rows of the tests (a key within 4e-8 of the support's edge, float32),
  and random causal attention with its gradients, float32 and float64;
* ``bench``: median milliseconds on the device (CUDA events) of row alpha-entmax,
  and of entmax attention forward and backward (alpha 1.5, causal, 1 x 4 x N x 64,
  float32) beside torch's ``scaled_dot_product_attention`` (softmax) and, where it is
  importable, AdaSplash (alpha 1.5) on the same shapes, N = 4096 and 16384 while
  ``--budget`` seconds last;
* ``tests``: the GPU tests' counts and failures, from the JUnit XML of ``--tests``;
* ``problems``: what the run must not show (:func:`problems`): a part that failed, a GPU
  test that failed, a row whose support differs from the CPU's; empty on success, and the
  exit status is 1 when it is not.

:func:`identity` also runs on the CPU stand-in of CuPy (tests/test_cuda_emu_public.py
runs it small), so that the first GPU run does not fail on the script itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _import_cupy():
    import cupy

    return cupy


def device() -> dict:
    cupy = _import_cupy()
    info = {"cupy": cupy.__version__}
    try:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        info.update(name=props["name"].decode(), compute_capability=cupy.cuda.Device().compute_capability,
                    driver=cupy.cuda.runtime.driverGetVersion(), runtime=cupy.cuda.runtime.runtimeGetVersion(),
                    nvrtc=".".join(map(str, cupy.cuda.nvrtc.getVersion())))
    except AttributeError:  # the CPU stand-in
        info.update(name="CPU stand-in of CuPy (tests/cuda_emu)")
    for name in ("torch", "adasplash"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "importable")
        except ImportError:
            info[name] = None
    return info


def _compare(got, want, support_got=None, support_want=None) -> dict:
    """Differences of one output: entries whose bits differ, the largest difference relative
    to the reference's largest magnitude, rows whose support differs."""
    got, want = np.asarray(got), np.asarray(want)
    out = {"dtype": str(want.dtype), "entries": int(want.size),
           "bits_differ": int((got.view(np.uint8).reshape(got.shape + (-1,)) !=
                               want.view(np.uint8).reshape(want.shape + (-1,))).any(axis=-1).sum())}
    scale = float(np.abs(want[np.isfinite(want)]).max(initial=0.0)) or 1.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    out["max_diff_rel"] = float(np.nanmax(diff, initial=0.0)) / scale
    if support_got is not None:
        out["rows"] = int(np.size(support_want))
        out["support_differs"] = int((np.asarray(support_got) != np.asarray(support_want)).sum())
    return out


def _rows(rng, n_rows: int, n: int) -> np.ndarray:
    x = rng.standard_normal((n_rows, n)) * rng.choice([0.3, 1.0, 4.0], size=(n_rows, 1))
    x[::7, ::3] = -np.inf
    x[1::9, : n // 2] = x[1::9, :1]  # ties at the top
    x[2::11] += 1e6  # far from 0
    return x


def identity(small: bool = False) -> dict:
    """The cases of the module docstring (``small``: a few rows each, for the CPU stand-in)."""
    cupy = _import_cupy()
    import entmax_ref as er

    sys.path.insert(0, str(ROOT / "tests"))
    from cuda_cases import near_tie_problem

    rng = np.random.default_rng(2024)
    out = {}
    lengths = (40, 1500) if small else (300, 5000)  # warp- and block-per-row kernels
    for n in lengths:
        x64 = _rows(rng, 6 if small else 256, n)
        for dtype in (np.float32, np.float64):
            x = x64.astype(dtype)
            for alpha in (1.0, 1.25, 1.5, 2.0, 3.0):
                p = er.entmax(cupy.asarray(x), alpha=alpha, backend="cupy").get()
                want = er.entmax(x, alpha=alpha, backend="numpy")
                out[f"rows n={n} {np.dtype(dtype).name} alpha={alpha}"] = _compare(
                    p, want, (p > 0).sum(axis=1), (want > 0).sum(axis=1))
    for alpha in (1.5, 2.0):
        q, k, v, scale = near_tie_problem(alpha, seed=int(alpha * 10), B=10 if small else 100)
        got, gi = er.attention(*(cupy.asarray(t) for t in (q, k, v)), alpha=alpha, scale=scale, return_info=True,
                               backend="cupy")
        want, wi = er.attention(q, k, v, alpha=alpha, scale=scale, return_info=True, backend="numpy")
        out[f"attention near-tie float32 alpha={alpha}"] = _compare(got.get(), want, gi.support.get(), wi.support)
    B, H, N, D = (1, 2, 24, 8) if small else (2, 4, 256, 64)
    for dtype in (np.float32, np.float64):
        q, k, v, do = (rng.standard_normal((B, H, N, D)).astype(dtype) for _ in range(4))
        for alpha in (1.5, 3.0):
            kw = dict(alpha=alpha, scale=D ** -0.5, causal=True)
            dev = [cupy.asarray(t) for t in (q, k, v, do)]
            got, gi = er.attention(*dev[:3], return_info=True, backend="cupy", **kw)
            want, wi = er.attention(q, k, v, return_info=True, backend="numpy", **kw)
            name = f"attention causal {np.dtype(dtype).name} alpha={alpha}"
            out[name] = _compare(got.get(), want, gi.support.get(), wi.support)
            gg = er.attention_vjp(dev[3], *dev[:3], info=gi, backend="cupy", **kw)
            gw = er.attention_vjp(do, q, k, v, info=wi, backend="numpy", **kw)
            for part in ("dq", "dk", "dv"):
                out[f"{name} {part}"] = _compare(getattr(gg, part).get(), getattr(gw, part))
    return out


def _events_ms(fn, repeat: int) -> float:
    """Median milliseconds of fn() on the device (CUDA events), after one warm call."""
    cupy = _import_cupy()
    fn()
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def _torch_ms(fn, repeat: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def bench(sizes, budget: float) -> list:
    """The timings of the module docstring, one record per case."""
    cupy = _import_cupy()
    from entmax_ref.backends import AttentionSpec, get_backend

    gpu = get_backend("cupy")
    gpu.warmup()  # compiled by the compile part, or here from CuPy's disk cache
    records = []
    try:
        import torch
        import torch.nn.functional as F

        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    try:
        from adasplash import adasplash
    except ImportError:
        adasplash = None
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for N in sizes:
        if time.perf_counter() - start > budget:
            records.append({"case": f"N={N}", "skipped": f"the budget of {budget:.0f} s is spent"})
            continue
        x = cupy.asarray(rng.standard_normal((64, N)), dtype=cupy.float32)
        soft = _events_ms(lambda: cupy.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1), 5)
        for alpha in (1.5, 2.0, 1.25):
            a = np.full(64, alpha)
            ms = _events_ms(lambda: gpu.entmax_forward(x, a, None), 5)
            records.append({"case": f"rows 64 x {N} float32, alpha {alpha}", "ms": ms,
                            "baseline": "cupy exp-sum pass", "baseline_ms": soft})
        B, H, D = 1, 4, 64
        q, k, v, do = (cupy.asarray(rng.standard_normal((B, H, N, D)), dtype=cupy.float32) for _ in range(4))
        spec = AttentionSpec(alpha=1.5, scale=D ** -0.5, causal=True)
        fwd = gpu.attention_forward(q, k, v, spec)
        t_f = _events_ms(lambda: gpu.attention_forward(q, k, v, spec), 2)
        t_b = _events_ms(lambda: gpu.attention_backward(do, q, k, v, fwd, fwd.skew, spec), 2)
        rec_f = {"case": f"attention forward, alpha 1.5, causal, {B}x{H}x{N}x{D} float32", "ms": t_f}
        rec_b = {"case": f"attention backward, {B}x{H}x{N}x{D} float32", "ms": t_b}
        if has_torch:
            tq, tk, tv = (torch.as_tensor(a, device="cuda").requires_grad_() for a in (q, k, v))
            tdo = torch.as_tensor(do, device="cuda")
            rec_f.update(baseline="torch SDPA (softmax)",
                         baseline_ms=_torch_ms(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True), 5))
            o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            rec_b.update(baseline="torch SDPA backward",
                         baseline_ms=_torch_ms(lambda: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True),
                                               5))
        records += [rec_f, rec_b]
        if adasplash is not None and has_torch:
            aq, ak, av = (torch.as_tensor(a, device="cuda") for a in (q, k, v))
            records.append({"case": f"attention forward {B}x{H}x{N}x{D} float32", "ms": t_f,
                            "baseline": "AdaSplash alpha 1.5",
                            "baseline_ms": _torch_ms(lambda: adasplash(aq, ak, av, alpha=1.5, niter=10,
                                                                       is_causal=True), 5)})
        del q, k, v, do, fwd
        cupy.get_default_memory_pool().free_all_blocks()
    return records


def tests(junit: Path) -> dict:
    """Counts and failures of a pytest JUnit XML report."""
    if not junit.exists():
        return {"error": f"no report at {junit}"}
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    out = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    out["seconds"] = float(suite.get("time", 0.0))
    out["failed"] = []
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"].append({"test": f"{case.get('classname')}::{case.get('name')}",
                                  "message": (bad.get("message") or "")[:500]})
    return out


def compile_seconds() -> float:
    """Seconds to compile every kernel of the cupy backend for this device."""
    from entmax_ref.backends import get_backend

    t0 = time.perf_counter()
    get_backend("cupy").warmup()
    return time.perf_counter() - t0


def problems(result: dict) -> list:
    """What the first GPU run must not show: a part that failed, a GPU test that failed or
    erred, a case whose rows have another support than the CPU engine's.  (float32 bits and
    float64 differences are measurements: the device's math library and cuBLAS round
    otherwise than the CPU's, docs/cuda.md.)"""
    out = [f"{name}: {part['error']}" for name, part in result.items()
           if isinstance(part, dict) and "error" in part]
    tests_ = result.get("tests", {})
    if tests_.get("failures") or tests_.get("errors"):
        out.append(f"GPU tests: {tests_['failures']} failed, {tests_['errors']} erred of {tests_['tests']}")
    ident = result.get("identity", {})
    out += [f"identity {case}: {c['support_differs']} of {c['rows']} rows with another support"
            for case, c in ident.items() if isinstance(c, dict) and c.get("support_differs")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the results (a later part adds to it)")
    ap.add_argument("--parts", default="compile,identity,bench", help="which parts to run, in order")
    ap.add_argument("--tests", type=Path, help="the GPU tests' JUnit XML report, to fold in")
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds after which larger sizes are skipped")
    args = ap.parse_args()
    parts = args.parts.split(",")
    result = {} if "compile" in parts or not args.json.exists() else json.loads(args.json.read_text())
    result.setdefault("device", device())
    runs = {"compile": compile_seconds, "identity": identity,
            "bench": lambda: bench([int(s) for s in args.sizes.split(",")], args.budget)}
    for name in parts:
        t0 = time.perf_counter()
        try:
            result[name] = runs[name]()
        except Exception as e:  # noqa: BLE001 - one part's failure is recorded, the others still run
            result[name] = {"error": f"{type(e).__name__}: {e}"}
        result[f"{name}_seconds"] = time.perf_counter() - t0
        args.json.write_text(json.dumps(result, indent=1))
    if args.tests is not None:
        result["tests"] = tests(args.tests)
    result["problems"] = problems(result)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "identity"}, indent=1)[:4000])
    ident = result.get("identity", {})
    if isinstance(ident, dict) and "error" not in ident:
        print("identity: rows with another support:", sum(c.get("support_differs", 0) for c in ident.values()),
              "| float32 entries with other bits:",
              sum(c["bits_differ"] for c in ident.values() if c["dtype"] == "float32"))
    sys.exit(1 if result["problems"] else 0)


if __name__ == "__main__":
    main()
