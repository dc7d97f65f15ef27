"""Installs in a temporary virtual environment (slow tier: each pip install takes a while).

(1) Uninstalling leaves nothing in site-packages (no numba cache file is written there);
(2) ``pip install .`` then ``pip install -e .`` leaves a working package importable from
any directory (no leftover folder shadows the editable install: "module 'entmax_ref' has
no attribute 'entmax15'"); (3) with a plain install, importing from the clone's root works.

The temporary venv sees this interpreter's packages (numpy, numba, setuptools, ...) through
a folder of links that leaves out entmax_ref itself (pip included), so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
_SKIP = {".git", "build", "dist", "site", ".hypothesis", ".pytest_cache", "__pycache__", "out"}


def _sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"
    # the build is clean: no setuptools warning (the license table, an unlisted package folder);
    # setuptools' notice on every editable install of a mapped package folder ("Editable
    # installation ... folders in your working directory with the same name") is advice, not one
    err = "\n".join(ln for ln in res.stderr.splitlines() if "BuildBackendWarning: Editable installation." not in ln)
    assert "BuildBackendWarning" not in err and "SetuptoolsDeprecationWarning" not in err, res.stderr
    return res.stdout


@pytest.fixture()
def venv(tmp_path):
    """(python of a fresh venv, its site-packages, a copy of the clone, env)."""
    src = tmp_path / "clone"
    shutil.copytree(ROOT, src, symlinks=True, ignore=lambda d, names: [n for n in names if n in _SKIP or n.endswith(".egg-info")])
    vdir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(vdir)], check=True, timeout=300)
    py = vdir / "bin" / "python"
    sp = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip())
    deps = tmp_path / "deps"
    deps.mkdir()
    for outer in site.getsitepackages():
        for entry in Path(outer).iterdir():
            low = entry.name.lower()
            if low.startswith(("entmax_ref", "entmax-ref", "__editable__", "_entmax_ref")) or entry.suffix == ".pth":
                continue
            if not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    (sp / "_outer_packages.pth").write_text(str(deps) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_CACHE_DIR")}
    env["ENTMAX_REF_CACHE_DIR"] = str(tmp_path / "cache")
    env["PIP_NO_INDEX"] = "1"
    return py, sp, src, env


_USE = ("import entmax_ref as er, numpy as np; print(er.entmax15([1.0]).tolist()); "
        "from entmax_ref.backends.numba._jit import jit; from entmax_ref.backends.numba.candidates import _row_max; "
        "jit(no_cpython_wrapper=False)(lambda x: _row_max(x))(np.zeros(2)); print(er.__file__)")


def _pip(py: Path, src: Path, env, *args: str) -> None:
    _sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *args], src, env)


def test_plain_install_works_anywhere_and_uninstall_leaves_nothing(venv, tmp_path):
    """Bugs (1) and (3) on one plain install (each install costs a venv and a build): used
    from another directory and from the clone's root, it caches outside site-packages, and
    uninstalling removes everything."""
    py, sp, src, env = venv
    _pip(py, src, env, ".")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = _sh([str(py), "-c", _USE], elsewhere, env)
    assert out.splitlines()[0] == "[1.0]" and str(sp) in out.splitlines()[1]
    out = _sh([str(py), "-c", _USE + "; import entmax_ref.backends.numba_backend"], src, env)
    assert out.splitlines()[0] == "[1.0]"
    assert not [p for p in (sp / "entmax_ref").rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert list((tmp_path / "cache").rglob("*.nbi")), "no kernel was cached in ENTMAX_REF_CACHE_DIR"
    _sh([str(py), "-m", "pip", "uninstall", "-y", "-q", "entmax-ref"], elsewhere, env)
    assert not (sp / "entmax_ref").exists(), sorted(str(p) for p in (sp / "entmax_ref").rglob("*"))


def test_install_then_editable_install_works_from_another_directory(venv, tmp_path):
    py, sp, src, env = venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pip(py, src, env, ".")
    _sh([str(py), "-c", _USE], elsewhere, env)  # compiles a kernel with the plain install
    _pip(py, src, env, "-e", ".")
    out = _sh([str(py), "-c", _USE], elsewhere, env)
    assert out.splitlines()[0] == "[1.0]"
    assert Path(out.splitlines()[1]).resolve() == (src / "entmax_ref" / "__init__.py").resolve()



_BARE = ("import importlib.machinery as m, json, sys, entmax_ref as er; b = er.backends; "
         "print(json.dumps({'origin': b.__spec__.origin, 'source': isinstance(b.__spec__.loader, m.SourceFileLoader), "
         "'top_level': 'backends' in sys.modules, 'value': er.sparsemax([-2.0, 0.0, 0.5]).tolist(), "
         "'numba': er.sparsemax([-2.0, 0.0, 0.5], backend='numba').tolist()}))")


def test_a_bare_clone_imports_without_an_install(venv, tmp_path):
    """No install at all: the clone's root imports, and ``entmax_ref.backends`` is the
    clone's ``backends/`` found by Python's own import system through the committed link
    ``entmax_ref/backends`` (no ``sys.modules`` entry written by the package itself, no
    top-level ``backends``)."""
    import json

    py, sp, src, env = venv
    assert (src / "entmax_ref" / "backends").is_symlink()
    out = json.loads(_sh([str(py), "-c", _BARE], src, env).strip().splitlines()[-1])
    assert Path(out.pop("origin")) == src / "entmax_ref" / "backends" / "__init__.py"
    assert out == {"source": True, "top_level": False, "value": [0.0, 0.25, 0.75], "numba": [0.0, 0.25, 0.75]}


#: the lowest numba release of the supported range (pyproject.toml's bound, cache_folder.TESTED_NUMBA)
LOWEST_NUMBA = "0.59.1"

_ON_NUMBA = """
import json, numpy as np, numba
import entmax_ref as er
from entmax_ref.backends.numba import _cache
from entmax_ref.backends.numba_precompile import tasks
x = np.random.default_rng(0).standard_normal((8, 300))
q = np.random.default_rng(1).standard_normal((1, 2, 40, 8)).astype(np.float32)
(t,) = [t for t in tasks(["entmax_forward"], ["float64"]) if t.kernel == "rows._rows_15"]
before = t.compiled()
rows = bool(np.allclose(er.entmax15(x, backend="numba"), er.entmax15(x, backend="numpy"), atol=1e-15))
att = er.attention(q, q, q, alpha=1.5, causal=True, backend="numba")
ref = er.attention(q, q, q, alpha=1.5, causal=True, backend="numpy")
print(json.dumps({"numba": numba.__version__, "cache": _cache.CACHE, "before": before, "rows": rows,
                  "attention": bool(np.allclose(att, ref, atol=1e-5)), "auto": er.backends.resolve_backend(None, x).name}))
