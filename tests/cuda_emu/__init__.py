"""The CUDA kernels of ``backends/cuda/`` run on the CPU, for the tests.

No machine that runs the tests has a GPU, so the CUDA engine is executed under emulation:

* ``cuda_emu.h``: the header that gives the unchanged ``.cu`` sources a host meaning (one
  fiber or OS thread per CUDA thread, blocks in sequence, barriers and warp shuffles as
  real barriers that check their use, shared arrays whose indices and barriers are
  checked, memory faults as failed launches, atomics as GCC atomics);
* :mod:`.build`: g++ builds of a source, cached by content outside the package;
* :mod:`.launcher`: ctypes launches with cuLaunchKernel's argument convention, checking
  argument kinds and sizes and ``__launch_bounds__``;
* :mod:`.cupy_stand_in`: the part of CuPy the backend uses, as strict as CuPy 14 (its
  names and parameters, no implicit host conversion, float32 flush-to-zero), on host
  memory that ends at an inaccessible page, installed as ``cupy`` by
  :func:`stand_in_cupy` so that the unchanged ``cupy_backend.py`` and the public
  functions with ``backend="cupy"`` run on it.

docs/cuda.md says what this covers and what still needs a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_BACKEND_MODULE = "entmax_ref.backends.cupy_backend"


@contextlib.contextmanager
def stand_in_cupy(variant: str = "fibers", tuning=None):
    """Within the block, ``import cupy`` gives the stand-in (building ``variant``, see
    :data:`.build.VARIANTS`) and ``backend="cupy"`` computes on it, with the launch
    parameters ``tuning`` (``CupyTuning``'s fields; None: the defaults); the block's end restores
    the modules, the backend registry's instance and the loader's memo as they were.
    Yields the stand-in module."""
    from entmax_ref import backends
    from entmax_ref.backends import _cuda_loader

    saved = {name: sys.modules.get(name) for name in ("cupy", _BACKEND_MODULE)}
    saved_instance = backends._instances.pop("cupy", None)
    saved_memo = dict(_cuda_loader._memo)
    spec = importlib.util.spec_from_file_location("cupy", HERE / "cupy_stand_in.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.VARIANT = variant
    sys.modules["cupy"] = module
    sys.modules.pop(_BACKEND_MODULE, None)
    _cuda_loader._memo.clear()
    if tuning is not None:
        from entmax_ref.backends.cupy_backend import CupyBackend, CupyTuning

        backends._instances["cupy"] = CupyBackend(CupyTuning(**tuning))
    try:
        yield module
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
        backends._instances.pop("cupy", None)
        if saved_instance is not None:
            backends._instances["cupy"] = saved_instance
        _cuda_loader._memo.clear()
        _cuda_loader._memo.update(saved_memo)
