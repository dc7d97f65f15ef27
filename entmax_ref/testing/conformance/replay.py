"""Replaying a corpus: each operation's cases against an implementation, as a :class:`CheckReport`
with a record per case and output (:mod:`entmax_ref.testing.report`).

Every field a file holds is judged by its tolerance class when the implementation returns it:
p, tau and support of the row files (a function that returns p alone has its support counted
from p), the gradients, the loss and its gradient, the ASEntmax scale and its derivatives,
the attention outputs and gradients.  A case whose verdict is ``acceptable`` and whose result
differs is recorded as ``ACCEPTABLE``, not as a failure; a case whose expected outcome is an
error passes when the call raises.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._adapters import from_numpy
from ..assertions import compare
from ..calling import CallError, attention_signature, caller, positional_capacity, raised, safe_np
from ..report import CheckReport, CheckRow
from .lines import tolerance, value

#: per row operation: (the data fields, the parameter, whether the parameter is required,
#: the expected fields in the order the function returns them)
_ROWS = {
    "entmax": (("x",), "alpha", False, ("p", "tau", "support")),
    "threshold": (("x",), "alpha", False, ("tau",)),
    "entmax_batch": (("x",), "alpha", False, ("p", "tau", "support")),
    "entmax_vjp": (("x", "grad"), "alpha", False, ("dx",)),
    "entmax_alpha_vjp": (("p", "grad"), "alpha", False, ("dalpha",)),
    "entmax_loss": (("x", "target"), "alpha", False, ("loss", "grad")),
    "normmax": (("x",), "alpha", True, ("p", "tau", "support")),
    "normmax_threshold": (("x",), "alpha", True, ("tau",)),
    "normmax_vjp": (("x", "grad"), "alpha", True, ("dx",)),
    "budget_sparsemax": (("x",), "budget", True, ("p", "tau", "support")),
    "budget_sparsemax_vjp": (("x", "grad"), "budget", True, ("dx",)),
}


def _alphas_of(case) -> np.ndarray:
    return np.asarray(value(case, "alpha"), np.float64).reshape(-1)


def selected(cases, dtypes=None, alphas=None) -> list:
    """The cases of the given dtypes whose every alpha is one of ``alphas`` (all when None)."""
    want = None if alphas is None else {float(a) for a in alphas}
    return [c for c in cases if (dtypes is None or c["dtype"] in dtypes)
            and (want is None or "alpha" not in c or set(_alphas_of(c).tolist()) <= want)]


def _groups(report, cases, dtypes, alphas, op, label):
    """The selected cases by dtype: yields ``(dtype, cases, row)`` with a row ``corpus <op>``
    added to ``report``, timed until the caller's loop body ends; a row whose every case was
    skipped is a SKIP row, one that compared nothing fails (:meth:`CheckRow.finish`)."""
    chosen = selected(cases, dtypes, alphas)
    by_dt: dict = {}
    for c in chosen:
        by_dt.setdefault(c["dtype"], []).append(c)
    if alphas is not None and not chosen:
        report.rows.append(CheckRow(f"corpus {op}", label, "-", verdict="SKIP",
                                    notes=[f"no case with alpha in {sorted(map(float, alphas))}"]))
    for dt, group in by_dt.items():
        row = CheckRow(f"corpus {op}", label, dt)
        report.rows.append(row)
        t0 = time.perf_counter()
        yield dt, group, row
        row.seconds = time.perf_counter() - t0
        row.case = ""
        if row.cases and not row.failed and all(r["verdict"] == "SKIP" for r in row.cases):
            row.verdict = "SKIP"
            row.notes.insert(0, row.cases[0]["reason"])
        else:
            row.finish()


def _tc(case) -> str:
    return case.get("tcId", case.get("id"))


def judge(row: CheckRow, case: dict, checks, where: str) -> None:
    """Judge one case's ``checks`` ((field, got, expected, bound) each), a record each: a
    difference on an 'acceptable' case is an ACCEPTABLE record and a note, not a failure; the
    support (a count) is judged without entering the row's error figures."""
    dt, acceptable = case["dtype"], case.get("verdict") == "acceptable"
    for name, got, exp, tol in checks:
        if getattr(got, "dtype", None) is not None and got.dtype.kind == "V":  # ml_dtypes' bfloat16
            got = got.astype(np.float64)
        cmp = compare(got, exp, tol, dt, name=name)
        cls = case.get("tol", {}).get(name, "")
        if name != "support":
            row.judge(cmp, name, where, case["why"], tc_id=_tc(case), acceptable=acceptable,
                      budget=f"the corpus's {cls}" if cls else "")
            continue
        row.record(_tc(case), "PASS" if cmp.ok else "ACCEPTABLE" if acceptable else "FAIL", name, cmp, cmp.problem)
        if not cmp.ok:
            msg = f"[{where}] {cmp.describe(name)} ({case['why']})"
            row.note(msg) if acceptable else row.fail(msg, cmp.problem_kind or "tol")


