r"""Batteries for alpha-normmax and budget-sparsemax (the ``entmax`` package's
``normmax_bisect`` and ``budget_bisect``), in the style of :mod:`.checks`.

Tolerances are error budgets of a correct implementation that computes in ``dtype``, in
the threshold-envelope form of :mod:`.tolerance` (``u`` the unit roundoff, ``delta_n``
its :func:`~.tolerance.threshold_budget`):

normmax
    ``p_i = t_i^g / sum_j t_j^g`` with ``t = [x - tau]_+``, ``g = 1/(alpha-1)``.  The
    threshold may be off by ``d = delta_n + 2 u max_i |x_i - max x|`` (the shift and the
    solver); the budget of entry i is the range of p_i when tau moves by ``+-d``, plus
    ``delta_n p_i`` (the powers and the n-term sum of the normalisation ``w / sum w``)
    and the smallest normal number.
normmax VJP
    ``dx = v (g - <p, g>) - p (v . (g - <p, g>))``, ``v_i`` proportional to
    ``t_i^(g (2 - alpha))``: a threshold error ``d`` moves ``v`` relatively by at most
    ``kappa d`` with ``kappa = (|2 - alpha| + 1) g max_{support} 1/t_i``, so the row
    budget is ``4 (kappa d + u) max|g| max|v| + 2 u max|dx|``.  Rows with an entry within
    ``1000 d`` of tau are ill-posed for alpha >= 2 (v jumps) and are not compared.
budget-sparsemax
    ``p = clip(x - tau, 0, 1)``: ``tau = max x + (|U| + sum_F (x_i - max x) - B)/|F|``
    carries ``d = delta_n (1 + B) + 2 u (|max x| + max_F |x_i - max x|)`` (sums of |F|
    terms, the shift, and implementations that do not shift); each entry adds ``u``.
budget-sparsemax VJP
    ``g_i - mean_F(g)`` on the free set: ``4 u max|g| + 2 u |dx|``; rows with an entry
    within ``1000 d`` of a breakpoint (0 or 1) are ill-posed and not compared.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from . import tolerance as T
from ._adapters import from_numpy
from .assertions import compare
from .calling import dtypes_of, guarded_call, rows_of, safe_np
from .report import CheckReport, CheckRow

__all__ = [
    "budget_tolerance",
    "budget_vjp_tolerance",
    "check_budget_sparsemax",
    "check_normmax",
    "normmax_threshold_tolerance",
    "normmax_tolerance",
    "normmax_vjp_tolerance",
]

ILL_POSED = T.ILL_POSED
#: the alphas and budgets ``entmax-ref check`` runs these batteries at, on engines and peers
NORMMAX_ALPHAS = (1.5, 2.0, 3.0)
BUDGETS = (1.0, 2.5)


def _shift(x):
    m = np.max(np.where(np.isfinite(x), x, -np.inf), axis=1, initial=-np.inf)
    return np.where(np.isfinite(m), m, 0.0)


def _normmax_d(x, dtype):
    x = np.asarray(x, np.float64)
    m = _shift(x)
    spread = np.max(np.where(np.isfinite(x), np.abs(x - m[:, None]), 0.0), axis=1, initial=0.0)
    return T.threshold_budget(dtype, x.shape[1]) + 2 * T.unit_roundoff(dtype) * (spread + np.abs(m))


def normmax_threshold_tolerance(x, dtype, *, factor=1.0):
    """Absolute tolerance per row for the normmax threshold tau: the ``d`` of the module
    docs (it covers tau's final rounding too: |tau| <= |max x| + 1)."""
    x = np.atleast_2d(np.asarray(x, np.float64))
    return factor * _normmax_d(x, dtype)


def normmax_tolerance(expected, tau, x, alpha, dtype, *, factor=1.0):
    """Per-entry absolute tolerance for alpha-normmax probabilities (module docs)."""
    p = np.asarray(expected, np.float64)
    x = np.asarray(x, np.float64)
    rows, n = p.shape
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (rows,))[:, None]
    tau = np.asarray(tau, np.float64).reshape(-1)
    live = np.isfinite(tau)
    d = factor * _normmax_d(x, dtype)[:, None]
    g = 1.0 / (a - 1.0)
    tt = np.where(live, tau, 0.0)[:, None]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        t = np.where(np.isfinite(x), x - tt, -np.inf)

        def probs(shift):
            w = np.where(t + shift > 0, np.power(np.maximum(t + shift, 0.0) / (np.abs(tt) + 1.0), g), 0.0)
            s = w.sum(axis=1, keepdims=True)
            return w / np.where(s > 0, s, 1.0)

        env = np.maximum(np.abs(probs(d) - p), np.abs(probs(-d) - p))
    # the normalisation p = w / sum w: the pow of each w and the sum of n terms
    tol = env + T.threshold_budget(dtype, n) * p + T.tiny(dtype)
    tol = np.where(np.isfinite(x) & live[:, None], tol, 0.0)
    return tol


