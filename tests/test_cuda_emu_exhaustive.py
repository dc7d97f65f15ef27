"""The emulated CUDA kernels under the sanitizers, shuffled schedules, and mutation.

Exhaustive tier (``--exhaustive``).  Each case runs tests/cuda_emu/workload.py in a
subprocess (a sanitizer's runtime must be loaded first, and a mutant must not share a
process with the real sources):

* ThreadSanitizer: every kernel template, one OS thread per CUDA thread; zero reports;
* AddressSanitizer: the same, for out-of-bounds reads and writes;
* fiber schedules shuffled by several seeds (``EMU_SEED``, all in one process): the same
  answers;
* mutants of the sources, generated from their text in a temporary folder: each
  ``__syncthreads()`` or warp shuffle of entmax_teams.cuh removed in turn, and an
  off-by-one in score_row's causal bound, must each be caught (a failed launch, a wrong
  answer, row kernels that no longer give the g++ harness's bits, or, for a removed
  barrier whose race the fiber schedules do not show, a ThreadSanitizer report); three
  defects the default tier's checks alone must catch, in fiber mode (the emulator's
  shared-array and race checks, the device arrays' guard pages, the blocks' reverse
  order): the block scratch sized for 256 threads while launches may have 512, the
  trailing ``__syncthreads()`` of the block reduction dropped, and the block loop one
  entry past the row.  A mutant that does not compile is an error of the test, not a
  catch.

Under pytest-xdist the cases (and the builds each makes, cached by content) run in
parallel.  Time: ``python -m pytest tests/test_cuda_emu_exhaustive.py tests/test_cuda_nvrtc.py
--exhaustive -q``, docs/cuda.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_cases import tool_missing
from entmax_ref.backends import _cuda_loader

pytestmark = pytest.mark.exhaustive

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "cuda_emu" / "workload.py"
SOURCES = sorted(_cuda_loader.KERNELS)


def _runtime(name: str) -> str:
    """The sanitizer runtime lib<name>.so of g++ (skipped without it, failed in CI)."""
    gxx = shutil.which("g++")
    if gxx is None:
        tool_missing("g++", "no g++ to build the emulated kernels")
    path = subprocess.run([gxx, f"-print-file-name=lib{name}.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path):
        tool_missing("g++", f"g++ has no lib{name}.so")
    return path


def run(variant: str, source: str, cuda_dir: Path | None = None, env: dict | None = None, seeds=()):
    cmd = [sys.executable, str(WORKLOAD), variant, source] + ([str(cuda_dir)] if cuda_dir else [])
    cmd += [f"--seeds={','.join(map(str, seeds))}"] if seeds else []
    full = dict(os.environ, **(env or {}))
    if variant in ("tsan", "asan"):
        full["LD_PRELOAD"] = _runtime(variant)
        full["TSAN_OPTIONS"] = "halt_on_error=0 report_signal_unsafe=0"
        full["ASAN_OPTIONS"] = "detect_leaks=0"
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=ROOT, timeout=1800)


@pytest.mark.parametrize("source", SOURCES)
def test_thread_sanitizer_reports_nothing(source):
    res = run("tsan", source)
    assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-4000:]
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]


@pytest.mark.parametrize("source", SOURCES)
def test_address_sanitizer_reports_nothing(source):
    res = run("asan", source)
    assert "ERROR: AddressSanitizer" not in res.stderr, res.stderr[-4000:]
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]


@pytest.mark.parametrize("source", SOURCES)
def test_shuffled_schedules_give_the_same_answers(source):
    res = run("fibers", source, seeds=(1, 2, 3))
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]


def _mutants() -> list:
    """(id, file, source text, caught in fiber mode alone) of each mutant."""
    teams = (_cuda_loader.cuda_dir() / "entmax_teams.cuh").read_text()
    out = []
    for pattern, what in ((r"__syncthreads\(\);", "syncthreads"),
                          (r"__shfl_xor_sync\(FULL_MASK, ([^,]+), off\)", "shuffle")):
        for i, m in enumerate(re.finditer(pattern, teams)):
            # a removed barrier is an empty statement; a removed shuffle keeps the lane's own value
            repl = "" if what == "syncthreads" else m.group(1)
            line = teams.count("\n", 0, m.start()) + 1
            out.append((f"teams-{what}-line{line}", "entmax_teams.cuh", teams[:m.start()] + repl + teams[m.end():],
                        False))
    for name, old, new in (
            ("scratch-for-256-threads", "constexpr int MAX_WARPS = 32;", "constexpr int MAX_WARPS = 8;"),
            ("block-reduction-without-trailing-barrier", "__syncthreads();  // scratch is reused by the next reduction",
             "// the barrier before the next reduction's writes, removed"),
            ("block-loop-one-past-the-row", "for (int i = tid; i < n; i += blockDim.x) f(i, a);",
             "for (int i = tid; i <= n; i += blockDim.x) f(i, a);")):
        assert teams.count(old) == 1, f"entmax_teams.cuh changed: update the mutant {name}"
        out.append((name, "entmax_teams.cuh", teams.replace(old, new), True))
    core = (_cuda_loader.cuda_dir() / "entmax_core.cuh").read_text()
    bound = "if (causal && r.i_abs + 1 < lim) lim = r.i_abs + 1;"
    assert core.count(bound) == 1, "score_row's causal bound moved: update the mutant"
    out.append(("score_row-causal-off-by-one", "entmax_core.cuh",
                core.replace(bound, "if (causal && r.i_abs + 2 < lim) lim = r.i_abs + 2;"), False))
    return out


MUTANTS = _mutants()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutants_are_caught(mutant, tmp_path):
    name, file, text, fibers_alone = mutant
    shutil.copytree(_cuda_loader.cuda_dir(), tmp_path / "cuda")
    (tmp_path / "cuda" / file).write_text(text)
    sources = ("entmax_attention.cu",) if file == "entmax_core.cuh" else ("entmax_rows.cu",)
    if fibers_alone:  # every kernel source: the defect must show wherever the teams are used
        sources = SOURCES
    for source in sources:
        res = run("fibers", source, tmp_path / "cuda", seeds=(0,) if fibers_alone else (0, 1, 2))
        assert "BuildError" not in res.stdout, f"{name} does not compile (a mutant must be valid code):\n{res.stdout}"
        if fibers_alone:
            assert res.returncode != 0, f"{name} was not caught in fiber mode running {source}:\n{res.stdout}"
    if res.returncode != 0:
        return
    res = run("tsan", sources[0], tmp_path / "cuda")
    assert res.returncode != 0 or "WARNING: ThreadSanitizer" in res.stderr, f"{name} was not caught"
