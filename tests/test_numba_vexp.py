"""The vectorisable exponential and the vectorised row passes of the numba engine.

``vexp`` replaces ``math.exp`` in the softmax passes; it must stay below 1 ulp of the exact
value (50-digit mpmath) everywhere, including the subnormal range, the underflow to 0, the
overflow to inf, and -inf / NaN; the lane maximum must equal the maximum exactly.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

from entmax_ref.backends import unavailable_reason
from helper_entry import entry

_reason = unavailable_reason("numba")
pytestmark = [
    pytest.mark.numba,
    pytest.mark.skipif(_reason is not None, reason=f"numba backend: {_reason}"),
]

TINY = np.finfo(np.float64).tiny
SUB = 5e-324  # the smallest subnormal: the ulp of every subnormal
NO_COLS = np.empty(0, np.int64)  # a gather without the candidates' columns


@pytest.fixture(scope="module")
def vexp_array():
    from numba_arrays import vexp_array

    return vexp_array


def _ulps(got, d):
    """|got - exp(d)| in ulps of the exact value (subnormal ulps below the normal range)."""
    with mp.workdps(50):
        out = []
        for g, v in zip(got, d):
            e = mp.exp(mp.mpf(float(v)))
            if e > mp.mpf(np.finfo(np.float64).max):
                assert g == np.inf
                out.append(0.0)
                continue
            ulp = SUB if e < TINY else float(mp.mpf(2) ** (mp.floor(mp.log(e, 2)) - 52))
            out.append(float(abs(mp.mpf(float(g)) - e) / ulp))
    return np.array(out)


def _sweep(rng, n):
    """Dense, with the ranges where exp is hard: around 0 (r tiny), near the reduction
    boundaries (d / ln2 near a half-integer), subnormal results, the underflow edge and
    the overflow edge."""
    half = (np.arange(-1076, 1025) + 0.5) * math.log(2.0)
    parts = [
        -np.logspace(-20, math.log10(746.0), n),
        np.logspace(-20, math.log10(709.0), n // 4),
        rng.uniform(-746.0, 0.0, n),
        rng.uniform(-10.0, 10.0, n),
        rng.uniform(-745.2, -708.0, n // 2),  # subnormal results
        rng.uniform(708.0, 709.78, n // 8),  # near overflow
        np.concatenate([half, np.nextafter(half, -np.inf), np.nextafter(half, np.inf)]),
        np.array([0.0, -0.0, 1e-300, -1e-300, -745.13321910194110842, -745.1332191019412,
                  -744.44007192138121, -744.4400719213812, -708.3964185322641, 709.782712893384]),
    ]
    return np.concatenate(parts)


def test_vexp_below_one_ulp_against_mpmath(vexp_array):
    rng = np.random.default_rng(2026)
    d = _sweep(rng, 4000)
    got = np.empty_like(d)
    vexp_array(d, got)
    err = _ulps(got, d)
    assert err.max() < 1.0, f"{err.max():.3f} ulp at d = {d[err.argmax()]!r}"
    # in the normal range: one final rounding (0.5 ulp) plus the roundings of the small part
    # (at most ~0.27 ulp of a result below 1); 0.64 is the worst seen
    normal = (d > -708.0) & (d < 709.0)
    assert err[normal].max() < 0.8



def test_vexp_neg_is_vexp_on_its_range():
    """``vexp_neg`` (the softmax pass's exponential) gives vexp's bits on [VEXP_NEG_MIN, 0],
    and below it a normal number that is not exp(d), which the pass recomputes."""
    from entmax_ref.backends.numba.vexp import VEXP_NEG_MIN
    from numba_arrays import vexp_array, vexp_neg_array

    rng = np.random.default_rng(7)
    d = -np.concatenate([_sweep(rng, 4000), rng.uniform(-10, 0, 100_000)])
    d = d[(d >= VEXP_NEG_MIN) & (d <= 0.0)]
    d = np.concatenate([d, [VEXP_NEG_MIN, 0.0, -0.0, np.nan]])
    got, want = np.empty_like(d), np.empty_like(d)
    vexp_neg_array(d, got)
    vexp_array(d, want)
    np.testing.assert_array_equal(got, want)
    below = np.array([np.nextafter(VEXP_NEG_MIN, -np.inf), -745.0, -1e300, -np.inf])
    got = np.empty_like(below)
    vexp_neg_array(below, got)
    assert np.all(got == math.exp(VEXP_NEG_MIN))


def test_vexp32_within_its_stated_bound_against_mpmath():
    """The float32 softmax's exponential is within ``VEXP32_ERR + VEXP32_SLOPE |d|`` units
    of 2^-53 (relative) at every point of a sweep of [-88, 0], the bound its rounding test
    relies on, and within 2^-44 down to -708.  The sweep holds the reduction's edges (d /
    ln2 near a half-integer) for every k of the range, where the polynomial's error and
    the float64 ln2's are largest (a polynomial one degree shorter, refitted, errs by
    7.4e-14 there: 14 times the bound)."""
    from numba import njit

    from entmax_ref.backends.numba.vexp import VEXP32_ERR, VEXP32_RANGE, VEXP32_SLOPE, vexp32

    @njit
    def vexp32_array(d, out):
        for i in range(d.shape[0]):
            out[i] = vexp32(d[i])

    rng = np.random.default_rng(32)
    half = (np.arange(-128, 0) + 0.5) * math.log(2.0)
    d = np.concatenate([half, np.nextafter(half, -np.inf), np.nextafter(half, np.inf),
                        rng.uniform(-VEXP32_RANGE, 0.0, 20_000), -np.logspace(-20, 0, 500), [0.0, -VEXP32_RANGE]])
    d = d[d >= -VEXP32_RANGE]
    deep = rng.uniform(-708.0, -VEXP32_RANGE, 2000)
    got, got_deep = np.empty_like(d), np.empty_like(deep)
    vexp32_array(d, got)
    vexp32_array(deep, got_deep)
    with mp.workdps(40):
        def rel(g, v):
            e = mp.exp(mp.mpf(float(v)))
            return float(abs(mp.mpf(float(g)) - e) / e)
        err = np.array([rel(g, v) for g, v in zip(got, d)])
        err_deep = np.array([rel(g, v) for g, v in zip(got_deep, deep)])
    share = err * 2.0 ** 53 / (VEXP32_ERR + VEXP32_SLOPE * np.abs(d))
    worst = share.argmax()
    assert share[worst] <= 1.0, f"{err[worst] * 2.0 ** 53:.1f} units at d = {d[worst]!r}"
    assert share[worst] > 0.5  # the sweep reaches the hard points (0.9 of the bound seen)
    assert err_deep.max() <= 2.0 ** -44


def test_vexp_agrees_with_libm_on_a_million_points(vexp_array):
    """Against math.exp (itself within 1 ulp) on a dense grid of the softmax range: at most
    one ulp apart, and equal on the large majority of points."""
    d = np.linspace(-745.2, 5.0, 1_000_003)
    got = np.empty_like(d)
    vexp_array(d, got)
    want = np.array([math.exp(v) for v in d])
    diff = np.abs(got - want)
    assert np.all(diff <= np.spacing(want)), "more than one ulp from libm"
    assert np.mean(got == want) > 0.9


def test_vexp_special_values_and_float32_input(vexp_array):
    d = np.array([-np.inf, np.nan, np.inf, -1e308, 1e308, -746.0, 710.0, 0.0])
    got = np.empty_like(d)
    vexp_array(d, got)
    assert got[0] == 0.0 and np.isnan(got[1]) and got[2] == np.inf
    assert got[3] == 0.0 and got[4] == np.inf and got[5] == 0.0 and got[6] == np.inf
    assert got[7] == 1.0
    x32 = np.linspace(-100, 3, 1001).astype(np.float32)  # float32 input widens exactly
    got32 = np.empty(x32.shape, np.float64)
    vexp_array(x32, got32)
    want = np.empty_like(got32)
    vexp_array(x32.astype(np.float64), want)
    np.testing.assert_array_equal(got32, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [0, 1, 7, 64, 65, 127, 128, 129, 1000, 8192, 8193])
def test_lane_maximum_is_exact(dtype, n):
    from entmax_ref.backends.numba.candidates import lane_max, _row_max
    lane_max, _row_max = entry(lane_max), entry(_row_max)

    rng = np.random.default_rng(n)
    M, M2 = np.empty(64), np.empty(64)
    for case in range(4):
        x = rng.standard_normal(n).astype(dtype)
        if n and case == 1:
            x[rng.integers(n)] = 50.0  # the maximum anywhere, the tail included
        if n and case == 2:
            x[:] = -np.inf
        if n and case == 3:
            x[rng.random(n) < 0.3] = np.nan  # NaN entries are ignored
            x[-1] = 99.0
        want = -np.inf if n == 0 else np.nanmax(x.astype(np.float64))
        bad = int(np.sum(~(x.astype(np.float64) < np.inf)))  # NaN (and +inf): the solvers' check
        for L in (8, 64):
            assert lane_max(x, M[:L], M2[:L]) == (want, bad)
        assert _row_max(x) == want


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("a1", [1e-6, 0.1, 0.25, 0.33, 0.4999999999999999, 0.5000000000000001, 0.75, 0.99])
def test_one_pass_gather_is_the_window_then_filter_set(dtype, a1):
    """The 1 < alpha < 2 solver gathers its bound's candidates and the candidates above the
    bound in one masked pass each with the maximum known; the sets (and their order) must be
    the ones the window gather and the two filters give, also for entries right at the edges
    and for row lengths that are not a multiple of the 8-byte words of the mask."""
    from entmax_ref.backends.numba.candidates import _compact, gather_alive, _max_gather, _refilter
    _compact, gather_alive, _max_gather, _refilter = entry(_compact), entry(gather_alive), entry(_max_gather), entry(_refilter)
    from entmax_ref.backends.numba.elementwise import K_15, K_GEN, K_SPARSE

    rng = np.random.default_rng(int(a1 * 1e6))
    n = 3001
    a1b, kb = (0.5, K_15) if a1 < 0.5 else (1.0, K_SPARSE)
    for case in range(6):
        x = rng.standard_normal(n) * (1.0, 5.0, 0.01, 1.0, 1.0, 30.0)[case]
        if case == 3:  # maximum 0, entries at the window and bound edges (and one ulp either side)
            x = -np.abs(x)
            edges = np.array([-1.0 / a1, -1.0 / a1b, -2.0, -1.0])
            x[: 3 * edges.size] = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, -10)])
            x[-1] = 0.0
        if case == 4:
            x[rng.random(n) < 0.4] = -np.inf
        x = x.astype(dtype)
        c = np.empty(n)
        m, k, bad = _max_gather(x, 1.0 / a1, c)
        assert bad == 0
        k = _refilter(c, k, m, a1, K_GEN, 0.0)
        want_b = np.empty(n)
        nb = _compact(c, k, a1b, kb, 0.0, want_b)
        got_b = np.empty(n)
        assert gather_alive(x, m, a1b, kb, 0.0, got_b, NO_COLS) == nb
        np.testing.assert_array_equal(got_b[:nb], want_b[:nb])
        for lo in (0.0, 0.3, 1.7, 1.0 / a1 - 1e-9):
            want = np.empty(n)
            kw = _compact(c, k, a1, K_GEN, lo, want)
            got = np.empty(n)
            assert gather_alive(x, m, a1, K_GEN, lo, got, NO_COLS) == kw
            np.testing.assert_array_equal(got[:kw], want[:kw])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 8195])
def test_masked_gather_of_the_15_and_sparsemax_windows(dtype, n):
    """alpha = 1.5 and 2 gather their candidates after a vectorised maximum: the same y, in
    the same order, as the one-pass window gather and its filter."""
    from entmax_ref.backends.numba.candidates import gather_alive, _max_gather, max_zeroing, _refilter
    gather_alive, _max_gather, max_zeroing, _refilter = entry(gather_alive), entry(_max_gather), entry(max_zeroing), entry(_refilter)
    from entmax_ref.backends.numba.elementwise import K_15, K_SPARSE

    rng = np.random.default_rng(n)
    for case in range(3):
        x = (rng.standard_normal(n) * (1.0, 0.3, 4.0)[case]).astype(dtype)
        if case == 2:
            x[rng.random(n) < 0.5] = -np.inf
            x[0] = 1.0
        for a1, kind, W in ((0.5, K_15, 2.0), (1.0, K_SPARSE, 1.0)):
            c = np.empty(n)
            m, k, bad = _max_gather(x, W, c)
            k = _refilter(c, k, m, a1, kind, 0.0)
            got = np.empty(n)
            out = np.full(n, 7.0, dtype)
            m2, bad2 = max_zeroing(x, out, np.empty(n), np.empty(n))
            assert m2 == m and bad == bad2 == 0
            assert not out.any()  # the output row is zero-filled in the same pass
            idx = np.empty(n, np.int64)
            assert gather_alive(x, m2, a1, kind, 0.0, got, idx) == k
            np.testing.assert_array_equal(got[:k], c[:k])
            np.testing.assert_array_equal(got[:k], x[idx[:k]].astype(np.float64) - m)


def test_vlog1p_below_one_ulp_against_mpmath():
    """``vlog1p`` replaces ``math.log1p`` in the 1 < alpha < 2 Newton and output passes: below
    1 ulp of the exact value (50 digits) on (-1, 1] and beyond, with the hard places: w near
    -1 (log1p large and negative), near 0 (log1p ~ w, the rounding of 1 + w carried), the
    reduction's switch at ``1 + w = sqrt(2)/2`` and ``sqrt(2)``, and powers of two."""
    from numba_arrays import vlog1p_array

    rng = np.random.default_rng(7)
    s2 = math.sqrt(2.0)
    edges = np.array([s2 / 2 - 1, s2 - 1, -0.5, 0.5, -0.25, 1.0, -1.0 + 2.0 ** -53, 2.0 ** -60, -2.0 ** -60])
    w = np.concatenate([
        -1.0 + np.logspace(-16, 0, 3000),
        -np.logspace(-300, 0, 3000),
        np.logspace(-300, 0, 3000),
        rng.uniform(-1.0, 1.0, 6000),
        np.logspace(0, 300, 500),
        edges, np.nextafter(edges, -2.0), np.nextafter(edges, 2.0), [0.0, -0.0],
    ])
    w = w[w > -1.0]
    got = np.empty_like(w)
    vlog1p_array(w, got)
    worst = 0.0
    with mp.workdps(50):
        for g, v in zip(got, w):
            e = mp.log1p(mp.mpf(float(v)))
            if e == 0:
                assert g == 0.0
                continue
            ulp = float(mp.mpf(2) ** (mp.floor(mp.log(abs(e), 2)) - 52))
            err = float(abs(mp.mpf(float(g)) - e) / ulp)
            assert err < 1.0, f"{err:.3f} ulp at w = {v!r}"
            worst = max(worst, err)
    assert worst < 0.8  # 0.75 is the worst seen


