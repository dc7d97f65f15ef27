"""Every public function gives the same bits on the numpy and numba engines, in float32 and
float64 (docs/conventions.md, "Correct rounding (the contract)"): then ``backend="auto"``
may pick either engine on any rule and a result never depends on the kernel cache, the
batch size or the process's history.

A failure prints the first differing entry's hex on both engines.
"""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as E

ROWS = (24, 37)


def _rows(dtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(ROWS) * 2.0).astype(dtype)
    x[3, 5] = -np.inf
    return x


def _g(dtype, shape):
    return np.random.default_rng(6).standard_normal(shape).astype(dtype)


def _p(dtype, alpha):
    return E.entmax(_rows(dtype), alpha=alpha, backend="numpy")


def _target():
    return np.random.default_rng(7).integers(0, ROWS[1], ROWS[0])


def _attn(dtype):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((2, 2, 9, 8), (2, 2, 13, 8), (2, 2, 13, 8)))
    return q, k, v


def _attention(dtype, be, **kw):
    q, k, v = _attn(dtype)
    return E.attention(q, k, v, alpha=1.5, causal=False, backend=be, **kw)


def _attention_vjp(dtype, be, alpha=1.5, **kw):
    q, k, v = _attn(dtype)
    g = _g(dtype, (2, 2, 9, 8))
    res = E.attention_vjp(g, q, k, v, alpha=alpha, backend=be, **kw)
    res = tuple(res) if isinstance(res, tuple) else tuple(getattr(res, f) for f in ("dq", "dk", "dv"))
    return tuple(r for r in res if r is not None)  # the ASEntmax and alpha gradients, where asked for


def _varlen(dtype, be):
    rng = np.random.default_rng(9)
    q = rng.standard_normal((7, 2, 8)).astype(dtype)
    k = rng.standard_normal((11, 2, 8)).astype(dtype)
    v = rng.standard_normal((11, 2, 8)).astype(dtype)
    cq, ck = np.array([0, 3, 7]), np.array([0, 5, 11])
    return E.attention_varlen(q, k, v, cq, ck, alpha=1.5, backend=be)


AS = dict(beta=0.5, gamma=1.0)
#: one alpha per row over [1, 2]: softmax, sparsemax, 1.5 and the general powers
_PER_ROW = np.concatenate([[1.0, 1.5, 2.0], np.linspace(1.0, 2.0, ROWS[0] - 3)])
#: one alpha per row over [1, 4]: both sides of alpha = 2, 3 and the general powers
_PER_ROW4 = np.concatenate([[1.0, 2.0, 3.0], np.linspace(1.0, 4.0, ROWS[0] - 3)])

