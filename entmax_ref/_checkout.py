"""``entmax_ref.backends`` when the package is imported from a source checkout.

An install puts the engines inside the package (``backends/`` maps to
``entmax_ref/backends/``, see ``[tool.setuptools.package-dir]``).  In the clone itself they
are the top-level folder ``backends/``, next to ``entmax_ref/``; when ``entmax_ref`` is
imported from there (the clone's root on ``sys.path``, with any kind of install or none),
:func:`map_backends` loads that folder under the name ``entmax_ref.backends``, so the
source tree never shadows a working install with a broken one.

Only ``backends`` is mapped.  Adding the clone's root to the package's ``__path__`` instead
would make every top-level folder, ``entmax_ref`` itself included, a subpackage, and
``pkgutil.walk_packages`` would recurse without end.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def map_backends(package: str) -> None:
    """Register the checkout's ``backends/`` as ``<package>.backends`` and bind it on the
    package, as an import would; nothing happens in an install (where the package holds its
    own ``backends/``) or when it is already registered."""
    here = os.path.dirname(os.path.abspath(sys.modules[package].__file__))
    src = os.path.join(os.path.dirname(here), "backends")
    if os.path.isdir(os.path.join(here, "backends")) or not os.path.isfile(os.path.join(src, "_base.py")):
        return
    name = package + ".backends"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(src, "__init__.py"),
                                                      submodule_search_locations=[src])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    setattr(sys.modules[package], "backends", sys.modules[name])
