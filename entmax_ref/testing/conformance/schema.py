"""The JSON Schemas (draft 2020-12) of the corpus files, built from :mod:`.fields`, and the
validation of a corpus against the schemas written with it.

``python -m entmax_ref.testing.conformance.validate DIR`` (:mod:`.validate`) validates every
line of the corpus in DIR (and its manifest) against ``DIR/schema/<kind>.schema.json`` and exits
1 on the first line that does not conform (it needs ``jsonschema``: ``pip install
"entmax-ref[corpus]"``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .fields import FIELDS, outputs
from .lines import ERRORS, FLAGS, FORMAT_MAJOR, VERDICTS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: a decimal number string (Python's repr of a float, NumPy's str of a float32) or a non-finite value
DECIMAL = r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|-?inf|nan)$"
#: a C99 hex-float string as printf's %a writes it, or a non-finite value
HEXFLOAT = r"^(-?0x[01](\.[0-9a-f]*[1-9a-f])?p[-+][0-9]+|-?inf|nan)$"
TOLERANCE_CLASS = r"^(exact|abs:@tol_[a-z_]+)$"
DTYPES = ["float64", "float32", "float16", "bfloat16"]

_NUM = {"type": "string", "pattern": DECIMAL}
_HEX = {"type": "string", "pattern": HEXFLOAT}


def _lists(item: dict, depth: int) -> dict:
    for _ in range(depth):
        item = {"type": "array", "items": item}
    return item


def _sizes(names: str) -> dict:
    return {"type": "object", "required": names.split(), "additionalProperties": False,
            "properties": {k: {"type": "integer", "minimum": 0} for k in names.split()}}


#: a number string, or lists of them to any depth (a parameter that broadcasts)
_ARR = {"anyOf": [_NUM, {"type": "array", "items": {"$ref": "#/$defs/arr"}}]}
_ARR_HEX = {"anyOf": [_HEX, {"type": "array", "items": {"$ref": "#/$defs/arr_hex"}}]}
_TYPES = {
    "num": (_NUM, _HEX),
    "vec": ({"type": "array", "items": _NUM}, {"type": "array", "items": _HEX}),
    "mat": (_lists(_NUM, 2), _lists(_HEX, 2)),
    "t3": (_lists(_NUM, 3), _lists(_HEX, 3)),
    "t4": (_lists(_NUM, 4), _lists(_HEX, 4)),
    "arr": ({"$ref": "#/$defs/arr"}, {"$ref": "#/$defs/arr_hex"}),
    "int": ({"type": "integer", "minimum": 0}, None),
    "bool": ({"type": "boolean"}, None),
    "ints": ({"type": "array", "items": {"type": "integer", "minimum": 0}}, None),
    "bools2": ({"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}, None),
    "shape": (_sizes("B Hq Hkv Nq Nk D Dv"), None),
    "vshape": (_sizes("total_q total_k Hq Hkv D Dv"), None),
    "error": ({"enum": list(ERRORS)}, None),
}


def schema_file(kind: str) -> str:
    """The path of kind's schema inside a corpus directory."""
    return f"schema/{kind}.schema.json"


def _nullable(s: dict, nullable: bool) -> dict:
    return {"anyOf": [s, {"type": "null"}]} if nullable else s


def line_schema(op: str) -> dict:
    """The JSON Schema of one line of ``op``'s file: every field of this format's minor (the
    schema is closed); a ``tol_<field>`` is present exactly when the field's class is
    ``abs:@tol_<field>``."""
    props: dict = {
        "schema": {"type": "object", "required": ["file", "format", "generator"], "additionalProperties": False,
                   "properties": {"file": {"const": schema_file(op)}, "format": {"const": FORMAT_MAJOR},
                                  "generator": {"type": "string", "pattern": "^entmax-ref "}}},
        "tcId": {"type": "string", "pattern": f"^{op}-[0-9a-f]{{12}}$"},
        "op": {"const": op},
        "kind": {"type": "string", "minLength": 1},
        "dtype": {"enum": DTYPES},
    }
    required = list(props)
    for f in FIELDS[op]:
        plain, hexed = _TYPES[f.type]
        props[f.name] = _nullable(plain, f.nullable)
        if f.role != "tol":
            required.append(f.name)
        if hexed is not None:
            props[f.name + "_hex"] = _nullable(hexed, f.nullable)
            if f.role != "tol":
                required.append(f.name + "_hex")
    outs = list(outputs(op))
    props["verdict"] = {"enum": list(VERDICTS)}
    props["flags"] = {"type": "array", "uniqueItems": True, "items": {"enum": list(FLAGS)}}
    props["tol"] = {"type": "object", "required": outs, "additionalProperties": False,
                    "properties": {o: {"type": "string", "pattern": TOLERANCE_CLASS} for o in outs}}
    props["why"] = {"type": "string", "minLength": 1}
    required += ["verdict", "flags", "tol", "why"]
    tols = [{"if": {"properties": {"tol": {"properties": {o: {"const": f"abs:@tol_{o}"}}}}},
             "then": {"required": [f"tol_{o}"]}, "else": {"not": {"required": [f"tol_{o}"]}}} for o in outs]
    return {"$schema": DRAFT, "$id": f"urn:entmax-ref:corpus:{FORMAT_MAJOR}:{op}",
            "title": f"entmax-ref conformance corpus (format {FORMAT_MAJOR}): one line of {op}.jsonl",
            "type": "object", "required": required, "additionalProperties": False, "properties": props,
            "allOf": tols, "$defs": {"arr": _ARR, "arr_hex": _ARR_HEX}}