#: name -> f(dtype, backend) returning an array or a tuple of arrays
CASES = {
    "softmax": lambda dt, be: E.softmax(_rows(dt), backend=be),
    "sparsemax": lambda dt, be: E.sparsemax(_rows(dt), backend=be),
    "entmax15": lambda dt, be: E.entmax15(_rows(dt), backend=be),
    "entmax(1.3)": lambda dt, be: E.entmax(_rows(dt), alpha=1.3, backend=be),
    "entmax(3)": lambda dt, be: E.entmax(_rows(dt), alpha=3.0, backend=be),
    "entmax(per row)": lambda dt, be: E.entmax(_rows(dt), alpha=np.linspace(1.0, 3.0, ROWS[0]), backend=be),
    "entmax_threshold": lambda dt, be: E.entmax_threshold(_rows(dt), alpha=1.3, backend=be),
    "entmax_vjp": lambda dt, be: E.entmax_vjp(_p(dt, 1.3), _g(dt, ROWS), alpha=1.3, backend=be),
    "entmax_vjp(per row)": lambda dt, be: E.entmax_vjp(_p(dt, _PER_ROW), _g(dt, ROWS), alpha=_PER_ROW, backend=be),
    "entmax_alpha_vjp": lambda dt, be: E.entmax_alpha_vjp(_p(dt, 1.3), _g(dt, ROWS), alpha=1.3, backend=be),
    "entmax_alpha_vjp(per row)": lambda dt, be: E.entmax_alpha_vjp(_p(dt, _PER_ROW), _g(dt, ROWS), alpha=_PER_ROW,
                                                                   backend=be),
    "entmax_vjp(3)": lambda dt, be: E.entmax_vjp(_p(dt, 3.0), _g(dt, ROWS), alpha=3.0, backend=be),
    "entmax_vjp(per row, 1 to 4)": lambda dt, be: E.entmax_vjp(_p(dt, _PER_ROW4), _g(dt, ROWS), alpha=_PER_ROW4,
                                                               backend=be),
    "entmax_alpha_vjp(3)": lambda dt, be: E.entmax_alpha_vjp(_p(dt, 3.0), _g(dt, ROWS), alpha=3.0, backend=be),
    "entmax_alpha_vjp(per row, 1 to 4)": lambda dt, be: E.entmax_alpha_vjp(_p(dt, _PER_ROW4), _g(dt, ROWS),
                                                                           alpha=_PER_ROW4, backend=be),
    "entmax_jacobian": lambda dt, be: E.entmax_jacobian(_p(dt, 1.3)[:4], alpha=1.3, backend=be),
    "entmax_jacobian(3)": lambda dt, be: E.entmax_jacobian(_p(dt, 3.0)[:4], alpha=3.0, backend=be),
    "entmax_loss": lambda dt, be: E.entmax_loss(_rows(dt), _target(), alpha=1.3, backend=be),
    "entmax_loss_grad": lambda dt, be: E.entmax_loss_grad(_rows(dt), _target(), alpha=1.3, backend=be),
    "normmax": lambda dt, be: E.normmax(_rows(dt), alpha=2.0, backend=be),
    "normmax_vjp": lambda dt, be: E.normmax_vjp(E.normmax(_rows(dt), backend="numpy"), _g(dt, ROWS), backend=be),
    "normmax_loss": lambda dt, be: E.normmax_loss(_rows(dt), _target(), backend=be),
    "normmax_loss_grad": lambda dt, be: E.normmax_loss_grad(_rows(dt), _target(), backend=be),
    "budget_sparsemax": lambda dt, be: E.budget_sparsemax(_rows(dt), budget=2.0, backend=be),
    "budget_sparsemax_vjp": lambda dt, be: E.budget_sparsemax_vjp(E.budget_sparsemax(_rows(dt), backend="numpy"),
                                                                  _g(dt, ROWS), backend=be),
    "asentmax": lambda dt, be: E.asentmax(_rows(dt), alpha=1.5, backend=be, **AS),
    "asentmax_vjp": lambda dt, be: E.asentmax_vjp(_g(dt, ROWS), _rows(dt), alpha=1.5, backend=be, **AS),
    "asentmax(3)": lambda dt, be: E.asentmax(_rows(dt), alpha=3.0, backend=be, **AS),
    "asentmax_vjp(3)": lambda dt, be: E.asentmax_vjp(_g(dt, ROWS), _rows(dt), alpha=3.0, backend=be, **AS),
    "ssmax": lambda dt, be: E.ssmax(_rows(dt), beta=0.5, backend=be),
    "ssmax_vjp": lambda dt, be: E.ssmax_vjp(_g(dt, ROWS), _rows(dt), beta=0.5, backend=be),
    "attention": lambda dt, be: _attention(dt, be),
    "attention(asentmax)": lambda dt, be: _attention(dt, be, beta=0.5, gamma=1.0),
    "attention_vjp": lambda dt, be: _attention_vjp(dt, be),
    "attention_vjp(3)": lambda dt, be: _attention_vjp(dt, be, alpha=3.0),
    "attention_varlen": lambda dt, be: _varlen(dt, be),
}

def _params():
    for name in CASES:
        for dt in ("float64", "float32"):
            yield pytest.param(name, dt, id=f"{name}-{dt}")


def _arrays(res):
    if isinstance(res, tuple):
        return [np.asarray(r) for r in res]
    return [np.asarray(res)]


@pytest.mark.parametrize("name, dtype", list(_params()))
def test_numpy_and_numba_give_the_same_bits(name, dtype):
    a = _arrays(CASES[name](dtype, "numpy"))
    b = _arrays(CASES[name](dtype, "numba"))
    assert len(a) == len(b)
    for k, (u, w) in enumerate(zip(a, b)):
        assert u.shape == w.shape and u.dtype == w.dtype, (k, u.shape, w.shape, u.dtype, w.dtype)
        same = (u == w) | (np.isnan(u) & np.isnan(w))
        if u.dtype.kind == "f":
            same &= np.signbit(u) == np.signbit(w)
        bad = np.argwhere(~same)
        assert not bad.size, (f"{name} ({dtype}), output {k}: {len(bad)} of {u.size} entries differ; first at "
                              f"{tuple(bad[0])}: numpy {float(u[tuple(bad[0])]).hex()}, "
                              f"numba {float(w[tuple(bad[0])]).hex()}")


