"""The backend contract: a small, kernel-level interface over canonical 2-D arrays.

Every public function in :mod:`entmax_ref` validates its inputs, moves the reduction axis
last, reshapes to a C-contiguous ``(rows, n)`` array of float32 or float64, and then calls
exactly one method of a backend.  A backend therefore never sees axes, broadcasting, masks
given as anything but ``-inf`` or exotic dtypes.

Units.  Backends work with the *x-space threshold* ``theta`` of a row: with
``e_alpha(y) = [1 + (alpha - 1) y]_+ ** (1 / (alpha - 1))`` (``exp(y)`` at ``alpha = 1``),

    p_i = e_alpha(x_i - theta),      sum_i p_i = 1.

``theta`` is finite for any row with a finite entry, is ``-inf`` for an all ``-inf`` row,
and is well conditioned for every ``alpha >= 1`` (at ``alpha = 1`` it is ``logsumexp(x)``).
The public layer converts it once to the ``tau`` of ``design.md``:
``tau = (alpha - 1) * theta - 1`` for ``alpha > 1`` and ``tau = theta`` at ``alpha = 1``.
The support of a row is ``{i : 1 + (alpha - 1)(x_i - theta) > 0}`` (``x_i > -inf`` at 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

class RowSolve(NamedTuple):
    """What a row transform returns.  All per-row fields have shape ``(rows,)``."""

    p: Any  #: (rows, n), same dtype as the input
    theta: Any  #: (rows,) float64 x-space threshold (see module docstring)
    support: Any  #: (rows,) int64 number of nonzeros
    n_iter: Any  #: (rows,) int64 iterations the solver took (0 for closed forms)
    converged: Any  #: (rows,) bool


class ExactRowSolve(RowSolve):
    """A :class:`RowSolve` of correctly rounded float64 rows (the CPU engines'), with their
    correctly rounded public threshold ``tau`` ((rows,) float64, module docstring), which
    the public layer returns instead of converting ``theta``.  It unpacks as a RowSolve."""

    def __new__(cls, p, theta, support, n_iter, converged, tau):
        self = super().__new__(cls, p, theta, support, n_iter, converged)
        self.tau = tau
        return self


@dataclass(frozen=True)
class AttentionSpec:
    """Everything but q, k, v that defines an attention problem (already validated).

    Scores are ``z_ij = s_i * scale * (q_i . k_j) + bias_ij`` with ``bias_ij`` ALiBi
    (``-slope_h * (i_abs - j)`` when causal, ``-slope_h * |i_abs - j|`` otherwise, where
    ``i_abs = i + Nk - Nq``), ``s_i = row_scale[b, h, i]`` (1 when ``row_scale`` is None),
    and keys ``j > i_abs`` (causal), ``j >= key_lengths[b]`` or ``key_mask[b, j] = False``
    masked out.  Query head ``h`` uses ``head_alpha[h]`` when given, else ``alpha``; with
    ``alpha_grad`` the backward also returns dL/dalpha of every row.  A backend that
    cannot honour ``head_alpha``, ``key_mask`` or ``alpha_grad`` raises a ValueError
    saying so (never silently ignores them).

    ``check_finite`` is the public ``check_finite`` of the call.  On (the default), a
    backend may scan k and v for NaN/inf in its own forward pass (see
    :class:`NonFiniteInput`); off, the caller promised clean q, k, v and no backend scans
    them: a backend then need not read v off the support.  Either way a non-finite score
    (q.k with a NaN/inf entry) is still the overflow ValueError, as for finite q, k whose
    scores overflow.
    """

    alpha: float
    scale: float
    causal: bool = False
    key_lengths: Any = None  #: (B,) int64 numpy array or None
    alibi_slopes: Any = None  #: (Hq,) float64 numpy array or None
    row_scale: Any = None  #: (B, Hq, Nq) float64 array (backend's array type) or None
    chunk: int | None = None  #: query rows per chunk; None = the backend chooses
    head_alpha: Any = None  #: (Hq,) float64 numpy array (values >= 1) or None: alpha per query head
    key_mask: Any = None  #: (B, Nk) bool numpy array or None: True where a key may be attended
    alpha_grad: bool = False  #: the backward also computes dL/dalpha per row (AttentionGrads.dalpha)
    check_finite: bool = True  #: False: no NaN/inf scan of q, k, v anywhere (the caller's promise)
    #: False: no backward follows this forward (``er.attention`` without ``return_info``):
    #: a backend may then form neither the skewed output nor the support keys, and return
    #: ``AttentionForward.skew`` and ``support_keys`` as None
    residual: bool = True


class NonFiniteInput(ValueError):
    """Raised by a backend's ``attention_forward`` that scans k and v itself (it has an
    ``attention_scans_inputs(q, k, v, spec)`` method that returned True for the call, so
    the public layer skipped its own scan of them; the public layer asks only when
    ``spec.check_finite`` is on, and the method must return False when it is off) when
    it finds a NaN or infinite entry,
    and by a backend's ``entmax_forward_scanned(x, alpha, method)`` (``entmax_forward``
    that scans x for NaN and +inf in its own row pass; the public layer calls it instead
    when it has one and ``check_finite`` is on); the public layer then scans the input to
    raise its usual error naming the entry."""


class AttentionForward(NamedTuple):
    """What an attention forward returns.  ``theta``, ``row_max``, ``edge`` and ``edge_p``
    are the backward's residual (see :class:`AttentionResidual`)."""

    out: Any  #: (B, Hq, Nq, Dv), dtype of q
    theta: Any  #: (B, Hq, Nq) float64, x-space threshold of each score row (-inf if empty)
    support: Any  #: (B, Hq, Nq) int64
    skew: Any  #: (B, Hq, Nq, Dv) float64 skewed output sum_j u_ij v_j / sum_j u_ij, u = p^(2-alpha); may be None when spec.residual is off
    row_max: Any = None  #: (B, Hq, Nq) float64 largest score m of each row (-inf if empty)
    edge: Any = None  #: (B, Hq, Nq) float64 c = min over the support of (z_j - m) (-inf if empty)
    edge_p: Any = None  #: (B, Hq, Nq) float64 q, the probability of that entry (0 if empty)
    support_keys: Any = None  #: (B, Hq, Nq, cap) int32 or None: see :class:`AttentionResidual`


