"""Replaying a corpus: each operation's cases against an implementation, as a :class:`CheckReport`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._adapters import from_numpy
from ..assertions import compare
from ..calling import (CallError, attention_grads, attention_signature, caller, guarded_call,
                       positional_capacity, safe_np)
from ..report import CheckReport, CheckRow
from .lines import tolerance, value


def _rows1(case, key, dtype):
    return value(case, key, dtype)[None]


def _expect(case, name, dtype, shape=None):
    """(expected, tolerance) of output ``name``, as float64 arrays reshaped to ``shape``."""
    exp = value(case, name)
    tol = tolerance(case, name, exp, dtype)
    return (exp, tol) if shape is None else (exp.reshape(shape), np.reshape(tol, shape))


def _row_label(case):
    prm = f"budget={case['budget']}" if "budget" in case else f"alpha={case['alpha']}"
    return f"{case.get('tcId', case.get('id'))} {case['kind']} {prm} n={case['n']}"


def _param_caller(fn, data_args, op, form, param):
    """A caller passing the (required) parameter by keyword ``param`` when fn has it (or
    ``**kwargs``), else positionally right after the data."""
    try:
        _, _, var_kw, names = positional_capacity(fn)
    except (TypeError, ValueError):
        names, var_kw = set(), False
    return caller(fn, data_args, op, form, param if (param in names or var_kw) else data_args)


def _dtype_groups(report, cases, dtypes, op, label):
    """The cases by dtype (only ``dtypes``, when given): yields ``(dtype, cases, row)`` with
    a row ``corpus <op>`` added to ``report``, timed until the caller's loop body ends."""
    by_dt: dict = {}
    for c in cases:
        if dtypes is None or c["dtype"] in dtypes:
            by_dt.setdefault(c["dtype"], []).append(c)
    for dt, group in by_dt.items():
        row = CheckRow(f"corpus {op}", label, dt)
        report.rows.append(row)
        t0 = time.perf_counter()
        yield dt, group, row
        row.seconds = time.perf_counter() - t0


def _replay_rows(cases, fn, op, form, data_args, compute, label, framework, device, dtypes, param=None):
    """Shared loop of the row replays: one CheckRow per dtype; ``compute(call, case, dt)``
    returns (got, expected, tol) arrays or None (skipped).  ``param`` (normmax's "alpha",
    "budget") names a required parameter taken from the case; by default alpha is passed
    as :func:`calling.caller` does."""
    report = CheckReport()
    for dt, group, row in _dtype_groups(report, cases, dtypes, op, label):
        try:
            call = (caller(fn, data_args, f"corpus {op}", form) if param is None
                    else _param_caller(fn, data_args, f"corpus {op}", form, param))
        except CallError as exc:
            row.fail(str(exc))
            continue
        skipped = 0
        for c in group:
            def run(*arrays):
                res = guarded_call(row, call, *(from_numpy(a, framework, device) for a in arrays),
                           alpha=float(value(c, param or "alpha")))
                return None if res is None else safe_np(row, res)

            out = compute(run, c, dt)
            if out is None:
                skipped += 1
                continue
            if out is False:
                continue
            for what, got, exp, tol in out:
                cmp = compare(got, exp, tol, np.dtype(dt), name=what)
                row.judge(cmp, what, _row_label(c), c["why"])
        if skipped:
            row.note(f"{skipped} ill-posed case(s) not compared")
    return report


def replay_entmax(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        return [("p", got, *_expect(c, "p", dt, (1, -1)))]

    return _replay_rows(corpus.cases["entmax.jsonl"], fn, "entmax", "fn(x, alpha)", 1, compute, **kw)


def replay_threshold(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        return [("tau", got.reshape(-1), *_expect(c, "tau", dt, (-1,)))]

    return _replay_rows(corpus.cases["entmax.jsonl"], fn, "threshold", "fn(x, alpha)", 1, compute, **kw)


def replay_entmax_vjp(corpus, fn, *, vjp_inputs="x", **kw):
    if vjp_inputs not in ("x", "p"):
        raise ValueError(f"vjp_inputs must be 'x' or 'p', got {vjp_inputs!r}")

    def compute(run, c, dt):
        if vjp_inputs == "x" and c["ill_posed"]:
            return None
        first = _rows1(c, "x", dt) if vjp_inputs == "x" else _rows1(c, "p", dt)
        got = run(first, _rows1(c, "grad", dt))
        if got is None:
            return False
        return [("dx", got, *_expect(c, "dx", dt, (1, -1)))]

    form = f"fn({vjp_inputs}, grad, alpha)"
    return _replay_rows(corpus.cases["entmax_vjp.jsonl"], fn, "entmax_vjp", form, 2, compute, **kw)


def replay_alpha_vjp(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "p", dt), _rows1(c, "grad", dt))
        if got is None:
            return False
        return [("dalpha", got.reshape(-1), *_expect(c, "dalpha", dt, (-1,)))]

    return _replay_rows(corpus.cases["entmax_alpha_vjp.jsonl"], fn, "entmax_alpha_vjp", "fn(p, grad, alpha)",
                        2, compute, **kw)


def replay_loss(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt), np.array([c["target"]]))
        if got is None:
            return False
        return [("loss", got.reshape(-1), *_expect(c, "loss", dt, (-1,)))]

    return _replay_rows(corpus.cases["entmax_loss.jsonl"], fn, "entmax_loss", "fn(x, target, alpha)", 2,
                        compute, **kw)


