"""The candidate passes of the numba row solvers: the row maximum, and the entries that
can be in the support (a superset gathered in one pass, then the output pass's own test).
Units as in :mod:`.rows`."""

from __future__ import annotations

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from ..constants import LB_MARGIN
from ._jit import jit
from .elementwise import is_alive


@jit(forceinline=True)
def max_lanes(x, M, M2):
    """The two alternating lane arrays of :func:`lane_max` for row ``x``: the float64
    scratch ``M``, ``M2`` viewed as x's dtype (``L = M.shape[0]`` lanes each), the first
    set to -inf.  Returns (A, B)."""
    L = M.shape[0]
    A = M.view(x.dtype)[:L]
    B = M2.view(x.dtype)[:L]
    for j in range(L):
        A[j] = -np.inf
    return A, B


@jit(forceinline=True)
def max_block(A, B, b):
    """The lanes block ``b`` of :func:`lane_max` reads and writes: (A, B) for even ``b``,
    (B, A) for odd; after ``nb`` blocks the maxima are in ``max_block(A, B, nb)[0]``."""
    return (A, B) if b % 2 == 0 else (B, A)


@jit(forceinline=True)
def max_into(src, dst, j, v):
    """One step of :func:`lane_max`: ``dst[j]`` = the larger of ``src[j]`` and ``v`` (a NaN
    ``v`` keeps ``src[j]``).  Returns 1 for a NaN or +inf ``v``, else 0."""
    w = src[j]
    dst[j] = v if v > w else w
    return not (v < np.inf)


@jit(forceinline=True)
def max_end(x, A, B, nb):
    """The end of :func:`lane_max` after ``nb`` blocks of ``L`` entries: the largest lane
    (:func:`max_block`) and the tail ``x[nb * L:]``.  Returns (m, nonfinite entries of the
    tail)."""
    L = A.shape[0]
    last = max_block(A, B, nb)[0]
    m = -np.inf
    for j in range(L):
        if np.float64(last[j]) > m:
            m = np.float64(last[j])
    bad = 0
    for i in range(nb * L, x.shape[0]):
        v = np.float64(x[i])
        if v > m:
            m = v
        bad += not (v < np.inf)
    return m, bad


@jit
def lane_max(x, M, M2):
    """The row maximum (NaN entries ignored; ``-inf`` for an empty or all ``-inf`` row) and
    the number of NaN or +inf entries (the row solvers' finiteness check, in the same pass),
    in a loop that LLVM vectorises: ``L = M.shape[0]`` lane maxima over consecutive blocks
    of ``L`` entries, then the lanes and the tail.  A maximum is exact in any order, and
    in x's precision (a float32 row is not converted: twice the lanes a vector; the
    float64 scratch ``M``, ``M2`` holds them as x's dtype); the
    lanes alternate between ``M`` and ``M2`` so that each store is unconditional (a store
    kept only where the entry is larger becomes a masked store, microcoded and slow on
    AMD).  The steps are :func:`max_lanes`, :func:`max_block`, :func:`max_into` and
    :func:`max_end` (the solvers' :func:`max_zeroing` runs them too).  Returns (m, nonfinite)."""
    A, B = max_lanes(x, M, M2)
    L = A.shape[0]
    bad = 0
    nb = x.shape[0] // L
    for b in range(nb):
        # the block read at unsigned indices (no wraparound test, which would stop LLVM
        # vectorising the loop) rather than sliced, and the lanes' roles taken by a branch
        # rather than a tuple of arrays: a slice or a picked array is a reference count,
        # an NRT call, a block
        o = b * L
        if b % 2 == 0:
            for j in range(L):
                bad += max_into(A, B, j, x[np.uint64(o + j)])
        else:
            for j in range(L):
                bad += max_into(B, A, j, x[np.uint64(o + j)])
    m, tail = max_end(x, A, B, nb)
    return m, bad + tail


@jit
def _max_gather(x, W, c):
    """One pass over the row: its maximum m, in ``c[:k]`` (as float64 x values) a superset
    of the entries with ``x > m - W``, and the number of NaN or +inf entries.  An entry is
    kept when it exceeds the running maximum minus W (widened by a relative margin that
    covers rounding); the running maximum only grows, so no entry within W of the final
    maximum is missed, and for rows in random order only a few more are kept.  Returns
    (m, k, nonfinite)."""
    m = -np.inf
    thr = -np.inf
    k = 0
    bad = 0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        bad += not (v < np.inf)
        if v > thr:
            c[k] = v
            k += 1
            if v > m:
                m = v
                thr = (m - W) - LB_MARGIN * (abs(m) + W)
    return m, k, bad


