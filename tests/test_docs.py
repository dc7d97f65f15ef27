"""The documentation site: its examples run, and it builds strictly (when mkdocs is installed)."""

from __future__ import annotations

import doctest
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if ">>> " in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_doctest_examples_in_pages(page):
    result = doctest.testfile(str(page), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} example(s) failed in {page.relative_to(DOCS)}"


def _section_code(page: Path, heading: str) -> str:
    """All ```python blocks under the level-2 heading that starts with ``heading``."""
    text = page.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    body = next(s for s in sections if s.startswith(heading))
    return "\n".join(re.findall(r"```python\n(.*?)```", body, flags=re.S))


@pytest.mark.parametrize("heading,module", [("PyTorch", "torch"), ("JAX", "jax")])
def test_autodiff_guide_examples_run(heading, module):
    pytest.importorskip(module)
    code = _section_code(DOCS / "guides" / "autodiff.md", heading)
    assert "assert" in code
    exec(compile(code, f"autodiff.md#{heading}", "exec"), {"__name__": f"autodiff_{module}"})


def test_autodiff_guide_starts_from_the_ready_made_adapters():
    """The guide to writing an autodiff rule first points to the rules the library ships,
    and its ready-made example runs."""
    pytest.importorskip("torch")
    text = (DOCS / "guides" / "autodiff.md").read_text(encoding="utf-8")
    intro = re.split(r"^## ", text, flags=re.M)[0]
    assert "`entmax_ref.torch`" in intro and "`entmax_ref.jax`" in intro and "(training.md)" in intro
    code = "\n".join(re.findall(r"```python\n(.*?)```", intro, flags=re.S))
    assert "ert.sparsemax" in code
    exec(compile(code, "autodiff.md#ready-made", "exec"), {"__name__": "autodiff_ready_made"})


def test_every_docs_image_exists():
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.relative_to(DOCS)} shows missing {target}"


def test_math_is_served_from_the_site():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "http://" not in config and "https://" not in config
    for asset in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js", "LICENSE"):
        assert (DOCS / "assets" / "katex" / asset).is_file()
    css = (DOCS / "assets" / "katex" / "katex.min.css").read_text(encoding="utf-8")
    for font in set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)):
        assert (DOCS / "assets" / "katex" / font).is_file(), font


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="mkdocs/mkdocstrings not installed (pip install 'entmax-ref[docs]')")
def test_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material not installed (pip install 'entmax-ref[docs]')")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = (site / "math" / "gradients" / "index.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in html and "assets/katex/katex.min.js" in html
    assert (site / "img" / "dispersion.png").is_file()
    api = (site / "reference" / "entmax" / "index.html").read_text(encoding="utf-8")
    assert "entmax_threshold" in api
    shutil.rmtree(site, ignore_errors=True)
