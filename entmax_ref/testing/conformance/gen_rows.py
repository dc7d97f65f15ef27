"""The generators of the entmax row files: entmax, its two VJPs, its loss, and the ASEntmax scale.

Each generator yields one case (a dict of JSON values) at a time; expected values are the
float64 NumPy reference, checked against the 50-digit oracle (:mod:`.exact`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import tolerance as T
from .exact import alpha_vjp_mp, loss_mp, mp_err, vjp_mp
from .numformat import num, nums, roundtrips
from .sources import Context, row_cases



def _ref(ctx: Context, x64, alpha):
    """The float64 reference (p, tau, support) of one row (memoised for one generation)."""
    import entmax_ref as er

    key = (x64.tobytes(), alpha)
    if key not in ctx.refs:
        p, info = er.entmax(x64[None], alpha, backend="numpy", return_info=True)
        ctx.refs[key] = (p[0], float(info.tau[0]), int(info.support[0]))
    p, tau, support = ctx.refs[key]
    return p.copy(), tau, support


def prefill_refs(ctx: Context) -> None:
    """Solve every row case's reference in one call per (n, alpha): a tenth of the time of
    one call per row, and row for row the same numbers (the solver works per row)."""
    import entmax_ref as er

    groups: dict = {}
    for _, a, _, _, x64 in row_cases(ctx):
        key = (x64.tobytes(), a)
        if key not in ctx.refs:
            groups.setdefault((len(x64), a), {})[key] = x64
    for (_, a), rows in groups.items():
        X = np.stack(list(rows.values()))
        p, info = er.entmax(X, a, backend="numpy", return_info=True)
        for i, key in enumerate(rows):
            ctx.refs[key] = (p[i], float(info.tau[i]), int(info.support[i]))




def gen_entmax(ctx: Context):
    """entmax.jsonl: p, tau and support of alpha-entmax (softmax at alpha 1, sparsemax at 2)."""
    mp = ctx.oracle.mp
    for src, a, dt, x, x64 in row_cases(ctx):
        p, tau, support = _ref(ctx, x64, a)
        tol_p = T.entmax_tolerance(p[None], a, dt, masked=np.isneginf(x64)[None])[0]
        tol_tau = float(T.threshold_tolerance(np.array([tau]), a, dt, len(x))[0])
        exact, tau_mp = ctx.oracle.row(x64, a, tau)
        with mp.workdps(50):
            tau_err = 0.0 if not np.isfinite(tau) else float(abs(mp.mpf(tau) - tau_mp))
            per_entry = np.array([float(abs(mp.mpf(float(g)) - e)) for g, e in zip(p, exact)])
        err = float(per_entry.max(initial=0.0))
        budget = T.entmax_tolerance(p[None], a, "float64", masked=np.isneginf(x64)[None])[0]
        within = not (np.any(per_entry > budget) or (np.isfinite(tau) and tau_err > T.threshold_tolerance(
            np.array([tau]), a, "float64", len(x))[0]))
        reaches = err <= T.ORACLE_ATOL
        if not reaches and a <= 2.0:
            raise RuntimeError(f"the float64 reference misses the {T.ORACLE_ATOL:g} contract at alpha={a!r}: "
                               f"x={x64.tolist()!r} (error {err:.3g})")
        case = {"op": "entmax", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
                "p": nums(p), "tau": num(tau), "support": support, "tol_p": nums(tol_p), "tol_tau": num(tol_tau),
                "oracle_err": num(err), "reaches_oracle": bool(reaches), "within_tol_of_oracle": bool(within),
                "why": src.why}
        if not within:
            case["why"] += "; the float64 reference is further from the oracle than its own float64 tolerance"
        if not reaches:
            case["why"] += ("; ill-conditioned (alpha > 2): float64 is within its budget of the 50-digit oracle "
                            "but not within 4e-15")
        roundtrips(case["x"], x, dt)
        yield case





def gen_entmax_vjp(ctx: Context):
    """entmax_vjp.jsonl: dx = J^T grad at x (u = p^(2-alpha): dx = u (grad - <u, grad> / sum u))."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 17])
    for src, a, dt, x, x64 in row_cases(ctx):
        if a > 10.0:
            continue  # u = p^(2 - alpha) overflows float64 on these rows' edge entries
        p, tau, _ = _ref(ctx, x64, a)
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = er.entmax_vjp(p[None], g64[None], a, backend="numpy")
        tol = float(T.vjp_tolerance(p[None], g64[None], dx, a, dt)[0, 0]) if len(x) else 0.0
        from entmax_ref.backends._base import tau_to_theta

        ill = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, dt)[0])
        exact, _ = ctx.oracle.row(x64, a, tau)
        dx_mp = vjp_mp(mp, exact, g64, a)
        err = mp_err(mp, dx[0], dx_mp)
        ill64 = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, "float64")[0])
        tol64 = float(T.vjp_tolerance(p[None], g64[None], dx, a, "float64")[0, 0]) if len(x) else 0.0
        within = ill64 or err <= tol64
        why = src.why + ("; ill-posed gradient (alpha >= 2 with an entry at the threshold): compare only "
                         "implementations that take p" if ill else "")
        yield {"op": "entmax_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "p": nums(p), "grad": nums(g, dt), "dx": nums(dx[0]), "tol_dx": num(tol), "ill_posed": ill,
               "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": why}





