"""Lazy compilation of the CUDA sources in ``cuda/`` with ``cupy.RawModule``.

Nothing is compiled, and cupy is not imported, when this module is imported.  The first
call of :func:`get_module` for a source builds a ``RawModule`` (CuPy caches the binary on
disk, keyed by source, options, architecture and NVRTC version, under ``CUPY_CACHE_DIR``)
and memoises it per ``(device id, source)``.  What NVRTC receives is stated in one place,
:func:`nvrtc_options`: the loader's :data:`OPTIONS` and what CuPy appends to them.

:data:`KERNELS` lists the kernels of each source as NVRTC name expressions (the row kernels
are C++ templates, instantiated for float and double).  The same lists drive
``tests/test_cuda_compile.py`` (nvcc) and ``tests/test_cuda_nvrtc.py`` (NVRTC, sm_80 and
sm_90) so that every kernel the backend can launch is compile-checked in CI.
"""

from __future__ import annotations

import threading
from importlib import resources
from pathlib import Path
from typing import Any

from . import constants

#: Scalar types the row kernels are instantiated for (the input's storage type).
SCALARS = ("float", "double")


def _on_both_teams(*names: str) -> tuple[str, ...]:
    """Each row kernel template as its warp and block kernels, for every scalar type."""
    return tuple(f"{n}_{team}<{t}>" for n in names for team in ("warp", "block") for t in SCALARS)


#: The kernels of each source file in cuda/, as NVRTC name expressions: the row kernels are
#: templates on the storage type; attention works in float64 whatever the input's dtype.
KERNELS: dict[str, tuple[str, ...]] = {
    "entmax_rows.cu": _on_both_teams("entmax_forward", "entmax_vjp", "entmax_alpha_vjp"),
    "family_rows.cu": _on_both_teams("normmax_forward", "normmax_vjp", "budget_forward", "budget_vjp"),
    "entmax_attention.cu": ("attn_forward_warp", "attn_forward_block", "attn_backward_warp", "attn_backward_block",
                            "attn_probs_from_theta_block", "attn_probs_from_edge_block", "narrow_to_float"),
}
#: Most threads per block the adaptor launches (the kernels' __launch_bounds__).
MAX_BLOCK = constants.MAX_BLOCK
#: The loader's compiler options, the same for NVRTC (the loader), nvcc (the compile test)
#: and g++ (the emulator and the CPU harness): C++17, no fused multiply-add contraction, so
#: the device computes what the CPU computes, and the numeric constants of
#: :mod:`entmax_ref.backends.constants` as ``-D`` defines.
OPTIONS: tuple[str, ...] = ("-std=c++17", "--fmad=false", *constants.cuda_defines())


def cupy_added_options(arch: str) -> tuple[str, ...]:
    """What ``cupy.RawModule`` (CuPy 14, cupy/cuda/compiler.py) appends to the options it is
    given before NVRTC compiles for the device architecture ``arch`` (``"sm_90"``):
    float32 subnormals flushed to zero (``-ftz=true``; it comes after ours, so it wins and
    cannot be turned off, and the kernels are written so that it changes nothing: see
    ``entmax_core.cuh``, "storage types"), the architecture, and device code as the default
    execution space.  (It also adds include folders of its own headers, which the kernels
    do not include.)"""
    return ("-ftz=true", f"-arch={arch}", "--device-as-default-execution-space")


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """The options NVRTC receives for a kernel source through ``cupy.RawModule`` on a device
    of architecture ``arch``: the loader's, the ``cuda/`` folder, and CuPy's additions.
    The NVRTC test compiles with exactly these, and the emulator builds from them."""
    return (*OPTIONS, f"-I{cuda_dir()}", *cupy_added_options(arch))


_memo: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


def cuda_dir() -> Path:
    """The folder holding the .cu/.cuh sources (package data of entmax_ref.backends)."""
    path = resources.files(__package__).joinpath("cuda")
    if not isinstance(path, Path):  # e.g. imported from a zip file
        raise RuntimeError(f"the CUDA sources must be on a file system to be compiled, found {path!r}")
    return path


def name_expressions(source: str) -> tuple[str, ...]:
    """The name expression of every kernel of ``source``."""
    return KERNELS[source]


def read_source(source: str) -> str:
    """The text of ``cuda/<source>`` with a ``#line`` directive so that compiler messages
    name the real file."""
    path = cuda_dir() / source
    return f'#line 1 "{path}"\n' + path.read_text(encoding="utf-8")


def get_module(source: str):
    """The compiled ``cupy.RawModule`` of ``cuda/<source>`` for the current device (with the
    loader's options and the ``cuda/`` folder; CuPy appends :func:`cupy_added_options`)."""
    import cupy

    key = (cupy.cuda.Device().id, source)
    module = _memo.get(key)
    if module is None:
        with _lock:
            module = _memo.get(key)
            if module is None:
                module = cupy.RawModule(
                    code=read_source(source),
                    options=(*OPTIONS, f"-I{cuda_dir()}"),
                    name_expressions=list(name_expressions(source)),
                )
                _memo[key] = module
    return module


def get_kernel(source: str, name: str, scalar: str | None = None):
    """The kernel ``name`` of ``cuda/<source>``, ``name<scalar>`` for a template (compiling
    the source on first use)."""
    if scalar is not None and scalar not in SCALARS:
        raise TypeError(f"CUDA kernels exist for {SCALARS}, not {scalar!r}")
    return get_module(source).get_function(name if scalar is None else f"{name}<{scalar}>")
