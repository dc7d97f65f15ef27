"""The conformance corpus: expected values as language-neutral data files.

``entmax-ref corpus --out DIR [--seed N] [--size small|full]`` writes ``DIR/manifest.json``
and one JSON Lines file per operation (one case per line), so that implementations in any
language (C++, Rust, Julia, JavaScript, a CUDA harness) can be tested against this
reference without Python.  :func:`load_corpus` reads a corpus back (checking its schema
version and SHA-256 checksums) and :func:`replay_corpus` / ``entmax-ref check --corpus DIR
[--impl mod:fn]`` replays it against an implementation.  The schema is documented in
``docs/corpus.md``.

Not to be confused with :mod:`entmax_ref.testing.corpus`, the *built-in* seeded case set
that ``entmax-ref check`` generates in memory; this module reuses its row and attention
generators and adds the cases chosen to break implementations (near-ties, entries at the
support boundary, huge offsets, alpha near 1 and far above 2, the property tests' frozen
failures).

Every float is a string: the shortest decimal that round-trips the value in the case's
``dtype`` for inputs, in float64 for expected values and tolerances; ``"-inf"``, ``"inf"``
and ``"nan"`` spell the non-finite values.  Expected values are the float64 reference
(NumPy backend); the row operations are checked at generation time against the 50-digit
mpmath oracle (:mod:`entmax_ref.testing.oracle`), and each row case records how far the
written value is from it (``oracle_err``).
"""

from __future__ import annotations

from .cli import main
from .numformat import num, nums, parse
from .operations import OPERATIONS, OPS, Operation, replay_backend, replay_corpus
from .read import SCHEMA_VERSION, Corpus, CorpusError, load_corpus
from .sources import SIZES
from .write import generate_corpus

__all__ = [
    "SCHEMA_VERSION",
    "SIZES",
    "OPERATIONS",
    "OPS",
    "Operation",
    "Corpus",
    "CorpusError",
    "generate_corpus",
    "load_corpus",
    "main",
    "num",
    "nums",
    "parse",
    "replay_backend",
    "replay_corpus",
]
