r"""Tolerances for judging an entmax implementation against the float64 reference.

They are error *budgets* of a correct implementation that works in ``dtype`` (shifts each
row by its maximum, sums in that precision, evaluates pow/exp/log1p to a few ulps), derived
from a first-order error analysis, never from what happened to pass.  Every function takes
the *expected* (reference) values, because how much rounding can move an entry depends on
where it sits relative to the threshold.

The formula
-----------
Let ``u = finfo(dtype).eps / 2`` (the unit roundoff of the dtype the implementation
returns), ``n`` the row length, and ``e_alpha(t) = [1 + (alpha-1) t]_+ ** (1/(alpha-1))``
(``exp(t)`` at alpha = 1), so that ``p_i = e_alpha(t_i)`` with ``t_i = x_i - theta``.

1. Threshold budget (x-space).  Solving ``sum_i e_alpha(t_i) = 1`` for theta makes an error
   of at most (error of the computed sum) / ``sum_i p_i^(2-alpha)``, and that denominator is
   >= 1 for every alpha >= 1, so::

       delta_n = u * (C_THETA + LAMBDA * sqrt(n))

   ``C_THETA = 8`` ulps cover the elementwise pow/exp/log1p, the max shift and the solver's
   stopping rule; ``LAMBDA * sqrt(n)`` with ``LAMBDA = 4`` is the probabilistic bound on the
   rounding error of a sum of n terms (Higham & Mary 2019; it covers recursive and cumulative
   sums, which sort-based sparsemax uses, and pairwise sums a fortiori).

2. Probabilities.  Entry i may additionally carry the rounding of its own argument,
   ``2 u |t_i|``, so with ``d_i = delta_n + 2 u |t_i|`` the budget is the exact range of p_i
   when the threshold moves by ``+-d_i`` (the *threshold envelope*), plus the final rounding::

       tol_i = max(e_alpha(t_i + d_i) - p_i, p_i - e_alpha(t_i - d_i)) + u p_i + tiny

   This is relative at alpha = 1 (``p (e^d - 1)``), ``d * p^(2-alpha)`` to first order for
   1 < alpha <= 2, and the Hölder term ``((alpha-1) d)^(1/(alpha-1))`` for entries at the
   threshold (where alpha-entmax is not Lipschitz when alpha > 2: an honest implementation
   can be that far off there).  Zeros of the reference use ``t_i`` = the threshold.
   ``tiny`` (the smallest normal number) allows for underflow; masked (-inf) entries get 0.

3. Threshold tau = (alpha-1) theta - 1 (theta at alpha = 1)::

       tol_tau = max(alpha-1, 1[alpha=1]) * delta_n + 2 u |tau|

4. Jacobian-vector products ``dx = u_i (g_i - sum_j u_j g_j / sum_j u_j)``, u = p^(2-alpha),
   row-wise: a threshold error d moves u_i relatively by ``|2-alpha| p_i^(1-alpha) d``
   (first order), hence the row's condition number
   ``kappa = 1 + max_{p_i>0} |2-alpha| p_i^(1-alpha)`` and::

       tol_row = 4 * delta_n * kappa * max|g| * max_i u_i + 2 u max|dx|

   (4: two terms of size <= u_i max|g|, each with the same relative error, and the
   weighted mean).  Rows where an entry sits within ``1000 delta_n`` of the threshold have
   an ill-posed gradient for alpha >= 2 (u jumps there) and are reported, not compared.

5. Attention: the score of query i carries ``u (C_THETA + LAMBDA sqrt(D)) s_i scale
   max_j sum_d |q_id k_jd|`` on top of ``delta_{Nk}``; outputs and gradients are sums of
   the per-entry budgets above weighted by |v|, |dO|, |q|, |k| (see the functions).

6. Fenchel-Young loss ``L = Omega(q) - Omega(p) + <p - q, x>`` (q the one-hot target),
   per row: evaluated on the max-shifted scores y = x - max x, the threshold error delta_n
   moves it by at most delta_n (the sum of p), the n-term sums round relatively by
   delta_n, and each shifted score |y_i| on the support of p or q carries its own
   rounding, so::

       tol_loss = delta_n * (1 + |L| + max_{p_i > 0 or q_i > 0} |x_i - max x|)

7. The alpha gradient ``dL/dalpha = sum_i g_i (p_i c_i - u_i <p, c> / sum u)`` with
   ``l_i = log p_i``, ``c_i = -l_i^2 h(-(alpha-1) l_i)``, ``h(w) = (e^w - 1 - w)/w^2``:
   a threshold error delta_n moves ``l_i`` by up to ``kappa delta_n`` (kappa of formula 4),
   hence c_i relatively by ``(2 |l_i| + l_i^2) kappa delta_n``; both terms of dp_i/dalpha,
   weighted by max|g|, carry it (factor 4 as in formula 4)::

       tol = 4 delta_n kappa max|g| sum_{p_i>0} (p_i + u_i)(1 + 2|l_i| + l_i^2)^2 + 2 u |dalpha|

8. The ASEntmax scale ``s = delta + beta L^gamma``, ``L = log(n + c)`` (float64 scalars):
   ``L`` carries ``dL = u (2 + |L|)`` (the rounding of n + c and of log), ``L^gamma`` a
   relative ``r = |gamma| dL / L + 4 u`` (pow to a few ulps); s, ``ds/dbeta = L^gamma`` and
   ``ds/dgamma = beta L^gamma log L`` inherit it, plus their final roundings::

       tol_s      = |beta| L^gamma r + 2 u (|delta| + |s|)
       tol_dbeta  = L^gamma (r + u)
       tol_dgamma = |beta| L^gamma (r |log L| + dL / L + 4 u) + 2 u |ds/dgamma|

Two engines that both compute in float64 agree far more tightly than an implementation in
``dtype`` is judged here; those agreement budgets are the test suite's own
(``tests/agreement.py``), not part of this model.

``rtol`` / ``atol`` arguments of the assertions add to (never replace) these budgets;
``factor`` multiplies them.  Shared parameters: ``dtype`` is the dtype the implementation
computed in; ``factor`` multiplies the budget.
"""

