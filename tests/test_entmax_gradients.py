"""Jacobian, VJPs (w.r.t. x and alpha) and Fenchel-Young losses against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import entmax_ref as er
from entmax_ref.testing.strategies import alphas

EPS = float(np.finfo(np.float64).eps)
H = 1e-6  # central-difference step: truncation ~ H^2 |p'''|, rounding ~ eps / H


def _rows(seed, rows=3, n=6, scale=2.0):
    return np.random.default_rng(seed).standard_normal((rows, n)) * scale


def _clear_of_kinks(x, alpha, backend, margin):
    """True when no score lies within ``margin`` of the support boundary (FD is smooth)."""
    if alpha == 1.0:
        return True
    tau = backend.call(er.entmax_threshold, x, alpha)
    gap = np.abs((alpha - 1) * x - tau[..., None]) / (alpha - 1)
    return bool(np.all(gap > margin))


@given(st.integers(0, 2**32 - 1), alphas(1.0, 3.0))
def test_jacobian_symmetric_rows_sum_to_zero_and_matches_fd(backend, seed, alpha):
    x = _rows(seed)
    assume(_clear_of_kinks(x, alpha, backend, 1e-3))
    p = backend.call(er.entmax, x, alpha)
    J = backend.call(er.entmax_jacobian, p, alpha)
    assert J.shape == (3, 6, 6)
    np.testing.assert_allclose(J, np.swapaxes(J, -1, -2), rtol=0, atol=4 * EPS)
    np.testing.assert_allclose(J.sum(axis=-1), 0.0, rtol=0, atol=16 * EPS * max(1.0, np.abs(J).max()))
    fd = np.empty_like(J)
    for j in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, j] = H
        fd[:, :, j] = (backend.call(er.entmax, x + e, alpha) - backend.call(er.entmax, x - e, alpha)) / (2 * H)
    np.testing.assert_allclose(J, fd, rtol=0, atol=1e-7 * max(1.0, np.abs(J).max()))


@given(st.integers(0, 2**32 - 1), alphas(1.0, 4.0))
def test_vjp_equals_grad_times_jacobian(backend, seed, alpha):
    x = _rows(seed)
    g = np.random.default_rng(seed + 1).standard_normal(x.shape)
    p = backend.call(er.entmax, x, alpha)
    J = backend.call(er.entmax_jacobian, p, alpha)
    vjp = backend.call(er.entmax_vjp, p, g, alpha)
    u = np.where(p > 0, np.where(p > 0, p, 1.0) ** (2 - alpha), 0.0)
    mean_abs = (u * np.abs(g)).sum(-1, keepdims=True) / u.sum(-1, keepdims=True)
    bound = 8 * x.shape[1] * EPS * u * (np.abs(g) + mean_abs)  # rounding of u * (g - u.g / sum u)
    np.testing.assert_array_less(np.abs(vjp - np.einsum("ri,rij->rj", g, J)), bound + 1e-300)
    assert np.all(vjp[p == 0] == 0), "the VJP must vanish off the support"


@given(st.integers(0, 2**32 - 1), st.floats(1.05, 3.0))
def test_alpha_vjp_matches_fd(backend, seed, alpha):
    x = _rows(seed)
    assume(_clear_of_kinks(x, alpha, backend, 1e-2))
    g = np.random.default_rng(seed + 1).standard_normal(x.shape)
    p = backend.call(er.entmax, x, alpha)
    got = backend.call(er.entmax_alpha_vjp, p, g, alpha)
    fd = ((backend.call(er.entmax, x, alpha + H) - backend.call(er.entmax, x, alpha - H)) * g).sum(-1) / (2 * H)
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8, 1e-12])
def test_alpha_vjp_continuous_through_one(backend, delta):
    """The alpha gradient has a removable singularity at 1; ours is smooth there."""
    x = _rows(3, scale=3.0)
    g = np.random.default_rng(4).standard_normal(x.shape)
    at_one = backend.call(er.entmax_alpha_vjp, backend.call(er.softmax, x), g, 1.0)
    near = backend.call(er.entmax_alpha_vjp, backend.call(er.entmax, x, 1 + delta), g, 1 + delta)
    # the second derivative in alpha is bounded by a few times max (log p)^3 here (~1e3)
    np.testing.assert_allclose(near, at_one, rtol=0, atol=1e4 * delta + 1e-12)
    # and at alpha = 1 it equals the closed form p_i (sum_j p_j l_j^2 - l_i^2) / 2
    p = backend.call(er.softmax, x)
    L = np.log(p)
    closed = (g * p * ((p * L * L).sum(-1, keepdims=True) - L * L) / 2).sum(-1)
    np.testing.assert_allclose(at_one, closed, rtol=1e-12, atol=1e-14)


def test_alpha_vjp_against_correia_formula(backend):
    """Away from alpha = 1 the textbook formula is well conditioned: both must agree."""
    x = _rows(5)
    g = np.random.default_rng(6).standard_normal(x.shape)
    for alpha in (1.2, 1.5, 2.0, 2.5):
        p = backend.call(er.entmax, x, alpha)
        u = np.where(p > 0, np.where(p > 0, p, 1) ** (2 - alpha), 0)
        pt = u / u.sum(-1, keepdims=True)
        S = np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)
        ent = S.sum(-1, keepdims=True)
        dp = (p - pt) / (alpha - 1) ** 2 - (S - pt * ent) / (alpha - 1)
        np.testing.assert_allclose(backend.call(er.entmax_alpha_vjp, p, g, alpha), (g * dp).sum(-1),
                                   rtol=1e-10, atol=1e-12)


@given(st.integers(0, 2**32 - 1), alphas(1.0, 3.0))
def test_loss_nonnegative_gradient_matches_fd(backend, seed, alpha):
    x = _rows(seed)
    target = np.random.default_rng(seed).integers(0, x.shape[1], size=x.shape[0])
    loss = backend.call(er.entmax_loss, x, target, alpha)
    assert loss.shape == (3,) and np.all(loss >= 0)
    grad = backend.call(er.entmax_loss_grad, x, target, alpha)
    np.testing.assert_allclose(grad, backend.call(er.entmax, x, alpha) - np.eye(x.shape[1])[target], atol=0)
    fd = np.empty_like(x)
    for j in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, j] = H
        fd[:, j] = (backend.call(er.entmax_loss, x + e, target, alpha)
                    - backend.call(er.entmax_loss, x - e, target, alpha)) / (2 * H)
    np.testing.assert_allclose(grad, fd, rtol=0, atol=1e-7)


@given(st.integers(0, 2**32 - 1), alphas(1.0, 3.0))
def test_loss_zero_iff_prediction_equals_target(backend, seed, alpha):
    x = _rows(seed)
    p = backend.call(er.entmax, x, alpha)
    at_p = backend.call(er.entmax_loss, x, p, alpha)
    np.testing.assert_allclose(at_p, 0.0, atol=64 * EPS * (1 + np.abs(x).max()))
    q = np.roll(p, 1, axis=-1)
    assume(np.abs(q - p).max() > 1e-3)
    assert np.all(backend.call(er.entmax_loss, x, q, alpha)[np.abs(q - p).max(-1) > 1e-3] > 1e-9)


def test_loss_special_cases(backend):
    x = np.array([[-2.0, 0.0, 0.5]])
    # alpha = 1 is the cross-entropy: logsumexp(x) - x_target
    lse = np.log(np.exp(x).sum())
    np.testing.assert_allclose(backend.call(er.entmax_loss, x, [2], 1.0), [lse - 0.5], rtol=1e-15)
    # sparsemax loss by hand: p = [0, .25, .75]: 1/2 - x_k + 1/2 sum_S (x_j^2 - tau^2), tau = -0.25
    np.testing.assert_allclose(backend.call(er.entmax_loss, x, [2], 2.0), [0.0625], rtol=1e-15)
    # mass on a masked entry costs +inf; masked entries without target mass cost nothing
    xm = np.array([[0.0, -np.inf, 1.0]])
    assert backend.call(er.entmax_loss, xm, [1], 1.5)[0] == np.inf
    assert np.isfinite(backend.call(er.entmax_loss, xm, [2], 1.5)[0])


def test_loss_target_errors(backend):
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="class index 3"):
        backend.call(er.entmax_loss, x, [0, 3])
    with pytest.raises(ValueError, match="sum to 1"):
        backend.call(er.entmax_loss, x, np.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="target has shape"):
        backend.call(er.entmax_loss, x, np.zeros((3, 3)))
