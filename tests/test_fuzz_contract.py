"""A long Hypothesis fuzz over the contract classes of tests/test_contract.py (exhaustive tier).

Shapes with zeros and 0-d inputs, every floating dtype (bfloat16 included), masks, scores up
to float64's limits, alpha from 1 to 1000, ASEntmax parameters that may overflow, and
attention with empty heads, head dims and rows, on every CPU backend.  Each example checks
the contract (shape, dtype, a distribution per row, ``support`` equal to the nonzeros,
numpy and numba agreeing, no warnings, errors only of the documented kind naming the
argument).

Runs with ``-m slow``, under the exhaustive option when the test tiers define one, or when
``ENTMAX_REF_FUZZ_EXAMPLES`` is set: the total number of examples (default 20,000), half
for the row functions and a quarter each for ASEntmax and attention.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import entmax_ref as er
from entmax_ref.backends import unavailable_reason

ml_dtypes = pytest.importorskip("ml_dtypes")

EXAMPLES = int(os.environ.get("ENTMAX_REF_FUZZ_EXAMPLES", 20000))
CPU = [b for b in ("numpy", "numba") if unavailable_reason(b) is None]
DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
EPS = {np.dtype(np.float64): 2.0 ** -52, np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float16): 2.0 ** -10,
       np.dtype(ml_dtypes.bfloat16): 2.0 ** -7}
FUZZ = settings(max_examples=max(EXAMPLES // 4, 1), deadline=None, print_blob=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

pytestmark = pytest.mark.slow

#: Above this alpha an exact attention gradient can exceed the dtype's range (u = p^(2-alpha)
#: is unbounded at the support's edge), so it may round to +-inf there; below it, and NaN
#: anywhere, is a failure.  (A backward that lost the support's edge gave NaN above 4.)
FINITE_GRAD_MAX_ALPHA = 4.0


@pytest.fixture(autouse=True)
def _exhaustive_only(request):
    config = request.config
    wanted = (config.getoption("exhaustive", default=False) or "slow" in (config.getoption("markexpr") or "")
              or "ENTMAX_REF_FUZZ_EXAMPLES" in os.environ)
    if not wanted:
        pytest.skip("exhaustive tier: run with -m slow (or set ENTMAX_REF_FUZZ_EXAMPLES)")


alphas = st.one_of(st.sampled_from([1.0, 1.0 + 1e-12, 1.0 + 1e-9, 1.5, 2.0, 3.0, 4.0, 10.0, 100.0, 1000.0]),
                   st.floats(1.0, 20.0))
scores = st.one_of(
    st.floats(-10.0, 10.0),
    st.sampled_from([0.0, -np.inf, 1e300, -1e300, 1.7e308, -1.7e308, 1e-300, -120.0, -1e-3, 65504.0, 3e38]),
    st.floats(allow_nan=False, allow_infinity=False),
)


@st.composite
def row_inputs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    if draw(st.booleans()) and draw(st.booleans()):
        shape = ()
    else:
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    size = int(np.prod(shape)) if shape else 1
    vals = np.array(draw(st.lists(scores, min_size=size, max_size=size)), np.float64).reshape(shape)
    with np.errstate(over="ignore"):
        x = vals.astype(dtype)
    x = np.where(np.isposinf(x.astype(np.float64)), 0.0, x).astype(dtype)  # +inf is invalid input
    axis = draw(st.integers(-max(len(shape), 1), max(len(shape), 1) - 1))
    return x, axis, draw(alphas), draw(st.sampled_from(CPU))


def _check_distribution(p, x, axis, dtype):
    pf = np.moveaxis(np.atleast_1d(p.astype(np.float64)), axis if p.ndim else 0, -1)
    xf = np.moveaxis(np.atleast_1d(x.astype(np.float64)), axis if x.ndim else 0, -1)
    assert np.all(pf >= 0) and np.all(np.isfinite(pf))
    live = np.isfinite(xf).any(axis=-1)
    sums = pf.sum(axis=-1)
    n = max(pf.shape[-1], 1)
    assert np.all(np.abs(sums[live] - 1.0) <= 2 * n * EPS[dtype] + 1e-300), sums[live]
    assert np.all(sums[~live] == 0)
    assert np.all(pf[~np.isfinite(xf)] == 0)  # masked entries are exactly 0


@settings(FUZZ, max_examples=max(EXAMPLES // 2, 1))
@given(row_inputs())
def test_fuzz_row_functions(case):
    x, axis, alpha, backend = case
    dtype = x.dtype
    p, info = er.entmax(x, alpha, axis, backend=backend, return_info=True)
    assert p.shape == x.shape and p.dtype == dtype
    _check_distribution(p, x, axis, dtype)
    ax = axis if x.ndim else 0
    assert np.array_equal(info.support, (np.atleast_1d(p) > 0).sum(axis=ax) if x.ndim else int(p > 0))
    if backend != "numpy":
        ref = er.entmax(x, alpha, axis, backend="numpy")
        tol = 8 * EPS[dtype] if dtype != np.float64 else 1e-12  # float64: a few ulps of 1
        assert np.allclose(p.astype(np.float64), ref.astype(np.float64), rtol=0, atol=tol)
    g = np.where(np.isfinite(x.astype(np.float64)), np.cos(np.arange(x.size)).reshape(x.shape), 0.0).astype(dtype)
    dx = er.entmax_vjp(p, g, alpha, axis, backend=backend)
    assert dx.shape == x.shape and dx.dtype == dtype
    assert np.all(np.isfinite(dx.astype(np.float64))) or alpha > 2  # alpha > 2: u may overflow to inf
    da = er.entmax_alpha_vjp(p, g, alpha, axis, backend=backend)
    assert da.shape == info.tau.shape and da.dtype == np.float64
    if x.ndim:
        n = x.shape[ax]
        idx = np.zeros(info.tau.shape, np.int64) if n else None
        if idx is not None:
            loss = er.entmax_loss(x, idx, alpha, axis, backend=backend)
            assert loss.shape == info.tau.shape and np.all(loss >= 0)
        d = er.row_diagnostics(p, axis=axis)
        assert np.array_equal(d.support, info.support)


@st.composite
def asentmax_inputs(draw):
    x, axis, alpha, backend = draw(row_inputs())
    big = st.one_of(st.floats(-5.0, 5.0), st.sampled_from([0.0, 1e308, -1e308, 1e10, 1e4, -1e4]))
    return x, axis, alpha, backend, draw(big), draw(st.one_of(st.floats(-3.0, 3.0), st.sampled_from([1e4, 500.0]))), \
        draw(big), draw(st.sampled_from([1.0, 0.0, -0.5, 2.0, 1e-300]))


@FUZZ
@given(asentmax_inputs())
def test_fuzz_asentmax(case):
    x, axis, alpha, backend, beta, gamma, delta, offset = case
    try:
        p, info = er.asentmax(x, alpha, beta=beta, gamma=gamma, delta=delta, offset=offset, axis=axis,
                              backend=backend, return_info=True)
    except ValueError as e:
        msg = str(e)
        assert ("beta" in msg and "gamma" in msg and "delta" in msg) or "log(n + offset)" in msg, msg
        return
    assert p.shape == x.shape and p.dtype == x.dtype
    _check_distribution(p, x, axis, x.dtype)
    ax = axis if x.ndim else 0
    assert np.array_equal(info.support, (np.atleast_1d(p) > 0).sum(axis=ax) if x.ndim else int(p > 0))
    assert np.all(np.isfinite(info.s[info.n > 0])) and np.all(np.isnan(info.s[info.n == 0]))
    g = er.asentmax_vjp(np.ones(x.shape, x.dtype), x, alpha, beta=beta, gamma=gamma, delta=delta, offset=offset,
                        axis=axis, backend=backend)
    assert g.dx.shape == x.shape and g.dx.dtype == x.dtype


@st.composite
def attention_inputs(draw):
    B, Hkv, Nq, Nk, D, Dv = (draw(st.integers(0, 3)) for _ in range(6))
    group = draw(st.integers(0, 2))
    Hq = Hkv * group
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    q, k, v = (rng.normal(size=s).astype(dtype) for s in ((B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, Dv)))
    kw = dict(alpha=draw(alphas), causal=draw(st.booleans()), backend=draw(st.sampled_from(CPU)))
    if B and draw(st.booleans()):
        kw["key_lengths"] = draw(st.lists(st.integers(0, Nk), min_size=B, max_size=B))
    if draw(st.booleans()):
        kw.update(beta=draw(st.floats(-1.0, 2.0)), gamma=draw(st.floats(0.0, 2.0)), offset=draw(st.sampled_from([1.0, 0.5, 0.0])))
    if Hq and draw(st.booleans()):
        kw["alibi_slopes"] = list(rng.uniform(0, 1, Hq))
    return q, k, v, kw


@FUZZ
@given(attention_inputs())
def test_fuzz_attention_shapes(case):
    q, k, v, kw = case
    try:
        out, info = er.attention(q, k, v, return_info=True, **kw)
    except ValueError as e:  # only the documented domain error of the ASEntmax scale
        assert "log(n + offset)" in str(e) and kw.get("offset", 1.0) <= 0.0, str(e)
        return
    B, Hq, Nq, _ = q.shape
    assert out.shape == (B, Hq, Nq, v.shape[3]) and out.dtype == q.dtype
    assert np.all(np.isfinite(out.astype(np.float64)))
    assert info.tau.shape == info.support.shape == (B, Hq, Nq)
    assert np.all(info.support <= info.n) and np.all(info.support[info.n > 0] >= 1)
    g = er.attention_vjp(np.ones(out.shape, out.dtype), q, k, v, **kw)
    for got, like in zip(g[:3], (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype
        vals = got.astype(np.float64)
        assert not np.any(np.isnan(vals)), "NaN in an attention gradient"
        if kw["alpha"] <= FINITE_GRAD_MAX_ALPHA:
            assert np.all(np.isfinite(vals))
