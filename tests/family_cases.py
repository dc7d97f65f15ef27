"""Checks shared by the normmax and budget-sparsemax tests (test_normmax.py,
test_budget_sparsemax.py): both are ``fn(x, param, axis=-1, *, backend)`` row maps."""

from __future__ import annotations

import numpy as np
import pytest


def check_axis_dtype_and_inputs(backend, fn, param, x, f32_atol=0.0):
    """``fn(x, param, axis=1)`` leaves x untouched, equals fn on x with that axis moved
    last, and returns float32 for float32 input: the float64 reference of the float32
    values rounded once (bit for bit when ``f32_atol`` is 0, else within it)."""
    keep = x.copy()
    p0 = backend.numpy(fn(backend.asarray(x), param, axis=1, backend=backend))
    np.testing.assert_array_equal(x, keep)
    p1 = backend.numpy(fn(backend.asarray(np.moveaxis(x, 1, -1)), param, backend=backend))
    np.testing.assert_array_equal(p0, np.moveaxis(p1, -1, 1))
    x32 = x.astype(np.float32)
    p32 = fn(backend.asarray(x32), param, axis=1, backend=backend)
    assert p32.dtype == np.float32
    ref = fn(x32.astype(np.float64), param, axis=1, backend="numpy").astype(np.float32)
    if f32_atol:
        np.testing.assert_allclose(backend.numpy(p32), ref, rtol=0, atol=f32_atol)
    else:
        np.testing.assert_array_equal(backend.numpy(p32), ref)


def check_per_row_param(backend, fn, x2, params):
    """A (rows,) parameter gives each row of the 2-D ``x2`` what that row alone gets."""
    pr = backend.numpy(fn(backend.asarray(x2), params, backend=backend))
    for i in range(len(params)):
        np.testing.assert_array_equal(pr[i], backend.numpy(fn(backend.asarray(x2[i]), params[i], backend=backend)))




def check_against_torch_peer(backend, fn, vjp, param, peer, x, g, atol_p, atol_dx):
    """``fn(x, param)`` within ``atol_p`` of ``peer(entmax, xt)`` (a function of the
    ``entmax`` package and a torch tensor) and ``vjp(p, g, param)`` within ``atol_dx`` of
    torch autograd through the peer.  Skips without torch or the entmax package."""
    torch = pytest.importorskip("torch")
    entmax_pkg = pytest.importorskip("entmax")
    xt = torch.tensor(x, requires_grad=True)
    pt = peer(entmax_pkg, xt)
    (pt * torch.tensor(g)).sum().backward()
    p = fn(backend.asarray(x), param, backend=backend)
    np.testing.assert_allclose(backend.numpy(p), pt.detach().numpy(), rtol=0, atol=atol_p)
    dx = vjp(p, backend.asarray(g), param, backend=backend)
    np.testing.assert_allclose(backend.numpy(dx), xt.grad.numpy(), rtol=0, atol=atol_dx)


def central_differences(fn, x, param, g, h):
    """d(g . fn(x, param))/dx of a 1-D row x by central differences of step h, on the
    NumPy reference."""
    return np.array([(g @ fn(x + h * e, param, backend="numpy") - g @ fn(x - h * e, param, backend="numpy")) / (2 * h)
                     for e in np.eye(len(x))])


def vjp_at(backend, vjp, p, param, seed):
    """(vjp(p, g, param) on the backend as NumPy, g) for a seeded standard-normal g."""
    g = np.random.default_rng(seed).standard_normal(np.shape(p))
    return backend.numpy(vjp(backend.asarray(p), backend.asarray(g), param, backend=backend)), g


def solve_on_both(backend, fn, x, param):
    """(p, info) of fn on the backend (p as NumPy) and (q, info) on the NumPy reference."""
    p, info = fn(backend.asarray(x), param, backend=backend, return_info=True)
    q, iq = fn(x, param, backend="numpy", return_info=True)
    return backend.numpy(p), info, q, iq


def large_batch(seed, rows, n, scale):
    """(rng, x): a batch with more than numba's SEQUENTIAL_MAX entries (so its prange
    drivers run), scaled normal scores with 5% masked; rng continues the same stream."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * scale
    x[rng.random(x.shape) < 0.05] = -np.inf
    return rng, x


def vjp_on_both(backend, vjp, p, g, param):
    """vjp(p, g, param) on the backend (as NumPy) and on the NumPy reference."""
    return (backend.numpy(vjp(backend.asarray(p), backend.asarray(g), param, backend=backend)),
            vjp(p, g, param, backend="numpy"))
