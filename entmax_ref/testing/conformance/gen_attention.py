"""The generators of the attention files: outputs and gradients of entmax attention (float64
reference) with per-entry budgets."""

from __future__ import annotations

import numpy as np

from ..assertions import attention_grad_tolerances, attention_out_tolerance, attention_reference, reference_attention_grads
from .numformat import num, nums
from .sources import ATTN_WHY, DTYPES, Context, attention_problems


def _attn_fields(case, a, dt):
    q, k, v = (t.astype(dt) for t in (case.q, case.k, case.v))
    kw = case.kwargs
    beta, gamma = kw.get("beta"), kw.get("gamma")
    fields = {"alpha": num(a), "dtype": dt, "shape": {"B": q.shape[0], "Hq": q.shape[1], "Hkv": k.shape[1],
                                                      "Nq": q.shape[2], "Nk": k.shape[2], "D": q.shape[3],
                                                      "Dv": v.shape[3]},
              "q": nums(q, dt), "k": nums(k, dt), "v": nums(v, dt), "scale": num(1.0 / np.sqrt(q.shape[3])),
              "causal": bool(kw.get("causal", False)),
              "key_lengths": None if kw.get("key_lengths") is None else [int(i) for i in kw["key_lengths"]],
              "key_padding_mask": None if kw.get("key_padding_mask") is None
              else np.asarray(kw["key_padding_mask"], bool).tolist(),
              "alibi_slopes": None if kw.get("alibi_slopes") is None else nums(np.asarray(kw["alibi_slopes"], float)),
              "beta": None if beta is None else nums(np.asarray(beta, float)),
              "gamma": None if gamma is None else nums(np.asarray(gamma, float)),
              "delta": "1.0", "offset": "1.0"}
    return q, k, v, fields


def gen_attention(ctx: Context):
    """attention.jsonl: entmax attention outputs (float64 reference) with per-entry budgets."""
    for case, a in attention_problems(ctx):
        for dt in DTYPES:
            q, k, v, fields = _attn_fields(case, a, dt)
            ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
            tol = attention_out_tolerance(ref, v, dt)
            yield {"op": "attention", "kind": case.name, **fields, "out": nums(ref.out), "tol_out": nums(tol),
                   "why": ATTN_WHY[case.name]}


def gen_attention_vjp(ctx: Context):
    """attention_vjp.jsonl: dq, dk, dv for an upstream grad_out (float64 reference)."""
    rng = np.random.default_rng([ctx.seed, 22])
    for case, a in attention_problems(ctx):
        g = rng.standard_normal(case.q.shape[:3] + (case.v.shape[3],))
        for dt in DTYPES:
            q, k, v, fields = _attn_fields(case, a, dt)
            do = g.astype(dt)
            q64, k64, v64, do64 = (t.astype(np.float64) for t in (q, k, v, do))
            kw = {kk: vv for kk, vv in case.kwargs.items() if vv is not None}
            exp = reference_attention_grads(do64, q64, k64, v64, alpha=a, **kw)
            ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
            tols = attention_grad_tolerances(ref, q64, k64, v64, do64, dt, exp)
            yield {"op": "attention_vjp", "kind": case.name, **fields, "grad_out": nums(do, dt),
                   "dq": nums(exp[0]), "dk": nums(exp[1]), "dv": nums(exp[2]),
                   "tol_dq": nums(tols[0]), "tol_dk": nums(tols[1]), "tol_dv": nums(tols[2]),
                   "why": ATTN_WHY[case.name]}


