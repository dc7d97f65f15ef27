"""Entmax attention: the dense formula, masks, GQA, decoding, gradients, theory, memory.

Reference = the dense formula: the full (B, Hq, Nq, Nk) score matrix materialised here with
einsum and masks, then the core transform ``er.entmax`` (numpy backend) and ``p @ v``.

Tolerances are derived, not tuned.  Both sides form each score from D products in float64,
so a score differs by at most dz = (D + 4) eps |s| scale sum_d |q_d k_d| (+ eps |bias|).
A probability moves by u_j (|dz_j| + |dtheta|) (u = p^(2-alpha) is d e_alpha / dz), and
the threshold by dtheta <= dz + Nk eps / sum u (the solve's residual; sum u >= 1 for every
alpha), so |dout| <= max|v| (2 dz sum_j u_j + 2 Nk eps); a factor 4 covers the two sides'
own roundings.  float32 outputs add one rounding: eps32 max|out|.
"""

from __future__ import annotations

import tracemalloc
import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import entmax_ref as er

EPS = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)
ALPHAS = [1.0, 1.25, 1.5, 2.0, 3.0]


# --------------------------------------------------------------------------- the dense formula
@dataclass
class Dense:
    out: np.ndarray
    p: np.ndarray
    z: np.ndarray
    tau: np.ndarray
    support: np.ndarray
    s: np.ndarray
    n: np.ndarray
    dz: np.ndarray  # per-row bound on the score rounding


def _on(fn, args, backend, kw):
    """``fn`` on ``backend``: the fixture's BackendName moves the inputs to its array type and
    the results back to NumPy; a plain name is passed as ``backend=`` (NumPy data)."""
    if backend is None:
        return fn(*args, **kw)
    if not hasattr(backend, "call"):
        return fn(*args, backend=backend, **kw)
    return backend.call(fn, *args, **kw)


def _attention(*args, backend=None, **kw):
    """er.attention on ``backend`` (see :func:`_on`)."""
    return _on(er.attention, args, backend, kw)


def _attention_vjp(*args, backend=None, **kw):
    """er.attention_vjp on ``backend``, like :func:`_attention`."""
    return _on(er.attention_vjp, args, backend, kw)


def dense(q, k, v, *, alpha, scale=None, causal=False, key_lengths=None, alibi_slopes=None,
          beta=None, gamma=None, delta=1.0, offset=1.0) -> Dense:
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    i_abs, j = np.arange(Nq) + Nk - Nq, np.arange(Nk)
    lengths = np.full(B, Nk) if key_lengths is None else np.asarray(key_lengths)
    visible = j[None, None, None, :] < lengths[:, None, None, None]
    if causal:
        visible = visible & (j[None, :] <= i_abs[:, None])[None, None]
    visible = np.broadcast_to(visible, (B, Hq, Nq, Nk))
    n = visible.sum(-1)
    s = np.ones((B, Hq, Nq))
    if beta is not None:  # the paper's formula, written out independently of asentmax_scale
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(n > 0, delta + beta * np.log(n + offset) ** gamma, 1.0)
    a = scale * np.einsum("bhid,bhjd->bhij", q, kk)
    bias = np.zeros((1, Hq, Nq, Nk))
    if alibi_slopes is not None:
        bias = -np.asarray(alibi_slopes, np.float64)[None, :, None, None] * np.abs(i_abs[:, None] - j[None, :])
    z = np.where(visible, s[..., None] * a + bias, -np.inf)
    p, info = er.entmax(z, alpha, backend="numpy", return_info=True)
    mag = np.abs(s)[..., None] * scale * np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(kk)) + np.abs(bias)
    dz = (D + 4) * EPS * np.where(visible, mag, 0.0).max(-1, initial=0.0)
    return Dense(p @ vv, p, z, info.tau, info.support, s, n, dz)


def weights(p, alpha):
    """u = p^(2-alpha) on the support, 0 elsewhere."""
    with np.errstate(divide="ignore"):
        return np.where(p > 0, p ** (2.0 - alpha), 0.0)


def out_tol(d: Dense, v, alpha, dtype) -> float:
    """The module docstring's bound on |out - dense.out|."""
    u = weights(d.p, alpha)
    nk = d.p.shape[-1]
    tol = 4 * np.abs(v).max(initial=0.0) * (2 * (d.dz * u.sum(-1)).max(initial=0.0) + 2 * nk * EPS)
    if np.dtype(dtype) == np.float32:
        tol += EPS32 * np.abs(d.out).max(initial=0.0)
    return float(tol)


def tau_tol(d: Dense, alpha) -> float:
    nk = d.p.shape[-1]
    live = np.isfinite(d.tau)
    return float(4 * max(alpha - 1.0, 1.0) * (2 * d.dz.max(initial=0.0) + 2 * nk * EPS)
                 + 4 * EPS * np.abs(d.tau[live]).max(initial=0.0))


def problem(seed, *, B=2, Hq=4, Hkv=2, Nq=5, Nk=7, D=3, Dv=2, dtype=np.float64, spread=1.5):
    rng = np.random.default_rng(seed)
    q = (spread * rng.standard_normal((B, Hq, Nq, D))).astype(dtype)
    k = (spread * rng.standard_normal((B, Hkv, Nk, D))).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, Dv)).astype(dtype)
    return rng, q, k, v


def check_against_dense(backend, q, k, v, alpha, **kw):
    out, info = _attention(q, k, v, alpha=alpha, return_info=True, backend=backend, **kw)
    kw.pop("chunk", None)
    d = dense(q, k, v, alpha=alpha, **kw)
    assert out.dtype == np.result_type(q.dtype, k.dtype, v.dtype)
    assert out.shape == d.out.shape
    np.testing.assert_allclose(out, d.out, rtol=0, atol=out_tol(d, v, alpha, out.dtype))
    live = d.n > 0
    assert np.array_equal(np.isneginf(info.tau), ~live)
    np.testing.assert_allclose(info.tau[live], d.tau[live], rtol=0, atol=tau_tol(d, alpha))
    assert np.array_equal(info.support, d.support)
    assert np.array_equal(info.n, d.n)
    if kw.get("beta") is not None:
        np.testing.assert_allclose(info.s[live], d.s[live], rtol=4 * EPS, atol=0)
        assert np.all(np.isnan(info.s[~live]))
    assert np.all(out[~live] == 0)
    return out, info, d


