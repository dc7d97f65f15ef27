"""Writing a corpus: every operation's file, one case per line, the manifest (with its
provenance block), the schemas, the readers, a README, the license and ``SHA256SUMS``."""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import sys
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from .exact import RowOracle, base_digits
from .fields import id_fields, inputs_in_dtype
from .lines import ERRORS, FLAGS, FORMAT_MAJOR, FORMAT_MINOR, NUMBERS_RULE, TOLERANCE_CLASSES, TOLERANCE_REASONS, \
    VERDICTS, finish_case
from .operations import OPERATIONS, operation
from .readme import LICENSE, readme
from .schema import schema_file, schema_texts
from .sources import SIZES, Context

#: the readers outside Python written into ``runners/`` of every corpus (package data)
RUNNERS = ("entmax_corpus.h", "check_entmax.c", "check_corpus.js", "rust/Cargo.toml", "rust/src/lib.rs",
           "rust/examples/check_entmax.rs")

TCID_NOTE = ("tcId is '<op>-' and the first 12 hex digits of the SHA-256 of the UTF-8 text of the JSON array "
             "[op, fields], written without whitespace and with object keys in sorted order, where fields maps each "
             "of the file's 'id_fields' to its value in the line, a number by its _hex string (or nested lists of "
             "them): the same inputs have the same id in every corpus of this format major, whatever the seed or the "
             "order of the cases. Cases of the random kinds (random, long, the attention problems) change with the "
             "seed; every other case is the same whatever the seed.")
GROUPS_NOTE = ("The cases of a file are grouped by alpha (or budget) in increasing order, then dtype (float64, "
               "float32, float16, bfloat16); each file's 'groups' gives every group's first line (1-based) and number "
               "of cases.")
POLICY_NOTE = ("Within format major 2 a new format_minor may add fields, flags, verdicts, error classes, files and "
               "kinds; it never removes or changes one. A reader of one minor reads every later minor of its major "
               "by ignoring what it does not know. The schemas of a minor are closed: they list every field and "
               "flag of that minor.")
PROVENANCE_NOTE = ("The provenance block records where and with what this corpus was written. It is the only part "
                   "of the corpus that changes when the same generator writes it again: 'entmax-ref corpus --check' "
                   "compares every other byte.")
_DTYPE_ORDER = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}


def _need_mpmath() -> None:
    try:
        import mpmath  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError('generating the corpus needs mpmath (its oracles give every expected value): '
                                  'pip install "entmax-ref[corpus]"', name="mpmath") from None


def provenance(extra: dict | None = None) -> dict:
    """Where and with what a corpus is written: the date (UTC), the Python, NumPy and mpmath
    versions and the platform, and ``extra`` (the command adds the git commit)."""
    import mpmath

    return {**(extra or {}), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "numpy": np.__version__, "mpmath": mpmath.__version__,
            "platform": f"{platform.platform()} ({sys.byteorder}-endian)"}


