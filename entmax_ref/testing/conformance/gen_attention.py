"""The generators of the attention files: outputs and gradients of entmax attention, dense and
packed (varlen), from the exact attention (:func:`.exact.attention_exact`) with per-entry
budgets of the tolerance model."""

from __future__ import annotations

import numpy as np

from ..assertions import attention_budgets, attention_grad_tolerances, attention_out_tolerance
from .exact import attention_exact, visible
from .numformat import num, nums
from .sources import ATTN_WHY, Context, attention_problems, attention_vjp_problems, case_rng, in_dtype, varlen_problems


def _arr(a):
    return None if a is None else nums(np.asarray(a, np.float64))


def _params(kw: dict, alpha, D: int) -> dict:
    """The parameter fields shared by the dense and the packed files."""
    return {"alpha": nums(np.asarray(alpha, np.float64)), "scale": num(1.0 / np.sqrt(D)),
            "causal": bool(kw.get("causal", False)), "alibi_slopes": _arr(kw.get("alibi_slopes")),
            "beta": _arr(kw.get("beta")), "gamma": _arr(kw.get("gamma")), "delta": nums(np.asarray(kw.get("delta", 1.0),
                                                                                                  np.float64)),
            "offset": num(kw.get("offset", 1.0))}


def _solve(ctx, q, k, v, kw, alpha, dt, do=None):
    """The exact attention of one dense problem (float64 arrays of dtype ``dt`` values) and
    its budgets: (exact dict, the reference with probability budgets, the keywords used)."""
    B, Hq, Nq, D = q.shape
    kw = {**kw, "scale": 1.0 / np.sqrt(D), "alpha": alpha}
    ex = attention_exact(ctx.oracle, q, k, v, kw, alpha, do)
    masked = np.broadcast_to(~visible(B, Nq, k.shape[2], kw)[:, None], ex["p"].shape)
    ref = attention_budgets(q, k, ex["out"], ex["p"], ex["s"], kw["scale"], masked, dt, kw)
    return ex, ref, kw


