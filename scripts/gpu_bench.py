"""GPU benchmark of the cupy backend (run by scripts/gpu_check.sh; installs nothing).

Times, on the current device, in the same run (ratios matter, the machine is shared):
  * row alpha-entmax forward (alpha 1.5, 2 and 1.25) over 64 rows of N entries;
  * entmax attention forward and backward (alpha 1.5, B=1, H=4, D=64, float32, causal);
  * torch.nn.functional.scaled_dot_product_attention (softmax, same shapes) when torch
    has CUDA, and AdaSplash (adasplash.adasplash, alpha 1.5) when it is importable,
at N = 4096, 16384, 65536.  Prints a Markdown table; stops adding sizes once
--budget seconds have passed so that the whole check stays under its time limit.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _time(fn, repeat: int) -> float:
    """Median seconds of fn() on the GPU (events on the current stream), after one warm call."""
    import cupy

    fn()
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def _torch_time(fn, repeat: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,16384,65536")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds before larger sizes are skipped")
    args = ap.parse_args()
    import cupy

    from entmax_ref.backends import AttentionSpec, get_backend

    gpu = get_backend("cupy")
    t0 = time.perf_counter()
    gpu.warmup()
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; "
          f"kernels compiled in {time.perf_counter() - t0:.1f} s")
    try:
        import torch
        import torch.nn.functional as F

        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    try:
        from adasplash import adasplash  # noqa: F401

        has_ada = has_torch
    except ImportError:
        has_ada = False

    rng = np.random.default_rng(0)
    print("\n| N | op | entmax-ref cupy (ms) | baseline | baseline (ms) | ratio |")
    print("|---|---|---|---|---|---|")
    start = time.perf_counter()
    for N in (int(s) for s in args.sizes.split(",")):
        if time.perf_counter() - start > args.budget:
            print(f"| {N} | skipped: the time budget of {args.budget:.0f} s is spent | | | | |")
            continue
        # Row entmax.
        x = cupy.asarray(rng.standard_normal((64, N)), dtype=cupy.float32)
        for alpha in (1.5, 2.0, 1.25):
            a = cupy.full(64, alpha)
            ms = 1e3 * _time(lambda: gpu.entmax_forward(x, a, None), 5)
            soft = 1e3 * _time(lambda: cupy.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1), 5)
            print(f"| {N} | rows 64 x N, alpha {alpha} | {ms:.3f} | cupy softmax | {soft:.3f} | {ms / soft:.1f} |")
        # Attention.
        B, H, D = 1, 4, 64
        q, k, v, do = (cupy.asarray(rng.standard_normal((B, H, N, D)), dtype=cupy.float32) for _ in range(4))
        spec = AttentionSpec(alpha=1.5, scale=D ** -0.5, causal=True)
        fwd = gpu.attention_forward(q, k, v, spec)
        t_f = 1e3 * _time(lambda: gpu.attention_forward(q, k, v, spec), 1)
        t_b = 1e3 * _time(lambda: gpu.attention_backward(do, q, k, v, fwd, fwd.skew, spec), 1)
        base = "-"
        t_tf = t_tb = float("nan")
        if has_torch:
            tq, tk, tv = (torch.as_tensor(a, device="cuda").requires_grad_() for a in (q, k, v))
            tdo = torch.as_tensor(do, device="cuda")
            t_tf = 1e3 * _torch_time(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True), 3)
            out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            t_tb = 1e3 * _torch_time(lambda: torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True), 3)
            base = "torch SDPA (softmax)"
        print(f"| {N} | attention fwd, alpha 1.5, causal, B{B} H{H} D{D} | {t_f:.1f} | {base} | {t_tf:.2f} | {t_f / t_tf:.1f} |")
        print(f"| {N} | attention bwd | {t_b:.1f} | {base} | {t_tb:.2f} | {t_b / t_tb:.1f} |")
        if has_ada:
            from adasplash import adasplash

            aq, ak, av = (torch.as_tensor(a, device="cuda") for a in (q, k, v))
            t_a = 1e3 * _torch_time(lambda: adasplash(aq, ak, av, alpha=1.5, niter=10, is_causal=True), 3)
            print(f"| {N} | attention fwd | {t_f:.1f} | AdaSplash alpha 1.5 | {t_a:.2f} | {t_f / t_a:.1f} |")
        del q, k, v, do, fwd
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
