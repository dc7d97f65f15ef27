"""Cross-validation against the PyTorch ``entmax`` package (forward and autograd)."""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as er

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e \".[test]\")")
entmax_pkg = pytest.importorskip("entmax", reason="the entmax package is not installed (pip install -e \".[test]\")")

pytestmark = pytest.mark.peer


def _batch(seed, rows=16, n=33, scale=2.0):
    return np.random.default_rng(seed).standard_normal((rows, n)) * scale


@pytest.mark.parametrize("name,alpha", [("sparsemax", 2.0), ("entmax15", 1.5)])
def test_exact_sort_transforms_and_gradients(backend, name, alpha):
    x = _batch(0)
    g = np.random.default_rng(1).standard_normal(x.shape)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    pt = getattr(entmax_pkg, name)(xt, dim=-1)
    (pt * torch.tensor(g)).sum().backward()
    p = er.entmax(backend.asarray(x), alpha, backend=backend)
    # the package's sort solution is exact up to rounding of its cumulative sums
    np.testing.assert_allclose(backend.numpy(p), pt.detach().numpy(), rtol=0, atol=1e-13)
    dx = er.entmax_vjp(p, backend.asarray(g), alpha, backend=backend)
    np.testing.assert_allclose(backend.numpy(dx), xt.grad.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.1, 1.25, 1.33, 1.5, 1.75, 2.0, 2.5])
def test_entmax_bisect_forward_and_gradients_including_alpha(backend, alpha):
    x = _batch(2, rows=8, n=20)
    g = np.random.default_rng(3).standard_normal(x.shape)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    at = torch.full((x.shape[0], 1), alpha, dtype=torch.float64, requires_grad=True)
    # entmax_bisect does a fixed 50 halvings of a bracket of width < 1 and renormalises:
    # its threshold is within 2^-50 of the true one, so p within about 2^-50 / (alpha - 1)
    pt = entmax_pkg.entmax_bisect(xt, at, dim=-1, n_iter=50)
    (pt * torch.tensor(g)).sum().backward()
    p = er.entmax(backend.asarray(x), alpha, backend=backend)
    base = 2.0**-50 / (alpha - 1)
    np.testing.assert_allclose(backend.numpy(p), pt.detach().numpy(), rtol=0, atol=2 * base)
    # its gradients are formulas of its own p, so they inherit that error times O(|g| u / sum u)
    # (measured <= 3 base on these rows)
    dx = er.entmax_vjp(p, backend.asarray(g), alpha, backend=backend)
    np.testing.assert_allclose(backend.numpy(dx), xt.grad.numpy(), rtol=0, atol=16 * base)
    da = er.entmax_alpha_vjp(p, backend.asarray(g), alpha, backend=backend)
    np.testing.assert_allclose(backend.numpy(da), at.grad.numpy()[:, 0], rtol=0, atol=16 * base)


def test_float32_against_the_package(backend):
    x = _batch(4).astype(np.float32)
    pt = entmax_pkg.entmax15(torch.tensor(x), dim=-1).numpy()
    p = backend.numpy(er.entmax15(backend.asarray(x), backend=backend))
    assert p.dtype == np.float32
    exact = er.entmax15(x.astype(np.float64), backend="numpy")
    # ours is the exact value rounded once; the package accumulates float32 rounding
    assert np.abs(p - exact).max() <= np.finfo(np.float32).eps
    assert np.abs(p - exact).max() <= np.abs(pt - exact).max() + np.finfo(np.float32).eps / 2


def test_softmax_against_torch(backend):
    x = _batch(5, scale=10.0)
    np.testing.assert_allclose(backend.numpy(er.softmax(backend.asarray(x), backend=backend)),
                               torch.softmax(torch.tensor(x), -1).numpy(), rtol=1e-14, atol=1e-16)