def _call(row: CheckRow, case: dict, call, *args, **kw):
    """``call(*args, **kw)`` as NumPy (a tuple when it returns several), or None with the case
    recorded: PASS when the case expects an error and the call raised, SKIP when it raised
    NotImplementedError, FAIL otherwise (an exception, ``sys.exit()``, a result of None)."""
    row.case = _tc(case)
    try:
        res = call(*args, **kw)
    except NotImplementedError as exc:
        row.skip_case(row.case, f"not implemented: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
        return None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the implementation may raise anything
        if case.get("error") and not isinstance(exc, SystemExit):
            row.measured = True  # the outcome was compared: the error the case expects
            row.record(row.case, "PASS", "error", reason=f"raised {type(exc).__name__} (expected: {case['error']})")
            return None
        row.fail_case(raised(row, exc), "exit" if isinstance(exc, SystemExit) else "raised")
        return None
    if res is None:
        row.fail_case(f"[{row.case}] returned None instead of an array", "None")
        return None
    if isinstance(res, (tuple, list)):  # several results; an info object (it has .tau) stays as it is
        return tuple(r if r is None or hasattr(r, "tau") else safe_np(row, r) for r in res)
    return safe_np(row, res)


def _expected(case, name, dtype):
    """(expected, bound) of field ``name``: a per-row number of a one-row case as shape (1,)."""
    exp = value(case, name)
    exp = exp.reshape(1) if exp.ndim == 0 else exp
    return exp, tolerance(case, name, exp, dtype)


def _param_caller(fn, data_args, op, form, param, required):
    """A caller passing the parameter by keyword ``param`` when fn has it (or ``**kwargs``),
    else positionally right after the data (only when required: fn(x) of a fixed alpha)."""
    if not required:
        return caller(fn, data_args, op, form)
    try:
        _, _, var_kw, names = positional_capacity(fn)
    except (TypeError, ValueError):
        names, var_kw = set(), False
    return caller(fn, data_args, op, form, param if (param in names or var_kw) else data_args)


def _row_outputs(op, res, rows: int):
    """The result's fields by name: p, or a tuple (p, tau[, support]) or (p, info)."""
    names = _ROWS[op][3]
    parts = res if isinstance(res, tuple) else (res,)
    if len(parts) == 2 and parts[1] is not None and hasattr(parts[1], "tau"):  # (p, info) as the library returns
        parts = (parts[0], np.asarray(parts[1].tau), np.asarray(parts[1].support))
    got = {n: np.asarray(v) if n in ("p", "dx", "grad") else np.asarray(v).reshape(-1)
           for n, v in zip(names, parts) if v is not None}
    if "p" in got and "support" in names and "support" not in got:
        got["support"] = (got["p"] > 0).sum(axis=-1).reshape(-1)  # counted from p
    return got


def replay_rows(cases, fn, *, op, label, framework="numpy", device=None, dtypes=None, alphas=None, vjp_inputs="x"):
    """The row operations (:data:`_ROWS`): one row per dtype."""
    data, param, required, _ = _ROWS[op]
    if vjp_inputs == "p" and op.endswith("vjp") and op != "entmax_alpha_vjp":
        data = ("p",) + data[1:]
    form = f"fn({', '.join(data)}, {param})"
    report = CheckReport()
    for dt, group, row in _groups(report, cases, dtypes, alphas, op, label):
        try:
            call = _param_caller(fn, len(data), f"corpus {op}", form, param, required)
        except CallError as exc:
            row.fail(str(exc))
            continue
        for c in group:
            where = f"{c.get('tcId', c.get('id'))} {c['kind']} {param}={c[param]} n={c['n']}"
            if dt == "bfloat16":
                try:
                    value(c, "x", dt)
                except ModuleNotFoundError as exc:
                    row.skip_case(_tc(c), str(exc))
                    continue
            x = value(c, "x", dt)
            rows = x.shape[0] if x.ndim == 2 else 1
            args = [(value(c, d, dt if d in ("x", "grad") else "float64") if d != "target" else np.array([c["target"]]))
                    for d in data]
            args = [a if a.ndim > 1 or d == "target" else a[None] for a, d in zip(args, data)]
            res = _call(row, c, call, *(from_numpy(a, framework, device) for a in args),
                        alpha=value(c, param).reshape(-1) if rows > 1 else float(value(c, param).reshape(-1)[0]))
            if res is None:
                continue
            got = _row_outputs(op, res, rows)
            checks = []
            for name, g in got.items():
                if name in c or name + "_hex" in c:
                    exp, tol = _expected(c, name, dt)
                    checks.append((name, g, exp if exp.ndim != 1 or name not in ("p", "dx", "grad") else exp[None],
                                   tol if np.ndim(tol) != 1 or name not in ("p", "dx", "grad") else tol[None]))
            judge(row, c, checks, where)
    return report


def replay_scale(cases, fn, *, op, label, framework="numpy", device=None, dtypes=None, alphas=None, vjp_inputs="x"):
    """asentmax_scale.jsonl: s, and ds/dbeta, ds/dgamma, ds/ddelta when fn returns them."""
    report = CheckReport()
    for _, group, row in _groups(report, cases, dtypes, None, op, label):
        for c in group:
            args = [c["n"]] + [float(value(c, k)) for k in ("beta", "gamma", "delta", "offset")]
            res = _call(row, c, fn, *args)
            if res is None:
                continue
            parts = res if isinstance(res, tuple) else (res,)
            checks = [(name, np.asarray(g, np.float64).reshape(-1), *_expected(c, name, "float64"))
                      for name, g in zip(("s", "dbeta", "dgamma", "ddelta"), parts) if g is not None]
            judge(row, c, checks, f"{c.get('tcId', c.get('id'))} n={c['n']} beta={c['beta']} gamma={c['gamma']}")
    return report


def _attn_args(c, dt):
    """(data arrays, keywords) of an attention case."""
    names = ("q", "k", "v") + (("cu_seqlens_q", "cu_seqlens_k") if "cu_seqlens_q" in c else ())
    data = [value(c, n, dt) if n in ("q", "k", "v") else np.array(c[n], np.int64) for n in names]
    kw: dict[str, Any] = {}
    if c["causal"]:
        kw["causal"] = True
    for key in ("key_lengths",):
        if c.get(key) is not None:
            kw[key] = np.array(c[key])
    if c.get("key_padding_mask") is not None:
        kw["key_padding_mask"] = np.array(c["key_padding_mask"], bool)
    for key in ("alibi_slopes", "beta", "gamma"):
        if c.get(key) is not None:
            kw[key] = value(c, key)
    if "delta" in c and np.any(value(c, "delta") != 1.0):
        kw["delta"] = value(c, "delta")
    if "offset" in c and float(value(c, "offset")) != 1.0:
        kw["offset"] = float(value(c, "offset"))
    return data, kw


def replay_attention(cases, fn, *, op, label, framework="numpy", device=None, dtypes=None, alphas=None,
                     vjp_inputs="x"):
    """The attention files: out, or (dq, dk, dv); one row per dtype."""
    report = CheckReport()
    grads = op.endswith("_vjp")
    varlen = "varlen" in op
    for dt, group, row in _groups(report, cases, dtypes, alphas, op, label):
        data_n = (5 if varlen else 3) + grads
        try:
            names, var_kw = attention_signature(fn, data_n, f"corpus {op}")
        except CallError as exc:
            row.fail(str(exc))
            continue
        for c in group:
            data, kw = _attn_args(c, dt)
            if "alpha" in names or var_kw:
                a = value(c, "alpha")
                kw["alpha"] = float(a) if a.ndim == 0 else a
            args = [from_numpy(t, framework, device) if i < 3 else t for i, t in enumerate(data)]
            if grads:
                args = [from_numpy(value(c, "grad_out", dt), framework, device)] + args
            res = _call(row, c, fn, *args, **kw)
            if res is None:
                continue
            outs = ("dq", "dk", "dv") if grads else ("out",)
            parts = res[:3] if grads and isinstance(res, tuple) else (res,)
            checks = [(n, g, *_expected(c, n, dt)) for n, g in zip(outs, parts) if g is not None]
            judge(row, c, checks, f"{c.get('tcId', c.get('id'))} {c['kind']} alpha={c['alpha']}")
    return report
