"""Properties of the alpha-entmax family, on every backend (Hypothesis + fixed cases)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import entmax_ref as er
from entmax_ref.testing.strategies import alphas, score_arrays, score_rows


def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _run(backend, x, alpha, **kw):
    p, info = er.entmax(backend.asarray(x), alpha, backend=backend, return_info=True, **kw)
    return backend.numpy(p), {k: backend.numpy(getattr(info, k)) for k in ("tau", "support", "n_iter", "converged")}


@given(score_rows(dtype=np.float64), alphas())
@example(np.full((2, 5), -np.inf), 1.0)  # found by hypothesis: 0 * -inf warning in tau
def test_simplex_float64(backend, x, alpha):
    p, info = _run(backend, x, alpha)
    n = x.shape[1]
    live = np.isfinite(x).any(axis=1)
    assert p.dtype == np.float64
    assert np.all(p >= 0) and np.all(p <= 1)
    np.testing.assert_allclose(p.sum(axis=1)[live], 1.0, rtol=0, atol=4 * n * _eps(np.float64))
    assert np.all(p[~live] == 0) and np.all(info["support"][~live] == 0)
    assert np.all(np.isneginf(info["tau"][~live]))
    assert np.all(p[np.isneginf(x)] == 0), "masked entries must be exactly 0"
    assert np.array_equal(info["support"], (p > 0).sum(axis=1))
    assert info["converged"].all()


@given(score_rows(dtype=np.float32), alphas())
def test_simplex_float32(backend, x, alpha):
    p, _ = _run(backend, x, alpha)
    live = np.isfinite(x).any(axis=1)
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1, dtype=np.float64)[live], 1.0, rtol=0,
                               atol=4 * x.shape[1] * _eps(np.float32))


@given(score_rows(offsets=False, magnitude=50.0), alphas())
def test_threshold_form_and_exact_support(backend, x, alpha):
    """p_i = [(alpha-1) x_i - tau]_+^(1/(alpha-1)) and support = {(alpha-1) x_i > tau}."""
    p, info = _run(backend, x, alpha)
    tau = info["tau"][:, None]
    live = np.isfinite(x).any(axis=1)
    xs, ps, tau = x[live], p[live], tau[live]
    eps = _eps(np.float64)
    if alpha == 1.0:
        fin = np.isfinite(xs)
        expected = np.where(fin, np.exp(np.where(fin, xs, 0) - tau), 0.0)
        slack = 8 * eps * (np.abs(np.where(fin, xs, 0)) + np.abs(tau) + 1) * expected
        np.testing.assert_array_less(np.abs(ps - expected), slack + 1e-300)
        return
    t = (alpha - 1) * xs - tau  # > 0 exactly on the support
    dt = 8 * eps * (np.abs((alpha - 1) * xs) + np.abs(tau) + 1)
    assert np.all(t[ps > 0] > -dt[ps > 0]), "support entry below the threshold"
    assert np.all(t[ps == 0] <= dt[ps == 0]), "entry above the threshold left out of the support"
    on = t > dt  # clear of the boundary: the closed form holds to rounding
    assume(alpha >= 1.1)
    t_on = np.where(on, t, 1.0)
    expected = np.where(on, t_on ** (1 / (alpha - 1)), ps)
    slope = np.maximum(t_on ** ((2 - alpha) / (alpha - 1)), 1.0) / (alpha - 1)
    np.testing.assert_array_less(np.abs(ps - expected), 4 * slope * dt + 1e-300)


@given(score_rows(offsets=False, masks=False, magnitude=50.0), alphas(1.0, 2.0), st.floats(-100, 100))
def test_translation_invariance(backend, x, alpha, c):
    p, _ = _run(backend, x, alpha)
    q, _ = _run(backend, x + c, alpha)
    atol = 8 * _eps(np.float64) * (np.abs(x).max() + abs(c) + 1)
    np.testing.assert_allclose(q, p, rtol=0, atol=atol)


@given(score_rows(offsets=False), alphas(), st.randoms(use_true_random=False))
def test_permutation_equivariance_and_order(backend, x, alpha, rnd):
    p, _ = _run(backend, x, alpha)
    perm = list(range(x.shape[1]))
    rnd.shuffle(perm)
    q, _ = _run(backend, x[:, perm], alpha)
    np.testing.assert_allclose(q, p[:, perm], rtol=0, atol=8 * x.shape[1] * _eps(np.float64) * max(1, alpha - 1))
    for r in range(x.shape[0]):
        order = np.argsort(x[r], kind="stable")
        assert np.all(np.diff(p[r][order]) >= 0), "order not preserved"
        for v in np.unique(x[r]):
            assert len(np.unique(p[r][x[r] == v])) == 1, "tied scores got different probabilities"


@pytest.mark.parametrize("alpha", [2.5, 3.9375, 10.0])
def test_order_kept_a_hair_above_the_support_edge(backend, alpha):
    """alpha > 2: an entry whose gap above the edge is negligible next to q^(alpha-1) gets
    p >= q, not the ulp below q that the log-space evaluation rounded to (found by
    Hypothesis in test_permutation_equivariance_and_order at alpha = 3.9375)."""
    x = np.array([[0.0, 0.0, 0.0, 1.4449741e-155, -1.0, -1.0, -1.0, -1.0]])
    p, _ = _run(backend, x, alpha)
    np.testing.assert_array_equal(p[0], [0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0])


@given(score_arrays(offsets=False), alphas())
def test_axis_handling(backend, x, alpha):
    ref = backend.numpy(er.entmax(backend.asarray(x), alpha, axis=-1, backend=backend))
    for axis in range(x.ndim):
        moved = np.moveaxis(x, -1, axis)
        out = backend.numpy(er.entmax(backend.asarray(moved), alpha, axis=axis, backend=backend))
        np.testing.assert_array_equal(np.moveaxis(out, axis, -1), ref)


@given(score_rows(offsets=False, max_n=16))
def test_named_transforms_and_methods_agree(backend, x):
    """alpha = 1, 1.5, 2 by their closed forms equal the generic bisection to a few ulps."""
    for name, fn, alpha in (("softmax", er.softmax, 1.0), ("entmax15", er.entmax15, 1.5), ("sparsemax", er.sparsemax, 2.0)):
        named = backend.numpy(fn(backend.asarray(x), backend=backend))
        generic = backend.numpy(er.entmax(backend.asarray(x), alpha, backend=backend))
        np.testing.assert_array_equal(named, generic, err_msg=name)
        bis = backend.numpy(er.entmax(backend.asarray(x), alpha, method="bisect", backend=backend))
        np.testing.assert_allclose(bis, named, rtol=0, atol=16 * _eps(np.float64), err_msg=name)


@given(score_rows(offsets=False, magnitude=20.0))
def test_alpha_to_one_tends_to_softmax(backend, x):
    soft = backend.numpy(er.softmax(backend.asarray(x), backend=backend))
    for delta in (1e-3, 1e-6, 1e-9):
        near = backend.numpy(er.entmax(backend.asarray(x), 1 + delta, backend=backend))
        assert np.all(np.isfinite(near))
        # |d p / d alpha| <= max over the row of p (log p)^2 ~ (2 * 20 + log n)^2 / 2
        np.testing.assert_allclose(near, soft, rtol=0, atol=delta * 2000 + 1e-14)


@given(score_rows(offsets=False, magnitude=10.0), st.sampled_from([20.0, 100.0, 1000.0]))
# found by hypothesis: the offset form lost the edge entry (sum 0.973) before the
# edge-relative solve for alpha > 2
@example(np.array([[0.0, 0.0], [0.0, 0.03125]]), 20.0)
@example(np.array([[0.0, -0.009617]]), 100.0)
def test_large_alpha_tends_to_argmax(backend, x, alpha):
    p, _ = _run(backend, x, alpha)
    live = np.isfinite(x).any(axis=1)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1)[live], 1.0, rtol=0, atol=4 * x.shape[1] * _eps(np.float64))
    for r in np.flatnonzero(live):
        top2 = np.sort(x[r][np.isfinite(x[r])])[::-1]
        if len(top2) > 1 and top2[0] - top2[1] >= 1 / (alpha - 1):  # the one-hot condition
            assert p[r].max() == 1.0 and np.count_nonzero(p[r]) == 1


@given(score_rows(offsets=False, masks=False, magnitude=10.0, min_n=2), alphas(1.1, 4.0),
       st.floats(0.01, 10), st.floats(1.01, 10))
def test_support_non_increasing_in_temperature(backend, x, alpha, s, factor):
    _, lo = _run(backend, x * s, alpha)
    _, hi = _run(backend, x * s * factor, alpha)
    assert np.all(hi["support"] <= lo["support"])


def test_temperature_limits(backend):
    x = np.array([[0.3, -1.2, 2.0, 0.7, 1.9]])
    for alpha in (1.0, 1.5, 2.0, 3.0):
        cold = backend.numpy(er.entmax(backend.asarray(x * 1e-9), alpha, backend=backend))
        np.testing.assert_allclose(cold, 0.2, atol=1e-7)
        hot = backend.numpy(er.entmax(backend.asarray(x * 1e4), alpha, backend=backend))
        np.testing.assert_allclose(hot, [[0, 0, 1, 0, 0]], atol=1e-12)


@given(score_rows(offsets=False, masks=False, magnitude=5.0, max_rows=1), alphas(1.0, 3.0),
       st.integers(0, 2**32 - 1))
def test_maximises_the_regularised_objective(backend, x, alpha, seed):
    """p maximises <p, x> + H_alpha(p) over the simplex: no random simplex point beats it."""
    from entmax_ref.losses import _tsallis_omega

    p, _ = _run(backend, x, alpha)
    rng = np.random.default_rng(seed)
    qs = np.concatenate([rng.dirichlet(np.ones(x.shape[1]) * c, size=64) for c in (0.1, 1.0, 10.0)])
    qs = np.concatenate([qs, 0.9 * p + 0.1 * qs[:8]])  # and points near the optimum

    def objective(q):
        a = np.full(len(q), alpha)
        return (q * x).sum(axis=1) - _tsallis_omega(q, a, np)

    best = objective(p)[0]
    assert np.all(objective(qs) <= best + 1e-12 * (1 + np.abs(x).max()))


GOLDEN = [  # (x, alpha, expected p): hand-checkable values from the literature
    ([-2.0, 0.0, 0.5], 2.0, [0.0, 0.25, 0.75]),
    ([-2.0, 0.0, 0.5], 1.5, [0.0, ((31**0.5 - 1) / 8) ** 2, ((31**0.5 + 1) / 8) ** 2]),  # z=x/2, tau=1/8-sqrt(31)/8
    ([0.0, 0.0], 1.5, [0.5, 0.5]),
    ([1.0, 1.0, 1.0, 1.0], 2.0, [0.25, 0.25, 0.25, 0.25]),
    ([0.0, np.log(3.0)], 1.0, [0.25, 0.75]),
    ([3.0, 1.0, -np.inf], 2.0, [1.0, 0.0, 0.0]),
    ([0.5, 0.0], 2.0, [0.75, 0.25]),
]


@pytest.mark.parametrize("x,alpha,expected", GOLDEN)
def test_golden_values(backend, x, alpha, expected):
    p = backend.numpy(er.entmax(backend.asarray(np.array(x)), alpha, backend=backend))
    np.testing.assert_allclose(p, expected, rtol=0, atol=5e-12)


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_rows(backend, n):
    x = np.zeros((3, n))
    p, info = _run(backend, x, 1.5)
    assert p.shape == (3, n)
    if n == 1:
        assert np.all(p == 1) and np.all(info["support"] == 1)
    else:
        assert np.all(info["support"] == 0) and np.all(np.isneginf(info["tau"]))


def test_empty_batch(backend):
    p = backend.numpy(er.entmax(backend.asarray(np.zeros((0, 5))), 1.3, backend=backend))
    assert p.shape == (0, 5)


def test_per_row_alpha_equals_row_by_row(backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7))
    alpha = np.array([[1.0, 1.3, 1.5], [2.0, 2.7, 1.0 + 1e-6]])
    both = backend.numpy(er.entmax(backend.asarray(x), alpha, backend=backend))
    for i in range(2):
        for j in range(3):
            one = backend.numpy(er.entmax(backend.asarray(x[i, j]), alpha[i, j], backend=backend))
            np.testing.assert_array_equal(both[i, j], one)
    col = backend.numpy(er.entmax(backend.asarray(x), np.array([1.2, 1.8, 2.5]), backend=backend))
    np.testing.assert_array_equal(col[1, 2], backend.numpy(er.entmax(backend.asarray(x[1, 2]), 2.5, backend=backend)))


@settings(max_examples=10)
@given(st.sampled_from([1.0, 1.25, 1.5, 2.0, 3.0]))
@example(1.5)
def test_long_row_with_offset(backend, alpha):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 100_000)) + 1e6
    p, info = _run(backend, x, alpha)
    ref, _ = _run(backend, x - 1e6, alpha)
    assert abs(p.sum() - 1) < 1e-10
    assert info["support"][0] == np.count_nonzero(p)
    np.testing.assert_allclose(p, ref, rtol=0, atol=1e-9)  # x + 1e6 rounds x to ~1e-10
