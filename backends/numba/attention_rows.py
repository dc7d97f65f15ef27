"""The row kernels of the numba attention: one chunk's rows, forward and backward.

Each kernel is a ``nogil`` serial loop over the rows of one chunk (the drivers run one per
worker thread); the candidates of a row and their exact scores come from the float32
filter (:mod:`.attention_filter`), the threshold from the compiled row solver.

forward (``fwd_rows``, per row)
    candidates and exact scores; the compiled row solver of
    :mod:`entmax_ref.backends.numba.rows`; then ``o_i = sum_{p_ij > 0} p_ij v_j`` and the
    skewed output ``skew_i = sum u_ij v_j / sum u_ij`` (``u = p^(2 - alpha)``).  The row's
    residual goes straight into the forward's arrays (:func:`row_result`); only ``o_i``
    passes through a float64 scratch row, which the driver converts to q's dtype.  A
    forward that keeps no residual (``AttentionSpec.residual`` off: ``er.attention``
    without ``return_info``) forms neither the skewed output nor the support keys.

backward (``bwd_rows`` then ``bwd_scatter``)
    the candidates: the support's keys the forward kept (``AttentionForward.support_keys``,
    :func:`_store_keys`: up to :func:`~.attention_chunks.keys_width` a row), whose exact scores are the only
    ones computed (a chunk whose rows all have them forms no score product and runs no
    filter pass); else the filter against the forward's theta.  ``p_j = e_alpha(z_j - theta_i)`` and ``u_j =
    p_j^(2 - alpha)`` as the row solvers' output pass forms them
    (:func:`~.elementwise._p_u`: the reference's ``exp(log1p(a1 y) / a1)``, closed forms at
    alpha = 1.5 and 2) on them (alpha > 2: edge-relative
    from the forward's row max, edge and edge probability, :func:`~.big_alpha._edge_p`, and dZ in
    the row VJP's overflow-free form, :func:`_dz_big`); the support is compacted
    (key, ``p``, ``u``), the skewed output recomputed from it when the caller has none,
    ``delta_i = dO_i . skew_i``, ``dZ_ij = u_ij (dO_i . v_j - delta_i)`` (a dot product per
    *support* entry, no dense ``dO V^T``), ``ds_i = sum_j dZ_ij a_ij``, ``dQ_i = scale sum_j
    s_i dZ_ij k_j``.  ``bwd_scatter`` adds ``dV_j += p_ij dO_i`` and ``dK_j += scale s_i
    dZ_ij q_i`` over the compacted entries.  When a chunk's support is dense (more than
    :data:`~.attention_backward.DENSE_FRACTION` of its block) the entries are expanded into dense blocks and dK,
    dV use BLAS.  alpha = 1 (softmax: the support is every visible key) uses the NumPy
    driver's backward.  With ``spec.alpha_grad`` each row's dL/dalpha is the compiled row alpha
    VJP (:mod:`entmax_ref.backends.numba.grads`) of the compacted support's ``p`` and
    ``dO . v_j``.
"""

from __future__ import annotations

import math
import numpy as np

from ._jit import ANY, jit, kernel
from ..constants import EDGE_TIE_ULPS
from .paths import path_runs
from ..geometry import visible_count
from .attention_records import (BWD_SIGNATURE, FWD_SIGNATURE, SCATTER_SIGNATURE, EXPAND_SIGNATURE, Cut, RowScore,
                                RowsOut, scores_of)
from .attention_filter import (PREFETCH_AHEAD, add_row, all_keys, candidate_buffers, candidates_fast, dot64,
                               prefetch_pair, prefetch_row, score_at)
from .big_alpha import a1_log_q as _lqa, edge_p as _edge_p
from .compensated import acc as _acc
from .elementwise import p_u as _p_u
from .grads import alpha_vjp_row as _alpha_vjp_row, alpha_vjp_row_big as _alpha_vjp_row_big
from .grads import signed_exp as _signed_exp, skew as _skew
from .rows import kind_of as _kind, solve_on_path, solver_scratch as _solver_scratch


_EPS = float(np.finfo(np.float64).eps)

#: The compiled twin of :func:`entmax_ref.backends.geometry.visible_count`: that very
#: function, compiled (tests/test_geometry.py ties the two).
_visible_count = jit(visible_count)


