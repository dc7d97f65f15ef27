"""Attention shapes real models use: alpha per query head (with dalpha) and key_padding_mask.

References: the dense formula (materialised scores, a visibility mask written out here,
``er.entmax`` row by row on the NumPy backend, ``er.entmax_alpha_vjp`` for dalpha), eager
PyTorch autograd through the ``entmax`` package's ``entmax_bisect`` (whose alpha is a
tensor with ``requires_grad``, so torch differentiates through alpha too), and central
finite differences in alpha.  Tolerances are the rounding bounds of tests/test_attention.py
(``out_tol``, ``tau_tol``, ``grad_tols``), evaluated with each head's alpha; for dalpha a
running-error bound of the same kind is derived in :func:`dalpha_tol`.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import EPS, Dense, assert_grads_match, grad_tols, out_tol, tau_tol, weights

import entmax_ref as er


@pytest.fixture(autouse=True)
def _cpu_engines_only(request):
    """These tests hand NumPy data to the CPU engines.  The cupy backend takes one-run
    key masks only (tests/test_cupy_backend.py::test_attention_key_padding_runs) and the
    strict stand-in array type is covered by tests/test_strict_array.py."""
    name = getattr(request.node, "callspec", None) and request.node.callspec.params.get("backend")
    if name not in (None, "numpy", "numba"):
        pytest.skip(f"{name}: covered by test_cupy_backend.py / test_strict_array.py")


# --------------------------------------------------------------------------- dense references
def visibility(B, Nq, Nk, *, causal=False, key_lengths=None, key_padding_mask=None):
    """(B, 1, Nq, Nk) bool: key j visible to query i of batch b (written out directly)."""
    i_abs, j = np.arange(Nq) + Nk - Nq, np.arange(Nk)
    vis = np.ones((B, 1, Nq, Nk), bool)
    if causal:
        vis &= (j[None, :] <= i_abs[:, None])[None, None]
    if key_lengths is not None:
        vis &= (j[None, :] < np.asarray(key_lengths)[:, None])[:, None, None, :]
    if key_padding_mask is not None:
        vis &= np.asarray(key_padding_mask, bool)[:, None, None, :]
    return vis


def dense(q, k, v, *, alpha, visible, scale=None, alibi_slopes=None, beta=None, gamma=None, delta=1.0,
          offset=1.0) -> Dense:
    """The dense formula with an explicit visibility mask and alpha per query head."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    i_abs, j = np.arange(Nq) + Nk - Nq, np.arange(Nk)
    vis = np.broadcast_to(visible, (B, Hq, Nq, Nk))
    n = vis.sum(-1)
    s = np.ones((B, Hq, Nq))
    if beta is not None:
        s = np.where(n > 0, delta + beta * np.log(np.maximum(n, 1) + offset) ** gamma, 1.0)
    a = scale * np.einsum("bhid,bhjd->bhij", q, kk)
    bias = np.zeros((1, Hq, Nq, Nk))
    if alibi_slopes is not None:
        bias = -np.asarray(alibi_slopes)[None, :, None, None] * np.abs(i_abs[:, None] - j[None, :])
    z = np.where(vis, s[..., None] * a + bias, -np.inf)
    rows_alpha = np.broadcast_to(np.broadcast_to(np.asarray(alpha, np.float64), (Hq,))[None, :, None], (B, Hq, Nq))
    p, info = er.entmax(z, rows_alpha, backend="numpy", return_info=True)
    mag = np.abs(s)[..., None] * scale * np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(kk)) + np.abs(bias)
    dz = (D + 4) * EPS * np.where(vis, mag, 0.0).max(-1, initial=0.0)
    return Dense(p @ vv, p, z, info.tau, info.support, s, n, dz)


