"""The numba backend's row kernels against the NumPy reference backend.

Same answers means: identical supports, converged solves, and every value within a few
float64 ulps *of its own conditioning* (the tolerances below are derived from the problem,
not from what happened to pass), for float64 and float32 inputs, on seeded random rows and
on adversarial ones (ties, constant rows, 1e6 offsets, -inf masks, n = 1, n = 10^6,
alpha from 1 to 100, per-row alpha).

Tolerance model: :func:`agreement.rows_agreement_tolerances` and
:func:`~agreement.rows_agreement_vjp_tolerances` (the test suite's engine-agreement
module: float64 working precision, K = 8 roundings' worth, derived from each row's
support, ``u = p^(2-alpha)`` and ``|log p|``); float32 output adds one float32 ulp of p.
"""

from __future__ import annotations

import re
import warnings
import zlib

import mpmath as mp
import numpy as np
import pytest

from entmax_ref.backends import get_backend, unavailable_reason
from agreement import rows_agreement_tolerances, rows_agreement_vjp_tolerances
from helper_entry import entry

_reason = unavailable_reason("numba")
pytestmark = [
    pytest.mark.numba,
    pytest.mark.skipif(_reason is not None, reason=f"numba backend: {_reason}"),
]

EPS = np.finfo(np.float64).eps
ALPHAS = [1.0, 1.0 + 1e-6, 1.1, 1.25, 1.33, 1.5, 1.75, 2.0, 2.5, 3.0, 10.0, 100.0]
DTYPES = [np.float64, np.float32]


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy")


@pytest.fixture(scope="module")
def nb():
    return get_backend("numba")


# ----------------------------------------------------------------------------- helpers
def _check(nb, ref, x, alpha, method=None, ref_method="same"):
    """Run both backends and assert the same answer (see the module docstring)."""
    x = np.ascontiguousarray(x)
    alpha = np.broadcast_to(np.asarray(alpha, np.float64), (x.shape[0],)).copy()
    x_before, a_before = x.copy(), alpha.copy()
    got = nb.entmax_forward(x, alpha, method)
    np.testing.assert_array_equal(x, x_before)  # inputs are never modified
    np.testing.assert_array_equal(alpha, a_before)
    rm = method if ref_method == "same" else ref_method
    x64 = x.astype(np.float64)
    want = ref.entmax_forward(x64, alpha, rm)  # the reference is float64 inside anyway

    assert got.p.dtype == x.dtype and got.p.shape == x.shape
    assert got.theta.dtype == np.float64 and got.support.dtype == np.int64
    assert got.n_iter.dtype == np.int64 and got.converged.dtype == np.bool_
    assert got.converged.all()
    np.testing.assert_array_equal(got.support, want.support)
    if x.dtype == np.float64:  # the same entries are nonzero (float32 may round tiny p to 0)
        np.testing.assert_array_equal(got.p > 0, want.p > 0)

    tol_p, tol_t = rows_agreement_tolerances(x64, alpha, want.p, want.theta)
    fin = np.isfinite(want.theta)
    np.testing.assert_array_equal(np.isfinite(got.theta), fin)
    assert np.all(got.theta[~fin] == -np.inf)
    err_t = np.abs(got.theta[fin] - want.theta[fin])
    assert np.all(err_t <= tol_t[fin]), f"theta off by {err_t.max():.3g} (tolerance {tol_t[fin][err_t.argmax()]:.3g})"

    if x.dtype == np.float32:
        # both sides round the same float64 number to float32: one float32 ulp on top
        tol = tol_p + np.spacing(np.abs(want.p).astype(np.float32)).astype(np.float64)
        ref_p = want.p.astype(np.float32).astype(np.float64)
    else:
        tol = tol_p
        ref_p = want.p
    err = np.abs(got.p.astype(np.float64) - ref_p)
    bad = err > tol
    assert not bad.any(), (
        f"{bad.sum()} entries off; worst {err[bad].max():.3g} vs tolerance {tol[bad][err[bad].argmax()]:.3g}"
    )
    return got, want


