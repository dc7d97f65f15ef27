"""attention_vjp against a dense row-by-row reference, to 1e-12 relative in float64.

The reference builds the score matrix densely and takes the library's row transform and
row VJP (``er.entmax``, ``er.entmax_vjp``, the NumPy backend), then the chain rule to
dq, dk, dv and, with ASEntmax, ``er.asentmax_scale_vjp`` to dbeta, dgamma, ddelta.  The
scores are exact (each query is a unit vector, so ``q . k`` is one product by 1), so
both sides solve the very same rows.  The rows put entries just inside and just outside
the support: for alpha > 2 the edge entry then has a probability whose gap to the
threshold theta is below theta's ulp (the backward must rebuild it edge-relative, as the
row solvers do), and near alpha = 1 the threshold must travel without the lossy
tau = (alpha - 1) theta - 1 conversion.  Both the recompute path (no residual) and the
saved path (``info=``) are checked; the ``tau=`` path too where it is lossless.
"""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as er

ALPHAS = (1.0, 1.0 + 1e-12, 1.0 + 1e-9, 1.5, 2.0, 3.0, 4.0, 10.0, 30.0, 100.0, 1000.0)
RTOL = 1e-12
N_ROWS = 4  # score rows (queries) per problem; also the head dim
N_KEYS = 14


def _support_edge(row: np.ndarray, alpha: float) -> float:
    """The score below which p = 0 (theta - 1/(alpha - 1)), from the reference."""
    p, info = er.entmax(row, alpha=alpha, return_info=True, backend="numpy")
    theta = (float(info.tau) + 1.0) / (alpha - 1.0)
    return theta - 1.0 / (alpha - 1.0)


def edge_rows(rng: np.random.Generator, alpha: float) -> np.ndarray:
    """(N_ROWS, N_KEYS) score rows with entries just inside and just outside the support.

    alpha near 1 (a support window of 1e9 and more): random scores plus entries whose
    probability is subnormal (inside) or underflows (outside).  Otherwise, scores within
    the window 1/(alpha - 1) of the maximum, then entries at relative distances 1e-3 ...
    1e-13 of the window above the edge (one at a time, each against the current edge),
    then two below it."""
    rows = []
    for _ in range(N_ROWS):
        if alpha < 1.5:
            base = 3.0 * rng.standard_normal(N_KEYS - 3)
            row = np.concatenate([base, base.max() - np.array([700.0, 744.0, 760.0])])
        else:
            W = 1.0 / (alpha - 1.0)
            row = -W * rng.uniform(0.0, 0.6, N_KEYS - 6)
            for rel in (1e-3, 1e-6, 1e-9, 1e-13):  # just inside, nearest last
                row = np.append(row, _support_edge(row, alpha) + rel * W)
            edge = _support_edge(row, alpha)  # entries with p = 0 do not move it
            row = np.append(row, edge - np.array([1e-3, 1e-9]) * W)  # just outside
        rows.append(rng.permutation(row))
    return np.array(rows)


def test_edge_rows_straddle_the_support():
    """The construction does what it says: zeros and tiny probabilities next to the edge."""
    rng = np.random.default_rng(0)
    for alpha in ALPHAS:
        z = edge_rows(rng, alpha)
        p = er.entmax(z, alpha=alpha, backend="numpy")
        if alpha >= 1.5:
            W = 1.0 / (alpha - 1.0)
            edge = np.array([_support_edge(r, alpha) for r in z])[:, None]
            near = np.abs(z - edge) < 1e-6 * W
            assert (near & (p > 0)).any(axis=1).all(), alpha  # just inside
            assert (near & (p == 0)).any(axis=1).all(), alpha  # just outside
        else:
            assert ((p > 0) & (p < 1e-300)).any(axis=1).all(), alpha  # subnormal
            assert (p == 0).any(axis=1).all(), alpha  # underflows