"""


def test_the_lowest_supported_numba_compiles_caches_and_loads(tmp_path):
    """The kernels' cache class and the float32 products' BLAS binding subclass or bind
    numba internals, hence numba's bound in pyproject.toml; its lower end is tested here
    (the upper end is the one the other tests run on): a fresh environment with that numba
    (from the package index) compiles, caches and, in a second process, loads."""
    import json

    vdir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(vdir)], check=True, timeout=300)
    py = vdir / "bin" / "python"
    got = subprocess.run([str(py), "-m", "pip", "install", "-q", f"numba=={LOWEST_NUMBA}", "scipy", "platformdirs"],
                         capture_output=True, text=True, timeout=1200)
    if got.returncode != 0:  # no package index reachable from here
        pytest.skip(f"numba {LOWEST_NUMBA} could not be installed here: {got.stderr.strip().splitlines()[-1:]}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_CACHE_DIR")}
    env.update(ENTMAX_REF_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    runs = [json.loads(_sh([str(py), "-c", _ON_NUMBA], tmp_path, env).strip().splitlines()[-1]) for _ in range(2)]
    for i, out in enumerate(runs):
        assert out == {"numba": LOWEST_NUMBA, "cache": True, "before": i == 1, "rows": True, "attention": True,
                       "auto": "auto"}
