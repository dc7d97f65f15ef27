"""alpha-normmax: exactness against a 50-digit oracle, properties, VJP, loss, peers."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import entmax_ref as er
from agreement import family_threshold_agreement, normmax_agreement_tolerance
from family_cases import (central_differences, check_against_torch_peer, check_axis_dtype_and_inputs,
                          check_per_row_param, large_batch, solve_on_both, vjp_at, vjp_on_both)
from family_oracle import normmax_mp, normmax_np

EPS = np.finfo(np.float64).eps
ALPHAS = (1.05, 1.5, 2.0, 3.0, 7.0)


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((10, 12)) * rng.choice([0.05, 0.5, 1.0, 4.0], size=(10, 1))
    x[1, [2, 5]] = -np.inf  # masks
    x[2, :4] = x[2, 0]  # ties at the top
    x[3, :] = -np.inf  # all masked
    x[4, :] = 1.0 + np.arange(12) * 1e-3  # nearly uniform
    x[5, :] = 1e3 + rng.standard_normal(12)  # offset
    return x


@pytest.mark.parametrize("alpha", ALPHAS)
def test_matches_mpmath_oracle(backend, alpha):
    x = _rows()
    p, info = er.normmax(backend.asarray(x), alpha, backend=backend, return_info=True)
    p, tau, support = backend.numpy(p), backend.numpy(info.tau), backend.numpy(info.support)
    p_ref, tau_ref = normmax_np(x, alpha)
    live = np.isfinite(tau_ref)
    np.testing.assert_array_equal(np.isfinite(tau), live)
    err_t = np.abs(tau[live] - tau_ref[live])
    assert (err_t <= family_threshold_agreement(tau_ref[live])).all(), err_t.max()
    tol = normmax_agreement_tolerance(x, p_ref, tau_ref, alpha)
    bad = np.abs(p - p_ref) > tol
    assert not bad.any(), (np.argwhere(bad)[:4], np.abs(p - p_ref)[bad][:4], tol[bad][:4])
    np.testing.assert_array_equal(support, (p_ref > 0).sum(axis=1))
    assert backend.numpy(info.converged).all()


def test_hand_example_closed_form(backend):
    # alpha = 2, x = [0, -0.5, -2]: (0 - t)^2 + (-0.5 - t)^2 = 1 on the top two
    p, info = er.normmax(backend.asarray(np.array([0.0, -0.5, -2.0])), 2.0, backend=backend, return_info=True)
    r = np.sqrt(1.75)
    want = np.array([0.5 + 0.25 / r, 0.5 - 0.25 / r, 0.0])
    np.testing.assert_allclose(backend.numpy(p), want, rtol=0, atol=4 * EPS)
    assert abs(float(backend.numpy(info.tau)) + (0.5 + r) / 2) <= 4 * EPS
    assert int(backend.numpy(info.support)) == 2


def test_single_and_uniform_rows(backend):
    # the top alone when the next entry is at least 1 below it
    p = backend.numpy(er.normmax(backend.asarray(np.array([[3.0, 2.0, -5.0]])), 1.7, backend=backend))
    np.testing.assert_array_equal(p, [[1.0, 0.0, 0.0]])
    # equal entries: uniform, tau = x - n^(-1/beta)
    n, alpha = 7, 3.0
    p, info = er.normmax(backend.asarray(np.full((1, n), 0.25)), alpha, backend=backend, return_info=True)
    np.testing.assert_allclose(backend.numpy(p), 1.0 / n, rtol=0, atol=2 * EPS)
    beta = alpha / (alpha - 1)
    assert abs(float(backend.numpy(info.tau)[0]) - (0.25 - n ** (-1 / beta))) <= 4 * EPS


def test_masks_and_all_masked_rows(backend):
    x = np.array([[0.3, -np.inf, 0.1, -np.inf], [-np.inf] * 4])
    p, info = er.normmax(backend.asarray(x), 1.5, backend=backend, return_info=True)
    p = backend.numpy(p)
    assert (p[0, [1, 3]] == 0).all() and (p[1] == 0).all()
    # masked entries are the same as leaving them out
    q = backend.numpy(er.normmax(backend.asarray(x[:1, [0, 2]]), 1.5, backend=backend))
    np.testing.assert_array_equal(p[0, [0, 2]], q[0])
    tau = backend.numpy(info.tau)
    assert tau[1] == -np.inf and backend.numpy(info.support)[1] == 0
    dx = backend.numpy(er.normmax_vjp(backend.asarray(p), backend.asarray(np.ones_like(p)), 1.5, backend=backend))
    assert (dx[1] == 0).all() and (dx[0, [1, 3]] == 0).all()


def test_dtypes_axis_and_inputs_untouched(backend):
    x = np.random.default_rng(3).standard_normal((3, 5, 4))
    # float32 is computed in float64 from the float32 values and rounded once
    check_axis_dtype_and_inputs(backend, er.normmax, 1.5, x)
    assert er.normmax(np.array([1, 2, 3]), backend="numpy").dtype == np.float64
    check_per_row_param(backend, er.normmax, x[:, :, 0], np.array([1.2, 2.0, 4.0]))  # per-row alpha


@pytest.mark.parametrize("alpha", [1.0, 0.5, np.nan, np.inf])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        er.normmax([0.0, 1.0], alpha, backend="numpy")
    with pytest.raises(ValueError, match="alpha"):
        er.normmax_vjp([0.5, 0.5], [1.0, 0.0], alpha, backend="numpy")


def test_bad_inputs():
    with pytest.raises(ValueError, match="NaN"):
        er.normmax([0.0, np.nan], backend="numpy")
    with pytest.raises(ValueError, match="axis"):
        er.normmax([0.0, 1.0], axis=2, backend="numpy")
    with pytest.raises(TypeError):
        er.normmax(np.array([1 + 1j, 0]), backend="numpy")
    with pytest.raises(ValueError, match="shape"):
        er.normmax_vjp([0.5, 0.5], [1.0, 0.0, 0.0], backend="numpy")
    with pytest.raises(ValueError, match="alpha"):
        er.normmax(np.zeros((2, 3)), np.array([1.5, 2.0, 3.0]), backend="numpy")


# ----------------------------------------------------------------------------- VJP


def _jacobian_mp(x, alpha, h="1e-20"):
    """dp/dx by central differences of the 50-digit oracle (error O(h^2) = 1e-40)."""
    n = len(x)
    J = np.zeros((n, n))
    with mp.workdps(50):
        hh = mp.mpf(h)
        for j in range(n):
            xp = [mp.mpf(float(v)) for v in x]
            xm = list(xp)
            xp[j] += hh
            xm[j] -= hh
            pp, _ = _normmax_mp_exact(xp, alpha)
            pm, _ = _normmax_mp_exact(xm, alpha)
            for i in range(n):
                J[i, j] = float((pp[i] - pm[i]) / (2 * hh))
    return J


def _normmax_mp_exact(xs, alpha):
    """normmax_mp on mpf inputs (no rounding to float64 of the perturbed x)."""
    with mp.workdps(50):
        a = mp.mpf(float(alpha))
        beta = a / (a - 1)
        s = sorted(xs, reverse=True)
        K = sum(1 for j in range(len(s)) if mp.fsum((s[i] - s[j]) ** beta for i in range(j)) < 1)
        lo = max(s[K] if K < len(s) else -mp.inf, s[0] - 1)
        hi = s[K - 1]
        for _ in range(400):
            mid = (lo + hi) / 2
            if mp.fsum((s[i] - mid) ** beta for i in range(K)) > 1:
                lo = mid
            else:
                hi = mid
        tau = (lo + hi) / 2
        w = [(v - tau) ** (1 / (a - 1)) if v > tau else mp.mpf(0) for v in xs]
        S = mp.fsum(w)
        return [wi / S for wi in w], tau


@pytest.mark.parametrize("alpha", (1.3, 2.0, 2.5))
def test_vjp_matches_high_precision_jacobian(backend, alpha):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(6) * 0.6
    p = er.normmax(backend.asarray(x), alpha, backend=backend)
    J = _jacobian_mp(x, alpha)
    np.testing.assert_allclose(J, J.T, rtol=0, atol=1e-12)  # the derivation: J is symmetric
    for k in range(3):
        g = rng.standard_normal(6)
        dx = backend.numpy(er.normmax_vjp(p, backend.asarray(g), alpha, backend=backend))
        want = J.T @ g
        np.testing.assert_allclose(dx, want, rtol=0, atol=64 * EPS * (1 + np.abs(J).sum(axis=0).max() * np.abs(g).max()))


@given(
    x=hnp.arrays(np.float64, st.integers(2, 9), elements=st.floats(-3, 3, allow_nan=False)),
    alpha=st.sampled_from([1.25, 1.5, 2.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_properties_and_vjp_vs_finite_differences(backend, x, alpha, seed):
    p, info = er.normmax(backend.asarray(x), alpha, backend=backend, return_info=True)
    p, tau = backend.numpy(p), float(backend.numpy(info.tau))
    # on the simplex, threshold form, beta-norm of the threshold gaps is 1
    assert (p >= 0).all() and abs(p.sum() - 1) <= 8 * len(x) * EPS
    beta = alpha / (alpha - 1)
    gaps = np.maximum(x - tau, 0)
    assert abs((gaps ** beta).sum() ** (1 / beta) - 1) <= 64 * EPS * (1 + np.abs(x).max())
    assert ((p > 0) == (x > tau)).all() or np.min(np.abs(x - tau)) < 1e-12
    # shift equivariance of tau, invariance of p
    p2, info2 = er.normmax(x + 2.5, alpha, backend="numpy", return_info=True)
    np.testing.assert_allclose(p2, p, rtol=0, atol=64 * EPS * (1 + np.abs(x).max()) * (1 + 1 / (alpha - 1)))
    # VJP vs central differences, away from the support's edges
    h = 1e-6
    assume(np.min(np.abs(x - tau)) > 1e-3)
    dx, g = vjp_at(backend, er.normmax_vjp, p, alpha, seed)
    fd = central_differences(er.normmax, x, alpha, g, h)
    scale = 1 + np.abs(g).sum() * (1 + np.abs(x).max()) / np.min(np.abs(x - tau)) ** 2
    np.testing.assert_allclose(dx, fd, rtol=0, atol=1e-6 * scale)
    assert abs(dx.sum()) <= 1e-12 * (1 + np.abs(dx).max())  # J 1 = 0


def test_backends_agree_on_a_large_batch(backend):
    rng, x = large_batch(5, 128, 300, 3.0)
    a = rng.uniform(1.1, 4.0, 128)
    p, info, q, iq = solve_on_both(backend, er.normmax, x, a)
    np.testing.assert_array_equal(backend.numpy(info.support), iq.support)
    np.testing.assert_allclose(p, q, rtol=0, atol=normmax_agreement_tolerance(x, q, iq.tau, a[:, None]).max())
    d1, d0 = vjp_on_both(backend, er.normmax_vjp, q, rng.standard_normal(x.shape), a)
    np.testing.assert_allclose(d1, d0, rtol=1e-12, atol=1e-12 * np.abs(d0).max())


# ----------------------------------------------------------------------------- loss


def test_loss_values_and_gradient(backend):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 5))
    t = rng.integers(0, 5, 6)
    L = backend.numpy(er.normmax_loss(backend.asarray(x), backend.asarray(t), 1.5, backend=backend))
    p = er.normmax(x, 1.5, backend="numpy")
    onehot = np.eye(5)[t]
    want = 1 - (p ** 1.5).sum(1) ** (1 / 1.5) + ((p - onehot) * x).sum(1)
    np.testing.assert_allclose(L, want, rtol=0, atol=32 * EPS * (1 + np.abs(x).max()))
    assert (L >= 0).all()
    grad = backend.numpy(er.normmax_loss_grad(backend.asarray(x), backend.asarray(t), 1.5, backend=backend))
    np.testing.assert_allclose(grad, p - onehot, rtol=0, atol=8 * EPS)
    # the gradient is the derivative of the loss (Danskin): central differences
    h = 1e-6
    fd = np.stack([(er.normmax_loss(x + h * e, t, 1.5, backend="numpy") - er.normmax_loss(x - h * e, t, 1.5, backend="numpy"))
                   / (2 * h) for e in np.eye(5)], axis=1)
    np.testing.assert_allclose(grad, fd, rtol=0, atol=1e-7)
    # zero at q = p, probability targets, masked target entries
    Z = backend.numpy(er.normmax_loss(backend.asarray(x), backend.asarray(p), 1.5, backend=backend))
    assert np.abs(Z).max() <= 32 * EPS * (1 + np.abs(x).max())
    xm = x.copy()
    xm[0, 2] = -np.inf
    t2 = t.copy()
    t2[0] = 2
    assert er.normmax_loss(xm, t2, 1.5, backend="numpy")[0] == np.inf


# ----------------------------------------------------------------------------- peers


@pytest.mark.peer
@pytest.mark.parametrize("alpha", (1.25, 1.5, 2.0, 3.0))
def test_peer_normmax_bisect_forward_and_autograd(backend, alpha):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((12, 17)) * 1.5
    # 100 halvings of the package's bracket: below float64 resolution
    check_against_torch_peer(backend, er.normmax, er.normmax_vjp, alpha,
                             lambda pkg, xt: pkg.normmax_bisect(xt, alpha=alpha, n_iter=100),
                             x, rng.standard_normal(x.shape), 1e-14, 1e-12)


@pytest.mark.peer
def test_peer_normmax_loss():
    torch = pytest.importorskip("torch")
    entmax_pkg = pytest.importorskip("entmax")
    rng = np.random.default_rng(17)
    x = rng.standard_normal((9, 8))
    t = rng.integers(0, 8, 9)
    want = entmax_pkg.normmax_bisect_loss(torch.tensor(x), torch.tensor(t), alpha=2.0, n_iter=100).numpy()
    np.testing.assert_allclose(er.normmax_loss(x, t, 2.0, backend="numpy"), want, rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- check battery


def test_check_battery_passes_the_backends_and_fails_a_perturbed_implementation(backend):
    from entmax_ref.testing.family_checks import check_normmax

    good = check_normmax(lambda x, alpha: er.normmax(x, alpha, backend=backend), 2.0,
                         vjp=lambda x, g, alpha: er.normmax_vjp(er.normmax(x, alpha, backend=backend), g, alpha,
                                                                backend=backend),
                         name=backend, size="quick")
    assert good.ok, good.table()
    assert {r.op for r in good.rows} == {"normmax a=2", "normmax vjp a=2"}

    def off_by_a_little(x, alpha):  # the threshold moved by 1e-9
        p = er.normmax(x, alpha, backend="numpy", return_info=True)[1].tau[..., None] - 1e-9
        w = np.where(x > p, np.maximum(x - p, 0) ** (1 / (alpha - 1)), 0.0)
        return (w / np.maximum(w.sum(-1, keepdims=True), 1e-300)).astype(x.dtype)

    bad = check_normmax(off_by_a_little, 2.0, size="quick", dtypes=("float64",))
    assert not bad.ok


def test_check_command_lists_the_family_jobs():
    from entmax_ref.testing import command as C

    labels = [label for label, _ in C.backend_jobs("numpy", "quick", 0)]
    assert "normmax a=2 [numpy]" in labels and "budget B=2.5 [numpy]" in labels
    peers = [label for label, _ in C.peer_jobs("quick", 0)]
    if any(label.startswith("entmax.") for label in peers):
        assert "entmax.normmax_bisect a=2" in peers and "entmax.budget_bisect B=1" in peers


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_family_vjps_keep_low_precision_dtypes(backend, dtype):
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([[0.0, -0.5, -2.0], [1.5, 0.8, 0.2]])
    g = np.array([[1.0, 0.0, 2.0], [3.0, 1.0, 0.0]])
    for fn, vjp, param in ((er.normmax, er.normmax_vjp, 2.0), (er.budget_sparsemax, er.budget_sparsemax_vjp, 1.5)):
        p = fn(x.astype(dt), param, backend=backend)
        assert p.dtype == dt
        dx = vjp(p, g.astype(dt), param, backend=backend)
        assert dx.dtype == dt, vjp.__name__
        # computed in float32 from the same values, rounded once
        want = vjp(p.astype(np.float32), g.astype(dt).astype(np.float32), param, backend="numpy").astype(dt)
        np.testing.assert_allclose(dx.astype(np.float64), want.astype(np.float64), rtol=0,
                                   atol=float(np.finfo(np.float32).eps) * 8)


def test_family_results_of_0d_inputs_are_0d(backend):
    one = np.array(0.7)  # one score: p = 1, every derivative 0
    assert er.normmax(one, 2.0, backend=backend).shape == ()
    for dx in (er.normmax_vjp(np.array(1.0), np.array(2.0), 2.0, backend=backend),
               er.budget_sparsemax_vjp(np.array(1.0), np.array(2.0), 1.0, backend=backend),
               er.normmax_loss_grad(one, np.array(0), 2.0, backend=backend),
               er.normmax_loss_grad(one, np.array(1.0), 2.0, backend=backend)):
        assert dx.shape == () and float(dx) == 0.0
    assert er.normmax_loss(one, np.array(1.0), 2.0, backend=backend).shape == ()


def test_huge_gaps_raise_no_warning_and_give_the_top_entry(backend):
    # x - max overflows to -inf for an entry 2.7e308 below the max: out of the support, no warning
    x = np.array([1e308, -1e308, 1.7e308])
    for alpha in (1.5, 2.0, 4.0):
        np.testing.assert_array_equal(er.normmax(x, alpha, backend=backend), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(er.normmax_vjp([0.5, 0.5], [1e308, 1e308], 2.0, backend=backend), [0.0, 0.0])