@pytest.mark.parametrize("alpha", [3.0, 100.0, 1000.0])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_vjps_above_two_give_the_same_bits_where_u_overflows(alpha, dtype):
    """alpha > 2 on rows with small edge probabilities, where ``u = p^(2 - alpha)``
    overflows at alpha = 100 and 1000 (ties, near-ties, the entry of largest u scaled by the
    second): ``entmax_vjp`` (+-inf entries included) and ``entmax_alpha_vjp`` give the same
    bits on both engines."""
    from oracle import edge_row

    rng = np.random.default_rng(int(alpha) + 11)
    rows = [edge_row(rng, alpha, ties, float(10.0 ** rng.uniform(-7.0, -2.5)), spread)
            for ties in (1, 2, 3, 5) for spread in (False, True) for _ in range(2)]
    rows += [np.array([0.0, -0.009617, -0.009617, -0.5, -np.inf])]
    rows += [rng.uniform(-1.5 / (alpha - 1), 0, 6) for _ in range(4)]
    overflows = 0
    for x in rows:
        p = E.entmax(x.astype(dtype), alpha=alpha, backend="numpy")
        g = rng.standard_normal(len(x)).astype(dtype)
        with np.errstate(over="ignore"):
            overflows += int(np.isinf(p[p > 0].astype(np.float64) ** (2.0 - alpha)).any())
        for f in (E.entmax_vjp, E.entmax_alpha_vjp):
            a, b = (np.asarray(f(p, g, alpha=alpha, backend=be)) for be in ("numpy", "numba"))
            same = ((a == b) | (np.isnan(a) & np.isnan(b))) & (np.signbit(a) == np.signbit(b))
            assert same.all(), (f.__name__, x.tolist(), [float(v).hex() for v in a], [float(v).hex() for v in b])
    assert (overflows > 0) == (alpha >= 100.0), overflows


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.33, 1.25, 3.0, 2.5])
def test_float32_edge_rows_give_the_same_bits(alpha):
    """float32 rows built on the support's edge (entries at the threshold and an ulp either
    side, ties, tiny exact probabilities, an offset of 2^10), alone and in one batch: p,
    tau and the exact support are the same bits on both engines (both correctly rounded)."""
    from entmax_ref.testing.oracle import boundary_rows

    rows = [x for seed in (45, 46, 48, 49, 50, 52, 62) for offset in (0.0, 2.0 ** 10)
            for _, x in boundary_rows(np.random.default_rng(seed), alpha, offset=offset)]
    batch = np.full((len(rows), max(map(len, rows))), -np.inf, np.float32)
    for r, row in enumerate(rows):
        batch[r, :len(row)] = row
    a, b = (E.entmax(batch, alpha=alpha, backend=be, return_info=True) for be in ("numpy", "numba"))
    for got, want, name in ((a[0], b[0], "p"), (a[1].tau, b[1].tau, "tau"),
                            (a[1].support_exact, b[1].support_exact, "support")):
        bad = np.flatnonzero((np.asarray(got) != np.asarray(want)).any(axis=-1) if name == "p" else got != want)
        assert not bad.size, (f"alpha={alpha}: {name} differs in {len(bad)} of {len(rows)} rows; first row "
                              f"{[float(v).hex() for v in batch[bad[0]]]}")