# --------------------------------------------------------------------------- forward vs dense
SHAPES = {"Nq<Nk": (4, 9), "Nq=Nk": (6, 6), "Nq>Nk": (8, 5)}


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_matches_dense_all_features(backend, alpha, dtype, causal, shape):
    """GQA + right padding + NAPE ALiBi (slope 0 on NoPE heads) + per-token ASEntmax."""
    Nq, Nk = SHAPES[shape]
    rng, q, k, v = problem(zlib.crc32(repr((alpha, causal, shape)).encode()), Nq=Nq, Nk=Nk, dtype=dtype)
    beta = rng.uniform(0.1, 1.0, (2, 4, Nq))
    gamma = rng.uniform(-1.5, 1.5, (4, Nq))
    check_against_dense(backend, q, k, v, alpha, causal=causal, key_lengths=[Nk, Nk - 2],
                        alibi_slopes=[1.0, 0.5, 0.0, 0.0], beta=beta, gamma=gamma, delta=0.5, chunk=3)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_dense_plain_and_per_head(backend, alpha, causal):
    rng, q, k, v = problem(7, Hq=3, Hkv=3, Nq=5, Nk=7)
    check_against_dense(backend, q, k, v, alpha, causal=causal)
    check_against_dense(backend, q, k, v, alpha, causal=causal, beta=rng.uniform(0.1, 1, (3, 1)),
                        gamma=rng.uniform(-1, 1, (3, 1)))
    check_against_dense(backend, q, k, v, alpha, causal=causal, scale=0.3, alibi_slopes=[0.25, 0.5, 1.0])


@st.composite
def configs(draw):
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 3))
    b, nq, nk = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kw = {"causal": draw(st.booleans()), "chunk": draw(st.one_of(st.none(), st.integers(1, 4)))}
    if draw(st.booleans()):
        kw["key_lengths"] = draw(st.lists(st.integers(0, nk), min_size=b, max_size=b))
    if draw(st.booleans()):
        kw["alibi_slopes"] = draw(st.lists(st.sampled_from([0.0, 0.125, 0.5, 1.0]), min_size=hq, max_size=hq))
    scaling = draw(st.sampled_from(["none", "head", "token", "ssmax"]))
    alpha = draw(st.sampled_from(ALPHAS))
    if scaling == "ssmax":
        alpha = 1.0
        kw.update(beta=np.full((hq, 1), 0.8), gamma=1.0, delta=0.0)
    elif scaling != "none":
        shape = (hq, 1) if scaling == "head" else (b, hq, nq)
        vals = st.floats(0.05, 1.5)
        kw["beta"] = np.array(draw(st.lists(vals, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))).reshape(shape)
        kw["gamma"] = draw(st.floats(-2.0, 2.0))
        kw["delta"] = draw(st.floats(0.0, 1.0))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    seed = draw(st.integers(0, 2**32 - 1))
    return (b, hq, hkv, nq, nk, dtype, seed, alpha, kw)


@given(configs())
def test_matches_dense_random_configs(backend, cfg):
    b, hq, hkv, nq, nk, dtype, seed, alpha, kw = cfg
    _, q, k, v = problem(seed, B=b, Hq=hq, Hkv=hkv, Nq=nq, Nk=nk, D=4, Dv=3, dtype=dtype)
    check_against_dense(backend, q, k, v, alpha, **kw)


def test_low_precision_and_integer_inputs(backend):
    _, q, k, v = problem(3, Nq=4, Nk=4)
    out16 = _attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), backend=backend)
    assert out16.dtype == np.float16
    ref = _attention(q.astype(np.float16).astype(np.float32), k.astype(np.float16).astype(np.float32),
                       v.astype(np.float16).astype(np.float32), backend=backend)
    assert np.array_equal(out16, ref.astype(np.float16))
    qi, ki, vi = (np.round(3 * a).astype(np.int64) for a in (q, k, v))
    outi = _attention(qi, ki, vi, alpha=2.0, backend=backend)
    assert outi.dtype == np.float64
    np.testing.assert_array_equal(outi, _attention(qi.astype(float), ki.astype(float), vi.astype(float),
                                                     alpha=2.0, backend=backend))


# --------------------------------------------------------------------------- structure
@pytest.mark.parametrize("alpha", [1.0, 1.5, 3.0])
def test_gqa_equals_repeated_kv(backend, alpha):
    rng, q, k, v = problem(11, Hq=6, Hkv=2, Nq=5, Nk=6)
    kw = dict(alpha=alpha, causal=True, alibi_slopes=rng.uniform(0, 1, 6), beta=rng.uniform(0.1, 1, (6, 1)),
              gamma=rng.uniform(-1, 1, (6, 1)), backend=backend)
    kr, vr = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    out, info = _attention(q, k, v, return_info=True, **kw)
    out_r, info_r = _attention(q, kr, vr, return_info=True, **kw)
    d = dense(q, k, v, alpha=alpha, causal=True, alibi_slopes=kw["alibi_slopes"], beta=kw["beta"], gamma=kw["gamma"])
    tol = out_tol(d, v, alpha, np.float64)
    np.testing.assert_allclose(out, out_r, rtol=0, atol=tol)
    assert np.array_equal(info.support, info_r.support)
    g_out = rng.standard_normal(out.shape)
    g = _attention_vjp(g_out, q, k, v, **kw)
    g_r = _attention_vjp(g_out, q, kr, vr, **kw)
    summed = lambda a: a.reshape(a.shape[0], 2, 3, *a.shape[2:]).sum(axis=2)  # noqa: E731
    tols = grad_tols(d, q, k, v, g_out, alpha, beta=kw["beta"], gamma=kw["gamma"])
    np.testing.assert_allclose(g.dq, g_r.dq, rtol=0, atol=tols[0])
    np.testing.assert_allclose(g.dk, summed(g_r.dk), rtol=0, atol=tols[1])
    np.testing.assert_allclose(g.dv, summed(g_r.dv), rtol=0, atol=tols[2])
    for a, b_, t in zip(g[3:], g_r[3:], tols[3:]):
        np.testing.assert_allclose(a, b_, rtol=0, atol=t)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