def dense_reference(q, k, v, do, alpha, scale, s=None, params=None, backend="numpy"):
    """(dq, dk, dv, dbeta, dgamma, ddelta) from dense scores, er.entmax and er.entmax_vjp
    of ``backend``.  (The same backend's row transform: rows this close to the support's
    edge are ill-conditioned, their edge probability q is determined to an absolute eps
    only, and the gradients carry u = q^(2 - alpha); two exact solvers may round q to
    neighbouring floats.  The row solvers are checked against the 50-digit oracle in
    test_oracle.py; here the attention is checked against its own row solver.)"""
    a = scale * (q @ k.T)
    z = a if s is None else a * s[:, None]
    to = getattr(backend, "asarray", lambda a: a)
    back = getattr(backend, "numpy", np.asarray)
    p = back(er.entmax(to(z), alpha=alpha, backend=str(backend)))
    dz = back(er.entmax_vjp(to(p), to(do @ v.T), alpha=alpha, backend=str(backend)))
    da = dz if s is None else dz * s[:, None]
    grads = [scale * (da @ k), scale * (da.T @ q), p.T @ do]
    if params is not None:
        # ds_i = sum_j dz_ij a_ij, summed as sum_j dz_ij (a_ij - a_im) (the dz of a row sum
        # to 0) with m the entry of largest u = p^(2 - alpha): for alpha > 2 the dz are huge
        # at the support's edge, where the a_ij nearly agree, and the plain sum cancels
        on = p > 0
        with np.errstate(divide="ignore"):
            lu = np.where(on, (2.0 - alpha) * np.log(np.where(on, p, 1.0)), -np.inf)
        a_ref = a[np.arange(len(a)), lu.argmax(axis=1)]
        ds = (dz * (a - a_ref[:, None])).sum(axis=1)
        n = np.full(len(ds), k.shape[0])
        sg = er.asentmax_scale_vjp(ds[None, None, :], n[None, None, :], **params)
        grads += [sg.dbeta, sg.dgamma, sg.ddelta]
    return grads


def problem(seed: int, alpha: float, asentmax: bool):
    rng = np.random.default_rng(seed)
    z = edge_rows(rng, alpha)  # (N_ROWS, N_KEYS)
    params, s = None, None
    if asentmax:
        params = dict(beta=0.25, gamma=0.5, delta=0.75, offset=1.0)
        s = np.broadcast_to(er.asentmax_scale(N_KEYS, **params), (N_ROWS,)).astype(np.float64)
        z = z / s[:, None]  # the content scores the scale multiplies (z * s is within an ulp of the rows)
    q = np.eye(N_ROWS)  # query i reads score row i: q_i . k_j = k[j, i], exactly
    k = np.ascontiguousarray(z.T)  # (N_KEYS, N_ROWS)
    v = rng.standard_normal((N_KEYS, 3))
    do = rng.standard_normal((N_ROWS, 3))
    return q, k, v, do, s, params


def _close(got, want, what):
    got = np.asarray(got, np.float64).reshape(np.shape(want))
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert np.isfinite(got).all(), f"{what}: not finite"
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} vs max |reference| {scale:.3g}"


#: the dense reference's rows are correctly rounded; the attention kernels' rows are not yet:
#: at alpha > 2 the VJP's weights p^(2 - alpha) magnify their last-bit difference at the
#: support's edge beyond 1e-12 in these cases ((backend, alpha, asentmax) -> why)
_EDGE_ROUNDING = "attention rows are not correctly rounded: the edge p's last bit, magnified by p^(2-alpha)"
NOT_YET = {("numba", 10.0, True): _EDGE_ROUNDING, ("numpy", 10.0, True): _EDGE_ROUNDING}


@pytest.fixture
def not_yet(request, backend):
    """Marks the case xfail (strict) where :data:`NOT_YET` names it."""
    def mark(*key):
        why = NOT_YET.get((str(backend),) + key)
        if why:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=why))
    return mark


@pytest.fixture
def dense_case(request, not_yet):
    not_yet(request.node.callspec.params["alpha"], request.node.callspec.params["asentmax"])


@pytest.fixture
def head_case(request, not_yet):
    not_yet(request.node.callspec.params["heads"])


@pytest.mark.parametrize("asentmax", [False, True], ids=["plain", "asentmax"])
@pytest.mark.parametrize("alpha", ALPHAS, ids=[repr(a) for a in ALPHAS])
def test_attention_vjp_matches_dense_entmax_vjp(backend, alpha, asentmax, dense_case):
    q, k, v, do, s, params = problem(int(alpha * 7) % 1000 + asentmax, alpha, asentmax)
    x = backend.asarray
    want = dense_reference(q, k, v, do, alpha, 1.0, s, params, backend)
    q4, k4, v4, do4 = (x(t[None, None]) for t in (q, k, v, do))
    kw = dict(alpha=alpha, scale=1.0, backend=backend)
    if asentmax:
        kw.update(params)
    out, info = er.attention(q4, k4, v4, return_info=True, **kw)
    paths = {"recompute": {}, "info": {"info": info}}
    if alpha == 1.0 or alpha >= 1.5:  # tau -> theta loses nothing here (alpha > 2: solved again)
        paths["tau"] = {"tau": info.tau}
    names = ("dq", "dk", "dv", "dbeta", "dgamma", "ddelta")
    for path, extra in paths.items():
        g = er.attention_vjp(x(do[None, None]), q4, k4, v4, **extra, **kw)
        for name, got, ref in zip(names, g, want):
            _close(backend.numpy(got), ref, f"{backend} {path} alpha={alpha!r} {name}")


