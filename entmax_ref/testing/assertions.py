"""Assertions that compare an implementation's results with the float64 reference.

Each ``assert_*`` takes the *actual* result (NumPy, CuPy, PyTorch, JAX, DLPack or
``__array__``) and the *inputs*; it computes the reference itself, in float64 on the NumPy
backend, and judges the difference by the budgets of :mod:`entmax_ref.testing.tolerance`
(computed for the dtype of ``actual``).  On failure the AssertionError names the worst
row and entry, the expected and actual values, the support difference, and ends with a
snippet that reproduces the worst row.

>>> import numpy as np
>>> from entmax_ref.testing import assert_entmax_close
>>> _ = assert_entmax_close(np.array([0.0, 0.25, 0.75]), [-2.0, 0.0, 0.5], alpha=2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import tolerance as T
from ._memo import memo
from ._adapters import dtype_of, to_numpy

__all__ = [
    "Comparison",
    "assert_attention_close",
    "assert_attention_grads_close",
    "assert_entmax_close",
    "assert_entmax_vjp_close",
    "assert_threshold_close",
    "compare",
]

_FLOAT64 = np.dtype(np.float64)


@dataclass
class Comparison:
    """The outcome of comparing ``actual`` with ``expected`` entry by entry.

    ``ulps`` is ``|actual - expected| / (eps * max(1, |expected|))`` with eps of the
    compared dtype: ulps of 1 for probabilities, relative ulps for large values.
    """

    ok: bool
    max_abs: float
    max_ulps: float
    n_bad: int
    #: index of the entry that uses the largest fraction of its tolerance (the one that
    #: exceeds it by the largest ratio when not ok); None when nothing was compared
    worst: tuple | None
    worst_row: int | None
    expected: float | None = None  #: at ``worst``
    actual: float | None = None  #: at ``worst``
    tol: float | None = None  #: at ``worst``
    support_diff: int = 0  #: entries that are zero in one and nonzero in the other
    #: the tolerance, in the same ulps, at the entry that uses the largest fraction of its
    #: own tolerance (the smallest tolerance when every entry is exact)
    tol_ulps: float = 0.0
    #: the largest ``|actual - expected| / tol`` (1 is the edge of the budget)
    used: float = 0.0
    problem: str = ""  #: a shape/dtype/type problem found before comparing
    #: what the problem is about: "shape", "dtype" or "type" ("" without one)
    problem_kind: str = ""
    #: index of the largest absolute error, and the tolerance there
    abs_at: tuple | None = None
    abs_tol: float | None = None
    extra: dict = field(default_factory=dict)

    def describe(self, what: str = "result") -> str:
        if self.problem:
            return self.problem
        if self.ok:
            return f"{what} within tolerance (max abs error {self.max_abs:.3g}, {self.max_ulps:.3g} ulps)"
        return (f"{self.n_bad} entr{'y' if self.n_bad == 1 else 'ies'} of {what} out of tolerance; worst at "
                f"index {self.worst} (row {self.worst_row}): expected {self.expected!r}, got {self.actual!r}, "
                f"|diff| = {abs(self.actual - self.expected):.3g} > tol {self.tol:.3g}; max abs error "
                f"{self.max_abs:.3g} ({self.max_ulps:.3g} ulps); support differs in {self.support_diff} entr"
                f"{'y' if self.support_diff == 1 else 'ies'}")


def _eps(dtype) -> float:
    return 2 * T.unit_roundoff(dtype)


def _refused(problem: str, kind: str) -> Comparison:
    return Comparison(False, np.inf, np.inf, -1, None, None, problem=problem, problem_kind=kind)


def compare(actual: Any, expected: np.ndarray, tol: np.ndarray, dtype=None, *, support: bool = False,
            name: str = "result") -> Comparison:
    """Compare entrywise: ``|actual - expected| <= tol``; NaN and shape errors fail.
    ``actual`` must have exactly ``expected``'s shape (the same number of entries in
    another shape is a shape error, not a reshape)."""
    try:
        a = to_numpy(actual, name)
    except TypeError as exc:
        return _refused(str(exc), "type")
    dtype = dtype or a.dtype
    e = np.asarray(expected, np.float64)
    if a.shape != e.shape:
        return _refused(f"{name} has shape {a.shape}, expected {e.shape}", "shape")
    if a.dtype.kind not in "fiu" and a.dtype != np.bool_:
        return _refused(f"{name} has dtype {a.dtype}, expected a real floating array", "dtype")
    a64 = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same_inf = (a64 == e) & np.isinf(e)
        diff = np.where(same_inf, 0.0, np.abs(a64 - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    tol = np.broadcast_to(np.asarray(tol, np.float64), e.shape)
    bad = diff > tol
    scale = _eps(dtype) * np.maximum(1.0, np.where(np.isfinite(e), np.abs(e), 1.0))
    ulps = diff / scale
    sdiff = int(((a64 != 0) != (e != 0)).sum()) if support else 0
    max_abs = float(diff.max(initial=0.0))
    max_ulps = float(ulps.max(initial=0.0))
    if not diff.size:
        return Comparison(True, max_abs, max_ulps, 0, None, None, support_diff=sdiff)
    with np.errstate(divide="ignore", invalid="ignore"):
        # the fraction of its tolerance each entry uses: inf beyond a zero tolerance
        frac = np.where(diff > 0, diff / tol, 0.0)
        frac = np.where(np.isnan(frac), np.inf, frac)
        budget = tol / scale
    at = int(np.argmax(frac)) if frac.max() > 0 else int(np.argmin(budget))
    idx = np.unravel_index(at, e.shape)
    big = np.unravel_index(int(np.argmax(diff)), e.shape)
    row = int(np.ravel_multi_index(idx[:-1], e.shape[:-1])) if e.ndim > 1 else 0
    return Comparison(not bad.any(), max_abs, max_ulps, int(bad.sum()), tuple(int(i) for i in idx), row,
                      float(e[idx]), float(a64[idx]), float(tol[idx]), sdiff, tol_ulps=float(budget.flat[at]),
                      used=float(frac.flat[at]), abs_at=tuple(int(i) for i in big), abs_tol=float(tol[big]))


def _fmt(a: np.ndarray) -> str:
    return np.array2string(np.asarray(a), separator=", ", precision=17, floatmode="maxprec",
                           threshold=10_000, max_line_width=100).replace("inf", "np.inf")


def _fail(cmp: Comparison, what: str, snippet: str):
    __tracebackhide__ = True
    raise AssertionError(f"{cmp.describe(what)}\n\nReproduce the worst row:\n{snippet}")


def _rows(x, axis):
    """(x moved to have ``axis`` last, its (rows, n) view, x's shape as given)."""
    x = np.asarray(to_numpy(x, "x"))
    shape = x.shape
    if x.ndim == 0:
        x = x.reshape(1)
    moved = np.moveaxis(x, axis, -1)
    return moved, moved.reshape(-1, moved.shape[-1]) if moved.shape[-1] else moved.reshape(-1, 0), shape


def _laid_out(actual, name, shape, axis, rows_shape):
    """``actual``, which must have ``shape`` exactly (x's, or x's without ``axis``: the same
    number of entries in another shape is no answer), in the reference's layout
    ``rows_shape``; else the Comparison that refuses it."""
    a = to_numpy(actual, name)
    if a.shape != tuple(shape):
        return None, _refused(f"{name} has shape {a.shape}, expected {tuple(shape)}", "shape")
    if len(rows_shape) == 2:  # a full row layout: move the axis last first
        a = np.moveaxis(a.reshape(1) if a.ndim == 0 else a, axis, -1)
    return a.reshape(rows_shape), None


def _alpha_rows(alpha, batch_shape):
    return np.ascontiguousarray(np.broadcast_to(np.asarray(alpha, np.float64), batch_shape)).reshape(-1)


def _reference_entmax(x2d, a_rows):
    import entmax_ref as er

    return er.entmax(x2d.astype(np.float64), a_rows, return_info=True, backend="numpy")


def assert_entmax_close(actual, x, alpha=1.5, axis=-1, *, factor=1.0, atol=0.0, rtol=0.0, dtype=None):
    """Assert ``actual`` equals alpha-entmax(x) along ``axis`` within the budget of
    :func:`entmax_ref.testing.tolerance.entmax_tolerance` (for ``actual``'s dtype, or
    ``dtype``), times ``factor``, plus ``atol + rtol * |expected|``.  ``actual`` must have
    x's shape; -inf entries of x must be exactly 0.

    >>> from entmax_ref.testing import assert_entmax_close
    >>> _ = assert_entmax_close([0.5, 0.5], [1.0, 1.0], alpha=3)
    """
    __tracebackhide__ = True
    moved, x2, shape = _rows(x, axis)
    a_rows = _alpha_rows(alpha, moved.shape[:-1])
    p, _ = _reference_entmax(x2, a_rows)
    dtype = dtype or dtype_of(actual)
    act, cmp = _laid_out(actual, "actual", shape, axis, x2.shape)
    if cmp is None:
        tol = T.entmax_tolerance(p, a_rows, dtype, masked=np.isneginf(x2), factor=factor) + atol + rtol * np.abs(p)
        cmp = compare(act, p, tol, dtype, support=True, name="actual")
    if not cmp.ok:
        r = cmp.worst_row or 0
        snippet = (f"import numpy as np, entmax_ref as er\nx = np.array({_fmt(x2[r])}, dtype=np.{x2.dtype})\n"
                   f"er.entmax(x.astype(np.float64), alpha={a_rows[r]!r})  # expected\n"
                   f"# actual: {_fmt(act[r]) if cmp.worst else 'see above'}")
        _fail(cmp, f"entmax(alpha={a_rows[r]!r})", snippet)
    return cmp


def assert_threshold_close(actual_tau, x, alpha=1.5, axis=-1, *, factor=1.0, atol=0.0, dtype=None):
    """Assert ``actual_tau`` (x's shape without ``axis``) is the entmax threshold tau, in
    the units p = [(alpha-1) x - tau]_+ ** (1/(alpha-1)) (logsumexp at alpha = 1), within
    :func:`entmax_ref.testing.tolerance.threshold_tolerance`.

    >>> from entmax_ref.testing import assert_threshold_close
    >>> _ = assert_threshold_close(-0.25, [-2.0, 0.0, 0.5], alpha=2)
    """
    __tracebackhide__ = True
    moved, x2, shape = _rows(x, axis)
    a_rows = _alpha_rows(alpha, moved.shape[:-1])
    _, info = _reference_entmax(x2, a_rows)
    tau = np.asarray(info.tau, np.float64).reshape(-1)
    dtype = dtype or dtype_of(actual_tau)
    act, cmp = _laid_out(actual_tau, "actual_tau", moved.shape[:-1] if shape else (), axis, tau.shape)
    if cmp is None:
        tol = T.threshold_tolerance(tau, a_rows, dtype, x2.shape[1], factor=factor) + atol
        cmp = compare(act, tau, tol, dtype, name="tau")
    if not cmp.ok:
        r = cmp.worst[0] if cmp.worst else 0
        snippet = (f"import numpy as np, entmax_ref as er\nx = np.array({_fmt(x2[r])}, dtype=np.{x2.dtype})\n"
                   f"er.entmax_threshold(x.astype(np.float64), alpha={a_rows[r]!r})  # expected {tau[r]!r}")
        _fail(cmp, "tau", snippet)
    return cmp


def assert_entmax_vjp_close(actual_dx, x, grad, alpha=1.5, axis=-1, *, factor=1.0, atol=0.0, dtype=None):
    """Assert ``actual_dx`` (x's shape) is the gradient of ``sum(grad * entmax(x, alpha))``
    w.r.t. x, within :func:`entmax_ref.testing.tolerance.vjp_tolerance`.

    >>> from entmax_ref.testing import assert_entmax_vjp_close
    >>> _ = assert_entmax_vjp_close([0.0, 0.5, -0.5], [-2.0, 0.0, 0.5], [0.0, 1.0, 0.0], alpha=2)
    """
    __tracebackhide__ = True
    import entmax_ref as er

    moved, x2, shape = _rows(x, axis)
    _, g2, _ = _rows(grad, axis)
    a_rows = _alpha_rows(alpha, moved.shape[:-1])
    p, _ = _reference_entmax(x2, a_rows)
    dx = er.entmax_vjp(p, g2.astype(np.float64), a_rows, backend="numpy")
    dtype = dtype or dtype_of(actual_dx)
    act, cmp = _laid_out(actual_dx, "actual_dx", shape, axis, x2.shape)
    if cmp is None:
        tol = T.vjp_tolerance(p, g2, dx, a_rows, dtype, factor=factor) + atol
        cmp = compare(act, dx, tol, dtype, name="dx")
    if not cmp.ok:
        r = cmp.worst_row or 0
        snippet = (f"import numpy as np, entmax_ref as er\nx = np.array({_fmt(x2[r])})\n"
                   f"g = np.array({_fmt(g2[r])})\np = er.entmax(x, alpha={a_rows[r]!r})\n"
                   f"er.entmax_vjp(p, g, alpha={a_rows[r]!r})  # expected")
        _fail(cmp, "dx", snippet)
    return cmp


# ----------------------------------------------------------------------------- attention


@dataclass
class AttentionReference:
    """Dense float64 reference of one attention problem, with per-entry budgets."""

    out: np.ndarray
    p: np.ndarray  #: (B, Hq, Nq, Nk)
    tol_p: np.ndarray
    delta: np.ndarray  #: (B, Hq, Nq) x-space budget per query row
    s: np.ndarray  #: (B, Hq, Nq) row scales (1 without ASEntmax)
    scale: float
    kwargs: dict


def attention_reference(q, k, v, dtype=None, **kw) -> AttentionReference:
    """The float64 reference output of :func:`entmax_ref.attention` and, from the dense
    probabilities, the per-entry budget of every probability (the score error of
    tolerance formula 5 added to the threshold budget).  Computed once per process for
    each problem (:mod:`._memo`); its arrays are read-only."""
    q, k, v = (np.asarray(to_numpy(a), np.float64) for a in (q, k, v))
    dtype = np.dtype(dtype or np.float64)
    kw = {key: val for key, val in kw.items() if val is not None}
    return memo("attention_reference", lambda: _attention_reference(q, k, v, dtype, kw), q, k, v,
                dtype=dtype.name, **kw)


def reference_attention_grads(grad_out, q, k, v, **kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of :func:`entmax_ref.attention_vjp` in float64, from the dense
    probabilities of :func:`attention_reference` and the row VJP
    (:func:`entmax_ref.entmax_vjp` on the NumPy backend), not from an attention engine:
    the reference of the numpy engine's backward is then not its own output.  With
    ``dP = dO V^T`` and ``dZ = entmax_vjp(P, dP)``: ``dv = P^T dO``, ``dq = c dZ K``,
    ``dk = (c dZ)^T Q``, ``c`` the score scale times the row scale ``s`` (ALiBi and the
    masks add constants to the scores); grouped-query heads sum into their key/value head.
    Computed once per process for each problem (:mod:`._memo`); read-only."""
    do, q, k, v = (np.asarray(to_numpy(a), np.float64) for a in (grad_out, q, k, v))
    kw = {key: val for key, val in kw.items() if val is not None}
    return memo("attention_grads", lambda: _attention_grads(do, q, k, v, kw), do, q, k, v, **kw)


def _dense_dz(p, do, v, alpha) -> tuple[np.ndarray, np.ndarray]:
    """``(G, dZ)`` of a dense reference: ``G = dO V^T``, the upstream gradient of the
    probabilities ``p`` (B, Hq, Nq, Nk), with the key/value heads repeated for grouped
    queries, and ``dZ = entmax_vjp(p, G)`` row by row.  The reference gradients and their
    budgets both need them: computed once per problem (:mod:`._memo`); read-only."""

    def compute():
        import entmax_ref as er

        G = np.einsum("bhie,bhje->bhij", do, np.repeat(v, p.shape[1] // v.shape[1], axis=1))
        return G, er.entmax_vjp(p, G, alpha, backend="numpy")

    return memo("attention_dz", compute, p, do, v, alpha=float(alpha))


def _attention_grads(do, q, k, v, kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ref = attention_reference(q, k, v, np.float64, **kw)
    B, Hkv, Nk = k.shape[:3]
    rep = q.shape[1] // Hkv
    dz = _dense_dz(ref.p, do, v, float(kw.get("alpha", 1.5)))[1] * (ref.scale * ref.s)[..., None]
    dq = np.einsum("bhij,bhjd->bhid", dz, np.repeat(k, rep, axis=1))
    dk = np.einsum("bhij,bhid->bhjd", dz, q).reshape(B, Hkv, rep, Nk, -1).sum(axis=2)
    dv = np.einsum("bhij,bhid->bhjd", ref.p, do).reshape(B, Hkv, rep, Nk, -1).sum(axis=2)
    return dq, dk, dv


def _attention_reference(q, k, v, dtype, kw) -> AttentionReference:
    import entmax_ref as er

    alpha = float(kw.get("alpha", 1.5))
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    kk = np.repeat(k, rep, axis=1)
    scale = float(kw.get("scale") or 1.0 / np.sqrt(D))
    if kw.get("beta") is not None or kw.get("gamma") is not None:  # ASEntmax: the row scales s
        s = er.attention(q, k, v, return_info=True, backend="numpy", **kw)[1].s
        s = np.where(np.isfinite(s), s, 1.0)
    else:
        s = np.ones((B, Hq, Nq))
    z = np.einsum("bhid,bhjd->bhij", q, kk) * scale * s[..., None]
    i_abs = np.arange(Nq)[:, None] + Nk - Nq
    j = np.arange(Nk)[None, :]
    slopes = kw.get("alibi_slopes")
    if slopes is not None:
        dist = (i_abs - j) if kw.get("causal") else np.abs(i_abs - j)
        z = z - np.asarray(slopes, np.float64)[None, :, None, None] * dist
    mask = np.zeros((B, 1, Nq, Nk), bool)
    if kw.get("causal"):
        mask |= (j > i_abs)[None, None]
    if kw.get("key_lengths") is not None:
        mask |= (j[None] >= np.asarray(kw["key_lengths"])[:, None, None])[:, None]
    if kw.get("key_padding_mask") is not None:
        mask |= ~np.asarray(kw["key_padding_mask"], bool)[:, None, None, :]
    z = np.where(mask, -np.inf, z)
    p = er.entmax(z, alpha, backend="numpy")
    # the output from the dense probabilities, not from the chunked NumPy driver: the
    # reference of the numpy engine is then not its own output
    out = np.einsum("bhij,bhjd->bhid", p, np.repeat(v, rep, axis=1))
    return attention_budgets(q, k, out, p, s, scale, np.broadcast_to(mask, p.shape), dtype, kw)


def _row_alphas(alpha, shape) -> np.ndarray:
    """A scalar alpha, or one per query head, as one per (B, Hq, Nq) row, flattened."""
    a = np.asarray(alpha, np.float64)
    return np.broadcast_to(a.reshape(-1, 1) if a.ndim else a, shape[1:]).reshape(1, -1).repeat(shape[0], 0).reshape(-1)


def attention_budgets(q, k, out, p, s, scale, masked, dtype, kw) -> AttentionReference:
    """The :class:`AttentionReference` of the dense probabilities ``p`` (B, Hq, Nq, Nk) of an
    attention problem, with the per-entry budget of every probability: the threshold
    budget plus the score error of tolerance formula 5, ``u (C + LAMBDA sqrt(D)) s_i scale
    max_j sum_d |q_id k_jd|``.  ``masked`` marks the keys a row does not see; ``kw`` holds
    alpha (a number, or one per query head) and the problem's keywords."""
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    kk = np.repeat(k, Hq // k.shape[1], axis=1)
    uu = T.unit_roundoff(dtype)
    mag = np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(kk)) * scale * np.abs(s)[..., None]
    mag = np.where(masked, 0.0, mag).max(axis=-1, initial=0.0)
    delta = uu * (T.C_THETA + T.LAMBDA * np.sqrt(D)) * mag
    tol_p = T.entmax_tolerance(p.reshape(-1, Nk), _row_alphas(kw.get("alpha", 1.5), p.shape[:3]), dtype,
                               masked=masked.reshape(-1, Nk), extra_delta=delta.reshape(-1)).reshape(p.shape)
    return AttentionReference(out, p, tol_p, delta + T.threshold_budget(dtype, Nk), s, scale, kw)


def attention_out_tolerance(ref: AttentionReference, v, dtype) -> np.ndarray:
    """|delta o_i| <= sum_j tol_p_ij max|v_j| + u (C + LAMBDA sqrt(Nk)) sum_j p_ij max|v_j|."""
    v = np.asarray(v, np.float64)
    rep = ref.p.shape[1] // v.shape[1]
    vmax = np.repeat(np.abs(v).max(axis=-1), rep, axis=1)  # (B, Hq, Nk)
    Nk = v.shape[2]
    uu = T.unit_roundoff(dtype)
    tol = np.einsum("bhij,bhj->bhi", ref.tol_p, vmax)
    tol += uu * (T.C_THETA + T.LAMBDA * np.sqrt(Nk)) * np.einsum("bhij,bhj->bhi", ref.p, vmax)
    tol = tol[..., None] + uu * np.abs(ref.out)
    return tol


def attention_grad_tolerances(ref: AttentionReference, q, k, v, do, dtype, grads, dense=None):
    """Budgets for dq, dk, dv (module docs, formula 5): dv from the probability budgets,
    dq and dk from the row VJP budget of dZ = entmax_vjp(p, dO v^T) weighted by |k|, |q|.
    ``dense`` is ``(G, dZ)`` (the probabilities' upstream gradient dO V^T and dZ, dense
    (B, Hq, Nq, Nk)) when the caller has them, else they come from the float64 reference."""
    q, k, v, do = (np.asarray(a, np.float64) for a in (q, k, v, do))
    B, Hq, Nq, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    alpha = _row_alphas(ref.kwargs.get("alpha", 1.5), (B, Hq, Nq))
    uu = T.unit_roundoff(dtype)
    kk, vv = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    # the probabilities' upstream gradient, and dZ
    G, dz = dense if dense is not None else _dense_dz(ref.p, do, v, float(ref.kwargs.get("alpha", 1.5)))
    Dv = v.shape[3]
    gerr = uu * (T.C_THETA + T.LAMBDA * np.sqrt(Dv)) * np.einsum("bhie,bhje->bhij", np.abs(do), np.abs(vv))
    tol_dz = T.vjp_tolerance(ref.p.reshape(-1, Nk), np.abs(G.reshape(-1, Nk)) + gerr.reshape(-1, Nk),
                             dz.reshape(-1, Nk), alpha, dtype,
                             extra_delta=ref.delta.reshape(-1) - T.threshold_budget(dtype, Nk))[:, 0]
    tol_dz = tol_dz.reshape(B, Hq, Nq)
    on = (ref.p > 0)
    acc_k = uu * (T.C_THETA + T.LAMBDA * np.sqrt(Nk))
    acc_q = uu * (T.C_THETA + T.LAMBDA * np.sqrt(Nq * rep))
    kmax = np.abs(kk).max(axis=-1)
    qmax = np.abs(q).max(axis=-1)
    domax = np.abs(do).max(axis=-1)
    sc = ref.scale * np.abs(ref.s)
    tol_dq = sc * (tol_dz * np.einsum("bhij,bhj->bhi", on, kmax) + acc_k * np.einsum("bhij,bhj->bhi", np.abs(dz), kmax))
    tol_dk = ref.scale * (np.einsum("bhij,bhi->bhj", on, sc / ref.scale * tol_dz * qmax)
                          + acc_q * np.einsum("bhij,bhi->bhj", np.abs(dz), np.abs(ref.s) * qmax))
    tol_dv = np.einsum("bhij,bhi->bhj", ref.tol_p, domax) + acc_q * np.einsum("bhij,bhi->bhj", ref.p, domax)
    tol_dk = tol_dk.reshape(B, Hkv, rep, Nk).sum(axis=2)
    tol_dv = tol_dv.reshape(B, Hkv, rep, Nk).sum(axis=2)
    dq, dk, dv = (np.asarray(g, np.float64) for g in grads)
    return (tol_dq[..., None] + uu * np.abs(dq), tol_dk[..., None] + uu * np.abs(dk),
            tol_dv[..., None] + uu * np.abs(dv))


def _attn_snippet(q, k, v, kw, what):
    shapes = ", ".join(f"{n} {tuple(np.shape(a))}" for n, a in (("q", q), ("k", k), ("v", v)))
    args = ", ".join(f"{key}={val!r}" if np.ndim(val) == 0 else f"{key}=np.array({np.asarray(val).tolist()!r})"
                     for key, val in kw.items())
    return (f"# {shapes}; save them with np.savez('case.npz', q=q, k=k, v=v), then:\n"
            f"import numpy as np, entmax_ref as er\nd = np.load('case.npz')\n"
            f"er.{what}(d['q'].astype(np.float64), d['k'].astype(np.float64), d['v'].astype(np.float64), {args})")


def assert_attention_close(actual_out, q, k, v, *, factor=1.0, atol=0.0, dtype=None, **kwargs):
    """Assert ``actual_out`` equals :func:`entmax_ref.attention` (q, k, v, **kwargs) in
    float64 within the budget of tolerance formula 5 (times ``factor``, plus ``atol``).

    >>> import numpy as np
    >>> from entmax_ref.testing import assert_attention_close
    >>> q = np.array([[[[1.0]]]]); k = np.array([[[[0.0], [1.0]]]]); v = np.eye(2)[None, None]
    >>> _ = assert_attention_close([[[[0.0, 1.0]]]], q, k, v, alpha=2, scale=1.0)
    """
    __tracebackhide__ = True
    dtype = dtype or dtype_of(actual_out)
    ref = attention_reference(q, k, v, dtype, **kwargs)
    tol = factor * attention_out_tolerance(ref, to_numpy(v), dtype) + atol
    cmp = compare(actual_out, ref.out, tol, dtype, name="out")
    if not cmp.ok:
        _fail(cmp, "attention output", _attn_snippet(q, k, v, ref.kwargs, "attention"))
    return cmp


def assert_attention_grads_close(actual, grad_out, q, k, v, *, factor=1.0, atol=0.0, dtype=None, **kwargs):
    """Assert ``actual = (dq, dk, dv)`` are the gradients of ``sum(grad_out * attention(q, k,
    v, **kwargs))`` within the budgets of tolerance formula 5.

    >>> import numpy as np, entmax_ref as er
    >>> from entmax_ref.testing import assert_attention_grads_close
    >>> q = np.array([[[[1.0]]]]); k = np.array([[[[0.0], [1.0]]]]); v = np.eye(2)[None, None]
    >>> g = np.ones((1, 1, 1, 2))
    >>> _ = assert_attention_grads_close(er.attention_vjp(g, q, k, v, alpha=2, scale=1.0)[:3],
    ...                                  g, q, k, v, alpha=2, scale=1.0)
    """
    __tracebackhide__ = True
    dq, dk, dv = actual[:3]
    dtype = dtype or dtype_of(dq)
    ref = attention_reference(q, k, v, dtype, **kwargs)
    qq, kk, vv, do = (np.asarray(to_numpy(a), np.float64) for a in (q, k, v, grad_out))
    exp = reference_attention_grads(do, qq, kk, vv, **ref.kwargs)
    tols = attention_grad_tolerances(ref, qq, kk, vv, do, dtype, exp)
    out = []
    for name, a, e, t in zip(("dq", "dk", "dv"), (dq, dk, dv), exp, tols):
        cmp = compare(a, e, factor * t + atol, dtype, name=name)
        if not cmp.ok:
            _fail(cmp, name, _attn_snippet(q, k, v, ref.kwargs, "attention_vjp"))
        out.append(cmp)
    return out