class AttentionResidual(NamedTuple):
    """Per score row, what the backward needs to rebuild the forward's probabilities exactly
    (each (B, Hq, Nq) float64; an :class:`AttentionForward` has the same fields).

    alpha <= 2: ``p_j = e_alpha(z_j - theta)`` (dp/dtheta = -p^(2-alpha) is bounded, so
    theta's last-bit rounding moves p by about one rounding).  alpha > 2: dp/dtheta is
    unbounded at the support's edge, and theta cannot resolve the edge entry's probability
    (its gap ``q^(alpha-1) / (alpha-1)`` to theta is below theta's ulp, or below the float64
    range), so the rows are rebuilt as the row solvers write them, relative to the row's
    smallest support entry: with ``d_j = (z_j - row_max) - edge`` (the solvers' own
    operations), ``p_j = (a1 d_j + edge_p^a1)^(1/a1)`` for ``d_j > 0`` (in log space),
    ``edge_p`` at ``d_j = 0`` and 0 below.  Empty rows: theta = row_max = edge = -inf,
    edge_p = 0.  ``row_max``, ``edge`` and ``edge_p`` may be None for alpha <= 2."""

    theta: Any
    row_max: Any = None
    edge: Any = None
    edge_p: Any = None
    #: Optional, a backend's own, (B, Hq, Nq, cap) int32: each row's support as key indices
    #: (ascending, then -1; -2, -1, ... where it has more than ``cap`` keys), so that the
    #: backward need not find the support again.  A backend's backward may use the keys its
    #: own forward wrote and ignores them otherwise; None: no keys kept.
    support_keys: Any = None


class AttentionGrads(NamedTuple):
    dq: Any
    dk: Any
    dv: Any
    drow_scale: Any  #: (B, Hq, Nq) float64 dL/ds_i, or None when spec.row_scale is None
    dalpha: Any = None  #: (B, Hq, Nq) float64 dL/dalpha of each row, or None unless spec.alpha_grad


