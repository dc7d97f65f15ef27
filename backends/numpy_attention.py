"""Query-chunked entmax attention: the reference forward and backward.

The reference never holds an ``(Nq, Nk)`` matrix.  It walks the chunks of the chunk
driver (:mod:`entmax_ref.backends.attention_driver`: ``(batch, kv-head)`` pairs, and in
each, chunks of query rows of *all* query heads that share the kv-head, so a block of
scores is ``(group * chunk, keys)``).  Every block holds complete score rows (all the keys
a row may attend), so each row is solved exactly, in one piece, by
``backend.entmax_forward``: the code is backend-agnostic and uses only NumPy matmuls,
elementwise NumPy and the backend's row solver (the Numba backend runs it with its own
row solver for key masks with holes and for the backward of softmax heads).

Per block, in float64 whatever the input dtype:

* ``a_ij = scale * (q_i . k_j)`` for the visible keys ``j < key_end`` of the chunk
  (causal: ``key_end = min(i_last + Nk - Nq + 1, key_length)``, so a query chunk only
  touches the keys it can see; otherwise ``key_end = key_length``; the geometry is
  :mod:`entmax_ref.backends.geometry`);
* ``z_ij = s_i * a_ij + bias_ij`` (ALiBi ``-slope_h * |i + Nk - Nq - j|``), ``-inf`` where
  ``j > i + Nk - Nq`` under the causal mask and where ``key_mask[b, j]`` is False;
  each row solved with its head's alpha (``spec.head_alpha``);
* forward: ``p, theta = backend.entmax_forward(z)``, ``o_i = sum_j p_ij v_j`` and the
  skewed output ``skew_i = sum_j u_ij v_j / sum_j u_ij`` with ``u = p^(2-alpha)``;
* the forward also keeps each row's residual (:class:`~entmax_ref.backends._base.AttentionResidual`):
  theta, the row maximum ``m``, the edge ``c = min_{p_j > 0} (z_j - m)`` and its
  probability ``q`` (read off the solver's p, which is ``q`` exactly at the edge);
* backward: p rebuilt from the residual exactly as the row solver wrote it
  (``e_alpha(z - theta)`` for alpha <= 2, edge-relative for alpha > 2, where theta cannot
  resolve the edge entry), then ``dZ = backend.entmax_vjp(p, dO V^T)`` row by row (the
  row VJP, overflow-free for alpha > 2), ``dV += p^T dO``, ``dQ = scale * (s * dZ) K``,
  ``dK += scale * (s * dZ)^T Q`` and ``ds_i = sum_j dZ_ij a_ij`` (summed as
  ``sum_j dZ_ij (a_ij - a_im)``, m the entry of largest u; see :func:`_row_scale_grad`).  (The reference does
  not need the skewed output: the row VJP forms ``sum_j u_ij (dO_i . v_j) / sum_j u_ij``
  itself.)  Each row is rebuilt and differentiated with its own alpha (its head's);
  with ``spec.alpha_grad`` also dL/dalpha of each row, the backend's row alpha VJP of the
  rebuilt ``p`` and ``dO . v``.

Sums in float64 attention (q float64): every matrix product above (``q . k``, ``p v``,
the skewed output's sums, ``dO V^T``, ``dZ K``) is correctly rounded
(:func:`products`), and dK, dV are one sum state per entry over all the query chunks,
rounded once (:class:`_QuerySums`): the CPU engines, which both run this driver, give the
same bits, and neither the chunking nor a summation order changes one.  Otherwise the
products are NumPy's (BLAS) and dK, dV float64 sums in chunk order.

A row with no visible key gets ``theta = -inf``, support 0, a zero output, a zero skewed
output and zero gradients.

Memory: besides the inputs and outputs (and float64 copies of one kv-head's K and V, and
float64 dK/dV accumulators: in float64 attention sum states of five times their size), the peak is a fixed number of ``(group * chunk, key_end)``
float64 blocks.  The chunk is chosen so that one such block stays within
:data:`~entmax_ref.backends.attention_driver.BLOCK_BYTES` (``spec.chunk`` overrides it).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from . import geometry
from ._base import AttentionForward, AttentionGrads, AttentionSpec, narrow
from .attention_driver import batch_chunks, empty_forward
from .constants import EDGE_TIE_ULPS
from .exact_sums import STATE_FIELDS, dot_rows, exact_dot, matmul_rows
from .numpy_elementwise import e_alpha, skew_weights
from .numpy_elementwise import edge_p as _edge_p
from .numpy_elementwise import normalised_skew as _normalised_skew

_F64 = np.float64


def _chunks(spec: AttentionSpec, k: np.ndarray, v: np.ndarray, group: int, Nq: int):
    """Yield (b, h0, i0, i1, keys, values) for every query chunk that sees a key: the
    chunk's query heads h0 .. h0+group share kv head h0 // group, and ``keys``/``values``
    (float64) stop at the last key any of its rows may attend.  Chunks with nothing
    visible are skipped (their rows keep zero output and theta = -inf)."""
    B, Hkv, Nk = k.shape[0], k.shape[1], k.shape[2]
    for b in range(B):
        bounds = batch_chunks(spec, b, Nq, Nk, group)
        for hk in range(Hkv):
            kk_all = np.asarray(k[b, hk], _F64)
            vv_all = np.asarray(v[b, hk], _F64)
            for i0, i1, key_end in bounds:
                yield b, hk * group, i0, i1, kk_all[:key_end], vv_all[:key_end]


def _weights(p: np.ndarray, alpha) -> np.ndarray:
    """The Jacobian weights u = p^(2-alpha) on the support (p itself at alpha = 1), up to a
    per-row factor: for alpha > 2, where u is unbounded at the support's edge and
    overflows, u / max u (computed in log space); the skewed output is a ratio of sums of
    them, so the factor cancels.  ``alpha`` a float or a (rows, 1) array."""
    if np.ndim(alpha) == 0:
        if alpha == 1.0:
            return p
        if alpha > 2.0:
            return _normalised_skew(p, alpha)
        return skew_weights(p, alpha)
    u = np.where(alpha == 1.0, p, skew_weights(p, alpha))
    big = alpha[:, 0] > 2.0
    if big.any():
        u[big] = _normalised_skew(p[big], alpha[big])
    return u


def row_alpha(spec: AttentionSpec, h0: int, group: int, nc: int) -> np.ndarray:
    """alpha of each row of a block (query heads h0 .. h0+group, ``nc`` queries each),
    shape (group * nc,) float64."""
    if spec.head_alpha is None:
        return np.full(group * nc, float(spec.alpha))
    return np.repeat(np.asarray(spec.head_alpha[h0:h0 + group], _F64), nc)


def _row_scale_grad(dz: np.ndarray, a: np.ndarray, p: np.ndarray, alpha, exact: bool = False) -> np.ndarray:
    """``ds_i = sum_j dZ_ij a_ij``, as ``sum_j dZ_ij (a_ij - a_im)`` with m the first entry
    of largest u = p^(2-alpha) (equal: the dZ of a row sum to 0).  For alpha > 2, dZ is
    huge at the support's edge, where the a_ij nearly agree; the shifted sum does not
    cancel those terms against each other, the plain one loses all its digits.  ``alpha``
    a float or a (rows, 1) array; ``exact``: each row's sum correctly rounded
    (:func:`~entmax_ref.backends.exact_sums.dot_rows`)."""
    rows = np.arange(p.shape[0])
    on = p > 0
    with np.errstate(divide="ignore"):
        lu = np.where(on, (2.0 - alpha) * np.log(np.where(on, p, 1.0)), -np.inf)
    a_ref = a[rows, lu.argmax(axis=1)] if a.shape[1] else np.zeros(len(rows))
    d = a - a_ref[:, None]
    # a term with a_ij = a_im is exactly 0, also where dZ_ij overflowed (alpha >> 2: u =
    # p^(2-alpha) beyond float64 on a support of equal scores), not inf * 0 = NaN
    w = np.where(d == 0.0, 0.0, dz)
    return dot_rows(w, d) if exact else np.einsum("rj,rj->r", w, d)


def edge_residual(z: np.ndarray, p: np.ndarray):
    """Per row of a score block and its float64 probabilities: the row maximum ``m``, the
    edge ``c = min_{p_j > 0} (z_j - m)`` (computed as the row solvers compute ``y = x - m``)
    and its probability ``q`` (-inf, -inf, 0 for a row without support).  For alpha > 2 the
    solvers write ``p_j = q`` exactly where ``z_j - m = c``, so ``(m, c, q)`` rebuild every
    p of the row bit for bit (:func:`rebuild_p`)."""
    rows = np.arange(z.shape[0])
    m = z.max(axis=1, initial=-np.inf)
    on = p > 0
    live = on.any(axis=1)
    with np.errstate(invalid="ignore"):
        y = np.where(on, z - np.where(live, m, 0.0)[:, None], np.inf)
    j = y.argmin(axis=1) if y.shape[1] else np.zeros(len(rows), np.int64)
    c = np.where(live, y[rows, j] if y.shape[1] else 0.0, -np.inf)
    q = np.where(live, p[rows, j] if y.shape[1] else 0.0, 0.0)
    return np.where(live, m, -np.inf), c, q


def rebuild_p(z: np.ndarray, alpha, theta: np.ndarray, m=None, c=None, q=None) -> np.ndarray:
    """The forward's probabilities of a score block from its residual (rows of ``z`` with
    theta = -inf get 0): ``e_alpha(z - theta)`` for alpha <= 2; for alpha > 2 the row
    solvers' edge-relative form ``p = (a1 d + q^a1)^(1/a1)``, ``d = (z - m) - c``
    (:func:`entmax_ref.backends.numpy_backend._edge_p`).  ``alpha`` a float or a (rows,)
    array (alpha per row, e.g. per query head): each row is rebuilt by its own rule."""
    live = np.isfinite(theta)
    if np.ndim(alpha) == 0:
        if alpha <= 2.0:
            return _rebuild_theta(z, alpha, theta, live)
        return _rebuild_edge(z, np.full(z.shape[0], alpha - 1.0), live, m, c, q)
    alpha = np.asarray(alpha, _F64)
    big = alpha > 2.0
    if not big.any():
        return _rebuild_theta(z, alpha[:, None], theta, live)
    p = np.empty(z.shape, _F64)
    small = ~big
    if small.any():
        p[small] = _rebuild_theta(z[small], alpha[small, None], theta[small], live[small])
    if m is None or c is None or q is None:
        raise ValueError("alpha > 2 needs the forward's row_max, edge and edge_p to rebuild p exactly")
    p[big] = _rebuild_edge(z[big], alpha[big] - 1.0, live[big], m[big], c[big], q[big])
    return p


def _rebuild_theta(z, alpha, theta, live):
    """:func:`rebuild_p` for alpha <= 2 (alpha a float or (rows, 1))."""
    th = np.where(live, theta, np.inf)  # empty rows: p = e_alpha(-inf) = 0
    with np.errstate(invalid="ignore"):
        return e_alpha(z - th[:, None], alpha)


def _rebuild_edge(z, a1, live, m, c, q):
    """:func:`rebuild_p` for alpha > 2, a1 = alpha - 1 of each row, shape (rows,)."""
    if m is None or c is None or q is None:
        raise ValueError("alpha > 2 needs the forward's row_max, edge and edge_p to rebuild p exactly")
    mm = np.where(live, m, 0.0)[:, None]
    cc = np.where(live, c, 0.0)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(live[:, None], (z - mm) - cc, -np.inf)
        # scores computed elsewhere (another engine, another BLAS order) may differ by an
        # ulp: an entry within rounding of the edge is the edge (p = q)
        tie = np.isfinite(d) & (np.abs(d) <= EDGE_TIE_ULPS * np.finfo(_F64).eps * (np.abs(z) + np.abs(mm)))
        d = np.where(tie, 0.0, d)
        on = d > 0
        Ld = np.where(on, np.log(np.where(on, a1[:, None] * d, 1.0)), -np.inf)
        return _edge_p(Ld, d, np.where(live, q, 0.0)[:, None], a1[:, None])


def products(backend, q: np.ndarray):
    """The matrix product of the blocks' sums: for float64 attention a correctly rounded
    one (:func:`~entmax_ref.backends.exact_sums.matmul_rows` with the backend's
    ``add_products``: every entry the real-number sum rounded once, whatever the summation
    order, so every CPU engine gives the same bits), else NumPy's (BLAS)."""
    if q.dtype != _F64:
        return np.matmul
    return functools.partial(matmul_rows, add=backend.add_products, rnd=backend.round_products)