def gen_entmax_alpha_vjp(ctx: Context):
    """entmax_alpha_vjp.jsonl: dL/dalpha = sum_i grad_i dp_i/dalpha, float64, rows with n <= 64."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 18])
    for src, a, dt, x, x64 in row_cases(ctx):
        if dt != "float64" or a > 10.0 or len(x) > 64:
            continue
        p, tau, _ = _ref(ctx, x64, a)
        g = rng.standard_normal(len(x))
        da = float(np.asarray(er.entmax_alpha_vjp(p[None], g[None], a, backend="numpy"))[0])
        exact, _ = ctx.oracle.row(x64, a, tau)
        err = float(abs(mp.mpf(da) - alpha_vjp_mp(mp, exact, g, a)))
        tol = float(T.alpha_vjp_tolerance(p[None], g[None], da, a, dt)[0])
        from entmax_ref.backends._base import tau_to_theta

        ill = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, "float64")[0])
        within = ill or err <= tol
        yield {"op": "entmax_alpha_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x),
               "x": nums(x, dt), "p": nums(p), "grad": nums(g), "dalpha": num(da), "tol_dalpha": num(tol),
               "ill_posed": ill, "oracle_err": num(err), "within_tol_of_oracle": bool(within),
               "why": src.why + ("; ill-posed at x (alpha >= 2 with an entry at the threshold): dalpha is "
                                 "exact for the p given, not for x" if ill else "")}





def gen_entmax_loss(ctx: Context):
    """entmax_loss.jsonl: the Fenchel-Young loss for a target class, and its gradient p - onehot."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 19])
    items = []
    for src, a, dt, x, x64 in row_cases(ctx):
        finite = np.flatnonzero(np.isfinite(x64))
        if not len(finite) or len(x) > 64 or a > 10.0:
            continue
        items.append((src, a, dt, x, x64, int(finite[0]) if rng.random() < 0.5 else int(np.argmax(x64))))
    losses: dict = {}  # one call per (n, alpha): the loss is computed row by row
    groups: dict = {}
    for i, it in enumerate(items):
        groups.setdefault((len(it[4]), it[1]), []).append(i)
    for (_, a), idx in groups.items():
        L = er.entmax_loss(np.stack([items[i][4] for i in idx]), np.array([items[i][5] for i in idx]), a,
                           backend="numpy")
        losses.update(zip(idx, np.asarray(L, np.float64).tolist()))
    for i, (src, a, dt, x, x64, target) in enumerate(items):
        loss = losses[i]
        p, tau, _ = _ref(ctx, x64, a)
        onehot = np.eye(len(x))[target]
        grad = p - onehot
        tol = float(T.loss_tolerance(x64[None], p[None], onehot[None], loss, dt)[0])
        tol_g = T.entmax_tolerance(p[None], a, dt)[0] + T.unit_roundoff(np.float64) * np.abs(grad)
        exact, _ = ctx.oracle.row(x64, a, tau)
        err = float(abs(mp.mpf(loss) - loss_mp(mp, exact, x64, target, a)))
        within = err <= float(T.loss_tolerance(x64[None], p[None], onehot[None], loss, "float64")[0])
        yield {"op": "entmax_loss", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "target": target, "loss": num(loss), "tol_loss": num(tol), "grad": nums(grad), "tol_grad": nums(tol_g),
               "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": src.why}


def gen_asentmax_scale(ctx: Context):
    """asentmax_scale.jsonl: s = delta + beta log(n + c)^gamma and ds/dbeta, ds/dgamma, ds/ddelta."""
    import entmax_ref as er

    from ..oracle import mp

    rng = np.random.default_rng([ctx.seed, 20])
    grid = [(n, c) for n in (0, 1, 2, 7, 100, 4095, 1_000_000) for c in (1.0, 0.5, float(np.e) - 1.0)
            if math.log(n + c) > 0]
    for n, c in grid:
        for _ in range(6 if ctx.size == "full" else 2):
            beta = float(rng.choice([0.0, 0.5, 1.0, 2.5, -0.75, float(rng.uniform(0.1, 3))]))
            gamma = float(rng.choice([1.0, 0.5, 2.0, float(rng.uniform(0.2, 3))]))
            delta = float(rng.choice([1.0, 0.0, -0.5]))
            s = float(er.asentmax_scale(n, beta, gamma, delta, c))
            gr = er.asentmax_scale_vjp(1.0, n, beta, gamma, delta, c)
            db, dg, dd = float(gr.dbeta), float(gr.dgamma), float(gr.ddelta)
            with mp.workdps(50):
                L = mp.log(mp.mpf(n) + mp.mpf(c))
                Lg = L ** mp.mpf(gamma)
                s_mp = mp.mpf(delta) + mp.mpf(beta) * Lg
                dg_mp = mp.mpf(beta) * Lg * mp.log(L)
                errs = (float(abs(mp.mpf(s) - s_mp)), float(abs(mp.mpf(db) - Lg)), float(abs(mp.mpf(dg) - dg_mp)))
            tols = T.asentmax_scale_tolerances(n, beta, gamma, delta, c, s, dg)
            if any(e > t for e, t in zip(errs, tols)) or dd != 1.0:
                raise RuntimeError(f"asentmax_scale reference off the oracle: n={n}, beta={beta}, gamma={gamma}")
            yield {"op": "asentmax_scale", "kind": "scale", "dtype": "float64", "n": n, "beta": num(beta),
                   "gamma": num(gamma), "delta": num(delta), "offset": num(c), "s": num(s), "dbeta": num(db),
                   "dgamma": num(dg), "ddelta": num(dd), "tol_s": num(tols[0]), "tol_dbeta": num(tols[1]),
                   "tol_dgamma": num(tols[2]), "tol_ddelta": "0.0", "oracle_err": num(max(errs)),
                   "why": "n = 0 with c = e - 1 (log = 1), c < 1, long contexts, negative beta and delta"
                   if n == 0 else "length-dependent temperature of ASEntmax"}