from __future__ import annotations

import math

import numpy as np

C_THETA = 8.0  #: ulps for elementwise evaluation, the max shift and the solver's stopping rule
LAMBDA = 4.0  #: multiple of sqrt(n) u in the probabilistic summation bound
ILL_POSED = 1e3  #: gradient rows with an entry within ILL_POSED * delta_n of the threshold
#: The float64 reference's accuracy contract: for alpha in [1, 2], rows of up to 1000 entries
#: with |x| <= 50, every probability lies within ORACLE_ATOL (absolute) of the exact value
#: (the 50-digit oracle of :mod:`entmax_ref.testing.oracle`): 18 float64 ulps of 1.  Held by
#: ``tests/test_oracle.py`` and by the corpus generator for every case it writes.
ORACLE_ATOL = 4e-15

__all__ = [
    "C_THETA",
    "LAMBDA",
    "ORACLE_ATOL",
    "alpha_vjp_tolerance",
    "asentmax_scale_tolerances",
    "e_alpha",
    "entmax_tolerance",
    "loss_tolerance",
    "threshold_budget",
    "threshold_tolerance",
    "unit_roundoff",
    "vjp_tolerance",
]


def _rows64(*arrays):
    """Each argument as a float64 array of at least two dimensions (rows, n)."""
    return tuple(np.atleast_2d(np.asarray(a, np.float64)) for a in arrays)


def unit_roundoff(dtype) -> float:
    """Half the machine epsilon of ``dtype`` ('bfloat16' accepted): 2^-53 for float64."""
    if str(dtype) == "bfloat16":
        return 2.0**-8
    return float(np.finfo(np.dtype(dtype)).eps) / 2


def tiny(dtype) -> float:
    if str(dtype) == "bfloat16":
        return float(np.finfo(np.float32).tiny)
    return float(np.finfo(np.dtype(dtype)).tiny)


def threshold_budget(dtype, n) -> np.ndarray | float:
    """delta_n = u (C_THETA + LAMBDA sqrt(n)): the x-space threshold error of a correct
    implementation in ``dtype`` on rows of length ``n`` (formula 1 of the module docs)."""
    return unit_roundoff(dtype) * (C_THETA + LAMBDA * np.sqrt(np.maximum(n, 1)))


def e_alpha(t, alpha):
    """[1 + (alpha-1) t]_+ ** (1/(alpha-1)), exp(t) where alpha == 1."""
    t = np.asarray(t, np.float64)
    a1 = np.asarray(alpha, np.float64) - 1.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        base = np.maximum(1.0 + a1 * t, 0.0)
        out = np.where(a1 == 0.0, np.exp(t), np.power(base, 1.0 / np.where(a1 == 0.0, 1.0, a1)))
    return out


def _t_of(p, alpha):
    """x-space distance t = x - theta from p (the threshold itself where p == 0)."""
    a1 = np.asarray(alpha, np.float64) - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t_pos = np.where(a1 == 0.0, np.log(np.where(p > 0, p, 1.0)),
                         (np.power(np.where(p > 0, p, 1.0), a1) - 1.0) / np.where(a1 == 0.0, 1.0, a1))
        t_zero = np.where(a1 == 0.0, -np.inf, -1.0 / np.where(a1 == 0.0, 1.0, a1))
    return np.where(p > 0, t_pos, t_zero)


