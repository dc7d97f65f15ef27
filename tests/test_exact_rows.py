"""float64 rows are correctly rounded, with the real-number support and a correctly rounded
tau, on both CPU engines (docs/conventions.md, "Correct rounding").

Every row is held to :func:`entmax_ref.testing.oracle.entmax_cr` at 0 ulp: exact rationals
at alpha = 2, mpmath at two precisions (90 and 130 digits) otherwise, the oracle raising
where its two precisions round differently.  The rows are built to break a float64 solver
(:func:`entmax_ref.testing.oracle.boundary_rows`: entries at the threshold and one or two
ulps either side, ties and near ties of the maximum, a threshold that is itself a float and
an entry, tiny exact probabilities, subnormal outputs, huge offsets, masked entries) plus
Hypothesis rows.  The default tier runs a sample (seconds); the exhaustive tier sweeps every
alpha of :data:`~entmax_ref.testing.oracle.BOUNDARY_ALPHAS`, long rows and the offsets.  A
failure prints the row, the field, and the hex of input, got and want.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import entmax_ref as E
from entmax_ref.testing.oracle import BOUNDARY_ALPHAS, boundary_rows, entmax_cr
from row_bits import assert_same_row, hexs

ENGINES = ("numpy", "numba")
#: the engines whose float32 rows are correctly rounded: both
ENGINES32 = ENGINES


def _engines32(alphas):
    """(backend, alpha) pairs of the float32 tests: every engine at every alpha."""
    return [(b, a) for a in alphas for b in ENGINES32]

#: the issue row of sparsemax: an entry 2^-54 below 0.5 whose exact probability is
#: 2 (2^-54) / 3 = 3.7e-17, a normal float64 (support 3, not 2)
ISSUE_ROW = np.array([0.0, -0.5000000000000001, -0.49999999999999994, 0.0, -0.5, -1.5])


def _solve(x: np.ndarray, alpha: float, backend: str, dtype=np.float64):
    """The public call for ``alpha`` (the named function at 1, 1.5 and 2) on ``x`` in
    ``dtype``: (p, tau, exact support)."""
    x = x.astype(dtype)
    fn = {1.0: E.softmax, 1.5: E.entmax15, 2.0: E.sparsemax}.get(alpha)
    if fn is not None:
        p, info = fn(x[None, :], backend=backend, return_info=True)
    else:
        p, info = E.entmax(x[None, :], alpha=alpha, backend=backend, return_info=True)
    return p[0], float(info.tau[0]), int(info.support_exact[0])


def check_row(x: np.ndarray, alpha: float, backend: str, name: str = "", dtype=np.float64) -> None:
    """``x``'s row at ``alpha`` on ``backend`` equals the oracle's bit for bit: p, tau and
    the support.  In float32 ``x`` is first rounded to float32, and the oracle rounds the
    exact p and tau at those inputs once, to float32."""
    x = x.astype(dtype).astype(np.float64)
    where = f"{backend}, {np.dtype(dtype).name}, alpha={alpha!r}, row {name!r}: x = {hexs(x)}"
    assert_same_row(where, _solve(x, alpha, backend, dtype), entmax_cr(x, alpha, dtype))


@pytest.mark.parametrize("backend", ENGINES)
def test_issue_row_has_the_real_number_support(backend):
    """Sparsemax of the issue row: support 3, p[2] = 2^-54 (2/3) correctly rounded, tau =
    -1/2 + ... correctly rounded (a float64 solver gives support 2 and p[2] = 0)."""
    p, tau, k = _solve(ISSUE_ROW, 2.0, backend)
    assert k == 3 and p[2] == float.fromhex("0x1.5555555555555p-55"), hexs(p)
    check_row(ISSUE_ROW, 2.0, backend, "issue row")


#: alpha = 3: the maximum alone leaves the other entry 1.4e-158 above the threshold, where
#: its p is about that difference (support 2); the oracle needs about 190 digits to see it
TINY_GAP_ROW = np.array([-0.5, -1.431366025724674e-158])


@pytest.mark.parametrize("backend", ENGINES)
def test_an_entry_a_tiny_difference_above_the_threshold(backend):
    """The oracle works at the digits the row's differences need (``cr_digits``): at a
    fixed 90 and 130 digits the entry would sit on the threshold (support 1, p = 0)."""
    p, _, k = entmax_cr(TINY_GAP_ROW, 3.0)
    assert k == 2 and p[0] == 1.431366025724674e-158, hexs(p)
    check_row(TINY_GAP_ROW, 3.0, backend, "tiny gap")


#: the default tier's sample: one boundary set per alpha kind (closed forms, the general
#: solver near 1 and between 1 and 2, the edge solver above 2)
SAMPLE_ALPHAS = (1.0, 1.5, 2.0, 1.33, 1.0 + 1e-6, 3.0)


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("alpha", SAMPLE_ALPHAS)
def test_boundary_rows_sample(backend, alpha):
    rng = np.random.default_rng(int(alpha * 1000) + 7)
    for name, x in boundary_rows(rng, alpha, n=10):
        check_row(x, alpha, backend, name)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("alpha", BOUNDARY_ALPHAS)
@pytest.mark.parametrize("offset", [0.0, 2.0 ** 20, 2.0 ** 50])
def test_boundary_rows_exhaustive(backend, alpha, offset):
    for seed in range(6):
        rng = np.random.default_rng(seed * 131 + int(alpha * 100))
        for name, x in boundary_rows(rng, alpha, n=int(rng.choice([4, 12, 40])), offset=offset):
            check_row(x, alpha, backend, f"{name}, seed {seed}")


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.25, 2.5])
def test_long_boundary_rows(backend, alpha):
    """Rows of n = 4,096 and more, with entries placed at their threshold."""
    rng = np.random.default_rng(4096 + int(alpha * 10))
    for name, x in boundary_rows(rng, alpha, n=4096):
        check_row(x, alpha, backend, name)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend", ENGINES)
def test_per_row_alpha_rows(backend):
    """alpha per row (and per head): each row as it is alone."""
    rng = np.random.default_rng(11)
    alphas = np.array([1.0, 1.25, 1.5, 2.0, 3.0, 1.0 + 2.0 ** -30])
    x = rng.standard_normal((len(alphas), 9))
    p, info = E.entmax(x, alpha=alphas, backend=backend, return_info=True)
    for r, a in enumerate(alphas):
        want_p, want_tau, want_k = entmax_cr(x[r], a)
        assert np.array_equal(p[r].view(np.int64), want_p.view(np.int64)), (a, hexs(x[r]), hexs(p[r]), hexs(want_p))
        assert float(info.tau[r]) == want_tau and int(info.support_exact[r]) == want_k, (a, hexs(x[r]))
    heads = E.entmax(x.reshape(2, 3, 9), alpha=alphas.reshape(2, 3), backend=backend)
    assert np.array_equal(heads.reshape(p.shape).view(np.int64), p.view(np.int64))


_floats = st.floats(-4.0, 4.0, allow_nan=False, allow_infinity=False, width=64)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend, dtype", [(b, np.float64) for b in ENGINES] + [(b, np.float32) for b in ENGINES32])
@settings(deadline=None)
@given(row=st.lists(st.one_of(_floats, st.sampled_from([0.0, 0.5, -0.5, 1.0, 2.0 ** -54, -np.inf])),
                    min_size=1, max_size=24),
       alpha=st.sampled_from([1.0, 1.5, 2.0, 1.25, 1.75, 3.0]))
def test_hypothesis_rows(backend, dtype, row, alpha):
    """Hypothesis rows, float64 on both engines and float32 on those of :data:`ENGINES32`."""
    x = np.array(row, np.float64)
    if not np.isfinite(x).any():
        x[0] = 0.0
    check_row(x, alpha, backend, "hypothesis", dtype)


# ----------------------------------------------------------------------------- float32
#: the default tier's float32 sample: boundary rows rounded to float32 (entries within an
#: ulp of the threshold stay near it), seeds where a float32 rounding of the float64 answer
#: is off by up to 6 ulps or misses the support
SAMPLE32_SEEDS = (45, 46, 48, 49, 50, 52, 62)


@pytest.mark.parametrize("backend, alpha", _engines32((1.0, 1.5, 2.0, 1.33, 3.0)))
def test_float32_boundary_rows_sample(backend, alpha):
    for seed in SAMPLE32_SEEDS:
        for name, x in boundary_rows(np.random.default_rng(seed), alpha):
            check_row(x, alpha, backend, f"{name}, seed {seed}", np.float32)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend, alpha", _engines32(BOUNDARY_ALPHAS))
@pytest.mark.parametrize("offset", [0.0, 2.0 ** 10])
def test_float32_boundary_rows_exhaustive(backend, alpha, offset):
    for seed in range(40, 70):
        rng = np.random.default_rng(seed)
        for name, x in boundary_rows(rng, alpha, n=int(rng.choice([4, 12, 40])), offset=offset):
            check_row(x, alpha, backend, f"{name}, seed {seed}", np.float32)


@pytest.mark.exhaustive
@pytest.mark.parametrize("backend, alpha", _engines32((1.0, 1.5, 2.0, 1.25)))
def test_float32_long_rows(backend, alpha):
    """Rows of n = 4,096 in float32, with entries placed at their threshold."""
    rng = np.random.default_rng(4032 + int(alpha * 10))
    for name, x in boundary_rows(rng, alpha, n=4096):
        check_row(x, alpha, backend, name, np.float32)


@pytest.mark.parametrize("backend", ENGINES32)
def test_float32_per_row_alpha_and_methods(backend):
    """float32 rows at an alpha per row, and with every ``method``, are each row's
    correctly rounded answer."""
    rng = np.random.default_rng(12)
    alphas = np.array([1.0, 1.25, 1.5, 2.0, 3.0, 1.0 + 2.0 ** -30])
    x = rng.standard_normal((len(alphas), 9)).astype(np.float32)
    for method in (None, "bisect") + (("newton",) if backend == "numba" else ()):
        p, info = E.entmax(x, alpha=alphas, backend=backend, method=method, return_info=True)
        for r, a in enumerate(alphas):
            want_p, want_tau, want_k = entmax_cr(x[r].astype(np.float64), a, np.float32)
            assert np.array_equal(p[r].view(np.int32), want_p.view(np.int32)), (method, a, hexs(x[r]), hexs(p[r]))
            assert float(info.tau[r]) == want_tau and int(info.support_exact[r]) == want_k, (method, a, hexs(x[r]))


@pytest.mark.parametrize("backend", ENGINES32)
def test_float32_boundary_rows_with_an_alpha_per_row(backend):
    """Boundary rows of several alphas (1.5, 2, 1.33; sparsemax's and 1.5's closed forms,
    the general solver), and with rows at 3 beside them (the edge solver), in one float32
    batch with an alpha per row (rows padded with masked entries): each row is its correctly
    rounded answer, whatever the rows beside it."""
    for kinds in ((1.5, 2.0, 1.33), (1.5, 2.0, 1.33, 3.0)):
        rows, alphas = [], []
        for a in kinds:
            for name, x in boundary_rows(np.random.default_rng(45), a, n=12):
                rows.append(x)
                alphas.append(a)
        x = np.full((len(rows), max(map(len, rows))), -np.inf, np.float32)
        for r, row in enumerate(rows):
            x[r, :len(row)] = row
        p, info = E.entmax(x, alpha=np.array(alphas), backend=backend, return_info=True)
        for r, a in enumerate(alphas):
            where = f"{backend}, float32, alpha={a!r}, row {r} of {kinds}: x = {hexs(x[r])}"
            got = (p[r], float(info.tau[r]), int(info.support_exact[r]))
            assert_same_row(where, got, entmax_cr(x[r].astype(np.float64), a, np.float32))


#: float32 rows at alpha = 3 whose exact p lies within 2^-60 of a float32 rounding midpoint:
#: with support {x_0, x_1}, p_0 - p_1 = 2 (x_0 - x_1) / (p_0 + p_1) = 2 (x_0 - x_1), so
#: p_0 = 1/2 + (x_0 - x_1).  At x_0 - x_1 = 2^-25 + 2^-60 that is just above the float32
#: midpoint 1/2 + 2^-25, at 3 (2^-25) - 2^-60 just below 1/2 + 3 (2^-25); the float64
#: rounding is the midpoint itself in both, and a second rounding (to even) goes the wrong
#: way.  The last row sits exactly on a midpoint (ties to even).
MIDPOINT_ROWS = (
    [2.0 ** -25, -(2.0 ** -60)],
    [-(2.0 ** -60), 2.0 ** -25, -4.0, -np.inf],
    [3.0 * 2.0 ** -25, 2.0 ** -60],
    [0.0, -(2.0 ** -25)],
)


@pytest.mark.parametrize("backend", ENGINES32)
def test_float32_rows_near_a_rounding_midpoint(backend):
    """alpha > 2: the float32 answer is the exact value rounded once, also where the
    float64 correctly rounded value is itself a float32 rounding midpoint (:data:`MIDPOINT_ROWS`)."""
    for i, row in enumerate(MIDPOINT_ROWS):
        check_row(np.array(row), 3.0, backend, f"midpoint row {i}", np.float32)


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("alpha", [1.0, 1.3, 1.5, 2.0, 3.0])
def test_rows_without_entries(backend, alpha):
    """Rows of length 0, in either dtype: p empty, tau = -inf, support 0 (the float32 rows'
    rounding test has no entry to test)."""
    for dtype in (np.float64, np.float32):
        p, info = E.entmax(np.zeros((3, 0), dtype), alpha, backend=backend, return_info=True)
        assert p.shape == (3, 0) and p.dtype == dtype
        assert (info.tau == -np.inf).all() and (info.support == 0).all() and (info.support_exact == 0).all()


def _midpoint_rows(rng, count=40):
    """Sparsemax rows of four entries on the grid of 2^-55 near 0: the support is all four,
    ``tau = (sum - 1) / 4`` and each ``p = x - tau`` a multiple of 2^-57 near 1/4 (whose last
    place is 2^-54), so about one p in eight is an exact float64 rounding midpoint."""
    return [rng.integers(-64, 64, 4) * 2.0 ** -55 for _ in range(count)]


def _tiny_softmax_rows(rng, count=40):
    """Softmax rows ``[m, m - d, ...]`` (``m`` in [1, 8)) whose small outputs ``exp(-d) / S``
    lie between 2^-1020 and 2^-960 (normal floats the low part of a double-word no longer
    resolves) or below the normal range."""
    return [np.concatenate([[m], m - rng.uniform(666.0, 744.0, 7)]) for m in rng.uniform(1.0, 8.0, count)]


def _dominant_softmax_rows(rng, count=40):
    """Softmax rows whose maximum (0 or within 1e-20 of it) lies 25 to 600 above every
    other entry, some masked (-inf) or beyond exp's range: tau = log(sum exp(x)) is tiny,
    so only a bound relative to the sum without the maximum decides it."""
    rows = []
    for i in range(count):
        top = 0.0 if i % 2 else -float(rng.uniform(0.0, 1e-20))
        rest = top - rng.uniform(25.0, 600.0, 5)
        rows.append(np.concatenate([[top], rest, [-np.inf, top - 1e4]]))
    return rows


@pytest.mark.parametrize("backend, alpha, rows", [("numba", 2.0, _midpoint_rows), ("numpy", 1.0, _tiny_softmax_rows),
                                                  ("numba", 1.0, _tiny_softmax_rows),
                                                  ("numpy", 1.0, _dominant_softmax_rows),
                                                  ("numba", 1.0, _dominant_softmax_rows)])
def test_midpoints_and_tiny_outputs_are_decided_without_the_exact_solver(backend, alpha, rows, monkeypatch):
    """Outputs below 2^-960 (rounded on float64's grid where they lie), a tiny softmax tau
    (rounded from log1p of the sum without the maximum), masked and far entries and, on the numba
    engine, sparsemax outputs that are exact rounding midpoints (rounded to even from the
    exact sign of ``p - midpoint``; the NumPy engine leaves such rows to the exact solver)
    are decided by the finishing stage: no row reaches the exact solver, and every row
    equals the oracle's."""
    from entmax_ref.backends import exact_rows

    solver, calls = exact_rows.entmax_row, []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return solver(*args, **kwargs)

    monkeypatch.setattr(exact_rows, "entmax_row", counted)
    xs = rows(np.random.default_rng(3))
    x = np.array(xs)
    fn = E.sparsemax if alpha == 2.0 else E.softmax
    p, info = fn(x, backend=backend, return_info=True)
    assert not calls, f"{len(calls)} of {len(xs)} rows left to the exact solver, first x = {hexs(calls[0])}"
    for i, row in enumerate(xs):
        where = f"{backend}, alpha={alpha!r}, row {i}: x = {hexs(row)}"
        assert_same_row(where, (p[i], float(info.tau[i]), int(info.support_exact[i])), entmax_cr(row, alpha))


@pytest.mark.numba
def test_rows_the_compiled_stage_leaves_go_to_the_numpy_stage_before_the_exact_solver(monkeypatch):
    """A float64 row that the numba engine's compiled finishing stage leaves undecided (alpha
    1.33, 8192 scores of standard deviation 0.1, a support of 6625) is finished by the NumPy engine's
    vectorised stage, which decides it: no call into the exact solver (about 10 s on this
    row), and the NumPy engine's bits.  A row above alpha 2 still goes to the exact solver."""
    pytest.importorskip("numba")
    from entmax_ref.backends import exact_rows
    from entmax_ref.backends import numba_backend as nb
    from entmax_ref.backends.numba import exact_finish, rows

    x = (np.random.default_rng(0).standard_normal((512, 8192)) * 0.1)[508:509]
    alpha = np.array([1.33])
    res = nb._row_forward(rows.entmax_rows, x, alpha, rows.METHOD_DEFAULT)
    tau, ok = np.empty(1), np.empty(1, np.bool_)
    exact_finish.finish_rows(x, alpha, res.p, res.theta, tau, res.support, ok, 1)
    assert not ok[0], "the compiled stage decides this row now: the test needs a row it leaves"

    solver, calls = exact_rows.entmax_row, []

    def counted(*args, **kwargs):
        calls.append(args[1])
        return solver(*args, **kwargs)

    monkeypatch.setattr(exact_rows, "entmax_row", counted)
    p, info = E.entmax(x, 1.33, backend="numba", return_info=True)
    assert not calls, "the row reached the exact solver"
    monkeypatch.setattr(exact_rows, "entmax_row", solver)
    want, want_info = E.entmax(x, 1.33, backend="numpy", return_info=True)
    np.testing.assert_array_equal(p, want)
    assert (info.tau[0], info.support_exact[0]) == (want_info.tau[0], want_info.support_exact[0])
    assert info.support_exact[0] == 6625

    monkeypatch.setattr(exact_rows, "entmax_row", counted)
    y = np.array([[0.0, -0.25, -1.0]])
    got = nb._finish_left(y, np.array([3.0]), np.array([0.5]), np.float64)
    assert calls == [3.0]
    np.testing.assert_array_equal(got[0], E.entmax(y, 3.0, backend="numpy"))