def test_vlog1p_agrees_with_libm():
    """Against math.log1p on a dense grid of the entmax range (-1, 0]: at most one ulp apart,
    equal on most points."""
    from numba_arrays import vlog1p_array

    w = np.linspace(-1.0, 0.0, 1_000_003)[1:]
    got = np.empty_like(w)
    vlog1p_array(w, got)
    want = np.array([math.log1p(v) for v in w])
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(want))), "more than one ulp from libm"
    assert np.mean(got == want) > 0.9


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("a1", [1e-6, 0.1, 0.33, 0.5000000000000001, 0.99])
def test_gather_with_columns_is_the_output_test_set(dtype, a1):
    """The 1 < alpha < 2 solver gathers its candidates above the bound with their columns:
    exactly the entries the output pass's test ``a1 ((x - m) - lo) > -1`` keeps (evaluated
    here by numpy, the same float64 operations), in row order, each column holding the
    entry its y came from, also for entries one ulp either side of the edge and for a
    maximum far from the edge (the comparison's edge search gives up there and the gather
    tests in float64); compacting at a larger lower bound keeps exactly the ones alive there."""
    from entmax_ref.backends.numba.candidates import gather_alive, max_zeroing
    gather_alive, max_zeroing = entry(gather_alive), entry(max_zeroing)
    from entmax_ref.backends.numba.elementwise import K_GEN
    from entmax_ref.backends.numba.gen import _compact_gen
    _compact_gen = entry(_compact_gen)

    rng = np.random.default_rng(int(a1 * 1e6) + 1)
    n = 3001
    for case in range(5):
        x = rng.standard_normal(n) * (1.0, 5.0, 0.01, 1.0, 1.0)[case]
        if case == 3:
            x[rng.random(n) < 0.4] = -np.inf
            x[: 3] = [-1.0 / a1, np.nextafter(-1.0 / a1, 0), np.nextafter(-1.0 / a1, -10)]
            x[-1] = 0.0
        if case == 4:  # the edge m - 1/a1 near 0 with a large maximum
            x = x * 1e-3 + 0.5 / a1
            x[0] = 1.0 / a1
        x = x.astype(dtype)
        m = max_zeroing(x, np.empty(n), np.empty(n), np.empty(n))[0]
        for lo in (0.0, 0.3, 1.7):
            y = x.astype(np.float64) - m
            want = np.flatnonzero(a1 * (y - lo) > -1.0)
            c = np.empty(n)
            idx = np.empty(n, np.int64)
            k = gather_alive(x, m, a1, K_GEN, lo, c, idx)
            np.testing.assert_array_equal(idx[:k], want)
            np.testing.assert_array_equal(c[:k], y[want])
            lo2 = lo + 0.5
            keep = a1 * (c[:k] - lo2) > -1.0
            c2, i2 = c[:k][keep], idx[:k][keep]
            k2 = _compact_gen(c, idx, k, a1, lo2)
            assert k2 == keep.sum()
            np.testing.assert_array_equal(c[:k2], c2)
            np.testing.assert_array_equal(idx[:k2], i2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_edge_value_is_the_first_alive_entry(dtype):
    """The masked gathers compare each entry with the smallest value of its dtype that the
    output pass's test keeps: that value passes, the one an ulp below fails (so the
    comparison is the test itself, for every entry); where the search gives up (an edge
    near 0 with a large maximum, so the test's float64 rounding spans many ulps of the
    entry) it says so."""
    from entmax_ref.backends.numba.candidates import _LINE_STEPS, _first_alive
    _first_alive = entry(_first_alive)
    from entmax_ref.backends.numba.elementwise import K_15, K_GEN, K_SPARSE, is_alive
    is_alive = entry(is_alive)

    rng = np.random.default_rng(11)
    x = np.zeros(1, dtype)
    found = {K_SPARSE: 0, K_15: 0, K_GEN: 0}
    for _ in range(3000):
        kind, a1 = [(K_SPARSE, 1.0), (K_15, 0.5), (K_GEN, float(rng.uniform(1e-3, 1.0)))][rng.integers(3)]
        m = float(dtype(rng.standard_normal() * 10.0 ** rng.integers(-3, 30)))
        lo = float(rng.uniform(0.0, 0.9 / a1))
        v, ok = _first_alive(x, m, a1, kind, lo)
        if not ok:
            # it may give up only where the test's float64 rounding (a few eps of its
            # largest term) spans more than its steps of the entry's ulps at the edge
            edge = dtype((m + lo) - 1.0 / a1)
            span = 4 * np.finfo(np.float64).eps * max(abs(m), abs(m + lo), 1.0 / a1)
            assert _LINE_STEPS * np.spacing(abs(edge)) < span, (kind, a1, m, lo, edge)
            continue
        found[kind] += 1
        assert float(dtype(v)) == v  # a value of the entries' dtype
        assert is_alive((float(v) - m) - lo, a1, kind)
        below = np.nextafter(dtype(v), dtype(-np.inf))
        assert not is_alive((float(below) - m) - lo, a1, kind)
    # the edges checked cover every kind (about 1,000 draws each; the give-ups are only
    # where the assertion above allows them)
    assert min(found.values()) > 300, found
    # the edge near 0 with a maximum of 1e6 (a1 = 1e-6): the entries near 0 are far finer
    # than the test's rounding
    assert not _first_alive(x, 1e6, 1e-6, K_GEN, 0.0)[1]


def test_rough_exp_and_log1p_within_their_stated_bounds():
    """The rough pair of the 1 < alpha < 2 Newton's early steps (``backends/numba/gen.py``):
    ``vexp_rough`` within 1e-8 relative on [-708, 0], ``vlog1p_rough`` within ``1e-9
    |log1p(w)| + 2^-53 / (1 + w)`` on (-1, 0], against 50-digit mpmath on sweeps with the
    reduction's switch points (one term fewer in the log's series fails the bound: 2e-9 of
    the log at the switch)."""
    from numba import njit

    from entmax_ref.backends.numba.vexp import vexp_rough, vlog1p_rough

    @njit
    def apply(log, x, out):  # the functions inline into their callers; one loop for both
        for i in range(x.shape[0]):
            out[i] = vlog1p_rough(x[i]) if log else vexp_rough(x[i])

    rng = np.random.default_rng(11)
    d = np.concatenate([-np.logspace(-300, math.log10(708.0), 3000), rng.uniform(-30.0, 0.0, 3000),
                        np.array([0.0, -0.0, -708.0, -math.log(2) / 2, -math.log(2) * 1.5])])
    got = np.empty_like(d)
    apply(False, d, got)
    s2 = math.sqrt(2.0)
    edges = np.array([s2 / 2 - 1, -0.5, -0.25, -1.0 + 2.0 ** -53, -2.0 ** -60])
    w = np.concatenate([-1.0 + np.logspace(-16, 0, 3000)[:-1], -np.logspace(-300, 0, 3000)[:-1],
                        rng.uniform(-1.0, 0.0, 3000), edges, np.nextafter(edges, 0.0), [0.0]])
    w = w[(w > -1.0) & (w <= 0.0)]
    lg = np.empty_like(w)
    apply(True, w, lg)
    worst_e = worst_l = 0.0
    with mp.workdps(50):
        for g, v in zip(got, d):
            e = mp.exp(mp.mpf(float(v)))
            worst_e = max(worst_e, float(abs(mp.mpf(float(g)) - e) / e))
        for g, v in zip(lg, w):
            e = mp.log1p(mp.mpf(float(v)))
            bound = 1e-9 * abs(e) + mp.mpf(2) ** -53 / (1 + mp.mpf(float(v)))
            worst_l = max(worst_l, float(abs(mp.mpf(float(g)) - e) / bound))
    assert worst_e < 1e-8, worst_e
    assert worst_l < 1.0, worst_l


@pytest.mark.parametrize("a1", [1e-6, 0.1, 0.33, 0.75, 0.99])
def test_rough_mass_within_its_bound_of_the_exact_one(a1):
    """``_f_gen_rough`` (Newton's early steps) against the compensated ``_f_gen`` on
    candidate sets of normal rows at thresholds from the 1.5-entmax bound to past the root:
    f within 4e-8 (1 + |f|) + 1e-15, so that f > ROUGH_F is certainly positive."""
    from entmax_ref.backends.numba.gen import GL, ROUGH_F, _f_gen, _f_gen_rough
    _f_gen, _f_gen_rough = entry(_f_gen), entry(_f_gen_rough)

    rng = np.random.default_rng(int(a1 * 1e6))
    for scale in (0.3, 1.0, 5.0):
        y = rng.standard_normal(600) * scale
        y = np.sort(y - y.max())[::-1].copy()
        y = y[a1 * y > -1.0]
        buf, lanes = np.empty((2, y.size)), np.empty((3, GL))
        for A in np.linspace(0.0, 1.5 / a1 if a1 < 0.5 else 3.0, 25):
            f, fp = _f_gen(y, y.size, a1, A, buf, lanes)
            fr, fpr = _f_gen_rough(y, y.size, a1, A, buf, lanes)
            assert abs(fr - f) <= 4e-8 * (1.0 + abs(f)) + 1e-15, (scale, A, f, fr)
            assert abs(fpr - fp) <= 4e-8 * (1.0 + abs(fp)) + 1e-15
            if fr > ROUGH_F:
                assert f > 0.0