def dense_dalpha(d: Dense, v, g_out, alpha):
    """dL/dalpha per head from the row transform's alpha VJP on the dense rows."""
    Hq = d.p.shape[1]
    vv = np.repeat(v, Hq // v.shape[1], axis=1)
    gp = g_out @ np.swapaxes(vv, -1, -2)  # dL/dp_ij = dO_i . v_j
    rows_alpha = np.broadcast_to(np.asarray(alpha, np.float64)[None, :, None], d.p.shape[:3])
    per_row = er.entmax_alpha_vjp(d.p, gp, rows_alpha, backend="numpy")
    return np.where(d.n > 0, per_row, 0.0).sum(axis=(0, 2))


def _dalpha_parts(d: Dense, v, g_out, alpha):
    """(alpha as (1, Hq, 1, 1), |g|_j = |dO| . |v_j| per score, u = p^(2-alpha), sum u
    per row) for the dalpha bounds."""
    Hq = d.p.shape[1]
    a = np.asarray(alpha, np.float64)[None, :, None, None]
    vv = np.abs(np.repeat(v, Hq // v.shape[1], axis=1))
    g_abs = np.abs(g_out) @ np.swapaxes(vv, -1, -2)
    u = weights(d.p, a)
    return a, g_abs, u, u.sum(-1, keepdims=True)


def dalpha_tol(d: Dense, v, g_out, alpha, grad_rel):
    """Bound on |dalpha - dalpha'| for two float64 evaluations of the same problem.

    Per row dalpha = sum_j c_j (g_j - r) with g_j = dO . v_j, r = sum u g / sum u and
    c_j = -p_j l_j^2 h(-(alpha-1) l_j) (l = log p), |c_j| <= p_j l_j^2 e^{(alpha-1)|l_j|}.
    Its rounding is at most (Nk + Dv) eps times sum_j |c_j| (|g|_j + |g|_r), and the
    forward's relative error ``grad_rel`` (the score error carried through p^(1-alpha))
    moves c_j by at most (2 + |l_j|) grad_rel |c_j| relative, so the bound is that sum times
    4 ((Nk + Dv + B Nq) eps + (2 + max|l|) grad_rel)."""
    a, g_abs, u, su = _dalpha_parts(d, v, g_out, alpha)
    r_abs = np.where(su > 0, (u * g_abs).sum(-1, keepdims=True) / np.where(su > 0, su, 1.0), 0.0)
    on = d.p > 0
    with np.errstate(divide="ignore"):
        lp = np.where(on, np.log(np.where(on, d.p, 1.0)), 0.0)
    c_abs = np.where(on, d.p * lp**2 * np.exp((a - 1.0) * np.abs(lp)), 0.0)
    total = (c_abs * (g_abs + r_abs)).sum(axis=(0, 2, 3))
    B, _, Nq, Nk = d.p.shape
    return 4 * ((Nk + v.shape[-1] + B * Nq) * EPS + (2 + float(np.abs(lp).max())) * grad_rel) * total


def fwd_rel(d: Dense, alpha):
    """The forward's relative error on p and u (as in test_attention.grad_tols)."""
    a = np.asarray(alpha, np.float64)[None, :, None, None]
    with np.errstate(divide="ignore"):
        sens = np.where(d.p > 0, d.p ** (1.0 - a), 0.0).max(initial=1.0)
    return 2 * max(1.0, float(sens)) * (2 * float(d.dz.max(initial=0.0)) + d.p.shape[-1] * EPS)


def problem(seed, *, B=2, Hq=4, Hkv=2, Nq=5, Nk=7, D=3, Dv=2, spread=1.5):
    rng = np.random.default_rng(seed)
    q = spread * rng.standard_normal((B, Hq, Nq, D))
    k = spread * rng.standard_normal((B, Hkv, Nk, D))
    v = rng.standard_normal((B, Hkv, Nk, Dv))
    return rng, q, k, v


def left_padding_mask(lengths, Nk):
    """(B, Nk) mask of left-padded sequences: the last ``lengths[b]`` keys are real."""
    return np.arange(Nk)[None, :] >= (Nk - np.asarray(lengths))[:, None]


def check_forward(backend, q, k, v, alpha, *, causal=False, key_lengths=None, key_padding_mask=None, **kw):
    B, _, Nq, _ = q.shape
    Nk = k.shape[2]
    out, info = er.attention(q, k, v, alpha=alpha, causal=causal, key_lengths=key_lengths,
                             key_padding_mask=key_padding_mask, return_info=True, backend=backend, **kw)
    vis = visibility(B, Nq, Nk, causal=causal, key_lengths=key_lengths, key_padding_mask=key_padding_mask)
    d = dense(q, k, v, alpha=alpha, visible=vis, **kw)
    a4 = np.broadcast_to(np.asarray(alpha, np.float64), (q.shape[1],))[None, :, None, None]
    np.testing.assert_allclose(out, d.out, rtol=0, atol=out_tol(d, v, a4, np.float64))
    live = d.n > 0
    assert np.array_equal(info.n, d.n)
    assert np.array_equal(info.support, d.support)
    assert np.array_equal(np.isneginf(info.tau), ~live)
    np.testing.assert_allclose(info.tau[live], d.tau[live], rtol=0, atol=tau_tol(d, float(np.max(alpha))))
    assert np.all(out[~live] == 0)
    if kw.get("beta") is not None:
        np.testing.assert_allclose(info.s[live], d.s[live], rtol=4 * EPS, atol=0)
    return out, info, d


# --------------------------------------------------------------------------- alpha per head
HEAD_ALPHAS = {
    "mixed": [1.0, 1.25, 2.0, 3.0],
    "near1": [1.0, 1.0 + 1e-9, 1.001, 1.5],
    "above1": [1.0 + 1e-9, 1.25, 2.0, 3.0],  # no softmax head: numba's fused kernels throughout
    "equal": [1.5, 1.5, 1.5, 1.5],
}


@pytest.mark.parametrize("alphas", list(HEAD_ALPHAS), ids=list(HEAD_ALPHAS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alpha_per_head_forward_matches_dense(backend, alphas, causal):
    rng, q, k, v = problem(3 + causal)
    alpha = np.array(HEAD_ALPHAS[alphas])
    check_forward(backend, q, k, v, alpha, causal=causal, key_lengths=[7, 5], alibi_slopes=[0.5, 0.0, 0.25, 0.0],
                  beta=rng.uniform(0.3, 1.0, (4, 1)), gamma=rng.uniform(-1, 1, (4, 1)))


def test_alpha_per_head_equals_one_call_per_head(backend):
    """Each head of a per-head call is bit-identical to... the same head run with its
    scalar alpha (same rows, same solver), for MHA; with GQA the kv head is shared."""
    _, q, k, v = problem(5, Hq=4, Hkv=4)
    alpha = np.array([1.0, 1.25, 2.0, 3.0])
    out, info = er.attention(q, k, v, alpha=alpha, causal=True, return_info=True, backend=backend)
    for h in range(4):
        o_h, i_h = er.attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], alpha=float(alpha[h]), causal=True,
                                return_info=True, backend="numpy")
        np.testing.assert_allclose(out[:, h:h + 1], o_h, rtol=0, atol=8 * EPS)
        assert np.array_equal(info.support[:, h:h + 1], i_h.support)
        np.testing.assert_allclose(info.tau[:, h:h + 1], i_h.tau, rtol=8 * EPS, atol=0)


@pytest.mark.parametrize("alphas", list(HEAD_ALPHAS), ids=list(HEAD_ALPHAS))
@pytest.mark.parametrize("masked", [False, True], ids=["lengths", "mask"])
def test_dalpha_matches_dense_row_vjp_and_finite_differences(backend, alphas, masked):
    """dalpha through attention equals the row transform's alpha VJP summed over each
    head's rows (exact through alpha -> 1: the 'near1' heads), and central differences."""
    rng, q, k, v = problem(11)
    alpha = np.array(HEAD_ALPHAS[alphas])
    kw = dict(causal=True, key_lengths=[7, 6], key_padding_mask=left_padding_mask([7, 5], 7) if masked else None,
              alibi_slopes=[0.3, 0.0, 0.0, 0.1])
    g_out = rng.standard_normal((2, 4, 5, 2))
    grads = er.attention_vjp(g_out, q, k, v, alpha=alpha, backend=backend, **kw)
    assert grads.dalpha.shape == (4,) and grads.dalpha.dtype == np.float64
    vis = visibility(2, 5, 7, causal=True, key_lengths=[7, 6], key_padding_mask=kw["key_padding_mask"])
    d = dense(q, k, v, alpha=alpha, visible=vis, alibi_slopes=kw["alibi_slopes"])
    tol = dalpha_tol(d, v, g_out, alpha, fwd_rel(d, alpha))
    np.testing.assert_array_less(np.abs(grads.dalpha - dense_dalpha(d, v, g_out, alpha)), tol + 1e-300)

    def loss(a):
        return float((er.attention(q, k, v, alpha=a, backend="numpy", **kw) * g_out).sum())

    for h in range(4):
        hstep = 1e-5
        e = np.zeros(4)
        e[h] = hstep
        lo = np.maximum(alpha - e, 1.0)  # alpha >= 1: one-sided at alpha = 1
        fd = (loss(alpha + e) - loss(lo)) / (alpha[h] + hstep - lo[h])
        # central: h^2 |L'''| / 6 plus rounding eps |L| / h, about 1e-10 here (1e-6 leaves
        # room for a support change within the step); one-sided at 1: h |L''| / 2
        central = lo[h] == alpha[h] - hstep
        tol = (1e-6 if central else 1e-4) * (1 + abs(fd))
        assert abs(grads.dalpha[h] - fd) <= tol, (h, grads.dalpha[h], fd)


def test_dalpha_continuous_through_one(backend):
    """dalpha(1 + e) -> dalpha(1) linearly as e -> 0 (no 1/(alpha - 1)^2 blow-up)."""
    rng, q, k, v = problem(17, Hq=2, Hkv=1)
    g_out = rng.standard_normal((2, 2, 5, 2))
    base = er.attention_vjp(g_out, q, k, v, alpha=np.array([1.0, 1.0]), causal=True, backend=backend).dalpha
    assert np.all(np.isfinite(base)) and np.all(base != 0)
    for e in (1e-4, 1e-7, 1e-10, 1e-13):
        near = er.attention_vjp(g_out, q, k, v, alpha=np.array([1.0 + e, 1.0]), causal=True, backend=backend).dalpha
        assert abs(near[0] - base[0]) <= 100 * e * abs(base[0]) + 1e-13 * abs(base[0])
        assert near[1] == base[1]  # the other head is untouched


def test_scalar_and_array_alpha(backend):
    """A Python scalar gives dalpha None; a 0-d array gives a 0-d dalpha equal to the sum
    of the per-head dalpha of the same problem; a uniform (Hq,) array the per-head split.
    Asking for dalpha leaves dq, dk, dv as they were (to their rounding bound: on numba the
    alpha gradient runs the NumPy driver instead of the fused kernels)."""
    rng, q, k, v = problem(19)
    g_out = rng.standard_normal((2, 4, 5, 2))
    g0 = er.attention_vjp(g_out, q, k, v, alpha=1.5, backend=backend)
    assert g0.dalpha is None
    g1 = er.attention_vjp(g_out, q, k, v, alpha=np.array(1.5), backend=backend)
    g2 = er.attention_vjp(g_out, q, k, v, alpha=np.full(4, 1.5), backend=backend)
    assert g1.dalpha.shape == () and g2.dalpha.shape == (4,)
    np.testing.assert_allclose(g1.dalpha, g2.dalpha.sum(), rtol=8 * EPS)
    d = dense(q, k, v, alpha=np.full(4, 1.5), visible=visibility(2, 5, 7))
    for a, b, tol in zip(g0[:3], g2[:3], grad_tols(d, q, k, v, g_out, 1.5)):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)
        if backend == "numpy":
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- key_padding_mask
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["holes", "runs"])
def test_key_padding_mask_matches_dense(backend, alpha, causal, kind):
    """Left padding, holes, combined with causal and key_lengths, ASEntmax n over the
    visible keys, rows with nothing to attend.  ("runs": every batch's keys one contiguous
    run, which numba computes with its fused kernels on the run; "holes": not.)"""
    rng, q, k, v = problem(23 + causal, B=3, Nq=6, Nk=8)
    mask = np.ones((3, 8), bool)
    mask[0, :3] = False  # left padding
    if kind == "holes":
        mask[1, [1, 4, 6]] = False
    else:
        mask[1, [0, 6, 7]] = False  # left and right padding
    mask[2, :] = False  # nothing to attend
    check_forward(backend, q, k, v, alpha, causal=causal, key_lengths=[8, 7, 8], key_padding_mask=mask,
                  alibi_slopes=[0.5, 0.25, 0.0, 0.1], beta=rng.uniform(0.3, 1.0, (4, 1)),
                  gamma=rng.uniform(-1, 1, (4, 1)))


def test_all_true_mask_is_no_mask_and_prefix_mask_is_key_lengths(backend):
    _, q, k, v = problem(29)
    ref = er.attention(q, k, v, causal=True, backend=backend)
    np.testing.assert_allclose(er.attention(q, k, v, causal=True, key_padding_mask=np.ones((2, 7), bool),
                                            backend=backend), ref, rtol=0, atol=4 * EPS)
    by_len = er.attention(q, k, v, key_lengths=[5, 3], backend=backend)
    by_mask = er.attention(q, k, v, key_padding_mask=np.arange(7)[None] < np.array([[5], [3]]), backend=backend)
    np.testing.assert_allclose(by_mask, by_len, rtol=0, atol=4 * EPS)


def test_left_padded_batch_equals_unpadded_sequences(backend):
    """A left-padded causal batch (keys masked, queries aligned bottom-right) gives each
    sequence's rows exactly what the unpadded sequence gives alone."""
    rng, q, k, v = problem(31, B=2, Nq=6, Nk=6)
    lengths = [6, 4]
    mask = left_padding_mask(lengths, 6)
    kw = dict(alpha=1.5, causal=True, alibi_slopes=[0.5, 0.25, 0.0, 0.1], beta=np.full((4, 1), 0.7),
              gamma=np.full((4, 1), 0.5))
    out = er.attention(q, k, v, key_padding_mask=mask, backend=backend, **kw)
    for b, L in enumerate(lengths):
        alone = er.attention(q[b:b + 1, :, 6 - L:], k[b:b + 1, :, 6 - L:], v[b:b + 1, :, 6 - L:], backend=backend, **kw)
        np.testing.assert_allclose(out[b:b + 1, :, 6 - L:], alone, rtol=0, atol=16 * EPS)
        assert np.all(out[b, :, :6 - L] == 0)  # padded queries see only padded keys


def test_keys_visible_with_mask():
    mask = np.array([[False, True, True, False, True]])
    assert er.keys_visible(3, 5, key_padding_mask=mask).tolist() == [[[3, 3, 3]]]
    assert er.keys_visible(3, 5, causal=True, key_padding_mask=mask).tolist() == [[[2, 2, 3]]]
    assert er.keys_visible(3, 5, causal=True, key_padding_mask=mask, key_lengths=[4]).tolist() == [[[2, 2, 2]]]


# --------------------------------------------------------------------------- peer: PyTorch autograd
def _peer():
    try:
        import entmax
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"cross-validation needs torch and the entmax package: {exc}")
    return torch, entmax