@jit
def _refilter(c, k, m, a1, kind, lo):
    """Turn the x values in ``c[:k]`` into ``y = x - m`` and keep the candidates: the
    entries that can be in the support for some ``A >= lo`` (the output pass's own test)."""
    j = 0
    for i in range(k):
        y = c[i] - m
        if is_alive(y - lo, a1, kind):
            c[j] = y
            j += 1
    return j


@jit
def window_candidates(x, a1, kind, c):
    """The row maximum m (``-inf`` for an all ``-inf`` row, or n = 0) and in ``c[:k]`` the
    candidates: the ``y = x - m`` alive at A = 0 (the output pass's own test) among the
    entries within the support window ``1/a1`` of m (every entry at a1 = 0), by
    :func:`_max_gather` and :func:`_refilter`, and the number of NaN or +inf entries
    (the solver then leaves the row: :func:`.elementwise.settled_row`).  Returns (m, k,
    nonfinite)."""
    m, k, bad = _max_gather(x, 1.0 / a1 if a1 > 0.0 else np.inf, c)
    if bad:
        return m, 0, bad
    return m, _refilter(c, k, m, a1, kind, 0.0), bad  # k = 0 when m = -inf: nothing to filter


@jit
def _compact(c, k, a1, kind, lo, dst):
    """Copy the candidates of ``c[:k]`` (y values) alive at ``lo`` into ``dst`` (no solver
    calls it: it is the tests' window-then-filter reference for the one-pass gathers)."""
    j = 0
    for i in range(k):
        if is_alive(c[i] - lo, a1, kind):
            dst[j] = c[i]
            j += 1
    return j


@jit
def count_finite(x):
    nf = 0
    for i in range(x.shape[0]):
        nf += np.float64(x[i]) > -np.inf
    return nf


@jit
def max_zeroing(x, out, aux, aux2):
    """The row maximum and its count of NaN or +inf entries (the steps of :func:`lane_max`),
    with the output row zero-filled in the same loop, and the lanes in the first entries of
    two float64 scratch rows of the row's length (free before the candidates are
    gathered).  The row's first read from memory and its output's write-allocate traffic
    then run as one loop's two streams, not one after the other; the solvers' output passes
    write the candidates alone (:func:`.elementwise.write_output_at`,
    :func:`.gen._output_gen`).  Returns (m, nonfinite)."""
    n = x.shape[0]
    L = min(64, aux.shape[0])
    if L == 0:
        return -np.inf, 0
    A, B = max_lanes(x, aux[:L], aux2[:L])
    bad = 0
    nb = n // L
    for b in range(nb):  # unsigned indices, the lanes by a branch: as lane_max
        o = b * L
        if b % 2 == 0:
            for j in range(L):
                out[np.uint64(o + j)] = 0.0
                bad += max_into(A, B, j, x[np.uint64(o + j)])
        else:
            for j in range(L):
                out[np.uint64(o + j)] = 0.0
                bad += max_into(B, A, j, x[np.uint64(o + j)])
    for i in range(nb * L, n):
        out[i] = 0.0
    m, tail = max_end(x, A, B, nb)
    return m, bad + tail


@jit
def _row_max(x):
    """The row maximum (:func:`lane_max` with its own 8 lanes), for callers without scratch
    (the tests; the solvers use :func:`max_zeroing` or their own lanes)."""
    return lane_max(x, np.empty(8, np.float64), np.empty(8, np.float64))[0]


#: rows of at least this many entries are gathered through a bit mask (:func:`_mask_alive`);
#: below it the mask's scratch costs more than it saves
MASK_MIN = 256


#: nextafter steps :func:`_first_alive` takes from its start before it gives up
_LINE_STEPS = 8


@jit
def _first_alive(x, m, a1, kind, lo):
    """The smallest value ``v`` of x's dtype alive at ``lo`` (the test of :func:`is_alive` on
    ``y = float64(v) - m``), and whether it was found.  The test is nondecreasing in the
    entry (every rounding in it is monotone), so ``x_i >= v`` is the test itself, and it
    compares in x's precision: for float32 rows twice the lanes of the float64 test, and no
    conversion.  The search starts at ``m + lo - 1/a1`` rounded to x's dtype, within a few
    ulps of the edge, and steps by ulps; it gives up after :data:`_LINE_STEPS` steps either
    way (the float64 rounding of the test spans many ulps of the entry when the edge lies
    far closer to 0 than ``m`` or ``lo``: tiny ``a1`` with a large maximum)."""
    ty = x.dtype.type
    up = ty(np.inf)
    down = ty(-np.inf)
    v = ty((m + lo) - 1.0 / a1)
    found = False
    for _ in range(_LINE_STEPS):
        if is_alive((np.float64(v) - m) - lo, a1, kind):
            found = True
            break
        v = np.nextafter(v, up)
    if not found:
        return v, False
    for _ in range(_LINE_STEPS):
        w = np.nextafter(v, down)
        if not is_alive((np.float64(w) - m) - lo, a1, kind):
            return v, True
        v = w
    return v, False