def normmax_vjp_tolerance(p, x, tau, g, dx, alpha, dtype, *, ill_posed_inf=True):
    """(per-entry tolerance, ill-posed rows) for the alpha-normmax VJP (module docs).

    ``p``, ``x``, ``g``, ``dx`` are (rows, n) float64 (reference p and dx), ``tau`` the
    (rows,) reference thresholds.  The tolerance is inf on ill-posed rows (alpha >= 2 with
    an entry within ILL_POSED d of tau), which are not to be compared from x, unless
    ``ill_posed_inf`` is False (for implementations given the reference p).
    """
    p = np.asarray(p, np.float64)
    rows, n = p.shape
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (rows,))
    d = _normmax_d(x, dtype)
    on = p > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.where(on, np.asarray(x, np.float64) - np.asarray(tau, np.float64).reshape(-1, 1), np.inf)
        inv_t = np.where(on, 1.0 / t, 0.0).max(axis=1, initial=0.0)
        lp = np.where(on, np.log(np.where(on, p, 1.0)), -np.inf)
        top = lp.max(axis=1, initial=-np.inf)
        lnorm = top + np.log(np.where(on, np.exp(a[:, None] * (lp - top[:, None])), 0.0).sum(axis=1)) / a
        v = np.where(on, np.exp(lnorm[:, None] + (2.0 - a[:, None]) * (lp - lnorm[:, None])), 0.0) / (a[:, None] - 1)
    kappa = (np.abs(2.0 - a) + 1.0) / (a - 1.0) * inv_t
    uu = T.unit_roundoff(dtype)
    gmax = np.abs(g).max(axis=1, initial=0.0)
    tol = 4 * (kappa * d + uu) * gmax * v.max(axis=1, initial=0.0) + 2 * uu * np.abs(dx).max(axis=1, initial=0.0)
    # every unmasked entry near tau, zeros of p included (v jumps as an entry enters the support)
    xx = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.abs(xx - np.asarray(tau, np.float64).reshape(-1, 1))
    ill = (a >= 2.0) & np.any(np.isfinite(xx) & (gap <= ILL_POSED * d[:, None]), axis=1)
    return np.broadcast_to(np.where(ill & ill_posed_inf, np.inf, tol)[:, None], (rows, n)), ill


def _budget_d(x, budget, dtype):
    x = np.asarray(x, np.float64)
    m = _shift(x)
    spread = np.max(np.where(np.isfinite(x), np.abs(x - m[:, None]), 0.0), axis=1, initial=0.0)
    uu = T.unit_roundoff(dtype)
    return T.threshold_budget(dtype, x.shape[1]) * (1 + np.asarray(budget, np.float64)) + 2 * uu * (np.abs(m) + spread)


def budget_tolerance(x, budget, dtype, *, factor=1.0):
    """Per-entry absolute tolerance for budget-sparsemax (module docs); masked entries 0."""
    x = np.asarray(x, np.float64)
    d = factor * _budget_d(x, budget, dtype)
    tol = d[:, None] + T.unit_roundoff(dtype)
    return np.where(np.isfinite(x), np.broadcast_to(tol, x.shape), 0.0)


def budget_vjp_tolerance(x, p, g, dx, budget, dtype, *, ill_posed_inf=True):
    """(per-entry tolerance, ill-posed rows) for the budget-sparsemax VJP (module docs):
    ``4 u max|g| + 2 u |dx|``, inf on rows with an entry within ILL_POSED d of a
    breakpoint (p near 0 or 1), which are not to be compared from x (finite there too
    when ``ill_posed_inf`` is False: for implementations given the reference p).

    ``x``, ``p``, ``g``, ``dx`` are (rows, n) float64 (reference p and dx).
    """
    x = np.atleast_2d(np.asarray(x, np.float64))
    p = np.atleast_2d(np.asarray(p, np.float64))
    d = _budget_d(x, budget, dtype)[:, None]
    with np.errstate(invalid="ignore"):
        near = np.isfinite(x) & ((np.abs(p) <= ILL_POSED * d) & (p > 0) | (np.abs(1 - p) <= ILL_POSED * d) & (p < 1))
    ill = near.any(axis=1)
    uu = T.unit_roundoff(dtype)
    tol = 4 * uu * np.abs(np.atleast_2d(g)).max(axis=1, keepdims=True) + 2 * uu * np.abs(np.atleast_2d(dx))
    return np.where(ill[:, None] & ill_posed_inf, np.inf, tol), ill


