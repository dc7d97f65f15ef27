"""``entmax-ref bench``: the CPU engine against its peers, as ratios measured in one run.

Every figure is a ratio of two timings taken in the same process, interleaved repeat by
repeat (A, B, A, B, ...): the ratio of each repeat's pair, summarised by the median over
the repeats, with the spread (the smallest and largest ratio of a repeat), so that a noisy
or shared machine slows both sides alike and its noise shows.  Compile time is excluded
(every callable runs once before timing).

Rows (``512 x 8192`` standard-normal scores, float32 and float64, one solve per row):

* softmax: ``entmax_ref.softmax`` against ``torch.softmax`` (target <= 1.5x the time);
* 1.5-entmax and sparsemax: against ``torch.softmax`` on the same array (target <= 1.2x)
  and the ``entmax`` package's ``entmax15`` / ``sparsemax`` (PyTorch, CPU; >= 30x faster);
* alpha = 1.33: against ``torch.softmax`` (<= 2.5x) and ``entmax.entmax_bisect`` (>= 50x).

Two timings are reported for entmax-ref: ``api`` is the public function as a user calls
it (input validation, finiteness scan, reshaping included) and ``kernel`` is the backend's
row solver alone.  Targets are judged on ``api``.

Attention (``--attention``), float32, alpha = 1.5, against
``torch.nn.functional.scaled_dot_product_attention`` (softmax):

* causal, B=1, H=8, N=4096, D=64: forward (target <= 1.0x SDPA's time), forward+backward
  against SDPA forward+backward (<= 0.5x), and the forward against an eager PyTorch
  implementation with ``entmax.entmax15`` (>= 20x faster; at ~15 s a call it runs at most
  3 repeats);
* decoding: 1 query over 65,536 cached keys, 8 heads, D=64, forward, as a user calls it
  (``check_finite=True``, the default: k and v are scanned for NaN/inf, which reads all
  of K and V) against its floor, one read of K and V (target <= 1.1x that read's time),
  and against SDPA (no target: how near that floor SDPA runs varies by machine); with
  ``check_finite=False`` (V read on each row's support only) against SDPA (<= 0.7x);
* with ``--long``, forward+backward at N = 16,384 against SDPA's (<= 0.4x; <= 3 repeats).

Each attention ratio comes from its own interleaved pair (ours and that baseline).

Some cases are also timed beside a *floor*, the least work the case must do, in the same
interleaved repeats, and printed under the table as multiples of it: softmax beside the
float64 ``exp(x - max)`` of every entry alone (its float64 contract needs each term of the
sum to a few float64 ulps), the other row transforms beside one read of x and one write of
p (every row transform, torch.softmax included, moves those bytes), and checked decoding
beside one read of K and V (the bytes a NaN/inf scan of the inputs must read).  A floor
above the target's share of the baseline's time shows that no implementation of that work
can meet the target here; a baseline near its floor leaves a target only the room between.

PyTorch runs with ``torch.set_num_threads(threads)`` (default 2) and numba with the same
number of threads, and with ``torch.set_float32_matmul_precision("highest")`` (SDPA's
float32 products in float32, not in a reduced precision a machine may offer); the thread
counts, the precision and the load average are printed, and all three settings are
restored when the bench returns.  Every timed call comes after
an idle pause (``--gap``, default 0.05 s): after a torch call its OpenMP workers keep spinning
for several milliseconds, and on a machine with as many cores as threads the call timed next
(ours, in the interleaved order) would run against them.  After the pause, a call shorter than
0.1 s is made once untimed, so that the timed one finds its own threads awake, as in a loop
(``REWARM_S``).  Usage::

    entmax-ref bench [--repeats N] [--runs R] [--threads T] [--gap S] [--json PATH]
                     [--attention | --attention-only] [--long] [--training | --training-only] [--quick]

``--runs R`` makes R runs of every case (one after the other, each its own interleaved
repeats) and judges each target on the median of the R runs' ratios, printed under the
case with each run's ratio: one run's median still moves with the machine's state.

Training (``--training``): one step (forward, backward, gradients of q, k, v and a learned
alpha per head) of causal attention, B=1, H=4, N=256, D=32, float32, through
:func:`entmax_ref.torch.attention` against eager PyTorch with ``entmax.entmax_bisect`` on
the dense scores (>= 10x faster).

The table prints each case on a line of its own, then its figures: ours and the peer in ms
and the ratio of ours to the peer's time ("x peer", below 1 is faster; a ">= F x faster"
target is "<= 1/F x"), in at most 100 columns; a row without a target (``-``) is printed
for comparison only.  Progress goes to stderr; ``--json`` writes
every figure, with the CPU model, its vector ISA and the cores in ``meta.cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import textwrap
import time
from typing import Callable

import numpy as np

ROWS, COLS = 512, 8192
DECODE_KEYS = 65536


class _Timings:
    """Seconds of each callable per repeat (interleaved); ratios are taken repeat by repeat."""

    def __init__(self, times: dict[str, list[float]]):
        self.times = times

    def ms(self, name: str) -> float:
        return 1e3 * statistics.median(self.times[name])

    def ratio(self, num: str, den: str) -> tuple[float, float, float]:
        """(median, smallest, largest) of the per-repeat ratios num / den."""
        r = [a / b for a, b in zip(self.times[num], self.times[den])]
        return statistics.median(r), min(r), max(r)


#: seconds of idle before each timed call (``--gap``): torch's OpenMP workers spin for a few
#: milliseconds after each torch call (libgomp's default wait policy, about 7 ms of CPU time
#: measured here), and a call timed right after one competes with them for the cores
GAP = 0.05


#: a callable whose warm-up call took less than this many seconds is called once more,
#: untimed, right before each timed call (see :func:`_time_interleaved`)
REWARM_S = 0.1


def _time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> _Timings:
    """Each callable run in turn within every repeat (after a warm-up), each after an idle
    pause of :data:`GAP` seconds so that no callable is timed against the spinning threads of
    the one before, then, for calls shorter than :data:`REWARM_S`, one untimed call of its
    own: the timed call finds its threads awake and its data in cache, as in a loop.
    Without it a short call pays the wake-up of its threads after the pause, which is no
    property of the implementation: on a 2-core AMD EPYC (Zen 4, AVX-512) torch.softmax of
    512 x 8192 float32 took 6-7 ms after the pause and 1.3-2 ms in a loop, ours 6 and 5 ms."""
    rewarm = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        rewarm[name] = time.perf_counter() - t0 < REWARM_S
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if GAP > 0:
                time.sleep(GAP)
            if rewarm[name]:
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return _Timings(times)


def _time_ratio(t: _Timings, ours: str, base: str, case: str, baseline: str, target: str, limit: float | None,
                kernel: str | None = None) -> dict:
    """A result row with ours/base as 'the time' (met when the median is <= limit; no
    verdict, ``met`` None, without a limit)."""
    med, lo, hi = t.ratio(ours, base)
    row = {"case": case, "ours_api_ms": t.ms(ours), "baseline": baseline, "baseline_ms": t.ms(base),
           "time_ratio": med, "spread": [lo, hi], "target": target, "limit": limit,
           "met": None if limit is None else med <= limit}
    if kernel is not None:
        row["ours_kernel_ms"] = t.ms(kernel)
        row["time_ratio_kernel"] = t.ratio(kernel, base)[0]
    return row


def _speedup(t: _Timings, ours: str, base: str, case: str, baseline: str, target: str, limit: float,
             kernel: str | None = None) -> dict:
    """A result row with base/ours as 'faster' (met when the median is >= limit)."""
    med, lo, hi = t.ratio(base, ours)
    row = {"case": case, "ours_api_ms": t.ms(ours), "baseline": baseline, "baseline_ms": t.ms(base),
           "speedup": med, "spread": [lo, hi], "target": target, "limit": limit, "met": med >= limit}
    if kernel is not None:
        row["ours_kernel_ms"] = t.ms(kernel)
        row["speedup_kernel"] = t.ratio(base, kernel)[0]
    return row


def _merge_runs(runs: list[list[dict]]) -> list[dict]:
    """The rows of several runs of the same cases (``runs[i]`` the rows of run i, in one
    order) as one row each: the median over the runs of each figure, each run's ratio in
    ``runs``, the smallest and largest ratio of a repeat over all runs as the spread, and
    the verdict on the median of the runs' ratios."""
    merged = []
    for rows in zip(*runs):
        row = dict(rows[0])
        key = "speedup" if "speedup" in row else "time_ratio"
        for field, value in row.items():
            if isinstance(value, float) and field != "limit":
                row[field] = statistics.median(r[field] for r in rows)
        row["runs"] = [r[key] for r in rows]
        row["spread"] = [min(r["spread"][0] for r in rows), max(r["spread"][1] for r in rows)]
        if row["limit"] is not None:
            row["met"] = row[key] >= row["limit"] if key == "speedup" else row[key] <= row["limit"]
        merged.append(row)
    return merged


