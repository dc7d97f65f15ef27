"""Every CUDA kernel through NVRTC, the compiler CuPy uses, without a device.

NVRTC compiles in the host process and needs no GPU: each source is compiled with the
options and the name expressions ``_cuda_loader.get_module`` hands ``cupy.RawModule``
(plus the architecture CuPy adds), for sm_80 and sm_90, to a cubin, and every name
expression must resolve to a lowered (mangled) name.  Uses the ``nvidia-cuda-nvrtc-cu12``
wheel that ``cupy-cuda12x`` depends on (``pip install 'entmax-ref[nvrtc]'``); skipped
without it.  Exhaustive tier.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import pytest

from entmax_ref.backends import _cuda_loader as L

pytestmark = pytest.mark.exhaustive

ARCHS = ("sm_80", "sm_90")


def _libnvrtc() -> ctypes.CDLL:
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the NVRTC wheel is not installed (pip install 'entmax-ref[nvrtc]')")
    libs = sorted(Path(next(iter(spec.submodule_search_locations)), "lib").glob("libnvrtc.so*"))
    libs = [p for p in libs if "builtins" not in p.name]
    if not libs:
        pytest.skip("no libnvrtc.so in the NVRTC wheel")
    lib = ctypes.CDLL(str(libs[0]))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _check(lib, rc: int, what: str, log: str = "") -> None:
    assert rc == 0, f"{what}: {lib.nvrtcGetErrorString(rc).decode()}\n{log}"


def _log(lib, prog) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", sorted(L.KERNELS))
def test_kernels_compile_with_nvrtc(source, arch):
    lib = _libnvrtc()
    prog = ctypes.c_void_p()
    code = L.read_source(source).encode()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), code, source.encode(), 0, None, None), "create")
    try:
        exprs = L.name_expressions(source)
        for e in exprs:
            _check(lib, lib.nvrtcAddNameExpression(prog, e.encode()), f"name expression {e}")
        options = [*L.OPTIONS, f"-I{L.cuda_dir()}", f"--gpu-architecture={arch}"]
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        rc = lib.nvrtcCompileProgram(prog, len(options), argv)
        log = _log(lib, prog)
        _check(lib, rc, f"compile {source} for {arch} with {options}", log)
        assert "warning" not in log.lower(), log
        for e in exprs:
            lowered = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(lowered)), f"lowered name of {e}")
            assert lowered.value and lowered.value.startswith(b"_Z"), e
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        assert size.value > 0
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
