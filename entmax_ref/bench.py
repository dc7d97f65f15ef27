"""``entmax-ref bench``: the CPU engine against its peers, as ratios measured in one run.

Every figure is a ratio of two timings taken in the same process, interleaved repeat by
repeat (A, B, A, B, ...) and summarised by their medians, so that a noisy or shared
machine slows both sides alike.  Compile time is excluded (every callable runs once
before timing).

Rows (``512 x 8192`` standard-normal scores, float32 and float64, one solve per row):

* 1.5-entmax and sparsemax: ``entmax_ref`` (numba backend) against the ``entmax``
  package's ``entmax15`` / ``sparsemax`` (PyTorch, CPU) and against ``torch.softmax`` on
  the same array (targets: >= 30x faster than entmax, <= 3x the time of softmax);
* alpha = 1.33: against ``entmax.entmax_bisect`` (target >= 30x faster).

Two timings are reported for entmax-ref: ``api`` is the public function as a user calls
it (input validation, finiteness scan, reshaping included) and ``kernel`` is the backend's
row solver alone.  Targets are judged on ``api``.

Attention (``--attention``): causal, B=1, H=8, N=4096, D=64, float32, alpha = 1.5, forward
against ``torch.nn.functional.scaled_dot_product_attention`` (softmax; target <= 2x) and
against an eager PyTorch implementation with ``entmax.entmax15`` (target >= 20x faster),
and forward+backward against SDPA forward+backward (target <= 3x).  Each attention ratio
comes from its own interleaved pair (ours and that baseline); the eager peer, at ~15 s a
call, runs at most 3 repeats.

PyTorch runs with ``torch.set_num_threads(threads)`` (default 2) and numba with the same
number of threads.  Usage::

    entmax-ref bench [--repeats N] [--threads T] [--json PATH] [--attention | --attention-only] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

ROWS, COLS = 512, 8192


def _time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each callable, run in turn within every repeat (after a warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _row_cases(torch, entmax, er, be, dtype, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS)).astype(dtype)
    xt = torch.from_numpy(x)
    results = []
    cases = [
        ("1.5-entmax", 1.5, lambda: er.entmax15(x, backend="numba"), lambda: entmax.entmax15(xt, dim=-1),
         "entmax.entmax15"),
        ("sparsemax", 2.0, lambda: er.sparsemax(x, backend="numba"), lambda: entmax.sparsemax(xt, dim=-1),
         "entmax.sparsemax"),
        ("alpha=1.33", 1.33, lambda: er.entmax(x, 1.33, backend="numba"),
         lambda: entmax.entmax_bisect(xt, alpha=1.33, dim=-1), "entmax.entmax_bisect"),
    ]
    for name, alpha, ours, peer, peer_name in cases:
        a = np.full(ROWS, alpha)
        fns = {
            "api": ours,
            "kernel": lambda a=a: be.entmax_forward(x, a, None),
            "peer": peer,
            "softmax": lambda: torch.softmax(xt, dim=-1),
        }
        # the peers are 10-1000x slower: fewer repeats of them would do, but interleaving
        # keeps the ratio honest on a shared machine, so all run the same count
        t = _time_interleaved(fns, repeats)
        dt = np.dtype(dtype).name
        results.append({
            "case": f"{name} {ROWS}x{COLS} {dt}", "ours_api_ms": 1e3 * t["api"], "ours_kernel_ms": 1e3 * t["kernel"],
            "baseline": peer_name, "baseline_ms": 1e3 * t["peer"], "speedup": t["peer"] / t["api"],
            "speedup_kernel": t["peer"] / t["kernel"], "target": ">= 30x faster", "met": t["peer"] / t["api"] >= 30.0,
        })
        if alpha in (1.5, 2.0):
            results.append({
                "case": f"{name} {ROWS}x{COLS} {dt}", "ours_api_ms": 1e3 * t["api"],
                "ours_kernel_ms": 1e3 * t["kernel"], "baseline": "torch.softmax", "baseline_ms": 1e3 * t["softmax"],
                "time_ratio": t["api"] / t["softmax"], "time_ratio_kernel": t["kernel"] / t["softmax"],
                "target": "<= 3x softmax time", "met": t["api"] / t["softmax"] <= 3.0,
            })
    return results


def _attention_cases(torch, entmax, er, repeats: int, n: int) -> list[dict]:
    import torch.nn.functional as F

    B, H, D = 1, 8, 64
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((B, H, n, D)).astype(np.float32)
    qt, kt, vt, dot = (torch.from_numpy(a) for a in (q, k, v, do))
    scale = 1.0 / np.sqrt(D)
    mask = torch.ones(n, n, dtype=torch.bool).tril()

    def eager_entmax():
        s = (qt @ kt.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        return entmax.entmax15(s, dim=-1) @ vt

    def sdpa_fwd_bwd():
        qq, kk, vv = (a.clone().requires_grad_(True) for a in (qt, kt, vt))
        F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(dot)

    def ours_fwd_bwd():
        out, info = er.attention(q, k, v, alpha=1.5, causal=True, return_info=True, backend="numba")
        er.attention_vjp(do, q, k, v, info=info, alpha=1.5, causal=True, backend="numba")

    def ours():
        return er.attention(q, k, v, alpha=1.5, causal=True, backend="numba")

    # each ratio from its own interleaved pair: the eager peer's long runs (with their
    # (N, N) tensors) would otherwise disturb the timing of the neighbouring SDPA ratio
    with torch.no_grad():
        t = _time_interleaved({"ours": ours, "sdpa": lambda: F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True)}, repeats)
        te = _time_interleaved({"ours": ours, "eager": eager_entmax}, max(1, min(repeats, 3)))
    tb = _time_interleaved({"ours": ours_fwd_bwd, "sdpa": sdpa_fwd_bwd}, repeats)
    case = f"attention causal B=1 H=8 N={n} D=64 float32 alpha=1.5"
    return [
        {"case": case + " fwd", "ours_api_ms": 1e3 * t["ours"], "baseline": "torch SDPA (softmax)",
         "baseline_ms": 1e3 * t["sdpa"], "time_ratio": t["ours"] / t["sdpa"], "target": "<= 2x SDPA time",
         "met": t["ours"] / t["sdpa"] <= 2.0},
        {"case": case + " fwd", "ours_api_ms": 1e3 * te["ours"], "baseline": "eager torch + entmax.entmax15",
         "baseline_ms": 1e3 * te["eager"], "speedup": te["eager"] / te["ours"], "target": ">= 20x faster",
         "met": te["eager"] / te["ours"] >= 20.0},
        {"case": case + " fwd+bwd", "ours_api_ms": 1e3 * tb["ours"], "baseline": "torch SDPA fwd+bwd",
         "baseline_ms": 1e3 * tb["sdpa"], "time_ratio": tb["ours"] / tb["sdpa"], "target": "<= 3x SDPA time",
         "met": tb["ours"] / tb["sdpa"] <= 3.0},
    ]


def _print_table(rows: list[dict]) -> None:
    head = f"{'case':<44} {'ours ms':>9} {'kernel':>8}  {'baseline':<30} {'base ms':>9}  {'figure':>16}  {'target':<20} met"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "speedup" in r:
            fig = f"{r['speedup']:.1f}x faster"
        else:
            fig = f"{r['time_ratio']:.2f}x the time"
        kern = f"{r['ours_kernel_ms']:8.2f}" if "ours_kernel_ms" in r else f"{'':>8}"
        print(f"{r['case']:<44} {r['ours_api_ms']:9.2f} {kern}  {r['baseline']:<30} {r['baseline_ms']:9.2f}  "
              f"{fig:>16}  {r['target']:<20} {'yes' if r['met'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="entmax-ref bench", description=__doc__.split("\n\n")[0].replace("``", ""))
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per callable (median; default 7)")
    ap.add_argument("--threads", type=int, default=2, help="threads for torch and numba (default 2)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--attention", action="store_true", help="also run the attention figures (slow)")
    ap.add_argument("--attention-only", action="store_true", help="only the attention figures")
    ap.add_argument("--attention-n", type=int, default=4096, help="sequence length of the attention figures")
    ap.add_argument("--quick", action="store_true", help="float32 rows only, 3 repeats (a smoke run)")
    args = ap.parse_args(argv)

    try:
        import torch
        import entmax
    except ImportError as exc:  # the peers are optional dependencies
        print(f'entmax-ref bench needs its peers torch and entmax: pip install "entmax-ref[bench]" ({exc})',
              file=sys.stderr)
        return 2
    import numba

    import entmax_ref as er

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    be = er.get_backend("numba")
    repeats = 3 if args.quick else args.repeats
    dtypes = [np.float32] if args.quick else [np.float32, np.float64]

    results: list[dict] = []
    for dt in ([] if args.attention_only else dtypes):
        results += _row_cases(torch, entmax, er, be, dt, repeats)
    if args.attention or args.attention_only:
        results += _attention_cases(torch, entmax, er, repeats, args.attention_n)

    print(f"entmax-ref bench: numba {numba.__version__} ({numba.get_num_threads()} threads), torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), entmax {getattr(entmax, '__version__', '?')}, "
          f"{platform.processor() or platform.machine()}; medians of {repeats} interleaved repeats")
    _print_table(results)
    if args.json:
        meta = {"numba": numba.__version__, "torch": torch.__version__, "threads": args.threads,
                "repeats": repeats, "machine": platform.platform()}
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