def _random_rows(rng, rows, n, kind):
    if kind == "normal":
        return rng.standard_normal((rows, n))
    if kind == "wide":
        return 20.0 * rng.standard_normal((rows, n))
    if kind == "narrow":
        return 0.01 * rng.standard_normal((rows, n))
    if kind == "uniform":
        return rng.random((rows, n))
    if kind == "ties":  # many exact ties, including ties at the top
        return np.round(2.0 * rng.standard_normal((rows, n))) / 2.0
    if kind == "offset":
        return 1e6 + rng.standard_normal((rows, n))
    if kind == "masked":
        x = rng.standard_normal((rows, n))
        x[rng.random((rows, n)) < 0.4] = -np.inf
        x[0] = -np.inf  # an all-masked row
        if n > 1:
            x[1, 1:] = -np.inf  # a single visible entry
        return x
    raise ValueError(kind)


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("kind", ["normal", "wide", "narrow", "uniform", "ties", "offset", "masked"])
def test_forward_matches_reference(nb, ref, kind, alpha, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{kind}-{alpha!r}".encode()))
    for n in (2, 7, 100, 1000):
        x = _random_rows(rng, 24, n, kind).astype(dtype)
        _check(nb, ref, x, alpha)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_constant_rows_and_single_entries(nb, ref, alpha, dtype):
    x = np.zeros((6, 50), dtype)
    x[1] = 3.0
    x[2] = -1e6
    x[3, :] = 1.0
    x[3, 7] = 1.0 + 1e-12  # a near-tie at the top
    x[4, 25:] = -np.inf  # constant visible half
    x[5] = np.linspace(0.0, 1.0, 50)  # evenly spaced
    _check(nb, ref, x, alpha)
    _check(nb, ref, np.array([[0.5], [-np.inf], [1e6]], dtype), alpha)  # n = 1


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_per_row_alpha(nb, ref, dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((200, 300)).astype(dtype)
    alpha = rng.choice(ALPHAS, size=200)
    _check(nb, ref, x, alpha)
    _check(nb, ref, x, 1.0 + 3.0 * rng.random(200))  # arbitrary alpha in [1, 4)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.33, 1.0 + 1e-6, 3.0])
def test_a_million_entries(nb, ref, alpha):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 10**6))
    x[0, rng.random(10**6) < 0.1] = -np.inf
    _check(nb, ref, x, alpha)
    _check(nb, ref, x.astype(np.float32), alpha)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_bisect_method_matches_reference_bisect(nb, ref, alpha):
    rng = np.random.default_rng(3)
    for kind in ("normal", "ties", "masked", "uniform"):
        x = _random_rows(rng, 16, 64, kind)
        got, want = _check(nb, ref, x, alpha, method="bisect")
        live = np.isfinite(want.theta)
        # same bracket and the same halving rule: the halving counts agree to a step or two
        assert np.all(np.abs(got.n_iter[live] - want.n_iter[live]) <= 2)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_newton_method_matches_reference(nb, ref, alpha):
    rng = np.random.default_rng(5)
    for kind in ("normal", "ties", "masked", "offset"):
        _check(nb, ref, _random_rows(rng, 16, 64, kind), alpha, method="newton", ref_method=None)


def test_empty_shapes_and_errors(nb):
    for shape in ((0, 5), (3, 0), (0, 0)):
        res = nb.entmax_forward(np.zeros(shape), np.full(shape[0], 1.5), None)
        assert res.p.shape == shape
        assert np.all(res.theta == -np.inf) and np.all(res.support == 0) and res.converged.all()
    with pytest.raises(NotImplementedError, match="'sort' exists on: numpy"):
        nb.entmax_forward(np.zeros((1, 3)), np.ones(1), "sort")


# ----------------------------------------------------------------------------- VJPs
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("alpha", ALPHAS + [1000.0])
def test_vjps_match_reference(nb, ref, alpha, dtype):
    rng = np.random.default_rng(int(alpha * 1000))
    for kind in ("normal", "ties", "masked", "wide"):
        x = _random_rows(rng, 16, 80, kind)
        a = np.full(16, alpha)
        p = ref.entmax_forward(x, a, None).p.astype(dtype)
        g = rng.standard_normal(p.shape).astype(dtype)
        p0, g0 = p.copy(), g.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither backend warns, even where u overflows
            dx = nb.entmax_vjp(p, g, a)
            da = nb.entmax_alpha_vjp(p, g, a)
            want_dx = ref.entmax_vjp(p, g, a)
            want_da = ref.entmax_alpha_vjp(p, g, a)
        np.testing.assert_array_equal(p, p0)
        np.testing.assert_array_equal(g, g0)
        tol, tol_a = rows_agreement_vjp_tolerances(p.astype(np.float64), g.astype(np.float64), a)
        assert dx.dtype == want_dx.dtype and da.dtype == np.float64
        # no NaN anywhere; the alpha VJP is always finite; an infinite dx (the Jacobian's
        # entries beyond float64's range, at alpha = 100 and 1000) is the same on both sides
        assert not np.isnan(want_dx).any() and not np.isnan(dx).any()
        assert np.isfinite(want_da).all() and np.isfinite(da).all()
        fin = np.isfinite(want_dx)
        np.testing.assert_array_equal(dx[~fin], want_dx[~fin])
        if dtype == np.float32:  # both round the same float64 value to float32
            with np.errstate(over="ignore"):
                tol = tol + np.spacing(np.abs(want_dx)).astype(np.float64)
        err = np.abs(dx[fin].astype(np.float64) - want_dx[fin])
        assert np.all(err <= tol[fin]), np.max(err - tol[fin])
        assert np.all(dx[p == 0] == 0)
        err_a = np.abs(da - want_da)
        assert np.all(err_a <= tol_a), np.max(err_a - tol_a)


def test_vjp_mixed_dtypes_and_empty_rows(nb, ref):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 9))
    x[0] = -np.inf
    a = np.array([1.5, 1.0, 2.0, 1.33, 3.0])
    p = ref.entmax_forward(x, a, None).p
    g = rng.standard_normal((5, 9)).astype(np.float32)
    dx = nb.entmax_vjp(p.astype(np.float32), g.astype(np.float64), a)
    assert dx.dtype == np.float64
    np.testing.assert_array_equal(dx[0], 0.0)
    assert nb.entmax_alpha_vjp(p, g.astype(np.float64), a)[0] == 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("alpha", [20.0, 100.0, 1000.0])
