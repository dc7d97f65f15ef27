"""The numeric constants of the solvers: one source for NumPy, Numba and CUDA.

The NumPy reference and the Numba kernels import these names (Numba reads module globals
as compile-time constants); the CUDA sources receive them as ``-D`` defines
(:func:`cuda_defines`), passed by the cupy loader (``_cuda_loader.OPTIONS``) to NVRTC and
by the tests to nvcc and to the g++ harness of the CUDA core, so no engine types its own
copy.  Each constant says why it has its value.
"""

from __future__ import annotations

#: Iteration cap of the root finders (bisection, safeguarded Newton).  Bisection of a
#: bracket of width log(n) < 64 down to the smallest subnormal spacing (2**-1074) takes
#: at most 1080 halvings; 2200 leaves room for the two-stage alpha > 2 solve.
MAX_ITER = 2200

#: Solver passes over a row the CUDA kernels may make (a pass is one Newton/Halley step
#: or one bisection; the two-stage alpha > 2 solve makes two root finds).
CUDA_MAX_PASSES = 2 * MAX_ITER

#: Newton steps that polish a sort-based threshold on its support (2 are always enough
#: in practice; the loop stops as soon as a step no longer changes the threshold).
POLISH_STEPS = 4

#: Newton steps of the normmax threshold on its identified support (convergence is
#: monotone from the left: fewer than 10 on every test row).
MAX_NEWTON = 200

#: Terms of the series of h(w) = (e^w - 1 - w) / w^2 = sum_k w^k / (k + 2)! used for
#: |w| < 1: the 18th term is below 1/20! < 2**-61, i.e. under half an ulp of h >= 1/e.
SERIES_TERMS = 18

#: Ulps of relative slack on the upper end of the edge-probability bracket of the
#: alpha > 2 solve (q(lo) = (a1 (c - lo) (1 + EDGE_ULPS eps))^(1/a1)), so that rounding
#: cannot put the root outside it.
EDGE_ULPS = 4.0

#: Ulps of float64 epsilon within which a computed mass is a tie with 1 (a sum of powers,
#: each within ~2 ulps, compensated): the numba kernels treat such a mass as exact.
TIE_ULPS = 8.0

#: Relative margin that turns a computed lower (upper) threshold bound into a certain one.
LB_MARGIN = 1e-12

#: Relative margin of the NumPy bisection's candidate test (alpha in (1, 2]): an entry
#: with ``y <= -(1 + CANDIDATE_MARGIN) / (alpha - 1)`` has ``e_alpha(y - A) = 0`` for every
#: ``A >= 0`` and is left out of the sums.  The margin keeps in every entry whose computed
#: bound ``-1/(alpha - 1)`` a rounding could have put on the wrong side; skipping an entry
#: is only an economy, so a generous margin costs nothing.
CANDIDATE_MARGIN = 1e-9

#: The numba softmax's output pass takes ``math.exp`` itself for entries with ``y - A`` at or
#: below this: its vectorised exponential is exact only down to ``vexp.VEXP_NEG_MIN`` (-708),
#: and these 8 units keep every entry it does compute inside that range.
SOFTMAX_EXP_FLOOR = -700.0

#: Relative margin of the numba attention's float32 filter (``attention_filter``): the
#: Newton lower bound of a row's threshold is lowered by this much of its magnitude, and
#: the support window ``1/(alpha - 1)`` widened by it.  Their sums are taken in any order
#: (vectorised), which moves their last bits (about 1e-15 relative); this margin is far
#: outside that, and keeps only a handful more candidate keys.
FILTER_MARGIN = 1e-9

#: Absolute (score units) and relative slack of the filter's cut lines, for the rounding
#: of the float64 arithmetic that forms the lines themselves (a few ulps of scores of
#: order one; the cut only chooses candidates, so any slack is safe).
FILTER_SLACK = 1e-12

#: Relative lowering of the filter's float32 line (below which no float32 ``g`` can give
#: a score above a cut, ``attention_filter.g_cut``): 1e-6 is about 8 float32 ulps, more
#: than the roundings of the division and of the conversion to float32.
G_CUT_MARGIN = 1e-6

#: Absolute lowering of that float32 line: a few times float32's smallest normal
#: (1.2e-38), so that a line near zero is lowered too.
G_CUT_TINY = 1e-37

#: Ulps of float64 epsilon within which a rebuilt entry's distance to the support's edge
#: (alpha > 2) is taken as exactly 0: scores formed by another engine or another
#: summation order may differ from the forward's by an ulp or two of ``|z| + |m|``.
EDGE_TIE_ULPS = 8.0

#: Most threads per block the CUDA adaptor launches (the kernels' ``__launch_bounds__``).
MAX_BLOCK = 512

#: The constants the CUDA sources use, by their macro name.
_CUDA = {
    "ER_MAX_BLOCK": MAX_BLOCK,
    "ER_SERIES_TERMS": SERIES_TERMS,
    "ER_EDGE_ULPS": EDGE_ULPS,
    "ER_EDGE_TIE_ULPS": EDGE_TIE_ULPS,
}


def cuda_defines() -> tuple[str, ...]:
    """``-DNAME=value`` compiler options for the CUDA sources (NVRTC, nvcc and g++)."""
    return tuple(f"-D{name}={value!r}" for name, value in _CUDA.items())
