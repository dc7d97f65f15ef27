"""Long-context scaling of causal attention forward + backward: ours against torch's SDPA.

For each sequence length N (default 1k, 2k, ..., 32k; 1 batch, 8 heads, D = 64, float32,
causal, alpha 1.5 for ours), each implementation runs in a fresh process of its own: one
small untimed call (kernels loaded, thread pools started), then ``--repeats`` timed
forward + backward calls at N, of which the median is reported, and the process's peak
resident set size above what it held once the inputs were made (``ru_maxrss``).  Ours is
``entmax_ref.attention(..., return_info=True)`` then ``attention_vjp(info=)`` on the numba
engine; the peer is ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``
and ``.backward()``, both on ``--threads`` threads.  Usage::

    python scripts/attention_scaling.py                       # the table, on stdout
    python scripts/attention_scaling.py --plot docs/img/attention_scaling.png --json out.json
    python scripts/attention_scaling.py --n 1024,4096 --repeats 1   # a quick look

Needs torch (the ``bench`` extra) and the compiled numba kernels (``entmax-ref compile``);
the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

CHILD = """
import json, resource, sys, time
import numpy as np
impl, n, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
H, D = 8, 64

def inputs(n):
    rng = np.random.default_rng(n)
    return [rng.standard_normal((1, H, n, D)).astype(np.float32) for _ in range(4)]

if impl == "ours":
    import numba
    import entmax_ref as er
    numba.set_num_threads(threads)

    def step(q, k, v, do):
        out, info = er.attention(q, k, v, alpha=1.5, causal=True, return_info=True, backend="numba")
        er.attention_vjp(do, q, k, v, info=info, alpha=1.5, causal=True, backend="numba")
else:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)

    def step(q, k, v, do):
        qq, kk, vv = (torch.from_numpy(a).requires_grad_(True) for a in (q, k, v))
        F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(torch.from_numpy(do))

step(*inputs(256))
args = inputs(n)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
times = []
for _ in range(repeats):
    t = time.perf_counter()
    step(*args)
    times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"impl": impl, "n": n, "times": times, "peak_above_inputs": max(0, peak - base)}))
"""

NAMES = {"ours": "entmax-ref (numba, alpha 1.5)", "sdpa": "torch SDPA (softmax)"}


def measure(impl: str, n: int, repeats: int, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    res = subprocess.run([sys.executable, "-c", CHILD, impl, str(n), str(repeats), str(threads)], env=env,
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{impl} at N={n} failed:\n{res.stderr[-3000:]}")
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    rec["median_s"] = sorted(rec["times"])[len(rec["times"]) // 2]
    return rec


def table(recs: list[dict]) -> str:
    by = {(r["impl"], r["n"]): r for r in recs}
    ns = sorted({r["n"] for r in recs})
    lines = ["| N | ours s | SDPA s | x SDPA's time | ours peak MiB | SDPA peak MiB |", "|---|---|---|---|---|---|"]
    for n in ns:
        o, s = by[("ours", n)], by[("sdpa", n)]
        lines.append(f"| {n:,} | {o['median_s']:.3f} | {s['median_s']:.3f} | {o['median_s'] / s['median_s']:.2f} | "
                     f"{o['peak_above_inputs'] / 2**20:.0f} | {s['peak_above_inputs'] / 2**20:.0f} |")
    return "\n".join(lines)


def plot(recs: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for impl, style in (("ours", "o-"), ("sdpa", "s--")):
        rs = sorted((r for r in recs if r["impl"] == impl), key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        ax1.plot(ns, [r["median_s"] for r in rs], style, label=NAMES[impl])
        ax2.plot(ns, [r["peak_above_inputs"] / 2**20 for r in rs], style, label=NAMES[impl])
    for ax, ylabel in ((ax1, "forward + backward, seconds (median)"), (ax2, "peak RSS above the inputs, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (causal, 8 heads, D = 64, float32)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default=",".join(str(1024 * 2**i) for i in range(6)), help="comma-separated lengths")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="write the figure (PNG) here")
    args = ap.parse_args(argv)
    recs = []
    for n in (int(s) for s in args.n.split(",")):
        for impl in ("ours", "sdpa"):
            t = time.perf_counter()
            recs.append(measure(impl, n, args.repeats, args.threads))
            print(f"[{impl} N={n}] {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    from entmax_ref.bench import machine

    head = f"{machine()}; {args.threads} threads each; median of {args.repeats}; python {platform.python_version()}"
    print(head)
    print(table(recs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": head, "records": recs}, f, indent=1)
    if args.plot:
        plot(recs, args.plot, head)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
