"""Writing a corpus: every operation's file, one case per line, and the manifest."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from .exact import RowOracle
from .gen_rows import prefill_refs
from .operations import OPERATIONS, operation
from .lines import (FLAGS, FORMAT_MAJOR, NUMBERS_RULE, TOLERANCE_CLASSES, TOLERANCE_REASONS, finish_case,
                    inputs_in_dtype)
from .schema import schema_file, schema_texts
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

    ``out`` receives ``manifest.json``, one JSON Lines file per operation (format
    :data:`.lines.FORMAT_MAJOR`: every number also as a C99 hex float, a stable ``tcId``,
    ``flags`` and a tolerance class per expected value), ``schema/<kind>.schema.json`` (JSON
    Schema draft 2020-12, one per file kind) and ``runners/`` (the C and JavaScript readers).

    Parameters
    ----------
    out : path
        Created if missing; the corpus files in it are overwritten.
    seed : int
        The same seed (and entmax-ref version) gives byte-identical files on one platform;
        a case's ``tcId`` depends only on its inputs, so it is the same in every
        regeneration of this format.
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
    generator = f"entmax-ref {er.__version__}"
    files = []
    for o in OPERATIONS:
        if o.generate is None or (ops is not None and o.name not in ops):
            continue
        if progress:
            progress(o.file)
        files.append(_write_file(out, o, o.generate(ctx), generator))
    schemas = _write_files(out, schema_texts())
    runners = _write_files(out, runner_texts())
    manifest = {
        "schema": {"file": schema_file("manifest"), "format": FORMAT_MAJOR, "generator": generator},
        "format": "entmax-ref conformance corpus",
        "format_major": FORMAT_MAJOR,
        "generator": generator,
        "seed": int(seed),
        "size": size,
        "numbers": NUMBERS_RULE,
        "tolerance_classes": TOLERANCE_CLASSES,
        "tolerances": TOLERANCE_REASONS,
        "notes": {"flags": FLAGS, "tcId": TCID_NOTE, "groups": GROUPS_NOTE},
        "files": files,
        "schemas": schemas,
        "runners": runners,
        "row_cases": sum(f["cases"] for f in files if not f["op"].startswith("attention")),
        "attention_cases": sum(f["cases"] for f in files if f["op"].startswith("attention")),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest




#: the readers outside Python written into ``runners/`` of every corpus (package data):
#: ``entmax_corpus.h`` (a single-file C99 reader, libc only), ``check_entmax.c`` (an example that
#: checks a short C entmax against ``entmax.jsonl``) and ``check_corpus.js`` (Node.js)
RUNNERS = ("entmax_corpus.h", "check_entmax.c", "check_corpus.js")


def runner_texts() -> dict[str, str]:
    """Every reader: its path inside a corpus directory -> its text."""
    folder = resources.files(__package__).joinpath("runners")
    return {f"runners/{name}": folder.joinpath(name).read_text(encoding="utf-8") for name in RUNNERS}


TCID_NOTE = ("tcId is '<op>-' and the first 12 hex digits of the SHA-256 of the case's inputs (dtype, parameters "
             "and inputs, in their hex form): unique within a file (inputs that occur twice are written once) and "
             "the same in every regeneration with this format major, whatever the seed or the order of the cases.")
GROUPS_NOTE = ("The cases of a file are grouped by alpha (or budget) in increasing order, then dtype (float64 "
               "first); each file's 'groups' gives every group's first line (1-based) and number of cases.")


def _group_key(case: dict):
    param = "alpha" if "alpha" in case else "budget" if "budget" in case else None
    return param, (float(case[param]) if param else 0.0), case["dtype"] != "float64"


def _write_file(out: Path, o, cases, generator: str) -> dict:
    """Write one operation's cases, finished (:func:`.lines.finish_case`), deduplicated by tcId
    and grouped by (alpha or budget, dtype); return its manifest entry."""
    stamp = {"file": schema_file(o.name), "format": FORMAT_MAJOR, "generator": generator}
    lines, seen = [], set()
    for case in cases:
        line = finish_case(o.name, case, stamp)
        if line["tcId"] not in seen:
            seen.add(line["tcId"])
            lines.append(line)
    lines.sort(key=_group_key)  # stable: within a group, the generation order
    groups: list = []
    h = hashlib.sha256()
    with open(out / o.file, "wb") as fh:
        for i, line in enumerate(lines, 1):
            param, _, _ = _group_key(line)
            key = (param, line.get(param) if param else None, line["dtype"])
            if not groups or (groups[-1]["param"], groups[-1]["value"], groups[-1]["dtype"]) != key:
                groups.append({"param": key[0], "value": key[1], "dtype": key[2], "first": i, "cases": 0})
            groups[-1]["cases"] += 1
            data = (json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n").encode()
            h.update(data)
            fh.write(data)
    return {"file": o.file, "op": o.name, "schema": schema_file(o.name), "cases": len(lines),
            "sha256": h.hexdigest(), "beyond_oracle_tol": sum(c.get("within_tol_of_oracle") is False for c in lines),
            "inputs_in_dtype": inputs_in_dtype(o.name), "groups": groups}


def _write_files(out: Path, texts: dict) -> dict:
    """Write ``{relative path: text}`` under ``out``; return ``{relative path: sha256}``."""
    digests = {}
    for rel, text in texts.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        target.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests
