"""The public contract on awkward inputs: degenerate shapes,
ASEntmax's scale domain and overflow, arguments of the wrong kind, low-precision dtypes,
what ``support`` counts, and no warnings on valid input.  Every test runs on every backend
(pytest turns warnings into errors, so each one also checks item 9)."""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as er

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
LOW = [np.dtype(np.float16), BF16]

X3 = np.array([[-2.0, 0.0, 0.5], [0.3, -np.inf, 0.1]])
ALPHAS = [1.0, 1.5, 2.0, 1.3, 3.0]


def _np(backend, a):
    return backend.numpy(a)


# --------------------------------------------------------------------------- 0-d and zero rows
ZERO_D = {  # one entry: p = 1 and every derivative is 0
    "entmax": (lambda x, b: er.entmax(x, 1.3, backend=b), 1.0),
    "softmax": (lambda x, b: er.softmax(x, backend=b), 1.0),
    "sparsemax": (lambda x, b: er.sparsemax(x, backend=b), 1.0),
    "entmax15": (lambda x, b: er.entmax15(x, backend=b), 1.0),
    "asentmax": (lambda x, b: er.asentmax(x, 1.3, beta=1.0, gamma=1.0, backend=b), 1.0),
    "vjp": (lambda x, b: er.entmax_vjp(er.entmax(x, 1.3, backend=b), x, 1.3, backend=b), 0.0),
    "jacobian": (lambda x, b: er.entmax_jacobian(er.entmax(x, 1.3, backend=b), 1.3, backend=b), 0.0),
    "loss_grad": (lambda x, b: er.entmax_loss_grad(x, np.int64(0), 1.3, backend=b), 0.0),
    "asentmax_vjp": (lambda x, b: er.asentmax_vjp(x, x, 1.3, beta=1.0, gamma=1.0, backend=b).dx, 0.0),
}


@pytest.mark.parametrize("name", list(ZERO_D))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_zero_d_input_gives_zero_d_output(backend, name, dtype):
    fn, want = ZERO_D[name]
    out = fn(np.array(0.7, dtype), backend)
    assert np.shape(out) == () and np.asarray(out).dtype == dtype
    assert float(_np(backend, out)) == want


def test_zero_d_info_and_threshold_are_zero_d(backend):
    p, info = er.entmax(np.float64(2.0), 1.5, backend=backend, return_info=True)
    assert np.shape(p) == () and np.shape(info.tau) == () and int(info.support) == 1
    assert np.shape(er.entmax_threshold(np.float64(2.0), 2.0, backend=backend)) == ()


@pytest.mark.parametrize("alpha", ALPHAS)
def test_zero_rows_every_row_function(backend, alpha):
    x = backend.asarray(np.zeros((0, 3)))
    assert _np(backend, er.entmax(x, alpha, backend=backend)).shape == (0, 3)
    p, info = er.entmax(x, alpha, backend=backend, return_info=True)
    assert _np(backend, info.support).shape == (0,)
    assert _np(backend, er.entmax_vjp(x, x, alpha, backend=backend)).shape == (0, 3)
    assert _np(backend, er.entmax_alpha_vjp(x, x, alpha, backend=backend)).shape == (0,)
    assert _np(backend, er.entmax_jacobian(x, alpha, backend=backend)).shape == (0, 3, 3)
    for target in (np.zeros((0, 3)), np.zeros((0,), np.int64)):
        t = backend.asarray(target)
        loss = er.entmax_loss(x, t, alpha, backend=backend)
        assert _np(backend, loss).shape == (0,) and _np(backend, loss).dtype == np.float64
        assert _np(backend, er.entmax_loss_grad(x, t, alpha, backend=backend)).shape == (0, 3)
    x = np.zeros((2, 0, 4))
    assert er.asentmax(x, alpha, beta=1.0, gamma=1.0, backend=backend).shape == (2, 0, 4)
    g = er.asentmax_vjp(x, x, alpha, beta=np.ones((2, 1)), gamma=1.0, backend=backend)
    assert g.dx.shape == (2, 0, 4) and g.dbeta.shape == (2, 1) and np.all(g.dbeta == 0)
    d = er.row_diagnostics(x)
    assert d.entropy.shape == (2, 0) and d.support.shape == (2, 0)


# --------------------------------------------------------------------------- attention shapes
def _qkv(B=1, Hq=2, Hkv=1, Nq=3, Nk=4, D=2, Dv=2, seed=0):
    r = np.random.default_rng(seed)
    return r.normal(size=(B, Hq, Nq, D)), r.normal(size=(B, Hkv, Nk, D)), r.normal(size=(B, Hkv, Nk, Dv))


ASE = dict(beta=np.array([[0.5], [1.0]]), gamma=1.0)  # per query head


@pytest.mark.parametrize("kw", [dict(), dict(causal=True, alibi_slopes=[0.5, 0.0]), ASE],
                         ids=["plain", "causal_alibi", "asentmax"])
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
def test_attention_head_dim_zero_is_all_zero_scores(backend, kw, alpha):
    """D = 0: every q . k is the empty sum 0, so the answer is that of q = k = 0 with D = 1
    (uniform attention, or entmax of the ALiBi bias alone), whatever ``scale`` is."""
    q, k, v = _qkv(D=0)
    q1, k1 = np.zeros(q.shape[:3] + (1,)), np.zeros(k.shape[:3] + (1,))
    out, info = er.attention(q, k, v, alpha=alpha, backend=backend, return_info=True, **kw)
    want, info1 = er.attention(q1, k1, v, alpha=alpha, scale=3.0, backend=backend, return_info=True, **kw)
    assert np.array_equal(_np(backend, out), _np(backend, want))
    assert np.array_equal(_np(backend, info.support), _np(backend, info1.support))
    do = np.random.default_rng(1).normal(size=out.shape)
    g = er.attention_vjp(do, q, k, v, alpha=alpha, backend=backend, **kw)
    g1 = er.attention_vjp(do, q1, k1, v, alpha=alpha, scale=3.0, backend=backend, **kw)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape
    assert np.array_equal(_np(backend, g.dv), _np(backend, g1.dv))
    if "beta" in kw:
        assert np.array_equal(g.dbeta, g1.dbeta)


def test_attention_head_dim_zero_with_an_overflowing_gradient(backend):
    """D = 0 at alpha = 1000: three tied keys give p = 1/3 each, whose exact dz overflows
    (u = p^(2 - alpha) = 3^998); dq and dk are empty, dv is finite, and no warning (the
    exhaustive fuzz found a RuntimeWarning from the padded column)."""
    q, k = np.zeros((1, 1, 1, 0)), np.zeros((1, 1, 3, 0))
    v = np.array([0.12573022, -0.13210486, 0.64042265]).reshape(1, 1, 3, 1)
    g = er.attention_vjp(np.ones((1, 1, 1, 1)), q, k, v, alpha=1000.0, backend=backend)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape
    np.testing.assert_allclose(_np(backend, g.dv).ravel(), [1 / 3] * 3, rtol=1e-15)


@pytest.mark.parametrize("kw", [dict(), ASE], ids=["plain", "asentmax"])
def test_attention_value_dim_zero(backend, kw):
    q, k, v = _qkv(Dv=0)
    out, info = er.attention(q, k, v, alpha=1.5, backend=backend, return_info=True, **kw)
    assert out.shape == (1, 2, 3, 0) and info.skew.shape == (1, 2, 3, 0)
    _, info_v = er.attention(q, k, np.ones(k.shape), alpha=1.5, backend=backend, return_info=True, **kw)
    assert np.array_equal(info.tau, info_v.tau)  # the scores do not depend on v
    g = er.attention_vjp(np.zeros(out.shape), q, k, v, alpha=1.5, tau=info.tau, backend=backend, **kw)
    assert g.dv.shape == v.shape
    for got, like in ((g.dq, q), (g.dk, k)):  # dO . v = 0: nothing reaches q, k or the scale
        assert got.shape == like.shape and np.all(_np(backend, got) == 0)
    if "beta" in kw:
        assert np.all(g.dbeta == 0) and np.all(g.dgamma == 0) and np.all(g.ddelta == 0)


@pytest.mark.parametrize("shape", [dict(Hq=0, Hkv=0), dict(Hq=0, Hkv=1), dict(B=0), dict(Nq=0)],
                         ids=["no_heads", "no_query_heads", "no_batch", "no_queries"])
def test_attention_without_query_rows(backend, shape):
    q, k, v = _qkv(**shape)
    out, info = er.attention(q, k, v, alpha=1.5, backend=backend, return_info=True)
    B, Hq, Nq = q.shape[:3]
    assert out.shape == (B, Hq, Nq, v.shape[3]) and info.tau.shape == (B, Hq, Nq)
    g = er.attention_vjp(np.zeros(out.shape), q, k, v, alpha=1.5, backend=backend)
    for got, like in zip(g[:3], (q, k, v)):
        assert got.shape == like.shape and np.all(_np(backend, got) == 0)
    if shape.get("Hq") == 0:  # key/value heads without query heads are fine; the converse is not
        q, k, v = _qkv(Hq=2, Hkv=0)
        with pytest.raises(ValueError, match="query heads .* multiple of the 0 key/value heads"):
            er.attention(q, k, v, backend=backend)


# --------------------------------------------------------------------------- ASEntmax scale
def test_asentmax_empty_row_does_not_trip_the_scale_domain(backend):
    """offset = 0: log(n) > 0 needs n >= 2, which every live row has; the empty row has
    no scale (NaN in info) and gives zeros."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, -np.inf], [0.5, 0.0, 2.0]])
    p, info = er.asentmax(x, 1.5, beta=1.0, gamma=1.0, offset=0.0, backend=backend, return_info=True)
    assert np.all(p[0] == 0) and np.isnan(info.s[0]) and info.n.tolist() == [0, 2, 3]
    for i in (1, 2):
        s = 1.0 + np.log(info.n[i])
        assert info.s[i] == s
        assert np.array_equal(p[i], er.entmax(s * x[i], 1.5, backend=backend))
    g = er.asentmax_vjp(np.ones_like(x), x, 1.5, beta=1.0, gamma=1.0, offset=0.0, backend=backend)
    assert np.all(g.dx[0] == 0) and np.isfinite(g.dbeta) and np.isfinite(g.dgamma)


def test_attention_empty_row_does_not_trip_the_scale_domain(backend):
    q, k, v = _qkv(B=2)
    kw = dict(alpha=1.5, beta=1.0, gamma=1.0, offset=0.0, key_lengths=[0, 4], backend=backend)
    out, info = er.attention(q, k, v, return_info=True, **kw)
    assert np.all(out[0] == 0) and np.all(np.isnan(info.s[0])) and np.all(info.s[1] == 1.0 + np.log(4.0))
    g = er.attention_vjp(np.ones(out.shape), q, k, v, **kw)
    assert np.isfinite(g.dbeta) and np.all(g.dq[0] == 0)
    with pytest.raises(ValueError, match=r"n \+ offset = 1.0 at query row \(b, h, i\) = \(0, 0, 0\)"):
        er.attention(*_qkv(Nq=4), **{**kw, "causal": True, "key_lengths": None})  # row 0 sees 1 key


@pytest.mark.parametrize("params", [dict(beta=1e308, gamma=1.0, delta=1e308), dict(beta=1.0, gamma=1e4),
                                    dict(beta=0.0, gamma=1e4)], ids=["sum", "power", "zero_times_inf"])
def test_scale_overflow_names_the_parameters_and_the_row(backend, params):
    x = np.array([[0.0, 1.0], [0.0, 1.0]])
    msg = r"overflows float64 at row \(0,\): beta = .*, gamma = .*, delta = .*, n = 2.0"
    with pytest.raises(ValueError, match=msg):
        er.asentmax(x, 1.5, backend=backend, **params)
    with pytest.raises(ValueError, match=msg):
        er.asentmax_vjp(x, x, 1.5, backend=backend, **params)
    with pytest.raises(ValueError, match=r"overflows float64 at n at index \(\): beta"):
        er.asentmax_scale(2, **params)
    with pytest.raises(ValueError, match=r"overflows float64 at n at index \(\): beta"):
        er.asentmax_scale_vjp(1.0, 2, **params)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"overflows float64 at query row \(b, h, i\) = \(0, 0, 0\): beta"):
        er.attention(q, k, v, backend=backend, **params)


def test_scaled_scores_that_overflow_name_the_row(backend):
    x = np.array([[0.0, 1.0], [0.0, 1e300]])
    with pytest.raises(ValueError, match=r"s \* x overflows float64 on row \(1,\) .*beta, gamma, delta"):
        er.asentmax(x, 1.5, beta=1e10, gamma=1.0, backend=backend)


def test_asentmax_scale_is_never_inf():
    n = np.arange(1, 50)
    s = er.asentmax_scale(n, beta=1e300, gamma=2.0, delta=0.0)  # finite: log(50)^2 < 16
    assert np.all(np.isfinite(s))
    gamma = np.r_[np.ones(48), 1000.0]  # log(50) ** 1000 alone is beyond float64
    with pytest.raises(ValueError, match="at n at index \\(48,\\): beta = 1.0, gamma = 1000.0"):
        er.asentmax_scale(n, beta=1.0, gamma=gamma, delta=0.0)


# --------------------------------------------------------------------------- wrong kinds
@pytest.mark.parametrize("bad", [np, 3, 2.5, object()], ids=["module", "int", "float", "object"])
def test_backend_of_the_wrong_kind_is_a_type_error(bad):
    x = np.array([0.0, 1.0])
    calls = [
        lambda: er.entmax(x, backend=bad),
        lambda: er.entmax_vjp(x, x, backend=bad),
        lambda: er.entmax_loss(x, 0, backend=bad),
        lambda: er.asentmax(x, beta=1.0, gamma=1.0, backend=bad),
        lambda: er.attention(*_qkv(), backend=bad),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="backend must be a backend name .'auto', 'cupy', 'numba', 'numpy'"):
            call()


@pytest.mark.parametrize("fn", [er.row_diagnostics, er.normalized_entropy, er.support_size,
                                er.max_probability, lambda p: er.mass_on(p, [0])],
                         ids=["row_diagnostics", "normalized_entropy", "support_size", "max_probability",
                              "mass_on"])
def test_diagnostics_check_they_were_given_distributions(fn):
    with pytest.raises(ValueError, match="row 0 sums to 2.5"):
        fn([2.0, 0.5])
    with pytest.raises(ValueError, match="row 1 sums to 0.5"):
        fn([[0.5, 0.5], [0.25, 0.25]])
    fn([[0.0, 0.0], [0.5, 0.5]])  # an all-zero row (nothing to attend) is allowed
    fn(np.array([1 / 3] * 3, BF16))  # tolerance from p's own precision: sums to 1.0020 in bfloat16
    with pytest.raises(ValueError, match="sums to"):
        fn(np.array([1 / 3] * 3) * 1.002)  # the same error in float64 is rejected


MASKED = np.ma.masked_array([[0.0, 1.0, 0.5]], mask=[[0, 1, 0]])


@pytest.mark.parametrize("call,name", [
    (lambda b: er.entmax(MASKED, backend=b), "x"),
    (lambda b: er.entmax_vjp(MASKED, np.ones((1, 3)), backend=b), "p"),
    (lambda b: er.entmax_vjp(np.ones((1, 3)) / 3, MASKED, backend=b), "grad"),
    (lambda b: er.entmax_loss(np.ones((1, 3)), MASKED / 1.5, backend=b), "target"),
    (lambda b: er.asentmax(MASKED, beta=1.0, gamma=1.0, backend=b), "x"),
    (lambda b: er.entmax(np.ones(3), alpha=np.ma.masked_array(1.5, mask=True), backend=b), "alpha"),
    (lambda b: er.row_diagnostics(MASKED / 1.5), "p"),
    (lambda b: er.attention(np.ma.masked_array(_qkv()[0]), *_qkv()[1:], backend=b), "q"),
], ids=["entmax", "vjp_p", "vjp_grad", "loss_target", "asentmax", "alpha", "diagnostics", "attention"])
def test_masked_arrays_are_rejected_naming_the_argument(backend, call, name):
    with pytest.raises(TypeError, match=rf"^{name} is a NumPy masked array.*-inf"):
        call(backend)


# --------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_low_precision_row_functions_keep_the_dtype(backend, dtype, alpha):
    x = X3.astype(dtype)
    a_low = np.asarray(alpha, dtype)
    p = er.entmax(x, a_low, backend=backend)
    assert p.dtype == dtype
    p32 = er.entmax(X3.astype(dtype).astype(np.float32), float(a_low), backend=backend)
    assert np.array_equal(p.astype(np.float32), p32.astype(dtype).astype(np.float32))
    g = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]], dtype)
    for out in (er.entmax_vjp(p, g, a_low, backend=backend), er.entmax_loss_grad(x, [2, 0], a_low, backend=backend)):
        assert out.dtype == dtype and out.shape == x.shape
    assert er.entmax_jacobian(p, a_low, backend=backend).dtype == dtype
    assert er.entmax_alpha_vjp(p, g, a_low, backend=backend).dtype == np.float64
    t = np.array([[1 / 3] * 3, [0.5, 0.0, 0.5]], dtype)  # sums to 1 within the target's precision
    loss = er.entmax_loss(x, t, a_low, backend=backend)
    assert loss.dtype == np.float64 and np.all(loss >= 0)
    other = np.float16 if dtype == BF16 else BF16  # float16 with bfloat16: float32
    assert er.entmax_vjp(p, g.astype(other), a_low, backend=backend).dtype == np.float32
    assert er.entmax_vjp(p, g.astype(np.float64), a_low, backend=backend).dtype == np.float64


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_asentmax_and_attention(backend, dtype):
    x = X3.astype(dtype)
    one = np.asarray(1.0, dtype)
    p = er.asentmax(x, np.asarray(1.5, dtype), beta=one, gamma=one, delta=one, backend=backend)
    assert p.dtype == dtype
    g = er.asentmax_vjp(np.ones_like(x), x, 1.5, beta=one, gamma=one, delta=one, backend=backend)
    assert g.dx.dtype == dtype and g.dbeta.dtype == np.float64
    q, k, v = (a.astype(dtype) for a in _qkv())
    out = er.attention(q, k, v, alpha=np.asarray(1.5, dtype), scale=np.asarray(0.5, dtype), beta=one,
                       gamma=one, backend=backend)
    assert out.dtype == dtype
    ga = er.attention_vjp(out, q, k, v, alpha=1.5, scale=np.asarray(0.5, dtype), backend=backend)
    assert ga.dq.dtype == ga.dk.dtype == ga.dv.dtype == dtype


def test_low_precision_target_tolerance_comes_from_the_target():
    x = np.zeros(3)
    t = np.array([1 / 3] * 3, BF16)
    assert float(t.astype(np.float64).sum()) != 1.0  # 1.00195..., off by more than float64 allows
    er.entmax_loss(x, t, 1.5, backend="numpy")
    with pytest.raises(ValueError, match="target rows must sum to 1"):
        er.entmax_loss(x, t.astype(np.float64), 1.5, backend="numpy")


# --------------------------------------------------------------------------- support
def test_support_counts_the_returned_probabilities(backend):
    x = np.array([0.0, -120.0, -1e-3], np.float32)
    p, info = er.entmax(x, 1.0, backend=backend, return_info=True)
    assert int(info.support) == int((_np(backend, p) > 0).sum()) == 2
    assert int(info.support_exact) == 3  # exp(-120) is a float64 number, below float32's range


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BF16], ids=str)
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.05, 4.0])
def test_support_equals_nonzeros_on_a_wide_row(backend, dtype, alpha):
    r = np.random.default_rng(3)
    x = (r.normal(size=(64, 40)) * np.logspace(-3, 3, 40)).astype(dtype)
    p, info = er.entmax(x, alpha, backend=backend, return_info=True)
    assert np.array_equal(info.support, (p > 0).sum(-1))
    assert np.all(info.support <= info.support_exact)
    pa, ia = er.asentmax(x, alpha, beta=0.5, gamma=1.0, backend=backend, return_info=True)
    assert np.array_equal(ia.support, (pa > 0).sum(-1))


# --------------------------------------------------------------------------- warnings
HUGE = [np.array([1e300, -1e300, 0.0]), np.array([1.7e308, -1.7e308, 0.0]), np.array([-1.7e308, 1.7e308]),
        np.array([1.7e308, 1.69e308, -1.7e308]), np.array([-1e300, -1e300 * (1 - 1e-15), -np.inf])]


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.2, 3.0, 1 + 1e-9, 100.0])
@pytest.mark.parametrize("x", HUGE, ids=range(len(HUGE)))
def test_huge_offsets_give_no_warning_and_agree(backend, alpha, x):
    p = er.entmax(x, alpha, backend=backend)
    ref = er.entmax(x, alpha, backend="numpy")
    assert np.array_equal(p, ref) and abs(p.sum() - 1) < 1e-15
    g = np.where(np.isfinite(x), x, 0.0) / 1e300
    er.entmax_vjp(p, g, alpha, backend=backend)
    er.entmax_alpha_vjp(p, g, alpha, backend=backend)
    er.entmax_loss(x, 0, alpha, backend=backend)


@pytest.mark.parametrize("alpha", [1.0, 1.25, 1.5, 2.0, 3.0])
def test_unchecked_plus_inf_is_an_answer_not_an_exception(backend, alpha):
    """check_finite=False hands +inf to the solvers (the caller promised clean input): the
    answer is unspecified, but no backend may raise from inside its solver (numba's
    softmax divided by zero: ZeroDivisionError)."""
    x = np.zeros((3, 40))
    x[0, 3] = np.inf
    x[1, :] = np.inf
    p = backend.call(er.entmax, x, alpha, check_finite=False)
    assert p.shape == x.shape
    assert np.array_equal(p[2], backend.call(er.entmax, x[2:], alpha)[0])  # a clean row as when checked
