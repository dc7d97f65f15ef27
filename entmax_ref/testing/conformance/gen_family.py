"""The generators of the normmax and budget-sparsemax files (and their VJPs), checked against
the 50-digit normmax oracle and the exact rational budget oracle."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .exact import family_oracle, mp_err, normmax_vjp_mp
from .numformat import num, nums, roundtrips
from .sources import NORMMAX_ALPHAS, Context, budget_cases, budget_why, family_cases, normmax_boundary_rows


def _normmax_ref(x64, a):
    import entmax_ref as er

    p, info = er.normmax(x64[None], a, backend="numpy", return_info=True)
    return p[0], float(info.tau[0]), int(info.support[0])


def gen_normmax(ctx: Context):
    """normmax.jsonl: p, tau and support of alpha-normmax, checked against the 50-digit oracle."""
    from ..family_checks import normmax_threshold_tolerance, normmax_tolerance

    fo = family_oracle(ctx)
    mp = fo.fo.mp
    for src, a, dt, x, x64 in family_cases(ctx, NORMMAX_ALPHAS, normmax_boundary_rows):
        p, tau, support = _normmax_ref(x64, a)
        tol_p = normmax_tolerance(p[None], [tau], x64[None], a, dt)[0]
        tol_tau = float(normmax_threshold_tolerance(x64[None], dt)[0]) if np.isfinite(tau) else 0.0
        exact, tau_mp = fo.normmax(x64, a)
        with mp.workdps(50):
            per_entry = np.array([float(abs(mp.mpf(float(v)) - e)) for v, e in zip(p, exact)])
            tau_err = 0.0 if tau_mp is None else float(abs(mp.mpf(tau) - tau_mp))
        err = float(per_entry.max(initial=0.0))
        within = bool(np.all(per_entry <= normmax_tolerance(p[None], [tau], x64[None], a, "float64")[0])
                      and (tau_mp is None) == (not np.isfinite(tau))
                      and tau_err <= float(normmax_threshold_tolerance(x64[None], "float64")[0]))
        case = {"op": "normmax", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
                "p": nums(p), "tau": num(tau), "support": support, "tol_p": nums(tol_p), "tol_tau": num(tol_tau),
                "oracle_err": num(max(err, tau_err)), "within_tol_of_oracle": within, "why": src.why}
        if not within:
            case["why"] += "; the float64 reference is further from the oracle than its own float64 tolerance"
        roundtrips(case["x"], x, dt)
        yield case





def gen_normmax_vjp(ctx: Context):
    """normmax_vjp.jsonl: dx = J^T grad of alpha-normmax at x, checked against the oracle."""
    import entmax_ref as er

    from ..family_checks import normmax_vjp_tolerance

    fo = family_oracle(ctx)
    mp = fo.fo.mp
    rng = np.random.default_rng([ctx.seed, 25])
    for src, a, dt, x, x64 in family_cases(ctx, NORMMAX_ALPHAS, normmax_boundary_rows):
        p, tau, _ = _normmax_ref(x64, a)
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = np.asarray(er.normmax_vjp(p[None], g64[None], a, backend="numpy"), np.float64)
        tol, ill = normmax_vjp_tolerance(p[None], x64[None], [tau], g64[None], dx, a, dt, ill_posed_inf=False)
        tol64, ill64 = normmax_vjp_tolerance(p[None], x64[None], [tau], g64[None], dx, a, "float64")
        exact, tau_mp = fo.normmax(x64, a)
        err = mp_err(mp, dx[0], normmax_vjp_mp(mp, x64, tau_mp, exact, g64, a))
        ill = bool(ill[0])
        within = bool(ill64[0]) or err <= float(tol64[0, 0])
        why = src.why + ("; ill-posed gradient (alpha >= 2 with an entry at the threshold): compare only "
                         "implementations that take p" if ill else "")
        yield {"op": "normmax_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "p": nums(p), "grad": nums(g, dt), "dx": nums(dx[0]), "tol_dx": num(tol[0, 0]),
               "ill_posed": ill, "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": why}





def gen_budget_sparsemax(ctx: Context):
    """budget_sparsemax.jsonl: p = clip(x - tau, 0, 1) with sum p = budget, against the exact rational oracle."""
    import entmax_ref as er

    from ..family_checks import budget_tolerance

    fo = family_oracle(ctx)
    for src, B, dt, x, x64 in budget_cases(ctx):
        p, info = er.budget_sparsemax(x64[None], B, backend="numpy", return_info=True)
        p, tau, support = p[0], float(info.tau[0]), int(info.support[0])
        exact, _ = fo.budget(x64, B)
        err = max((float(abs(Fraction(float(v)) - e)) for v, e in zip(p, exact)), default=0.0)
        within = err <= float(budget_tolerance(x64[None], B, "float64").max(initial=0.0))
        case = {"op": "budget_sparsemax", "kind": src.kind, "budget": num(B), "dtype": dt, "n": len(x),
                "x": nums(x, dt), "p": nums(p), "tau": num(tau), "support": support,
                "tol_p": nums(budget_tolerance(x64[None], B, dt)[0]), "oracle_err": num(err),
                "within_tol_of_oracle": bool(within), "why": budget_why(src, B, x64)}
        if not within:
            case["why"] += "; the float64 reference is further from the exact projection than its own tolerance"
        roundtrips(case["x"], x, dt)
        yield case


def gen_budget_sparsemax_vjp(ctx: Context):
    """budget_sparsemax_vjp.jsonl: dx_i = g_i - mean over the free set F = {0 < p < 1} of g on F, 0 elsewhere."""
    import entmax_ref as er

    from ..family_checks import budget_vjp_tolerance

    fo = family_oracle(ctx)
    rng = np.random.default_rng([ctx.seed, 27])
    for src, B, dt, x, x64 in budget_cases(ctx):
        p = er.budget_sparsemax(x64[None], B, backend="numpy")
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = np.asarray(er.budget_sparsemax_vjp(p, g64[None], B, backend="numpy"), np.float64)
        tol, ill = budget_vjp_tolerance(x64[None], p, g64[None], dx, B, dt, ill_posed_inf=False)
        tol64, _ = budget_vjp_tolerance(x64[None], p, g64[None], dx, B, "float64")
        exact, _ = fo.budget(x64, B)
        free = [i for i, e in enumerate(exact) if 0 < e < 1]
        mean = sum((Fraction(float(g64[i])) for i in free), Fraction(0)) / len(free) if free else Fraction(0)
        dx_exact = [Fraction(float(g64[i])) - mean if i in free else Fraction(0) for i in range(len(x))]
        err = max((float(abs(Fraction(float(v)) - e)) for v, e in zip(dx[0], dx_exact)), default=0.0)
        ill = bool(ill[0])
        within = ill or err <= float(tol64.max(initial=0.0))
        why = budget_why(src, B, x64) + ("; ill-posed gradient (an entry at a breakpoint 0 or 1): compare only "
                                          "implementations that take p" if ill else "")
        yield {"op": "budget_sparsemax_vjp", "kind": src.kind, "budget": num(B), "dtype": dt, "n": len(x),
               "x": nums(x, dt), "p": nums(p[0]), "grad": nums(g, dt), "dx": nums(dx[0]),
               "tol_dx": nums(tol[0]), "ill_posed": ill, "oracle_err": num(err),
               "within_tol_of_oracle": bool(within), "why": why}


