"""Batteries that run a user's callable on the built-in corpus and return a report.

Each ``check_*`` calls the function on every corpus case in every requested dtype,
compares with the float64 reference under the budgets of
:mod:`entmax_ref.testing.tolerance`, checks properties, and returns a :class:`CheckReport`
with one :class:`CheckRow` per dtype.  Nothing raises: an import error, a wrong
signature, an exception or ``sys.exit()`` inside the function, a result of None or of the
wrong shape becomes a failing row with a one-line message, and the other cases still run;
a row that compared nothing fails.

>>> import entmax_ref as er
>>> from entmax_ref.testing import check_entmax
>>> report = check_entmax(lambda x: er.sparsemax(x, backend="numpy"), alpha=2.0, size="quick")
>>> report.ok
True
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from . import tolerance as T
from ._adapters import from_numpy
from ._memo import memo
from .calling import (ALPHA_KEYWORD, CallError, attention_grads, attention_signature, battery_rows, dtype_ok, dtypes_of,
                      guarded_call, rows_of, safe_np)
from .assertions import (
    attention_grad_tolerances,
    attention_out_tolerance,
    attention_reference,
    compare,
    reference_attention_grads,
)
from .corpus import attention_corpus, golden_cases
from .report import CheckReport, CheckRow

__all__ = ["CheckReport", "CheckRow", "check_attention", "check_entmax", "check_entmax_vjp", "check_threshold"]


def _ref(x64, alpha):
    import entmax_ref as er

    return memo("entmax", lambda: er.entmax(x64, alpha, return_info=True, backend="numpy"), x64, alpha=alpha)


# ----------------------------------------------------------------------------- entmax


def check_entmax(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                 name: str | None = None, dtypes=("float64", "float32"),
                 framework: str = "numpy", device: Any = None, size: str = "default", seed: int = 0,
                 masked_rows: bool = True, peer: bool = False) -> CheckReport:
    """Run the alpha-entmax battery on ``fn``.

    ``fn(x)`` or ``fn(x, alpha=...)`` must return alpha-entmax of the (rows, n) array ``x``
    along its last axis, in x's dtype; ``x`` is a ``framework`` array ('numpy', 'torch',
    'jax', 'cupy') on ``device``.  ``alpha_arg`` says how alpha is passed: by keyword
    ``alpha`` when fn has that parameter (the default), by another keyword name, as
    positional argument number ``alpha_arg`` (an int: 1 for ``fn(x, a)``), or not at all
    (None); it is never guessed from positions, so ``fn(x, dim=-1)`` keeps its ``dim``.

    Compared with the reference on every corpus case (random, ties, masks, all-masked
    rows unless ``masked_rows=False``, extreme magnitudes, tiny and long rows) under
    :func:`entmax_ref.testing.tolerance.entmax_tolerance`; properties: output dtype, on the
    simplex, masked entries exactly 0, all-masked rows give zeros, shift invariance,
    permutation equivariance, golden values.
    """
    report = CheckReport()
    a = float(alpha)
    for dt, row, call in battery_rows(report, f"entmax a={a:g}", fn, name, dtypes, peer, 1, "check_entmax",
                                  "fn(x) or fn(x, alpha=...)", alpha_arg):

        def run(x):
            res = guarded_call(row, call, from_numpy(x, framework, device), alpha=a)
            return res, (None if res is None else safe_np(row, res))

        cases = rows_of(size, seed, masked_rows)
        seen_dtype = False
        for case in cases:
            row.case = case.id
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, _ = _ref(x64, a)
            res, got = run(x)
            if got is None:
                continue
            if not seen_dtype:
                seen_dtype = True
                ok_before = row.verdict
                dtype_ok(row, res, dt)
                row.prop("dtype", row.verdict == ok_before or row.verdict == "FAIL" and ok_before == "FAIL",
                         f"got {getattr(res, 'dtype', '?')}")
            tol = T.entmax_tolerance(p, a, dt, masked=np.isneginf(x64))
            cmp = compare(got, p, tol, dt, support=True)
            if not row.judge(cmp, "p", case.id):
                continue
            if case.name == "masks":
                row.prop("masked entries are exactly 0", bool(np.all(got[np.isneginf(x64)] == 0)))
            if case.name == "all-masked":
                row.prop("all-masked rows give zeros", bool(np.all(got == 0)))
            if case.name == "random":
                live = np.isfinite(x64).any(axis=1)
                s = got.astype(np.float64).sum(axis=1)
                row.prop("on the simplex", bool(np.all(got >= 0) and np.all(np.abs(s - 1)[live] <= tol.sum(axis=1)[live])),
                         f"min p {got.min():.3g}, worst |sum - 1| {np.abs(s - 1).max():.3g}")
                shift = np.float64(3.0).astype(dt)
                _, got2 = run(x + shift)
                if got2 is not None:
                    p2, _ = _ref(x64 + float(shift), a)
                    c2 = compare(got2, p2, T.entmax_tolerance(p2, a, dt), dt)
                    row.prop("shift invariance", c2.ok, c2.describe("p(x + 3)"))
                perm = np.random.default_rng(seed + 1).permutation(x.shape[1])
                _, got3 = run(np.ascontiguousarray(x[:, perm]))
                if got3 is not None and got3.shape == got.shape:
                    row.prop("permutation equivariance", bool(np.all(np.abs(got3[:, np.argsort(perm)] - got) <= 2 * tol)))
        row.case = "golden"
        for gx, ga, gp in golden_cases(a):
            res, got = run(gx.astype(dt))
            if got is not None:
                c = compare(got, gp, T.entmax_tolerance(gp, a, dt, masked=np.isneginf(gx)), dt)
                row.prop("golden value", c.ok, f"entmax({gx[0].tolist()}) = {gp[0].tolist()}: {c.describe('p')}")
    return report


def check_threshold(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                    name: str | None = None, dtypes=("float64", "float32"),
                    framework: str = "numpy", device: Any = None, size: str = "default", seed: int = 0,
                    masked_rows: bool = True, peer: bool = False) -> CheckReport:
    """Run the threshold battery: ``fn(x)`` / ``fn(x, alpha=...)`` returns tau per row, shape
    (rows,), in the units p = [(alpha-1) x - tau]_+ ** (1/(alpha-1)) (logsumexp at 1).
    ``alpha_arg`` as in :func:`check_entmax`.

    Compared under :func:`entmax_ref.testing.tolerance.threshold_tolerance`; property:
    the threshold form at the returned tau sums to 1 within the probability budgets
    (support/threshold consistency), and all-masked rows give -inf.
    """
    report = CheckReport()
    a = float(alpha)
    for dt, row, call in battery_rows(report, f"threshold a={a:g}", fn, name, dtypes, peer, 1, "check_threshold",
                                  "fn(x) or fn(x, alpha=...)", alpha_arg):
        for case in rows_of(size, seed, masked_rows):
            row.case = case.id
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, info = _ref(x64, a)
            res = guarded_call(row, call, from_numpy(x, framework, device), alpha=a)
            got = None if res is None else safe_np(row, res)
            if got is None:
                continue
            got = got.reshape(-1) if got.size == len(x) else got
            cmp = compare(got, info.tau, T.threshold_tolerance(info.tau, a, dt, x.shape[1]), dt)
            if not row.judge(cmp, "tau", case.id):
                continue
            if case.name == "random":
                from entmax_ref.backends._base import tau_to_theta

                theta = tau_to_theta(got.astype(np.float64), np.full(len(x), a))
                pp = T.e_alpha(x64 - theta[:, None], a)
                # the envelope of the threshold error the tau budget allows, in x-space units
                slack = T.threshold_tolerance(info.tau, a, dt, x.shape[1]) / (a - 1 if a > 1 else 1.0)
                budget = T.entmax_tolerance(p, a, dt, extra_delta=slack).sum(axis=1)
                row.prop("support/threshold consistency", bool(np.all(np.abs(pp.sum(axis=1) - 1) <= budget)),
                         f"worst |sum p(tau) - 1| {np.abs(pp.sum(axis=1) - 1).max():.3g}")
            if case.name == "all-masked":
                row.prop("all-masked rows give -inf", bool(np.all(np.isneginf(got))))
    return report


# ----------------------------------------------------------------------------- VJP


def check_entmax_vjp(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                     inputs: str = "x", name: str | None = None,
                     dtypes=("float64", "float32"), framework: str = "numpy", device: Any = None,
                     size: str = "default", seed: int = 0, masked_rows: bool = True,
                     peer: bool = False) -> CheckReport:
    """Run the VJP battery on ``fn``.

    ``inputs="x"``: ``fn(x, grad)`` / ``fn(x, grad, alpha=...)`` returns the gradient of
    ``sum(grad * entmax(x, alpha))`` w.r.t. x (what autograd gives).  ``inputs="p"``:
    ``fn(p, grad, alpha=...)`` takes the forward's output instead (like
    :func:`entmax_ref.entmax_vjp`).  ``alpha_arg`` as in :func:`check_entmax` (2 for
    ``fn(p, grad, a)``).  Compared under
    :func:`entmax_ref.testing.tolerance.vjp_tolerance`; rows whose gradient is ill-posed
    (alpha >= 2 and an entry at the threshold) are counted in the notes, not compared.
    Properties: rows of the VJP sum to 0 (J 1 = 0), the Jacobian built from VJPs is
    symmetric, and (float64) agreement with central finite differences of the reference.
    """
    import entmax_ref as er

    if inputs not in ("x", "p"):
        raise ValueError(f"inputs must be 'x' or 'p', got {inputs!r}")
    report = CheckReport()
    a = float(alpha)
    rng = np.random.default_rng(seed + 7)
    form = "fn(x, grad) or fn(x, grad, alpha=...)" if inputs == "x" else "fn(p, grad) or fn(p, grad, alpha=...)"
    for dt, row, call in battery_rows(report, f"vjp a={a:g}", fn, name, dtypes, peer, 2, "check_entmax_vjp", form,
                                  alpha_arg):

        def vjp(x, g, p):
            first = x if inputs == "x" else p
            res = guarded_call(row, call, from_numpy(first, framework, device), from_numpy(g, framework, device),
                               alpha=a)
            return None if res is None else safe_np(row, res)

        skipped = 0
        for case in rows_of(size, seed, masked_rows):
            row.case = case.id
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, info = _ref(x64, a)
            g = rng.standard_normal(x.shape).astype(dt)
            pin = p.astype(dt)
            p_used = pin.astype(np.float64) if inputs == "p" else p
            dx = er.entmax_vjp(p_used, g.astype(np.float64), a, backend="numpy")
            got = vjp(x, g, pin)
            if got is None:
                continue
            tol = T.vjp_tolerance(p_used, g, dx, a, dt)
            if inputs == "x":
                from entmax_ref.backends._base import tau_to_theta

                bad = T.ill_posed_rows(x64, tau_to_theta(info.tau, np.full(len(x), a)), a, dt)
                skipped += int(bad.sum())
                tol = np.where(bad[:, None], np.inf, tol)
            cmp = compare(got, dx, tol, dt)
            if not row.judge(cmp, "dx", case.id):
                continue
            if case.name == "random":
                s = got.astype(np.float64).sum(axis=1)
                row.prop("rows sum to 0 (J 1 = 0)", bool(np.all(np.abs(s) <= tol.sum(axis=1))),
                         f"worst |sum| {np.abs(s).max():.3g}")
        # the Jacobian from n VJPs is symmetric
        row.case = "jacobian"
        xs = np.random.default_rng(seed + 3).standard_normal((1, 6)).astype(dt)
        xs64 = xs.astype(np.float64)
        ps, _ = _ref(xs64, a)
        eye = np.eye(6, dtype=dt)
        cols = [vjp(xs, eye[i:i + 1], ps.astype(dt)) for i in range(6)]
        if all(c is not None and c.shape == (1, 6) for c in cols):
            J = np.concatenate(cols).astype(np.float64)
            tolJ = T.vjp_tolerance(np.repeat(ps, 6, 0), eye, J, a, dt)
            row.prop("Jacobian is symmetric", bool(np.all(np.abs(J - J.T) <= 2 * tolJ)),
                     f"max |J - J^T| {np.abs(J - J.T).max():.3g}")
        if dt == np.float64:
            # central differences of the (exact) reference forward, h = eps^(1/3)
            row.case = "finite differences"
            xf = np.random.default_rng(seed + 5).standard_normal((3, 7))
            gf = np.random.default_rng(seed + 6).standard_normal((3, 7))
            pf, _ = _ref(xf, a)
            h = np.finfo(np.float64).eps ** (1 / 3)
            fd = np.empty_like(xf)
            for j in range(xf.shape[1]):
                e = np.zeros_like(xf)
                e[:, j] = h
                fd[:, j] = ((_ref(xf + e, a)[0] - _ref(xf - e, a)[0]) * gf).sum(axis=1) / (2 * h)
            got = vjp(xf, gf, pf)
            if got is not None and got.shape == fd.shape:
                # truncation h^2/6 |f'''| + rounding eps/h, with |f'''| <= 1e2 on these rows
                budget = 1e2 * h * h + 4 * np.finfo(np.float64).eps / h
                row.prop("finite differences", bool(np.all(np.abs(got - fd) <= budget * (1 + np.abs(gf).max()))),
                         f"max |vjp - fd| {np.abs(got - fd).max():.3g}")
        if skipped:
            row.note(f"{skipped} ill-posed row(s) not compared (alpha >= 2 with an entry at the threshold)")
    return report


# ----------------------------------------------------------------------------- attention


def _attn_kwargs(case, alpha, names, var_kw, alpha_arg):
    kw = {k: v for k, v in case.kwargs.items() if v is not None and v is not False}
    if alpha_arg is not None and (alpha_arg in names or var_kw):
        kw[alpha_arg] = alpha
    return kw


def check_attention(fn: Callable | None, alpha: float = 1.5, *, alpha_arg: str | None = ALPHA_KEYWORD,
                    vjp: Callable | None = None, name: str | None = None, features=("causal", "gqa", "cross"),
                    dtypes=("float64", "float32"), framework: str = "numpy",
                    device: Any = None, size: str = "default", seed: int = 0, peer: bool = False) -> CheckReport:
    """Run the attention battery.

    ``fn(q, k, v, **kw)`` returns the (B, Hq, Nq, Dv) output of entmax attention; ``kw``
    holds alpha under the keyword ``alpha_arg`` (default ``alpha``, when fn has that
    parameter or ``**kwargs``; None: never passed) and what the case uses: ``causal=True``,
    ``key_lengths``, ``alibi_slopes``, ``beta``/``gamma`` (see
    :func:`entmax_ref.testing.corpus.attention_corpus` and ``features``).  The scale is
    left to fn's default, which must be 1/sqrt(D); causal masking is bottom-right aligned.
    ``vjp(grad_out, q, k, v, **kw)`` (optional) returns ``(dq, dk, dv)``.

    Compared under the budgets of tolerance formula 5.  Properties: output dtype, rows
    with no key give zeros (with "key_lengths"), grouped-query heads equal repeated k/v
    (with "gqa").
    """
    report = CheckReport()
    a = float(alpha)
    label = name or getattr(fn if fn is not None else vjp, "__name__", "fn")
    cases = attention_corpus(size, seed, features)
    rng = np.random.default_rng(seed + 11)
    grads_out = {id(c): rng.standard_normal(c.q.shape[:3] + (c.v.shape[3],)) for c in cases}
    jobs = [(f, op) for f, op in ((fn, "attention"), (vjp, "attention vjp")) if f is not None]
    for f, op in jobs:
        for dt in dtypes_of(dtypes):
            row = CheckRow(f"{op} a={a:g}", label, dt.name, peer=peer)
            report.rows.append(row)
            t0 = time.perf_counter()
            data = 4 if op == "attention vjp" else 3
            try:
                if isinstance(alpha_arg, int):
                    raise CallError(f"check_attention passes alpha by keyword; alpha_arg must be a name or None, "
                                     f"got {alpha_arg!r}")
                names, var_kw = attention_signature(f, data, f"check_attention ({op})")
            except CallError as exc:
                row.fail(str(exc), "call")
                continue
            first = True
            for case in cases:
                row.case = case.name
                q, k, v = (t.astype(dt) for t in (case.q, case.k, case.v))
                kw = _attn_kwargs(case, a, names, var_kw, alpha_arg)
                ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
                args = [from_numpy(t, framework, device) for t in (q, k, v)]
                if op == "attention":
                    res = guarded_call(row, f, *args, **kw)
                    got = None if res is None else safe_np(row, res)
                    if got is None:
                        continue
                    if first:
                        first = False
                        before = row.verdict
                        dtype_ok(row, res, dt)
                        row.prop("dtype", row.verdict == before, f"got {getattr(res, 'dtype', '?')}")
                    cmp = compare(got, ref.out, attention_out_tolerance(ref, v, dt), dt)
                    if not row.judge(cmp, "out", case.name):
                        continue
                    if case.name == "key_lengths":
                        kl = np.asarray(case.kwargs["key_lengths"])
                        row.prop("no keys gives a zero output", bool(np.all(got[kl == 0] == 0)))
                    if case.name == "gqa":
                        rep = q.shape[1] // k.shape[1]
                        k2, v2 = (from_numpy(np.repeat(t, rep, axis=1), framework, device) for t in (k, v))
                        res2 = guarded_call(row, f, args[0], k2, v2, **kw)
                        got2 = None if res2 is None else safe_np(row, res2)
                        if got2 is not None:
                            row.prop("grouped heads equal repeated k, v", bool(np.all(np.abs(got2 - got) <= 2 * (
                                attention_out_tolerance(ref, v, dt)))))
                else:
                    do = grads_out[id(case)].astype(dt)
                    got = attention_grads(row, f, from_numpy(do, framework, device), *args, **kw)
                    if got is None:
                        continue
                    q64, k64, v64, do64 = (t.astype(np.float64) for t in (q, k, v, do))
                    exp = reference_attention_grads(do64, q64, k64, v64, alpha=a, **case.kwargs)
                    tols = attention_grad_tolerances(ref, q64, k64, v64, do64, dt, exp)
                    for gname, g_act, g_exp, tol in zip(("dq", "dk", "dv"), got, exp, tols):
                        cmp = compare(g_act, g_exp, tol, dt, name=gname)
                        row.judge(cmp, gname, case.name)
                    if case.name == "key_lengths" and len(got) == 3 and got[0].shape == q.shape:
                        kl = np.asarray(case.kwargs["key_lengths"])
                        row.prop("no keys gives zero gradients", bool(np.all(got[0][kl == 0] == 0)))
            row.seconds = time.perf_counter() - t0
            row.finish()
    return report