def test_decoding_one_query_equals_last_causal_row(backend, alpha):
    rng, q, k, v = problem(5, Hq=4, Hkv=2, Nq=7, Nk=7)
    kw = dict(alpha=alpha, causal=True, alibi_slopes=[0.5, 0.25, 0.0, 0.0],
              beta=rng.uniform(0.2, 1, (4, 1)), gamma=rng.uniform(-1, 1, (4, 1)), backend=backend)
    out, info = _attention(q, k, v, return_info=True, **kw)
    d = dense(q, k, v, alpha=alpha, causal=True, alibi_slopes=kw["alibi_slopes"], beta=kw["beta"], gamma=kw["gamma"])
    tol = out_tol(d, v, alpha, np.float64)
    for m in (1, 3):  # decode one token; continue a prefill with 3 new queries
        out_m, info_m = _attention(q[:, :, -m:], k, v, return_info=True, **kw)
        np.testing.assert_allclose(out_m, out[:, :, -m:], rtol=0, atol=tol)
        assert np.array_equal(info_m.n, info.n[:, :, -m:])
        assert np.array_equal(info_m.support, info.support[:, :, -m:])
        np.testing.assert_allclose(info_m.s, info.s[:, :, -m:], rtol=0, atol=0)


def test_chunk_size_does_not_change_results(backend):
    rng, q, k, v = problem(9, Nq=9, Nk=11)
    kw = dict(alpha=1.5, causal=True, key_lengths=[11, 6], beta=rng.uniform(0.2, 1, (4, 1)),
              gamma=0.5, backend=backend)
    d = dense(q, k, v, alpha=1.5, causal=True, key_lengths=[11, 6], beta=kw["beta"], gamma=0.5)
    ref = _attention(q, k, v, chunk=1, **kw)
    g_out = rng.standard_normal(ref.shape)
    g_ref = _attention_vjp(g_out, q, k, v, chunk=1, **kw)
    tol = out_tol(d, v, 1.5, np.float64)
    tols = grad_tols(d, q, k, v, g_out, 1.5, beta=kw["beta"], gamma=0.5)
    for chunk in (2, 4, 9, None):
        np.testing.assert_allclose(_attention(q, k, v, chunk=chunk, **kw), ref, rtol=0, atol=tol)
        g = _attention_vjp(g_out, q, k, v, chunk=chunk, **kw)
        for a, b_, t in zip(g, g_ref, tols):
            np.testing.assert_allclose(a, b_, rtol=0, atol=t)


def test_rows_with_nothing_to_attend(backend):
    """key_lengths 0 and causal rows before the first key: zero output, tau -inf, zero grads."""
    rng, q, k, v = problem(2, B=2, Hq=2, Hkv=1, Nq=6, Nk=3)
    kw = dict(alpha=1.5, causal=True, key_lengths=[3, 0], beta=np.full((2, 1), 0.5), gamma=1.0, backend=backend)
    out, info = _attention(q, k, v, return_info=True, **kw)
    empty = info.n == 0
    assert empty[1].all() and empty[0, :, :3].all() and not empty[0, :, 3:].any()
    assert np.all(out[empty] == 0) and np.all(np.isneginf(info.tau[empty])) and np.all(info.support[empty] == 0)
    assert np.all(np.isnan(info.s[empty])) and np.all(info.skew[empty] == 0)
    g = _attention_vjp(rng.standard_normal(out.shape), q, k, v, tau=info.tau, out=out, **kw)
    assert np.all(g.dq[empty] == 0) and np.all(g.dk[1] == 0) and np.all(g.dv[1] == 0)
    assert np.all(np.isfinite(g.dbeta)) and np.all(np.isfinite(g.dgamma))


def test_skewed_output(backend):
    """info.skew = sum_j u_ij v_j / sum_j u_ij with u = p^(2-alpha); equals out at alpha = 1."""
    _, q, k, v = problem(4, Nq=5, Nk=6)
    for alpha in (1.0, 1.5, 3.0):
        out, info = _attention(q, k, v, alpha=alpha, return_info=True, backend=backend)
        d = dense(q, k, v, alpha=alpha)
        u = weights(d.p, alpha)
        skew = (u @ np.repeat(v, 2, axis=1)) / u.sum(-1, keepdims=True)
        tol = out_tol(d, v, alpha, np.float64) * max(1.0, float(np.abs(u).max() / u.sum(-1).min()))
        np.testing.assert_allclose(info.skew, skew, rtol=0, atol=tol)
        if alpha == 1.0:
            np.testing.assert_allclose(info.skew, out, rtol=0, atol=tol)


def test_inputs_not_modified(backend):
    rng, q, k, v = problem(1)
    beta, gamma = rng.uniform(0.1, 1, (4, 1)), rng.uniform(-1, 1, (4, 1))
    copies = [a.copy() for a in (q, k, v, beta, gamma)]
    out, info = _attention(q, k, v, beta=beta, gamma=gamma, return_info=True, backend=backend)
    g_out = np.ones_like(out)
    g_copy = g_out.copy()
    _attention_vjp(g_out, q, k, v, beta=beta, gamma=gamma, tau=info.tau, out=out, backend=backend)
    for a, c in zip((q, k, v, beta, gamma, g_out), copies + [g_copy]):
        assert np.array_equal(a, c)