def test_float32_vjp_above_two_in_blocks():
    """float32 ``entmax_vjp`` with rows above alpha = 2 among others, on rows long enough
    that the numba engine widens them a few rows at a time on its worker threads: the same
    bits as the NumPy engine."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((96, 2000)).astype(np.float32)
    alpha = np.where(np.arange(96) % 3 == 0, 1.5, np.where(np.arange(96) % 3 == 1, 3.0, 2.5))
    p = E.entmax(x, alpha=alpha, backend="numpy")
    g = rng.standard_normal(x.shape).astype(np.float32)
    for a in (alpha, np.full(96, 3.0)):
        u, w = (np.asarray(E.entmax_vjp(p, g, alpha=a, backend=be)) for be in ("numpy", "numba"))
        assert np.array_equal(u.view(np.int32), w.view(np.int32)), np.argwhere(u.view(np.int32) != w.view(np.int32))[:3]


def _hard_attention(dtype):
    """(q, k, v, key_padding_mask) of rows built to be hard: GQA (4 query heads on 2
    kv-heads), 1,500 keys, scores that cancel in q.k (keys nearly orthogonal to the
    queries, so a summation order shows in every bit), ties in p (repeated keys), a key
    mask with holes and keys of every magnitude."""
    rng = np.random.default_rng(21)
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 6, 1500, 16
    q = rng.standard_normal((B, Hq, Nq, D))
    k = rng.standard_normal((B, Hkv, Nk, D))
    v = rng.standard_normal((B, Hkv, Nk, D))
    # keys whose q.k cancels: k_j orthogonal to query 0 of head 0 up to a tiny remainder
    q0 = q[0, 0, 0]
    k[0, 0, :500] -= np.outer(k[0, 0, :500] @ q0 / (q0 @ q0), q0) * (1.0 - 1e-12)
    k[0, :, 500:700] = k[0, :, 700:900]  # repeated keys: tied scores and tied p
    v[0, :, 500:700] = v[0, :, 700:900]
    k[0, 1, 900:1000] *= 10.0 ** rng.integers(-8, 3, (100, 1))  # scores of every magnitude
    mask = rng.random((B, Nk)) > 0.2
    mask[0, -Nq:] = True  # every causal row sees a key
    return tuple(a.astype(dtype) for a in (q, k, v)) + (mask,)


@pytest.mark.parametrize("dtype", ["float64"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_on_hard_rows_is_identical(dtype, causal, masked):
    """Forward and backward (dq, dk, dv, dalpha per head, the ASEntmax parameters) with a
    head per solver path (alpha 1, 1.25, 1.5, 2), ALiBi and ASEntmax, on the rows of
    :func:`_hard_attention`: the same bits on both engines."""
    q, k, v, mask = _hard_attention(dtype)
    kw = dict(alpha=np.array([1.0, 1.25, 1.5, 2.0]), causal=causal, alibi_slopes=np.array([0.0, 0.01, 0.0, 0.1]),
              beta=0.5, gamma=np.array([1.0, 0.5, 2.0, 1.0])[None, :, None], key_padding_mask=mask if masked else None)
    g = np.random.default_rng(22).standard_normal(q.shape[:3] + (v.shape[3],)).astype(dtype)
    got = {}
    for be in ("numpy", "numba"):
        out, info = E.attention(q, k, v, backend=be, return_info=True, **kw)
        grads = E.attention_vjp(g, q, k, v, info=info, backend=be, **kw)
        got[be] = [out, info.theta, info.skew] + [r for r in tuple(grads) if r is not None]
    assert len(got["numpy"]) == len(got["numba"]) >= 8
    for n, (u, w) in enumerate(zip(got["numpy"], got["numba"])):
        u, w = np.asarray(u), np.asarray(w)
        bad = np.argwhere(~((u == w) | (np.isnan(u) & np.isnan(w))))
        assert not bad.size, (n, len(bad), tuple(bad[0]), float(u[tuple(bad[0])]).hex(), float(w[tuple(bad[0])]).hex())


@pytest.mark.parametrize("be", ["numpy", "numba"])
def test_float64_attention_does_not_depend_on_the_chunks(be):
    """float64 attention's sums are correctly rounded over all their terms, dK and dV over
    the query rows of every chunk too: query chunks of 2 rows and the default chunks give
    the same bits."""
    q, k, v, mask = _hard_attention("float64")
    kw = dict(alpha=1.5, causal=True, key_padding_mask=mask, beta=0.5, gamma=1.0, backend=be)
    g = np.random.default_rng(23).standard_normal(q.shape[:3] + (v.shape[3],))
    res = []
    for chunk in (None, 2):
        out, info = E.attention(q, k, v, return_info=True, chunk=chunk, **kw)
        res.append([out] + [r for r in tuple(E.attention_vjp(g, q, k, v, info=info, chunk=chunk, **kw))
                            if r is not None])
    for n, (u, w) in enumerate(zip(*res)):
        bad = np.argwhere(u != w)
        assert not bad.size, (n, len(bad), tuple(bad[0]), float(u[tuple(bad[0])]).hex(), float(w[tuple(bad[0])]).hex())
