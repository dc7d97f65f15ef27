"""The engines behind :mod:`entmax_ref.torch` and :mod:`entmax_ref.jax`: each public function
of the library as a differentiable operation of a framework, whose backward is the library's
own VJP.

The framework is imported by these modules only: ``import entmax_ref`` imports neither torch
nor JAX.
"""

from __future__ import annotations

from typing import Any

from .._validate import finite_real


def number(value: Any, name: str) -> float:
    """A scalar parameter of an adapter (alpha, budget, offset) as a float, refused as the
    library refuses it: a bool, a string, NaN or an array is a TypeError or ValueError, not
    1.0 or 1.5."""
    a = finite_real(value, name)
    if a.ndim:
        raise ValueError(f"{name} must be a number, got an array of shape {a.shape}")
    return float(a)