@functools.lru_cache(maxsize=None)
def _floors():
    """Three floors, the least work a case must do, as numba kernels on the engine's threads
    (compiled once a process, on first use; not in the kernel cache): ``exp_rows(x, m, r0,
    r1)`` takes the float64 exponential ``vexp_neg(x - m)`` of every entry of rows ``r0 ..
    r1 - 1`` into a row of scratch, which softmax must do to meet its float64 contract;
    ``read_rows(a, zero, r0, r1)`` sums rows of ``a`` in its own dtype (``zero`` of that
    dtype), reading each byte once, which a call that scans its inputs for NaN/inf must
    do; ``read_write_rows(x, out, r0, r1)`` sums each row of ``x`` into ``out[r, 0]`` and
    zeros the rest of the row, a read of every input and a write of every output, which
    every row transform does.  They compile on the kernels' own target (the package's
    ``jit``: the same vector width as the kernels they are compared with)."""
    from entmax_ref.backends.numba._jit import jit as njit
    from entmax_ref.backends.numba.vexp import vexp_neg

    @njit(nogil=True, no_cpython_wrapper=False)
    def exp_rows(x, m, r0, r1):
        e = np.empty(x.shape[1])
        for r in range(r0, r1):
            for i in range(x.shape[1]):
                e[i] = vexp_neg(np.float64(x[r, i]) - m[r])
        return e

    @njit(nogil=True, fastmath={"reassoc"}, no_cpython_wrapper=False)
    def read_rows(a, zero, r0, r1):
        t = zero
        for r in range(r0, r1):
            for d in range(a.shape[1]):
                t += a[r, d]
        return t

    @njit(nogil=True, fastmath={"reassoc"}, no_cpython_wrapper=False)
    def read_write_rows(x, out, r0, r1):
        for r in range(r0, r1):
            t = x.dtype.type(0)
            for i in range(x.shape[1]):
                t += x[r, i]
            for i in range(x.shape[1]):
                out[r, i] = 0
            out[r, 0] = t

    return exp_rows, read_rows, read_write_rows


