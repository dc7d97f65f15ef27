"""The correctly rounded sums, dot products and powers that make the row VJPs identical across
engines (:mod:`entmax_ref.backends.exact_sums` and its numba twin): each returns the
real-number value rounded to nearest (ties to even), checked against ``math.fsum`` and exact
rationals on rows built to be hard (cancellation, huge and tiny terms together, exact
midpoints, products whose low part underflows).  The numba kernels may leave a row
undecided (their callers then take the NumPy engine's exact fallback), never decide it
wrong; on plain rows they decide every row.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from entmax_ref.backends import exact_sums as X
from entmax_ref.backends import unavailable_reason
from entmax_ref.backends.exact_fallback import round_real
from helper_entry import entry

_numba_reason = unavailable_reason("numba")
needs_numba = pytest.mark.skipif(_numba_reason is not None, reason=f"numba backend: {_numba_reason}")

H = 2.0 ** -53  # half an ulp of 1


def _hard_sums():
    """Rows of float64 terms whose sum is hard to round, padded to one width."""
    rng = np.random.default_rng(11)
    rows = [
        [1.0, H],  # an exact midpoint: ties to even, 1
        [1.0, H, H * H],  # just above the midpoint: 1 + 2^-52
        [1.0 + 2 * H, H],  # a midpoint rounding up to even
        [1.0, -H / 2, H * H],  # just below 1 (the gap below 1 is half the gap above)
        [1e300, 1.0, -1e300],  # cancellation to a small exact value
        [1e300, 1e-300, -1e300, 3.0],
        [2.0 ** 1000, 2.0 ** -1000, -(2.0 ** 1000)],
        [0.1] * 10 + [-1.0],  # rounding errors of decimal fractions left over
        [5e-324, 5e-324, -1e-320],  # subnormals
        [1.0, H, 2.0 ** -200, 2.0 ** -300],  # above a midpoint by less than any double-word bound
        [0.0, -0.0],
        [],
        list(rng.standard_normal(40) * 10.0 ** rng.integers(-20, 20, 40)),
        list(np.concatenate([v := rng.standard_normal(30), -v[::-1]])) + [1e-30],
    ]
    n = max(len(r) for r in rows)
    return np.array([r + [0.0] * (n - len(r)) for r in rows])


def _hard_products():
    rng = np.random.default_rng(12)
    a = rng.standard_normal((8, 33))
    b = rng.standard_normal((8, 33))
    b[1] = -a[1] * (1.0 + H)  # every product nearly cancels its neighbour's
    a[2, ::2], b[2, ::2] = 1e-160, 1e-160  # products whose low part underflows
    b[3] = 1.0 / a[3]  # products near 1 with rounding errors
    a[4, 0], b[4, 0] = 3.0, 2.0 ** 1000  # a large operand
    a[5] = 0.0
    a[6, 1:] = a[6, 0]
    b[6, 1:] = -b[6, 0] / 32.0  # the products sum to exactly 0 in exact arithmetic
    return a, b


def _exact(a, b=None):
    if b is None:
        return math.fsum(a.tolist()) + 0.0
    return round_real(sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)), np.float64) + 0.0


def _same(got, want):
    return all(float(g).hex() == float(w).hex() for g, w in zip(got, want))


def test_numpy_sums_are_correctly_rounded():
    x = _hard_sums()
    assert _same(X.dot_rows(x), [_exact(r) for r in x])


def test_numpy_dot_products_are_correctly_rounded():
    a, b = _hard_products()
    assert _same(X.dot_rows(a, b), [_exact(a[r], b[r]) for r in range(len(a))])


@needs_numba
def test_both_engines_use_the_same_sum_error_bound():
    """The numba kernels decide a sum's rounding with the NumPy engine's bound (its
    derivation is in :mod:`entmax_ref.backends.exact_sums`): the same value for every row
    length and magnitude sum, so neither engine claims a rounding the other's proof does
    not cover."""
    from entmax_ref.backends.numba import exact_sums as N

    for n in (0, 1, 2, 3, 31, 32, 33, 4096, 10 ** 6, 2 ** 40):
        for absum in (0.0, 2.0 ** -1074, 1e-300, 0.75, 1.0, 3.5, 2.0 ** 600, 1e300):
            assert entry(N.sum_bound)(n, absum) == X.sum_bound(n, absum), (n, absum)


@needs_numba
def test_numba_sums_are_correctly_rounded_where_decided():
    from numba_arrays import dot_rows_array

    x = _hard_sums()
    out, ok = np.empty(len(x)), np.empty(len(x), bool)
    dot_rows_array(x, None, out, ok)
    want = [_exact(r) for r in x]
    assert _same(out[ok], np.array(want)[ok])
    # where no TwoSum error is lost, the double-word is the exact sum: its rounding decides
    # midpoints, cancellation and subnormal sums
    assert ok[[0, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12]].all()
    assert not ok[[1, 9]].any()  # near a midpoint with a rounded error term: the exact fallback's


@needs_numba
def test_numba_dot_products_are_correctly_rounded_where_decided():
    from numba_arrays import dot_rows_array

    a, b = _hard_products()
    out, ok = np.empty(len(a)), np.empty(len(a), bool)
    dot_rows_array(a, b, out, ok)
    want = np.array([_exact(a[r], b[r]) for r in range(len(a))])
    assert _same(out[ok], want[ok])
    assert ok[[0, 3, 5, 7]].all() and not ok[2]  # ok: plain rows; not: an underflowing low part


@needs_numba
def test_numba_decides_plain_rows():
    from numba_arrays import dot_rows_array

    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((200, 1000)), rng.standard_normal((200, 1000))
    out, ok = np.empty(200), np.empty(200, bool)
    dot_rows_array(a, b, out, ok)
    assert ok.all() and _same(out, X.dot_rows(a, b))


def _hard_matrices():
    """(a, b) whose products a @ b hold the hard rows of :func:`_hard_products` and
    :func:`_hard_sums` (a row of ones against a column of terms) among plain ones."""
    a, b = _hard_products()
    x = _hard_sums()
    n = max(a.shape[1], x.shape[1])
    a = np.concatenate([np.pad(a, ((0, 0), (0, n - a.shape[1]))), np.ones((1, n))])
    b = np.concatenate([np.pad(b, ((0, 0), (0, n - b.shape[1]))), np.pad(x, ((0, 0), (0, n - x.shape[1])))]).T
    return a, np.ascontiguousarray(b)


def test_numpy_matrix_products_are_correctly_rounded():
    a, b = _hard_matrices()
    got = X.matmul_rows(a, b)
    want = [[_exact(a[r], b[:, c]) for c in range(b.shape[1])] for r in range(a.shape[0])]
    assert _same(got.ravel(), np.array(want).ravel())


@needs_numba
def test_numba_matrix_products_fill_sum_states_that_round_correctly():
    """The compiled terms go into the NumPy engine's sum states (in another order than its
    blocks): the state's rounding is the correctly rounded sum wherever it is proven, on
    every entry of plain rows, and the exact fallback decides the rest."""
    from entmax_ref.backends.numba.exact_sums import add_products
    from entmax_ref.backends.numba_backend import NumbaBackend

    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((40, 64)), rng.standard_normal((64, 300))
    a[:, ::3] = 0.0
    got = X.product_state(a.shape[0], b.shape[1])
    add_products(a, b, got, 0, a.shape[0])
    want = np.array([[_exact(a[r], b[:, c]) for c in range(b.shape[1])] for r in range(a.shape[0])])
    for rnd in (X.round_products, NumbaBackend().round_products):
        v, ok = rnd(got, a.shape[1])
        assert ok.all() and _same(v.ravel(), want.ravel())
    # where the engines' TwoProds differ (an underflowing low part, an operand Dekker's split
    # cannot take) the state says so and the exact fallback decides
    numba = NumbaBackend()
    for a, b in (_hard_matrices(), (a, b)):
        got = X.matmul_rows(a, b, add=numba.add_products, rnd=numba.round_products)
        assert _same(got.ravel(), X.matmul_rows(a, b).ravel())
        st = X.product_state(a.shape[0], b.shape[1])
        numba.add_products(st, a, b)
        (v, ok), (v2, ok2) = X.round_products(st, a.shape[1]), numba.round_products(st, a.shape[1])
        assert (ok == ok2).all() and _same(v[ok], v2[ok2])  # the same rounding, proven on the same sums


def test_matrix_product_sums_run_over_several_products(monkeypatch):
    """A sum state taken over several products (the attention's dK, dV over query chunks)
    rounds to the one product's correctly rounded sums, whatever the split."""
    rng = np.random.default_rng(16)
    a, b = rng.standard_normal((5, 90)), rng.standard_normal((90, 7))
    a[0, :45] = -a[0, 45:]  # a row whose terms cancel in pairs across the split
    b[:45, 0] = b[45:, 0]
    want = X.matmul_rows(a, b)
    for block in (1, 4, 1 << 14):  # one inner index a step, a few, all of a product's
        monkeypatch.setattr(X, "BLOCK_TERMS", block * 35)
        st = X.product_state(5, 7)
        for lo, hi in ((0, 13), (13, 60), (60, 90)):
            X.add_products(st, a[:, lo:hi], b[lo:hi])
        v, ok = X.round_products(st, 90)
        assert _same(v[ok], want[ok]) and ok.ravel()[1:].all()
        assert not ok[0, 0] and want[0, 0] == 0.0  # an exact 0 after rounded errors: the exact fallback's


def _pow_cases():
    rng = np.random.default_rng(14)
    p = np.concatenate([rng.random(400), rng.random(100) ** 40, [1.0, 0.5, 0.25, 2.0 ** -1022, 2.0 ** -1050,
                                                                 np.nextafter(1.0, 0.0)]])
    return p


@pytest.mark.parametrize("a", [0.7, 0.5, 0.25, 1.0 / 3.0, 1e-9, 1.0, 0.0])
def test_numpy_powers_are_correctly_rounded(a):
    p = _pow_cases()
    got = X.skew_rows(p[None, :], np.array([[a]]))[0]
    assert _same(got, [X.exact_pow(float(v), a) for v in p])


@needs_numba
@pytest.mark.parametrize("a", [0.7, 0.5, 1.0 / 3.0, 1e-9])
def test_numba_powers_are_correctly_rounded_where_decided(a):
    from numba_arrays import pow_array

    p = _pow_cases()
    out, ok = np.empty(len(p)), np.empty(len(p), bool)
    pow_array(p, a, out, ok)
    want = np.array([X.exact_pow(float(v), a) for v in p])
    assert _same(out[ok], want[ok])
    assert ok[:-2].sum() >= len(p) - 3
    assert ok[-2] == (a == 0.5)  # a subnormal p is left to the fallback (its square root is one IEEE operation)


def test_exact_pow_log_exp_against_mpmath():
    mp = pytest.importorskip("mpmath")
    rng = np.random.default_rng(15)
    with mp.workdps(60):
        for v in rng.random(30) ** 8:
            assert X.exact_pow(float(v), 0.3) == float(mp.mpf(float(v)) ** mp.mpf(0.3))
            assert X.exact_log(float(v)) == float(mp.log(mp.mpf(float(v))))
            assert X.exact_exp(float(-v * 700)) == float(mp.exp(mp.mpf(float(-v * 700))))


def test_numpy_logs_and_exponentials_are_correctly_rounded():
    rng = np.random.default_rng(16)
    p = np.concatenate([rng.random(200) ** 10, [1.0, 2.0 ** -1050, 3.0, np.nextafter(1.0, 0.0)]])
    assert _same(X.log_rows(p), [X.exact_log(float(v)) for v in p])
    z = np.concatenate([rng.uniform(-745.0, 709.0, 200), [709.78, -1e-300, 0.0, -745.2]])
    assert _same(X.exp_rows(z), [X.exact_exp(float(v)) for v in z])


def _fallback_rows():
    """float64 rows of p and g whose VJP the compiled kernels leave to the exact fallback:
    a subnormal p (its power), a sum u . g that cancels to a midpoint-near value, and
    rows without trouble around them."""
    rng = np.random.default_rng(17)
    p = rng.random((6, 40))
    p /= p.sum(axis=1, keepdims=True)
    g = rng.standard_normal((6, 40))
    p[1, 3] = 2.0 ** -1060
    p[2, :2], p[2, 2:] = 0.5, 0.0
    g[2, :2] = 1.0, -1.0 + 2.0 ** -52
    p[3, ::2] = 0.0
    return p, g


@needs_numba
@pytest.mark.parametrize("alpha", [1.0, 1.3, 1.5, 2.0])
def test_vjps_agree_on_rows_that_take_the_exact_fallback(alpha):
    import entmax_ref as E

    p, g = _fallback_rows()
    for f in (E.entmax_vjp, E.entmax_alpha_vjp):
        a, b = f(p, g, alpha=alpha, backend="numpy"), f(p, g, alpha=alpha, backend="numba")
        assert _same(np.ravel(a), np.ravel(b)), f.__name__
    u = X.skew_rows(p, np.full((len(p), 1), 2.0 - alpha))
    ug = [_exact(u[r], g[r]) for r in range(len(p))]
    su = [_exact(u[r]) for r in range(len(p))]
    want = np.where(u > 0, u * (g - (np.array(ug) / np.array(su))[:, None]), 0.0)
    assert _same(E.entmax_vjp(p, g, alpha=alpha, backend="numba").ravel(), want.ravel())