@pytest.mark.parametrize("alpha", (1.0 + 1e-12, 1.0 + 1e-9, 10.0, 100.0, 1000.0))
def test_saved_path_rebuilds_the_forward_exactly(backend, alpha):
    """info= gives the same gradients as recomputing, bit for bit on the same backend
    (nothing is solved again, nothing is lost in a conversion)."""
    q, k, v, do, _, _ = problem(3, alpha, False)
    x = backend.asarray
    q4, k4, v4, do4 = (x(t[None, None]) for t in (q, k, v, do))
    kw = dict(alpha=alpha, scale=1.0, backend=backend)
    out, info = er.attention(q4, k4, v4, return_info=True, **kw)
    a = er.attention_vjp(do4, q4, k4, v4, **kw)
    b = er.attention_vjp(do4, q4, k4, v4, info=info, **kw)
    for ga, gb in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(backend.numpy(ga), backend.numpy(gb))


def test_issue_example_alpha_10_and_100(backend):
    """One query, keys x = [0, -0.1] (alpha 10) and [0, -0.0101] (alpha 100), g = [1, -2]:
    dk is the dense entmax_vjp, not [3.29, 0] or NaN."""
    for alpha, xs in ((10.0, [0.0, -0.1]), (100.0, [0.0, -0.0101])):
        q = np.ones((1, 1, 1, 1))
        k = np.array(xs).reshape(1, 1, 2, 1)
        v = np.array([1.0, -2.0]).reshape(1, 1, 2, 1)
        p = er.entmax(np.array(xs), alpha=alpha, backend="numpy")
        want = er.entmax_vjp(p, np.array([1.0, -2.0]), alpha=alpha, backend="numpy")
        kw = dict(alpha=alpha, scale=1.0, backend=backend)
        x = backend.asarray
        out, info = er.attention(x(q), x(k), x(v), return_info=True, **kw)
        for extra in ({}, {"info": info}, {"tau": info.tau}):
            g = er.attention_vjp(x(np.ones((1, 1, 1, 1))), x(q), x(k), x(v), **extra, **kw)
            np.testing.assert_allclose(backend.numpy(g.dk).ravel(), want, rtol=1e-13, atol=0)
        # the skewed output is finite although u = p^(2 - alpha) overflows at the edge
        assert np.isfinite(backend.numpy(info.skew)).all()


def test_info_is_checked():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))
    do = rng.standard_normal((1, 2, 5, 3))
    out, info = er.attention(q, k, v, alpha=3.0, return_info=True, backend="numpy")
    with pytest.raises(ValueError, match="alpha=3.0"):
        er.attention_vjp(do, q, k, v, info=info, alpha=1.5, backend="numpy")
    with pytest.raises(ValueError, match="not both"):
        er.attention_vjp(do, q, k, v, info=info, tau=info.tau, alpha=3.0, backend="numpy")
    with pytest.raises(ValueError, match="causal"):
        er.attention_vjp(do, q, k, v, info=info, alpha=3.0, causal=True, backend="numpy")
    with pytest.raises(ValueError, match="info.theta"):
        er.attention_vjp(do[:, :, :4], q[:, :, :4], k, v, info=info, alpha=3.0, backend="numpy")
    with pytest.raises(TypeError, match="AttentionInfo"):
        er.attention_vjp(do, q, k, v, info=info.tau, alpha=3.0, backend="numpy")


HEAD_ALPHAS = {
    "sparse": (1.0 + 1e-9, 1.5, 10.0, 100.0),  # no softmax head: numba's fused kernels
    "with_softmax": (1.0, 2.0, 3.0, 1000.0),  # a softmax head: every backend's NumPy driver
}


