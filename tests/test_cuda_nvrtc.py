"""Every CUDA kernel through NVRTC, the compiler CuPy uses, with CuPy's options, no device.

NVRTC compiles in the host process and needs no GPU: each source is compiled with exactly
the options ``cupy.RawModule`` hands NVRTC (``_cuda_loader.nvrtc_options``: the loader's,
then CuPy's ``-ftz=true``, architecture and execution space) and the loader's name
expressions, for sm_80 and sm_90, to a cubin, once per source and architecture, and then:

* every name expression resolves to a lowered name, with no warning;
* the PTX holds no float32 instruction that ``-ftz=true`` could change (CuPy appends it
  after the loader's options, so it cannot be turned off: every float32 value the kernels
  read or write goes through er::load / er::store, conversions written without .ftz);
* ptxas's resources (registers, stack, spills, shared memory) are within the limits: no
  spill, registers that let a block of ``__launch_bounds__`` threads run (65536 per
  multiprocessor), static shared memory within 48 KiB; and they are the ones the table
  of docs/cuda.md shows (``python scripts/cuda_resources.py --write`` writes it).

Uses the ``nvidia-cuda-nvrtc-cu12`` wheel (``pip install 'entmax-ref[nvrtc]'``): skipped
without it, failed where ``ENTMAX_REF_REQUIRE_TOOLS`` names ``nvrtc`` (CI).  Exhaustive
tier.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import nvrtc_compile as N
from cuda_cases import tool_missing
from entmax_ref.backends import _cuda_loader as L
from entmax_ref.backends.constants import MAX_BLOCK

pytestmark = pytest.mark.exhaustive

ROOT = Path(__file__).resolve().parents[1]
REGISTERS_PER_SM = 65536
STATIC_SHARED = 48 * 1024


def _documented(arch: str) -> tuple[str, dict]:
    """The NVRTC version of docs/cuda.md's resource table and {name expression: its row,
    for ``arch``}."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import cuda_resources

    text = cuda_resources.documented()
    column = N.ARCHS.index(arch)
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([^`]+)` \| (.+) \|$", line)
        if m:
            cells = [c.strip().split(" / ")[column] for c in m.group(2).split("|")]
            rows[m.group(1)] = " | ".join(cells)
    return re.match(r"NVRTC (\S+),", text).group(1), rows


@pytest.mark.parametrize("arch", N.ARCHS)
@pytest.mark.parametrize("source", sorted(L.KERNELS))
def test_kernels_compile_with_cupys_options(source, arch):
    try:
        N.library()
    except N.NvrtcMissing as e:
        tool_missing("nvrtc", str(e))
    got = N.compile_source(source, arch)
    assert got.options[:len(L.nvrtc_options(arch))] == L.nvrtc_options(arch)
    assert "-ftz=true" in got.options and f"-arch={arch}" in got.options
    assert "warning" not in got.log.lower(), got.log
    assert set(got.lowered) == set(L.name_expressions(source))
    assert all(name.startswith("_Z") for name in got.lowered.values()), got.lowered
    assert got.cubin_bytes > 0
    exposed = N.ftz_exposed_instructions(got.ptx)
    assert not exposed, f"{len(exposed)} float32 instructions that -ftz=true changes, e.g. {exposed[:5]}"
    used = N.resources(got)
    assert set(used) == set(L.name_expressions(source))
    for expr, r in used.items():
        assert r.spill_stores == r.spill_loads == 0, (expr, r)
        assert r.registers * MAX_BLOCK <= REGISTERS_PER_SM, (expr, r)
        assert r.shared <= STATIC_SHARED, (expr, r)
    version, documented = _documented(arch)
    if N.version() == version:  # the extra pins the NVRTC of the table (pyproject.toml)
        table = {expr: f"{r.registers} | {r.stack} | {r.spill_stores}, {r.spill_loads} | {r.shared}"
                 for expr, r in used.items()}
        stale = {e: (documented.get(e), row) for e, row in table.items() if documented.get(e) != row}
        assert not stale, f"docs/cuda.md's resource table is not this compile's (documented, now): {stale}"
