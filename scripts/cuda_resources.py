"""The CUDA kernels' resources as ptxas reports them under NVRTC, for docs/cuda.md.

``python scripts/cuda_resources.py`` prints the table (every kernel the loader compiles:
registers, stack frame, spill stores and loads, static shared memory, on sm_80 and
sm_90, each compiled with exactly the options CuPy gives NVRTC);
``python scripts/cuda_resources.py --write`` puts it into docs/cuda.md between its
markers.  tests/test_cuda_nvrtc.py checks the limits and that the docs hold this table.
Needs the NVRTC wheel (``pip install 'entmax-ref[nvrtc]'``), no GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import nvrtc_compile as N  # noqa: E402
from entmax_ref.backends import _cuda_loader as L  # noqa: E402

DOCS = ROOT / "docs" / "cuda.md"
BEGIN = "<!-- the resource table: python scripts/cuda_resources.py --write -->"
END = "<!-- end of the resource table -->"


def table() -> str:
    """The Markdown table (with a line naming the compiler)."""
    per_arch = {arch: {} for arch in N.ARCHS}
    for source in L.KERNELS:
        for arch in N.ARCHS:
            per_arch[arch].update(N.resources(N.compile_source(source, arch)))
    both = " / ".join(N.ARCHS)
    lines = [f"NVRTC {N.version()}, values as {both}:", "",
             "| kernel | registers | stack (bytes) | spill stores, loads (bytes) | shared memory (bytes) |",
             "|---|---|---|---|---|"]
    for source in L.KERNELS:
        for expr in L.name_expressions(source):
            r = [per_arch[arch][expr] for arch in N.ARCHS]
            lines.append(f"| `{expr}` | {' / '.join(str(x.registers) for x in r)} | "
                         f"{' / '.join(str(x.stack) for x in r)} | "
                         f"{' / '.join(f'{x.spill_stores}, {x.spill_loads}' for x in r)} | "
                         f"{' / '.join(str(x.shared) for x in r)} |")
    return "\n".join(lines) + "\n"


def documented() -> str:
    """The table as docs/cuda.md holds it."""
    text = DOCS.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="put the table into docs/cuda.md")
    args = ap.parse_args()
    got = table()
    if args.write:
        text = DOCS.read_text()
        DOCS.write_text(text[:text.index(BEGIN) + len(BEGIN)] + "\n" + got + text[text.index(END):])
    else:
        print(got, end="")


if __name__ == "__main__":
    main()
