"""ASEntmax and SSMax: the scale, its gradients, the row transforms and their VJPs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from test_attention import fd_check

import entmax_ref as er
from entmax_ref.testing.strategies import alphas

EPS = float(np.finfo(np.float64).eps)
ALPHAS = [1.0, 1.25, 1.5, 2.0, 3.0]


# --------------------------------------------------------------------------- the scale
def test_scale_formula_and_paper_convention():
    # causal row at 0-based position i attends n = i + 1 keys and uses log(i + 2)
    i = np.arange(6)
    s = er.asentmax_scale(i + 1, beta=0.5, gamma=0.7, delta=1.0)
    np.testing.assert_allclose(s, 1.0 + 0.5 * np.log(i + 2.0) ** 0.7, rtol=2 * EPS, atol=0)
    # SSMax: beta log(n + c)
    np.testing.assert_allclose(er.asentmax_scale([3, 7], beta=2.0, gamma=1.0, delta=0.0, offset=0.5),
                               2.0 * np.log([3.5, 7.5]), rtol=2 * EPS, atol=0)
    assert er.asentmax_scale(5, beta=0.0, gamma=3.0).item() == 1.0  # beta = 0: plain entmax


def test_scale_broadcasts_per_head_and_token():
    n = np.arange(1, 6)  # (Nq,)
    beta = np.array([[0.5], [1.0], [2.0]])  # per head
    gamma = np.linspace(-1, 1, 15).reshape(3, 5)  # per head and token
    s = er.asentmax_scale(n, beta, gamma, delta=np.array([1.0, 0.5, 0.0])[:, None])
    assert s.shape == (3, 5)
    np.testing.assert_allclose(s[2, 4], 0.0 + 2.0 * np.log(6.0) ** gamma[2, 4], rtol=2 * EPS)


@pytest.mark.parametrize("bad, match", [
    (dict(n=-1), "n must be >= 0"),
    (dict(n=0), "log"),
    (dict(n=1, offset=0.0), "log"),
    (dict(beta=np.nan), "beta"),
    (dict(gamma=np.inf), "gamma"),
    (dict(beta=np.ones(3), gamma=np.ones(4)), "broadcast"),
])
def test_scale_rejects_bad_input(bad, match):
    kw = dict(n=4, beta=1.0, gamma=1.0)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        er.asentmax_scale(**kw)


def test_scale_vjp_matches_finite_differences_and_reduces():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 1000, (2, 3, 5))
    beta = rng.uniform(0.1, 2, (3, 1))
    gamma = rng.uniform(-2, 2, (3, 5))
    delta = np.array([0.3])
    offset = 1.0
    g = rng.standard_normal((2, 3, 5))
    grads = er.asentmax_scale_vjp(g, n, beta, gamma, delta, offset)
    assert grads.dbeta.shape == beta.shape and grads.dgamma.shape == gamma.shape and grads.ddelta.shape == (1,)

    def loss(b, c, d):
        return float((g * er.asentmax_scale(n, b, c, d, offset)).sum())

    fd_check(loss, [beta, gamma, delta], grads, 4 * g.size)


def test_scale_vjp_closed_form():
    # L = log(n + 1); ds/dbeta = L^gamma, ds/dgamma = beta L^gamma log L, ds/ddelta = 1
    n, beta, gamma = 10, 0.7, 1.3
    L = np.log(11.0)
    g = er.asentmax_scale_vjp(2.0, n, beta, gamma)
    np.testing.assert_allclose([g.dbeta, g.dgamma, g.ddelta],
                               [2 * L**gamma, 2 * beta * L**gamma * np.log(L), 2.0], rtol=4 * EPS)


# --------------------------------------------------------------------------- the transforms
@pytest.mark.parametrize("alpha", ALPHAS)
def test_asentmax_is_entmax_of_scaled_row(backend, alpha):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 9))
    x[0, 1, 3:] = -np.inf  # n = 3 on that row
    x[2, 0, :] = -np.inf  # an empty row
    beta = rng.uniform(0.1, 1.5, (3, 1))  # per "head" (axis 0), broadcast over rows (axis 1)
    gamma = rng.uniform(-1, 1, (3, 4))
    p, info = backend.call(er.asentmax, x, alpha, beta=beta, gamma=gamma, delta=0.5, return_info=True)
    n = np.isfinite(x).sum(-1)
    assert np.array_equal(info.n, n)
    live = n > 0
    s = np.where(live, 0.5 + beta * np.log(np.maximum(n, 1) + 1.0) ** gamma, np.nan)
    np.testing.assert_allclose(info.s[live], s[live], rtol=4 * EPS, atol=0)
    assert np.all(np.isnan(info.s[~live]))
    with np.errstate(invalid="ignore"):
        z = np.where(np.isfinite(x), np.nan_to_num(s)[..., None] * x, -np.inf)
    ref = backend.call(er.entmax, z, alpha)
    # the same scaled row (s and s * x formed by the same float64 operations), the same solver
    assert np.array_equal(p, ref)
    assert np.all(p[~np.isfinite(x)] == 0) and np.all(p[2, 0] == 0)
    assert np.array_equal(info.support, (p > 0).sum(-1))


def test_asentmax_axis_dtype_and_no_scale(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    p = backend.call(er.asentmax, x, 1.5, beta=0.4, gamma=0.5, axis=0)
    assert p.dtype == np.float32 and p.shape == x.shape
    p_t = backend.call(er.asentmax, x.T, 1.5, beta=0.4, gamma=0.5)
    assert np.array_equal(p, p_t.T)
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=6 * float(np.finfo(np.float32).eps))
    # beta = 0, delta = 1: plain entmax
    x64 = x.astype(np.float64)
    assert np.array_equal(backend.call(er.asentmax, x64, 1.5, beta=0.0, gamma=1.0),
                          backend.call(er.entmax, x64, 1.5))


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=30), alphas(1.0, 3.0), st.floats(0.05, 3.0), st.floats(0.05, 3.0))
def test_support_shrinks_as_the_scale_grows(backend, xs, alpha, s1, s2):
    """entmax(s x) is sparser for larger s (dense-to-sparse interpolation of ASEntmax)."""
    assume(abs(s1 - s2) > 1e-3)
    lo, hi = sorted((s1, s2))
    x = np.array(xs)
    # s = delta for beta = 0: the scale is exactly lo / hi
    p_lo = backend.call(er.asentmax, x, alpha, beta=0.0, gamma=1.0, delta=lo)
    p_hi = backend.call(er.asentmax, x, alpha, beta=0.0, gamma=1.0, delta=hi)
    assert er.support_size(p_hi) <= er.support_size(p_lo)
    assert er.max_probability(p_hi) >= er.max_probability(p_lo) - 4 * len(xs) * EPS


def test_gamma_sign_sharpens_or_softens_with_n(backend):
    """IID Gaussian rows: with s = log(n)^gamma the support stays about flat for gamma = 1/2
    and grows for gamma = -1/2, while plain entmax sits in between (digest 3.7)."""
    rng = np.random.default_rng(0)
    sizes = (64, 4096, 65536)
    sup = {g: [] for g in (-0.5, 0.0, 0.5)}
    for n in sizes:
        x = rng.standard_normal((4, n))
        for g in sup:
            p = backend.call(er.asentmax, x, 1.5, beta=1.0, gamma=g, delta=0.0, offset=0.0)
            sup[g].append(er.support_size(p).mean())
    assert sup[-0.5][-1] > 4 * sup[-0.5][0]
    assert sup[0.5][-1] < 2 * sup[0.5][0]
    assert all(a > b > c for a, b, c in zip(sup[-0.5], sup[0.0], sup[0.5]))


# --------------------------------------------------------------------------- VJPs
def _margin_ok(x, s, alpha, margin=1e-2):
    if alpha == 1.0:
        return True
    z = np.where(np.isfinite(x), s[..., None] * x, -np.inf)
    _, info = er.entmax(z, alpha, return_info=True, backend="numpy")
    theta = (info.tau + 1) / (alpha - 1)
    arg = 1 + (alpha - 1) * (z - theta[..., None])
    return bool(np.all(np.abs(arg[np.isfinite(z)]) >= margin))


@pytest.mark.parametrize("alpha", ALPHAS)
def test_asentmax_vjp_matches_finite_differences(backend, alpha):
    for seed in range(100):
        rng = np.random.default_rng(seed)
        x = 1.5 * rng.standard_normal((2, 3, 5))
        x[1, 2, 3:] = -np.inf
        beta = rng.uniform(0.2, 1.0, (2, 1))
        gamma = rng.uniform(-1, 1, (2, 3))
        delta = np.array(0.6)
        n = np.isfinite(x).sum(-1)
        if _margin_ok(x, delta + beta * np.log(n + 1.0) ** gamma, alpha):
            break
    g = rng.standard_normal(x.shape)
    grads = backend.call(er.asentmax_vjp, g, x, alpha, beta=beta, gamma=gamma, delta=delta)
    p = backend.call(er.asentmax, x, alpha, beta=beta, gamma=gamma, delta=delta)
    grads_p = backend.call(er.asentmax_vjp, g, x, alpha, beta=beta, gamma=gamma, delta=delta, p=p)
    for a, b in zip(grads, grads_p):
        assert np.array_equal(a, b)
    assert grads.dbeta.shape == beta.shape and grads.dgamma.shape == gamma.shape and grads.ddelta.shape == ()
    assert np.all(grads.dx[~np.isfinite(x)] == 0)
    args = [np.where(np.isfinite(x), x, 0.0), beta, gamma, delta]
    masked = ~np.isfinite(x)

    def loss(xx, b, c, d):
        return float((backend.call(er.asentmax, np.where(masked, -np.inf, xx), alpha, beta=b, gamma=c, delta=d)
                      * g).sum())

    fd_check(loss, args, (grads.dx, grads.dbeta, grads.dgamma, grads.ddelta), 4 * g.size,
             skip=lambda idx, ii: idx == 0 and masked[ii])


def test_ssmax_is_softmax_of_log_n_scaled_row(backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 7))
    x[0, 5:] = -np.inf
    p = backend.call(er.ssmax, x, beta=0.8)
    n = np.isfinite(x).sum(-1)
    ref = backend.call(er.softmax, np.where(np.isfinite(x), (0.8 * np.log(n + 1.0))[:, None] * x, -np.inf))
    np.testing.assert_allclose(p, ref, rtol=0, atol=8 * EPS)
    g = rng.standard_normal(x.shape)
    sg = backend.call(er.ssmax_vjp, g, x, beta=0.8)
    ag = backend.call(er.asentmax_vjp, g, x, 1.0, beta=0.8, gamma=1.0, delta=0.0)
    assert np.array_equal(sg.dx, ag.dx) and np.array_equal(sg.dbeta, ag.dbeta)
    h = EPS ** (1 / 3)
    f = lambda b: float((backend.call(er.ssmax, x, beta=b) * g).sum())  # noqa: E731
    fd, fd2 = (f(0.8 + h) - f(0.8 - h)) / (2 * h), (f(0.8 + 2 * h) - f(0.8 - 2 * h)) / (4 * h)
    assert abs(float(sg.dbeta) - fd) <= abs(fd - fd2) + 4 * g.size * EPS * max(1.0, abs(f(0.8))) / h


@pytest.mark.parametrize("b, trend", [(0.5, "down"), (1.0, "flat"), (1.5, "up")])
def test_ssmax_phase_transition(backend, b, trend):
    """One key at gap 1 over n - 1 zeros, s = b log n: the key's mass tends to 0, 1/2, 1
    for b < 1, b = 1, b > 1 (digest 7.7); closed form n^b / (n^b + n - 1)."""
    masses = []
    for n in (64, 1024, 65536):
        x = np.zeros(n)
        x[0] = 1.0
        p = backend.call(er.ssmax, x, beta=b, offset=0.0)
        np.testing.assert_allclose(p[0], n**b / (n**b + n - 1), rtol=64 * EPS)
        masses.append(p[0])
    if trend == "down":
        assert masses[0] > masses[1] > masses[2] and masses[2] < 0.01
    elif trend == "up":
        assert masses[0] < masses[1] < masses[2] and masses[2] > 0.99
    else:
        np.testing.assert_allclose(masses, 0.5, atol=0.01)


def test_asentmax_bad_input():
    with pytest.raises(ValueError, match="row shape"):
        er.asentmax(np.zeros((3, 4)), beta=np.ones(4), gamma=1.0)
    with pytest.raises(ValueError, match="NaN"):
        er.asentmax([0.0, np.nan], beta=1.0, gamma=1.0)
    with pytest.raises(ValueError, match="beta"):
        er.asentmax([0.0, 1.0], beta=np.inf, gamma=1.0)
    with pytest.raises(ValueError, match="log"):
        er.asentmax([0.0, -np.inf], beta=1.0, gamma=1.0, offset=0.0)
    with pytest.raises(ValueError, match="shape"):
        er.asentmax_vjp(np.ones(3), np.zeros(2), beta=1.0, gamma=1.0)