def torch_attention(torch, entmax, q, k, v, alpha, visible, *, alibi_slopes=None, beta=None, gamma=None,
                    delta=1.0, offset=1.0):
    """Eager attention with an explicit (B, 1, Nq, Nk) visibility mask and one alpha per
    head (a tensor: entmax_bisect differentiates through it); softmax where alpha = 1.
    Rows with nothing visible get p = 0 (computed on dummy scores, then multiplied by 0)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    kk, vv = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    vis = torch.as_tensor(visible).expand(B, Hq, Nq, Nk)
    live = vis.any(-1, keepdim=True)
    safe_vis = vis | ~live
    if beta is not None:
        n = vis.sum(-1).to(q.dtype)
        s = delta + beta * torch.log(n.clamp(min=1) + offset) ** gamma
        q = q * s[..., None]
    scores = (q @ kk.transpose(-1, -2)) / D**0.5
    if alibi_slopes is not None:
        i_abs, j = torch.arange(Nq) + Nk - Nq, torch.arange(Nk)
        dist = (i_abs[:, None] - j[None, :]).abs().to(q.dtype)
        scores = scores - torch.as_tensor(alibi_slopes, dtype=q.dtype)[None, :, None, None] * dist
    scores = scores.masked_fill(~safe_vis, float("-inf"))
    heads = []
    for h in range(Hq):
        sh = scores[:, h:h + 1]
        if float(alpha[h].detach()) == 1.0:
            heads.append(torch.softmax(sh, dim=-1))
        else:
            a = alpha[h].reshape(1, 1, 1, 1).expand(B, 1, Nq, 1)
            heads.append(entmax.entmax_bisect(sh, alpha=a, dim=-1, n_iter=200))
    p = torch.cat(heads, dim=1) * live
    return p @ vv


def bisect_dalpha_tol(d: Dense, v, g_out, alpha):
    """Extra error of entmax_bisect's own alpha gradient: it evaluates
    (g.(p - p_sk))/(alpha-1)^2 - g.(S - p_sk H)/(alpha-1) (S = p log p, H = sum S), whose
    terms cancel as alpha -> 1: rounding of about Nk eps times the terms' magnitudes."""
    a, g_abs, u, su = _dalpha_parts(d, v, g_out, alpha)
    psk = np.where(su > 0, u / np.where(su > 0, su, 1.0), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        S = np.where(d.p > 0, np.abs(d.p * np.log(d.p)), 0.0)
    H = S.sum(-1, keepdims=True)
    terms = g_abs * ((d.p + psk) / (a - 1.0) ** 2 + (S + psk * H) / (a - 1.0))
    return 8 * (d.p.shape[-1] + v.shape[-1]) * EPS * terms.sum(axis=(0, 2, 3))


@pytest.mark.peer
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("alphas", ["sparse", "with_softmax"])
@pytest.mark.parametrize("masked", [False, True], ids=["lengths", "mask"])
def test_matches_pytorch_autograd(backend, causal, alphas, masked):
    """Forward and every gradient (q, k, v, beta, gamma, delta and, where torch has it,
    alpha) against torch autograd: alpha per head, GQA, ALiBi, ASEntmax, a left-padded
    key_padding_mask combined with key_lengths and causal."""
    torch, entmax = _peer()
    rng, q, k, v = problem(37 + causal + 2 * (alphas == "sparse"), B=2, Hq=4, Hkv=2, Nq=5, Nk=6)
    alpha = np.array([1.25, 1.5, 2.0, 3.0] if alphas == "sparse" else [1.0, 1.5, 1.0, 2.0])
    beta, gamma, delta = rng.uniform(0.3, 1.2, (4, 1)), rng.uniform(-1, 1, (4, 1)), np.array(0.8)
    mask = left_padding_mask([6, 4], 6)
    mask[0, 2] = False
    if not masked:  # numba: the fused kernels (with alpha > 1 on every head)
        mask = None
    kw = dict(causal=causal, key_lengths=[6, 5], key_padding_mask=mask, alibi_slopes=[0.5, 0.25, 0.0, 0.0])
    g_out = rng.standard_normal((2, 4, 5, 2))

    out, info = er.attention(q, k, v, alpha=alpha, beta=beta, gamma=gamma, delta=delta, return_info=True,
                             backend=backend, **kw)
    grads = er.attention_vjp(g_out, q, k, v, out=out, tau=info.tau, alpha=alpha, beta=beta, gamma=gamma,
                             delta=delta, backend=backend, **kw)

    vis = visibility(2, 5, 6, causal=causal, key_lengths=[6, 5], key_padding_mask=mask)
    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v, beta, gamma, delta, alpha)]
    t_out = torch_attention(torch, entmax, *leaves[:3], leaves[6], vis, alibi_slopes=kw["alibi_slopes"],
                            beta=leaves[3], gamma=leaves[4], delta=leaves[5])
    t_out.backward(torch.tensor(g_out))

    d = dense(q, k, v, alpha=alpha, visible=vis, alibi_slopes=kw["alibi_slopes"], beta=beta, gamma=gamma,
              delta=delta)
    assert (d.n == 0).any() == (causal and masked)  # left-padded causal rows that see nothing
    a4 = alpha[None, :, None, None]
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=0, atol=out_tol(d, v, a4, np.float64))
    assert_grads_match(grads, leaves, grad_tols(d, q, k, v, g_out, a4, beta=beta, gamma=gamma))
    sparse = alpha > 1.0  # entmax_bisect's alpha gradient divides by (alpha - 1)^2
    theirs = leaves[6].grad.numpy()
    tol = dalpha_tol(d, v, g_out, alpha, fwd_rel(d, alpha)) + np.where(
        sparse, bisect_dalpha_tol(d, v, g_out, np.where(sparse, alpha, 2.0)), 0.0)
    assert grads.dalpha.shape == (4,)
    np.testing.assert_array_less(np.abs(grads.dalpha - theirs)[sparse], tol[sparse])
    # at alpha = 1 torch has no alpha gradient; the dense row VJP is the reference there
    np.testing.assert_array_less(np.abs(grads.dalpha - dense_dalpha(d, v, g_out, alpha))[~sparse],
                                 dalpha_tol(d, v, g_out, alpha, fwd_rel(d, alpha))[~sparse])