# --------------------------------------------------------------------------- gradients
def grad_tols(d: Dense, q, k, v, g_out, alpha, *, scale=None, beta=None, gamma=None, offset=1.0):
    """Rounding bounds for (dq, dk, dv, dbeta, dgamma, ddelta) of two float64 evaluations.

    Each gradient is a chain of sums of products; its rounding error is at most
    (terms x eps + the forward's relative error) times the same sums taken over absolute
    values (the running-error bound), which are computed here from the dense p:
    |dZ| <= u (|dO| |v|^T + |dO| . skew_abs), |dQ| <= scale |s| |dZ| |K|, and so on.  The
    forward's score error dz moves u and p relatively by at most p^(1-alpha) * 2 (2 dz +
    Nk eps) on the support; terms = Hq Nq + Nk + D + Dv (+ B Hq Nq for the reductions of
    the scale's parameters)."""
    q, k, v, g_out = (np.asarray(a, np.float64) for a in (q, k, v, g_out))
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
    grp = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    kk, vv = np.abs(np.repeat(k, grp, axis=1)), np.abs(np.repeat(v, grp, axis=1))
    p, u = d.p, weights(d.p, alpha)
    su = u.sum(-1, keepdims=True)
    skew_abs = np.where(su > 0, (u @ vv) / np.where(su > 0, su, 1.0), 0.0)
    dO = np.abs(g_out)
    dz_abs = u * (dO @ np.swapaxes(vv, -1, -2) + (dO * skew_abs).sum(-1, keepdims=True))
    s_abs = np.abs(d.s)[..., None]
    group_sum = lambda a: a.reshape(B, Hkv, grp, *a.shape[2:]).sum(axis=2)  # noqa: E731
    abs_bounds = [
        scale * s_abs * (dz_abs @ kk),
        group_sum(scale * np.swapaxes(s_abs * dz_abs, -1, -2) @ np.abs(q)),
        group_sum(np.swapaxes(p, -1, -2) @ dO),
    ]
    ds_abs = (dz_abs * scale * (np.abs(q) @ np.swapaxes(kk, -1, -2))).sum(-1)
    if beta is not None:
        L = np.log(np.maximum(d.n, 1) + offset)
        b_ = np.broadcast_to(np.abs(beta), ds_abs.shape)
        g_ = np.broadcast_to(gamma, ds_abs.shape)
        abs_bounds += [np.sum(ds_abs * L**g_), np.sum(ds_abs * b_ * L**g_ * np.abs(np.log(L))), np.sum(ds_abs)]
    with np.errstate(divide="ignore"):
        sens = np.where(p > 0, p ** (1.0 - alpha), 0.0).max(initial=1.0)
    rel_fwd = 2 * max(1.0, float(sens)) * (2 * float(d.dz.max(initial=0.0)) + Nk * EPS)
    terms = Hq * Nq + Nk + D + Dv
    return [4 * ((terms + (B * Hq * Nq if i >= 3 else 0)) * EPS + rel_fwd) * float(np.max(a))
            for i, a in enumerate(abs_bounds)]


def fd_check(f, args, analytic, loss_terms, skip=None):
    """Central differences with h = eps^(1/3) (relative), against analytic gradients.

    Allowed error per entry: the Richardson estimate |FD(h) - FD(2h)| of the truncation
    error (the FD error is about a third of it) plus the rounding of the loss difference,
    loss_terms * eps * max(1, |L|) / h.  ``skip(idx, ii)`` true leaves entry ii of
    argument idx out (a masked score, say)."""
    base = f(*args)
    for idx, (a, g) in enumerate(zip(args, analytic)):
        a = np.asarray(a, np.float64)
        assert np.shape(g) == a.shape, (idx, np.shape(g), a.shape)
        for ii in np.ndindex(a.shape):
            if skip is not None and skip(idx, ii):
                continue
            h = EPS ** (1 / 3) * max(1.0, abs(a[ii]))
            vals = []
            for step in (h, 2 * h):
                ap, am = a.copy(), a.copy()
                ap[ii] += step
                am[ii] -= step
                lp, lm = list(args), list(args)
                lp[idx], lm[idx] = ap, am
                vals.append((f(*lp) - f(*lm)) / (2 * step))
            tol = abs(vals[0] - vals[1]) + loss_terms * EPS * max(1.0, abs(base)) / h
            assert abs(np.asarray(g)[ii] - vals[0]) <= tol, (idx, ii, float(np.asarray(g)[ii]), vals, tol)


def assert_grads_match(grads, leaves, tols):
    """Our (dq, dk, dv, dbeta, dgamma, ddelta) against the torch leaves' .grad, each within
    its absolute tolerance (zip stops at the shorter of grads and leaves)."""
    for name, ours, leaf, tol in zip(("dq", "dk", "dv", "dbeta", "dgamma", "ddelta"), grads, leaves, tols):
        theirs = leaf.grad.numpy()
        assert np.shape(ours) == theirs.shape, name
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol, err_msg=name)


def _margin_ok(d: Dense, alpha, margin=1e-2):
    """No live score within `margin` of the support boundary (where e_alpha has a kink)."""
    if alpha == 1.0:
        return True
    theta = np.where(np.isfinite(d.tau), (d.tau + 1) / (alpha - 1), np.inf)
    arg = 1 + (alpha - 1) * (d.z - theta[..., None])
    live = np.isfinite(d.z) & np.isfinite(theta[..., None])
    return bool(np.all(np.abs(arg[live]) >= margin))


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_match_finite_differences(backend, alpha, causal):
    """dq, dk, dv, dbeta (per head), dgamma (per token), ddelta against central differences,
    with GQA, ALiBi and padding, float64."""
    for seed in range(100):
        rng, q, k, v = problem(seed + 100, B=1, Hq=2, Hkv=1, Nq=3, Nk=4, D=2, Dv=2)
        beta, gamma, delta = rng.uniform(0.2, 1.0, (2, 1)), rng.uniform(-1, 1, (2, 3)), np.array(0.7)
        kw = dict(causal=causal, key_lengths=[3] if not causal else None, alibi_slopes=[0.4, 0.0])
        d = dense(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, **kw)
        if _margin_ok(d, alpha):
            break
    else:  # pragma: no cover
        pytest.fail("no seed with every score away from the support boundary")
    g_out = rng.standard_normal(d.out.shape)

    def loss(q, k, v, beta, gamma, delta):
        out = _attention(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, backend=backend, **kw)
        return float((out * g_out).sum())

    g = _attention_vjp(g_out, q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, backend=backend, **kw)
    assert g.dbeta.shape == beta.shape and g.dgamma.shape == gamma.shape and g.ddelta.shape == ()
    fd_check(loss, (q, k, v, beta, gamma, delta), g, loss_terms=4 * g_out.size)
    # from the forward's tau (and out) instead of from scratch: the same numbers
    out, info = _attention(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, return_info=True,
                             backend=backend, **kw)
    g2 = _attention_vjp(g_out, q, k, v, out=out, tau=info.tau, alpha=alpha, beta=beta, gamma=gamma,
                          delta=delta, backend=backend, **kw)
    tols = grad_tols(d, q, k, v, g_out, alpha, beta=beta, gamma=gamma)
    for a, b_, t in zip(g, g2, tols):
        np.testing.assert_allclose(a, b_, rtol=0, atol=t)


