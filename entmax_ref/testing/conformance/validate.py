"""``python -m entmax_ref.testing.conformance.validate DIR``: check every line of a corpus (and
its manifest) against the JSON Schema it names (:func:`.schema.validate_corpus`); exit status 1
on the first line that does not conform, naming the file, the line and the violation."""

from __future__ import annotations

import sys

from .read import CorpusError
from .schema import validate_corpus


def main(argv: list[str] | None = None) -> int:
    """Validate the corpus in the one directory given; print how many lines conform."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m entmax_ref.testing.conformance.validate CORPUS_DIR", file=sys.stderr)
        return 2
    try:
        n = validate_corpus(args[0])
    except (CorpusError, ModuleNotFoundError, FileNotFoundError) as exc:
        print(f"corpus validation: {exc}", file=sys.stderr)
        return 1
    print(f"{n} lines of {args[0]} conform to their schemas")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
