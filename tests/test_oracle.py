"""float64 results against a 50-digit mpmath oracle (the accuracy contract of the library).

Contract: for alpha in [1, 2], rows of up to 1000 entries with |x| <= 50, every
probability is within 4e-15 absolute of the exact value.  For alpha > 2, where
dp/dtau grows like p^(2-alpha) at the support edge, the bound is
ALPHA_GT2_FACTOR * eps * max_support p^(2-alpha) / (alpha - 1).
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import entmax_ref as er
from oracle import entmax_mp

EPS = float(np.finfo(np.float64).eps)
ATOL_ALPHA_LE_2 = 4e-15
ALPHA_GT2_FACTOR = 4.0

ALPHAS_LE_2 = [1.0, 1.0 + 1e-6, 1.01, 1.1, 1.25, 1.33, 1.5, 1.75, 1.9, 2.0]
ALPHAS_GT_2 = [2.5, 3.0, 5.0, 10.0]


def _cases(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 100, 1000):
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


def _errors(backend, alpha, seed):
    worst = 0.0
    for x in _cases(seed):
        p, info = er.entmax(x, alpha, backend=backend, return_info=True)
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


@pytest.mark.parametrize("alpha", ALPHAS_LE_2)
def test_float64_within_4e15_of_50_digit_oracle(backend, alpha):
    assert _errors(backend, alpha, seed=int(alpha * 1000)) <= ATOL_ALPHA_LE_2


@pytest.mark.parametrize("alpha", ALPHAS_GT_2)
def test_float64_alpha_above_2_within_documented_bound(backend, alpha):
    assert _errors(backend, alpha, seed=int(alpha * 1000)) <= 1.0


def test_bisection_agrees_with_scipy_brentq(backend):
    """An independent root finder (scipy's brentq on the same threshold equation)."""
    from scipy.optimize import brentq

    rng = np.random.default_rng(11)
    for alpha in (1.2, 1.5, 1.8, 2.6):
        x = rng.standard_normal(50) * 3
        p, info = er.entmax(x, alpha, method="bisect", backend=backend, return_info=True)

        def f(tau):
            return (np.maximum((alpha - 1) * x - tau, 0) ** (1 / (alpha - 1))).sum() - 1

        m = (alpha - 1) * x.max()
        tau = brentq(f, m - 1, m - 50 ** (1 - alpha), xtol=1e-15, rtol=4 * EPS)
        np.testing.assert_allclose(info.tau, tau, rtol=0, atol=1e-14)