@runtime_checkable
class Backend(Protocol):
    """What every backend implements.  Inputs are C-contiguous float32/float64 arrays of
    the backend's own array type; ``alpha`` for row ops is a float64 array of shape
    ``(rows,)`` with every entry finite and >= 1.  Backends never modify their inputs.
    """

    name: str

    def owns(self, x: Any) -> bool:
        """True when ``x`` is an array this backend computes on (no transfers)."""

    def entmax_forward(self, x: Any, alpha: Any, method: str | None) -> RowSolve:
        """Row-wise alpha-entmax of ``x`` (rows, n); ``-inf`` entries are masked."""

    def entmax_vjp(self, p: Any, g: Any, alpha: Any) -> Any:
        """dL/dx = u * (g - (u . g) / sum u) with u = p^(2-alpha) on the support."""

    def entmax_alpha_vjp(self, p: Any, g: Any, alpha: Any) -> Any:
        """dL/dalpha per row, shape (rows,) float64; continuous through alpha -> 1."""

    def normmax_forward(self, x: Any, alpha: Any) -> RowSolve:
        """Row-wise alpha-normmax (alpha > 1): ``p_i`` proportional to ``[x_i - tau]_+^(1/(alpha-1))``
        with ``||[x - tau]_+||_(alpha/(alpha-1)) = 1``.  ``theta`` holds that x-space ``tau``
        (-inf on all -inf rows); ``-inf`` entries are masked."""

    def normmax_vjp(self, p: Any, g: Any, alpha: Any) -> Any:
        """dL/dx = v * (g - <p, g>) - p * (v . (g - <p, g>)), v = ||p||_alpha (p/||p||_alpha)^(2-alpha)
        / (alpha - 1) on the support."""

    def budget_forward(self, x: Any, budget: Any) -> RowSolve:
        """Row-wise budget-sparsemax: ``p = clip(x - tau, 0, 1)``, ``sum p = budget``
        (float64 (rows,), 0 <= budget <= n); ``theta`` holds ``tau`` (the smallest one
        when not unique; -inf when every unmasked entry is 1)."""

    def budget_vjp(self, p: Any, g: Any) -> Any:
        """dL/dx = g - mean_F(g) on the free set F = {0 < p < 1}, 0 elsewhere."""

    def attention_forward(self, q: Any, k: Any, v: Any, spec: AttentionSpec) -> AttentionForward:
        """Chunked attention forward; never holds an (Nq, Nk) matrix."""

    def attention_backward(
        self, do: Any, q: Any, k: Any, v: Any, res: Any, skew: Any, spec: AttentionSpec
    ) -> AttentionGrads:
        """Chunked attention backward from the forward's residual ``res`` (an
        :class:`AttentionResidual` or :class:`AttentionForward`) and skewed output (None:
        recomputed)."""


def is_cupy(x: Any) -> bool:
    """True for a CuPy array (decided from its type's module, so cupy is never imported)."""
    return type(x).__module__.split(".")[0] == "cupy"


def xp_of(x: Any):
    """The array namespace of ``x``: cupy for CuPy arrays, the namespace an array of another
    type declares (``x.__array_namespace__()``, the array API protocol, when it is not
    NumPy's), numpy otherwise (never imports)."""
    import sys

    if is_cupy(x):
        return sys.modules["cupy"]
    if not isinstance(x, np.ndarray) and hasattr(type(x), "__array_namespace__"):
        return x.__array_namespace__()
    return np


def narrow(a: Any, dtype: Any) -> Any:
    """``a``, a result computed in a wider dtype, in ``dtype``: a value beyond ``dtype``'s
    range rounds to +-inf, as IEEE rounding does, without a warning (a gradient of a valid
    input may exceed float32's range, e.g. attention at a large alpha)."""
    with np.errstate(over="ignore"):
        return a.astype(dtype, copy=False)


def theta_to_tau(theta: Any, alpha: Any) -> Any:
    """Convert the x-space threshold to design.md's tau."""
    xp = xp_of(theta)
    a1 = xp.where(alpha == 1.0, 1.0, alpha - 1.0)  # avoid 0 * -inf on all-masked rows
    with np.errstate(over="ignore"):  # |(alpha - 1) theta| beyond float64's range: tau is +-inf
        return xp.where(alpha == 1.0, theta, a1 * theta - 1.0)


def tau_to_theta(tau: Any, alpha: Any) -> Any:
    """Inverse of :func:`theta_to_tau` (loses relative precision as alpha -> 1)."""
    xp = xp_of(tau)
    a1 = xp.where(alpha == 1.0, 1.0, alpha - 1.0)
    return xp.where(alpha == 1.0, tau, (tau + 1.0) / a1)
