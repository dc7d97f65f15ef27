"""float64 results against a 50-digit mpmath oracle (the accuracy contract of the library).

Contract: for alpha in [1, 2], rows of up to 1000 entries with |x| <= 50, every
probability is within 4e-15 absolute of the exact value.  For alpha > 2, where
dp/dtau grows like p^(2-alpha) at the support edge, the bound is
ALPHA_GT2_FACTOR * eps * max_support p^(2-alpha) / (alpha - 1).  That bound is vacuous
at large alpha, so the solves relative to the support's edge are held to more: on rows
whose edge probabilities q are small enough that the edge gap q^(alpha-1) / (alpha-1) is
below float64's range (q < ~1e-308^(1/(alpha-1)): 8e-4 at alpha = 100, 0.5 at alpha =
1000), every probability is within ATOL_ALPHA_LE_2 = 4e-15 absolute of the exact value,
with the exact support (alpha in {20, 100, 1000}).
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import entmax_ref as er
from entmax_ref.testing.tolerance import ORACLE_ATOL
from oracle import edge_row, entmax_mp

EPS = float(np.finfo(np.float64).eps)
ATOL_ALPHA_LE_2 = ORACLE_ATOL
ALPHA_GT2_FACTOR = 4.0

ALPHAS_LE_2 = [1.0, 1.0 + 1e-6, 1.01, 1.1, 1.25, 1.33, 1.5, 1.75, 1.9, 2.0]
ALPHAS_GT_2 = [2.5, 3.0, 5.0, 10.0]


#: row lengths of the sweep: the default tier checks up to 100 entries, the exhaustive
#: tier adds the 1000-entry rows (the slow part of the 50-digit oracle)
SWEEPS = [pytest.param((1, 2, 7, 100), id="n<=100"),
          pytest.param((1000,), id="n=1000", marks=pytest.mark.exhaustive)]


def _cases(seed, sizes=(1, 2, 7, 100, 1000)):
    rng = np.random.default_rng(seed)
    for n in sizes:
        for scale in (0.05, 1.0, 10.0, 50.0):
            yield np.clip(rng.standard_normal(n) * scale, -50, 50)
        yield rng.uniform(-50, 50, n)
        yield np.round(rng.uniform(-3, 3, n) * 4) / 4  # exact ties


_EXACT: dict = {}  # the oracle is slow: share its answers between backends


def _exact(x, alpha, start):
    key = (x.tobytes(), alpha)
    if key not in _EXACT:
        _EXACT[key] = entmax_mp(x, alpha, start)[0]
    return _EXACT[key]


def _errors(backend, alpha, seed, sizes):
    worst = 0.0
    for x in _cases(seed, sizes):
        p, info = backend.call(er.entmax, x, alpha, return_info=True)
        start = float(info.tau) / (alpha - 1) if alpha != 1 else None  # the support threshold
        exact = _exact(x, alpha, start)
        with mp.workdps(50):
            err = max(abs(mp.mpf(float(pi)) - e) for pi, e in zip(p, exact))
            bound = 1.0
            if alpha > 2:
                on = [e for e in exact if e > 0]
                bound = ALPHA_GT2_FACTOR * EPS * float(max(e ** (2 - alpha) for e in on)) / (alpha - 1)
        worst = max(worst, float(err) / bound)
        exact_on = np.array([e > 0 for e in exact])
        representable = np.array([e >= np.finfo(np.float64).tiny for e in exact])
        assert np.all(p[~exact_on] == 0) and np.all(p[representable] > 0), "support differs from the exact one"
    return worst


@pytest.mark.parametrize("sizes", SWEEPS)
@pytest.mark.parametrize("alpha", ALPHAS_LE_2)
def test_float64_within_4e15_of_50_digit_oracle(backend, alpha, sizes):
    assert _errors(backend, alpha, int(alpha * 1000), sizes) <= ATOL_ALPHA_LE_2


@pytest.mark.parametrize("sizes", SWEEPS)
@pytest.mark.parametrize("alpha", ALPHAS_GT_2)
def test_float64_alpha_above_2_within_documented_bound(backend, alpha, sizes):
    assert _errors(backend, alpha, int(alpha * 1000), sizes) <= 1.0


def test_bisection_agrees_with_scipy_brentq(backend):
    """An independent root finder (scipy's brentq on the same threshold equation)."""
    from scipy.optimize import brentq

    rng = np.random.default_rng(11)
    for alpha in (1.2, 1.5, 1.8, 2.6):
        x = rng.standard_normal(50) * 3
        p, info = backend.call(er.entmax, x, alpha, method="bisect", return_info=True)

        def f(tau):
            return (np.maximum((alpha - 1) * x - tau, 0) ** (1 / (alpha - 1))).sum() - 1

        m = (alpha - 1) * x.max()
        tau = brentq(f, m - 1, m - 50 ** (1 - alpha), xtol=1e-15, rtol=4 * EPS)
        np.testing.assert_allclose(info.tau, tau, rtol=0, atol=1e-14)


def _edge_cases(alpha):
    """Rows with small-probability support edges (see :func:`oracle.edge_row`)."""
    rng = np.random.default_rng(int(alpha))
    yield np.array([0.0, -0.009617])  # p_2 = 4.96e-4 at alpha = 100 (float delta ~ 1e-327)
    yield np.array([0.0, -0.009617, -0.009617, -0.5, -np.inf])
    for ties in (1, 2, 3, 5):
        for spread in (False, True):
            for _ in range(3):
                yield edge_row(rng, alpha, ties, float(10.0 ** rng.uniform(-7.0, -2.5)), spread)


@pytest.mark.parametrize("alpha", [20.0, 100.0, 1000.0])
def test_small_edge_probabilities_at_large_alpha(backend, alpha):
    """Regression: the edge gap q^(alpha-1)/(alpha-1) underflowed (e.g. [0, -0.009617] at
    alpha = 100 gave p_2 = 5.68e-4, sum 1.00007, instead of 4.96e-4); now every p is within
    4e-15 absolute of the 50-digit oracle, the support is exact and the sum is 1 to rounding."""
    below_range = 0
    for x in _edge_cases(alpha):
        xb = backend.asarray(x)
        p = backend.numpy(backend.call(er.entmax, xb, alpha))
        q = backend.numpy(backend.call(er.entmax, xb, alpha, method="bisect"))
        exact = entmax_mp(x, alpha)[0]
        ex = np.array([float(e) for e in exact])
        on = np.array([e > 0 for e in exact])
        below_range += np.any(on & (ex ** (alpha - 1) / (alpha - 1) < np.finfo(np.float64).tiny))
        for got in (p, q):
            with mp.workdps(50):
                err = max(float(abs(mp.mpf(float(pi)) - e)) for pi, e in zip(got, exact))
            assert err <= ATOL_ALPHA_LE_2, (x.tolist(), err)
            np.testing.assert_array_equal(got > 0, on)
            assert abs(got.sum() - 1.0) <= 4 * EPS
    if alpha >= 100:  # the rows do reach the regime of the defect
        assert below_range >= 10


@pytest.mark.parametrize("alpha", [3.0, 100.0, 1000.0])
def test_vjp_where_skew_weights_overflow(backend, alpha):
    """alpha > 2: u = p^(2-alpha) overflows float64 at small edge probabilities (alpha =
    100, 1000).  The documented behaviour (NumpyBackend.entmax_vjp): no warnings, no NaN;
    every dx_i that float64 can hold is accurate, the entry of largest u included
    (dx_m = sum_{j != m} u_j (g_m - g_j) / sum u, bounded while it alone overflows); the
    others beyond float64's range are +-inf with the exact sign; d/dalpha is finite.
    Checked against 50 digits (u, r and dx_i = sum_j u_i u_j (g_i - g_j) / sum u, which
    has no cancellation, on the float64 p taken as exact)."""
    import warnings

    rng = np.random.default_rng(int(alpha) + 7)
    rows = [x for x in _edge_cases(alpha)] + [rng.uniform(-1.5 / (alpha - 1), 0, 6) for _ in range(6)]
    infinite = 0
    for x in rows:
        p = er.entmax(x, alpha)
        g = rng.standard_normal(len(x))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dx = backend.numpy(backend.call(er.entmax_vjp, backend.asarray(p), backend.asarray(g), alpha))
            da = float(backend.numpy(backend.call(er.entmax_alpha_vjp, backend.asarray(p), backend.asarray(g), alpha)))
        on = p > 0
        lg = 1.0 + np.log2(on.sum())
        with mp.workdps(50):
            P = [mp.mpf(float(v)) for v in p[on]]
            G = [mp.mpf(float(v)) for v in g[on]]
            a1 = mp.mpf(alpha) - 1
            U = [v ** (1 - a1) for v in P]
            S = mp.fsum(U)
            r = mp.fsum(u * gi for u, gi in zip(U, G)) / S
            exact = [mp.fsum(ui * uj * (gi - gj) for uj, gj in zip(U, G)) / S for ui, gi in zip(U, G)]
            exact_da = mp.fsum(v * (1 - a1 * mp.log(v)) * (gi - r) for v, gi in zip(P, G)) / a1**2
            m = max(range(len(U)), key=lambda i: U[i])
            e = [2 + abs((1 - a1) * mp.log(v)) for v in P]
            spread = lg * mp.fsum(u * ei * (abs(gi) + abs(r)) for u, ei, gi in zip(U, e, G)) / S
            bound = [u * (ei * (abs(gi) + abs(r)) + spread) for u, ei, gi in zip(U, e, G)]
            bound[m] = lg * mp.fsum(U[j] * e[j] * (abs(G[m]) + abs(G[j])) for j in range(len(U)) if j != m) * U[m] / S
            got = dx[on]
            for gi, ex, b in zip(got, exact, bound):
                if abs(ex) > mp.mpf(np.finfo(np.float64).max):
                    infinite += 1
                    assert gi == (np.inf if ex > 0 else -np.inf), (x.tolist(), gi, ex)
                else:
                    assert abs(mp.mpf(float(gi)) - ex) <= 8 * EPS * b, (x.tolist(), gi, ex)
            da_bound = lg * mp.fsum(v * (1 - a1 * mp.log(v)) * (4 + abs(mp.log(v))) * (abs(gi) + abs(r) + spread / S)
                                    for v, gi in zip(P, G)) / a1**2
            assert abs(mp.mpf(da) - exact_da) <= 8 * EPS * da_bound
        assert np.all(dx[~on] == 0)
    if alpha >= 100:
        assert infinite > 0  # the rows do reach the overflow


@pytest.mark.parametrize("method", [None, "bisect"])
def test_reference_bisection_skips_only_entries_that_stay_zero(monkeypatch, method):
    """The reference's bisection evaluates only the entries that can reach the support
    (numpy_backend._on_candidates): the same bits as evaluating every entry, on rows with
    ties, masked and far-off entries, alpha near 1 and far above 2, one alpha per row."""
    from entmax_ref.backends import numpy_backend as nb

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 300)) * rng.choice([0.05, 1.0, 10.0, 50.0], (64, 1))
    x[::7, :20] = x[::7, :1]  # ties at the top
    x[1::5, 40:60] = -np.inf  # masked entries
    x[2::9, 100:110] = -1e200  # far below every support window
    alpha = rng.choice([1.0 + 1e-6, 1.01, 1.25, 1.33, 1.75, 1.9, 2.5, 3.0, 10.0, 100.0, 1000.0], 64)

    def run(share):
        monkeypatch.setattr(nb, "CANDIDATE_SHARE", share)
        return er.entmax(x, alpha, method=method, backend="numpy", return_info=True)

    (p_all, i_all), (p_cand, i_cand) = run(0.0), run(1.0 + 1e-9)  # every entry; candidates only
    assert np.array_equal(p_all, p_cand)
    assert np.array_equal(i_all.tau, i_cand.tau)
    assert np.array_equal(i_all.n_iter, i_cand.n_iter)


