"""MkDocs hook: show doctest paragraphs of docstrings as Python console code blocks.

numpydoc renders a docstring's ``Examples`` section as code, but many short docstrings
carry their example as a bare doctest paragraph (``>>> ...`` lines, then the output, up
to a blank line).  Markdown would read the ``>>>`` as nested block quotes.  This hook adds
a Markdown preprocessor that fences every such paragraph outside an existing fence as a
``pycon`` block; the pages' own examples are already fenced and are left alone.
"""

from __future__ import annotations

from markdown import Extension
from markdown.preprocessors import Preprocessor


class _DoctestBlocks(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fence: str | None = None
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.lstrip()
            if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
                fence = stripped[:3]
            elif fence is not None and stripped.startswith(fence):
                fence = None
            elif fence is None and (stripped.startswith(">>> ") or stripped == ">>>"):
                indent = line[: len(line) - len(stripped)]
                out.append(f"{indent}```pycon")
                while i < len(lines) and lines[i].strip():
                    out.append(lines[i])
                    i += 1
                out.append(f"{indent}```")
                continue
            out.append(line)
            i += 1
        return out


class DoctestBlocksExtension(Extension):
    def extendMarkdown(self, md) -> None:  # noqa: N802 (Markdown's API name)
        md.preprocessors.register(_DoctestBlocks(md), "entmax_ref_doctest_blocks", 29)


def on_config(config):
    config.markdown_extensions.append(DoctestBlocksExtension())
    return config
