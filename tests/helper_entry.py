"""A Python entry to a compiled helper of the numba engine, for the tests that call one
directly: a helper has none of its own (``entmax_ref.backends.numba._jit.Helper``)."""

from __future__ import annotations

import functools


@functools.cache
def entry(helper):
    """A function that Python calls with ``helper``'s arguments and that returns its result
    (compiled per signature, like the helper)."""
    from entmax_ref.backends.numba._jit import jit

    @jit(no_cpython_wrapper=False)
    def call(*args):
        return helper(*args)

    return call