def replay_family(corpus, fn, *, op, vjp_inputs="x", **kw):
    """normmax / normmax_threshold / budget_sparsemax and their VJPs."""
    if vjp_inputs not in ("x", "p"):
        raise ValueError(f"vjp_inputs must be 'x' or 'p', got {vjp_inputs!r}")
    param = "budget" if op.startswith("budget") else "alpha"
    vjp = op.endswith("_vjp")
    file = (op[:-4] if vjp else op.replace("_threshold", "")) + ("_vjp" if vjp else "") + ".jsonl"

    def compute(run, c, dt):
        if vjp:
            if vjp_inputs == "x" and c["ill_posed"]:
                return None
            got = run(_rows1(c, vjp_inputs, dt), _rows1(c, "grad", dt))
            return False if got is None else [("dx", got, *_expect(c, "dx", dt, (1, -1)))]
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        if op == "normmax_threshold":
            return [("tau", got.reshape(-1), *_expect(c, "tau", dt, (-1,)))]
        return [("p", got, *_expect(c, "p", dt, (1, -1)))]

    first = vjp_inputs if vjp else "x"
    form = f"fn({first}, grad, {param})" if vjp else f"fn(x, {param})"
    return _replay_rows(corpus.cases[file], fn, op, form, 2 if vjp else 1, compute, param=param, **kw)


def replay_scale(corpus, fn, *, label, framework="numpy", device=None, dtypes=None):
    report = CheckReport()
    row = CheckRow("corpus asentmax_scale", label, "float64")
    report.rows.append(row)
    t0 = time.perf_counter()
    for c in corpus.cases["asentmax_scale.jsonl"]:
        args = [c["n"]] + [float(value(c, k)) for k in ("beta", "gamma", "delta", "offset")]
        res = guarded_call(row, fn, *args)
        got = None if res is None else safe_np(row, res)
        if got is None:
            continue
        cmp = compare(got.reshape(-1), *_expect(c, "s", "float64", (-1,)), np.float64, name="s")
        row.judge(cmp, "s", f"n={c['n']} beta={c['beta']} gamma={c['gamma']}")
    row.seconds = time.perf_counter() - t0
    return report


def _attn_args(c):
    dt = c["dtype"]
    q, k, v = (value(c, n, dt) for n in ("q", "k", "v"))
    kw: dict[str, Any] = {}
    if c["causal"]:
        kw["causal"] = True
    if c["key_lengths"] is not None:
        kw["key_lengths"] = np.array(c["key_lengths"])
    if c.get("key_padding_mask") is not None:
        kw["key_padding_mask"] = np.array(c["key_padding_mask"], bool)
    if c["alibi_slopes"] is not None:
        kw["alibi_slopes"] = value(c, "alibi_slopes")
    if c["beta"] is not None:
        kw["beta"], kw["gamma"] = value(c, "beta"), value(c, "gamma")
    return q, k, v, kw


def replay_attention(corpus, fn, *, op="attention", label, framework="numpy", device=None, dtypes=None):
    file = "attention.jsonl" if op == "attention" else "attention_vjp.jsonl"
    report = CheckReport()
    for dt, group, row in _dtype_groups(report, corpus.cases[file], dtypes, op, label):
        data = 3 if op == "attention" else 4
        try:
            names, var_kw = attention_signature(fn, data, f"corpus {op}")
        except CallError as exc:
            row.fail(str(exc))
            continue
        for c in group:
            q, k, v, kw = _attn_args(c)
            if "alpha" in names or var_kw:
                kw["alpha"] = float(value(c, "alpha"))
            args = [from_numpy(t, framework, device) for t in (q, k, v)]
            where = f"{c.get('tcId', c.get('id'))} {c['kind']} alpha={c['alpha']}"
            if op == "attention":
                res = guarded_call(row, fn, *args, **kw)
                got = None if res is None else safe_np(row, res)
                if got is None:
                    continue
                checks = [("out", got, *_expect(c, "out", dt))]
            else:
                got = attention_grads(row, fn, from_numpy(value(c, "grad_out", dt), framework, device), *args, **kw)
                if got is None:
                    continue
                checks = [(n, g, *_expect(c, n, dt)) for n, g in zip(("dq", "dk", "dv"), got)]
            for what, got_, exp, tol in checks:
                cmp = compare(got_, exp, tol, np.dtype(dt), name=what)
                row.judge(cmp, what, where, c["why"])
    return report
