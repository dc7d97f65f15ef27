"""Type-checked by mypy in CI (.ci/run): the public API as a user calls it."""

import numpy as np

import entmax_ref as er

x = np.array([[0.0, 1.0, -1.0]])
p = er.entmax(x, 1.5)
p2, info = er.entmax(x, alpha=2.0, return_info=True)
tau = info.tau
q = er.sparsemax([0.0, 0.5], backend="numpy")
q15, info15 = er.entmax15(x, return_info=True)
support15 = info15.support
dx = er.entmax_vjp(p, np.ones_like(x), 1.5)
loss = er.entmax_loss(x, [0], 1.5)
out, ainfo = er.attention(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)),
                          alpha=1.5, causal=True, return_info=True)
grads = er.attention_vjp(np.ones_like(out), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)),
                         np.zeros((1, 1, 2, 2)), out=out, tau=ainfo.tau)
dq = grads.dq
names: list[str] = er.available_backends()
with er.use_backend("numpy"):
    er.entmax15(x)
d = er.row_diagnostics(p)
vis = er.keys_visible(2, 3, causal=True)
