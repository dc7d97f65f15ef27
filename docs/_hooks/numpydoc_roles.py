"""Griffe extension: numpydoc/Sphinx roles in docstrings become mkdocs cross-references.

The docstrings use Sphinx roles (``:func:`entmax_ref.entmax```, ``:mod:`...```,
``:class:``, ``:meth:``, ``:data:``), which mkdocstrings would print literally.  Each role
becomes an autorefs link ``[`name`][identifier]`` when the target is rendered somewhere on
the site (a ``::: identifier`` block, or a public member of a rendered module), and plain
code otherwise (private helpers, kernels), so ``mkdocs build --strict`` has no dangling
reference.  Short names (``:func:`entmax```) and the public re-exports
(``entmax_ref.entmax``) resolve to the one rendered object with that name.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe

DOCS = Path(__file__).resolve().parents[1]
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|obj|exc):`(~?)([^`<>]+?)`")


def _documented() -> tuple[set[str], set[str]]:
    """(rendered identifiers, rendered modules) from the ``::: id`` lines of the pages."""
    ids: set[str] = set()
    for page in DOCS.rglob("*.md"):
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("::: "):
                ids.add(line[4:].strip())
    return ids, ids


def _canonical(target: str) -> str:
    # the site renders the backends/ folder as the top-level package "backends"
    if target.startswith("entmax_ref.backends"):
        return target[len("entmax_ref."):]
    return target


class NumpydocRoles(griffe.Extension):
    """Rewrite the roles of every docstring of the loaded packages."""

    def __init__(self) -> None:
        self.ids, _ = _documented()
        self.modules: set[str] = set()

    def _resolve(self, target: str) -> str | None:
        t = _canonical(target.strip())
        if t in self.ids:
            return t
        parent, _, name = t.rpartition(".")
        if parent in self.modules and not name.startswith("_"):
            return t
        short = t.split(".")[-1]
        if t.startswith("entmax_ref.") and t.count(".") > 1:
            return None
        hits = sorted(i for i in self.ids if i.split(".")[-1] == short)
        hits += sorted(f"{m}.{short}" for m in self.modules if f"{m}.{short}" in self.members)
        hits = sorted(set(hits))
        return hits[0] if len(hits) == 1 else None

    def _rewrite(self, text: str) -> str:
        def sub(m: re.Match) -> str:
            tilde, target = m.group(1), m.group(2).strip()
            shown = target.split(".")[-1] if tilde else target
            ident = self._resolve(target)
            return f"[`{shown}`][{ident}]" if ident else f"`{shown}`"

        return ROLE.sub(sub, text)

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        # the rendered modules (their public members are rendered too)
        self.members: set[str] = set()
        objs = [pkg]
        seen = []
        while objs:
            obj = objs.pop()
            seen.append(obj)
            if obj.is_module and obj.path in self.ids:
                self.modules.add(obj.path)
            for member in obj.members.values():
                if not member.is_alias:
                    objs.append(member)
        for obj in seen:
            if obj.parent is not None and obj.parent.path in self.modules and not obj.name.startswith("_"):
                self.members.add(obj.path)
        for obj in seen:
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = self._rewrite(obj.docstring.value)
