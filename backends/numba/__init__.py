"""Numba CPU kernels of the ``numba`` backend, one module per kernel family.

``rows``   forward row solvers (max shift, candidate prefilter, Condat / pivot / Newton,
           output pass), one per solver path, and their drivers over blocks of rows;
``grads``  the fused Jacobian-vector products with respect to the scores and to alpha;
``budget``   budget-sparsemax forward (sorted breakpoint walk) and VJP;
``attention``  the fused chunked attention forward and support-only backward;
``decode``   the decoding forward (few queries, long key cache, split over the keys).

Every kernel is a per-row compiled core function plus a ``nogil`` driver
that runs the core over a range of rows; ``_threads.run_blocks`` splits the rows into blocks
and runs the driver on ``numba.get_num_threads()`` Python threads with the GIL released (no
shared writes; a row's answer never depends on its block or thread).  No row kernel uses
``parallel=True``/``prange``: the parallel compile was most of the cold first call, and
without it the row operations need no Numba threading layer at all.  The Python side
picks the driver of the one path a call takes (for example the 1.5-entmax path at
alpha = 1.5), so a first call compiles that path only.

Every compiled function is made by :func:`._jit.jit` (helpers) or :func:`._jit.kernel`
(entry kernels, the functions the Python side calls, with the signatures they are
compiled for declared next to them: :data:`._jit.KERNELS`, what ``entmax-ref compile``
compiles).  Compiled machine code is cached on disk, so a new process loads it instead of
compiling again.  The cache lives in the per-user cache
directory of the platform (``~/.cache/entmax-ref`` on Linux, ``ENTMAX_REF_CACHE_DIR``
overrides it), never inside the installed package, and is keyed on a hash of every kernel
source in this folder (and the package modules they import), so a change to a helper in
any file invalidates it (:mod:`entmax_ref.backends.numba._cache`).  Set the environment
variable ``ENTMAX_REF_NUMBA_CACHE=0`` (before the backend is first imported) to turn the
disk cache off.

Numba compiles a callee for every argument type it meets while it types the caller,
literal values included: a counter that starts as ``k = 0`` and grows in a loop reaches
a call first as ``Literal[int](0)``, then as ``int64``, and the callee is compiled (and
cached) for both though only the second runs.  Counters and indices that reach a call
therefore start as ``np.int64(0)``, and flags as ``np.bool_(False)`` (one
specialization; ``tests/test_numba_compile.py`` checks that no kernel compiles such a
literal twin).
"""

from __future__ import annotations

from ._cache import CACHE, CACHE_DIR

__all__ = ["CACHE", "CACHE_DIR"]
