"""The layout of a corpus line (format 2): the ``schema`` stamp, the stable ``tcId``, the
``flags``, the bit-exact ``NAME_hex`` sibling of every number and the tolerance class of every
expected value; and the notes the manifest carries to explain them.

A generator yields a case with decimal number strings (:mod:`.numformat`); :func:`finish_case`
turns it into the line that is written.  :func:`value` and :func:`tolerance` read a line back
(the hex form when there is one, so that a format 1 corpus, decimal only, still reads).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from .fields import FIELDS, NUMERIC, inputs, numeric, outputs
from .numformat import parse

#: the format's major version: a new major is a breaking change for readers
FORMAT_MAJOR = 2
#: the formats this library reads (1: decimal numbers only, no schema, ids, flags or tolerance classes)
READABLE = (1, 2)

NUMBERS_RULE = (
    "Every number is written twice: NAME as the shortest decimal string that round-trips the value in its "
    "dtype, and NAME_hex as a C99 hexadecimal floating constant (printf's %a form: '0x1.8p-1', '-0x0p+0', "
    "'0x0.0000000000001p-1022' for a subnormal) or 'inf', '-inf', 'nan'. Readers use NAME_hex: strtod (C), "
    "float.fromhex (Python) or the mantissa-times-power-of-two rule (JavaScript) give the value exactly. The "
    "fields listed in a file's 'inputs_in_dtype' hold values of the case's dtype (a float32 value is exact in "
    "its hex form, so parsing it as float64 and rounding to float32 changes nothing); every other number is a "
    "float64 value. The decimal NAME of a float32 input is float32's shortest string: parse it with strtof, "
    "not strtod.")

TOLERANCE_CLASSES = {
    "exact": "the result, converted to float64, equals the expected value (0 and -0 are equal)",
    "ulps:K": "|result - expected| <= K * ulp(expected), the ulp taken in the case's dtype at |expected| "
              "(the gap from |expected| to the next larger value of that dtype)",
    "abs:E": "|result - expected| <= E (a number, the same for every entry)",
    "abs:@FIELD": "|result[i] - expected[i]| <= FIELD[i] (FIELD a list, one bound per entry) or <= FIELD "
                  "(a number, for every entry): the error budget of a correct implementation in the case's dtype",
    "non-finite": "in every class an expected -inf, inf or nan must be matched exactly (nan by nan)",
}

TOLERANCE_REASONS = (
    "The abs:@tol_* bounds are the library's tolerance model (docs/validate.md) for an implementation working "
    "in the case's dtype with float64 accumulation where it matters: per entry for p, out and the attention "
    "gradients (an entry near the threshold carries the threshold's error), per row for a VJP, per value for "
    "tau, the loss and the ASEntmax scale. A field whose every bound is 0 (masked entries, all-masked rows, "
    "ds/ddelta = 1, the support size) is 'exact'.")

#: flag -> what a case with it exercises (the manifest's notes)
FLAGS = {
    "ties": "two or more equal finite scores",
    "near-ties": "the largest scores one ulp or 1e-12 apart, or all equal but one",
    "masked": "some scores are -inf (masked: their p is exactly 0)",
    "all-masked": "every score is -inf: p = 0, tau = -inf, support 0, zero gradients",
    "huge-offset": "scores of magnitude >= 1e4 (coarse spacing, cancellation in x - tau)",
    "support-boundary": "scores exactly at the threshold (or a breakpoint) and one ulp either side",
    "found-by-hypothesis": "a frozen failure found by the property tests",
    "alpha-near-1": "1 < alpha <= 1.01 (the limit towards softmax)",
    "alpha-above-2": "alpha > 2 (p = t^(1/(alpha-1)) flattens near the support's edge)",
    "ill-posed": "the gradient is discontinuous at x (an entry at the threshold): compare implementations "
                 "that take p",
    "tiny": "n <= 2",
    "long-row": "n >= 1024 (summation error grows with n)",
    "budget-zero": "budget 0 (p = 0)",
    "budget-above-support": "a budget at or above the number of unmasked scores (those are 1)",
    "causal": "causal mask, bottom-right aligned",
    "grouped-query": "grouped-query heads (Hq > Hkv)",
    "cross": "cross attention (Nq != Nk)",
    "key-padding": "keys masked by key_lengths or key_padding_mask",
    "empty-query-rows": "some query rows see no key (zero output and gradients)",
    "alibi": "ALiBi biases",
    "asentmax": "ASEntmax per-row scale (beta, gamma)",
}

_KIND_FLAGS = {"near-ties": "near-ties", "support-boundary": "support-boundary",
               "found-by-hypothesis": "found-by-hypothesis"}


def hexnum(value: float) -> str:
    """The C99 hex-float string of a float (trailing zero hex digits dropped: printf's %a)."""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    h = v.hex()  # [-]0x1.8000000000000p-1
    mant, exp = h.split("p")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}"


def _hexes(a):
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return hexnum(a)
    return [_hexes(r) for r in a] if a.ndim > 1 else [hexnum(v) for v in a.tolist()]


