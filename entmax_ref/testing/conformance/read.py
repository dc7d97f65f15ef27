"""Reading a corpus back: the manifest's format and every file's SHA-256 are checked first, and
a malformed file is a :class:`CorpusError` that names the file and the line."""

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


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        minor = self.manifest.get("format_minor")
        files = ", ".join(f"{name} {len(v)}" for name, v in self.cases.items())
        return (f"Corpus('{self.path}', format {self.format}{'' if minor is None else f'.{minor}'}, "
                f"{len(self)} cases: {files})")


def _json(data: bytes, where: str):
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{where}: not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None


def _entry(mpath: Path, i: int, f) -> dict:
    """The i-th file entry of a manifest, checked to name a file, its digest and its count."""
    if not isinstance(f, dict):
        raise CorpusError(f"{mpath}: files[{i}] is not an object")
    for key, kind in (("file", str), ("sha256", str), ("cases", int)):
        if not isinstance(f.get(key), kind) or isinstance(f.get(key), bool):
            raise CorpusError(f"{mpath}: files[{i}] has no {key!r} ({kind.__name__})")
    return f


def load_corpus(path) -> Corpus:
    """Read a corpus written by ``entmax-ref corpus``, checking it first.

    Raises :class:`CorpusError` (a ValueError) when the directory or manifest is missing,
    the manifest is not a JSON object of a format this library reads (:data:`.lines.READABLE`:
    the current format and format 1, whose numbers are decimal only) or lacks a file's name,
    digest or count, a file is missing, its SHA-256 or case count differs from the
    manifest's, or one of its lines is not UTF-8 JSON (naming the file and the line).
    """
    path = Path(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CorpusError(f"{path} is not a corpus: no manifest.json (write one with: entmax-ref corpus --out {path})")
    manifest = _json(mpath.read_bytes(), str(mpath))
    if not isinstance(manifest, dict):
        raise CorpusError(f"{mpath}: a manifest is a JSON object, not a {type(manifest).__name__}")
    version = manifest.get("format_major", manifest.get("schema_version"))
    if isinstance(version, bool) or version not in READABLE:
        raise CorpusError(f"{path}: corpus format {version!r}; this entmax-ref reads formats "
                          f"{', '.join(map(str, READABLE))} (regenerate the corpus with: entmax-ref corpus --out DIR)")
    files = manifest.get("files", [])
    if not isinstance(files, list):
        raise CorpusError(f"{mpath}: 'files' is not a list")
    cases = {}
    for i, f in enumerate(files):
        f = _entry(mpath, i, f)
        fp = path / f["file"]
        if not fp.is_file():
            raise CorpusError(f"{path}: {f['file']} is listed in the manifest but missing")
        data = fp.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != f["sha256"]:
            raise CorpusError(f"{fp}: SHA-256 {digest} differs from the manifest's {f['sha256']} (corrupted or edited)")
        lines = []
        for n, ln in enumerate(data.split(b"\n"), 1):
            if ln:
                line = _json(ln, f"{fp}:{n}")
                if not isinstance(line, dict):
                    raise CorpusError(f"{fp}:{n}: a case is a JSON object, not a {type(line).__name__}")
                lines.append(line)
        if len(lines) != f["cases"]:
            raise CorpusError(f"{fp}: {len(lines)} cases, the manifest says {f['cases']}")
        cases[f["file"]] = lines
    return Corpus(path, manifest, cases, int(version))
