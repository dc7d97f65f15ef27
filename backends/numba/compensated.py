"""Compensated summation shared by the numba kernels (one copy: the kernel cache is keyed on
every source file of this folder, so a helper may live in its own module)."""

from __future__ import annotations

from numba import njit

from . import CACHE


@njit(inline="always", cache=CACHE)
def acc(s, comp, v):
    """One step of Neumaier's compensated summation: returns the new running sum and the
    new compensation (the true sum is ``s + comp``)."""
    t = s + v
    if abs(s) >= abs(v):
        comp += (s - t) + v
    else:
        comp += (v - t) + s
    return t, comp
