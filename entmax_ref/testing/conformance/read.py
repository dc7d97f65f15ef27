"""Reading a corpus back: the manifest's format version and every file's SHA-256 are checked first."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


from .lines import FORMAT_MAJOR, READABLE

#: the format this library writes (the manifest's ``format_major``; ``schema_version`` in format 1)
SCHEMA_VERSION = FORMAT_MAJOR


class CorpusError(ValueError):
    """A corpus directory that is missing, of a format this library does not read, or corrupted."""


@dataclass
class Corpus:
    """A loaded corpus: its directory, manifest and the cases of each file (dicts, as in
    the files: numbers are strings; :func:`.lines.value` turns a field into an array, from
    its exact hex form when the corpus has one)."""

    path: Path
    manifest: dict
    cases: dict  #: file name -> list of case dicts
    format: int = FORMAT_MAJOR  #: the format major it was written in (1: decimal numbers only)

    def __len__(self) -> int:
        return sum(len(v) for v in self.cases.values())


def load_corpus(path) -> Corpus:
    """Read a corpus written by ``entmax-ref corpus``, checking it first.

    Raises :class:`CorpusError` (a ValueError) when the directory or manifest is missing,
    the format is not one this library reads (:data:`.lines.READABLE`: the current format
    and format 1, whose numbers are decimal only), a file is missing, or its SHA-256 or case
    count differs from the manifest's.
    """
    path = Path(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CorpusError(f"{path} is not a corpus: no manifest.json (write one with: entmax-ref corpus --out {path})")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{mpath}: not JSON ({exc})") from None
    version = manifest.get("format_major", manifest.get("schema_version"))
    if isinstance(version, bool) or version not in READABLE:
        raise CorpusError(f"{path}: corpus format {version!r}; this entmax-ref reads formats "
                          f"{', '.join(map(str, READABLE))} (regenerate the corpus with: entmax-ref corpus --out DIR)")
    cases = {}
    for f in manifest.get("files", []):
        fp = path / f["file"]
        if not fp.is_file():
            raise CorpusError(f"{path}: {f['file']} is listed in the manifest but missing")
        data = fp.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != f["sha256"]:
            raise CorpusError(f"{fp}: SHA-256 {digest} differs from the manifest's {f['sha256']} (corrupted or edited)")
        lines = [json.loads(ln) for ln in data.decode().splitlines() if ln]
        if len(lines) != f["cases"]:
            raise CorpusError(f"{fp}: {len(lines)} cases, the manifest says {f['cases']}")
        cases[f["file"]] = lines
    return Corpus(path, manifest, cases, int(version))