# ----------------------------------------------------------------------------- batteries


def _call2(row, fn, x, prm, framework, device, keyword):
    """fn(x, prm) positionally, else fn(x, keyword=prm), guarded (:func:`.calling.guarded_call`)."""
    xin = from_numpy(x, framework, device)

    def call():
        try:
            return fn(xin, prm)
        except TypeError:
            return fn(xin, **{keyword: prm})

    return guarded_call(row, call)


def _dtype_rows(report, fn, vjp, kind, param, label, dtypes, peer, ill_note):
    """For each dtype: the forward row ``"{kind} {param}"`` (None without ``fn``) and the
    VJP row ``"{kind} vjp {param}"`` (None without ``vjp``), added to ``report``; yields
    ``(dtype, frow, vrow, skipped)`` and, after the caller's loop body, times the rows and
    notes the ill-posed rows the body counted in ``skipped[0]``."""
    for dt in dtypes_of(dtypes):
        frow = CheckRow(f"{kind} {param}", label, dt.name, peer=peer) if fn is not None else None
        vrow = CheckRow(f"{kind} vjp {param}", label, dt.name, peer=peer) if vjp is not None else None
        report.rows.extend(r for r in (frow, vrow) if r is not None)
        t0 = time.perf_counter()
        skipped = [0]
        yield dt, frow, vrow, skipped
        for r in (frow, vrow):
            if r is not None:
                r.seconds = time.perf_counter() - t0
                r.finish()
        if skipped[0] and vrow is not None:
            vrow.note(f"{skipped[0]} ill-posed row(s) not compared ({ill_note})")


def _forward_case(frow, fn, case, x, prm, p, tol, dt, framework, device, keyword):
    """fn(x, prm) against the reference ``p`` under ``tol`` (the budget of ``keyword``'s
    family: alpha for normmax, budget for budget-sparsemax), with the dtype and
    masked-entry properties; the result as NumPy when it is within tolerance, else None."""
    res = _call2(frow, fn, x, prm, framework, device, keyword)
    got = None if res is None else safe_np(frow, res)
    if got is None:
        return None
    if case.name == "random":
        frow.prop("dtype", dt.name in str(getattr(res, "dtype", "")), f"got {getattr(res, 'dtype', '?')}")
    budget = "normmax_tolerance" if keyword == "alpha" else "budget_tolerance"
    if not frow.judge(compare(got, p, tol, dt, support=True), "p", case.id, budget=budget):
        return None
    if case.name == "masks":
        frow.prop("masked entries are exactly 0", bool(np.all(got[np.isneginf(x.astype(np.float64))] == 0)))
    return got


def _vjp_case(vrow, vjp, case, x, g, prm, dx, tol, dt, framework, device, budget):
    """vjp(x, g, prm) against the reference ``dx`` under ``tol`` (the tolerance function
    ``budget``): (result as NumPy or None when the call failed, within tolerance)."""
    gx = from_numpy(g, framework, device)
    res = guarded_call(vrow, lambda: vjp(from_numpy(x, framework, device), gx, prm))
    got = None if res is None else safe_np(vrow, res)
    if got is None:
        return None, False
    return got, vrow.judge(compare(got, dx, tol, dt), "dx", case.id, budget=budget)