def _newton_start_rows(rng, rows, n):
    """Rows for the Newton-start test: scales from 1e-8 to 1e3, ties at the top, masked and
    far-off entries, tiny and huge gaps, single-entry supports."""
    x = rng.standard_normal((rows, n)) * rng.choice([1e-8, 1e-3, 0.05, 1.0, 10.0, 1e3], (rows, 1))
    x[::7, : max(1, n // 4)] = x[::7, :1]  # ties at the top
    x[1::5, n // 2:] = -np.inf  # masked entries
    x[2::9, 1:] = -1e200  # a single entry within reach
    x[3::11] = rng.integers(-2, 3, (len(x[3::11]), n))  # integer ties everywhere
    x[4::13, 1::2] = x[4::13, :1] - 1e-300  # gaps far below the row's spacing
    return x


@pytest.mark.parametrize("n", [1, 2, 5, 64, 700])
def test_reference_newton_start_is_bitwise_the_bisection(n):
    """method=None narrows each row's bracket with safeguarded Newton steps before the
    last-bit bisection (numpy_backend._newton_bracket).  Every point it evaluates moves
    an end of the bracket by the sign of the same f the bisection uses, so it ends at the
    same adjacent pair of floats: p, tau and the support are those of method="bisect",
    bit for bit, in several times fewer evaluations."""
    rng = np.random.default_rng(n)
    x = _newton_start_rows(rng, 120, n)
    alpha = rng.choice([1.0 + 1e-9, 1.01, 1.1, 1.25, 1.33, 1.7, 1.99, 2.001, 2.5, 3.0, 4.0, 10.0, 100.0, 1000.0], 120)
    p0, i0 = er.entmax(x, alpha, backend="numpy", return_info=True)
    p1, i1 = er.entmax(x, alpha, method="bisect", backend="numpy", return_info=True)
    assert np.array_equal(p0, p1)
    assert np.array_equal(i0.tau, i1.tau)
    assert np.array_equal(i0.support, i1.support)
    assert np.all(i0.converged)
    if n >= 5:
        assert i0.n_iter.sum() * 2 < i1.n_iter.sum(), (i0.n_iter.sum(), i1.n_iter.sum())


@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.sampled_from([1.05, 1.25, 1.75, 2.5, 3.0, 7.0, 100.0]))
def test_reference_newton_start_is_bitwise_the_bisection_fuzzed(seed, n, alpha):
    rng = np.random.default_rng(seed)
    x = _newton_start_rows(rng, 24, n)
    p0, i0 = er.entmax(x, alpha, backend="numpy", return_info=True)
    p1, i1 = er.entmax(x, alpha, method="bisect", backend="numpy", return_info=True)
    assert np.array_equal(p0, p1) and np.array_equal(i0.tau, i1.tau)