@jit
def _visible(r, nc, i0, offset, key_end, causal):
    """(query head index within the group, absolute query index, visible key count)."""
    h = r // nc
    i_abs = i0 + (r - h * nc) + offset
    return h, i_abs, _visible_count(i_abs, key_end, causal)


@jit(_nrt=False)
def _row_params(r, rows, key_end, has_s):
    """Row ``r`` of a chunk (``rows`` its :data:`~.attention_records.ChunkRows`): :func:`_visible`'s (h, i_abs,
    n), then its head's ``a1 = alpha - 1``, ``a2 = 2 - alpha``, whether alpha > 2, the
    support window ``1/a1`` (inf at alpha = 1) and the row's ASEntmax scale ``s`` (1
    without one)."""
    h, i_abs, n = _visible(r, rows.nc, rows.i0, rows.offset, key_end, rows.causal)
    alpha = rows.alphas[h]
    a1 = alpha - 1.0
    a2 = 2.0 - alpha
    window = 1.0 / a1 if a1 > 0.0 else np.inf
    s = rows.row_scale[r] if has_s else 1.0
    return h, i_abs, n, a1, a2, alpha > 2.0, window, s


@jit(_nrt=False)
def _weigh(cand, m, alpha, vv, scratch, keep):
    """From one row's solved candidates ``cand = (zc, pc, idx)`` (scores ``zc[:m]``,
    probabilities ``pc[:m]``, keys ``idx[:m]``; ``alpha = (a1, a2, big)``): ``o += sum p_j
    v_j`` and, with ``keep`` (the backward's residual is wanted), the skewed output ``sk =
    sum u_j v_j / sum u_j`` (``u = p^(2 - alpha)``, divided by its maximum, the edge's, when
    ``big``: alpha > 2) on the support only (``scratch = (o, sk)``, zeroed; ``vv`` the values'
    pair); ``o`` gets the same bits either way.  Returns (L, ce, qe): the row maximum L, the
    edge ``ce = min_{p > 0} (z - L)`` and its probability ``qe``."""
    zc, pc, idx = cand
    _, a2, big = alpha
    o, sk = scratch
    L = -np.inf
    for ci in range(m):
        if zc[ci] > L:
            L = zc[ci]
    ce = np.inf
    qe = 0.0
    for ci in range(m):
        if pc[ci] > 0.0:
            y = zc[ci] - L
            if y < ce:
                ce = y
                qe = pc[ci]
    if not keep:
        for ci in range(m):
            if ci + PREFETCH_AHEAD < m and pc[ci + PREFETCH_AHEAD] > 0.0:  # the rows P.V reads
                prefetch_pair(vv, idx[ci + PREFETCH_AHEAD])
            pj = pc[ci]
            if pj > 0.0:
                add_row(o, pj, vv, idx[ci])
        return L, ce, qe
    lmax = a2 * math.log(qe) if (big and qe > 0.0) else 0.0  # log of max u (at the edge)
    su = 0.0
    for ci in range(m):
        if ci + PREFETCH_AHEAD < m and pc[ci + PREFETCH_AHEAD] > 0.0:
            prefetch_pair(vv, idx[ci + PREFETCH_AHEAD])
        pj = pc[ci]
        if pj > 0.0:
            j = idx[ci]
            u = math.exp(a2 * math.log(pj) - lmax) if big else _skew(pj, a2)
            su += u
            add_row(o, pj, vv, j)
            add_row(sk, u, vv, j)
    inv = 1.0 / su if su > 0.0 else 0.0
    for d in range(sk.shape[0]):
        sk[d] *= inv
    return L, ce, qe


@jit(_nrt=False)
def _store_keys(m, pc, idx, row):
    """A row's support keys into ``row`` (:func:`keys_width` wide): the keys of the
    candidates with ``p > 0`` in candidate (ascending key) order, then -1; -2 and then -1
    when there are more than fit (the backward finds that row's support again)."""
    cap = row.shape[0]
    t = 0
    for ci in range(m):
        if pc[ci] > 0.0:
            if t == cap:
                row[0] = -2
                t = 1
                break
            row[t] = idx[ci]
            t += 1
    for c in range(t, cap):
        row[c] = -1


@jit(_nrt=False)
def row_result(row, solved, cand, alpha, vv, scratch, fwd, res):
    """Everything one forward row writes, from its candidates ``cand = (zc, pc, idx)``
    (exact scores, their p, keys) as the row solver left them: ``solved = (m, ok, theta,
    support)`` (``m`` candidates, ``ok``: its scores were finite; theta and support (-inf,
    0) for a row the caller did not solve, one without candidates or with overflowed
    scores).  Row ``row[0]`` of the block's :data:`~.attention_records.RowsOut` ``res``
    (``out``, float64: the driver converts it to q's dtype; ``bad``, ``ncand``); then
    (:func:`_weigh`; ``alpha = (a1, a2, big)``; ``scratch = (o, sk)``) theta, the support,
    the residual, the skewed output (the output itself at alpha = 1, as the reference has
    it) and the support's keys (:func:`_store_keys`) straight into their place ``row[1:] =
    (b, hq, i)`` of the forward's arrays ``fwd`` (:data:`~.attention_records.ForwardArrays`);
    without ``fwd.keep`` (no backward will follow) the last two are neither formed nor
    written.  A row without candidates, or with overflowed scores, attends nothing.  It
    links no row solver: the kernel of each solver path calls its solver itself, so that
    this part compiles once and the solver into one level of calls."""
    r, b, hq, i = row
    m, ok, th, cnt = solved
    zc, pc, idx = cand
    a1 = alpha[0]
    o, sk = scratch
    keep = fwd.keep
    res.bad[r] = 0 if ok else 1
    res.ncand[r] = m
    for d in range(o.shape[0]):
        o[d] = 0.0
        sk[d] = 0.0
    L = -np.inf
    ce = -np.inf
    qe = 0.0
    if m > 0 and ok:
        L, ce, qe = _weigh(cand, m, alpha, vv, scratch, keep)
        if cnt == 0:  # the residual (the row maximum, the support's edge) of a row with a support only
            L = -np.inf
            ce = -np.inf
            qe = 0.0
    fwd.theta[b, hq, i] = th
    fwd.support[b, hq, i] = cnt
    fwd.rmax[b, hq, i] = L
    fwd.edge[b, hq, i] = ce
    fwd.edge_p[b, hq, i] = qe
    for d in range(o.shape[0]):
        res.out[r, d] = o[d]
    if keep:
        _store_keys(m if cnt > 0 else np.int64(0), pc, idx, fwd.keys[b, hq, i])
        src = o if a1 == 0.0 else sk
        for d in range(o.shape[0]):
            fwd.skew[b, hq, i, d] = src[d]


@kernel(lambda _: FWD_SIGNATURE, dtypes=ANY, ops=("attention_forward",))
def fwd_rows(scores, kv, r0, rows, fwd, res, path):
    """Fused forward of rows ``r0 .. r0 + n - 1`` of a chunk (all of it, or a block of it:
    see :data:`~.attention.FILTER_BLOCK_BYTES`), every one of solver path ``path``
    (:func:`~.paths.solver_path`): ``scores`` (:data:`~.attention_records.Scores`) holds
    their q.k (float64, or float32 as a filter, :func:`~.attention_filter.candidates_fast`),
    the bound of its error and their float64 queries; ``kv`` the kv-head's keys and values;
    ``rows`` the chunk's :data:`~.attention_records.ChunkRows` (the filter needs every
    alpha > 1); ``res`` (:data:`~.attention_records.RowsOut`) the rows' outputs (float64,
    n x Dv), candidate counts and overflow flags.  Each row writes ``fwd``
    (:data:`~.attention_records.ForwardArrays`: the skewed output, theta, the support, the
    residual: the row maximum m, ``c = min_{p > 0} (z - m)`` and its p, and the support's
    keys, :func:`_store_keys`) at its place in those whole (B, Hq, Nq, ...) arrays
    (:func:`row_result`).  For alpha > 2 the skewed output is formed from ``w = u / max u``
    (u overflows at the support's edge; the factor cancels in the ratio).

    One kernel serves every path: it links every row solver (each row calls its path's,
    :func:`~.rows.solve_on_path`), so that the code around the solver is compiled once,
    not once per path.  One signature serves every input: the scores and the keys and
    values come as pairs of which the rows' own precision is read
    (:mod:`.attention_records`)."""
    filt = scores.filt
    g32, g64 = scores.g32, scores.g64
    n_rows = g32.shape[0] if filt else g64.shape[0]
    key_end = g32.shape[1] if filt else g64.shape[1]
    dv = max(kv.v[0].shape[1], kv.v[1].shape[1])
    has_s = rows.row_scale.shape[0] > 0
    buf = candidate_buffers(key_end)
    _, idx, zc, _ = buf
    pc = np.empty(key_end, np.float64)
    c, aux, aux2 = _solver_scratch(key_end)
    scratch = (np.empty(dv, np.float64), np.empty(dv, np.float64))
    for r in range(n_rows):
        rc = r0 + r
        h, i_abs, n, a1, a2, big, window, s = _row_params(rc, rows, key_end, has_s)
        sc = RowScore(scores.qc, r, kv.k, rows.scale, s, has_s, rows.slopes[h], i_abs)
        if filt:
            m, ok = candidates_fast(g32, n, sc, Cut(scores.err[r], window, np.bool_(True), 0.0), buf)
        else:
            m, ok = all_keys(g64, n, sc, buf)
        th, cnt = -np.inf, np.int64(0)
        if m > 0 and ok:  # the path's solver, seeded with the row's index in its chunk
            th, cnt, _, _ = solve_on_path(zc[:m], pc[:m], a1, c, aux, aux2, rc, path)[0]
        row_result((r, rows.b, rows.h0 + h, rows.i0 + (rc - h * rows.nc)), (m, ok, th, cnt), (zc, pc, idx),
                   (a1, a2, big), kv.v, scratch, fwd, res)


def fwd_runs(g, g0, r0, r1, chunk, kv, rows, fwd, res):
    """Rows ``r0 .. r1 - 1`` of a chunk (``rows`` its :data:`~.attention_records.ChunkRows`)
    through :func:`fwd_rows`, one call per run of heads of one solver path
    (:func:`~.paths.path_runs`): the chunked forward's blocks
    and the decoding path's rows.  ``g`` holds the scores of rows ``g0 ..`` (float32: the
    filter); ``chunk = (err, qc)`` and ``res`` (:data:`~.attention_records.RowsOut`) those
    of the whole chunk; ``kv`` the kv-head's :data:`~.attention_records.KeysValues`."""
    err, qc = chunk
    filt = g.dtype == np.float32
    for lo, hi, path in path_runs(rows.alphas, rows.nc, r0, r1):
        fwd_rows(scores_of(g[lo - g0:hi - g0], filt, err[lo:hi], qc[lo:hi]), kv, lo, rows, fwd,
                 RowsOut(res.out[lo:hi], res.ncand[lo:hi], res.bad[lo:hi]), path)


@kernel(lambda _: BWD_SIGNATURE, dtypes=ANY, ops=("attention_backward",))
def bwd_rows(scores, kv, rows, inp, res):
    """Per-row backward of one chunk over the support only (see the module docstring).
    ``scores``, ``kv``, ``rows`` (every alpha > 1 here) as in the forward's row kernels;
    ``inp`` (:data:`~.attention_records.BackwardRows`): ``th`` (rows,) theta (-inf: empty row), and for the
    rows whose alpha > 2 the forward's ``rmax``, ``edge``, ``edge_p`` (rows,), from which
    p is rebuilt as the row solver wrote it (:func:`~.big_alpha._edge_p`); ``doc`` dO;
    ``skew`` (rows, Dv) or an empty (0, Dv) array (then recomputed from p); ``keys``
    (rows, cap) or (0, cap): the forward's support keys (:func:`_store_keys`); a row that
    has them takes its candidates from them (:func:`_stored_candidates`) and reads
    nothing of the scores, which may then be empty when every row has them.  Writes ``res``
    (:data:`~.attention_records.BackwardOut`): the compacted support ``idx``, ``pb`` (p), ``ub`` (s dZ),
    ``cnt`` per row, ``dq`` (rows, D), ``ds`` (rows,); ``bad[r] = 1`` where a score
    overflowed, 2 where the keys do not belong to this call.  alpha > 2:
    :func:`_dz_big`.  ``dal`` (rows,) or empty: dL/dalpha of each row, the row
    transform's alpha VJP (:mod:`entmax_ref.backends.numba.grads`) on the support's p and
    dL/dp = dO . v."""
    th, rmax, edge, edge_p, doc, skew_in, keys = inp
    idx, pb, ub, cnt, dq, ds, bad, dal = res
    scale = rows.scale
    kk, vv = kv
    n_rows = th.shape[0]
    key_end = max(kk[0].shape[0], kk[1].shape[0])
    use_keys = keys.shape[0] > 0
    dv = max(vv[0].shape[1], vv[1].shape[1])
    D = scores.qc.shape[1]
    want_dal = dal.shape[0] > 0
    has_s = rows.row_scale.shape[0] > 0
    buf = candidate_buffers(key_end)
    _, ci, zc, gx = buf
    gs = np.empty(key_end, np.float64)
    gd = np.empty(key_end, np.float64)
    sk = np.empty(dv, np.float64)
    acc = np.empty(D, np.float64)
    for r in range(n_rows):
        h, i_abs, n, a1, a2, big, window, s = _row_params(r, rows, key_end, has_s)
        t = th[r]
        for d in range(D):
            acc[d] = 0.0
        live = t > -np.inf
        sc = RowScore(scores.qc, r, kk, scale, s, has_s, rows.slopes[h], i_abs)
        if use_keys and keys[r, 0] != -2:
            mc, status = _stored_candidates(sc, n, keys, buf)
            bad[r] = status
        else:
            if scores.filt:
                mc, ok = candidates_fast(scores.g32, n, sc, Cut(scores.err[r], window, np.bool_(False), t), buf)
            else:
                mc, ok = all_keys(scores.g64, n, sc, buf)
            bad[r] = 0 if ok else 1
        m = np.int64(0)
        if live and big:
            L = rmax[r]
            ce = edge[r]
            qe = edge_p[r]
            lqa = _lqa(qe, a1)
            for c in range(mc):
                # the scores may differ from the forward's by an ulp (BLAS or dot64, as the
                # float32 filter's state decides per chunk): an entry within rounding of
                # the edge is the edge (p = q), not an entry outside or far inside it
                d = (zc[c] - L) - ce
                if d - d == 0.0 and abs(d) <= EDGE_TIE_ULPS * _EPS * (abs(zc[c]) + abs(L)):
                    d = 0.0
                p = _edge_p(d, a1, qe, lqa)
                if p > 0.0:
                    idx[r, m] = ci[c]
                    pb[r, m] = p
                    ub[r, m] = a2 * math.log(p)  # log u, for _dz_big
                    gs[m] = gx[c]
                    m += 1
        elif live:
            kind = _kind(a1)
            for c in range(mc):
                p, u = _p_u(zc[c] - t, a1, kind)  # the row solvers' e_alpha and p^(2 - alpha)
                if p > 0.0:
                    idx[r, m] = ci[c]
                    pb[r, m] = p
                    ub[r, m] = u
                    gs[m] = gx[c]
                    m += 1
        cnt[r] = m
        mref = 0  # the first entry of largest u (the reference point of ds)
        if big:
            mref = _dz_big(r, m, (idx, ub), doc, vv, skew_in, sk, gd)
        else:
            for c in range(1, m):
                if ub[r, c] > ub[r, mref]:
                    mref = c
            _row_skew(r, m, (idx, ub), (np.bool_(False), 0.0, 0.0), vv, skew_in, sk)
            delta = _output_grads(r, m, idx, doc, vv, sk, gd)
            for c in range(m):
                ub[r, c] = ub[r, c] * (gd[c] - delta)
        dsr = 0.0
        a_ref = scale * gs[mref] if m > 0 else 0.0
        for c in range(m):
            j = idx[r, c]
            dz = ub[r, c]
            if has_s:
                # ds = sum dZ a as sum dZ (a - a_ref): the dZ sum to 0, and the huge ones
                # (alpha > 2, at the edge) sit where a is nearly a_ref; a term with a =
                # a_ref is 0, also where dZ overflowed (not inf * 0 = NaN)
                da = scale * gs[c] - a_ref
                if da != 0.0:
                    dsr += dz * da
                dz = dz * s
            ub[r, c] = dz
            add_row(acc, dz, kk, j)
        ds[r] = dsr
        for d in range(D):
            dq[r, d] = scale * acc[d]
        if want_dal:  # gd[:m] = dO . v_j on the support (both branches above)
            if a1 > 1.0:
                dal[r] = _alpha_vjp_row_big(pb[r, :m], gd[:m], a1)
            else:
                dal[r] = _alpha_vjp_row(pb[r, :m], gd[:m], a1)


@jit(_nrt=False)
def _stored_candidates(sc, n, keys, buf):
    """Row ``sc.r``'s candidates from the forward's support keys ``keys[r]`` (ascending,
    then -1): their keys ``idx``, exact scores ``zc`` and exact q.k ``gx`` (``buf``), as
    :func:`~.attention_filter._candidates` gives them.  Returns (m, status): status 0, 1
    where a score is not finite, 2 (and m = 0) where a key is not ascending or not one the
    row sees (keys of another call)."""
    _, idx, zc, gx = buf
    r = sc.r
    m = np.int64(0)
    prev = np.int64(-1)
    status = np.int8(0)
    for c in range(keys.shape[1]):
        j = np.int64(keys[r, c])
        if j == -1:
            break
        if j <= prev or j >= n:
            return np.int64(0), np.int8(2)
        if c + PREFETCH_AHEAD < keys.shape[1] and keys[r, c + PREFETCH_AHEAD] >= 0:
            prefetch_pair(sc.keys, np.int64(keys[r, c + PREFETCH_AHEAD]))
        gv = dot64(sc.qc, r, sc.keys, j)
        z = score_at(gv, sc, j)
        if (z - z) != 0.0:
            status = np.int8(1)
        idx[m] = j
        gx[m] = gv
        zc[m] = z
        m += 1
        prev = j
    return m, status


