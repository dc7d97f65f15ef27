"""Per-row diagnostics: normalised entropy, support, max probability, mass on positions,
and the paper's claims stated in them (dispersion of softmax, concentration of entmax)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import entmax_ref as er

EPS = float(np.finfo(np.float64).eps)


def test_hand_checkable_values():
    p = np.array([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    np.testing.assert_allclose(er.normalized_entropy(p), [1.0, 0.0, 0.5], rtol=2 * EPS, atol=0)
    assert er.support_size(p).tolist() == [4, 1, 2]
    assert er.max_probability(p).tolist() == [0.25, 1.0, 0.5]
    assert er.mass_on(p, [0, 3]).tolist() == [0.5, 1.0, 0.5]
    d = er.row_diagnostics(p, positions=[1])
    assert d.mass.tolist() == [0.25, 0.0, 0.5] and d.n.tolist() == [4, 4, 4]
    np.testing.assert_allclose(d.entropy, [np.log(4), 0.0, np.log(2)], rtol=2 * EPS, atol=0)


def test_n_from_scores_axis_and_masks():
    x = np.array([[0.0, 1.0, -np.inf, -np.inf], [0.0, 0.0, 0.0, 0.0]])
    p = er.softmax(x)
    # row 0 has 2 candidates: uniform over them is not dispersion-limited by the padding
    hn = er.normalized_entropy(p, scores=x)
    h = -(p[0, :2] * np.log(p[0, :2])).sum()
    np.testing.assert_allclose(hn, [h / np.log(2), 1.0], rtol=4 * EPS)
    np.testing.assert_allclose(er.normalized_entropy(p, n=np.array([2, 4])), hn, rtol=0, atol=0)
    np.testing.assert_allclose(er.normalized_entropy(p.T, scores=x.T, axis=0), hn, rtol=0, atol=0)
    assert er.normalized_entropy([1.0], n=1).item() == 0.0  # one candidate: no dispersion
    mask = np.array([[True, False, False, False], [False, True, True, False]])
    np.testing.assert_allclose(er.mass_on(p, mask), [p[0, 0], 0.5], rtol=2 * EPS)
    assert er.mass_on(p, [-1]).tolist() == [0.0, 0.25]


def test_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        er.support_size([0.5, -0.1])
    with pytest.raises(ValueError, match="out of range"):
        er.mass_on([0.5, 0.5], [2])
    with pytest.raises(ValueError, match="not both"):
        er.normalized_entropy([0.5, 0.5], n=2, scores=[0.0, 0.0])
    with pytest.raises(ValueError, match="broadcast"):
        er.mass_on(np.full((2, 3), 1 / 3), np.ones((4,), bool))


def _on_host(backend, d):
    """The RowDiagnostics ``d`` computed on ``backend``'s arrays, with NumPy fields."""
    import dataclasses

    return dataclasses.replace(d, **{f.name: None if getattr(d, f.name) is None else backend.numpy(getattr(d, f.name))
                                     for f in dataclasses.fields(d)})


@pytest.mark.parametrize("n", [64, 4096, 65536])
def test_lemma2_pattern_entropy_is_log_k_over_log_n(backend, n):
    """k = 4 keys at the Lemma-2 gap for alpha = 1.5 (Delta = 1): H / log n = log 4 / log n,
    the max probability is 1/4 and all the mass is on the 4 keys; softmax disperses."""
    x = np.zeros(n)
    x[:4] = 1.0
    x = backend.asarray(x)
    d = _on_host(backend, er.row_diagnostics(er.entmax15(x, backend=backend), positions=np.arange(4)))
    np.testing.assert_allclose(d.normalized_entropy, np.log(4) / np.log(n), rtol=16 * EPS)
    assert int(d.support) == 4 and float(d.max_prob) == pytest.approx(0.25, abs=2 * np.spacing(0.25))
    np.testing.assert_allclose(d.mass, 1.0, rtol=0, atol=8 * EPS)
    ds = _on_host(backend, er.row_diagnostics(er.softmax(x, backend=backend), positions=np.arange(4)))
    np.testing.assert_allclose(ds.mass, 4 * np.e / (4 * np.e + n - 4), rtol=64 * EPS)


@given(st.integers(2, 2000), st.floats(0.1, 6.0), st.integers(0, 2**32 - 1))
def test_softmax_dispersion_bound(backend, n, R, seed):
    """Bounded logits of range R: softmax has H / log n >= 1 - R / log n (digest 3.1) and
    p_max <= e^R / n."""
    x = np.random.default_rng(seed).uniform(0.0, R, n)
    d = _on_host(backend, er.row_diagnostics(er.softmax(backend.asarray(x), backend=backend)))
    slack = 64 * n * EPS
    assert d.normalized_entropy >= 1 - (x.max() - x.min()) / np.log(n) - slack
    assert d.max_prob <= np.exp(x.max() - x.min()) / n * (1 + slack)


@given(st.lists(st.floats(-4, 4), min_size=2, max_size=200), st.sampled_from([1.25, 1.5, 2.0, 3.0]))
def test_entmax_entropy_at_most_log_support(backend, xs, alpha):
    """Proposition 1's premise: H(p) <= log |support|, so H / log n <= log s / log n."""
    x = np.array(xs)
    p = er.entmax(backend.asarray(x), alpha, backend=backend)
    d = _on_host(backend, er.row_diagnostics(p))
    assert d.entropy <= np.log(d.support) + 8 * len(xs) * EPS
    assert d.max_prob >= 1.0 / d.support - 8 * len(xs) * EPS
