"""Every docstring example in the package runs (and is checked) as a doctest."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import entmax_ref

OPTIONAL = {"cupy", "torch", "jax", "matplotlib", "mkdocs"}


def _modules():
    """The package's modules.  In a clone, entmax_ref.__path__ also holds the clone's root
    (so that ``backends/`` resolves as entmax_ref.backends): walk the package's own folder
    and the backends package, not the whole root (which would recurse into entmax_ref/)."""
    import entmax_ref.backends as backends

    own = [p for p in entmax_ref.__path__ if pkgutil.os.path.basename(p.rstrip("/")) == "entmax_ref"]
    names = ["entmax_ref", "entmax_ref.backends"]
    for path, prefix in ((own, "entmax_ref."), (backends.__path__, "entmax_ref.backends.")):
        names += [info.name for info in pkgutil.walk_packages(path, prefix)]
    return sorted(n for n in set(names) if not n.endswith("__main__"))  # importing those runs the CLI


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # a module of an optional extra whose package is absent
        if getattr(exc, "name", None) and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"


def test_readme_examples():
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "README.md"
    result = doctest.testfile(str(readme), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_readme_code_blocks_run():
    """The README's plain (non-doctest) python blocks run as written."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if not b.lstrip().startswith(">>>")]
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