# --------------------------------------------------------------------------- bad input
def test_bad_input_names_argument_and_expected_shape():
    _, q, k, v = problem(41)
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool array of shape \(2, 7\)"):
        er.attention(q, k, v, key_padding_mask=np.ones((2, 6), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool array of shape \(2, 7\).*int64"):
        er.attention(q, k, v, key_padding_mask=np.ones((2, 7), np.int64))
    with pytest.raises(ValueError, match=r"key_padding_mask .*shape \(2, 7\)"):
        er.attention_vjp(np.ones((2, 4, 5, 2)), q, k, v, key_padding_mask=np.ones(7, bool))
    with pytest.raises(ValueError, match=r"alpha must be a scalar or one value per query head, shape \(\) or \(4,\)"):
        er.attention(q, k, v, alpha=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match=r"shape \(\) or \(4,\)"):
        er.attention_vjp(np.ones((2, 4, 5, 2)), q, k, v, alpha=np.ones((4, 1)))
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        er.attention(q, k, v, alpha=np.array([1.5, 0.5, 2.0, 2.0]))
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        er.attention(q, k, v, alpha=np.array([1.5, np.nan, 2.0, 2.0]))
    with pytest.raises(ValueError, match="alpha must be >= 1"):
        er.attention(q, k, v, alpha=0.5)


def test_inputs_not_modified(backend):
    rng, q, k, v = problem(43)
    mask = left_padding_mask([7, 4], 7)
    alpha = np.array([1.0, 1.5, 2.0, 3.0])
    copies = [a.copy() for a in (q, k, v, mask, alpha)]
    g_out = rng.standard_normal((2, 4, 5, 2))
    er.attention_vjp(g_out, q, k, v, alpha=alpha, key_padding_mask=mask, causal=True, backend=backend)
    for a, c in zip((q, k, v, mask, alpha), copies):
        np.testing.assert_array_equal(a, c)


# --------------------------------------------------------------------------- entmax-ref check
def test_check_battery_covers_key_padding_mask():
    """The attention battery of ``entmax-ref check`` has a key_padding_mask case: the
    library passes it (forward and gradients), an implementation ignoring the mask fails it."""
    from entmax_ref.testing import check_attention

    kw = dict(features=("causal", "key_padding_mask"), dtypes=("float64",), size="quick")
    rep = check_attention(lambda q, k, v, **a: er.attention(q, k, v, **a), 1.5,
                          vjp=lambda do, q, k, v, **a: er.attention_vjp(do, q, k, v, **a)[:3], **kw)
    assert rep.ok, rep.table()

    def ignores_mask(q, k, v, key_padding_mask=None, **a):
        return er.attention(q, k, v, **a)

    rep = check_attention(ignores_mask, 1.5, **kw)
    assert not rep.ok
    assert "[key_padding_mask]" in " ".join(rep.rows[0].notes)
