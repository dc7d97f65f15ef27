"""NVRTC, the compiler ``cupy.RawModule`` uses, driven through ctypes without a device.

:func:`compile_source` compiles a kernel source of ``backends/cuda/`` for one architecture
with exactly the options NVRTC receives through CuPy (``_cuda_loader.nvrtc_options``, plus
``--ptxas-options=-v``, which only reports), once per process, and returns its log, PTX,
cubin size and the lowered names of the name expressions.  :func:`resources` reads ptxas's
report (registers, spills, stack, shared memory of every kernel) and
:func:`ftz_exposed_instructions` finds the float32 instructions whose result -ftz=true can
change.  Uses the ``nvidia-cuda-nvrtc-cu12`` wheel (``pip install 'entmax-ref[nvrtc]'``);
used by tests/test_cuda_nvrtc.py and scripts/cuda_resources.py.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from entmax_ref.backends import _cuda_loader as L

ARCHS = ("sm_80", "sm_90")


class NvrtcMissing(RuntimeError):
    """The NVRTC library is not installed (the message says how to install it)."""


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """libnvrtc of the ``nvidia-cuda-nvrtc-cu12`` wheel."""
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
    if spec is None or not spec.submodule_search_locations:
        raise NvrtcMissing("the NVRTC wheel is not installed (pip install 'entmax-ref[nvrtc]')")
    libs = [p for p in sorted(Path(next(iter(spec.submodule_search_locations)), "lib").glob("libnvrtc.so*"))
            if "builtins" not in p.name]
    if not libs:
        raise NvrtcMissing("no libnvrtc.so in the NVRTC wheel")
    lib = ctypes.CDLL(str(libs[0]))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def version() -> str:
    """NVRTC's version, ``"12.9"``."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


@dataclass(frozen=True)
class Compiled:
    """One source compiled for one architecture."""

    options: tuple
    log: str
    ptx: str
    cubin_bytes: int
    lowered: dict  #: name expression -> mangled name


def _check(lib, rc: int, what: str, log: str = "") -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}\n{log}")


def _text(lib, prog, size_fn, get_fn) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, size_fn(prog, ctypes.byref(size)), size_fn.__name__)
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, get_fn(prog, buf), get_fn.__name__)
    return buf.raw[:size.value]


@functools.lru_cache(maxsize=None)
def compile_source(source: str, arch: str) -> Compiled:
    """``cuda/<source>`` with every name expression, compiled as CuPy compiles it on a device
    of architecture ``arch`` (a RuntimeError with NVRTC's log if it does not compile)."""
    lib = library()
    prog = ctypes.c_void_p()
    code = L.read_source(source).encode()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), code, source.encode(), 0, None, None), "create")
    try:
        exprs = L.name_expressions(source)
        for e in exprs:
            _check(lib, lib.nvrtcAddNameExpression(prog, e.encode()), f"name expression {e}")
        options = (*L.nvrtc_options(arch), "--ptxas-options=-v")
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        rc = lib.nvrtcCompileProgram(prog, len(options), argv)
        log = _text(lib, prog, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog).rstrip(b"\0").decode(
            errors="replace")
        _check(lib, rc, f"compile {source} for {arch} with {options}", log)
        lowered = {}
        for e in exprs:
            name = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)), f"lowered name of {e}")
            lowered[e] = name.value.decode()
        ptx = _text(lib, prog, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX).rstrip(b"\0").decode()
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        return Compiled(options, log, ptx, size.value, lowered)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack: int  #: bytes of stack frame
    shared: int  #: bytes of static shared memory


def resources(compiled: Compiled) -> dict:
    """{name expression: :class:`Resources`} from a compile's ptxas report."""
    by_mangled = {v: k for k, v in compiled.lowered.items()}
    out, name = {}, None
    stack = spill_st = spill_ld = 0
    for line in compiled.log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = by_mangled.get(m.group(1))
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            stack, spill_st, spill_ld = (int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name is not None:
            smem = re.search(r"(\d+) bytes smem", line)
            out[name] = Resources(int(m.group(1)), spill_st, spill_ld, stack, int(smem.group(1)) if smem else 0)
            name = None
    return out


def ftz_exposed_instructions(ptx: str) -> list:
    """The instructions of ``ptx`` that flushing float32 subnormals to zero (``.ftz``) could
    change: every float32 ``.ftz`` instruction (``rcp.approx.ftz.f64``, the math library's
    double reciprocal, has no other form) except the CUDA math library's tests of a double's
    high word, an ``abs`` or ``setp`` whose float32 operands are bit moves (``mov.b32`` of
    an integer register, or ``abs`` of one) or literals (the library is built for both
    settings).  A conversion, a comparison of a value read from memory, any float32
    arithmetic: each is exposed.  Registers are tracked per function."""
    exposed, defs = [], {}
    for line in ptx.splitlines():
        text = line.strip()
        if ".entry " in text or ".func " in text:
            defs = {}
            continue
        if text.startswith("@"):  # a guarded instruction: the guard predicate goes
            text = text.split(None, 1)[1] if " " in text else ""
        if not text or text.startswith(("//", ".", "{", "}", "$")) or " " not in text:
            continue
        op, rest = text.split(None, 1)
        operands = [o.strip() for o in rest.rstrip(";").split(",")]
        if operands and re.fullmatch(r"%f\d+", operands[0]):
            defs[operands[0]] = (op, operands[1:])
        if ".ftz" in op and ".f32" in op and not (
                op.startswith(("abs.", "setp.")) and all(_from_bits(defs, o) for o in operands[1:])):
            exposed.append(text)
    return exposed


def _from_bits(defs: dict, operand: str) -> bool:
    """Whether a float32 operand is a literal, or a bit move from an integer register (or the
    absolute value of one)."""
    if not operand.startswith("%"):
        return True  # a literal (0f4086232B)
    op, sources = defs.get(operand, ("", []))
    if op == "mov.b32":
        return bool(sources) and sources[0].startswith("%r")
    if op.startswith("abs."):
        return bool(sources) and _from_bits(defs, sources[0])
    return False
