"""Cold and warm first-call times of each public function, each in a fresh process.

For every public function: a new Python process with an empty kernel cache
(``ENTMAX_REF_CACHE_DIR`` pointing at a new temporary folder) imports entmax_ref and makes
one call (cold), then a second process with the same folder makes the same call (warm: the
compiled kernels load from the cache).  Three sizes: ``small`` (a small input on the
default backend, which answers on the NumPy reference while nothing is compiled),
``large`` on the numba backend (what compiles), and ``auto``: the large input on the
default backend with an empty cache (the NumPy reference answers, nothing is compiled and
no process is started; the cache stays empty, so there is no warm figure).
Usage::

    python scripts/first_call.py                       # every function, both sizes
    python scripts/first_call.py --only entmax15,attention --sizes large
    python scripts/first_call.py --only softmax,entmax15 --sizes large --dtypes float64,float32

Prints one line per (function, size) with import + call seconds, cold and warm; ``--json``
writes them.  The machine should be otherwise idle: compile times scale with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROWS = "x = rng.standard_normal((N, 64)).astype(DT)"
PG = ("p = er.entmax15(rng.standard_normal((N, 64)).astype(DT), backend='numpy');"
      " g = rng.standard_normal(p.shape).astype(DT)")
QKV = "q = rng.standard_normal((1, 2, N, 16))"
FWD = QKV + "; o, i = er.attention(q, q, q, alpha=1.5, return_info=True, backend='numpy')"
#: name -> (setup, call); ``N`` is the input size, ``be`` the backend argument
CASES: dict[str, tuple[str, str]] = {
    "softmax": (ROWS, "er.softmax(x, backend=be)"),
    "sparsemax": (ROWS, "er.sparsemax(x, backend=be)"),
    "entmax15": (ROWS, "er.entmax15(x, backend=be)"),
    "entmax": (ROWS, "er.entmax(x, 1.3, backend=be)"),
    "entmax_a3": (ROWS, "er.entmax(x, 3.0, backend=be)"),
    "entmax_threshold": (ROWS, "er.entmax_threshold(x, 1.5, backend=be)"),
    "entmax_vjp": (PG, "er.entmax_vjp(p, g, 1.5, backend=be)"),
    "entmax_alpha_vjp": (PG, "er.entmax_alpha_vjp(p, g, 1.5, backend=be)"),
    "entmax_jacobian": ("p = er.entmax15(rng.standard_normal((N // 64, 64)), backend='numpy')",
                        "er.entmax_jacobian(p, 1.5, backend=be)"),
    "entmax_loss": (ROWS + "; t = np.zeros(N, int)", "er.entmax_loss(x, t, 1.5, backend=be)"),
    "entmax_loss_grad": (ROWS + "; t = np.zeros(N, int)", "er.entmax_loss_grad(x, t, 1.5, backend=be)"),
    "asentmax": (ROWS, "er.asentmax(x, 1.5, beta=0.5, gamma=1.0, backend=be)"),
    "asentmax_vjp": (ROWS + "; g = rng.standard_normal(x.shape)",
                     "er.asentmax_vjp(g, x, 1.5, beta=0.5, gamma=1.0, backend=be)"),
    "attention": (QKV, "er.attention(q, q, q, alpha=1.5, causal=True, backend=be)"),
    "attention_vjp": (FWD, "er.attention_vjp(np.ones_like(o), q, q, q, out=o, tau=i.tau, alpha=1.5, backend=be)"),
}

#: size -> (backend, rows N, attention N); "auto" is the large input on the default backend with
#: an empty cache: the reference answers (no warm figure)
SIZES = {"small": ("None", 16, 32), "large": ("'numba'", 4096, 256), "auto": ("None", 4096, 256)}

CHILD = """
import time, sys
t0 = time.perf_counter()
import numpy as np, entmax_ref as er
t1 = time.perf_counter()
rng = np.random.default_rng(0)
be = {be}
N = {n}
DT = np.{dtype}
{setup}
t2 = time.perf_counter()
{call}
t3 = time.perf_counter()
print(t1 - t0, t3 - t2, any(m.startswith('entmax_ref.backends.numba.') and m != 'entmax_ref.backends.numba._cache'
                            for m in sys.modules))
"""


def _one(name: str, size: str, cache: str, dtype: str = "float64") -> tuple[float, float, bool]:
    setup, call = CASES[name]
    be, n_rows, n_attn = SIZES[size]
    n = n_attn if name.startswith("attention") else n_rows
    code = CHILD.format(be=be, n=n, dtype=dtype, setup=setup, call=call)
    env = {**os.environ, "ENTMAX_REF_CACHE_DIR": cache}
    env.pop("NUMBA_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    imp, first, kernels = res.stdout.split()
    return float(imp), float(first), kernels == "True"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated function names")
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--dtypes", default="float64", help="comma-separated: float64,float32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(CASES)
    rows = []
    print(f"{'function':<18}{'size':<7}{'dtype':<9}{'import s':>9}{'cold s':>9}{'warm s':>9}  kernels loaded")
    for size in args.sizes.split(","):
        for dtype in args.dtypes.split(","):
            for name in names:
                with tempfile.TemporaryDirectory() as cache:
                    imp, cold, numba = _one(name, size, cache, dtype)
                    warm = _one(name, size, cache, dtype)[1] if size != "auto" else float("nan")
                rows.append(dict(function=name, size=size, dtype=dtype, import_s=imp, cold_s=cold, warm_s=warm,
                                 numba=numba))
                print(f"{name:<18}{size:<7}{dtype:<9}{imp:9.2f}{cold:9.2f}{warm:9.2f}  {numba}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "load": os.getloadavg(),
                                               "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
