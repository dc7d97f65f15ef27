"""How the corpus writes numbers: strings that round-trip the value in the case's dtype."""

from __future__ import annotations

import math

import numpy as np


def num(value: float, dtype: str = "float64") -> str:
    """The shortest decimal string that round-trips ``value`` in ``dtype`` ("-inf", "inf", "nan")."""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if dtype == "float32":
        return str(np.float32(v))
    return repr(v)


def nums(a, dtype: str = "float64"):
    """A (nested) list of :func:`num` strings for an array."""
    a = np.asarray(a)
    if a.ndim == 0:
        return num(a, dtype)
    return [nums(r, dtype) for r in a] if a.ndim > 1 else [num(v, dtype) for v in a.tolist()]


def parse(strings, dtype: str = "float64") -> np.ndarray:
    """A (nested) list of number strings back to an array of ``dtype``."""
    return np.asarray(np.array(strings, dtype=object).astype(np.float64), dtype=np.dtype(dtype))


def roundtrips(strings, values: np.ndarray, dtype: str) -> None:
    back = parse(strings, dtype)
    same = (back == values) | (np.isnan(back) & np.isnan(values))
    if not np.all(same):  # pragma: no cover - a formatting bug
        raise AssertionError(f"number strings do not round-trip in {dtype}")

