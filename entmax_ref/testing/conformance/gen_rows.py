"""The generators of the entmax row files: entmax (one alpha, and rows of several alphas), its
two VJPs, its loss, and the ASEntmax scale.

Each generator yields one case (a dict of JSON values) at a time.  Expected values are the
exact answers correctly rounded (:mod:`.exact`); the ``tol_`` bounds are the library's
tolerance model for an implementation in the case's dtype.
"""

from __future__ import annotations

import math

import numpy as np

from .. import tolerance as T
from .exact import alpha_vjp_exact, at_both, loss_exact, vjp_exact
from .lines import float64_class
from .numformat import num, nums
from .sources import CONSTRUCTED, Context, case_rng, in_dtype, row_cases


def _theta(tau: float, alpha: float) -> float:
    """The backends' x-space threshold (tau = (alpha - 1) theta - 1; theta = tau at alpha 1)."""
    from entmax_ref.backends._base import tau_to_theta

    return float(tau_to_theta(np.array([tau]), np.array([alpha]))[0])


def _solution(ctx: Context, op: str, x64: np.ndarray, a: float, dt: str) -> dict:
    """p, tau and support of one row (the exact answer) and their ``tol_`` bounds.

    tol_support counts the entries whose membership of the support a correct implementation
    in ``dt`` may decide either way: within the threshold's budget of it (alpha > 1), or in
    the support with a probability within its budget of 0 (it may round to 0).  Where the
    float64 p is correctly rounded (:data:`.lines.FLOAT64_CLASSES`) only the second remains,
    for the probabilities that round to 0."""
    ans = ctx.oracle.row(x64, a)
    n = len(x64)
    masked = np.isneginf(x64)
    tol_p = T.entmax_tolerance(ans.p[None], a, dt, masked=masked[None])[0]
    tol_tau = float(T.threshold_tolerance(np.array([ans.tau]), a, dt, n)[0])
    if float64_class(op, {"dtype": dt}, "p"):
        either = ans.on & (ans.p == 0)
    else:
        either = ans.on & (ans.p <= tol_p)
        if a > 1.0 and np.isfinite(ans.theta):
            t = np.where(masked, -np.inf, x64 - ans.theta)
            either |= np.abs(t) <= T.threshold_budget(dt, n) + 2 * T.unit_roundoff(dt) * np.abs(t)
    return {"p": ans.p, "tau": ans.tau, "support": ans.support, "tol_p": tol_p, "tol_tau": tol_tau,
            "tol_support": int(either.sum())}


def _written(sol: dict) -> dict:
    return {"p": nums(sol["p"]), "tau": num(sol["tau"]), "support": sol["support"], "tol_p": nums(sol["tol_p"]),
            "tol_tau": num(sol["tol_tau"]), "tol_support": sol["tol_support"]}


def gen_entmax(ctx: Context):
    """entmax.jsonl: p, tau and support of alpha-entmax (softmax at alpha 1, sparsemax at 2),
    and the rows with NaN or +inf scores (an error)."""
    for src, a, dt, x in row_cases(ctx, nonfinite=True):
        case = {"kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt), "why": src.why,
                "error": None}
        if src.kind == "non-finite":
            case.update(p=nums(np.full(len(x), np.nan)), tau="nan", support=0, tol_p=nums(np.zeros(len(x))),
                        tol_tau="0.0", tol_support=0, error="invalid-input")
        else:
            case.update(_written(_solution(ctx, "entmax", x, a, dt)))
        yield case


def gen_entmax_batch(ctx: Context):
    """entmax_batch.jsonl: rows of one length, each at its own alpha, in one call."""
    rows = [r for r in ctx.rows if len(r.x) == 17 and r.kind in ("random", "ties", "masks", "all-masked")]
    plans = ((1.0, 1.5, 2.0, 3.0), (1.000001, 1.25, 10.0, 1.0), (2.0, 2.0, 1.5, 1.25), (3.0, 1.0, 1.000001, 2.0))
    for i, alphas in enumerate(plans):
        group = [rows[(i + j) % len(rows)] for j in range(len(alphas))]
        for dt in ("float64", "float32"):
            X = np.stack([in_dtype(r.x, dt) for r in group])
            sols = [_solution(ctx, "entmax_batch", x, a, dt) for x, a in zip(X, alphas)]
            case = {"kind": "per-row alpha", "alpha": nums(np.array(alphas)), "dtype": dt, "n": X.shape[1],
                    "x": nums(X, dt), "why": "rows of " + ", ".join(r.kind for r in group) + " at alphas "
                    + ", ".join(f"{a:g}" for a in alphas)}
            for key in ("p", "tau", "tol_p", "tol_tau"):
                case[key] = nums(np.array([s[key] for s in sols]))
            case["support"] = [s["support"] for s in sols]
            case["tol_support"] = [s["tol_support"] for s in sols]
            yield case


def _acceptable(x, tau, a, dt) -> dict:
    """The verdict and flag of a gradient case: 'acceptable' (flag ill-posed) when alpha >= 2
    and an entry sits at the threshold, where the gradient at x is discontinuous."""
    ill = bool(T.ill_posed_rows(x[None], np.array([_theta(tau, a)]), a, dt)[0]) if np.isfinite(tau) else False
    return {"verdict": "acceptable", "extra_flags": ("ill-posed",)} if ill else {}


