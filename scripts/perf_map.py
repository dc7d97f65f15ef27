"""Name numba's compiled functions in a Linux ``perf`` profile of the attention forward.

``perf`` shows JIT code as bare addresses.  This script compiles the kernels (run it with
``ENTMAX_REF_NUMBA_CACHE=0``: code loaded from numba's cache keeps no symbol table),
prints ``ready <pid>``, waits a second, runs the causal attention forward of the bench
(B=1 H=8 N=4096 D=64 float32, alpha 1.5) ``--calls`` times, and then writes
``/tmp/perf-<pid>.map`` (address, size, name of every compiled function), which
``perf report`` reads.  Record from ``ready`` on, so that compilation is not sampled::

    ENTMAX_REF_NUMBA_CACHE=0 python scripts/perf_map.py --threads 1 > /tmp/pm.out &
    until grep -q ready /tmp/pm.out; do sleep 0.5; done
    perf record -F 4000 -p "$(awk '/ready/ {print $2}' /tmp/pm.out)" -o /tmp/perf.data
    perf report -i /tmp/perf.data --no-children --sort sym

A function's size is the distance to the next one (numba does not report it), so a
sample in padding after the last function of a library is charged to that function.
docs/performance.md ("What bounds each case") has a profile made this way.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

import entmax_ref as er


def compiled_functions() -> list[tuple[int, str]]:
    """(address, symbol) of every function numba compiled in this process."""
    found = {}
    for obj in gc.get_objects():
        if not isinstance(obj, CPUDispatcher):
            continue
        for cres in obj.overloads.values():
            try:
                module = cres.library._final_module
            except Exception:  # loaded from the cache: no module to read the symbols from
                continue
            for fn in module.functions:
                if fn.is_declaration:
                    continue
                address = cres.library.get_pointer_to_function(fn.name)
                if address:
                    found[address] = fn.name
    return sorted(found.items())


def write_perf_map(path: str | None = None) -> str:
    """Write the perf map of this process (``/tmp/perf-<pid>.map`` unless ``path``)."""
    path = path or f"/tmp/perf-{os.getpid()}.map"
    functions = compiled_functions()
    with open(path, "w") as fh:
        for i, (address, name) in enumerate(functions):
            end = functions[i + 1][0] if i + 1 < len(functions) else address + 4096
            fh.write(f"{address:x} {min(end - address, 1 << 16):x} {name}\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--n", type=int, default=4096, help="sequence length")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 8, args.n, 64)).astype(np.float32) for _ in range(3))
    er.attention(q, k, v, alpha=1.5, causal=True, backend="numba")  # compiles
    print("ready", os.getpid(), flush=True)
    time.sleep(1.0)
    t = time.perf_counter()
    for _ in range(args.calls):
        er.attention(q, k, v, alpha=1.5, causal=True, backend="numba")
    ms = 1e3 * (time.perf_counter() - t) / args.calls
    print(f"{args.calls} calls, {ms:.1f} ms each; perf map: {write_perf_map()}", flush=True)


if __name__ == "__main__":
    main()