def test_gradients_without_scale_and_float32(backend):
    _, q, k, v = problem(21, Nq=4, Nk=5)
    g_out = np.random.default_rng(0).standard_normal((2, 4, 4, 2))
    g64 = _attention_vjp(g_out, q, k, v, alpha=1.5, causal=True, backend=backend)
    assert g64.dbeta is None and g64.dgamma is None and g64.ddelta is None
    g32 = _attention_vjp(g_out.astype(np.float32), q.astype(np.float32), k.astype(np.float32),
                           v.astype(np.float32), alpha=1.5, causal=True, backend=backend)
    assert all(a.dtype == np.float32 for a in g32[:3])
    # float32 inputs are computed in float64 from their float32 values: the float64 call on
    # those values, rounded once.
    g_ref = _attention_vjp(g_out.astype(np.float32).astype(np.float64), *(a.astype(np.float32).astype(np.float64)
                             for a in (q, k, v)), alpha=1.5, causal=True, backend=backend)
    for a, b_ in zip(g32[:3], g_ref[:3]):
        np.testing.assert_allclose(a, b_, rtol=0, atol=EPS32 * np.abs(b_).max())


# --------------------------------------------------------------------------- the paper's theory
def _probe(nk):
    """v = identity, so that the attention output row is the probability row itself."""
    return np.eye(nk)[None, None]


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_lemma1_keys_below_threshold_change_nothing(backend, alpha):
    """Appending keys whose scores are <= tau / (alpha - 1) leaves every probability as it
    was and gives the new keys exactly 0 (the support is unchanged); the only difference
    allowed is the rounding of re-solving the threshold on a longer row."""
    rng = np.random.default_rng(int(alpha * 100))
    n_old, n_new, D = 12, 500, 4
    q = rng.standard_normal((1, 1, 1, D))
    k_old = rng.standard_normal((1, 1, n_old, D))
    p_old, info = _attention(q, k_old, _probe(n_old), alpha=alpha, scale=1.0, return_info=True, backend=backend)
    cut = float(info.tau[0, 0, 0]) / (alpha - 1)  # scores <= cut get exactly 0
    # new keys along q with scores uniformly in [cut - 3, cut - 1e-9 (1 + |cut|)]
    target = rng.uniform(cut - 3, cut - 1e-9 * (1 + abs(cut)), n_new)
    k_new = (target / float((q * q).sum()))[None, None, :, None] * q[0, 0, 0][None, None, None, :]
    keys = np.concatenate([k_old, k_new], axis=2)
    perm = rng.permutation(n_old + n_new)
    p_all, info_all = _attention(q, keys[:, :, perm], _probe(n_old + n_new), alpha=alpha, scale=1.0,
                                   return_info=True, backend=backend)
    p_all = p_all[..., np.argsort(perm)]
    assert np.all(p_all[..., n_old:] == 0), "keys below the threshold must get exactly 0"
    assert int(info_all.support[0, 0, 0]) == int(info.support[0, 0, 0])
    u = weights(p_old, alpha)
    resolve = 4 * (np.log2(n_old + n_new) + 8) * EPS * max(1.0, float(u.max()))
    np.testing.assert_allclose(p_all[..., :n_old], p_old, rtol=0, atol=resolve)
    np.testing.assert_allclose(info_all.tau, info.tau, rtol=0, atol=resolve * (1 + abs(float(info.tau[0, 0, 0]))))
    # softmax, by contrast, shrinks every old probability
    s_old = _attention(q, k_old, _probe(n_old), alpha=1.0, scale=1.0, backend=backend)
    s_all = _attention(q, keys, _probe(n_old + n_new), alpha=1.0, scale=1.0, backend=backend)
    assert np.all(s_all[..., :n_old] < s_old)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("k_rel", [1, 2, 3, 4, 8])
def test_lemma2_gap_gives_exactly_uniform_on_k(backend, alpha, k_rel):
    """k keys at gap Delta >= k^(1-alpha)/(alpha-1) above n-k equal others get 1/k each and
    the others exactly 0, at every n; just below the gap the support is larger."""
    gap = k_rel ** (1 - alpha) / (alpha - 1)
    gap = np.nextafter(np.nextafter(gap, np.inf), np.inf)  # at or above the exact gap: the rows are exact
    for n in (k_rel + 1, 64, 4096, 100_000):
        for g in (gap, 1.5 * gap):
            x = np.zeros(n)
            x[:k_rel] = g
            p, info = backend.call(er.asentmax, x, alpha, beta=0.0, gamma=1.0, return_info=True)  # s = 1
            assert np.all(p[k_rel:] == 0), (n, g)
            assert int(info.support) == k_rel
            # the threshold is solved to the last bit; p then carries one rounding
            np.testing.assert_allclose(p[:k_rel], 1.0 / k_rel, rtol=0, atol=2 * np.spacing(1.0 / k_rel))
        x = np.zeros(n)
        x[:k_rel] = gap * (1 - 1e-3)
        assert int(er.support_size(backend.call(er.entmax, x, alpha))) == n


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alibi_window(backend, alpha, causal):
    """With ALiBi slope m and content scores of a row in [a, b], no key farther than
    (b - a + 1/(alpha-1)) / m gets mass (exactly), whatever the length."""
    rng = np.random.default_rng(3)
    N, D, H = 160, 4, 3
    slopes = np.array([1.0, 0.5, 0.125])
    q = rng.standard_normal((1, H, N, D))
    k = rng.standard_normal((1, 1, N, D))
    p, info = _attention(q, k, _probe(N), alpha=alpha, causal=causal, alibi_slopes=slopes, scale=0.5,
                           return_info=True, backend=backend)
    content = 0.5 * np.einsum("hid,jd->hij", q[0], k[0, 0])
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    visible = (j <= i) if causal else np.ones((N, N), bool)
    a = np.where(visible, content, np.inf).min(-1)
    b = np.where(visible, content, -np.inf).max(-1)
    bound = (b - a + 1 / (alpha - 1)) / slopes[:, None]  # (H, N)
    far = np.abs(i - j)[None] > bound[..., None]
    assert far.any()  # the bound bites
    assert np.all(p[0][far] == 0)
    assert np.all(info.support[0] <= np.floor(2 * bound + 1))


# --------------------------------------------------------------------------- memory
def _traced_peak(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_memory_is_chunk_by_keys_not_queries_by_keys():
    """Forward + backward at Nq = Nk = 3072 with 16-row chunks: the traced peak stays below
    the size of one (Nq, Nk) matrix even at 2 bytes per entry (float16); a float64 one
    would be 72 MiB.  (The numpy backend; the driver is what is under test.)"""
    N, D = 3072, 8
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, N, D)) for _ in range(3))
    g_out = rng.standard_normal((1, 1, N, D))

    def run():
        out, info = er.attention(q, k, v, alpha=1.0, chunk=16, return_info=True, backend="numpy")
        er.attention_vjp(g_out, q, k, v, alpha=1.0, chunk=16, out=out, tau=info.tau, backend="numpy")

    peak = _traced_peak(run)
    assert peak < 2 * N * N, f"peak {peak / 2**20:.1f} MiB >= an (Nq, Nk) float16 matrix"