@jit
def _mask_alive(x, m, a1, kind, lo, words):
    """Bit ``t`` of ``words[w]`` is whether entry ``64 w + t`` is alive at ``lo`` (the test of
    :func:`gather_alive`), for ``w < words.shape[0]``.  The tests of a word are a loop with
    no store but the word's, which LLVM vectorises (a compare and a bit pack per 8 or 16
    entries), where storing every entry costs a store and a dependent index a cycle each.
    The test is a comparison with the row's edge value in x's precision
    (:func:`_first_alive`), or, where that search gives up, the float64 test itself."""
    v, found = _first_alive(x, m, a1, kind, lo)
    for w in range(words.shape[0]):
        o = 64 * w  # unsigned indices, not a slice a word: as lane_max
        b = np.uint64(0)
        if found:
            for t in range(64):
                b |= np.uint64(x[np.uint64(o + t)] >= v) << np.uint64(t)
        else:
            for t in range(64):
                y = np.float64(x[np.uint64(o + t)]) - m
                b |= np.uint64(is_alive(y - lo, a1, kind)) << np.uint64(t)
        words[w] = b


@jit
def unpack(x, m, words, dst, idx):
    """The entries whose bits are set in ``words``, in row order: ``dst[k] = x - m`` (and
    ``idx[k]`` their columns when ``idx`` is not empty), one step per set bit (a few percent
    of a normal row).  Returns the count."""
    cols = idx.shape[0] > 0
    k = 0
    for w in range(words.shape[0]):
        b = words[w]
        while b != np.uint64(0):
            i = 64 * w + trailing_zeros(b)
            dst[k] = np.float64(x[i]) - m
            if cols:
                idx[k] = i
            k += 1
            b &= b - np.uint64(1)
    return k


@jit
def set_bits(words, idx):
    """The positions ``64 w + t`` of the set bits of ``words`` into ``idx``, ascending (the
    attention filter's keys); returns their count."""
    k = 0
    for w in range(words.shape[0]):
        b = words[w]
        while b != np.uint64(0):
            idx[k] = 64 * w + trailing_zeros(b)
            k += 1
            b &= b - np.uint64(1)
    return k


@jit
def gather_alive(x, m, a1, kind, lo, dst, idx):
    """Gather into ``dst``, in row order, the ``y = x - m`` alive at ``lo`` (the test of
    :func:`is_alive`), and into ``idx`` their columns unless ``idx`` is empty, for a row whose
    maximum m is known.  Long rows (``MASK_MIN`` entries or more) build a bit mask of the
    test first (:func:`_mask_alive`), a loop with no branch that LLVM vectorises, and then
    visit only the set bits (:func:`unpack`).  The rest of the row (and
    every short one) is a loop with no branch on the data: every entry is stored at
    ``dst[k]`` and ``k`` advances by the test's outcome, so the next entry overwrites a
    dead one (``k <= i`` at every store, so ``dst`` of the row's length suffices).  With a
    few percent of the row alive, a branch on the test would be mispredicted at nearly
    every hit.  The solvers call it for their candidates, with their columns, and for the
    entries of a window near the maximum from which a lower bound is taken (sparsemax's
    test at ``lo = 1 - W`` keeps ``y > -W``; for 1 < alpha < 2 the window lies inside
    ``a1 y > -1``, rounding being monotone).  Returns the count."""
    n = x.shape[0]
    cols = idx.shape[0] > 0
    k = 0
    i0 = 0
    if n >= MASK_MIN:
        words = np.empty(n // 64, np.uint64)
        _mask_alive(x, m, a1, kind, lo, words)
        k = unpack(x, m, words, dst, idx)
        i0 = 64 * words.shape[0]
    for i in range(i0, n):
        y = np.float64(x[i]) - m
        dst[k] = y
        if cols:
            idx[k] = i
        k += is_alive(y - lo, a1, kind)
    return k
