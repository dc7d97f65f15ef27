"""The package layout: backends/ installs as entmax_ref.backends, every subpackage ships."""

from __future__ import annotations

import pathlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    # the corpus's readers ship from their one copy in the repository, the pinned corpus's runners/
    assert dirs == {"entmax_ref": "entmax_ref", "entmax_ref.backends": "backends",
                    "entmax_ref.testing.conformance.runners": "corpus/v2/runners"}
    assert "backends" not in listed, "a top-level 'backends' module must never be installed"
    found = set()
    for pkg, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py") if pkg.count(".") < 2 else ():
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((pkg, *rel.parts)) if rel.parts else pkg)
    # data-only folders (the CUDA sources) are listed too, with their package data, so that
    # setuptools ships them without a "package would be ignored" warning; they hold no Python
    data = {pkg for pkg in cfg["package-data"] if pkg not in found}
    for pkg in data:
        base = max((b for b in dirs if pkg == b or pkg.startswith(b + ".")), key=len)
        folder = ROOT / dirs[base] / pkg.removeprefix(base).lstrip(".").replace(".", "/")
        assert folder.is_dir() and not any(folder.glob("*.py")), pkg
    assert found | data == listed, f"unlisted: {sorted(found - listed)}; listed but absent: {sorted(listed - found - data)}"


CHECK_INSTALLED = r"""
import importlib.util, json, pathlib, sys
import entmax_ref as er
from entmax_ref.backends import _cuda_loader, capabilities, constants, geometry
site = pathlib.Path(sys.argv[1]).resolve()
out = {
    "entmax_ref": str(pathlib.Path(er.__file__).resolve()),
    "backends": str(pathlib.Path(er.backends.__file__).resolve()),
    "top_level_backends": importlib.util.find_spec("backends") is not None,
    "cuda_sources": sorted(p.name for p in _cuda_loader.cuda_dir().iterdir()),
    "runners": sorted(__import__("entmax_ref.testing.conformance.write", fromlist=["x"]).runner_texts()),
    "sparsemax": er.sparsemax([-2.0, 0.0, 0.5], backend="numpy").tolist(),
    "site": str(site),
}
print(json.dumps(out))
"""


def test_the_built_wheel_installs_backends_as_a_subpackage(tmp_path):
    """Build the wheel, install it into a fresh venv (dependencies from this environment
    through a .pth file) and import it from outside the clone: the engines come from the
    installed entmax_ref/backends, no top-level ``backends`` exists, the CUDA sources ship,
    and no test code does (the g++ drivers of the CUDA cores and their CPU team stay in
    tests/)."""
    import json
    import zipfile
    import os
    import subprocess
    import sys
    import sysconfig

    import shutil

    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("entmax_ref", "backends", "corpus/v2/runners"):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "target"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("entmax_ref-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        cuda = {n: zf.read(n) for n in names if "/backends/cuda/" in n}
    assert sorted(n.rsplit("/", 1)[1] for n in cuda) == sorted(p.name for p in (ROOT / "backends" / "cuda").iterdir())
    assert not [n for n in names if "harness" in n or n.endswith(".cpp")], names
    assert not [n for n, text in cuda.items() if b"HostTeam" in text]
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    # without the caller's PYTHONPATH: a checkout on it (with the egg-info of an in-tree
    # build) reads to pip as entmax_ref already installed, and the wheel is skipped
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, text=True, env=clean)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # numpy, scipy, numba from the environment running the tests, after the venv's own site
    (pathlib.Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    res = subprocess.run([str(py), "-I", "-c", CHECK_INSTALLED, site], cwd=work, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    site = str(pathlib.Path(site).resolve())
    assert got["entmax_ref"].startswith(site) and got["backends"].startswith(site), got
    assert got["backends"].endswith("entmax_ref/backends/__init__.py"), got
    assert not got["top_level_backends"], "a top-level 'backends' module is installed"
    assert {"entmax_core.cuh", "entmax_rows.cu", "entmax_attention.cu", "entmax_teams.cuh"} <= set(got["cuda_sources"])
    assert got["sparsemax"] == [0.0, 0.25, 0.75]
    # the corpus's readers, from the pinned corpus's runners/, ship as package data
    from entmax_ref.testing.conformance.write import RUNNERS

    assert got["runners"] == sorted(f"runners/{name}" for name in RUNNERS)


def test_the_readme_test_command_brings_the_peers_without_a_cuda_build():
    """``pip install -e ".[test]"`` installs torch (the adapter's tests) and the entmax
    package (the peer comparisons), pinned to the versions the suite runs with, so no
    separate requirements file exists; the README and the install guide say how to get
    torch's CPU build where the index serves its CUDA build."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch==2.13.0" in extras["test"] and "entmax==1.3" in extras["test"]
    assert not (ROOT / ".ci" / "requirements-peers.txt").exists()
    assert "requirements-peers" not in (ROOT / ".ci" / "run").read_text()
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu"
    for page in ("README.md", "docs/guides/install.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert f'python -m pip install -e ".[test]" && python -m pytest' in text, page
        assert f"python -m pip install torch==2.13.0 {cpu_index}" in text, page


def test_the_test_run_closes_with_what_it_skipped_and_how_to_run_it():
    """conftest.py's last line of a run (pytest_terminal_summary): the skipped tests counted
    by what they need, each with the command or install that runs them."""
    import conftest

    class Report:
        def __init__(self, reason):
            self.longrepr = ("tests/test_x.py", 1, f"Skipped: {reason}")

    class Config:
        stash: dict = {}

    lines = []

    class Reporter:
        stats = {"skipped": [Report("exhaustive tier: run with --exhaustive (or ENTMAX_REF_EXHAUSTIVE=1)")] * 3
                 + [Report("cupy: cupy is not installed (pip install 'entmax-ref[cuda]')")] * 2
                 + [Report("could not import 'torch': No module named 'torch'")]
                 + [Report("node is not installed")]}
        write_line = staticmethod(lines.append)

    conftest.pytest_terminal_summary(Reporter(), 0, Config())
    assert lines == ["7 skipped: 3 are the exhaustive tier (python -m pytest --exhaustive); 2 need cupy and a CUDA "
                     "GPU (pip install \"entmax-ref[cuda]\"); 1 need torch (pip install -e \".[test]\"; its CPU build: "
                     "docs/guides/install.md); 1 node is not installed"]
