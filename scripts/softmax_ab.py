"""Float32 row transforms against ``torch.softmax``, and the float32 softmax row kernel
against the per-row path of float64 rows, timed in interleaved pairs in one process.

512 x 8192 standard normal float32 rows (seed 0).  For each name in FNS: ``er.<name>(x,
backend="numba")`` then ``torch.softmax(x, -1)``, PAIRS times; ``kernel``: the float32
softmax kernel (``rows._rows_softmax``) then a kernel that runs the per-row path
(``softmax.softmax_lanes``) on every row, the kernel's outputs checked against the NumPy
engine's correctly rounded bits.  Prints the
medians, the minimums, the median ratio and its spread, and the load average::

    taskset -c 1 python scripts/softmax_ab.py 41 1 softmax,kernel,entmax15,sparsemax
    python scripts/softmax_ab.py 31 2 softmax,kernel
"""
import sys, time, statistics, os
import numpy as np, numba, torch
pairs, threads = int(sys.argv[1]), int(sys.argv[2])
fns = sys.argv[3].split(",") if len(sys.argv) > 3 else ["softmax", "kernel"]
torch.set_num_threads(threads); numba.set_num_threads(threads)
import entmax_ref as er
from entmax_ref.backends.numba import rows as R
from entmax_ref.backends.numba._jit import jit
from entmax_ref.backends.numba._threads import run_blocks
from entmax_ref.backends.numba.softmax import LANES, softmax_lanes

@jit(nogil=True, no_cpython_wrapper=False)
def per_row_softmax(x, alpha, method, res, r0, r1):  # the per-row path on every row
    out, theta, support, n_iter, converged = res
    c = np.empty(x.shape[1], np.float64)
    lanes = np.empty((4, LANES), np.float64)
    for r in range(r0, r1):
        theta[r], support[r], n_iter[r], converged[r] = softmax_lanes(x[r], out[r], c, lanes)

x = np.random.default_rng(0).standard_normal((512, 8192)).astype(np.float32)
xt = torch.from_numpy(x)
a = np.ones(512)
def bufs():
    return R.Solved(np.empty_like(x), np.empty(512), np.empty(512, np.int64), np.empty(512, np.int64), np.empty(512, np.bool_))
b1, b2 = bufs(), bufs()
nblk = 8 * threads
def report(name, ra, rb):
    rat = [p / q for p, q in zip(ra, rb)]
    print(f"{name}: {statistics.median(ra)*1e3:.2f} vs {statistics.median(rb)*1e3:.2f} ms (medians; mins {min(ra)*1e3:.2f}, {min(rb)*1e3:.2f}); "
          f"ratio median {statistics.median(rat):.2f}x, spread {min(rat):.2f}-{max(rat):.2f}, ratio of mins {min(ra)/min(rb):.2f}x")
def ab(name, f, g):
    f(); g()
    ra, rb = [], []
    for _ in range(pairs):
        t0 = time.perf_counter(); f(); t1 = time.perf_counter(); g(); t2 = time.perf_counter()
        ra.append(t1 - t0); rb.append(t2 - t1)
    report(name, ra, rb)
print(f"threads {threads}, pairs {pairs}, load before {os.getloadavg()[0]:.1f}")
for fn in fns:
    if fn == "kernel":
        ab("float32 softmax kernel vs the per-row path", lambda: run_blocks(R._rows_softmax, (x, a, 0, b1), x.shape, nblk),
           lambda: run_blocks(per_row_softmax, (x, a, 0, b2), x.shape, nblk))
        assert np.array_equal(b1.p.view(np.int32), er.softmax(x, backend="numpy").view(np.int32))
    else:
        f = getattr(er, fn)
        ab(f"{fn} vs torch.softmax", lambda: f(x, backend="numba"), lambda: torch.softmax(xt, -1))
print(f"load after {os.getloadavg()[0]:.1f}")
