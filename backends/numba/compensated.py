"""Compensated summation shared by the numba kernels (one copy: the kernel cache is keyed on
every source file of this folder, so a helper may live in its own module)."""

from __future__ import annotations


from ._jit import jit


@jit(forceinline=True)
def acc(s, comp, v):
    """One step of Neumaier's compensated summation: returns the new running sum and the
    new compensation (the true sum is ``s + comp``)."""
    t = s + v
    if abs(s) >= abs(v):
        comp += (s - t) + v
    else:
        comp += (v - t) + s
    return t, comp


@jit(forceinline=True)
def two_sum(s, v):
    """Knuth's branch-free TwoSum: ``s + v = t + err`` exactly; returns ``(t, err)``.  No
    branch, so a loop of independent lanes (one per position of a block) vectorises."""
    t = s + v
    bv = t - s
    return t, (s - (t - bv)) + (v - bv)


@jit(forceinline=True)
def merge_lanes(S, C, L):
    """The first ``L`` TwoSum lanes (sums ``S``, error terms ``C``) merged into one running
    sum and compensation with Neumaier's step."""
    s = 0.0
    comp = 0.0
    for j in range(L):
        s, comp = acc(s, comp, S[j])
        comp += C[j]
    return s, comp