def manifest_schema() -> dict:
    """The JSON Schema of ``manifest.json``."""
    sha = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
    group = {"type": "object", "required": ["param", "value", "dtype", "first", "cases"], "additionalProperties": False,
             "properties": {"param": {"enum": ["alpha", "budget", None]}, "value": {"type": ["string", "array", "null"]},
                            "dtype": {"enum": DTYPES}, "first": {"type": "integer", "minimum": 1},
                            "cases": {"type": "integer", "minimum": 1}}}
    names = {"type": "array", "items": {"type": "string"}}
    file_entry = {"type": "object", "additionalProperties": False,
                  "required": ["file", "op", "schema", "cases", "sha256", "id_fields", "inputs_in_dtype", "groups"],
                  "properties": {"file": {"type": "string"}, "op": {"enum": list(FIELDS)}, "schema": {"type": "string"},
                                 "cases": {"type": "integer", "minimum": 0}, "sha256": sha, "id_fields": names,
                                 "inputs_in_dtype": names, "groups": {"type": "array", "items": group}}}
    digests = {"type": "object", "additionalProperties": sha}
    text = {"type": "string"}
    provenance = {"type": "object", "required": ["date", "python", "numpy", "mpmath", "platform"],
                  "additionalProperties": False,
                  "properties": {"commit": {"type": ["string", "null"]}, "source": {"enum": ["committed", "modified"]},
                                 "date": text, "python": text, "numpy": text, "mpmath": text, "platform": text}}
    props = {
        "schema": {"type": "object", "required": ["file", "format", "generator"],
                   "properties": {"file": {"const": schema_file("manifest")}, "format": {"const": FORMAT_MAJOR},
                                  "generator": text}},
        "format": {"const": "entmax-ref conformance corpus"},
        "format_major": {"const": FORMAT_MAJOR},
        "format_minor": {"type": "integer", "minimum": 0},
        "generator": {"type": "string", "pattern": "^entmax-ref "},
        "seed": {"type": "integer", "minimum": 0},
        "size": {"enum": ["small", "full"]},
        "oracle_digits": {"type": "array", "items": {"type": "integer"}},
        "numbers": text,
        "tolerance_classes": {"type": "object", "additionalProperties": text},
        "tolerances": text,
        "notes": {"type": "object", "required": ["flags", "verdicts", "errors", "tcId", "groups", "policy",
                                                 "provenance"]},
        "files": {"type": "array", "items": file_entry},
        "schemas": digests,
        "runners": digests,
        "row_cases": {"type": "integer", "minimum": 0},
        "attention_cases": {"type": "integer", "minimum": 0},
        "provenance": provenance,
    }
    return {"$schema": DRAFT, "$id": f"urn:entmax-ref:corpus:{FORMAT_MAJOR}:manifest",
            "title": f"entmax-ref conformance corpus (format {FORMAT_MAJOR}): manifest.json", "type": "object",
            "required": list(props), "additionalProperties": False, "properties": props}


def schema_texts() -> dict[str, str]:
    """Every schema file of a corpus: path inside the corpus -> its text."""
    kinds = {k: line_schema(k) for k in FIELDS}
    kinds["manifest"] = manifest_schema()
    return {schema_file(k): json.dumps(s, indent=2) + "\n" for k, s in kinds.items()}


def validate_corpus(path, limit: int | None = None) -> int:
    """Validate every line of the corpus in ``path`` (or the first ``limit`` lines of each
    file) and its manifest against the schema each names; return the number of lines checked.
    (About 100 lines a second for the attention files: jsonschema checks each number string.)  Raises ``CorpusError`` naming the file, the line
    and the first violation; ModuleNotFoundError (naming the extra) without ``jsonschema``."""
    from .read import CorpusError

    try:
        from jsonschema import Draft202012Validator
    except ModuleNotFoundError:
        raise ModuleNotFoundError('validating a corpus needs jsonschema: pip install "entmax-ref[corpus]"',
                                  name="jsonschema") from None
    path = Path(path)
    validators: dict = {}

    def check(doc, where):
        name = doc.get("schema", {}).get("file") if isinstance(doc, dict) and isinstance(doc.get("schema"), dict) else None
        if name is None:
            raise CorpusError(f"{where}: no schema.file field (a format {FORMAT_MAJOR} corpus names its schema)")
        if name not in validators:
            sp = path / name
            if not sp.is_file():
                raise CorpusError(f"{where}: its schema {name} is missing")
            s = json.loads(sp.read_text())
            Draft202012Validator.check_schema(s)
            validators[name] = Draft202012Validator(s)
        err = next(iter(validators[name].iter_errors(doc)), None)
        if err is not None:
            at = "/".join(str(p) for p in err.absolute_path) or "(the line)"
            raise CorpusError(f"{where}: {at}: {err.message[:300]} (schema {name})")

    manifest = json.loads((path / "manifest.json").read_text())
    check(manifest, f"{path / 'manifest.json'}")
    count = 1
    for f in manifest["files"]:
        with open(path / f["file"], encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if limit is not None and i > limit:
                    break
                check(json.loads(line), f"{path / f['file']}:{i}")
                count += 1
    return count