def gen_entmax_vjp(ctx: Context):
    """entmax_vjp.jsonl: dx = J^T grad at x (u = p^(2-alpha): dx = u (grad - <u, grad> / sum u))."""
    from .. import oracle

    for src, a, dt, x in row_cases(ctx):
        if a > 10.0 or len(x) > 1024:
            continue  # u = p^(2 - alpha) overflows float64 on these rows' edge entries; the long row suffices
        ans = ctx.oracle.row(x, a)
        g = in_dtype(case_rng("grad", x, a, dt).standard_normal(len(x)), dt)
        dx = ctx.oracle.derived(x, a, lambda p, T_, d: vjp_exact(oracle.mp, p, g, a))
        tol = float(T.vjp_tolerance(ans.p[None], g[None], dx[None], a, dt)[0, 0]) if len(x) else 0.0
        yield {"kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt), "p": nums(ans.p),
               "grad": nums(g, dt), "dx": nums(dx), "tol_dx": num(tol), "why": src.why, **_acceptable(x, ans.tau, a, dt)}


def gen_entmax_alpha_vjp(ctx: Context):
    """entmax_alpha_vjp.jsonl: dL/dalpha = sum_i grad_i dp_i/dalpha, float64, rows with n <= 64."""
    from .. import oracle

    for src, a, dt, x in row_cases(ctx):
        if dt != "float64" or a > 10.0 or len(x) > 64:
            continue
        ans = ctx.oracle.row(x, a)
        g = case_rng("alpha grad", x, a).standard_normal(len(x))
        da = float(ctx.oracle.derived(x, a, lambda p, T_, d: alpha_vjp_exact(oracle.mp, p, g, a)))
        tol = float(T.alpha_vjp_tolerance(ans.p[None], g[None], da, a, dt)[0])
        yield {"kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt), "p": nums(ans.p),
               "grad": nums(g), "dalpha": num(da), "tol_dalpha": num(tol), "why": src.why,
               **_acceptable(x, ans.tau, a, dt)}


def gen_entmax_loss(ctx: Context):
    """entmax_loss.jsonl: the Fenchel-Young loss for a target class, and its gradient p - onehot."""
    from .. import oracle

    for src, a, dt, x in row_cases(ctx):
        finite = np.flatnonzero(np.isfinite(x))
        if not len(finite) or len(x) > 64 or a > 10.0:
            continue
        target = int(finite[0]) if case_rng("target", x, a, dt).random() < 0.5 else int(np.argmax(x))
        ans = ctx.oracle.row(x, a)
        mp = oracle.mp
        exact = ctx.oracle.derived(x, a, lambda p, T_, d: [loss_exact(mp, p, x, target, a)]
                                   + [e - (i == target) for i, e in enumerate(p)])
        loss, grad = float(exact[0]), exact[1:]
        onehot = np.eye(len(x))[target]
        tol = float(T.loss_tolerance(x[None], ans.p[None], onehot[None], loss, dt)[0])
        tol_g = T.entmax_tolerance(ans.p[None], a, dt)[0] + T.unit_roundoff(dt) * np.abs(grad)
        yield {"kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt), "target": target,
               "loss": num(loss), "grad": nums(grad), "tol_loss": num(tol), "tol_grad": nums(tol_g), "why": src.why}


def gen_asentmax_scale(ctx: Context):
    """asentmax_scale.jsonl: s = delta + beta log(n + c)^gamma and ds/dbeta, ds/dgamma, ds/ddelta."""
    from .. import oracle

    mp = oracle.mp
    rng = np.random.default_rng([CONSTRUCTED, 20])
    grid = [(n, c) for n in (0, 1, 2, 7, 100, 4095, 1_000_000) for c in (1.0, 0.5, float(np.e) - 1.0)
            if math.log(n + c) > 0]
    for n, c in grid:
        for _ in range(6 if ctx.size == "full" else 2):
            beta = float(rng.choice([0.0, 0.5, 1.0, 2.5, -0.75, float(rng.uniform(0.1, 3))]))
            gamma = float(rng.choice([1.0, 0.5, 2.0, float(rng.uniform(0.2, 3))]))
            delta = float(rng.choice([1.0, 0.0, -0.5]))

            def exact(level):
                L = mp.log(mp.mpf(n) + mp.mpf(c))
                Lg = L ** mp.mpf(gamma)
                return [mp.mpf(delta) + mp.mpf(beta) * Lg, Lg, mp.mpf(beta) * Lg * mp.log(L)]

            s, db, dg = (float(v) for v in at_both(exact))
            tols = T.asentmax_scale_tolerances(n, beta, gamma, delta, c, s, dg)
            yield {"kind": "scale", "dtype": "float64", "n": n, "beta": num(beta), "gamma": num(gamma),
                   "delta": num(delta), "offset": num(c), "s": num(s), "dbeta": num(db), "dgamma": num(dg),
                   "ddelta": "1.0", "tol_s": num(tols[0]), "tol_dbeta": num(tols[1]), "tol_dgamma": num(tols[2]),
                   "tol_ddelta": "0.0", "why": "n = 0: a row that sees no key, log(offset) alone" if n == 0
                   else "length-dependent temperature of ASEntmax"}
