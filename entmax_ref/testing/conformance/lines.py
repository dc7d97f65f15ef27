"""The layout of a corpus line (format 2): the ``schema`` stamp, the ``tcId``, the ``verdict``,
the ``flags``, the bit-exact ``NAME_hex`` sibling of every number and the tolerance class of
every expected value; and the notes the manifest carries to explain them.

A generator yields a case with decimal number strings (:mod:`.numformat`) and a ``tol_``
bound for every expected value; :func:`finish_case` turns it into the line that is written.
:func:`value` and :func:`tolerance` read a line back (the hex form when there is one, so
that a format 1 corpus, decimal only, still reads).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from .fields import COMMON, FIELDS, NUMERIC, id_fields, outputs
from ..report import hexnum
from .numformat import parse

#: the format's major version: a new major is a breaking change for readers
FORMAT_MAJOR = 2
#: the format's minor version: a new minor adds fields, flags, files or kinds (readers of an
#: older minor of the same major ignore what they do not know)
FORMAT_MINOR = 0
#: the formats this library reads (1: decimal numbers only, no schema, ids, flags or tolerance classes)
READABLE = (1, 2)

#: file -> {field: class} of the float64 expected values the library returns correctly
#: rounded, so that their class is ``exact`` instead of the tolerance model's bound; where p
#: is one of them, the support is exact but for entries whose exact probability rounds to 0
FLOAT64_CLASSES: dict[str, dict[str, str]] = {"entmax": {"p": "exact", "tau": "exact"},
                                               "entmax_batch": {"p": "exact", "tau": "exact"},
                                               "budget_sparsemax": {"p": "exact"},
                                               "normmax": {"p": "exact", "tau": "exact"}}

NUMBERS_RULE = (
    "Every number is written twice: NAME as the shortest decimal string that round-trips the value in its "
    "dtype, and NAME_hex as a C99 hexadecimal floating constant (printf's %a form: '0x1.8p-1', '-0x0p+0', "
    "'0x0.0000000000001p-1022' for a subnormal) or 'inf', '-inf', 'nan'. Readers use NAME_hex: strtod (C), "
    "float.fromhex (Python) or the mantissa-times-power-of-two rule (JavaScript, Rust) give the value exactly. "
    "The fields listed in a file's 'inputs_in_dtype' hold values of the case's dtype (a float32, float16 or "
    "bfloat16 value is exact in its hex form, so reading it as float64 and rounding to the dtype changes "
    "nothing); every other number is a float64 value. The decimal NAME of such an input is the dtype's own "
    "shortest string: parse it in that dtype (strtof for float32), not as float64.")

TOLERANCE_CLASSES = {
    "exact": "the result, converted to float64, equals the expected value (0 and -0 are equal; an integer "
             "equals it)",
    "abs:@FIELD": "|result[i] - expected[i]| <= FIELD[i] (FIELD has the expected value's shape) or <= FIELD "
                  "(a number, for every entry): the error budget of a correct implementation in the case's dtype",
    "non-finite": "in every class an expected -inf, inf or nan must be matched exactly (nan by nan)",
}

TOLERANCE_REASONS = (
    "The abs:@tol_* bounds are the library's tolerance model (docs/validate.md) for an implementation working "
    "in the case's dtype with float64 accumulation where it matters: per entry for p, out and the attention "
    "gradients (an entry near the threshold carries the threshold's error), per row for a VJP, per value for "
    "tau, the loss and the ASEntmax scale. tol_support is the number of entries whose membership of the "
    "support a correct implementation in the dtype may decide either way (within the threshold's error of "
    "it, or in the support with a probability that may round to 0). A field whose every bound is 0 is "
    "'exact' and has no tol_ field.")

#: flag -> what a case with it exercises (the manifest's notes)
FLAGS = {
    "ties": "two or more equal finite scores",
    "near-ties": "the largest scores one ulp or 1e-12 apart, or all equal but one",
    "masked": "some scores are -inf (masked: their p is exactly 0)",
    "all-masked": "every score is -inf: p = 0, tau = -inf, support 0, zero gradients",
    "huge-offset": "scores of magnitude >= 1e4 (coarse spacing, cancellation in x - tau)",
    "support-boundary": "scores exactly at the threshold (or a breakpoint) and one ulp either side",
    "subnormal": "subnormal scores, or expected probabilities that are subnormal in the case's dtype",
    "non-finite": "NaN or +inf scores: an error (see 'error')",
    "found-by-hypothesis": "a frozen failure found by the property tests",
    "alpha-near-1": "1 < alpha <= 1.01 (the limit towards softmax)",
    "alpha-above-2": "alpha > 2 (p = t^(1/(alpha-1)) flattens near the support's edge)",
    "ill-posed": "the gradient is discontinuous at x (an entry at the threshold or a breakpoint): the "
                 "expected value is that of the p written; an implementation that takes x may differ "
                 "(verdict 'acceptable')",
    "tiny": "n <= 2",
    "long-row": "n >= 1024 (summation error grows with n)",
    "per-row-alpha": "rows of different alphas in one call",
    "budget-zero": "budget 0 (p = 0)",
    "budget-above-support": "a budget at or above the number of unmasked scores (those are 1)",
    "causal": "causal mask, bottom-right aligned",
    "grouped-query": "grouped-query heads (Hq > Hkv)",
    "cross": "cross attention (Nq != Nk)",
    "key-padding": "keys masked by key_lengths or key_padding_mask",
    "empty-query-rows": "some query rows see no key (zero output and gradients)",
    "alibi": "ALiBi biases",
    "asentmax": "ASEntmax per-row scale (beta, gamma, delta, offset)",
    "per-head-alpha": "one alpha per query head",
    "long-keys": "128 keys or more",
    "varlen": "packed sequences of different lengths (cu_seqlens)",
}

#: verdict -> what it asks of an implementation (the manifest's notes)
VERDICTS = {
    "valid": "the result must match every expected value within its class",
    "acceptable": "the expected values are one of several defensible answers (the flags say why): a runner "
                  "compares them and reports a difference, but does not count it as a failure",
}

#: error class -> what it means (the manifest's notes)
ERRORS = {
    "invalid-input": "the scores hold NaN or +inf: the library raises ValueError. An implementation passes by "
                     "reporting an error, or by returning NaN for p and tau (the expected values) and support 0",
}

_KIND_FLAGS = {"near-ties": "near-ties", "support-boundary": "support-boundary", "subnormal": "subnormal",
               "found-by-hypothesis": "found-by-hypothesis", "non-finite": "non-finite"}


def _hexes(a):
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return hexnum(a)
    return [_hexes(r) for r in a] if a.ndim > 1 else [hexnum(v) for v in a.tolist()]


def tiny(dtype: str) -> float:
    """The smallest normal value of ``dtype``."""
    return {"float64": 2.0 ** -1022, "float32": 2.0 ** -126, "bfloat16": 2.0 ** -126, "float16": 2.0 ** -14}[dtype]


def _row_flags(op: str, line: dict) -> list[str]:
    flags = []
    dt = line["dtype"]
    x = parse(line["x"], dt)
    fin = x[np.isfinite(x)]
    if fin.size != np.unique(fin).size:
        flags.append("ties")
    if np.isneginf(x).any():
        flags.append("masked" if fin.size else "all-masked")
    if fin.size and np.abs(fin).max() >= 1e4:
        flags.append("huge-offset")
    p = parse(line["p"]) if "p" in line else np.zeros(0)
    small = np.concatenate([fin[fin != 0], p[np.isfinite(p) & (p != 0)]])
    if np.any(np.abs(small) < tiny(dt)):
        flags.append("subnormal")
    if "alpha" in line:
        a = parse(line["alpha"])
        flags += ["alpha-near-1"] if np.any((1.0 < a) & (a <= 1.01)) else []
        flags += ["alpha-above-2"] if np.any(a > 2.0) else []
        flags += ["per-row-alpha"] if a.ndim else []
    if "budget" in line:
        b = float(line["budget"])
        flags += ["budget-zero"] if b == 0.0 else ["budget-above-support"] if b >= fin.size else []
    n = x.shape[-1]
    flags += ["tiny"] if n <= 2 else ["long-row"] if n >= 1024 else []
    return flags


def _attention_flags(op: str, line: dict) -> list[str]:
    s = line["shape"]
    varlen = "cu_seqlens_q" in line
    flags = ["causal"] if line["causal"] else []
    flags += ["grouped-query"] if s["Hq"] > s["Hkv"] else []
    if varlen:
        lq, lk = np.diff(line["cu_seqlens_q"]), np.diff(line["cu_seqlens_k"])
        flags += ["cross"] if np.any(lq != lk) else []
        flags += ["empty-query-rows"] if np.any((lk == 0) & (lq > 0)) else []
        flags += ["long-keys"] if lk.max(initial=0) >= 128 else []
    else:
        flags += ["cross"] if s["Nq"] != s["Nk"] else []
        if line["key_lengths"] is not None or line["key_padding_mask"] is not None:
            flags.append("key-padding")
        lengths = line["key_lengths"] or []
        masks = line["key_padding_mask"] or []
        if 0 in lengths or any(not any(m) for m in masks) or (line["causal"] and s["Nq"] > s["Nk"]):
            flags.append("empty-query-rows")
        flags += ["long-keys"] if s["Nk"] >= 128 else []
    flags += ["alibi"] if line["alibi_slopes"] is not None else []
    flags += ["asentmax"] if line["beta"] is not None else []
    flags += ["per-head-alpha"] if isinstance(line["alpha"], list) else []
    flags += ["varlen"] if varlen else []
    return flags


def flags(op: str, line: dict, extra=()) -> list[str]:
    """The flags of a line (names of :data:`FLAGS`), in :data:`FLAGS`' order."""
    if op.startswith("attention"):
        got = set(_attention_flags(op, line))
    elif op == "asentmax_scale":
        got = set()
    else:
        got = set(_row_flags(op, line))
    if line["kind"] in _KIND_FLAGS:
        got.add(_KIND_FLAGS[line["kind"]])
    got.update(extra)
    return [f for f in FLAGS if f in got]