class _QuerySums:
    """dK or dV of every (batch, kv-head): ``sum_i a_ij b_i`` over the query rows of all its
    chunks.  float64 attention (``exact``): the chunks' exact terms go into one sum state
    per entry (``backend.add_products``), rounded once at the end (correctly, by
    ``backend.round_products``: the chunking and the order change nothing), and an entry
    whose rounding is not proven is summed exactly from its terms (:meth:`exact`);
    otherwise the float64 sum of the chunks' products."""

    def __init__(self, backend, exact: bool, shape: tuple, scale: float):
        self.backend, self.exact, self.scale = backend, exact, scale
        B, H, N, D = shape
        self.st = np.zeros((B, H, N, STATE_FIELDS, D) if exact else shape, _F64)

    def add(self, bh: tuple, a: np.ndarray, b: np.ndarray) -> None:
        """Add ``scale a^T b`` (``a`` (rows, keys), ``b`` (rows, D)) to the sums of the
        first keys (exact: the terms of ``a^T b``; the scale multiplies the rounded sum)."""
        n = a.shape[1]
        if self.exact:
            self.backend.add_products(self.st[bh][:n], np.ascontiguousarray(a.T), b)
        else:
            self.st[bh][:n] += self.scale * (a.T @ b)

    def result(self, terms, rows: int):
        """The sums (float64 (B, H, N, D)); ``terms()`` yields every chunk's ``(bh, a, b)``
        again, for the exact sums of the entries whose rounding is not proven; ``rows``
        bounds the terms of a sum."""
        if not self.exact:
            return self.st
        v, ok = self.backend.round_products(self.st, rows)
        v = self.scale * v
        bad = np.argwhere(~ok)
        if bad.size:
            cols = {tuple(i): ([], []) for i in bad.tolist()}
            for bh, a, b in terms():
                for (bb, h, j, d), (ta, tb) in cols.items():
                    if (bb, h) == bh and j < a.shape[1]:
                        ta.append(a[:, j])
                        tb.append(b[:, d])
            for i, (ta, tb) in cols.items():
                x, y = (np.concatenate(t) if t else np.zeros(0) for t in (ta, tb))
                v[i] = self.scale * exact_dot(x[x != 0.0], y[x != 0.0])
        return v


