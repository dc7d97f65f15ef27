"""Row transforms on the numba engine against ``torch.softmax`` in the same process.

512x8192 standard-normal rows; each repeat runs every case in turn (interleaved), and the
script prints the median time, the spread (min-max) and the ratio to ``torch.softmax`` of
the same dtype, with the thread counts and the load average.  Run from a clone root::

    python scripts/bench_rows.py --repeats 9 [--dtypes float32,float64] [--only softmax,entmax15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--only", default="softmax,entmax15,sparsemax,alpha1.33")
    ap.add_argument("--bisect", type=int, default=0, metavar="R",
                    help="also time entmax.entmax_bisect at 1.33 against ours, R interleaved repeats (slow)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numba
    import torch

    import entmax_ref as er
    from entmax_ref.backends.numba_backend import NumbaBackend

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    be = NumbaBackend()
    only = args.only.split(",")
    rng = np.random.default_rng(0)
    print(f"numba {numba.__version__} threads={numba.get_num_threads()} torch {torch.__version__} "
          f"threads={torch.get_num_threads()} load={os.getloadavg()[0]:.2f}")
    for dt in args.dtypes.split(","):
        x = rng.standard_normal((args.rows, args.cols)).astype(dt)
        xt = torch.from_numpy(x)
        fns = {"torch.softmax": lambda: torch.softmax(xt, dim=-1)}
        if "softmax" in only:
            fns["softmax"] = lambda: er.softmax(x, backend="numba")
        if "entmax15" in only:
            fns["entmax15"] = lambda: er.entmax15(x, backend="numba")
        if "sparsemax" in only:
            fns["sparsemax"] = lambda: er.sparsemax(x, backend="numba")
        if "alpha1.33" in only:
            fns["alpha=1.33"] = lambda: er.entmax(x, 1.33, backend="numba")
        for fn in fns.values():  # warm-up (compiles)
            fn()
        times = {k: [] for k in fns}
        load0 = os.getloadavg()[0]
        for _ in range(args.repeats):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        load1 = os.getloadavg()[0]
        base = statistics.median(times["torch.softmax"])
        print(f"{dt} {args.rows}x{args.cols}, {args.repeats} repeats, load {load0:.2f}-{load1:.2f}")
        for k, ts in times.items():
            med = statistics.median(ts)
            # per-repeat ratio spread: ours / torch in the same repeat
            rat = [a / b for a, b in zip(ts, times["torch.softmax"])]
            print(f"  {k:20s} {1e3 * med:8.2f} ms  [{1e3 * min(ts):7.2f}-{1e3 * max(ts):7.2f}]  "
                  f"x torch {med / base:5.2f}  (per-repeat {min(rat):.2f}-{max(rat):.2f})")
        if args.bisect:
            import entmax
            pair = {"alpha=1.33": lambda: er.entmax(x, 1.33, backend="numba"),
                    "entmax_bisect": lambda: entmax.entmax_bisect(xt, alpha=1.33, dim=-1)}
            tb = {k: [] for k in pair}
            for _ in range(args.bisect):
                for k, fn in pair.items():
                    t0 = time.perf_counter()
                    fn()
                    tb[k].append(time.perf_counter() - t0)
            sp = [b / a for a, b in zip(tb["alpha=1.33"], tb["entmax_bisect"])]
            print(f"  entmax_bisect(1.33) / ours: median {statistics.median(sp):.0f}x "
                  f"(per-repeat {min(sp):.0f}-{max(sp):.0f}x, {args.bisect} repeats, load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
