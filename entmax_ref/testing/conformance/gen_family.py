"""The generators of the normmax and budget-sparsemax files (and their VJPs): expected values
from the correctly rounding normmax oracle and the exact rational budget oracle."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .exact import FamilyOracle, at_both, normmax_vjp_exact
from .lines import float64_class
from .numformat import num, nums
from .sources import (NORMMAX_ALPHAS, Context, budget_cases, budget_why, case_rng, family_cases, in_dtype,
                      normmax_boundary_rows)


def _oracle(ctx: Context) -> FamilyOracle:
    if ctx.family is None:
        ctx.family = FamilyOracle()
    return ctx.family


def _normmax_cr(ctx, x, a):
    """One normmax row, correctly rounded to float64 with the real-number support, and its
    exact solution at the oracle's two precisions
    (:func:`~entmax_ref.testing.family_oracle.normmax_cr_row`)."""
    from ..family_oracle import normmax_cr_row

    key = ("cr", x.tobytes(), a)
    if key not in _oracle(ctx).cache:
        _oracle(ctx).cache[key] = normmax_cr_row(x, a)
    return _oracle(ctx).cache[key]


def _either(on, p, tol_p, t, reach):
    """How many entries a correct implementation may put in or out of the support: in it
    with a probability within its budget of 0, or within ``reach`` of the threshold (t = x
    minus the threshold, in x's units)."""
    return int((on & (p <= tol_p) | (np.isfinite(t) & (np.abs(t) <= reach))).sum())


def _grad(x, prm, dt):
    return in_dtype(case_rng("grad", x, prm, dt).standard_normal(len(x)), dt)


def _gradient_case(op, src, prm_name, prm, dt, x, p, g, dx, tol, ill, why) -> dict:
    """A VJP line of the family files: 'acceptable' (flag ill-posed) where x sits at a breakpoint."""
    case = {"kind": src.kind, prm_name: num(prm), "dtype": dt, "n": len(x), "x": nums(x, dt), "p": nums(p),
            "grad": nums(g, dt), "dx": nums(dx), "tol_dx": nums(tol) if np.ndim(tol) else num(tol), "why": why}
    if ill:
        case.update(verdict="acceptable", extra_flags=("ill-posed",))
    return case


def gen_normmax(ctx: Context):
    """normmax.jsonl: p, tau and support of alpha-normmax (the correctly rounding oracle)."""
    from ..family_checks import normmax_threshold_tolerance, normmax_tolerance

    for src, a, dt, x in family_cases(ctx, NORMMAX_ALPHAS, normmax_boundary_rows):
        row = _normmax_cr(ctx, x, a)
        p, tau, on = row.p, row.tau, row.on
        tol_p = normmax_tolerance(p[None], [tau], x[None], a, dt)[0]
        tol_tau = float(normmax_threshold_tolerance(x[None], dt)[0]) if np.isfinite(tau) else 0.0
        with np.errstate(invalid="ignore"):
            t = np.where(np.isfinite(x), x - tau, -np.inf) if np.isfinite(tau) else np.full(len(x), -np.inf)
        yield {"kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt), "p": nums(p),
               "tau": num(tau), "support": int(on.sum()), "tol_p": nums(tol_p), "tol_tau": num(tol_tau),
               "tol_support": int((on & (p == 0)).sum()) if float64_class("normmax", {"dtype": dt}, "p")
               else _either(on, p, tol_p, t, tol_tau), "why": src.why}


def gen_normmax_vjp(ctx: Context):
    """normmax_vjp.jsonl: dx = J^T grad of alpha-normmax at x (the correctly rounding oracle's
    p, and dx from its exact solution at both precisions)."""
    from .. import oracle
    from ..family_checks import normmax_vjp_tolerance

    for src, a, dt, x in family_cases(ctx, NORMMAX_ALPHAS, normmax_boundary_rows):
        row = _normmax_cr(ctx, x, a)
        p, tau = row.p, row.tau
        g = _grad(x, a, dt)
        dx = at_both(lambda level: normmax_vjp_exact(oracle.mp, row.levels[level][1], row.levels[level][0], g, a),
                     row.digits)
        tol, _ = normmax_vjp_tolerance(p[None], x[None], [tau], g[None], dx[None], a, dt, ill_posed_inf=False)
        _, ill = normmax_vjp_tolerance(p[None], x[None], [tau], g[None], dx[None], a, dt)
        yield _gradient_case("normmax_vjp", src, "alpha", a, dt, x, p, g, dx, float(tol[0, 0]), bool(ill[0]), src.why)


def gen_budget_sparsemax(ctx: Context):
    """budget_sparsemax.jsonl: p = clip(x - tau, 0, 1) with sum p = budget (the exact rational oracle)."""
    from ..family_checks import budget_tolerance

    for src, B, dt, x in budget_cases(ctx):
        pf, tauf = _oracle(ctx).budget(x, B)
        p = np.array([float(v) for v in pf])
        tol_p = budget_tolerance(x[None], B, dt)[0]
        on = np.array([v > 0 for v in pf])
        if float64_class("budget_sparsemax", {"dtype": dt}, "p"):
            either = int((on & (p == 0)).sum())
        else:
            t = np.where(np.isfinite(x), x - float(tauf), -np.inf) if tauf is not None else np.full(len(x), np.inf)
            either = _either(on, p, tol_p, t, tol_p)
        yield {"kind": src.kind, "budget": num(B), "dtype": dt, "n": len(x), "x": nums(x, dt), "p": nums(p),
               "support": int(on.sum()), "tol_p": nums(tol_p), "tol_support": either, "why": budget_why(src, B, x)}


def gen_budget_sparsemax_vjp(ctx: Context):
    """budget_sparsemax_vjp.jsonl: dx_i = g_i - mean over the free set F = {0 < p < 1} of g on F, 0 elsewhere."""
    from ..family_checks import budget_vjp_tolerance

    for src, B, dt, x in budget_cases(ctx):
        pf, _ = _oracle(ctx).budget(x, B)
        p = np.array([float(v) for v in pf])
        g = _grad(x, B, dt)
        free = [i for i, e in enumerate(pf) if 0 < e < 1]
        mean = sum((Fraction(float(g[i])) for i in free), Fraction(0)) / len(free) if free else Fraction(0)
        dx = np.array([float(Fraction(float(g[i])) - mean) if i in free else 0.0 for i in range(len(x))])
        tol, _ = budget_vjp_tolerance(x[None], p[None], g[None], dx[None], B, dt, ill_posed_inf=False)
        _, ill = budget_vjp_tolerance(x[None], p[None], g[None], dx[None], B, dt)
        yield _gradient_case("budget_sparsemax_vjp", src, "budget", B, dt, x, p, g, dx, tol[0], bool(ill[0]),
                             budget_why(src, B, x))
