"""Writing a corpus: every operation's file, one case per line, and the manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np

from .exact import RowOracle
from .gen_rows import prefill_refs
from .operations import OPERATIONS, operation
from .read import SCHEMA_VERSION
from .sources import SIZES, Context, row_sources


def _need_mpmath() -> None:
    try:
        import mpmath  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError('generating the corpus needs mpmath (its 50-digit oracle checks every row case): '
                                  'pip install "entmax-ref[corpus]"', name="mpmath") from None


def generate_corpus(out, *, seed: int = 0, size: str = "small", ops=None,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Write the conformance corpus into directory ``out`` and return its manifest.

    Parameters
    ----------
    out : path
        Created if missing; the corpus files in it are overwritten.
    seed : int
        The same seed (and entmax-ref version) gives byte-identical files on one platform.
    size : {"small", "full"}
        "small": >= 1,000 row cases and >= 100 attention cases, written in seconds;
        "full": more and longer rows (n = 100,000 among them) and more attention problems.
    ops : iterable of str or None
        Write only the files of these operations (names of :data:`OPERATIONS`); all by default.
    progress : callable or None
        Called with each file's name as it starts.

    Raises
    ------
    ValueError for a bad size or seed; ModuleNotFoundError (naming the ``corpus`` extra)
    without mpmath; RuntimeError if a float64 probability with alpha <= 2 misses the
    50-digit oracle by more than 4e-15 (the library's accuracy contract).  A case whose
    reference is within that but further from the oracle than its own float64 tolerance
    is written with ``"within_tol_of_oracle": false`` and counted in the manifest.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if ops is not None:
        ops = tuple(ops)
        for op in ops:
            operation(op)
    _need_mpmath()
    import entmax_ref as er

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(size, int(seed), RowOracle(), [])
    ctx.rows = row_sources(size, int(seed))
    prefill_refs(ctx)
    files = []
    for o in OPERATIONS:
        if o.generate is None or (ops is not None and o.name not in ops):
            continue
        if progress:
            progress(o.file)
        h = hashlib.sha256()
        count = beyond = 0
        with open(out / o.file, "wb") as fh:
            for case in o.generate(ctx):
                count += 1
                beyond += case.get("within_tol_of_oracle") is False
                line = (json.dumps({"id": f"{o.name}-{count:05d}", **case}, separators=(",", ":"),
                                   allow_nan=False) + "\n").encode()
                h.update(line)
                fh.write(line)
        files.append({"file": o.file, "op": o.name, "cases": count, "sha256": h.hexdigest(),
                      "beyond_oracle_tol": beyond})
    manifest = {
        "format": "entmax-ref conformance corpus",
        "schema_version": SCHEMA_VERSION,
        "entmax_ref_version": er.__version__,
        "seed": int(seed),
        "size": size,
        "files": files,
        "row_cases": sum(f["cases"] for f in files if not f["op"].startswith("attention")),
        "attention_cases": sum(f["cases"] for f in files if f["op"].startswith("attention")),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest



