"""Attention kernels of the numba backend.

The forward walks the same query chunks as the NumPy driver
(:mod:`entmax_ref.backends.numpy_attention`: its score blocks, chunk sizes and causal key
ranges are reused as they are), solves every score row with the compiled row solver, and
then forms the output and the skewed output from the *support only*:

    o_i = sum_{j: p_ij > 0} p_ij v_j,      skew_i = sum_{j: p_ij > 0} u_ij v_j / sum_j u_ij,

with ``u = p^(2 - alpha)`` evaluated only where ``p > 0`` (``sparse_pv``, a ``prange``
kernel over rows).  With sparse rows this replaces two dense ``(rows, keys) x (keys, Dv)``
products and a transcendental over the whole score block by work proportional to the
support.  At alpha = 1 (every visible key is in the support) the skewed output is the
output itself, as in the NumPy driver.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import CACHE


@njit(inline="always", cache=CACHE)
def _skew(p, a2):
    if a2 == 0.0:
        return 1.0
    elif a2 == 0.5:
        return math.sqrt(p)
    elif a2 == 1.0:
        return p
    return math.exp(a2 * math.log(p))


@njit(parallel=True, cache=CACHE)
def sparse_pv(p, vv, alpha, out, skew):
    """``out[r] = sum_j p[r, j] vv[j]`` and ``skew[r] = sum_j u_rj vv[j] / sum_j u_rj``
    over the nonzeros of each row of ``p`` (float64 accumulation)."""
    rows, n = p.shape
    dv = vv.shape[1]
    a2 = 2.0 - alpha
    for r in prange(rows):
        o = np.zeros(dv)
        s = np.zeros(dv)
        su = 0.0
        for j in range(n):
            pj = np.float64(p[r, j])
            if pj > 0.0:
                u = _skew(pj, a2)
                su += u
                for d in range(dv):
                    vjd = vv[j, d]
                    o[d] += pj * vjd
                    s[d] += u * vjd
        inv = 1.0 / su if su > 0.0 else 0.0
        for d in range(dv):
            out[r, d] = o[d]
            skew[r, d] = s[d] * inv


def attention_forward(backend, q, k, v, spec):
    """The chunked forward of :mod:`entmax_ref.backends.numpy_attention` with the sparse
    output kernel (see the module docstring); same outputs and conventions."""
    from .._base import AttentionForward
    from ..numpy_attention import _Block, _key_end, choose_chunk

    f64 = np.float64
    B, Hq, Nq, _ = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    group = Hq // Hkv
    offset = Nk - Nq
    out = np.zeros((B, Hq, Nq, Dv), f64)
    skew = np.zeros((B, Hq, Nq, Dv), f64)
    theta = np.full((B, Hq, Nq), -np.inf)
    support = np.zeros((B, Hq, Nq), np.int64)
    lengths = spec.key_lengths
    for b in range(B):
        length = Nk if lengths is None else int(lengths[b])
        chunk = choose_chunk(spec, group, length, Nq)
        for hk in range(Hkv):
            h0 = hk * group
            kk_all = np.asarray(k[b, hk], f64)
            vv_all = np.ascontiguousarray(v[b, hk], f64)
            for i0 in range(0, Nq, chunk):
                i1 = min(Nq, i0 + chunk)
                key_end = _key_end(i1, offset, length, spec.causal)
                if key_end == 0:
                    continue  # nothing visible: zero output, theta -inf
                qc = np.asarray(q[b, h0:h0 + group, i0:i1], f64).reshape(-1, q.shape[3])
                blk = _Block(spec, qc, kk_all[:key_end], b, h0, group, i0, i1, offset)
                z = np.ascontiguousarray(blk.z)
                res = backend.entmax_forward(z, np.full(z.shape[0], spec.alpha), None)
                o = np.empty((z.shape[0], Dv), f64)
                sk = np.empty((z.shape[0], Dv), f64)
                sparse_pv(res.p, vv_all[:key_end], float(spec.alpha), o, sk)
                if spec.alpha == 1.0:
                    sk = o
                shape = (group, i1 - i0)
                out[b, h0:h0 + group, i0:i1] = o.reshape(shape + (Dv,))
                skew[b, h0:h0 + group, i0:i1] = sk.reshape(shape + (Dv,))
                theta[b, h0:h0 + group, i0:i1] = res.theta.reshape(shape)
                support[b, h0:h0 + group, i0:i1] = res.support.reshape(shape)
    return AttentionForward(out.astype(q.dtype, copy=False), theta, support, skew)
