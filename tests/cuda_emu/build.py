"""Compile a CUDA source with the emulation header into a shared library, once per content.

:func:`build` takes what ``cupy.RawModule`` takes (the source text, the NVRTC options, the
name expressions) plus a build :data:`VARIANTS` name, and returns a :class:`Built`: the
path of a g++-compiled library that exports every named kernel (``cuda_emu.h``'s
``EMU_EXPORT``) and each kernel's ``__launch_bounds__`` limit.

The library is cached under ``$ENTMAX_REF_CACHE_DIR/cuda-emu/`` (the platform's per-user
cache folder when the variable is unset; never inside the package), named by a hash of
everything that decides its contents: the header, the source, every file of the include
folders, the options, the variant's flags, the name expressions and the compiler's
version.  An edit of any of them is a new build; concurrent builds of one key (pytest-xdist
workers) wait for each other on a lock file and the first one's result is reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

HERE = Path(__file__).resolve().parent
HEADER = HERE / "cuda_emu.h"

#: Build variants: the g++ flags each adds.  ``fibers`` (the default) runs the threads of a
#: block as fibers on one OS thread; ``threads`` as OS threads; ``tsan`` / ``asan`` are the
#: thread mode under ThreadSanitizer / AddressSanitizer (load them into a process that has
#: the sanitizer's runtime preloaded, see :func:`sanitizer_runtime`).
VARIANTS: dict[str, tuple[str, ...]] = {
    "fibers": ("-O1",),
    "threads": ("-O1", "-DEMU_THREADS"),
    "tsan": ("-O1", "-g", "-DEMU_THREADS", "-fsanitize=thread"),
    "asan": ("-O1", "-g", "-DEMU_THREADS", "-fsanitize=address", "-fno-omit-frame-pointer"),
}


class BuildError(RuntimeError):
    """g++ rejected a unit (the message holds the command and the compiler's output)."""


@dataclass(frozen=True)
class Built:
    """A compiled emulation library and what the launcher needs to know about it."""

    library: Path
    #: kernel name (``entmax_forward_warp``, no template arguments) -> its launch bound
    launch_bounds: dict


def compiler() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        raise BuildError("no g++ on PATH: the CUDA emulation compiles the kernels with g++")
    return cxx


def cache_dir() -> Path:
    """``$ENTMAX_REF_CACHE_DIR/cuda-emu``, else the per-user cache folder's ``cuda-emu``."""
    env = os.environ.get("ENTMAX_REF_CACHE_DIR", "").strip()
    if env:
        root = Path(env).expanduser().resolve()
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("entmax-ref", appauthor=False))
    return root / "cuda-emu"


def gxx_options(nvrtc_options) -> tuple[list[str], list[Path]]:
    """The g++ flags for NVRTC ``options`` (what ``cupy.RawModule`` hands NVRTC,
    ``_cuda_loader.nvrtc_options``), and the include folders among them.

    ``--fmad=false`` (no fused multiply-add contraction) is ``-ffp-contract=off``;
    ``-std=``, ``-D`` and ``-I`` mean the same to both.  CuPy's own additions have no host
    meaning: ``-arch=`` and ``--device-as-default-execution-space`` concern device code
    generation, and the kernels' device code is the same with and without ``-ftz=true``
    (tests/test_cuda_nvrtc.py compares their PTX), so flushing float32 subnormals changes
    nothing there either.  Any other option is refused, so that an option the backend
    starts passing is emulated on purpose, not dropped."""
    flags, includes = [], []
    for opt in nvrtc_options:
        if opt == "--fmad=false":
            flags.append("-ffp-contract=off")
        elif opt.startswith(("-std=", "-D")):
            flags.append(opt)
        elif opt.startswith("-I"):
            flags.append(opt)
            includes.append(Path(opt[2:]))
        elif opt in ("-ftz=true", "--device-as-default-execution-space") or opt.startswith("-arch=sm_"):
            continue
        else:
            raise BuildError(f"the emulation does not know the NVRTC option {opt!r}")
    return flags, includes


def unit_text(code: str, name_expressions) -> str:
    """The compile unit: the header, the source, and the export table of the kernels."""
    table = ", ".join(f"EMU_KERNEL({e})" for e in name_expressions)
    return f'#include "cuda_emu.h"\n{code}\nEMU_EXPORT({table})\n'


def _key(code: str, flags: list[str], includes: list[Path], name_expressions, variant: str, cxx: str) -> str:
    h = hashlib.sha256()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    for part in (HEADER.read_text(), code, repr(flags), repr(list(name_expressions)), repr(VARIANTS[variant]),
                 version):
        h.update(part.encode())
        h.update(b"\0")
    for folder in includes:
        for f in sorted(folder.glob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:24]


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return res.stdout


_BOUND = re.compile(r"EMU_LAUNCH_BOUNDS\s*\(\s*([^,)]+)[^)]*\)\s*(\w+)\s*\(")


def _launch_bounds(cxx: str, unit: Path, flags: list[str]) -> dict:
    """Each kernel's ``__launch_bounds__`` limit, read from the preprocessed unit."""
    text = _run([cxx, "-E", "-P", "-DEMU_SCAN_BOUNDS", f"-I{HERE}", *flags, str(unit)])
    bounds = {}
    for expr, name in _BOUND.findall(text):
        bounds[name] = int(eval(expr, {"__builtins__": {}}))  # an integer constant expression
    return bounds


def build(code: str, nvrtc_options, name_expressions, variant: str = "fibers") -> Built:
    """The library of ``code`` (cached, see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown build variant {variant!r}; known: {', '.join(VARIANTS)}")
    cxx = compiler()
    flags, includes = gxx_options(nvrtc_options)
    key = _key(code, flags, includes, name_expressions, variant, cxx)
    folder = cache_dir()
    library, meta = folder / f"{variant}-{key}.so", folder / f"{variant}-{key}.json"
    with locked(folder / f"{variant}-{key}.lock"):
        if not (library.exists() and meta.exists()):
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                unit = Path(tmp) / "unit.cpp"
                unit.write_text(unit_text(code, name_expressions))
                out = Path(tmp) / "lib.so"
                _run([cxx, *flags, *VARIANTS[variant], "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread",
                      f"-I{HERE}", str(unit), "-o", str(out)])
                info = {"launch_bounds": _launch_bounds(cxx, unit, flags)}
                os.replace(out, library)
                Path(tmp, "meta.json").write_text(json.dumps(info))
                os.replace(Path(tmp, "meta.json"), meta)
    info = json.loads(meta.read_text())
    return Built(library, info["launch_bounds"])