@jit(_nrt=False)
def _row_skew(r, m, sup, weights, vv, skew_in, sk):
    """Row r's skewed output into ``sk``: the forward's (``skew_in[r]``) when the caller
    kept it (``skew_in`` has rows), else ``sum_c w_c v_j / sum_c w_c`` over the compacted
    support ``sup = (idx, ub)`` (key ``idx[r, c]``): ``w = u = ub[r, c]``, or for alpha > 2
    (``weights = (big, lmax, S)``; ``ub`` holds log u) ``w = u / max u = exp(ub[r, c] -
    lmax)`` with its compensated sum ``S``."""
    idx, ub = sup
    big, lmax, S = weights
    dv = sk.shape[0]
    if skew_in.shape[0] > 0:
        for d in range(dv):
            sk[d] = skew_in[r, d]
        return
    for d in range(dv):
        sk[d] = 0.0
    su = 0.0
    for c in range(m):
        w = math.exp(ub[r, c] - lmax) if big else ub[r, c]
        su += w
        add_row(sk, w, vv, np.int64(idx[r, c]))
    norm = S if big else su
    if norm > 0.0:
        for d in range(dv):
            sk[d] /= norm


@jit(_nrt=False)
def _output_grads(r, m, idx, doc, vv, sk, gd):
    """``gd[c] = dO_r . v_j`` over the compacted support of row r (key ``j = idx[r, c]``);
    returns ``delta = dO_r . skew_r``."""
    dv = sk.shape[0]
    delta = 0.0
    for d in range(dv):
        delta += doc[r, d] * sk[d]
    for c in range(m):
        if c + PREFETCH_AHEAD < m:
            prefetch_pair(vv, np.int64(idx[r, c + PREFETCH_AHEAD]))
        gd[c] = dot64(doc, r, vv, np.int64(idx[r, c]))
    return delta


