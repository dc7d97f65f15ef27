"""Peak memory and time of entmax attention forward + backward on one long head.

Runs each measurement in a fresh subprocess so that the peak resident set size
(``ru_maxrss``) belongs to that measurement alone, and optionally a second subprocess under
``tracemalloc`` (which sees every NumPy allocation, so its peak is the largest amount of
array memory alive at once).  Usage::

    python scripts/attention_memory.py                     # N = 65,536, D = 64, float32, alpha 1.5
    python scripts/attention_memory.py --n 8192 --causal --tracemalloc
    python scripts/attention_memory.py --child ...         # (internal) one measurement

Prints one JSON line per measurement and a human summary.  The full (N, N) float64 score
matrix at N = 65,536 would be 32 GiB; the library keeps it under 1 GiB of peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _child(args: argparse.Namespace) -> dict:
    import numpy as np

    import entmax_ref as er

    trace = args.mode == "tracemalloc"
    if trace:
        import tracemalloc

        tracemalloc.start()
    rng = np.random.default_rng(0)
    dt = np.dtype(args.dtype)
    shape = (1, 1, args.n, args.d)
    q = rng.standard_normal(shape).astype(dt)
    k = rng.standard_normal(shape).astype(dt)
    v = rng.standard_normal(shape).astype(dt)
    do = rng.standard_normal(shape).astype(dt)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if trace:
        base_traced = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    kw = dict(alpha=args.alpha, causal=args.causal, chunk=args.chunk, backend=args.backend)
    t0 = time.perf_counter()
    out, info = er.attention(q, k, v, return_info=True, **kw)
    t1 = time.perf_counter()
    grads = er.attention_vjp(do, q, k, v, info=info, **kw)
    t2 = time.perf_counter()
    res = {
        "n": args.n, "d": args.d, "dtype": args.dtype, "alpha": args.alpha, "causal": args.causal,
        "backend": args.backend or "auto", "mode": args.mode,
        "forward_s": round(t1 - t0, 2), "backward_s": round(t2 - t1, 2), "total_s": round(t2 - t0, 2),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_after_inputs_bytes": base_rss,
        "mean_support": float(info.support.mean()),
        "finite": bool(np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads[:3])),
    }
    if trace:
        res["traced_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        res["traced_inputs_bytes"] = base_traced
    res["full_matrix_f64_bytes"] = 8 * args.n * args.n
    return res


def _run(args: argparse.Namespace, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--n", str(args.n),
           "--d", str(args.d), "--dtype", args.dtype, "--alpha", str(args.alpha)]
    if args.causal:
        cmd.append("--causal")
    if args.chunk is not None:
        cmd += ["--chunk", str(args.chunk)]
    if args.backend:
        cmd += ["--backend", args.backend]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=65536, help="Nq = Nk")
    ap.add_argument("--d", type=int, default=64, help="head dim (D = Dv)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--alpha", type=float, default=1.5)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--tracemalloc", action="store_true", help="also measure under tracemalloc")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="rss", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    gib = 2.0**30
    results = [_run(args, "rss")] + ([_run(args, "tracemalloc")] if args.tracemalloc else [])
    for r in results:
        print(json.dumps(r))
    r = results[0]
    print(f"N = {r['n']}, D = {r['d']}, {r['dtype']}, alpha = {r['alpha']}, causal = {r['causal']}: "
          f"forward {r['forward_s']} s + backward {r['backward_s']} s = {r['total_s']} s; "
          f"peak RSS {r['peak_rss_bytes'] / gib:.3f} GiB (inputs loaded: {r['rss_after_inputs_bytes'] / gib:.3f} GiB); "
          f"a full (N, N) float64 matrix would be {r['full_matrix_f64_bytes'] / gib:.1f} GiB")
    if args.tracemalloc:
        t = results[1]
        print(f"tracemalloc peak of NumPy/Python allocations: {t['traced_peak_bytes'] / gib:.3f} GiB")
    ok = all(x["peak_rss_bytes"] < gib and x["finite"] for x in results)
    print("within 1 GiB" if ok else "OVER 1 GiB or non-finite")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