@pytest.mark.slow
def test_memory_automatic_chunk_long_input():
    """Nq = Nk = 16,384 with the automatic chunk: the traced peak stays below one (Nq, Nk)
    boolean matrix (256 MiB; a float64 one is 2 GiB)."""
    N, D = 16_384, 16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, N, D)).astype(np.float32) for _ in range(3))
    g_out = rng.standard_normal((1, 1, N, D)).astype(np.float32)

    def run():
        out, info = er.attention(q, k, v, alpha=1.0, causal=True, return_info=True, backend="numpy")
        er.attention_vjp(g_out, q, k, v, alpha=1.0, causal=True, out=out, tau=info.tau, backend="numpy")

    peak = _traced_peak(run)
    assert peak < N * N, f"peak {peak / 2**20:.1f} MiB >= an (Nq, Nk) boolean matrix"


# --------------------------------------------------------------------------- bad input
def test_bad_input_raises_value_errors_naming_shapes():
    _, q, k, v = problem(0, B=2, Hq=4, Hkv=2, Nq=3, Nk=5, D=3, Dv=2)
    cases = [
        (dict(k=k[..., :2]), "head dim"),
        (dict(v=v[:, :, :4]), "must agree"),
        (dict(q=q[:, :3]), "multiple"),
        (dict(k=k[:1], v=v[:1]), "batch"),
        (dict(key_lengths=[5, 6]), r"\[0, 5\]"),
        (dict(key_lengths=[5]), r"shape \(2,\)"),
        (dict(alibi_slopes=[1.0, 1.0]), r"\(4,\)"),
        (dict(beta=np.ones(7), gamma=1.0), "broadcast"),
        (dict(beta=1.0), "together"),
        (dict(beta=1.0, gamma=1.0, offset=-4.5), r"n \+ offset = 0.5 at query row"),  # every row sees 5 keys
        (dict(delta=0.0), "only apply"),
        (dict(alpha=0.5), "alpha"),
        (dict(alpha=np.nan), "finite"),
        (dict(q=np.where(np.arange(3) == 1, np.nan, q)), "NaN"),
        (dict(k=np.where(np.arange(3) == 1, np.inf, k)), "infinite"),
        (dict(v=v[0]), "4 dimensions"),
        (dict(beta=np.nan, gamma=1.0), "beta"),
        (dict(chunk=0), "chunk"),
    ]
    for change, match in cases:
        args = dict(q=q, k=k, v=v)
        kw = {key: val for key, val in change.items() if key not in args}
        args.update({key: val for key, val in change.items() if key in args})
        with pytest.raises(ValueError, match=match):
            _attention(args["q"], args["k"], args["v"], **kw)
    with pytest.raises(ValueError, match="grad_out"):
        _attention_vjp(np.ones((2, 4, 3, 3)), q, k, v)
    with pytest.raises(ValueError, match="tau"):
        _attention_vjp(np.ones((2, 4, 3, 2)), q, k, v, tau=np.zeros((2, 4, 2)))
    with pytest.raises(ValueError, match="-inf"):
        _attention_vjp(np.ones((2, 4, 3, 2)), q, k, v, tau=np.full((2, 4, 3), -np.inf))
    with pytest.raises(ValueError, match="overflowed"):
        _attention(q * 1e200, k * 1e200, v)


# --------------------------------------------------------------------------- check_finite
def _cpu_only(backend):
    """Tests that pass an AttentionInfo or compare NaN placement: NumPy data on the CPU engines."""
    if backend not in ("numpy", "numba"):
        pytest.skip(f"{backend}: the CPU engines' check_finite=False semantics")


def _same_info(a, b):
    import dataclasses

    for f in dataclasses.fields(er.AttentionInfo):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=f.name)


def _cf_problem(seed, alpha, scaling):
    rng, q, k, v = problem(seed, B=2, Hq=4, Hkv=2, Nq=6, Nk=9, D=3, Dv=2)
    kw = dict(alpha=alpha, causal=True, key_lengths=[9, 6], alibi_slopes=[0.5, 0.0, 0.25, 0.0])
    if scaling:
        kw.update(beta=rng.uniform(0.2, 1.0, (4, 1)), gamma=rng.uniform(-1, 1, (4, 6)), delta=np.array(0.8))
    return rng, q, k, v, kw


@pytest.mark.parametrize("alpha", [1.0, 1.5, 3.0])
@pytest.mark.parametrize("scaling", [False, True], ids=["plain", "asentmax"])
def test_check_finite_off_is_bit_identical_on_clean_input(backend, alpha, scaling):
    """check_finite only decides whether q, k, v (and grad_out) are scanned: on clean
    input the outputs, every field of info and every gradient are the same bits."""
    rng, q, k, v, kw = _cf_problem(40, alpha, scaling)
    out, info = _attention(q, k, v, return_info=True, backend=backend, **kw)
    out2, info2 = _attention(q, k, v, return_info=True, backend=backend, check_finite=False, **kw)
    np.testing.assert_array_equal(out, out2)
    _same_info(info, info2)
    g_out = rng.standard_normal(out.shape)
    paths = [({}, {}), (dict(tau=info.tau, out=out), dict(tau=info2.tau, out=out2))]
    if backend in ("numpy", "numba"):  # the info residual, as NumPy arrays
        paths.append((dict(info=info), dict(info=info2)))
    for on, off in paths:
        g = _attention_vjp(g_out, q, k, v, backend=backend, **kw, **on)
        g2 = _attention_vjp(g_out, q, k, v, backend=backend, check_finite=False, **kw, **off)
        for name, a, b_ in zip(g._fields, g, g2):
            assert (a is None) == (b_ is None), name
            if a is not None:
                np.testing.assert_array_equal(a, b_, err_msg=f"{name} {sorted(on)}")