def id_text(op: str, line: dict) -> str:
    """The text a case's id digests: the JSON array ``[op, {field: value}]`` over the file's
    id fields (:func:`.fields.id_fields`), every number by its ``_hex`` form, with sorted keys
    and no whitespace (docs/corpus.md, "Ids")."""
    key = {name: line.get(name + "_hex", line.get(name)) for name in id_fields(op)}
    return json.dumps([op, key], sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def tcid(op: str, line: dict) -> str:
    """``<op>-<12 hex digits>``: the start of the SHA-256 of :func:`id_text`, so that the same
    inputs get the same id in every corpus of this format, whatever the seed or the order."""
    return f"{op}-{hashlib.sha256(id_text(op, line).encode()).hexdigest()[:12]}"


def float64_class(op: str, case: dict, name: str) -> str | None:
    """The class of a float64 value the library returns correctly rounded
    (:data:`FLOAT64_CLASSES`), or None."""
    return FLOAT64_CLASSES.get(op, {}).get(name) if case["dtype"] == "float64" else None


def _tolerance_class(op: str, case: dict, name: str) -> str:
    """The class of :data:`FLOAT64_CLASSES`, else ``exact`` when every bound of
    ``tol_<name>`` is 0, else ``abs:@tol_<name>``."""
    return float64_class(op, case, name) or ("abs:@tol_" + name if np.any(parse(case["tol_" + name])) else "exact")


def finish_case(op: str, case: dict, stamp: dict) -> dict:
    """The line written for a generator's ``case``: the schema stamp and tcId first, then the
    fields in :data:`.fields.FIELDS` order with each number's ``_hex`` sibling after it (a
    ``tol_`` field only when its class names it), the verdict, the flags (``case['extra_flags']``
    among them), the tolerance class of each expected value and ``why``."""
    dt = case["dtype"]
    classes = {name: _tolerance_class(op, case, name) for name in outputs(op)}
    body: dict = {"op": op, "kind": case["kind"], "dtype": dt}
    for f in FIELDS[op]:
        if f.role == "tol" and not classes[f.name[4:]].startswith("abs:@"):
            continue
        v = case[f.name]
        body[f.name] = v
        if f.type in NUMERIC:
            body[f.name + "_hex"] = None if v is None else _hexes(parse(v, dt if f.role == "in" else "float64"))
    body["verdict"] = case.get("verdict", "valid")
    body["flags"] = flags(op, body, case.get("extra_flags", ()))
    body["tol"] = classes
    body["why"] = case["why"]
    line = {"schema": stamp, "tcId": tcid(op, body), **body}
    assert set(COMMON) <= set(line)
    return line


# ----------------------------------------------------------------------------- reading a line


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a corpus dtype name (bfloat16 comes with ml_dtypes)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ModuleNotFoundError:
            raise ModuleNotFoundError("bfloat16 cases need ml_dtypes: pip install ml_dtypes", name="ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def value(case: dict, name: str, dtype: str = "float64") -> np.ndarray:
    """Field ``name`` of a line as an array of ``dtype``: from ``name_hex`` when present."""
    if name + "_hex" in case:
        h = case[name + "_hex"]
        vals = np.vectorize(float.fromhex, otypes=[np.float64])(np.array(h, dtype=object))
        return np.asarray(vals).astype(np_dtype(dtype))
    return parse(case[name], dtype).astype(np_dtype(dtype))


def tolerance(case: dict, name: str, expected: np.ndarray, dtype: str) -> np.ndarray:
    """The bound on |result - expected| for field ``name``, from its tolerance class (format 2)
    or its ``tol_`` field (format 1)."""
    cls = case["tol"][name] if "tol" in case else f"abs:@tol_{name}"
    kind, _, arg = cls.partition(":")
    if kind == "exact":
        return np.zeros(np.shape(expected), dtype=np.float64)
    if kind == "abs" and arg.startswith("@"):
        return np.broadcast_to(value(case, arg[1:]), np.shape(expected))
    raise ValueError(f"case {case.get('tcId', case.get('id'))}: unknown tolerance class {cls!r} for {name}")
