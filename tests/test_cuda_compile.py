"""Compile every CUDA kernel with nvcc for sm_80 and sm_90 (no GPU needed).

Each source in backends/cuda/ is compiled as the loader compiles it (the same options,
the same include directory) with every template kernel instantiated for float and double
(the loader's name expressions), so a syntax, template or register-limit error fails CI
even without a GPU.  Skipped without nvcc, failed where ``ENTMAX_REF_REQUIRE_TOOLS`` names
``nvcc`` (CI).  Exhaustive tier: run alone with ``pytest --exhaustive
tests/test_cuda_compile.py`` (about a minute on two cores).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from cuda_cases import tool_missing
from entmax_ref.backends import _cuda_loader as L

pytestmark = pytest.mark.exhaustive

ARCHS = ("sm_80", "sm_90")


def _unit(source: str) -> str:
    """A compile unit that includes the source and takes the address of every instance."""
    refs = "\n".join(f"    (void)&{expr};" for expr in L.name_expressions(source))
    return f'#include "{source}"\nvoid entmax_ref_instantiate_all() {{\n{refs}\n}}\n'


@pytest.mark.parametrize("source", sorted(L.KERNELS))
def test_kernels_compile_with_nvcc(source, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        tool_missing("nvcc", "nvcc is not on PATH (install the CUDA toolkit to compile-check the kernels)")
    unit = tmp_path / f"all_{source}"
    unit.write_text(_unit(source))
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in ARCHS]
    cmd = [nvcc, *L.OPTIONS, f"-I{L.cuda_dir()}", *gencode, "--resource-usage", "-Werror", "all-warnings",
           "-c", str(unit), "-o", str(tmp_path / "out.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    log = res.stdout + res.stderr
    # No register spills: the row solver keeps its state in registers.
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    # Every instance was compiled for every architecture.
    for arch in ARCHS:
        assert log.count(f"for '{arch}'") >= len(L.name_expressions(source)), log