@jit(_nrt=False)
def _dz_big(r, m, sup, doc, vv, skew_in, sk, gd):
    """alpha > 2: ``dZ_rc = u_c (g_c - delta_r)`` over the compacted support of row r, in
    the overflow-free form of the row VJP (``NumpyBackend.entmax_vjp``), with ``g_c = dO_r
    . v_j``.  On entry ``ub[r, :m]`` holds ``log u``; on exit dZ.  With ``w = u / max u``
    (log space), ``S = sum w``, the skewed output ``sum w v / S`` (or the forward's) and
    ``delta = dO . skew``: entries other than the first of largest u (the edge) get ``u_c
    (g_c - delta)`` (``sign exp(log u_c + log|g_c - delta|)`` where u_c overflows); that
    entry, whose ``g_m - delta`` is a tiny difference times a huge u, gets ``sum_{c != m}
    u_c (g_m - g_c) / S`` (scaled by the second largest u where that is not finite).
    Returns the index of that entry (0 when ``m = 0``).  ``sup = (idx, ub)``, ``skew_in`` as
    in :func:`_row_skew`."""
    idx, ub = sup
    if m == 0:
        return 0
    mi = 0
    lmax = ub[r, 0]
    for c in range(1, m):
        if ub[r, c] > lmax:
            lmax = ub[r, c]
            mi = c
    S = 0.0
    cS = 0.0
    for c in range(m):
        S, cS = _acc(S, cS, math.exp(ub[r, c] - lmax))
    S = S + cS
    _row_skew(r, m, sup, (np.bool_(True), lmax, S), vv, skew_in, sk)
    delta = _output_grads(r, m, idx, doc, vv, sk, gd)
    l2 = -np.inf
    for c in range(m):
        if c != mi and ub[r, c] > l2:
            l2 = ub[r, c]
    gm = gd[mi]
    Dm = 0.0
    cD = 0.0
    for c in range(m):
        if c != mi:
            Dm, cD = _acc(Dm, cD, math.exp(ub[r, c]) * (gm - gd[c]))
    Dm = (Dm + cD) / S
    if not (Dm - Dm == 0.0):  # beyond float64: scaled by the second largest u
        T = 0.0
        cT = 0.0
        for c in range(m):
            if c != mi:
                T, cT = _acc(T, cT, math.exp(ub[r, c] - l2) * (gm - gd[c]))
        Dm = _signed_exp(l2, (T + cT) / S)
    if l2 == -np.inf:  # the edge alone on the support
        Dm = 0.0
    for c in range(m):
        if c == mi:
            continue
        lu = ub[r, c]
        diff = gd[c] - delta
        u = math.exp(lu)
        if diff == 0.0:
            ub[r, c] = 0.0
        elif u == np.inf:
            ub[r, c] = _signed_exp(lu, diff)
        else:
            ub[r, c] = u * diff
    ub[r, mi] = Dm
    return mi


@jit(forceinline=True)
def _next_entry(r, c, cnt):
    """The entry of the compacted support (``cnt[r]`` entries in row r) after (r, c): the
    next in row r, or the first of the next row that has any; r = ``cnt.shape[0]`` when
    none is left.  (0, -1) gives the first entry."""
    c += 1
    while r < cnt.shape[0] and c >= cnt[r]:
        r += 1
        c = 0
    return r, c


@kernel(lambda _: SCATTER_SIGNATURE, dtypes=ANY, ops=("attention_backward",))
def bwd_scatter(support, doc, qc, scale, acc):
    """``dv_acc[j] += p dO_r`` and ``dk_acc[j] += scale (s dZ) q_r`` over the compacted
    support ``support = (idx, pb, ub, cnt)`` of one chunk (``acc = (dv_acc, dk_acc)``).  The rows ``j`` come in random order from accumulators larger
    than the core's cache (two of Nk x D float64: 16 MiB at 16,384 x 64), so the rows of
    the entry :data:`PREFETCH_AHEAD` entries ahead (across rows) are prefetched: without
    it each entry waited on memory (about 200 ns an entry at N = 16,384)."""
    idx, pb, ub, cnt = support
    dv_acc, dk_acc = acc
    rows = idx.shape[0]
    Dv = doc.shape[1]
    D = qc.shape[1]
    ar, ac = _next_entry(np.int64(0), np.int64(-1), cnt)
    for _ in range(PREFETCH_AHEAD):
        if ar < rows:
            ar, ac = _next_entry(ar, ac, cnt)
    for r in range(rows):
        for c in range(cnt[r]):
            if ar < rows:
                prefetch_row(dv_acc, idx[ar, ac])
                prefetch_row(dk_acc, idx[ar, ac])
                ar, ac = _next_entry(ar, ac, cnt)
            j = idx[r, c]
            p = pb[r, c]
            for d in range(Dv):
                dv_acc[j, d] += p * doc[r, d]
            dz = scale * ub[r, c]
            for d in range(D):
                dk_acc[j, d] += dz * qc[r, d]


@kernel(lambda _: EXPAND_SIGNATURE, dtypes=ANY, ops=("attention_backward",))
def expand(support, P, U):
    """Dense blocks ``P``, ``U`` (rows, key_end) from the compacted support ``support = (idx,
    pb, ub, cnt)`` (zeros off it)."""
    idx, pb, ub, cnt = support
    rows, n = P.shape
    for r in range(rows):
        for j in range(n):
            P[r, j] = 0.0
            U[r, j] = 0.0
        for c in range(cnt[r]):
            j = idx[r, c]
            P[r, j] = pb[r, c]
            U[r, j] = ub[r, c]