def _on_threads(kernel, a, *args):
    """``kernel(a, *args, r0, r1)`` over the rows of the 2-D ``a`` on the numba threads."""
    import numba

    from entmax_ref.backends.numba._threads import run_blocks

    run_blocks(kernel, (a, *args), a.shape, 2 * numba.get_num_threads())


def _with_floor(row: dict, t: _Timings, ours: str, base: str, what: str) -> dict:
    """``row`` (the ratio of ``ours`` to ``base`` in ``t``) with the time of the floor
    (``t``'s callable ``"floor"``, described by ``what``) and the ratios of ours and of the
    baseline to it."""
    row.update(floor=what, floor_ms=t.ms("floor"), ours_over_floor=t.ratio(ours, "floor")[0],
               baseline_over_floor=t.ratio(base, "floor")[0])
    return row


def _row_cases(torch, entmax, er, be, dtype, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS)).astype(dtype)
    xt = torch.from_numpy(x)
    dt = np.dtype(dtype).name
    softmax = lambda: torch.softmax(xt, dim=-1)  # noqa: E731
    exp_rows = _floors()[0]
    m = x.max(axis=1).astype(np.float64)
    t = _time_interleaved({"api": lambda: er.softmax(x, backend="numba"),
                           "kernel": lambda: be.entmax_forward(x, np.ones(ROWS), None), "softmax": softmax,
                           "floor": lambda: _on_threads(exp_rows, x, m)}, repeats)
    results = [_with_floor(_time_ratio(t, "api", "softmax", f"softmax {ROWS}x{COLS} {dt}", "torch.softmax",
                                       "<= 1.5x softmax time", 1.5, kernel="kernel"), t, "api", "softmax",
                           "the float64 exp(x - max) of every entry, nothing else")]
    cases = [
        ("1.5-entmax", 1.5, lambda: er.entmax15(x, backend="numba"), lambda: entmax.entmax15(xt, dim=-1),
         "entmax.entmax15", 30.0, 1.2),
        ("sparsemax", 2.0, lambda: er.sparsemax(x, backend="numba"), lambda: entmax.sparsemax(xt, dim=-1),
         "entmax.sparsemax", 30.0, 1.2),
        ("alpha=1.33", 1.33, lambda: er.entmax(x, 1.33, backend="numba"),
         lambda: entmax.entmax_bisect(xt, alpha=1.33, dim=-1), "entmax.entmax_bisect", 50.0, 2.5),
    ]
    read_write_rows = _floors()[2]
    for name, alpha, ours, peer, peer_name, fast, slow in cases:
        a = np.full(ROWS, alpha)
        fns = {"api": ours, "kernel": lambda a=a: be.entmax_forward(x, a, None), "peer": peer, "softmax": softmax,
               "floor": lambda: _on_threads(read_write_rows, x, np.empty_like(x))}
        # the peers are 10-1000x slower: fewer repeats of them would do, but interleaving
        # keeps the ratio honest on a shared machine, so all run the same count
        t = _time_interleaved(fns, repeats)
        case = f"{name} {ROWS}x{COLS} {dt}"
        results.append(_with_floor(_time_ratio(t, "api", "softmax", case, "torch.softmax",
                                               f"<= {slow:g}x softmax time", slow, kernel="kernel"), t, "api",
                                   "softmax", "one read of x and one write of p, nothing else"))
        results.append(_speedup(t, "api", "peer", case, peer_name, f">= {fast:g}x faster", fast, kernel="kernel"))
    return results