def test_small_edge_probabilities_at_large_alpha(nb, ref, alpha, dtype):
    """Edge probabilities q whose gap q^(alpha-1)/(alpha-1) is below float64's range
    (both backends solve for q itself, in log space): same supports and values, for every
    method, on the oracle's edge rows (padded with -inf) and random rows."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from oracle import edge_row

    rng = np.random.default_rng(int(alpha) + 1)
    rows = [np.array([0.0, -0.009617]), np.array([0.0, -0.009617, -0.009617, -0.5])]
    for ties in (1, 2, 3, 5, 9):
        for spread in (False, True):
            for _ in range(4):
                rows.append(edge_row(rng, alpha, ties, float(10.0 ** rng.uniform(-9.0, -2.0)), spread))
    n = max(len(r) for r in rows)
    x = np.full((len(rows), n), -np.inf)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
    x = x.astype(dtype)
    for method in (None, "bisect", "newton"):
        got, want = _check(nb, ref, x, alpha, method=method, ref_method=method if method != "newton" else None)
        p = want.p.astype(np.float64)
        if dtype == np.float64:
            assert np.all(np.abs(p.sum(axis=1) - 1.0) <= 4 * EPS)
            assert np.all(np.abs(got.p.sum(axis=1) - 1.0) <= 4 * EPS)
        if method == "bisect":
            assert np.all(np.abs(got.n_iter - want.n_iter) <= 2)
    w = 1.0 / (alpha - 1.0)
    _check(nb, ref, rng.uniform(-1.5 * w, 0.0, (64, 9)).astype(dtype), alpha)


# ----------------------------------------------------------------------------- the fused finite scan
@pytest.mark.parametrize("alpha", [1.0, 1.33, 1.5, 2.0, 3.0, "mixed"])
@pytest.mark.parametrize("method", [None, "bisect"])
def test_scan_in_the_row_pass_raises_the_public_error(nb, alpha, method):
    """The public layer leaves the NaN/+inf scan of x to the numba kernels (their own pass
    over each row); a bad entry anywhere, in any driver, gives exactly the error of the
    separate scan, and -inf still masks (the same answer as without the scan)."""
    import entmax_ref as er
    from entmax_ref.backends._base import NonFiniteInput

    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 64, 70)).astype(np.float32)  # rows of 64 along axis 1
    a = rng.uniform(1.1, 3.0, (6, 70)) if alpha == "mixed" else alpha
    x[rng.random(x.shape) < 0.2] = -np.inf
    p = er.entmax(x, a, axis=1, method=method, backend="numba")
    np.testing.assert_array_equal(p, er.entmax(x, a, axis=1, method=method, backend="numba", check_finite=False))
    for bad, pos in ((np.nan, (0, 0, 0)), (np.inf, (5, 63, 69)), (np.nan, (3, 17, 2))):
        xb = x.copy()
        xb[pos] = bad
        want = f"x contains 1 NaN or +inf value; the first is x[{', '.join(map(str, pos))}] = {xb[pos].item()!r}"
        with pytest.raises(ValueError, match=re.escape(want)):
            er.entmax(xb, a, axis=1, method=method, backend="numba")
    rows = np.moveaxis(x, 1, -1).reshape(-1, 64).copy()
    rows[7, 5] = np.nan
    with pytest.raises(NonFiniteInput):
        nb.entmax_forward_scanned(rows, np.full(rows.shape[0], 1.5), method)



def test_every_solver_marks_its_nonfinite_rows(nb):
    """No separate scan: each row solver counts NaN and +inf in its maximum pass. Every
    kind of bad row is caught on every path (the scanned call raises; unscanned, the row
    is p = NaN, theta NaN, n_iter -1, and the clean rows are untouched); rows of -inf
    alone pass; softmax's underflowing entries still give exact thresholds."""
    from entmax_ref.backends._base import NonFiniteInput

    inf, nan = np.inf, np.nan
    bad = [[nan, 1.0, 2.0], [inf, 1.0, 0.0], [inf, inf, -inf], [-inf, nan, -inf], [nan, nan, nan],
           [-inf, -inf, inf]]
    for dtype in (np.float64, np.float32):
        for alpha, method in ((1.0, None), (1.33, None), (1.5, None), (2.0, None), (3.0, None), (1.5, "bisect"),
                              (3.0, "bisect"), (1.5, "newton")):
            a = np.full(3, alpha)
            for row in bad:
                rows = np.array([[0.5, -1.0, 0.25], row, [1.0, 0.0, -2.0]], dtype)
                with pytest.raises(NonFiniteInput):
                    nb.entmax_forward_scanned(rows, a, method)
                got = nb.entmax_forward(rows, a, method)
                want = nb.entmax_forward(rows[[0, 2]], a[:2], method)
                assert np.isnan(got.p[1]).all() and np.isnan(got.theta[1]) and got.n_iter[1] == -1
                assert got.support[1] == 0 and not got.converged[1]
                np.testing.assert_array_equal(got.p[[0, 2]], want.p)
                np.testing.assert_array_equal(got.theta[[0, 2]], want.theta)
            masked = np.array([[-inf, -inf, -inf], [0.0, -inf, -1.0]], dtype)
            got = nb.entmax_forward_scanned(masked, a[:2], method)
            assert got.theta[0] == -inf and (got.p[0] == 0).all() and got.p[1, 1] == 0
        rows = np.array([[-inf, -inf, -inf], [0.0, -1000.0, -inf], [0.0, -745.0, -708.5]], dtype)
        got = nb.entmax_forward_scanned(rows, np.ones(3), None)
        assert got.theta[0] == -inf and got.theta[1] == 0.0  # exp(-1000) is below float64's range
        # entries below vexp_neg's range are redone with vexp (without that, exp(-708) =
        # 3e-308 in place of each): theta = log1p(e^a + e^b) = e^a + e^b here, each term
        # within one ulp of the bottom of float64's grid (vexp's bound), their sum and
        # log1p exact at this size
        a, b = (mp.mpf(float(v)) for v in rows[2, 1:])
        with mp.workdps(50):
            want = float(mp.exp(a) + mp.exp(b))
        assert abs(got.theta[2] - want) <= 2 * np.spacing(0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("n", [1, 37, 1000, 4096])
def test_softmax_rows_take_each_maximum_in_the_previous_rows_pass(nb, dtype, n):
    """In a block of rows, softmax takes each row's maximum and NaN/+inf count inside the
    previous row's exponential pass. Every row of a
    many-row call, settled rows (NaN, +inf, all -inf) between solved ones, bad entries at
    either end of the next row (its last block overlaps the one before when n is not a
    multiple of the lanes), gets the same bits as the row solved alone (whose pass reads
    itself again)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((300, n)).astype(dtype)
    x[rng.random(x.shape) < 0.1] = -np.inf
    x[::7] = -np.inf  # all masked, every 7th row
    for r, col in ((10, 0), (11, n - 1), (40, n // 2), (41, 0)):
        x[r, col] = np.nan
    x[60, n - 1] = np.inf
    x[61, 0] = np.inf
    x[90] = 2.0  # all tied at the top
    x[93, :] = -800.0  # below exp's range except the maximum
    x[93, 0] = 0.0
    got = nb.entmax_forward(x, np.ones(x.shape[0]), None)
    for r in range(x.shape[0]):
        one = nb.entmax_forward(x[r:r + 1], np.ones(1), None)
        np.testing.assert_array_equal(got.p[r], one.p[0])
        for field in ("theta", "support", "n_iter", "converged"):
            np.testing.assert_array_equal(getattr(got, field)[r], getattr(one, field)[0])
    bad = ~np.isfinite(x) & ~np.isneginf(x)
    np.testing.assert_array_equal(got.n_iter == -1, bad.any(axis=1))
    assert (got.support[::7] == 0).all() and (got.theta[::7] == -np.inf).all()


def _float32_softmax_rows(n):
    """float32 rows of length ``n`` for the softmax kernel: every scale (wide ones reach
    float32's subnormal range and zero), -inf masks, ties, a huge offset, a row of one
    finite entry."""
    rng = np.random.default_rng(n)
    blocks = [rng.standard_normal((24, n)) * s for s in (1e-3, 1.0, 8.0, 40.0, 1e3)]
    x = np.concatenate(blocks).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = -np.inf
    x[3] = np.round(x[3])  # ties, the maximum's included
    x[4] += np.float32(3e5)  # an offset far above the spread
    x[5, :] = -np.inf
    x[5, -1] = 1.0
    return x


@pytest.mark.parametrize("n", [1, 7, 64, 65, 1000, 4099, 8192])
def test_float32_softmax_rows_are_correctly_rounded(n):
    """The float32 softmax kernel (:func:`.softmax.softmax32_rows`: the shorter exponential,
    a rounding test against the exact value, the compiled finishing stage where it does
    not decide) gives the correctly rounded rows, the NumPy engine's bits: p, tau and the
    support; short rows also against the mpmath oracle."""
    import entmax_ref as E
    from entmax_ref.testing.oracle import entmax_cr

    x = _float32_softmax_rows(n)
    got = E.softmax(x, backend="numba", return_info=True)
    want = E.softmax(x, backend="numpy", return_info=True)
    np.testing.assert_array_equal(got[0].view(np.int32), want[0].view(np.int32))
    np.testing.assert_array_equal(got[1].tau, want[1].tau)
    np.testing.assert_array_equal(got[1].support_exact, want[1].support_exact)
    if n <= 65:
        for r in range(0, x.shape[0], 7):
            p, tau, k = entmax_cr(x[r].astype(np.float64), 1.0, np.float32)
            np.testing.assert_array_equal(got[0][r].view(np.int32), np.asarray(p, np.float32).view(np.int32))
            assert got[1].tau[r] == tau and got[1].support_exact[r] == k, r


def test_float32_softmax_fast_path_within_its_rounding_test_width():
    """Every float64 probability of the float32 softmax's fast path (:func:`.softmax._pass32`:
    ``p_i = vexp32(x_i - m) / D``) lies within the rounding test's ``T`` ulps of the exact
    value (mpmath), on rows of several spreads and on a row whose ``x_i - m`` are not exact
    in float64 (entries near 0 under a maximum of 80): the bound the test's decisions rest
    on.  (A polynomial one degree short of :func:`.vexp.vexp32`'s errs by 600 units.)"""
    from entmax_ref.backends.numba.softmax import _lanes, _pass32, _row_test
    _lanes, _pass32, _row_test = entry(_lanes), entry(_pass32), entry(_row_test)

    rng = np.random.default_rng(9)
    rows = [rng.standard_normal(4096) * s for s in (1.0, 6.0, 20.0)]
    far = rng.standard_normal(4096) * 1e-9
    far[:64] = rng.uniform(70.0, 80.0, 64)
    far[0] = 80.0
    rows.append(far)
    for x in rows:
        x = x.astype(np.float32)
        n, m, lo = x.shape[0], float(x.max()), float(x.min())
        L = _lanes(n)
        lanes, c, out = np.empty((2, L)), np.empty(n), np.empty(n, np.float32)
        D = _pass32(x, m, c, lanes[0], lanes[1], out, c.copy(), 0.0, 0, x)[0]
        T, _ = _row_test(n, L, m, lo)
        p = c * (1.0 / D)
        with mp.workdps(40):
            e = [mp.exp(mp.mpf(float(v)) - mp.mpf(m)) for v in x]
            S = mp.fsum(e)
            ulps = np.array([float(abs(mp.mpf(float(pi)) - ei / S) / mp.mpf(float(np.spacing(pi))))
                             for pi, ei in zip(p, e)])
        assert ulps.max() <= T, (ulps.max(), T)
        assert ulps.max() > 1.0  # the sweep sees the exponential's error, not only the last rounding


def test_float32_softmax_rows_left_by_the_kernel_are_solved_exactly():
    """A float32 softmax row that the row kernel's compiled finishing stage leaves undecided
    is solved exactly on the Python side: the oracle's p, support and tau (where a tau
    array is given), a ``theta`` whose float32 rounding is the oracle's tau; the other rows
    are left as they are."""
    from entmax_ref.backends._base import RowSolve
    from entmax_ref.backends.numba_backend import _exact_softmax32
    from entmax_ref.testing.oracle import entmax_cr

    x = np.random.default_rng(11).standard_normal((3, 9)).astype(np.float32)
    res = RowSolve(np.zeros((3, 9), np.float32), np.zeros(3), np.zeros(3, np.int64), np.zeros(3, np.int64),
                   np.array([True, False, True]))
    taus = np.zeros(3)
    _exact_softmax32(x, np.array([1]), res, taus)
    p, tau, k = entmax_cr(x[1].astype(np.float64), 1.0, np.float32)
    np.testing.assert_array_equal(res.p[1].view(np.int32), np.asarray(p, np.float32).view(np.int32))
    assert np.float32(res.theta[1]) == tau == taus[1] and res.support[1] == k and res.converged[1]
    assert not res.p[[0, 2]].any() and not res.theta[[0, 2]].any() and not taus[[0, 2]].any()


def _undecided32(alpha):
    """The float32 rows at ``alpha`` that the float32 rounding test leaves undecided, with
    their solver's theta, among: boundary rows (entries placed at the threshold, whose
    small probabilities the float64 threshold cannot round), narrow random rows and
    sparsemax rows with a tiny support entry (no float64 grid holds their sums exactly)."""
    from entmax_ref.backends.numba import rows as R
    from entmax_ref.backends.numba_backend import _solve_buffers
    from entmax_ref.testing.oracle import boundary_rows

    rng = np.random.default_rng(int(alpha * 100))
    rows = [r for seed in range(40, 70) for _, r in boundary_rows(np.random.default_rng(seed), alpha, n=12)]
    rows += [np.array([0.5, 2.0 ** -e, -2.0, -0.25 * e]) for e in range(90, 100)]
    x = np.full((48 + len(rows), 1024), -np.inf, np.float32)
    x[:48] = rng.standard_normal((48, 1024)) * 0.03
    for r, row in enumerate(rows):
        x[48 + r, :len(row)] = row
    bufs = _solve_buffers(x)
    tau, ok = np.empty(len(x)), np.empty(len(x), np.bool_)
    R.entmax_rows(x, np.full(len(x), alpha), R.METHOD_DEFAULT, R.Solved(*bufs), 4, (tau, ok))
    return x[~ok], bufs[1][~ok]


@pytest.mark.parametrize("alpha", [1.33, 1.5, 1.75, 2.0])
def test_float32_rows_the_rounding_test_leaves_are_finished_compiled(alpha):
    """float32 rows at 1 < alpha <= 2 that the rounding test leaves undecided go to the
    compiled finishing stage on the float32 grid (:func:`.exact_finish.finish_rows` with
    ``f32``): it decides rows itself (those with an entry on the threshold are left to the
    exact solver), with float32 values of p and tau (not their float64 roundings) that are
    the NumPy engine's bits, and the public call gives the NumPy engine's bits on every
    row."""
    import entmax_ref as E
    from entmax_ref.backends.numba import exact_finish

    x, theta = _undecided32(alpha)
    assert len(x) >= 3, len(x)
    a = np.full(len(x), alpha)
    x64 = x.astype(np.float64)
    out, tau = np.zeros(x.shape), np.empty(len(x))
    support, ok = np.empty(len(x), np.int64), np.empty(len(x), np.bool_)
    exact_finish.finish_rows(x64, a, out, theta.copy(), tau, support, ok, 4, True)
    assert ok.sum() >= 3, ok
    want, info = E.entmax(x[ok], alpha=alpha, backend="numpy", return_info=True)
    np.testing.assert_array_equal(out[ok], want.astype(np.float64))  # float32 values, the correct ones
    np.testing.assert_array_equal(tau[ok], info.tau)
    np.testing.assert_array_equal(support[ok], info.support_exact)
    got, gi = E.entmax(x, alpha=alpha, backend="numba", return_info=True)
    want, wi = E.entmax(x, alpha=alpha, backend="numpy", return_info=True)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    np.testing.assert_array_equal(gi.tau, wi.tau)
    np.testing.assert_array_equal(gi.support_exact, wi.support_exact)


#: (alpha, m): float32 rows whose maximum ``m`` alone is the support, where ``a1 m - 1``
#: (tau) rounded to float64 is a float32 rounding midpoint: the exact value itself (alpha
#: 1.75), or just above or below it (the float64 rounding loses which side)
ALONE_AT_MIDPOINTS = ((1.75, float.fromhex("0x1.ca6916p+1")), (1.75, float.fromhex("0x1.bb0accp+5")),
                      (float.fromhex("0x1.a3818250729bdp+0"), float.fromhex("0x1.730f84p+1")),
                      (float.fromhex("0x1.6e2ab4aef9ef5p+0"), float.fromhex("0x1.836196p+1")),
                      (float.fromhex("0x1.e4e308cf0b4e8p+0"), float.fromhex("0x1.70a00ap+1")),
                      (float.fromhex("0x1.bb789995feecbp+0"), float.fromhex("0x1.1673eep+1")))


def _rounding_test32(x, alpha):
    """The float32 rounding test's verdict on each row of ``x`` (:func:`.rows.entmax_rows`
    with its ``(tau, ok)``): (p, tau, ok)."""
    from entmax_ref.backends.numba import rows as R
    from entmax_ref.backends.numba_backend import _solve_buffers

    bufs = _solve_buffers(x)
    tau, ok = np.empty(len(x)), np.empty(len(x), np.bool_)
    R.entmax_rows(x, np.asarray(alpha, np.float64), R.METHOD_DEFAULT, R.Solved(*bufs), 4, (tau, ok))
    return bufs[0], tau, ok


def test_float32_rounding_test_decides_a_maximum_alone_exactly():
    """Where the rounding test proves that the maximum alone is the support, p = 1 and
    ``tau = a1 m - 1`` rounded once from the exact value, also where its float64 rounding is
    a float32 rounding midpoint (:data:`ALONE_AT_MIDPOINTS`; a bound on tau cannot decide
    those): the row is decided by the test itself, with the oracle's bits."""
    from entmax_ref.testing.oracle import entmax_cr

    x = np.array([[m, m - 4.0, m - 6.5, -np.inf] for _, m in ALONE_AT_MIDPOINTS], np.float32)
    alpha = np.array([a for a, _ in ALONE_AT_MIDPOINTS])
    p, tau, ok = _rounding_test32(x, alpha)
    assert ok.all(), ok
    for r, a in enumerate(alpha):
        want_p, want_tau, k = entmax_cr(x[r].astype(np.float64), a, np.float32)
        np.testing.assert_array_equal(p[r], np.asarray(want_p, np.float32))
        assert tau[r] == want_tau, (r, tau[r].hex(), float(want_tau).hex())


def test_float32_rounding_test_decides_narrow_rows():
    """The rounding test's radius on the threshold comes from the mass's slope over the
    whole support where that exceeds 1 (narrow rows: thousands of entries in the support,
    whose small probabilities far from the maximum move with the threshold): it decides
    more than nine rows in ten of 1.33-entmax on N(0, 0.01) rows of 8192, where the radius
    with slope 1 decided two in three; the rows it decides are the NumPy engine's bits."""
    import entmax_ref as E

    x = (np.random.default_rng(17).standard_normal((64, 8192)) * 0.1).astype(np.float32)
    p, tau, ok = _rounding_test32(x, np.full(64, 1.33))
    assert ok.mean() >= 0.85, ok.mean()
    want, info = E.entmax(x[ok], alpha=1.33, backend="numpy", return_info=True)
    np.testing.assert_array_equal(p[ok].view(np.int32), want.view(np.int32))
    np.testing.assert_array_equal(tau[ok], info.tau)


def test_float32_softmax_rounding_test_flags_what_it_cannot_decide():
    """The float32 softmax's rounding test (:func:`.softmax._pass32`'s least low bits
    against ``2 T``) leaves an entry undecided exactly when its float64 value lies within
    ``T`` ulps of a float32 rounding midpoint, and stores every entry's float32 rounding;
    :func:`.softmax._row_end32` leaves a row undecided when an entry lies in float32's
    subnormal range above 2^-152."""
    from entmax_ref.backends.numba.softmax import _MID29, _pass32, _row_end32
    _pass32, _row_end32 = entry(_pass32), entry(_row_end32)

    T = 100
    rng = np.random.default_rng(5)
    f = rng.uniform(2.0 ** -120, 1.0, 200).astype(np.float32)
    mid = (f.astype(np.float64) + np.nextafter(f, np.float32(2)).astype(np.float64)) / 2  # exact
    out = np.empty(1, np.float32)
    x = np.zeros(1, np.float32)
    lanes = np.empty((2, 8))
    c = np.empty(1)

    def undecided(v):
        low = _pass32(x, 0.0, c, lanes[0], lanes[1], out, np.array([v]), 1.0, T - _MID29, x)[1]
        return int(low <= 2 * T)

    for m in mid:
        for k, want in ((0, 1), (T, 1), (-T, 1), (T + 1, 0), (-T - 1, 0), (2 ** 27, 0)):
            v = m + k * np.spacing(m)
            assert undecided(v) == want, (m, k)
            assert out[0] == np.float32(v)
    E = 50.0
    for v, ok in ((2.0 ** -126, True), (np.nextafter(2.0 ** -126, 0), False), (2.0 ** -152, False),
                  (np.nextafter(2.0 ** -152, 0), True), (0.0, True)):
        # the exponentials 1 and v (theta = 0.5 + log(1 + v), far from a float32 boundary)
        row = np.array([0.0, np.log(v) if v > 0 else -np.inf], np.float32)
        cv = np.array([1.0, v])
        low = np.int64(1 << 29)  # the low bits decide nothing here
        got_ok = _row_end32(row, np.empty(2, np.float32), cv, 0.5, float(row.min()), 1.0 + v, T, E, low)[2]
        assert got_ok == ok, v


def test_three_way_partition():
    """The pivot solvers' three-way partition (two branch-free Lomuto passes): below, equal
    to and above the pivot in that order, the same multiset, and the sums of ``y - v`` and
    ``(y - v)^2`` above it, on sub-ranges with many ties and with a pivot at either end."""
    from numba import njit

    from entmax_ref.backends.numba.threshold import partition3
    partition3 = entry(partition3)

    part = njit(lambda c, lo, hi, v: partition3(c, lo, hi, v))
    rng = np.random.default_rng(5)
    for n, lo, hi in [(1, 0, 1), (2, 0, 2), (50, 0, 50), (300, 17, 251), (300, 0, 300)]:
        for ties in (False, True):
            c = rng.standard_normal(n)
            if ties:
                c = np.round(c * 2) / 2
            for v in (c[lo], c[lo:hi].min(), c[lo:hi].max(), np.median(c[lo:hi])):
                d = c.copy()
                lt, gt, s1, s2 = part(d, lo, hi, v)
                seg = c[lo:hi]
                np.testing.assert_array_equal(np.sort(d[lo:hi]), np.sort(seg))
                np.testing.assert_array_equal(d[:lo], c[:lo])
                np.testing.assert_array_equal(d[hi:], c[hi:])
                assert lt - lo == (seg < v).sum() and gt - lt == (seg == v).sum()
                assert np.all(d[lo:lt] < v) and np.all(d[lt:gt] == v) and np.all(d[gt:hi] > v)
                above = seg[seg > v] - v
                np.testing.assert_allclose([s1, s2], [above.sum(), (above ** 2).sum()], rtol=1e-13, atol=1e-300)


def test_closed_form_polish_stops_at_working_precision():
    """The Newton polish of a 1.5-entmax closed form stops once a step leaves f unchanged
    within its rounding error of 0, rather than bisecting the whole bracket from there
    (about 50 evaluations to move the threshold by an ulp), over the 27 largest of 2,048
    Gaussian scores, the attention forward's candidates.  The row is compiled by the
    package's own ``jit`` (its target, :mod:`entmax_ref.backends.numba._target`), as the
    helpers it calls are."""
    from entmax_ref.backends.numba import candidates as cd, elementwise as ew, rows as rw, threshold as th
    from entmax_ref.backends.numba._jit import jit

    @jit(no_cpython_wrapper=False)
    def polish(z, c, aux, seed):
        m = rw.max_zeroing(z, np.empty_like(z), c, aux)[0]
        k = cd.gather_alive(z, m, 0.5, ew.K_15, 0.0, c, aux.view(np.int64))
        A0, s0 = th.pivot15(c, k, seed)
        sup = c[s0:k]
        A, it, ok = th.newton_row(sup, k - s0, 0.5, ew.K_15, A0, 0.0, ew.bound_above(k, 0.5))
        f = th._f_eval(sup, k - s0, 0.5, ew.K_15, A, 0.0, False)[0]
        return m + A, it, ok, f

    rng = np.random.default_rng(3)
    its = []
    ref = get_backend("numpy")
    rows = []
    for r in range(600):
        s = rng.standard_normal(2048)
        rows.append(s[np.sort(np.argsort(s)[-27:])])
    x = np.array(rows)
    want = ref.entmax_forward(x, np.full(len(x), 1.5), None).theta
    for r, z in enumerate(x):
        theta, it, ok, f = polish(z, np.empty(27), np.empty(27), r)
        assert ok and abs(f) <= ew.TIE
        assert abs(theta - want[r]) <= 4 * np.spacing(abs(want[r])), (r, theta, want[r])
        its.append(it)
    # a bisection of the bracket [0, hi] down to one ulp takes about 50 evaluations, so a
    # row below 10 took none; the closed form itself is within an ulp or two of the root,
    # so Newton needs one or two evaluations a row
    assert max(its) < 10 and np.mean(its) <= 2.0, (max(its), np.mean(its))


@pytest.mark.parametrize("kind", ["normal", "wide", "narrow", "uniform", "ties", "offset", "masked"])
def test_subset_bounds_lie_below_the_thresholds(ref, kind):
    """The lower bounds the long-row solvers take from a window near the maximum: 1.5-entmax's
    threshold of the entries within 1 of it (exact when it says so), and for 1 < alpha < 1.5
    the rough Newton steps on alpha's own mass over the entries within 1.25, are at most the
    row's threshold (the reference's, to its rounding), and on normal rows close to it from
    alpha = 1.33 on (nearer 1 the support is wider than the window)."""
    from entmax_ref.backends.numba import candidates as cd
    from entmax_ref.backends.numba.gen import subset_bound_gen
    subset_bound_gen = entry(subset_bound_gen)
    from entmax_ref.backends.numba.rows import _subset_bound15
    _subset_bound15 = entry(_subset_bound15)

    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    x = _random_rows(rng, 24, 2000, kind)
    n = x.shape[1]
    for alpha in (1.05, 1.2, 1.33, 1.45, 1.5):
        want = ref.entmax_forward(x, np.full(len(x), alpha), None).theta
        ratios = []
        for r, row in enumerate(x):
            m = entry(cd._row_max)(row)
            if not np.isfinite(want[r]):
                continue
            A = want[r] - m  # the row's threshold in the solvers' units
            c, idx = np.empty(n), np.empty(n, np.int64)
            if alpha == 1.5:
                bound, s0, k, exact = _subset_bound15(row, m, c, idx, r)
                if exact:  # the window's threshold is the row's
                    assert abs(bound - A) <= 8 * EPS * (1.0 + abs(A)) + 4 * EPS * abs(m), (r, bound, A)
            else:
                bound, evals = subset_bound_gen(row, m, alpha - 1.0, c, idx)
                assert evals >= 1  # the window's mass is evaluated at least at 0
            # the reference's threshold is within a few ulps of the root, and A = theta - m
            # carries the rounding of theta near m: 8 eps (1 + |A|) + 4 eps |m|
            assert bound <= A + 8 * EPS * (1.0 + abs(A)) + 4 * EPS * abs(m), (alpha, r, bound, A)
            if A > 0:
                ratios.append(bound / A)
        if kind == "normal" and alpha >= 1.33:  # the top entries carry most of the mass
            assert np.median(ratios) > 0.9, (alpha, np.median(ratios))


def _alive(x, m, lo, a1):
    """The solvers' gather test (:func:`entmax_ref.backends.numba.candidates.gather_alive`)
    on float32 entries ``x``, with the kind of ``a1``, in NumPy's float64 arithmetic."""
    d = (np.asarray(x, np.float32).astype(np.float64) - m) - lo
    return {1.0: 1.0 + d > 0.0, 0.5: 1.0 + 0.5 * d > 0.0}.get(a1, a1 * d > -1.0)


@pytest.mark.parametrize("a1", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("n", [40, 300])
def test_float32_rounding_test_takes_the_solvers_candidates_only_where_they_cover_its_cut(a1, n):
    """The float32 rounding test's candidates are every entry above its cut, in row order,
    whether it filters the solver's gathered candidates or reads the row: it filters them
    only where the solver's gather keeps the smallest float32 above the cut.  The row holds
    the gather's edge ``v`` (its smallest float32 kept) and the float32 below it: a cut at
    that float32 is covered, a cut an ulp below it is not (the entry there lies above the
    cut and outside the solver's candidates), nor is any cut of a solver that kept none."""
    from entmax_ref.backends.numba.round32 import _candidates32
    _candidates32 = entry(_candidates32)

    rng = np.random.default_rng(int(a1 * 8) + n)
    x = rng.standard_normal(n).astype(np.float32)
    m, lo = float(x.max()), 0.4 * a1
    v = np.float32((m + lo) - 1.0 / a1)
    while not _alive(v, m, lo, a1):
        v = np.nextafter(v, np.float32(np.inf))
    while _alive(np.nextafter(v, np.float32(-np.inf)), m, lo, a1):
        v = np.nextafter(v, np.float32(-np.inf))
    below = np.nextafter(v, np.float32(-np.inf))
    x[[3, n - 5]] = [below, v]
    cols = np.flatnonzero(_alive(x, m, lo, a1))
    cut_at = float(below)
    for cut, kept_lo in ((cut_at, lo), (np.nextafter(cut_at, -np.inf), lo), (cut_at, np.inf)):
        want = np.flatnonzero(x.astype(np.float64) > cut)
        c, idx = np.full(n, np.nan), np.full(n, -1, np.int64)
        idx[:cols.size] = cols  # the solver's columns, in the buffer the test fills
        k, top = _candidates32(x, cut, (idx[:cols.size], m, kept_lo, a1), c, idx)
        assert k == want.size and top == x[want].max(), (cut, kept_lo)
        np.testing.assert_array_equal(idx[:k], want)
        np.testing.assert_array_equal(c[:k], x[want].astype(np.float64))


def test_float32_batch_with_a_few_rows_above_alpha_2():
    """A float32 batch with a few rows above alpha = 2 among many (solved as float64 rows,
    for those rows alone) gives the NumPy engine's bits, and each such row's bits alone."""
    import entmax_ref as E

    rng = np.random.default_rng(23)
    x = rng.standard_normal((300, 257)).astype(np.float32)
    alpha = np.full(300, 1.5)
    alpha[100:140] = 2.0
    big = [7, 150, 299]
    alpha[big] = [3.0, 2.5, 3.0]
    p, info = E.entmax(x, alpha=alpha, backend="numba", return_info=True)
    q, want = E.entmax(x, alpha=alpha, backend="numpy", return_info=True)
    np.testing.assert_array_equal(p.view(np.int32), q.view(np.int32))
    np.testing.assert_array_equal(info.tau, want.tau)
    np.testing.assert_array_equal(info.support_exact, want.support_exact)
    for r in big:
        alone, one = E.entmax(x[r:r + 1], alpha=alpha[r], backend="numba", return_info=True)
        np.testing.assert_array_equal(p[r].view(np.int32), alone[0].view(np.int32))
        assert info.tau[r] == one.tau[0] and info.support_exact[r] == one.support_exact[0]
