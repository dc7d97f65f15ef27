"""The conformance corpus: expected values as language-neutral data files.

``entmax-ref corpus --out DIR [--seed N] [--size small|full]`` writes ``DIR/manifest.json``,
one JSON Lines file per operation (one case per line), their JSON Schemas
(``DIR/schema/<kind>.schema.json``), readers in C, JavaScript and Rust (``DIR/runners/``), a
README, the license and ``SHA256SUMS``, so that implementations in any language can be tested
against this reference without Python.  The repository pins one: ``corpus/v2/`` (``entmax-ref
corpus --check corpus/v2`` regenerates it and compares the bytes).  :func:`load_corpus` reads
a corpus back (checking its format and SHA-256 checksums), :func:`validate_corpus` checks every
line against its schema, and :func:`replay_corpus` / ``entmax-ref check --corpus DIR [--impl
mod:fn]`` replays it against an implementation.  The format is documented in
``docs/corpus.md``.

Not to be confused with :mod:`entmax_ref.testing.corpus`, the *built-in* seeded case set
that ``entmax-ref check`` generates in memory; this package reuses its row and attention
generators and adds the cases chosen to break implementations (near-ties, entries at the
support boundary, subnormal and non-finite scores, huge offsets, alpha near 1 and far above 2,
the property tests' frozen failures, long keys, packed sequences).

Every number is written twice: as the shortest decimal string that round-trips it in its
dtype, and bit-exact as a C99 hex float (``NAME_hex``).  Expected values are the exact
answers, correctly rounded to float64 (:mod:`.exact`: rational arithmetic for sparsemax and
budget-sparsemax, mpmath at two precisions otherwise); nothing is taken from the library's
own solvers.

One module per idea: :mod:`.numformat` (decimal strings), :mod:`.lines` (the layout of a
line: hex form, ids, verdicts, flags, tolerance classes), :mod:`.fields` (the fields of each
file), :mod:`.schema` (the JSON Schemas and validation; :mod:`.validate` its command),
:mod:`.sources` (the rows and problems, and why each is hard), :mod:`.exact` (the oracles),
the generators :mod:`.gen_rows`, :mod:`.gen_family` and :mod:`.gen_attention`,
:mod:`.operations` (the table of operations and the dispatch of a replay), :mod:`.write` (the
files, the manifest and its provenance, the comparison with a pinned corpus), :mod:`.readme`
(the README and license of a corpus), :mod:`.read`, :mod:`.replay` and :mod:`.cli`
(``entmax-ref corpus``).  The readers outside Python are package data whose one copy in the
repository is ``corpus/v2/runners/``.
"""

from __future__ import annotations

from .cli import main
from .numformat import num, nums, parse
from .lines import FORMAT_MAJOR, FORMAT_MINOR
from .operations import OPERATIONS, OPS, Operation, replay_backend, replay_corpus
from .read import SCHEMA_VERSION, Corpus, CorpusError, load_corpus
from .schema import validate_corpus
from .sources import SIZES
from .write import compare_corpora, generate_corpus

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "SCHEMA_VERSION",
    "SIZES",
    "OPERATIONS",
    "OPS",
    "Operation",
    "Corpus",
    "CorpusError",
    "compare_corpora",
    "generate_corpus",
    "load_corpus",
    "main",
    "num",
    "nums",
    "parse",
    "replay_backend",
    "replay_corpus",
    "validate_corpus",
]
