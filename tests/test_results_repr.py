"""Result objects print a short summary (dtype, shape, a few values), never whole arrays."""

from __future__ import annotations

import numpy as np

import entmax_ref as er


def test_attention_results_have_short_reprs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 300, 8))
    out, info = er.attention(q, q, q, alpha=1.5, return_info=True, backend="numpy")
    text = repr(info)
    assert text.startswith("AttentionInfo(tau=float64(1, 2, 300) [")
    assert "skew=float64(1, 2, 300, 8) [" in text and ", ...]" in text
    assert len(text) < 400, text
    grads = er.attention_vjp(np.ones_like(out), q, q, q, out=out, tau=info.tau, backend="numpy")
    g = repr(grads)
    assert g.startswith("AttentionGradients(dq=float64(1, 2, 300, 8) [") and "dbeta=None" in g and len(g) < 400
    assert grads.dq.shape == q.shape  # still a tuple of arrays


def test_row_results_have_short_reprs():
    _, info = er.entmax(np.zeros((1000, 5)), 1.5, return_info=True, backend="numpy")
    text = repr(info)
    assert text.startswith("EntmaxInfo(tau=float64(1000,) [") and "converged=bool(1000,) [True, True, True, ...]" in text
    _, ainfo = er.asentmax(np.zeros((50, 4)), 1.5, beta=1.0, gamma=1.0, return_info=True, backend="numpy")
    assert repr(ainfo).startswith("ASEntmaxInfo(tau=float64(50,) [") and len(repr(ainfo)) < 300
    d = er.row_diagnostics(np.array([0.5, 0.5]))
    assert repr(d).startswith("RowDiagnostics(entropy=0.6931") and "mass=None" in repr(d)