def _skewed(u: np.ndarray, vv: np.ndarray, mm) -> np.ndarray:
    """sum_j u_ij v_j / sum_j u_ij per row (both sums by the product ``mm``); 0 for a row
    without support."""
    uv = mm(u, np.concatenate([vv, np.ones((vv.shape[0], 1))], axis=1))
    su = uv[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(su[:, None] > 0, uv[:, :-1] / su[:, None], 0.0)


class _Block:
    """Scores of one chunk: rows of ``group`` query heads x ``chunk`` queries."""

    def __init__(self, spec: AttentionSpec, qc: np.ndarray, kk: np.ndarray, b: int, h0: int,
                 group: int, i0: int, i1: int, offset: int, mm):
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
            self.a = spec.scale * mm(qc, kk.T)  # (rows, key_end), no row scale, no bias
            self.z = self._scores(spec, b, h0, group, i0, i1, offset, kk.shape[0])

    def _scores(self, spec, b, h0, group, i0, i1, offset, key_end):
        i_abs = np.tile(np.arange(i0, i1) + offset, group)  # (rows,)
        j = np.arange(key_end)
        if spec.row_scale is not None:
            self.s = np.asarray(spec.row_scale[b, h0:h0 + group, i0:i1], _F64).reshape(-1)
            z = self.a * self.s[:, None]
        else:
            self.s = None
            z = self.a  # never written to: every step below makes a new array
        if spec.alibi_slopes is not None:
            slopes = np.repeat(np.asarray(spec.alibi_slopes[h0:h0 + group], _F64), i1 - i0)
            if np.any(slopes != 0.0):
                z = z - slopes[:, None] * np.abs(i_abs[:, None] - j[None, :]).astype(_F64)
        if not np.isfinite(z).all():
            raise ValueError(
                "attention scores overflowed (non-finite s * scale * q.k + bias); "
                "rescale q, k, the scale or the ASEntmax scale"
            )
        if spec.causal:
            z = np.where(geometry.sees(i_abs[:, None], j[None, :], True), z, -np.inf)
        if spec.key_mask is not None:
            z = np.where(np.asarray(spec.key_mask[b, :key_end])[None, :], z, -np.inf)
        return z


def attention_forward(backend, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      spec: AttentionSpec) -> AttentionForward:
    """Chunked forward; see the module docstring.  Returns out in q's dtype, and float64
    theta, int64 support and float64 skewed output."""
    B, Hq, Nq, _ = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    offset = geometry.key_offset(Nq, Nk)
    out, theta, support, skew, row_max, edge, edge_p, _ = empty_forward(B, Hq, Nq, Dv)
    mm = products(backend, q)
    for b, h0, i0, i1, kk, vv in _chunks(spec, k, v, group, Nq):
        qc = np.asarray(q[b, h0:h0 + group, i0:i1], _F64).reshape(-1, q.shape[3])
        blk = _Block(spec, qc, kk, b, h0, group, i0, i1, offset, mm)
        a_rows = row_alpha(spec, h0, group, i1 - i0)
        res = backend.entmax_forward(blk.z, a_rows, None)
        p = np.asarray(res.p, _F64)
        o = mm(p, vv)
        sk = o if np.all(a_rows == 1.0) else _skewed(_weights(p, a_rows[:, None]), vv, mm)
        shape = (group, i1 - i0)
        out[b, h0:h0 + group, i0:i1] = o.reshape(shape + (Dv,))
        skew[b, h0:h0 + group, i0:i1] = sk.reshape(shape + (Dv,))
        theta[b, h0:h0 + group, i0:i1] = np.asarray(res.theta, _F64).reshape(shape)
        support[b, h0:h0 + group, i0:i1] = np.asarray(res.support).reshape(shape)
        m, c, qe = edge_residual(blk.z, p)
        row_max[b, h0:h0 + group, i0:i1] = m.reshape(shape)
        edge[b, h0:h0 + group, i0:i1] = c.reshape(shape)
        edge_p[b, h0:h0 + group, i0:i1] = qe.reshape(shape)
    return AttentionForward(out.astype(q.dtype, copy=False), theta, support, skew, row_max, edge, edge_p)


def attention_backward(backend, do: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       res, skew, spec: AttentionSpec) -> AttentionGrads:
    """Chunked backward from the forward's residual ``res`` (theta, and for alpha > 2 the
    edge: row_max, edge, edge_p; see :func:`rebuild_p`; with ``spec.head_alpha`` each row
    by its head's alpha); see the module docstring.  The skewed output is not needed here
    (``skew`` is accepted for the backend contract).  dq, dk, dv come back in the dtypes of
    q, k, v; drow_scale and dalpha are float64 (None when ``spec.row_scale`` is None,
    resp. unless ``spec.alpha_grad``)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    exact = q.dtype == _F64
    dq = np.zeros((B, Hq, Nq, D), _F64)
    dk = _QuerySums(backend, exact, (B, Hkv, Nk, D), spec.scale)
    dv = _QuerySums(backend, exact, (B, Hkv, Nk, Dv), 1.0)
    ds = np.zeros((B, Hq, Nq), _F64) if spec.row_scale is not None else None
    dalpha = np.zeros((B, Hq, Nq), _F64) if spec.alpha_grad else None

    def chunks():
        return _backward_chunks(backend, do, q, k, v, res, spec)

    for c in chunks():
        shape = (c.rows.stop - c.rows.start, c.qc.shape[0] // (c.rows.stop - c.rows.start))
        if dalpha is not None:  # the row transform's alpha VJP, on the support of p
            dalpha[c.sl] = np.asarray(backend.entmax_alpha_vjp(c.p, c.gp, c.a_rows), _F64).reshape(shape)
        if ds is not None:
            ds[c.sl] = _row_scale_grad(c.dz, c.a, c.p, c.a_col, exact).reshape(shape)
        dq[c.sl] = (spec.scale * c.mm(c.da, c.kk)).reshape(shape + (D,))
        dv.add(c.bh, c.p, c.doc)
        dk.add(c.bh, c.da, c.qc)
    rows = (Hq // Hkv) * Nq
    dkr = dk.result(lambda: ((c.bh, c.da, c.qc) for c in chunks()), rows)
    dvr = dv.result(lambda: ((c.bh, c.p, c.doc) for c in chunks()), rows)
    return AttentionGrads(narrow(dq, q.dtype), narrow(dkr, k.dtype), narrow(dvr, v.dtype), ds, dalpha)


class _Chunk(NamedTuple):
    """What one query chunk of the backward gives the sums: its place (``bh`` = (batch,
    kv-head), ``sl`` its rows in (B, Hq, Nq), ``rows`` its query heads), its float64 queries
    ``qc``, ``dO`` rows ``doc``, keys ``kk``, scores ``a`` (no row scale, no bias), the
    rebuilt ``p``, ``gp = dO V^T``, ``dz`` (the row VJP), ``da = s dz``, each row's alpha
    (``a_rows``; ``a_col`` as :func:`_row_scale_grad` takes it) and the product ``mm``."""
    bh: tuple
    sl: tuple
    rows: slice
    qc: np.ndarray
    doc: np.ndarray
    kk: np.ndarray
    a: np.ndarray
    p: np.ndarray
    gp: np.ndarray
    dz: np.ndarray
    da: np.ndarray
    a_rows: np.ndarray
    a_col: Any
    mm: Callable


def _backward_chunks(backend, do, q, k, v, res, spec: AttentionSpec):
    """Yield the :class:`_Chunk` of every query chunk of the backward, in order."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    offset = geometry.key_offset(Nq, Nk)
    big = spec.alpha > 2.0 if spec.head_alpha is None else bool(np.any(np.asarray(spec.head_alpha) > 2.0))
    mm = products(backend, q)
    for b, h0, i0, i1, kk, vv in _chunks(spec, k, v, group, Nq):
        sl = (b, slice(h0, h0 + group), slice(i0, i1))
        qc = np.asarray(q[sl], _F64).reshape(-1, D)
        doc = np.asarray(do[sl], _F64).reshape(-1, Dv)
        blk = _Block(spec, qc, kk, b, h0, group, i0, i1, offset, mm)

        def rows_of(a):
            return None if a is None else np.asarray(a[sl], _F64).reshape(-1)

        a_rows = row_alpha(spec, h0, group, i1 - i0)
        a_col = float(spec.alpha) if spec.head_alpha is None else a_rows[:, None]
        if big:
            p = rebuild_p(blk.z, a_rows if spec.head_alpha is not None else spec.alpha, rows_of(res.theta),
                          rows_of(res.row_max), rows_of(res.edge), rows_of(res.edge_p))
        else:
            p = rebuild_p(blk.z, a_rows if spec.head_alpha is not None else spec.alpha, rows_of(res.theta))
        gp = mm(doc, vv.T)  # dL/dp_ij = dO_i . v_j
        dz = np.asarray(backend.entmax_vjp(p, gp, a_rows), _F64)
        da = dz * blk.s[:, None] if spec.row_scale is not None else dz
        yield _Chunk((b, h0 // group), sl, slice(h0, h0 + group), qc, doc, kk, blk.a, p, gp, dz, da, a_rows,
                     a_col, mm)