@pytest.mark.parametrize("where", ["q", "k", "v", "grad_out"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_check_finite_on_names_the_entry(backend, where, bad):
    _, q, k, v = problem(41, B=2, Hq=4, Hkv=2, Nq=3, Nk=5, D=3, Dv=2)
    g_out = np.ones((2, 4, 3, 2))
    arrs = dict(q=q, k=k, v=v, grad_out=g_out)
    arrs[where] = arrs[where].copy()
    arrs[where][1, 1, 2, 1] = bad
    match = rf"{where} contains 1 NaN or infinite value; the first is {where}\[1, 1, 2, 1\]"
    if where != "grad_out":
        with pytest.raises(ValueError, match=match):
            _attention(arrs["q"], arrs["k"], arrs["v"], backend=backend)
        with pytest.raises(ValueError, match=match):
            _attention(arrs["q"], arrs["k"], arrs["v"], backend=backend, check_finite=True)
    with pytest.raises(ValueError, match=match):
        _attention_vjp(arrs["grad_out"], arrs["q"], arrs["k"], arrs["v"], backend=backend)


@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_check_finite_off_nonfinite_q_or_k_is_the_overflow_error(backend, where, bad):
    """Unscanned, a NaN/inf in q or in a key some query attends makes scores non-finite:
    the overflow error (-inf is no mask there), forward and backward."""
    rng, q, k, v = problem(42, B=2, Hq=4, Hkv=2, Nq=3, Nk=5, D=3, Dv=2)
    arr = q if where == "q" else k
    arr[1, 1, 2 if where == "q" else 0, 1] = bad  # key 0: visible to every query
    g_out = rng.standard_normal((2, 4, 3, 2))
    for causal in (False, True):
        with pytest.raises(ValueError, match="attention scores overflowed"):
            _attention(q, k, v, causal=causal, backend=backend, check_finite=False)
        with pytest.raises(ValueError, match="attention scores overflowed"):
            _attention_vjp(g_out, q, k, v, causal=causal, backend=backend, check_finite=False)


def _holders(backend, q, k, v, kw, b, hk, j):
    """(B, Hq, Nq) bool: the rows whose support holds key j of kv-head hk in batch b, from
    the backend's own clean forward with v = the indicator of that key (out = p_ij)."""
    e = np.zeros(v.shape[:3] + (1,))
    e[b, hk, j, 0] = 1.0
    return _attention(q, k, e, backend=backend, **kw)[..., 0] > 0


def _no_skew(info):
    import dataclasses

    return dataclasses.replace(info, skew=None)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 3.0])
@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_check_finite_off_nonfinite_v_reaches_only_the_rows_that_need_it(backend, alpha, bad):
    """Unscanned, a NaN/inf in v at key j: info unchanged but for the skewed output; the
    rows whose support holds j are non-finite (output and skew); every other entry is
    non-finite or the clean bits, and on numba (support-only output) the clean bits."""
    _cpu_only(backend)
    rng, q, k, v, kw = _cf_problem(43, alpha, False)
    out, info = _attention(q, k, v, return_info=True, backend=backend, **kw)
    for j in (0, 3):
        holds = _holders(backend, q, k, v, kw, 1, 1, j)
        assert holds.any()
        vb = v.copy()
        vb[1, 1, j, 1] = bad
        with np.errstate(invalid="ignore"):  # numpy: 0 * inf in p @ v may warn (the caller's broken promise)
            out2, info2 = _attention(q, k, vb, return_info=True, backend=backend, check_finite=False, **kw)
        _same_info(_no_skew(info), _no_skew(info2))
        for got, clean in ((out2, out), (info2.skew, info.skew)):
            bad_rows = ~np.isfinite(got).all(-1)
            assert np.all(bad_rows[holds])
            assert np.all(~np.isfinite(got) | (got == clean))
            if backend == "numba":
                assert np.array_equal(bad_rows, holds)


@pytest.mark.parametrize("alpha", [1.5, 3.0])
@pytest.mark.parametrize("where", ["v", "grad_out"])
@pytest.mark.parametrize("path", ["recompute", "info"])
def test_check_finite_off_nonfinite_v_or_grad_out_in_the_gradients(backend, alpha, where, path):
    """Unscanned, a NaN in v or grad_out reaches the gradients as non-finite entries (a
    row i of grad_out: at least dv of row i's support keys), and no gradient entry is
    finite but different from the clean input's."""
    _cpu_only(backend)
    rng, q, k, v, kw = _cf_problem(44, alpha, True)
    g_out = rng.standard_normal((2, 4, 6, 2))
    out, info = _attention(q, k, v, return_info=True, backend=backend, **kw)
    extra = dict(info=info) if path == "info" else {}
    clean = _attention_vjp(g_out, q, k, v, backend=backend, **kw, **extra)
    vb, gb = v.copy(), g_out.copy()
    if where == "v":
        vb[1, 1, 2, 0] = np.nan
    else:
        gb[1, 2, 4, 0] = np.nan  # batch 1, query head 2 (kv-head 1), query 4
    g = _attention_vjp(gb, q, k, vb, backend=backend, check_finite=False, **kw, **extra)
    assert not all(np.isfinite(a).all() for a in g[:3])
    for name, a, c in zip(g._fields, g, clean):
        if a is not None:
            assert np.all(~np.isfinite(a) | (a == c)), name
    if where == "grad_out":  # dv of the support keys of row (1, 2, 4)
        support = [j for j in range(v.shape[2]) if _holders(backend, q, k, v, kw, 1, 1, j)[1, 2, 4]]
        assert support and all(np.isnan(g.dv[1, 1, j, 0]) for j in support)

def test_check_finite_off_numba_backward_from_info_reads_k_on_the_support_only(backend):
    """The numba backward given info scores the forward's support keys only: unscanned, a
    NaN in k off every row's support is not read (the clean gradients, bit for bit),
    while the forward, which scores every visible key, raises the overflow error.
    (float32: float64 attention runs the NumPy reference's driver, which scores every key.)"""
    if backend != "numba":
        pytest.skip("the numba backward's support keys")
    rng, q, k, v = problem(45, B=1, Hq=2, Hkv=1, Nq=2, Nk=12, D=3, Dv=2, spread=3.0, dtype=np.float32)
    kw = dict(alpha=1.5, causal=True)
    out, info = _attention(q, k, v, return_info=True, backend=backend, **kw)
    g_out = rng.standard_normal(out.shape)
    clean = _attention_vjp(g_out, q, k, v, info=info, backend=backend, **kw)
    off = [j for j in range(11) if not _holders(backend, q, k, v, kw, 0, 0, j).any()]  # both queries see 0..10
    assert off
    kb = k.copy()
    kb[0, 0, off[0], 0] = np.nan
    g = _attention_vjp(g_out, q, kb, v, info=info, backend=backend, check_finite=False, **kw)
    for name, a, c in zip(g._fields, g, clean):
        if a is not None:
            np.testing.assert_array_equal(a, c, err_msg=name)
    with pytest.raises(ValueError, match="attention scores overflowed"):
        _attention(q, kb, v, backend=backend, check_finite=False, **kw)