#: the attention cases' name (of the sequence length), and the length of ``--long``
ATTENTION_CASE, LONG_N = "attention causal B=1 H=8 N={} D=64 float32 alpha=1.5", 16384


def _attention_problem(torch, n: int):
    """Causal attention of the bench, B=1 H=8 D=64 float32, N = ``n``: (q, k, v, dO) as
    NumPy arrays and as tensors, and the forward+backward of ours (with ``info=``) and of
    SDPA."""
    import torch.nn.functional as F

    import entmax_ref as er

    B, H, D = 1, 8, 64
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((B, H, n, D)).astype(np.float32)
    tensors = tuple(torch.from_numpy(a) for a in (q, k, v, do))

    def sdpa_fwd_bwd():
        qq, kk, vv = (a.clone().requires_grad_(True) for a in tensors[:3])
        F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(tensors[3])

    def ours_fwd_bwd():
        out, info = er.attention(q, k, v, alpha=1.5, causal=True, return_info=True, backend="numba")
        er.attention_vjp(do, q, k, v, info=info, alpha=1.5, causal=True, backend="numba")

    return (q, k, v, do), tensors, ours_fwd_bwd, sdpa_fwd_bwd


def _attention_cases(torch, entmax, er, repeats: int, n: int, eager: bool = True) -> list[dict]:
    import torch.nn.functional as F

    (q, k, v, _), (qt, kt, vt, _), ours_fwd_bwd, sdpa_fwd_bwd = _attention_problem(torch, n)
    scale = 1.0 / np.sqrt(q.shape[-1])
    mask = torch.ones(n, n, dtype=torch.bool).tril()

    def eager_entmax():
        s = (qt @ kt.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        return entmax.entmax15(s, dim=-1) @ vt

    def ours():
        return er.attention(q, k, v, alpha=1.5, causal=True, backend="numba")

    # each ratio from its own interleaved pair: the eager peer's long runs (with their
    # (N, N) tensors) would otherwise disturb the timing of the neighbouring SDPA ratio
    with torch.no_grad():
        t = _time_interleaved({"ours": ours, "sdpa": lambda: F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True)}, repeats)
        te = _time_interleaved({"ours": ours, "eager": eager_entmax}, max(1, min(repeats, 3))) if eager else None
    tb = _time_interleaved({"ours": ours_fwd_bwd, "sdpa": sdpa_fwd_bwd}, repeats)
    case = ATTENTION_CASE.format(n)
    rows = [_time_ratio(t, "ours", "sdpa", case + " fwd", "torch SDPA (softmax)", "<= 1.0x SDPA time", 1.0)]
    if te is not None:
        rows.append(_speedup(te, "ours", "eager", case + " fwd", "eager torch + entmax.entmax15", ">= 20x faster",
                             20.0))
    rows.append(_time_ratio(tb, "ours", "sdpa", case + " fwd+bwd", "torch SDPA fwd+bwd", "<= 0.5x SDPA time", 0.5))
    return rows