def generate_corpus(out, *, seed: int = 0, size: str = "small", ops=None,
                    progress: Callable[[str], None] | None = None, source: dict | None = None) -> dict:
    """Write the conformance corpus into directory ``out`` and return its manifest.

    ``out`` receives ``manifest.json``, one JSON Lines file per operation (format
    :data:`.lines.FORMAT_MAJOR`: every number also as a C99 hex float, a ``tcId``, a verdict,
    flags and a tolerance class per expected value), ``schema/<kind>.schema.json`` (JSON
    Schema draft 2020-12), ``runners/`` (the C, JavaScript and Rust readers), ``README.md``,
    ``LICENSE`` and ``SHA256SUMS`` (the digest of every file but the manifest and itself).

    Parameters
    ----------
    out : path
        Created if missing; the corpus files in it are overwritten.
    seed : int
        Draws the random kinds (Gaussian rows, the long row, the attention problems); every
        other case is the same whatever the seed.  The same seed and version give the same
        bytes on every platform but for the manifest's provenance block.
    size : {"small", "full"}
        "small": the corpus the repository pins (``corpus/v2``); "full": more rows (n =
        100,000 among them), every alpha on every family row, more attention problems.
    ops : iterable of str or None
        Write only the files of these operations (names of :data:`OPERATIONS`); all by default.
    progress : callable or None
        Called with each file's name as it starts.
    source : dict or None
        Recorded in the provenance block (the command gives the git commit it ran from).

    Raises
    ------
    ValueError for a bad size, seed or operation; ModuleNotFoundError (naming the ``corpus``
    extra) without mpmath; :class:`.exact.OracleError` if the oracle cannot decide a value's
    rounding at its two precisions.
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
    ctx = Context(size, int(seed), RowOracle())
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
        "format_minor": FORMAT_MINOR,
        "generator": generator,
        "seed": int(seed),
        "size": size,
        "oracle_digits": list(base_digits()),
        "numbers": NUMBERS_RULE,
        "tolerance_classes": TOLERANCE_CLASSES,
        "tolerances": TOLERANCE_REASONS,
        "notes": {"flags": FLAGS, "verdicts": VERDICTS, "errors": ERRORS, "tcId": TCID_NOTE, "groups": GROUPS_NOTE,
                  "policy": POLICY_NOTE, "provenance": PROVENANCE_NOTE},
        "files": files,
        "schemas": schemas,
        "runners": runners,
        "row_cases": sum(f["cases"] for f in files if not f["op"].startswith("attention")),
        "attention_cases": sum(f["cases"] for f in files if f["op"].startswith("attention")),
    }
    docs = _write_files(out, {"README.md": readme(manifest), "LICENSE": LICENSE})
    listed = {**{f["file"]: f["sha256"] for f in files}, **schemas, **runners, **docs}
    (out / "SHA256SUMS").write_text("".join(f"{d}  {name}\n" for name, d in sorted(listed.items())))
    text = json.dumps(manifest, indent=2)
    prov = json.dumps(provenance(source), indent=2).replace("\n", "\n  ")
    (out / "manifest.json").write_text(f'{text[:-2]},\n  "provenance": {prov}\n}}\n')
    return {**manifest, "provenance": json.loads(prov)}


def runner_texts() -> dict[str, str]:
    """Every reader: its path inside a corpus directory -> its text.  They are package data
    (in the repository their one copy is ``corpus/v2/runners/``, which the package's
    ``runners`` links to in a checkout and pyproject.toml maps to in an install)."""
    folder = resources.files("entmax_ref.testing.conformance.runners")
    return {f"runners/{name}": folder.joinpath(name).read_text(encoding="utf-8") for name in RUNNERS}


def _group_key(case: dict):
    param = "alpha" if "alpha" in case else "budget" if "budget" in case else None
    value = case[param] if param else None
    first = float(value if isinstance(value, str) else value[0]) if param else 0.0
    return param, first, _DTYPE_ORDER[case["dtype"]]


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
            param = _group_key(line)[0]
            key = (param, json.dumps(line.get(param)) if param else None, line["dtype"])
            if not groups or (groups[-1]["param"], json.dumps(groups[-1]["value"]), groups[-1]["dtype"]) != key:
                groups.append({"param": param, "value": line.get(param) if param else None, "dtype": line["dtype"],
                               "first": i, "cases": 0})
            groups[-1]["cases"] += 1
            data = (json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n").encode()
            h.update(data)
            fh.write(data)
    return {"file": o.file, "op": o.name, "schema": schema_file(o.name), "cases": len(lines), "sha256": h.hexdigest(),
            "id_fields": list(id_fields(o.name)), "inputs_in_dtype": inputs_in_dtype(o.name), "groups": groups}


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


def compare_corpora(pinned, fresh) -> list[str]:
    """The differences between two corpus folders, byte for byte, but for the manifest's
    provenance block: one line per file that differs, is missing or is extra."""
    pinned, fresh = Path(pinned), Path(fresh)

    def files(d):
        return {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}

    def core(p):
        data = p.read_bytes()
        return data.split(b'\n  "provenance": ')[0] if p.name == "manifest.json" else data

    a, b = files(pinned), files(fresh)
    out = [f"{name}: only in {pinned}" for name in sorted(a - b)] + [f"{name}: only in {fresh}" for name in sorted(b - a)]
    out += [f"{name}: the bytes differ" for name in sorted(a & b) if core(pinned / name) != core(fresh / name)]
    return out