def entmax_tolerance(expected, alpha, dtype, *, masked=None, extra_delta=0.0, factor=1.0):
    """Per-entry absolute tolerance for alpha-entmax probabilities (formula 2).

    Parameters
    ----------
    expected : (rows, n) float64 reference probabilities.
    alpha : scalar or (rows,) alpha.
    dtype : the dtype the implementation computed in.
    masked : (rows, n) bool, entries that were -inf (budget 0: they must be exactly 0).
    extra_delta : scalar or (rows,) extra x-space error (e.g. of attention scores).
    factor : multiplies the budget.
    """
    p = np.asarray(expected, np.float64)
    rows, n = p.shape
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (rows,))[:, None]
    uu = unit_roundoff(dtype)
    t = _t_of(p, a)
    live = np.isfinite(t)
    extra = np.asarray(extra_delta, np.float64)
    extra = extra.reshape(-1, 1) if extra.ndim else extra
    d = factor * (threshold_budget(dtype, n) + extra)
    d = d + factor * 2 * uu * np.where(live, np.abs(t), 0.0)
    # the envelope, written without cancellation: with w = (alpha-1) d / p^(alpha-1),
    # e_alpha(t +- d) = p (1 +- w)^(1/(alpha-1)) on the support (p e^(+-d) at alpha = 1)
    a1 = a - 1.0
    pos = p > 0
    safe_p = np.where(pos, p, 1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = np.where(a1 == 0.0, d, a1 * d / np.power(safe_p, a1))
        inv = 1.0 / np.where(a1 == 0.0, 1.0, a1)
        up = np.where(a1 == 0.0, np.expm1(d), np.expm1(np.log1p(w) * inv))
        down = np.where(a1 == 0.0, -np.expm1(-d),
                        np.where(w >= 1.0, 1.0, -np.expm1(np.log1p(-np.minimum(w, 1.0)) * inv)))
        zero = np.where(a1 == 0.0, 0.0, np.power(np.maximum(a1 * d, 0.0), inv))
    env = np.where(pos, safe_p * np.maximum(up, down), np.where(live, zero, 0.0))
    # the underflow allowance: every entry that is not masked (a softmax entry whose value
    # underflows to 0 included, when the masks are given) may round to a subnormal or to 0
    tol = env + uu * p + np.where(live if masked is None else ~np.asarray(masked, bool), tiny(dtype), 0.0)
    if masked is not None:
        tol = np.where(masked, 0.0, tol)
    return tol


def threshold_tolerance(expected_tau, alpha, dtype, n, *, factor=1.0):
    """Absolute tolerance for tau per row (formula 3)."""
    tau = np.asarray(expected_tau, np.float64)
    a = np.broadcast_to(np.asarray(alpha, np.float64), tau.shape)
    scale = np.where(a == 1.0, 1.0, a - 1.0)
    with np.errstate(invalid="ignore"):
        tol = factor * (scale * threshold_budget(dtype, n) + 2 * unit_roundoff(dtype) * np.abs(tau))
    return np.where(np.isfinite(tau), tol, 0.0)


def vjp_kappa(p, alpha):
    """1 + max over the support of |2 - alpha| p^(1 - alpha), per row."""
    p = np.asarray(p, np.float64)
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (p.shape[0],))[:, None]
    with np.errstate(divide="ignore", over="ignore"):
        c = np.where(p > 0, np.abs(2.0 - a) * np.power(np.where(p > 0, p, 1.0), 1.0 - a), 0.0)
    return 1.0 + c.max(axis=1, initial=0.0)


def vjp_tolerance(p, g, expected_dx, alpha, dtype, *, factor=1.0, extra_delta=0.0):
    """Per-row absolute tolerance (broadcast to (rows, n)) for entmax VJPs (formula 4)."""
    p = np.asarray(p, np.float64)
    g = np.asarray(g, np.float64)
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (p.shape[0],))[:, None]
    rows, n = p.shape
    with np.errstate(divide="ignore", over="ignore"):
        u = np.where(p > 0, np.power(np.where(p > 0, p, 1.0), 2.0 - a), 0.0)
    d = threshold_budget(dtype, n) + np.asarray(extra_delta, np.float64).reshape(-1)
    gmax = np.abs(g).max(axis=1, initial=0.0)
    tol = 4 * d * vjp_kappa(p, a) * gmax * u.max(axis=1, initial=0.0)
    tol = tol + 2 * unit_roundoff(dtype) * np.abs(expected_dx).max(axis=1, initial=0.0)
    return np.broadcast_to((factor * tol)[:, None], (rows, n))