def _long_case(torch, repeats: int, n: int = LONG_N) -> list[dict]:
    """Forward+backward at a long context (``--long``): at most 3 repeats (a pair takes ~10 s)."""
    _, _, ours_fwd_bwd, sdpa_fwd_bwd = _attention_problem(torch, n)
    tb = _time_interleaved({"ours": ours_fwd_bwd, "sdpa": sdpa_fwd_bwd}, max(1, min(repeats, 3)))
    return [_time_ratio(tb, "ours", "sdpa", ATTENTION_CASE.format(n) + " fwd+bwd", "torch SDPA fwd+bwd",
                        "<= 0.4x SDPA time", 0.4)]


def _decoding_case(torch, er, repeats: int, nk: int) -> list[dict]:
    import torch.nn.functional as F

    B, H, D = 1, 8, 64
    rng = np.random.default_rng(2)
    q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, H, nk, D)).astype(np.float32) for _ in range(2))
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt)  # noqa: E731
    read_rows = _floors()[1]
    kr, vr = k.reshape(-1, D), v.reshape(-1, D)

    def read_kv():
        _on_threads(read_rows, kr, kr.dtype.type(0))
        _on_threads(read_rows, vr, vr.dtype.type(0))

    with torch.no_grad():  # each ratio from its own interleaved pair (the checked call's with its floor)
        t = _time_interleaved({"ours": lambda: er.attention(q, k, v, alpha=1.5, backend="numba"),
                               "sdpa": sdpa, "floor": read_kv}, repeats)
        tu = _time_interleaved({"ours": lambda: er.attention(q, k, v, alpha=1.5, backend="numba", check_finite=False),
                                "sdpa": sdpa}, repeats)
    case = f"decoding 1 query x {nk} keys H=8 D=64 float32 alpha=1.5"
    floor = f"one read of K and V ({(k.nbytes + v.nbytes) / 2**20:.0f} MiB), nothing else"
    return [_time_ratio(t, "ours", "floor", case, "its floor: one read of K and V", "<= 1.1x floor time", 1.1),
            _with_floor(_time_ratio(t, "ours", "sdpa", case, "torch SDPA (softmax)", "none", None), t, "ours",
                        "sdpa", floor),
            _time_ratio(tu, "ours", "sdpa", case + " check_finite=False", "torch SDPA (softmax)",
                        "<= 0.7x SDPA time", 0.7)]


def _training_case(torch, entmax, repeats: int, n: int = 256) -> list[dict]:
    """One training step of a causal attention layer with a learned alpha per head (forward,
    backward, the gradients of q, k, v and alpha), float32, B=1, H=4, D=32:
    :func:`entmax_ref.torch.attention` against eager PyTorch with ``entmax.entmax_bisect``
    (the peer's differentiable-alpha entmax) on the dense scores."""
    import entmax_ref.torch as ert

    B, H, D = 1, 4, 32
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for _ in range(3))
    alpha = torch.linspace(1.2, 1.8, H)
    mask = torch.ones(n, n, dtype=torch.bool).tril()

    def leaves():
        return [t.clone().requires_grad_(True) for t in (q, k, v, alpha)]

    def ours():
        qq, kk, vv, aa = leaves()
        ert.attention(qq, kk, vv, alpha=aa, causal=True, backend="numba").square().sum().backward()

    def peer():
        qq, kk, vv, aa = leaves()
        s = ((qq @ kk.transpose(-1, -2)) / D ** 0.5).masked_fill(~mask, float("-inf"))
        p = entmax.entmax_bisect(s, alpha=aa.view(1, H, 1, 1).expand(B, H, n, 1), dim=-1)
        (p @ vv).square().sum().backward()

    t = _time_interleaved({"ours": ours, "peer": peer}, repeats)
    case = f"training step: causal attention, learned alpha per head, B=1 H=4 N={n} D=32 float32"
    return [_speedup(t, "ours", "peer", case, "eager torch + entmax.entmax_bisect", ">= 10x faster", 10.0)]


