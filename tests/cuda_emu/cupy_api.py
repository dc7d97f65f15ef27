"""Write ``cupy14_api.txt``: the public names of the installed CuPy, with the parameters of its
functions and of ``cupy.ndarray``'s methods.

``python tests/cuda_emu/cupy_api.py > tests/cuda_emu/cupy14_api.txt`` in an environment
where cupy-cuda12x is installed (importing it needs no GPU).  The CuPy stand-in reads the
file: it exposes only names listed there and accepts only the listed parameters, so that a
call that would fail on a GPU fails in emulation too.  One line per name: ``name``,
``name(parameters)`` for a callable whose parameters could be read (from its signature, or
from the first line of a compiled function's docstring), ``ndarray.name(parameters)`` for
the array's methods.
"""

from __future__ import annotations

import inspect
import re


def parameters(obj) -> str | None:
    """The parameter list of ``obj``, ``"(a, axis=None, out=None, keepdims=False)"``."""
    try:
        sig = inspect.signature(obj)
        return "(" + ", ".join(str(p).split(":")[0].split("=")[0] + ("=" if p.default is not p.empty else "")
                               for p in sig.parameters.values()) + ")"
    except (TypeError, ValueError):
        pass
    first = (getattr(obj, "__doc__", None) or "").strip().split("\n", 1)[0]
    m = re.match(r"[\w.]+\((.*)\)", first.split(" -> ")[0])
    if not m:
        return None
    out = []
    for part in m.group(1).replace("\\*", "*").split(","):
        name = part.strip().split("=")[0].split(":")[0].strip()
        if name and name != "self":
            out.append(name + ("=" if "=" in part else ""))
    return "(" + ", ".join(out) + ")"


def main() -> None:
    import cupy

    print(f"# cupy {cupy.__version__}: tests/cuda_emu/cupy_api.py")
    for name in sorted(n for n in dir(cupy) if not n.startswith("_")):
        obj = getattr(cupy, name)
        params = parameters(obj) if callable(obj) and not isinstance(obj, type) else None
        print(name + (params or ""))
    for name in sorted(n for n in dir(cupy.ndarray) if not n.startswith("_") or n in ("__array__",)):
        obj = getattr(cupy.ndarray, name)
        params = parameters(obj) if callable(obj) else None
        print(f"ndarray.{name}" + (params or ""))


if __name__ == "__main__":
    main()