def ill_posed_rows(x, theta, alpha, dtype):
    """Rows where an unmasked entry sits within ILL_POSED * delta_n of the threshold and
    alpha >= 2: their gradient is discontinuous there (u jumps from >= 1 to 0)."""
    x = np.asarray(x, np.float64)
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (x.shape[0],))
    th = np.asarray(theta, np.float64).reshape(-1)
    rows, n = x.shape
    with np.errstate(invalid="ignore"):
        gap = np.abs(1.0 + (a[:, None] - 1.0) * (x - th[:, None]))  # p^(alpha-1) on the support
    near = np.isfinite(x) & (gap <= ILL_POSED * (a[:, None] - 1.0) * threshold_budget(dtype, n))
    return (a >= 2.0) & near.any(axis=1)


def loss_tolerance(x, p, target_onehot, loss, dtype, *, factor=1.0):
    """Absolute tolerance per row for the Fenchel-Young entmax loss (formula 6).

    Parameters
    ----------
    x : (rows, n) float64 scores (-inf for masked entries).
    p : (rows, n) float64 reference probabilities.
    target_onehot : (rows, n) one-hot targets q.
    loss : (rows,) float64 reference losses.
    dtype, factor : as in the module docs.

    Returns
    -------
    (rows,) float64 array.
    """
    x, p, q = _rows64(x, p, target_onehot)
    with np.errstate(invalid="ignore"):
        y = x - x.max(axis=1, keepdims=True)
    reach = np.where((p > 0) | (q > 0), np.abs(y), 0.0).max(axis=1, initial=0.0)
    loss = np.abs(np.asarray(loss, np.float64).reshape(-1))
    return factor * threshold_budget(dtype, x.shape[1]) * (1 + loss + reach)


def alpha_vjp_tolerance(p, g, dalpha, alpha, dtype, *, factor=1.0):
    """Absolute tolerance per row for ``dL/dalpha`` of alpha-entmax (formula 7).

    Parameters
    ----------
    p : (rows, n) float64 reference probabilities.
    g : (rows, n) upstream gradient.
    dalpha : (rows,) float64 reference dL/dalpha.
    alpha : scalar or (rows,) alpha.
    dtype, factor : as in the module docs.

    Returns
    -------
    (rows,) float64 array.
    """
    p, g = _rows64(p, g)
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (p.shape[0],))[:, None]
    on = p > 0
    ell = np.abs(np.log(np.where(on, p, 1.0)))
    with np.errstate(over="ignore"):
        u = np.where(on, np.power(np.where(on, p, 1.0), 2.0 - a), 0.0)
    weight = np.where(on, (p + u) * (1.0 + 2.0 * ell + ell * ell) ** 2, 0.0).sum(axis=1)
    d = threshold_budget(dtype, p.shape[1])
    tol = 4 * d * vjp_kappa(p, a) * np.abs(g).max(axis=1, initial=0.0) * weight
    tol = tol + 2 * unit_roundoff(dtype) * np.abs(np.asarray(dalpha, np.float64).reshape(-1))
    return factor * tol


def asentmax_scale_tolerances(n, beta, gamma, delta, offset, s, dgamma, *, factor=1.0):
    """Absolute tolerances (tol_s, tol_dbeta, tol_dgamma) of the float64 ASEntmax scale
    ``s = delta + beta log(n + offset)^gamma`` and its gradients (formula 8); ``ds/ddelta``
    is exactly 1.

    Parameters
    ----------
    n : context length (log(n + offset) > 0).
    beta, gamma, delta, offset : the scale's parameters.
    s, dgamma : the reference s and ds/dgamma.
    factor : multiplies the budgets.

    Returns
    -------
    tuple of three floats.
    """
    u = unit_roundoff(np.float64)
    L = math.log(n + offset)
    if not L > 0:
        raise ValueError(f"log(n + offset) must be > 0, got n={n!r}, offset={offset!r}")
    dL = u * (2 + abs(L))
    r = abs(gamma) * dL / L + 4 * u
    Lg = L**gamma
    tol_s = abs(beta) * Lg * r + 2 * u * (abs(delta) + abs(s))
    tol_db = Lg * r + u * Lg
    tol_dg = abs(beta) * Lg * (r * abs(math.log(L)) + dL / L + 4 * u) + 2 * u * abs(dgamma)
    return factor * tol_s, factor * tol_db, factor * tol_dg