def machine() -> str:
    """The CPU model, its widest vector instruction set and the cores this process may use."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:  # not Linux
        pass
    known = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON"), ("sse4_2", "SSE4.2"))
    isa = next((name for flag, name in known if flag in flags), "vector ISA unknown")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {isa}, {cores} cores"


def _ratio_cells(r: dict) -> tuple[float, str, str]:
    """(ours / peer time, its spread, the target) of a row, in the one convention "x the
    peer's time" (below 1 is faster); a speedup row's ">= F x faster" is "<= 1/F x"; a row
    without a target has "-"."""
    lo, hi = r["spread"]
    if "speedup" in r:
        return 1.0 / r["speedup"], f"{1 / hi:.3g}-{1 / lo:.3g}", f"<= {1 / r['limit']:.3g}x"
    target = "-" if r["limit"] is None else f"<= {r['limit']:g}x"
    return r["time_ratio"], f"{lo:.3g}-{hi:.3g}", target


def _say(text: str) -> None:
    """Print ``text`` wrapped at 100 columns (continuation lines indented)."""
    print(textwrap.fill(text, 100, subsequent_indent="    ", break_on_hyphens=False))


def _print_table(rows: list[dict]) -> None:
    """Each case on its own line, then its figures (at most 100 columns): ours and the
    peer in ms, the ratio of ours to the peer's time (below 1 is faster), its spread over
    the repeats, the target and whether it is met; with several runs, each run's ratio on
    a line of its own."""
    print(f"  {'peer':<36} {'ours ms':>9} {'peer ms':>9} {'x peer':>7} {'spread':>13} {'target':>9} met")
    print("-" * 96)
    for r in rows:
        ratio, spread, target = _ratio_cells(r)
        met = "-" if r["met"] is None else "yes" if r["met"] else "NO"
        print(r["case"][:100])
        print(f"  {r['baseline'][:36]:<36} {r['ours_api_ms']:9.2f} {r['baseline_ms']:9.2f} {ratio:7.3g} "
              f"{spread:>13} {target:>9} {met}")
        if len(r.get("runs", ())) > 1:
            each = [1.0 / x for x in r["runs"]] if "speedup" in r else r["runs"]
            _say(f"    runs: {', '.join(f'{x:.3g}' for x in each)}x; median {ratio:.3g}x")
    floors = [r for r in rows if "floor" in r]
    if floors:
        print()
        _say("Floors, timed in the same interleaved repeats (the least work the case must do; "
             "ours and the baseline as multiples of it):")
        for r in floors:
            _say(f"  {r['case']}: {r['floor']}: {r['floor_ms']:.2f} ms; ours {r['ours_over_floor']:.2f}x, "
                 f"{r['baseline']} {r['baseline_over_floor']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    global GAP
    ap = argparse.ArgumentParser(prog="entmax-ref bench", description=__doc__.split("\n\n")[0].replace("``", ""))
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per callable (median; default 7)")
    ap.add_argument("--runs", type=int, default=1,
                    help="runs of every case, one after the other; targets judged on the median of the runs' "
                         "ratios (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="threads for torch and numba (default 2)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--attention", action="store_true", help="also run the attention and decoding figures (slow)")
    ap.add_argument("--attention-only", action="store_true", help="only the attention and decoding figures")
    ap.add_argument("--attention-n", type=int, default=4096, help="sequence length of the attention figures")
    ap.add_argument("--long", action="store_true",
                    help=f"with the attention figures, forward+backward at N = {LONG_N} too (slow)")
    ap.add_argument("--decode-keys", type=int, default=DECODE_KEYS, help="cached keys of the decoding figure")
    ap.add_argument("--no-eager", action="store_true", help="leave out the slow eager torch + entmax peer")
    ap.add_argument("--quick", action="store_true", help="float32 rows only, 3 repeats (a smoke run)")
    ap.add_argument("--training", action="store_true",
                    help="also time one training step of attention with a learned alpha per head")
    ap.add_argument("--training-only", action="store_true", help="only the training step")
    ap.add_argument("--training-n", type=int, default=256, help="sequence length of the training step")
    ap.add_argument("--gap", type=float, default=GAP, metavar="S",
                    help=f"idle seconds before each timed call, so that torch's spinning OpenMP workers do not "
                         f"slow the next call (default {GAP:g}; 0 times calls back to back)")
    args = ap.parse_args(argv)
    GAP = max(0.0, args.gap)

    try:
        import torch
        import entmax
    except ImportError as exc:  # the peers are optional dependencies
        print(f'entmax-ref bench needs its peers torch and entmax: pip install "entmax-ref[bench]" ({exc})',
              file=sys.stderr)
        return 2
    import numba

    with _settings(torch, numba, args.threads):
        return _run(args, torch, entmax, numba)


@contextlib.contextmanager
def _settings(torch, numba, threads: int):
    """torch and numba on ``threads`` threads and torch's float32 products in float32
    (``set_float32_matmul_precision("highest")``) for the block; the caller's settings
    restored after it."""
    before = torch.get_num_threads(), numba.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
        torch.set_float32_matmul_precision(before[2])


def _run(args, torch, entmax, numba) -> int:
    import entmax_ref as er

    be = er.get_backend("numba")
    repeats = 3 if args.quick else args.repeats
    runs = max(1, args.runs)
    dtypes = [np.float32] if args.quick else [np.float32, np.float64]

    load0 = _load()
    only = args.attention_only or args.training_only
    cases = [(f"rows {np.dtype(dt).name}", functools.partial(_row_cases, torch, entmax, er, be, dt, repeats))
             for dt in ([] if only else dtypes)]
    if args.attention or args.attention_only:
        cases += [("attention", lambda: _attention_cases(torch, entmax, er, repeats, args.attention_n,
                                                         eager=not args.no_eager)),
                  ("decoding", lambda: _decoding_case(torch, er, repeats, args.decode_keys))]
        if args.long:
            cases.append(("long context", lambda: _long_case(torch, repeats)))
    if args.training or args.training_only:
        cases.append(("training step", lambda: _training_case(torch, entmax, repeats, args.training_n)))
    per_run: list[list[dict]] = []
    for run in range(runs):
        rows: list[dict] = []
        for i, (name, case) in enumerate(cases):
            t0 = time.perf_counter()
            tag = f"run {run + 1}/{runs}, " if runs > 1 else ""
            print(f"[{tag}{i + 1}/{len(cases)}] {name} ...", end="", file=sys.stderr, flush=True)
            rows += case()
            print(f" {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        per_run.append(rows)
    results = _merge_runs(per_run) if runs > 1 else per_run[0]
    load1 = _load()

    precision = torch.get_float32_matmul_precision()
    _say(f"entmax-ref bench on {machine()}: numba {numba.__version__} ({numba.get_num_threads()} threads), "
         f"torch {torch.__version__} ({torch.get_num_threads()} threads, float32 matmul precision {precision}), "
         f"entmax {getattr(entmax, '__version__', '?')}; load average {load0} before, {load1} after; medians of "
         f"{repeats} interleaved repeats ({GAP:g} s idle, then calls under {REWARM_S:g} s once untimed, before "
         f"each timed call)" + (f", median of {runs} runs" if runs > 1 else "") +
         "; x peer = ours / the peer's time (below 1 is faster), spread = smallest-largest ratio of a repeat")
    _print_table(results)
    if args.json:
        meta = {"numba": numba.__version__, "torch": torch.__version__, "threads": args.threads,
                "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
                "float32_matmul_precision": precision, "repeats": repeats, "runs": runs, "gap_s": GAP,
                "rewarm_below_s": REWARM_S, "machine": platform.platform(), "cpu": machine(),
                "cpus": os.cpu_count(), "load_before": load0, "load_after": load1}
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": results}, fh, indent=2)
    return 0


def _load() -> str:
    try:
        return "%.2f" % os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return "n/a"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
