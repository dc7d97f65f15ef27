"""The readers outside Python that ship with the corpus (``runners/`` in a corpus directory):
``entmax_corpus.h`` (a single-file C99 reader, libc only), ``check_entmax.c`` (an example that
checks a short C entmax against ``entmax.jsonl``) and ``check_corpus.js`` (Node.js)."""

from __future__ import annotations

from importlib import resources

#: the runner files, in the order they are written
RUNNERS = ("entmax_corpus.h", "check_entmax.c", "check_corpus.js")


def runner_texts() -> dict[str, str]:
    """Every runner file: path inside a corpus directory -> its text (from the package data)."""
    folder = resources.files(__package__).joinpath("runners")
    return {f"runners/{name}": folder.joinpath(name).read_text(encoding="utf-8") for name in RUNNERS}