# --------------------------------------------------------------------------- peer: PyTorch autograd
def _peer():
    try:
        import entmax
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"cross-validation needs torch and the entmax package: {exc}")
    return torch, entmax


def torch_attention(torch, entmax, q, k, v, *, alpha, scale=None, causal=False, key_lengths=None,
                    alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0):
    """Eager attention as in the paper's code: q scaled by s_i, scores, ALiBi, mask,
    entmax_bisect (softmax at alpha = 1), matmul with v; GQA by repeating k and v."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    kk, vv = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    scale = 1.0 / D**0.5 if scale is None else scale
    i_abs, j = torch.arange(Nq) + Nk - Nq, torch.arange(Nk)
    lengths = torch.full((B,), Nk) if key_lengths is None else torch.as_tensor(key_lengths)
    visible = j[None, None, None, :] < lengths[:, None, None, None]
    if causal:
        visible = visible & (j[None, :] <= i_abs[:, None])[None, None]
    visible = visible.expand(B, Hq, Nq, Nk)
    if beta is not None:
        n = visible.sum(-1).to(q.dtype)
        s = delta + beta * torch.log(n + offset) ** gamma
        q = q * s[..., None]
    scores = (q @ kk.transpose(-1, -2)) * scale
    if alibi_slopes is not None:
        dist = (i_abs[:, None] - j[None, :]).abs().to(q.dtype)
        scores = scores - torch.as_tensor(alibi_slopes, dtype=q.dtype)[None, :, None, None] * dist
    scores = scores.masked_fill(~visible, float("-inf"))
    if alpha == 1.0:
        p = torch.softmax(scores, dim=-1)
    else:
        p = entmax.entmax_bisect(scores, alpha=alpha, dim=-1, n_iter=200)
    return p @ vv


@pytest.mark.peer
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scaling", ["head", "token"])
def test_matches_pytorch_autograd(backend, alpha, causal, scaling):
    """Forward and every gradient (q, k, v, beta, gamma, delta) against torch autograd
    through an eager entmax-package implementation, float64, GQA + ALiBi + padding."""
    torch, entmax = _peer()
    rng, q, k, v = problem(31 + int(alpha * 8) + 2 * causal, B=2, Hq=4, Hkv=2, Nq=5, Nk=6, D=3, Dv=2)
    shape = (4, 1) if scaling == "head" else (2, 4, 5)
    beta, gamma = rng.uniform(0.2, 1.2, shape), rng.uniform(-1.5, 1.5, shape)
    delta = np.array(0.8)
    kw = dict(causal=causal, key_lengths=[6, 5], alibi_slopes=[0.5, 0.25, 0.0, 0.0])
    g_out = rng.standard_normal((2, 4, 5, 2))

    out, info = _attention(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, return_info=True,
                             backend=backend, **kw)
    grads = _attention_vjp(g_out, q, k, v, out=out, tau=info.tau, alpha=alpha, beta=beta, gamma=gamma,
                             delta=delta, backend=backend, **kw)

    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v, beta, gamma, delta)]
    t_out = torch_attention(torch, entmax, *leaves[:3], alpha=alpha, beta=leaves[3], gamma=leaves[4],
                            delta=leaves[5], **kw)
    t_out.backward(torch.tensor(g_out))

    d = dense(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, **kw)
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=0, atol=out_tol(d, v, alpha, np.float64))
    assert_grads_match(grads, leaves, grad_tols(d, q, k, v, g_out, alpha, beta=beta, gamma=gamma))


def test_row_scale_gradient_with_overflowing_dz_on_equal_scores(backend):
    """alpha = 1000 on a row of equal scores (D = 0: every score is 0): p = 1/3 each and u
    = p^(2 - alpha) = 3^998 overflows, so dZ is +-inf, but every a_ij - a_im is exactly 0,
    so ds, and the ASEntmax parameters' gradients, are exactly 0 (the sum gave inf * 0 =
    NaN and attention_vjp raised; found by tests/test_fuzz_contract.py)."""
    q = np.zeros((1, 1, 1, 0))
    k = np.zeros((1, 1, 3, 0))
    v = np.array([0.12573022, -0.13210486, 0.64042265]).reshape(1, 1, 3, 1)
    kw = dict(alpha=1000.0, backend=backend, beta=0.0, gamma=0.0, offset=1.0)
    out = er.attention(q, k, v, **kw)
    g = er.attention_vjp(np.ones(out.shape), q, k, v, **kw)
    assert (g.dbeta, g.dgamma, g.ddelta) == (0.0, 0.0, 0.0)
    assert np.all(g.dv == g.dv[0, 0, 0, 0]) and abs(g.dv.sum() - 1.0) <= 4 * np.finfo(np.float64).eps


def test_a_gradient_beyond_float32s_range_is_inf_without_a_warning(backend):
    """Two tied keys at alpha = 1000: p = (1/2, 1/2), and the score gradient is
    p^(2 - alpha) (g - mean g) = 2^998 * (+-1/2), finite in float64 but beyond float32's
    range, so the float32 dk rounds to -+inf, as IEEE rounding does (valid input, no
    RuntimeWarning: the suite turns warnings into errors); dq (their sum, times q) is 0."""
    q = np.ones((1, 1, 1, 1), np.float32)
    k = np.ones((1, 1, 2, 1), np.float32)
    v = np.array([1.0, 0.0], np.float32).reshape(1, 1, 2, 1)
    out = er.attention(q, k, v, alpha=1000.0, backend=backend)
    g = er.attention_vjp(np.ones_like(out), q, k, v, alpha=1000.0, backend=backend)
    assert out.ravel().tolist() == [0.5]
    assert g.dq.ravel().tolist() == [0.0]
    assert g.dk.ravel().tolist() == [np.inf, -np.inf]
    assert g.dv.ravel().tolist() == [0.5, 0.5]
