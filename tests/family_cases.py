"""Checks shared by the normmax and budget-sparsemax tests (test_normmax.py,
test_budget_sparsemax.py): both are ``fn(x, param, axis=-1, *, backend)`` row maps."""

from __future__ import annotations

import numpy as np


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
    """``fn(x, param)`` within ``atol_p`` of ``peer(x)`` (a torch function of a tensor) and
    ``vjp(p, g, param)`` within ``atol_dx`` of torch autograd through the peer."""
    import torch

    xt = torch.tensor(x, requires_grad=True)
    pt = peer(xt)
    (pt * torch.tensor(g)).sum().backward()
    p = fn(backend.asarray(x), param, backend=backend)
    np.testing.assert_allclose(backend.numpy(p), pt.detach().numpy(), rtol=0, atol=atol_p)
    dx = vjp(p, backend.asarray(g), param, backend=backend)
    np.testing.assert_allclose(backend.numpy(dx), xt.grad.numpy(), rtol=0, atol=atol_dx)