@pytest.mark.parametrize("heads", list(HEAD_ALPHAS), ids=list(HEAD_ALPHAS))
def test_alpha_per_head_is_exact(backend, heads, head_case):
    """Alpha per query head, heads with alpha > 2 next to heads with alpha <= 2: each row
    is rebuilt by its own head's rule (edge-relative above 2, from theta below), so every
    head's gradients match the dense reference of its alpha to 1e-12, on the recompute,
    info= and tau= paths."""
    alphas = HEAD_ALPHAS[heads]
    x = backend.asarray
    qs, ks, vs, dos, want = [], [], [], [], []
    for h, alpha in enumerate(alphas):
        q, k, v, do, _, _ = problem(40 + h, alpha, False)
        qs.append(q), ks.append(k), vs.append(v), dos.append(do)
        want.append(dense_reference(q, k, v, do, alpha, 1.0, backend=backend))
    q4, k4, v4, do4 = (x(np.stack(t)[None]) for t in (qs, ks, vs, dos))
    kw = dict(alpha=np.array(alphas), scale=1.0, backend=backend)
    out, info = er.attention(q4, k4, v4, return_info=True, **kw)
    assert info.alpha == alphas  # a tuple, one float per head
    for path, extra in {"recompute": {}, "info": {"info": info}, "tau": {"tau": info.tau}}.items():
        g = er.attention_vjp(do4, q4, k4, v4, **extra, **kw)
        assert g.dalpha is not None and np.isfinite(backend.numpy(g.dalpha)).all()
        for h, alpha in enumerate(alphas):
            for name, got, ref in zip(("dq", "dk", "dv"), g[:3], want[h]):
                _close(backend.numpy(got)[0, h], ref, f"{backend} {path} head {h} alpha={alpha!r} {name}")


def test_info_alpha_per_head_is_checked():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((1, 2, 5, 3)) for _ in range(4))
    out, info = er.attention(q, k, v, alpha=np.array([1.5, 3.0]), return_info=True, backend="numpy")
    with pytest.raises(ValueError, match="alpha="):
        er.attention_vjp(do, q, k, v, info=info, alpha=np.array([1.5, 2.0]), backend="numpy")
    with pytest.raises(ValueError, match="alpha="):
        er.attention_vjp(do, q, k, v, info=info, alpha=3.0, backend="numpy")
    # equal alphas per head run as the scalar: the info of either is accepted by the other
    out, info = er.attention(q, k, v, alpha=np.array([2.5, 2.5]), return_info=True, backend="numpy")
    g = er.attention_vjp(do, q, k, v, info=info, alpha=2.5, backend="numpy")
    h = er.attention_vjp(do, q, k, v, alpha=2.5, backend="numpy")
    for a, b in zip(g[:3], h[:3]):
        np.testing.assert_array_equal(a, b)


def test_alpha_per_head_key_runs_are_exact(backend):
    """A key_padding_mask whose keys form one run per batch (numba: the fused kernels on
    each batch's run of keys, its residual slice passed along) with alpha per head across
    2: the gradients of each batch are the dense reference of its run, 0 on masked keys,
    on the recompute and info= paths."""
    alphas = HEAD_ALPHAS["sparse"]
    rng = np.random.default_rng(7)
    lo = (0, 3)  # batch 0: right padding; batch 1: left and right padding
    Nk = N_KEYS + 5
    qs, ks, vs, dos, want = [], [], [], [], []
    for h, alpha in enumerate(alphas):
        q, k, v, do, _, _ = problem(60 + h, alpha, False)
        qs.append(q), dos.append(do), want.append(dense_reference(q, k, v, do, alpha, 1.0, backend=backend))
        kb = 5.0 * rng.standard_normal((2, Nk, N_ROWS))  # masked keys: large scores that would matter
        vb = 5.0 * rng.standard_normal((2, Nk, v.shape[1]))
        for b, l0 in enumerate(lo):
            kb[b, l0:l0 + N_KEYS], vb[b, l0:l0 + N_KEYS] = k, v
        ks.append(kb), vs.append(vb)
    x = backend.asarray
    q4 = x(np.broadcast_to(np.stack(qs)[None], (2,) + np.stack(qs).shape).copy())
    do4 = x(np.broadcast_to(np.stack(dos)[None], (2,) + np.stack(dos).shape).copy())
    k4, v4 = (x(np.stack(t, axis=1)) for t in (ks, vs))
    mask = np.zeros((2, Nk), bool)
    for b, l0 in enumerate(lo):
        mask[b, l0:l0 + N_KEYS] = True
    kw = dict(alpha=np.array(alphas), scale=1.0, backend=backend, key_padding_mask=mask)
    out, info = er.attention(q4, k4, v4, return_info=True, **kw)
    for path, extra in {"recompute": {}, "info": {"info": info}}.items():
        g = er.attention_vjp(do4, q4, k4, v4, **extra, **kw)
        dq, dk, dv = (backend.numpy(t) for t in g[:3])
        for b, l0 in enumerate(lo):
            assert not dk[b][:, ~mask[b]].any() and not dv[b][:, ~mask[b]].any(), path
            for h, alpha in enumerate(alphas):
                for name, got, ref in zip(("dq", "dk", "dv"), (dq[b, h], dk[b, h, l0:l0 + N_KEYS],
                                                               dv[b, h, l0:l0 + N_KEYS]), want[h]):
                    _close(got, ref, f"{backend} {path} batch {b} head {h} alpha={alpha!r} {name}")
