"""The degenerate shapes of attention (head dim 0, value dim 0, no query rows), answered
exactly around a backend, so that engines only ever see B * Hq * Nq > 0 and D, Dv >= 1
(docs/conventions.md lists the answers)."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from .backends._base import AttentionForward, AttentionGrads, AttentionSpec, xp_of


class ShapeGuard:
    """A backend seen through the degenerate shapes' exact answers, so that engines only
    ever get B * Hq * Nq > 0 and D, Dv >= 1.

    * head dim D = 0: every q . k is the empty sum, 0, so q and k are given one zero column
      (the scores, hence p, are those of all-zero content scores plus any ALiBi bias) and
      dq, dk are returned without it (empty);
    * value dim Dv = 0: v and grad_out get one zero column, so dO . v = 0 and no gradient
      reaches q, k or the scale; out and the skewed output are returned empty;
    * no query rows (B, Hq or Nq = 0): empty outputs, and zero gradients for k and v.
    """

    def __init__(self, backend: Any):
        self.backend = backend
        self.name = backend.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.backend, attr)

    @staticmethod
    def _pad(a: Any) -> Any:
        xp = xp_of(a)
        return xp.ascontiguousarray(xp.concatenate([a, xp.zeros(a.shape[:3] + (1,), a.dtype)], axis=3))

    def attention_forward(self, q, k, v, spec, *rest, **kw):
        xp = xp_of(q)
        (B, Hq, Nq, D), Dv = q.shape, v.shape[3]
        if B * Hq * Nq == 0:
            rows = (B, Hq, Nq)
            known = {"out": xp.zeros(rows + (Dv,), q.dtype), "theta": xp.full(rows, -np.inf),
                     "support": xp.zeros(rows, np.int64), "skew": xp.zeros(rows + (Dv,)),
                     "row_max": xp.full(rows, -np.inf), "edge": xp.full(rows, -np.inf), "edge_p": xp.zeros(rows)}
            return AttentionForward(**{f: known.get(f) for f in AttentionForward._fields})
        if D == 0:
            q, k = self._pad(q), self._pad(k)
        fwd = self.backend.attention_forward(q, k, self._pad(v) if Dv == 0 else v, spec, *rest, **kw)
        if Dv == 0:
            return fwd._replace(out=fwd.out[..., :Dv], skew=None if fwd.skew is None else fwd.skew[..., :Dv])
        return fwd

    def attention_backward(self, do, q, k, v, *rest, **kw):
        xp = xp_of(q)
        (B, Hq, Nq, D), Dv = q.shape, v.shape[3]
        if B * Hq * Nq == 0:
            spec = next(a for a in (*rest, *kw.values()) if isinstance(a, AttentionSpec))
            ds = None if spec.row_scale is None else xp.zeros((B, Hq, Nq))
            return AttentionGrads(xp.zeros(q.shape, q.dtype), xp.zeros(k.shape, k.dtype),
                                  xp.zeros(v.shape, v.dtype), ds, xp.zeros((B, Hq, Nq)) if spec.alpha_grad else None)
        if D == 0:
            q, k = self._pad(q), self._pad(k)
        if Dv == 0:
            v, do = self._pad(v), self._pad(do)
            rest = tuple(self._pad(a) if getattr(a, "ndim", 0) == 4 else a for a in rest)  # the skewed output
        # the padded column's dq, dk are dz times a zero column, NaN where an exact dz
        # overflows (alpha far above 2); they are sliced off, so that is not a warning
        with np.errstate(invalid="ignore") if D == 0 else contextlib.nullcontext():
            g = self.backend.attention_backward(do, q, k, v, *rest, **kw)
        return g._replace(dq=g.dq[..., :D], dk=g.dk[..., :D], dv=g.dv[..., :Dv])
