"""The package layout: backends/ installs as entmax_ref.backends, every subpackage ships."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    assert dirs == {"entmax_ref": "entmax_ref", "entmax_ref.backends": "backends"}
    assert "backends" not in listed, "a top-level 'backends' module must never be installed"
    found = set()
    for pkg, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((pkg, *rel.parts)) if rel.parts else pkg)
    assert found == listed, f"unlisted: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
