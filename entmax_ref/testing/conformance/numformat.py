"""How the corpus writes numbers: strings that round-trip the value in the case's dtype."""

from __future__ import annotations

import math

import numpy as np

from .sources import in_dtype


def num(value: float, dtype: str = "float64") -> str:
    """The shortest decimal string that round-trips ``value`` in ``dtype`` ("-inf", "inf",
    "nan"): Python's repr for float64, NumPy's for float32 and float16, and the shortest of
    ``%.{k}g`` for bfloat16 (which NumPy lacks)."""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if dtype in ("float32", "float16"):
        return str(np.dtype(dtype).type(v))
    if dtype == "bfloat16":
        for k in range(1, 10):
            s = f"{v:.{k}g}"
            if in_dtype(np.array([float(s)]), "bfloat16")[0] == v:
                return s if any(c in s for c in ".en") else s + ".0"
    return repr(v)


def nums(a, dtype: str = "float64"):
    """A (nested) list of :func:`num` strings for an array."""
    a = np.asarray(a)
    if a.ndim == 0:
        return num(a, dtype)
    return [nums(r, dtype) for r in a] if a.ndim > 1 else [num(v, dtype) for v in a.tolist()]


def parse(strings, dtype: str = "float64") -> np.ndarray:
    """A (nested) list of number strings back to float64 values of ``dtype`` (a float64 array
    holding values of that dtype)."""
    return in_dtype(np.array(strings, dtype=object).astype(np.float64), dtype)


def roundtrips(strings, values: np.ndarray, dtype: str) -> None:
    back = parse(strings, dtype)
    same = (back == values) | (np.isnan(back) & np.isnan(values))
    if not np.all(same):  # pragma: no cover - a formatting bug
        raise AssertionError(f"number strings do not round-trip in {dtype}")