def check_normmax(fn: Callable | None, alpha: float = 2.0, *, vjp: Callable | None = None, name: str | None = None,
                  dtypes=("float64", "float32"), framework: str = "numpy", device: Any = None,
                  size: str = "default", seed: int = 0, masked_rows: bool = True, peer: bool = False) -> CheckReport:
    """Run the alpha-normmax battery.

    ``fn(x, alpha)`` returns alpha-normmax of the (rows, n) array ``x`` along its last
    axis; ``vjp(x, grad, alpha)`` the gradient of ``sum(grad * normmax(x))`` w.r.t. x.
    Either may be None.  Compared with the float64 NumPy reference under
    :func:`normmax_tolerance`; properties: dtype, on the simplex, masked entries 0,
    all-masked rows 0, shift invariance, VJP rows sum to 0.
    """
    import entmax_ref as er

    report = CheckReport()
    a = float(alpha)
    label = name or getattr(fn or vjp, "__name__", "fn")
    rng = np.random.default_rng(seed + 41)
    for dt, frow, vrow, skipped in _dtype_rows(report, fn, vjp, "normmax", f"a={a:g}", label, dtypes, peer,
                                               "alpha >= 2 with an entry at the threshold"):
        for case in rows_of(size, seed, masked_rows):
            for r in (frow, vrow):
                if r is not None:
                    r.case = case.id
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, info = er.normmax(x64, a, backend="numpy", return_info=True)
            if frow is not None:
                tol = normmax_tolerance(p, info.tau, x64, a, dt)
                got = _forward_case(frow, fn, case, x, a, p, tol, dt, framework, device, "alpha")
                if got is not None and case.name == "all-masked":
                    frow.prop("all-masked rows give zeros", bool(np.all(got == 0)))
                elif got is not None and case.name == "random":
                    s = got.astype(np.float64).sum(axis=1)
                    frow.prop("on the simplex", bool(np.all(got >= 0) and np.all(np.abs(s - 1) <= tol.sum(axis=1))),
                              f"worst |sum - 1| {np.abs(s - 1).max():.3g}")
                    xs = x + np.asarray(3.0, dt)  # the reference of the rounded shifted input
                    res2 = _call2(frow, fn, xs, a, framework, device, "alpha")
                    got2 = None if res2 is None else safe_np(frow, res2)
                    if got2 is not None:
                        xs64 = xs.astype(np.float64)
                        p2, i2 = er.normmax(xs64, a, backend="numpy", return_info=True)
                        c2 = compare(got2, p2, normmax_tolerance(p2, i2.tau, xs64, a, dt), dt)
                        frow.prop("shift invariance", c2.ok, c2.describe("p(x + 3)"))
            if vrow is not None and case.name != "long":
                g = rng.standard_normal(x.shape).astype(dt)
                dx = er.normmax_vjp(p, g.astype(np.float64), a, backend="numpy")
                tol, ill = normmax_vjp_tolerance(p, x64, info.tau, g, dx, a, dt)
                got, ok = _vjp_case(vrow, vjp, case, x, g, a, dx, tol, dt, framework, device,
                                    "normmax_vjp_tolerance")
                if got is None:
                    continue
                skipped[0] += int(ill.sum())
                if ok and case.name == "random":
                    s = got.astype(np.float64).sum(axis=1)
                    ok = np.abs(s) <= np.where(ill, np.inf, tol[:, 0] * x.shape[1])
                    vrow.prop("rows sum to 0 (J 1 = 0)", bool(ok.all()), f"worst |sum| {np.abs(s).max():.3g}")
    return report


def check_budget_sparsemax(fn: Callable | None, budget: float = 2.0, *, vjp: Callable | None = None,
                           name: str | None = None, dtypes=("float64", "float32"), framework: str = "numpy",
                           device: Any = None, size: str = "default", seed: int = 0, masked_rows: bool = True,
                           masks: bool = True, peer: bool = False) -> CheckReport:
    """Run the budget-sparsemax battery.

    ``fn(x, budget)`` projects each row of ``x`` onto {0 <= p <= 1, sum p = budget};
    ``vjp(x, grad, budget)`` is the gradient of ``sum(grad * p)`` w.r.t. x.  Rows shorter
    than ``budget`` use ``budget = n``.  ``masks=False`` leaves the rows with -inf entries
    out (for implementations that do not take them).  Compared with the float64 NumPy
    reference under :func:`budget_tolerance`; properties: dtype, box and sum, masked entries 0.
    """
    import entmax_ref as er

    report = CheckReport()
    label = name or getattr(fn or vjp, "__name__", "fn")
    rng = np.random.default_rng(seed + 43)
    for dt, frow, vrow, skipped in _dtype_rows(report, fn, vjp, "budget", f"B={budget:g}", label, dtypes, peer,
                                               "an entry at a breakpoint"):
        for case in rows_of(size, seed, masked_rows and masks):
            if not masks and case.name == "masks":
                continue
            for r in (frow, vrow):
                if r is not None:
                    r.case = case.id
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            b = float(min(budget, x.shape[1]))
            p, info = er.budget_sparsemax(x64, b, backend="numpy", return_info=True)
            if frow is not None:
                tol = budget_tolerance(x64, b, dt)
                got = _forward_case(frow, fn, case, x, b, p, tol, dt, framework, device, "budget")
                if got is not None and case.name == "random":
                    s = got.astype(np.float64).sum(axis=1)
                    frow.prop("in the box, summing to the budget",
                              bool(np.all(got >= 0) and np.all(got <= 1) and np.all(np.abs(s - b) <= tol.sum(axis=1))),
                              f"worst |sum - budget| {np.abs(s - b).max():.3g}")
            if vrow is not None and case.name != "long":
                g = rng.standard_normal(x.shape).astype(dt)
                dx = er.budget_sparsemax_vjp(p, g.astype(np.float64), b, backend="numpy")
                tol, ill = budget_vjp_tolerance(x64, p, g, dx, b, dt)
                got, _ = _vjp_case(vrow, vjp, case, x, g, b, dx, tol, dt, framework, device, "budget_vjp_tolerance")
                if got is not None:
                    skipped[0] += int(ill.sum())
    return report
