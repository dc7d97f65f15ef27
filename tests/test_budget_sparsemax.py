"""budget-sparsemax: exactness against a rational-arithmetic oracle, properties, VJP, peers."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import entmax_ref as er
from agreement import budget_agreement_tolerance
from family_cases import (central_differences, check_against_torch_peer, check_axis_dtype_and_inputs,
                          check_per_row_param, large_batch, solve_on_both, vjp_at, vjp_on_both)
from family_oracle import budget_exact, budget_np

from entmax_ref.testing.oracle import round_cr

EPS = np.finfo(np.float64).eps


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((10, 9)) * rng.choice([0.1, 1.0, 3.0], size=(10, 1))
    x[1, [0, 4]] = -np.inf  # masks
    x[2, :5] = x[2, 0]  # ties
    x[3, :] = -np.inf  # all masked
    x[4, :3] = -np.inf  # only 6 unmasked
    x[5] = 100.0 + rng.standard_normal(9)  # offset
    x[6] = np.array([3.0, 1.0, 0.0, -1.0, -2.0, -4.0, -5.0, -6.0, -7.0])  # integer-spaced breakpoints
    return x


@pytest.mark.parametrize("budget", (0.0, 0.5, 1.0, 2.0, 3.5, 6.0, 8.25, 9.0))
def test_matches_exact_oracle(backend, budget):
    x = _rows()
    p, info = er.budget_sparsemax(backend.asarray(x), budget, backend=backend, return_info=True)
    p, tau = backend.numpy(p), backend.numpy(info.tau)
    p_ref, tau_ref = budget_np(x, budget)
    tol = budget_agreement_tolerance(x, budget)
    err = np.abs(p - p_ref)
    assert (err <= tol).all(), (np.argwhere(err > tol)[:4], err.max())
    np.testing.assert_array_equal(np.isfinite(tau), np.isfinite(tau_ref))
    live = np.isfinite(tau_ref)
    assert (np.abs(tau[live] - tau_ref[live]) <= tol[live, 0]).all()
    np.testing.assert_array_equal(backend.numpy(info.support), (p_ref > 0).sum(axis=1))
    # the budget is met wherever it can be (at most the number of unmasked entries)
    m = np.isfinite(x).sum(axis=1)
    np.testing.assert_allclose(p.sum(axis=1), np.minimum(budget, m), rtol=0, atol=x.shape[1] * tol.max())


def test_hand_example_and_conventions(backend):
    p, info = er.budget_sparsemax(backend.asarray(np.array([1.5, 0.8, 0.2, -1.0])), 2.0, backend=backend,
                                  return_info=True)
    np.testing.assert_allclose(backend.numpy(p), [1.0, 0.8, 0.2, 0.0], rtol=0, atol=2 * EPS)
    assert abs(float(backend.numpy(info.tau))) <= 4 * EPS
    # integer budget, no fractional entry: tau is not unique; the smallest one is returned
    p, info = er.budget_sparsemax(backend.asarray(np.array([5.0, 4.0, 0.0])), 2.0, backend=backend, return_info=True)
    np.testing.assert_array_equal(backend.numpy(p), [1.0, 1.0, 0.0])
    assert float(backend.numpy(info.tau)) == 0.0
    # budget 0: zeros, tau = max; budget n: ones, tau = -inf
    p, info = er.budget_sparsemax(backend.asarray(np.array([0.3, -0.2])), 0.0, backend=backend, return_info=True)
    np.testing.assert_array_equal(backend.numpy(p), [0.0, 0.0])
    assert float(backend.numpy(info.tau)) == 0.3
    p, info = er.budget_sparsemax(backend.asarray(np.array([0.3, -0.2])), 2, backend=backend, return_info=True)
    np.testing.assert_array_equal(backend.numpy(p), [1.0, 1.0])
    assert float(backend.numpy(info.tau)) == -np.inf
    # budget 1 is sparsemax
    x = np.random.default_rng(2).standard_normal((5, 7))
    np.testing.assert_allclose(backend.numpy(er.budget_sparsemax(backend.asarray(x), 1.0, backend=backend)),
                               er.sparsemax(x, backend="numpy"), rtol=0, atol=8 * EPS)


def test_rows_with_a_huge_dynamic_range(backend):
    # the free entries are relative to each other, not to the row's maximum
    x = np.array([[1e300, -1e300, 0.0, 0.25], [1e16, 0.5, 0.0, -1e16]])
    p = backend.numpy(er.budget_sparsemax(backend.asarray(x), 1.5, backend=backend))
    np.testing.assert_array_equal(p, [[1.0, 0.0, 0.125, 0.375], [1.0, 0.5, 0.0, 0.0]])


def test_rows_beyond_2_53_are_exact(backend):
    # |x| >= 2^53: x - 1 rounds to x, so breakpoints formed as x - 1 collapse; the
    # projection is still exact (p relative to the largest free entry), and tau is the
    # exact threshold rounded to float64
    big = 2.0 ** 53
    x = np.array([[4 * big, 4 * big - 8.0, 0.0], [-big, 0.0, 0.25]])
    p, info = er.budget_sparsemax(backend.asarray(x), 1.5, backend=backend, return_info=True)
    p, tau = backend.numpy(p), backend.numpy(info.tau)
    np.testing.assert_array_equal(p[0], [1.0, 0.5, 0.0])
    assert tau[0] == float(Fraction(4 * big - 8) - Fraction(1, 2))  # 4 big - 8.5, rounded
    np.testing.assert_array_equal(p[1], [0.0, 0.625, 0.875])  # ordinary rows are unaffected


@pytest.mark.parametrize("x, budget, want", [
    ([1e16, 1e16], 1.0, [0.5, 0.5]),
    ([1e17, 1e17, 1e17, 1e17], 1.0, [0.25] * 4),
    ([-1e17, -1e17], 1.0, [0.5, 0.5]),
    ([1e300, -1e300], 1.5, [1.0, 0.5]),
    ([-1e300, 1e300, 1e300], 1.5, [0.0, 0.75, 0.75]),
    ([1.7e308, 1.6e308, -1.7e308], 1.5, [1.0, 0.5, 0.0]),
    ([1.7976931348623157e308, -1.7976931348623157e308], 1.25, [1.0, 0.25]),
    ([1.7976931348623157e308, 1.7976931348623157e308, -np.inf], 1.0, [0.5, 0.5, 0.0]),
])
def test_huge_and_near_float_max_rows_are_the_exact_projection(backend, x, budget, want):
    # differences of entries that overflow are +-inf, never a warning or a wrong sign
    x = np.array(x)
    p = backend.numpy(er.budget_sparsemax(backend.asarray(x), budget, backend=backend))
    np.testing.assert_array_equal(p, want)
    np.testing.assert_array_equal(p, budget_np(x[None], budget)[0][0])


@given(
    steps=hnp.arrays(np.int64, st.integers(1, 8), elements=st.integers(-8, 8)),
    shift=st.sampled_from([2.0 ** 50, 2.0 ** 52, 2.0 ** 53, 1e16, -1e17, 2.0 ** 60, 1e300, -1e300, 1.7e308]),
    masked=st.integers(0, 2),
    frac=st.floats(0, 1),
)
def test_huge_offsets_numpy_numba_and_the_exact_projection_agree(steps, shift, masked, frac):
    # rows of whole float64 steps (ulps) around a huge offset, with ties, masks and entries
    # at -offset: the exact projection (rational arithmetic) on both engines, and
    # sparsemax where the budget is 1
    x = np.concatenate([shift + np.spacing(abs(shift)) * steps, [-shift] * (masked == 1), [-np.inf] * (masked == 2)])
    n = len(x)
    budget = frac * n
    # the free entries lie within 1 of the largest of them: the error does not grow with the offset
    tol = budget_agreement_tolerance(np.ones((1, 1)), budget)[0, 0]
    p = {name: er.budget_sparsemax(x, budget, backend=name) for name in ("numpy", "numba")}
    p1 = {name: er.budget_sparsemax(x, 1.0, backend=name) for name in ("numpy", "numba")}
    p_ref, p1_ref = budget_np(x[None], budget)[0][0], budget_np(x[None], 1.0)[0][0]
    for name in p:
        np.testing.assert_allclose(p[name], p_ref, rtol=0, atol=tol, err_msg=name)
        np.testing.assert_allclose(p1[name], p1_ref, rtol=0, atol=tol, err_msg=name)
    np.testing.assert_allclose(p["numpy"], p["numba"], rtol=0, atol=2 * tol)
    np.testing.assert_allclose(p1["numba"], er.sparsemax(x, backend="numba"), rtol=0, atol=2 * tol)


def test_masks_all_masked_and_saturated_rows(backend):
    x = np.array([[0.5, -np.inf, 0.2, -np.inf], [-np.inf] * 4, [0.1, -np.inf, -np.inf, -np.inf]])
    p, info = er.budget_sparsemax(backend.asarray(x), 1.5, backend=backend, return_info=True)
    p = backend.numpy(p)
    np.testing.assert_allclose(p[0], [0.9, 0.0, 0.6, 0.0], rtol=0, atol=4 * EPS)
    np.testing.assert_array_equal(p[1], 0.0)
    np.testing.assert_array_equal(p[2], [1.0, 0.0, 0.0, 0.0])  # 1 unmasked entry < budget
    tau = backend.numpy(info.tau)
    assert tau[1] == -np.inf and tau[2] == -np.inf
    dx = backend.numpy(er.budget_sparsemax_vjp(backend.asarray(p), backend.asarray(np.ones_like(p) * 3), 1.5,
                                               backend=backend))
    np.testing.assert_array_equal(dx[1:], 0.0)


def test_dtypes_axis_inputs_untouched_and_per_row_budget(backend):
    x = np.random.default_rng(4).standard_normal((4, 6, 3))
    check_axis_dtype_and_inputs(backend, er.budget_sparsemax, 2.5, x, f32_atol=np.finfo(np.float32).eps)
    check_per_row_param(backend, er.budget_sparsemax, x[:, :, 0], np.array([0.5, 1.0, 2.0, 5.5]))


@pytest.mark.parametrize("budget", [-0.5, 4.5, np.inf, np.nan])
def test_budget_outside_range_is_a_value_error(budget):
    with pytest.raises(ValueError, match=r"budget.*(\[0, 4\]|finite)"):
        er.budget_sparsemax(np.zeros(4), budget, backend="numpy")
    with pytest.raises(ValueError, match="budget"):
        er.budget_sparsemax_vjp(np.zeros(4), np.zeros(4), budget, backend="numpy")


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"n = 3"):
        er.budget_sparsemax(np.zeros((2, 3)), 4, backend="numpy")
    with pytest.raises(ValueError, match="budget"):
        er.budget_sparsemax(np.zeros((2, 3)), np.array([1.0, 2.0, 0.5]), backend="numpy")
    with pytest.raises(TypeError, match="budget"):
        er.budget_sparsemax(np.zeros(3), "2", backend="numpy")
    with pytest.raises(ValueError, match="NaN"):
        er.budget_sparsemax([0.0, np.nan], 1, backend="numpy")


def test_vjp_free_set_and_degenerate_cases(backend):
    p = np.array([[1.0, 0.8, 0.2, 0.0], [1.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    g = np.array([[3.0, 1.0, 0.0, 5.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 6.0]])
    dx = backend.numpy(er.budget_sparsemax_vjp(backend.asarray(p), backend.asarray(g), 2.0, backend=backend))
    np.testing.assert_array_equal(dx[0], [0.0, 0.5, -0.5, 0.0])
    np.testing.assert_array_equal(dx[1], 0.0)  # empty free set: p is locally constant
    np.testing.assert_array_equal(dx[2], [-2.0, -1.0, 0.0, 3.0])


@given(
    x=hnp.arrays(np.float64, st.integers(1, 10),
                 elements=st.one_of(st.floats(-4, 4, allow_nan=False), st.just(-np.inf))),
    frac=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_properties_and_vjp_vs_finite_differences(backend, x, frac, seed):
    n = len(x)
    budget = frac * n
    p, info = er.budget_sparsemax(backend.asarray(x), budget, backend=backend, return_info=True)
    p, tau = backend.numpy(p), float(backend.numpy(info.tau))
    fin = np.isfinite(x)
    tol = 16 * EPS * (1 + np.abs(np.where(fin, x, 0)).max() + n)
    assert (p >= 0).all() and (p <= 1).all() and (p[~fin] == 0).all()
    assert abs(p.sum() - min(budget, fin.sum())) <= n * tol
    if np.isfinite(tau):
        np.testing.assert_allclose(p, np.where(fin, np.clip(x - tau, 0, 1), 0.0), rtol=0, atol=tol)
    # optimality against the exact oracle
    p_ref, _ = budget_np(x, budget)
    np.testing.assert_allclose(p, p_ref[0], rtol=0, atol=tol)
    # VJP vs central differences, away from the breakpoints
    assume(np.isfinite(tau))
    assume(np.min(np.minimum(np.abs(x - tau), np.abs(x - 1 - tau))[fin]) > 1e-4)
    dx, g = vjp_at(backend, er.budget_sparsemax_vjp, p, budget, seed)
    fd = central_differences(er.budget_sparsemax, x, budget, g, 1e-7)
    np.testing.assert_allclose(dx, fd, rtol=0, atol=1e-6 * (1 + np.abs(g).sum()))


def test_backends_agree_on_a_large_batch(backend):
    rng, x = large_batch(9, 130, 257, 2.0)
    b = rng.uniform(0, 257, 130)
    p, _, q, _ = solve_on_both(backend, er.budget_sparsemax, x, b)
    np.testing.assert_allclose(p, q, rtol=0, atol=budget_agreement_tolerance(x, b).max())
    d1, d0 = vjp_on_both(backend, er.budget_sparsemax_vjp, q, rng.standard_normal(x.shape), b)
    np.testing.assert_allclose(d1, d0, rtol=0, atol=1e-13)


@pytest.mark.peer
@pytest.mark.parametrize("budget", (1.0, 2.0, 3.5, 7.0))
def test_peer_budget_bisect_forward_and_autograd(backend, budget):
    rng = np.random.default_rng(19)
    x = rng.standard_normal((12, 15))
    check_against_torch_peer(backend, er.budget_sparsemax, er.budget_sparsemax_vjp, budget,
                             lambda pkg, xt: pkg.budget_bisect(xt, budget=budget, n_iter=100),
                             x, rng.standard_normal(x.shape), 1e-14, 1e-13)


def test_check_battery_passes_the_backends_and_fails_a_perturbed_implementation(backend):
    from entmax_ref.testing.family_checks import check_budget_sparsemax

    good = check_budget_sparsemax(lambda x, budget: er.budget_sparsemax(x, budget, backend=backend), 2.5,
                                  vjp=lambda x, g, budget: er.budget_sparsemax_vjp(
                                      er.budget_sparsemax(x, budget, backend=backend), g, budget, backend=backend),
                                  name=backend, size="quick")
    assert good.ok, good.table()

    def sum_slightly_off(x, budget):
        return np.clip(er.budget_sparsemax(x, budget, backend="numpy") * (1 + 1e-9), 0, 1).astype(x.dtype)

    bad = check_budget_sparsemax(sum_slightly_off, 2.5, size="quick", dtypes=("float64",))
    assert not bad.ok


def test_vjp_of_huge_upstream_gradients(backend):
    # g_i - mean_F(g) with sum_F g beyond float64's range: scaled, not -inf or NaN
    vjp = er.budget_sparsemax_vjp
    np.testing.assert_array_equal(vjp([0.5, 0.5], [1e308, 1e308], 1.0, backend=backend), [0.0, 0.0])
    dx = vjp([0.5, 0.25, 0.25, 0.0], [1.5e308, 1.5e308, -1.5e308, 1e308], 1.0, backend=backend)
    exact = [float(Fraction(1.5e308) - Fraction(1.5e308) / 3), float(Fraction(1.5e308) - Fraction(1.5e308) / 3)]
    np.testing.assert_allclose(dx[:2], exact, rtol=4 * EPS)
    assert dx[2] == -np.inf and dx[3] == 0.0  # -1.5e308 - 0.5e308: beyond the range, rounded to -inf


# ----------------------------------------------------------------------------- correct rounding
CPU_ENGINES = ("numpy", "numba")


def _cr(x, budget, dtype):
    """The exact projection (:func:`family_oracle.budget_exact`) rounded once in ``dtype``:
    (p, tau, support)."""
    pf, tf = budget_exact(x, budget)
    p = np.array([round_cr(v, v, dtype) for v in pf], dtype)
    tau = -np.inf if tf is None else round_cr(tf, tf, dtype)
    return p, tau, sum(1 for v in pf if v > 0)


def _edge_rows(rng, n):
    """Rows whose entries sit on the breakpoints of h and one ulp either side (at tau and
    tau + 1 of a dyadic threshold), near ties, an offset, a masked entry; with budgets."""
    x = rng.standard_normal(n) * float(rng.choice([0.3, 1.0, 3.0]))
    yield x, float(rng.choice([0.5, 1.0, 2.0, 2.5, 3.7]))
    t = float(rng.choice([-1.0, -0.25, 0.5, 1.5]))
    near = [t, np.nextafter(t, 2.0), np.nextafter(t, -2.0), t + 1.0, np.nextafter(t + 1.0, 3.0),
            np.nextafter(t + 1.0, -3.0), t + 0.5, t + 0.25]
    yield np.array(near + list(t - rng.uniform(0.0, 2.0, 3))), float(rng.choice([1.0, 1.75, 2.0, 2.5]))
    m = float(x.max())
    yield np.concatenate([x, [m, np.nextafter(m, -np.inf), m - 1.0, np.nextafter(m - 1.0, np.inf)]]), 2.0
    yield np.round(x * 8.0) / 8.0 + 2.0 ** 20, 1.5
    masked = x.copy()
    masked[int(rng.integers(n))] = -np.inf
    yield masked, 1.25


def _check_cr(x, budget, backend, dtype, where):
    x = x.astype(dtype).astype(np.float64)
    budget = min(budget, float(len(x)))
    want_p, want_tau, want_k = _cr(x, budget, dtype)
    p, info = er.budget_sparsemax(x.astype(dtype)[None], budget, backend=backend, return_info=True)
    bits = np.int64 if dtype == np.float64 else np.int32
    hexes = [float(v).hex() for v in x]
    assert np.array_equal(p[0].view(bits), want_p.view(bits)), (where, hexes, p[0].tolist(), want_p.tolist())
    assert float(info.tau[0]) == want_tau, (where, hexes, float(info.tau[0]).hex(), float(want_tau).hex())
    assert int(info.support[0]) == want_k, (where, hexes, int(info.support[0]), want_k)


@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("backend", CPU_ENGINES)
def test_correctly_rounded_sample(backend, dtype):
    """Every p and tau is the exact projection's value rounded once (float64 and float32),
    with the exact support, on random rows and rows on the breakpoints."""
    for seed in range(12):
        for i, (x, budget) in enumerate(_edge_rows(np.random.default_rng(seed), int(3 + seed))):
            _check_cr(x, budget, backend, dtype, (seed, i, budget))
    for x in _rows(3):
        if np.isfinite(x).any():
            for budget in (0.0, 0.5, 1.0, 2.0, 3.5):
                _check_cr(x, budget, backend, dtype, ("rows", budget))


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", (np.float64, np.float32))
@pytest.mark.parametrize("backend", CPU_ENGINES)
def test_correctly_rounded_sweep(backend, dtype):
    for seed in range(300):
        rng = np.random.default_rng(seed + 1000)
        for i, (x, budget) in enumerate(_edge_rows(rng, int(rng.choice([3, 9, 40, 300])))):
            _check_cr(x, budget, backend, dtype, (seed, i, budget))
