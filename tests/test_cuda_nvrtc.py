"""Every CUDA kernel through NVRTC, the compiler CuPy uses, with CuPy's options, no device.

NVRTC compiles in the host process and needs no GPU: each source is compiled with exactly
the options ``cupy.RawModule`` hands NVRTC (``_cuda_loader.nvrtc_options``: the loader's,
then CuPy's ``-ftz=true``, architecture and execution space) and the loader's name
expressions, for sm_80 and sm_90, to a cubin; every name expression resolves to a lowered
name, and the kernels' PTX holds no float32 instruction that ``-ftz=true`` could change.
Uses the ``nvidia-cuda-nvrtc-cu12`` wheel (``pip install 'entmax-ref[nvrtc]'``): skipped
without it, failed where ``ENTMAX_REF_REQUIRE_TOOLS`` names ``nvrtc`` (CI).  Exhaustive
tier.
"""

from __future__ import annotations

import pytest

import nvrtc_compile as N
from cuda_cases import tool_missing
from entmax_ref.backends import _cuda_loader as L

pytestmark = pytest.mark.exhaustive


def _compiled(source: str, arch: str) -> N.Compiled:
    try:
        N.library()
    except N.NvrtcMissing as e:
        tool_missing("nvrtc", str(e))
    return N.compile_source(source, arch)


@pytest.mark.parametrize("arch", N.ARCHS)
@pytest.mark.parametrize("source", sorted(L.KERNELS))
def test_kernels_compile_with_cupys_options(source, arch):
    got = _compiled(source, arch)
    assert got.options[:len(L.nvrtc_options(arch))] == L.nvrtc_options(arch)
    assert "-ftz=true" in got.options and f"-arch={arch}" in got.options
    assert "warning" not in got.log.lower(), got.log
    assert set(got.lowered) == set(L.name_expressions(source))
    assert all(name.startswith("_Z") for name in got.lowered.values()), got.lowered
    assert got.cubin_bytes > 0


@pytest.mark.parametrize("source", sorted(L.KERNELS))
def test_no_float32_instruction_depends_on_flush_to_zero(source):
    """CuPy appends -ftz=true (flush float32 subnormals to zero) to every compile, after the
    loader's options, so it cannot be turned off: every float32 value the kernels read or
    write goes through er::load / er::store, integer code, and the PTX holds no float32
    load, conversion or arithmetic, only the bit moves and word tests of the math library."""
    exposed = N.ftz_exposed_instructions(_compiled(source, "sm_90").ptx)
    assert not exposed, f"{len(exposed)} float32 instructions that -ftz=true changes, e.g. {exposed[:5]}"
