"""The NumPy engine's vectorised threshold solver agrees with the literal per-row one.

:mod:`entmax_ref.backends.numpy_threshold` is the definition of ``backend="numpy"``: one row
at a time, sort for alpha in {1, 1.5, 2} (logsumexp at 1), bisection to adjacent floats
otherwise.  :mod:`entmax_ref.backends.numpy_backend` solves all rows at once with Newton
bracketing, candidate skipping, a Newton polish and a two-stage solve above alpha = 2.  For
every method of that engine, on the built-in corpus, on hand-picked hard rows and on
Hypothesis rows, both give:

* probabilities within :func:`entmax_ref.testing.tolerance.entmax_tolerance` (float64);
* thresholds tau within :func:`entmax_ref.testing.tolerance.threshold_tolerance`;
* the same support, except entries whose probability is within that budget of 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import entmax_ref as er
from entmax_ref.backends._base import theta_to_tau
from entmax_ref.backends.numpy_backend import NumpyBackend
from entmax_ref.backends.numpy_elementwise import e_alpha
from entmax_ref.backends.numpy_threshold import last_bit, solve_row, solve_rows
from entmax_ref.testing import tolerance as T
from entmax_ref.testing.corpus import GOLDEN, row_corpus
from entmax_ref.testing.strategies import alphas, score_rows

ALPHAS = (1.0, 1.0 + 1e-12, 1.0 + 1e-6, 1.1, 1.25, 1.5, 1.75, 2.0, 2.0 + 1e-9, 2.5, 3.0, 10.0, 100.0)
SORTED = (1.0, 1.5, 2.0)


def _hard_rows() -> list[np.ndarray]:
    """Ties (at the threshold too), masks, a lone finite entry, huge offsets and spreads."""
    rng = np.random.default_rng(7)
    rows = [np.zeros(5), np.array([1.0, 1.0, 1.0, -np.inf]), np.array([0.0, 0.0, -1.0, -2.0]),
            np.array([3.0, -np.inf, -np.inf]), np.array([-np.inf, 2.5]),
            np.round(rng.uniform(-3, 3, 40) * 4) / 4,
            1e15 + np.arange(8.0), -1e300 + np.zeros(3), np.array([1e300, -1e300, 0.0, 1e300]),
            rng.standard_normal(50) * 1e3, rng.standard_normal(200) * 1e-9, np.array([0.0, -1e-300, 5e-324])]
    return rows


def _pad(rows: list[np.ndarray]) -> np.ndarray:
    n = max(len(r) for r in rows)
    return np.array([np.concatenate([r, np.full(n - len(r), -np.inf)]) for r in rows])


def _assert_agree(x: np.ndarray, alpha: np.ndarray, method) -> None:
    """The vectorised solve of ``x`` (rows, n) at per-row ``alpha`` against the literal one."""
    got = NumpyBackend().entmax_forward(x, alpha, method)
    p, theta = solve_rows(x, alpha)
    masked = np.isneginf(x)
    tol = T.entmax_tolerance(p, alpha, np.float64, masked=masked)
    err = np.abs(got.p - p)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), (f"p at {worst} (alpha {alpha[worst[0]]!r}, method {method!r}): "
                                f"{got.p[worst]!r} against {p[worst]!r}, tolerance {tol[worst]:.3g}")
    live = np.isfinite(theta)
    assert np.array_equal(np.isfinite(got.theta), live)
    tau, tau_got = theta_to_tau(theta[live], alpha[live]), theta_to_tau(got.theta[live], alpha[live])
    tol_tau = T.threshold_tolerance(tau, alpha[live], np.float64, x.shape[1])
    assert (np.abs(tau_got - tau) <= tol_tau).all(), (method, alpha[live], tau_got - tau, tol_tau)
    same = (got.p > 0) == (p > 0)
    assert (same | (np.maximum(got.p, p) <= tol)).all(), f"support differs beyond the budget ({method!r})"


def _methods(alpha: float):
    return (None, "bisect", "sort") if alpha in SORTED else (None, "bisect")


@pytest.mark.parametrize("alpha", ALPHAS)
def test_corpus_and_hard_rows(alpha):
    rows = [r for case in row_corpus("quick", 0) if case.name != "long" for r in case.x] + _hard_rows()
    x = _pad(rows)
    for method in _methods(alpha):
        _assert_agree(x, np.full(len(x), alpha), method)


def test_golden_rows():
    """The closed-form answers of the corpus, from the literal solver itself."""
    for x, alpha, want in GOLDEN:
        p, _ = solve_row(np.array(x, np.float64), alpha)
        tol = T.entmax_tolerance(np.array([want]), alpha, np.float64, masked=np.isneginf([x]))[0]
        assert (np.abs(p - want) <= tol).all(), (x, alpha, p, want)


def test_stopping_rule_reaches_adjacent_floats():
    """The bisection stops on adjacent floats, the lower with f >= 0 and the upper with f < 0."""
    y = np.array([0.3, -0.2, 1.7, 0.0, 1.1]) - 1.7
    for alpha in (1.0 + 1e-6, 1.25, 1.75, 3.0, 100.0):
        def f(a):
            return np.sum(T.e_alpha(y - a, alpha)) - 1.0

        lo, hi = last_bit(f, 0.0, -np.expm1((1.0 - alpha) * np.log(len(y))) / (alpha - 1.0))
        assert hi == np.nextafter(lo, np.inf), (alpha, lo, hi)
        assert f(lo) >= 0.0 > f(hi), (alpha, f(lo), f(hi))


def test_the_solver_returns_the_bracket_end_with_the_smaller_residual():
    """The stopping rule's second half: of the two adjacent ends, the one whose |f| is
    smaller.  On [1, 1] at alpha 1.25 the two ends differ by one ulp and the upper one wins,
    on [0, 0, -1] the lower one: a solver that always returned one end, or the other, or
    the end with the larger |f|, is caught."""
    winners = set()
    for x, alpha in (([1.0, 1.0], 1.25), ([0.0, 0.0, -1.0], 1.25)):
        x = np.array(x)
        y = x - x.max()

        def f(a):
            return np.sum(e_alpha(y - a, alpha)) - 1.0  # the solver's own evaluation

        lo, hi = last_bit(f, 0.0, -np.expm1((1.0 - alpha) * np.log(len(y))) / (alpha - 1.0))
        assert hi == np.nextafter(lo, np.inf) and abs(f(lo)) != abs(f(hi)), (x, f(lo), f(hi))
        want, other = (hi, lo) if abs(f(hi)) < abs(f(lo)) else (lo, hi)
        winners.add(want == hi)
        _, theta = solve_row(x, alpha)
        assert theta == x.max() + want != x.max() + other, (x, theta, lo, hi)
    assert winners == {True, False}  # each end wins once


def test_support_counts_the_nonzero_entries_of_a_sparse_row():
    """sparsemax of (0, -2) is (1, 0): a support of 1, not the row length (NumPy engine and
    the literal solver alike)."""
    p, info = er.entmax(np.array([0.0, -2.0]), 2.0, return_info=True, backend="numpy")
    assert p.tolist() == [1.0, 0.0] and int(info.support) == 1 == int(info.support_exact)
    assert int(NumpyBackend().entmax_forward(np.array([[0.0, -2.0]]), np.array([2.0]), None).support[0]) == 1
    assert (solve_row(np.array([0.0, -2.0]), 2.0)[0] > 0).sum() == 1


@given(x=score_rows(max_n=30, max_rows=3, magnitude=50.0), alpha=alphas(1.0, 5.0),
       method=st.sampled_from([None, "bisect"]))
def test_hypothesis_rows(x, alpha, method):
    _assert_agree(x, np.full(len(x), alpha), method)


@given(x=score_rows(max_n=30, max_rows=3), method=st.sampled_from([None, "bisect", "sort"]),
       alpha=st.sampled_from(SORTED))
def test_hypothesis_sorted_alphas(x, alpha, method):
    _assert_agree(x, np.full(len(x), alpha), method)