def _dense(ctx: Context, problems, grads: bool):
    for case, alpha, dtypes in problems:
        rng = case_rng("grad_out", case.q, case.k, case.v, repr(alpha))
        g = rng.standard_normal(case.q.shape[:3] + (case.v.shape[3],))
        for dt in dtypes:
            q, k, v = (in_dtype(t, dt) for t in (case.q, case.k, case.v))
            kw = case.kwargs
            B, Hq, Nq, D = q.shape
            fields = {"kind": case.name, "dtype": dt,
                      "shape": {"B": B, "Hq": Hq, "Hkv": k.shape[1], "Nq": Nq, "Nk": k.shape[2], "D": D,
                                "Dv": v.shape[3]},
                      "q": nums(q, dt), "k": nums(k, dt), "v": nums(v, dt), **_params(kw, alpha, D),
                      "key_lengths": None if kw.get("key_lengths") is None else [int(i) for i in kw["key_lengths"]],
                      "key_padding_mask": None if kw.get("key_padding_mask") is None
                      else np.asarray(kw["key_padding_mask"], bool).tolist(), "why": ATTN_WHY[case.name]}
            do = in_dtype(g, dt) if grads else None
            ex, ref, kw2 = _solve(ctx, q, k, v, kw, alpha, dt, do)
            if not grads:
                yield {**fields, "out": nums(ex["out"]), "tol_out": _per_row(attention_out_tolerance(ref, v, dt))}
                continue
            tols = attention_grad_tolerances(ref, q, k, v, do, dt, (ex["dq"], ex["dk"], ex["dv"]),
                                             dense=_vjp_dense(ex, do, v, alpha, Hq // k.shape[1]))
            yield {**fields, "grad_out": nums(do, dt), "dq": nums(ex["dq"]), "dk": nums(ex["dk"]),
                   "dv": nums(ex["dv"]), **{f"tol_{n}": _per_row(t) for n, t in zip(("dq", "dk", "dv"), tols)}}


def _per_row(tol: np.ndarray):
    """A tensor's budgets as one bound per row (the largest over its last axis): the model's
    bounds are a row's term plus u |value|, and these files are read by every runner."""
    return nums(np.max(tol, axis=-1, keepdims=True, initial=0.0))


def _vjp_dense(ex, do, v, alpha, rep):
    """(G, dZ) for the gradient budgets: G = dO V^T and dZ = J(p)^T G row by row, in float64
    from the correctly rounded p (the budgets need magnitudes, not the last bit)."""
    p = ex["p"]
    G = np.einsum("bhie,bhje->bhij", do, np.repeat(v, rep, axis=1))
    a = np.broadcast_to(np.asarray(alpha, np.float64).reshape(-1), (p.shape[1],))[None, :, None, None]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        u = np.where(p > 0, np.power(np.where(p > 0, p, 1.0), 2.0 - a), 0.0)
    su = u.sum(axis=-1, keepdims=True)
    dz = u * (G - np.where(su > 0, (u * G).sum(axis=-1, keepdims=True) / np.where(su > 0, su, 1.0), 0.0))
    return G, dz


def gen_attention(ctx: Context):
    """attention.jsonl: entmax attention outputs with per-entry budgets."""
    yield from _dense(ctx, attention_problems(ctx), grads=False)


def gen_attention_vjp(ctx: Context):
    """attention_vjp.jsonl: dq, dk, dv for an upstream grad_out."""
    yield from _dense(ctx, attention_vjp_problems(ctx), grads=True)


def _varlen(ctx: Context, grads: bool):
    """Each packed problem solved sequence by sequence as a dense (1, H, N_s, D) problem."""
    for prob, alpha, dtypes in varlen_problems(ctx):
        cq, ck = prob.cu_seqlens_q, prob.cu_seqlens_k
        g = case_rng("grad_out", prob.q, prob.k, repr(alpha)).standard_normal(prob.q.shape[:2] + (prob.v.shape[2],))
        for dt in dtypes:
            q, k, v = (in_dtype(t, dt) for t in (prob.q, prob.k, prob.v))
            do = in_dtype(g, dt)
            Hq, D, Dv = q.shape[1], q.shape[2], v.shape[2]
            names = ("dq", "dk", "dv") if grads else ("out",)
            res = {"out": np.zeros((q.shape[0], Hq, Dv)), "dq": np.zeros(q.shape), "dk": np.zeros(k.shape),
                   "dv": np.zeros(v.shape)}
            tol = {n_: np.zeros_like(res[n_]) for n_ in res}
            for s in range(len(cq) - 1):
                sq, sk = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
                if sq.stop == sq.start or sk.stop == sk.start:
                    continue  # no queries, or no keys: zero outputs and gradients
                dense = [t[sl].transpose(1, 0, 2)[None] for t, sl in ((q, sq), (k, sk), (v, sk), (do, sq))]
                ex, ref, _ = _solve(ctx, *dense[:3], prob.kwargs, alpha, dt, dense[3] if grads else None)
                if grads:
                    tols = attention_grad_tolerances(ref, *dense, dt, (ex["dq"], ex["dk"], ex["dv"]),
                                                     dense=_vjp_dense(ex, dense[3], dense[2], alpha,
                                                                      Hq // k.shape[1]))
                    parts = dict(zip(names, zip((ex["dq"], ex["dk"], ex["dv"]), tols)))
                else:
                    parts = {"out": (ex["out"], attention_out_tolerance(ref, dense[2], dt))}
                for n_, (val, t) in parts.items():
                    sl = sq if n_ in ("out", "dq") else sk
                    res[n_][sl], tol[n_][sl] = val[0].transpose(1, 0, 2), t[0].transpose(1, 0, 2)
            fields = {"kind": prob.name, "dtype": dt,
                      "shape": {"total_q": q.shape[0], "total_k": k.shape[0], "Hq": Hq, "Hkv": k.shape[1], "D": D,
                                "Dv": Dv},
                      "q": nums(q, dt), "k": nums(k, dt), "v": nums(v, dt), "cu_seqlens_q": list(cq),
                      "cu_seqlens_k": list(ck), **_params(prob.kwargs, alpha, D), "why": ATTN_WHY[prob.name]}
            if grads:
                fields["grad_out"] = nums(do, dt)
            for n_ in names:
                fields[n_], fields["tol_" + n_] = nums(res[n_]), _per_row(tol[n_])
            yield fields


def gen_attention_varlen(ctx: Context):
    """attention_varlen.jsonl: outputs of packed variable-length sequences."""
    yield from _varlen(ctx, grads=False)


def gen_attention_varlen_vjp(ctx: Context):
    """attention_varlen_vjp.jsonl: dq, dk, dv of packed variable-length sequences."""
    yield from _varlen(ctx, grads=True)
