"""Name numba's compiled functions in a Linux ``perf`` profile of one of the bench's cases.

``perf`` shows JIT code as bare addresses.  This script compiles the kernels (run it with
``ENTMAX_REF_NUMBA_CACHE=0``: code loaded from numba's cache keeps no symbol table),
makes one call of a case of the bench, writes ``/tmp/perf-<pid>.map`` (address, size,
name of every compiled function), which ``perf report`` reads, prints ``ready <pid>``,
waits a second and runs the case ``--calls`` times.  The cases (``--case``): ``forward``, the causal attention
forward (B=1 H=8 N=4096 D=64 float32, alpha 1.5; ``--n`` sets N); ``decode`` and
``decode-unchecked``, 1 query over 65,536 keys (H=8 D=64 float32, alpha 1.5,
``check_finite`` on and off); ``rows``, the row transform of ``--alpha`` over 512 x 8192
rows of ``--dtype`` (``--alpha 1`` is softmax) with N(0, ``--scale``^2) scores.  Record
from ``ready`` on, so that compilation is not sampled::

    ENTMAX_REF_NUMBA_CACHE=0 python scripts/perf_map.py --threads 1 > /tmp/pm.out &
    until grep -q ready /tmp/pm.out; do sleep 0.5; done
    perf record -F 4000 -p "$(awk '/ready/ {print $2}' /tmp/pm.out)" -o /tmp/perf.data
    perf report -i /tmp/perf.data --no-children --sort sym

A function's size is the distance to the next one (numba does not report it), so a
sample in padding after the last function of a library is charged to that function.
The objects the compile left are moved out of the collector's reach (``gc.freeze``)
before ``ready``: the profile is of the calls, as in a process that loads the kernels.
docs/performance.md ("What bounds each case") has profiles made this way.

``--widths`` prints instead, for each kernel the case compiled, how many of its packed
arithmetic instructions use 512-bit and 256-bit registers, and exits.  With
``NUMBA_CPU_NAME=sapphirerapids`` (or another Intel server core) it shows the code LLVM
makes for that CPU, all of whose instructions run on an AVX-512 host::

    NUMBA_CPU_NAME=sapphirerapids ENTMAX_REF_NUMBA_CACHE=0 python scripts/perf_map.py --case forward --widths
"""

from __future__ import annotations

import argparse
import functools
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


#: packed vector arithmetic in AT&T assembly, by register width
_PACKED = r"^\s+v(?:fmadd|fmsub|fnmadd|fnmsub|add|sub|mul|div|max|min|cmp)\w*p[sd]\s.*%{}mm"


def vector_widths() -> list[tuple[str, int, int]]:
    """(kernel, zmm, ymm) of every package function compiled in this process: the packed
    arithmetic instructions of its code (its callees included) on 512-bit and on 256-bit
    registers."""
    import re

    rows = []
    for obj in gc.get_objects():
        if not isinstance(obj, CPUDispatcher) or not obj.py_func.__module__.startswith("entmax_ref"):
            continue
        asm = "".join(cres.library.get_asm_str() for cres in obj.overloads.values())
        z, y = (len(re.findall(_PACKED.format(w), asm, re.M)) for w in "zy")
        if z + y:
            rows.append((obj.py_func.__module__.rsplit(".", 1)[-1] + "." + obj.py_func.__qualname__, z, y))
    return sorted(rows)


def _case(args):
    """The call that ``--case`` profiles, made once (which compiles its kernels)."""
    rng = np.random.default_rng(1)
    if args.case == "rows":
        x = (rng.standard_normal((512, 8192)) * args.scale).astype(args.dtype)
        call = functools.partial(er.entmax, x, args.alpha, backend="numba")
    elif args.case == "forward":
        q, k, v = (rng.standard_normal((1, 8, args.n, 64)).astype(np.float32) for _ in range(3))
        call = functools.partial(er.attention, q, k, v, alpha=1.5, causal=True, backend="numba")
    else:
        q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
        k, v = (rng.standard_normal((1, 8, 65536, 64)).astype(np.float32) for _ in range(2))
        call = functools.partial(er.attention, q, k, v, alpha=1.5, backend="numba",
                                 check_finite=args.case == "decode")
    call()
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=("forward", "decode", "decode-unchecked", "rows"), default="forward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--n", type=int, default=4096, help="sequence length of --case forward")
    ap.add_argument("--alpha", type=float, default=1.0, help="alpha of --case rows (1: softmax)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="dtype of --case rows")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="standard deviation of the scores of --case rows (0.01: supports of thousands)")
    ap.add_argument("--widths", action="store_true",
                    help="print the packed vector instructions of each compiled kernel by width and exit "
                         "(NUMBA_CPU_NAME=sapphirerapids shows the code LLVM makes for an Intel server core)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    call = _case(args)
    if args.widths:
        for name, z, y in vector_widths():
            print(f"{name} zmm {z} ymm {y}")
        return
    path = write_perf_map()  # before ready: walking the compiled code is not sampled
    # the compiler's objects (millions, in a process that compiles) to the permanent
    # generation: otherwise the collector's walks over them take a large share of the
    # samples, which a process that loads the kernels from the cache does not pay
    gc.collect()
    gc.freeze()
    print("ready", os.getpid(), flush=True)
    time.sleep(1.0)
    t = time.perf_counter()
    for _ in range(args.calls):
        call()
    ms = 1e3 * (time.perf_counter() - t) / args.calls
    print(f"{args.calls} calls, {ms:.1f} ms each; perf map: {path}", flush=True)


if __name__ == "__main__":
    main()