def _row_flags(op: str, case: dict) -> list[str]:
    flags = []
    dt = case["dtype"]
    x = parse(case["x"], dt).astype(np.float64)
    fin = x[np.isfinite(x)]
    if fin.size != np.unique(fin).size:
        flags.append("ties")
    if fin.size < x.size:
        flags.append("masked" if fin.size else "all-masked")
    if fin.size and np.abs(fin).max() >= 1e4:
        flags.append("huge-offset")
    if "alpha" in case:
        a = float(case["alpha"])
        flags += ["alpha-near-1"] if 1.0 < a <= 1.01 else ["alpha-above-2"] if a > 2.0 else []
    if "budget" in case:
        b = float(case["budget"])
        flags += ["budget-zero"] if b == 0.0 else ["budget-above-support"] if b >= fin.size else []
    if case.get("ill_posed"):
        flags.append("ill-posed")
    flags += ["tiny"] if x.size <= 2 else ["long-row"] if x.size >= 1024 else []
    return flags


def _attention_flags(case: dict) -> list[str]:
    s = case["shape"]
    flags = ["causal"] if case["causal"] else []
    flags += ["grouped-query"] if s["Hq"] > s["Hkv"] else []
    flags += ["cross"] if s["Nq"] != s["Nk"] else []
    if case["key_lengths"] is not None or case["key_padding_mask"] is not None:
        flags.append("key-padding")
    lengths = case["key_lengths"] or []
    masks = case["key_padding_mask"] or []
    if 0 in lengths or any(not any(m) for m in masks) or (case["causal"] and s["Nq"] > s["Nk"]):
        flags.append("empty-query-rows")
    flags += ["alibi"] if case["alibi_slopes"] is not None else []
    flags += ["asentmax"] if case["beta"] is not None else []
    return flags


def flags(op: str, case: dict) -> list[str]:
    """The flags of a case (names of :data:`FLAGS`), in :data:`FLAGS`' order."""
    if op.startswith("attention"):
        got = set(_attention_flags(case))
    elif op == "asentmax_scale":
        got = set()
    else:
        got = set(_row_flags(op, case))
    if case["kind"] in _KIND_FLAGS:
        got.add(_KIND_FLAGS[case["kind"]])
    return [f for f in FLAGS if f in got]


def tcid(op: str, case: dict) -> str:
    """``<op>-<12 hex digits>``: a digest of the case's inputs (in their hex form), so that the
    same inputs get the same id in every regeneration of this format major."""
    key = {name: case.get(name + "_hex", case.get(name)) for name in inputs(op)}
    digest = hashlib.sha256(json.dumps([op, key], sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{op}-{digest[:12]}"


def _tolerance_class(case: dict, name: str) -> str:
    tol = case["tol_" + name] if "tol_" + name in case else None
    if name == "support" or tol is None:
        return "exact"
    vals = parse(tol)
    return "exact" if not np.any(vals) else f"abs:@tol_{name}"


def finish_case(op: str, case: dict, stamp: dict) -> dict:
    """The line written for a generator's ``case``: the schema stamp and tcId first, then the
    fields in :data:`FIELDS` order with each number's ``_hex`` sibling after it, the flags, the
    tolerance class of each expected value and ``why``."""
    dt = case["dtype"]
    body: dict = {"op": op, "kind": case["kind"], "dtype": dt}
    for f in FIELDS[op]:
        v = case[f.name]
        body[f.name] = v
        if f.type in NUMERIC:
            body[f.name + "_hex"] = None if v is None else _hexes(parse(v, dt if f.role == "in" else "float64"))
    body["flags"] = flags(op, body)
    body["tol"] = {name: _tolerance_class(case, name) for name in outputs(op)}
    body["why"] = case["why"]
    return {"schema": stamp, "tcId": tcid(op, body), **body}


def inputs_in_dtype(op: str) -> list[str]:
    """The fields of ``op`` whose values are of the case's dtype (the others are float64)."""
    return [f.name for f in numeric(op) if f.role == "in"]


# ----------------------------------------------------------------------------- reading a line


def value(case: dict, name: str, dtype: str = "float64") -> np.ndarray:
    """Field ``name`` of a line as an array of ``dtype``: from ``name_hex`` when present."""
    if name + "_hex" in case:
        h = case[name + "_hex"]
        vals = np.vectorize(float.fromhex, otypes=[np.float64])(np.array(h, dtype=object))
        return np.asarray(vals, np.dtype(dtype))
    return parse(case[name], dtype)


def ulp(expected: np.ndarray, dtype: str) -> np.ndarray:
    """The gap from |expected| to the next larger value of ``dtype`` (as float64)."""
    e = np.abs(np.asarray(expected, np.float64)).astype(dtype)
    with np.errstate(over="ignore"):
        return (np.nextafter(e, np.asarray(np.inf, dtype)) - e).astype(np.float64)


def tolerance(case: dict, name: str, expected: np.ndarray, dtype: str) -> np.ndarray:
    """The bound on |result - expected| for field ``name``, from its tolerance class (format 2)
    or its ``tol_`` field (format 1)."""
    cls = case["tol"][name] if "tol" in case else f"abs:@tol_{name}"
    kind, _, arg = cls.partition(":")
    if kind == "exact":
        return np.zeros_like(expected, dtype=np.float64)
    if kind == "ulps":
        return int(arg) * ulp(expected, dtype)
    if kind == "abs" and arg.startswith("@"):
        return np.broadcast_to(value(case, arg[1:]), np.shape(expected))
    if kind == "abs":
        return np.full(np.shape(expected), float.fromhex(arg) if arg.startswith(("0x", "-0x")) else float(arg))
    raise ValueError(f"case {case.get('tcId', case.get('id'))}: unknown tolerance class {cls!r} for {name}")
