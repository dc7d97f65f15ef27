"""Numba CPU kernels of the ``numba`` backend, one module per kernel family.

``rows``   forward row solvers (max shift, candidate prefilter, Condat / pivot / Newton,
           output pass) and their ``prange`` drivers over rows;
``grads``  the fused Jacobian-vector products with respect to the scores and to alpha;
``normmax``  alpha-normmax forward (sorted support search, monotone Newton) and VJP;
``budget``   budget-sparsemax forward (sorted breakpoint walk) and VJP.

Every kernel is a per-row ``@njit`` core function plus an ``@njit(parallel=True)`` driver
that runs the core over blocks of rows with ``prange`` (no shared writes, no exceptions
inside the parallel loop).

Compiled machine code is cached on disk (numba's ``cache=True``: ``__pycache__`` next to
these files, or ``NUMBA_CACHE_DIR`` when that is set or the folder is read-only), so a new
process loads it instead of compiling again.  Set the environment variable
``ENTMAX_REF_NUMBA_CACHE=0`` (before the backend is first imported) to turn the disk cache
off, e.g. when several numba versions share one installation.
"""

from __future__ import annotations

import os

#: Whether the kernels are cached on disk (``ENTMAX_REF_NUMBA_CACHE=0`` turns it off).
CACHE: bool = os.environ.get("ENTMAX_REF_NUMBA_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")

__all__ = ["CACHE"]
