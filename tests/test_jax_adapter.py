"""entmax_ref.jax: custom VJPs through the library's own backward, under jit, grad and vmap.

jax.test_util.check_grads compares the VJP rules with finite differences in float64 (x64
enabled for the test only); the results must equal the top-level functions bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import entmax_ref as er  # noqa: E402
import entmax_ref.jax as erj  # noqa: E402
from adapter_cases import message_without, row_pairs  # noqa: E402


@pytest.fixture(autouse=True)
def x64():
    """float64 for this module's tests only."""
    with jax.enable_x64(True):
        yield


def _randn(*shape, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype=jnp.float64)


def _grads(fn, *args):
    check_grads(fn, args, order=1, modes=["rev"])


ROWS = row_pairs(erj)


@pytest.mark.parametrize("name", ROWS)
def test_rows_check_grads_jit_vmap_and_equal_the_library(name):
    ours, lib = ROWS[name]
    x = _randn(3, 6)
    _grads(ours, x)
    _grads(lambda x: ours(x, axis=0), x)
    p = jax.jit(ours)(x)
    assert p.dtype == x.dtype and np.array_equal(p, lib(np.asarray(x)))
    batched = jax.vmap(ours)(jnp.stack([x, 2 * x]))
    assert np.array_equal(batched[1], lib(np.asarray(2 * x)))


def test_array_alpha_per_row_and_shared():
    x = _randn(2, 3, 5)
    alpha = jnp.array([[1.2, 1.6, 2.3], [1.05, 1.5, 3.0]])
    _grads(lambda x, a: erj.entmax(x, a), x, alpha)
    _grads(lambda x, a: erj.entmax(x, a, axis=1), x, jnp.array(1.7))
    p = erj.entmax(x, alpha)
    assert np.array_equal(p, er.entmax(np.asarray(x), np.asarray(alpha)))
    g = _randn(2, 3, 5, seed=3)
    _, vjp = jax.vjp(lambda a: erj.entmax(x, a), alpha)
    assert np.array_equal(vjp(g)[0], er.entmax_alpha_vjp(np.asarray(p), np.asarray(g), np.asarray(alpha)))
    # vmap over rows with their own alpha (alpha broadcast to the rows first)
    out = jax.vmap(lambda x, a: erj.entmax(x, a))(x, jnp.array([1.3, 2.2]))
    assert np.array_equal(out[1], er.entmax(np.asarray(x[1]), 2.2))


@pytest.mark.parametrize("kind", ["entmax", "normmax"])
def test_losses(kind):
    ours, lib = {"entmax": (erj.entmax_loss, er.entmax_loss), "normmax": (erj.normmax_loss, er.normmax_loss)}[kind]
    x = _randn(4, 5)
    for target in (jnp.array([0, 4, 2, 1]), jax.nn.softmax(_randn(4, 5, seed=2))):
        _grads(lambda x: ours(x, target, 1.5), x)
        assert np.array_equal(ours(x, target, 1.5), lib(np.asarray(x), np.asarray(target), 1.5))


def test_asentmax_and_ssmax():
    x = jnp.where(jnp.arange(6) >= 4, -jnp.inf, _randn(2, 3, 6))  # masked keys: n = 4
    beta, gamma, delta = jnp.array([[0.5], [0.9]]), jnp.array([1.0, 1.3, 0.7]), jnp.array(0.8)
    _grads(lambda x, b, g, d: erj.asentmax(jnp.where(jnp.isfinite(x), x, -jnp.inf), beta=b, gamma=g, delta=d),
           x, beta, gamma, delta)
    _grads(lambda b: erj.ssmax(x, beta=b), beta)
    p = erj.asentmax(x, beta=beta, gamma=gamma, delta=delta)
    args = [np.asarray(a) for a in (x, beta, gamma, delta)]
    assert np.array_equal(p, er.asentmax(args[0], beta=args[1], gamma=args[2], delta=args[3]))
    g = _randn(2, 3, 6, seed=4)
    _, vjp = jax.vjp(lambda b, gm, d: erj.asentmax(x, beta=b, gamma=gm, delta=d), beta, gamma, delta)
    want = er.asentmax_vjp(np.asarray(g), args[0], beta=args[1], gamma=args[2], delta=args[3])
    for ours, theirs in zip(vjp(g), want[1:]):
        assert np.array_equal(ours, theirs)


def _qkv(seed=0):
    return _randn(1, 2, 4, 3, seed=seed), _randn(1, 1, 5, 3, seed=seed + 1), _randn(1, 1, 5, 2, seed=seed + 2)


def test_attention_check_grads_every_argument_and_bits():
    q, k, v = _qkv()
    alpha, beta, gamma, delta = jnp.array([1.3, 2.4]), jnp.array([[0.5], [0.7]]), jnp.array([[1.0], [1.2]]), \
        jnp.array(0.9)

    def fn(q, k, v, a, b, g, d):
        return erj.attention(q, k, v, alpha=a, causal=True, beta=b, gamma=g, delta=d, key_lengths=jnp.array([4]),
                             alibi_slopes=jnp.array([0.1, 0.3]))

    args = (q, k, v, alpha, beta, gamma, delta)
    _grads(fn, *args)
    host = [np.asarray(a) for a in args]
    kw = dict(alpha=host[3], causal=True, beta=host[4], gamma=host[5], delta=host[6], key_lengths=np.array([4]),
              alibi_slopes=np.array([0.1, 0.3]))
    ref, info = er.attention(*host[:3], return_info=True, **kw)
    out, vjp = jax.vjp(jax.jit(fn), *args)
    assert np.array_equal(out, ref)
    g = _randn(*out.shape, seed=7)
    want = er.attention_vjp(np.asarray(g), *host[:3], info=info, **kw)
    for ours, theirs in zip(vjp(g), (want.dq, want.dk, want.dv, want.dalpha, want.dbeta, want.dgamma, want.ddelta)):
        assert np.array_equal(ours, theirs)


def test_attention_vmap_and_varlen():
    q, k, v = _qkv()
    qs = jnp.stack([q, 2 * q])
    out = jax.vmap(lambda q: erj.attention(q, k, v, causal=True))(qs)
    assert np.array_equal(out[1], er.attention(np.asarray(2 * q), np.asarray(k), np.asarray(v), causal=True))
    qp, kp, vp = _randn(6, 2, 3), _randn(7, 1, 3, seed=1), _randn(7, 1, 2, seed=2)
    cu_q, cu_k = jnp.array([0, 2, 6]), jnp.array([0, 3, 7])
    _grads(lambda q, k, v, a: erj.attention_varlen(q, k, v, cu_q, cu_k, alpha=a, causal=True), qp, kp, vp,
           jnp.array([1.3, 1.7]))


def test_float32_without_x64_keeps_the_residual_exact():
    host64 = [np.asarray(t) for t in _qkv()]
    with jax.enable_x64(False):
        q, k, v = (jnp.asarray(t.astype(np.float32)) for t in host64)
        g = jax.grad(lambda q: erj.attention(q, k, v, alpha=1.5, causal=True).sum())(q)
        host = [np.asarray(t) for t in (q, k, v)]
        out, info = er.attention(*host, alpha=1.5, causal=True, return_info=True)
        want = er.attention_vjp(np.ones_like(out), *host, info=info, alpha=1.5, causal=True)
        assert g.dtype == jnp.float32 and np.array_equal(g, want.dq)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="x must be a floating JAX array"):
        erj.entmax15(jnp.arange(3))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        erj.entmax15(jnp.zeros((2, 3)), axis=2)


@pytest.mark.parametrize("call", ["asentmax", "ssmax", "attention", "attention_delta"])
def test_grad_with_respect_to_a_python_float_parameter(call):
    x = _randn(3, 5)
    q, k, v = _qkv()
    fns = {"asentmax": lambda b: (erj.asentmax(x, beta=b, gamma=1.0) * jnp.arange(5.0)).sum(),
           "ssmax": lambda b: (erj.ssmax(x, beta=b) * jnp.arange(5.0)).sum(),
           "attention": lambda b: jnp.square(erj.attention(q, k, v, beta=b, gamma=1.0)).sum(),
           "attention_delta": lambda d: jnp.square(erj.attention(q, k, v, beta=0.5, gamma=1.0, delta=d)).sum()}
    fn = fns[call]
    got = jax.grad(fn)(0.5)  # a Python float: jax.grad hands the custom rules a plain number
    assert got == jax.grad(fn)(jnp.array(0.5)) and got == jax.jit(jax.grad(fn))(0.5) and got != 0


def test_loss_gradient_with_respect_to_a_probability_target_is_refused():
    x = _randn(3, 5)
    target = jax.nn.softmax(_randn(3, 5, seed=1))
    for jit in (lambda f: f, jax.jit):
        with pytest.raises(ValueError, match="differentiate the scores x, not the target"):
            jit(jax.grad(lambda t: erj.entmax_loss(x, t, 1.5).sum()))(target)
        dx = jit(jax.grad(lambda x: erj.normmax_loss(x, target, 2.0).sum()))(x)
        assert np.array_equal(dx, er.normmax_loss_grad(np.asarray(x), np.asarray(target), 2.0))
    _, tangent = jax.jvp(lambda x: erj.entmax_loss(x, target, 1.5), (x,), (jnp.ones_like(x),))
    want = (er.entmax_loss_grad(np.asarray(x), np.asarray(target), 1.5)).sum(axis=-1)
    assert np.allclose(tangent, want, rtol=0, atol=1e-15)


def test_nan_input_is_the_librarys_value_error():
    x = jnp.array([1.0, jnp.nan, 0.5])
    with pytest.raises(ValueError, match=r"x contains 1 NaN or \+inf value; the first is x\[1\] = nan"):
        erj.entmax15(x)
    with pytest.raises(ValueError, match=r"the first is x\[1\] = nan"):
        jax.grad(lambda x: erj.sparsemax(x)[0])(x)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"q contains 1 NaN"):
        erj.attention(q.at[0, 0, 0, 0].set(jnp.nan), k, v)
    # under jit the host runs in XLA's runtime: the library's message is in JAX's error
    with pytest.raises(Exception, match=r"x contains 1 NaN or \+inf value"):
        jax.jit(erj.entmax15)(x).block_until_ready()


def test_zero_d_input_is_one_row_of_length_one():
    x = jnp.array(3.0)
    assert erj.entmax15(x) == 1.0 and erj.entmax15(x).shape == () and erj.normmax(x).shape == ()
    assert erj.entmax(x, jnp.array(1.7)).shape == () and erj.softmax(x, axis=0) == 1.0
    assert jax.grad(erj.entmax15)(x) == 0.0 and jax.grad(lambda a: erj.entmax(x, a))(jnp.array(1.7)) == 0.0
    assert erj.entmax_loss(x, jnp.array(0), 1.5) == 0.0 and erj.entmax_loss(x, jnp.array(1.0), 1.5) == 0.0
    assert np.array_equal(jax.vmap(erj.sparsemax)(jnp.array([3.0, -1.0])), [1.0, 1.0])
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        erj.entmax15(x, axis=1)


@pytest.mark.parametrize("bad", [True, "1.5", jnp.nan])
def test_a_number_that_is_not_a_number_is_refused_as_the_library_refuses_it(bad):
    x = _randn(2, 3)
    for call in (lambda: erj.entmax(x, bad), lambda: erj.normmax(x, bad), lambda: erj.budget_sparsemax(x, bad),
                 lambda: erj.entmax_loss(x, jnp.array([0, 1]), bad), lambda: erj.asentmax(x, bad, beta=0.5, gamma=1.0),
                 lambda: erj.attention(*_qkv(), alpha=bad)):
        with pytest.raises((TypeError, ValueError), match="alpha|budget"):
            call()


def test_alpha_in_the_keepdims_shape_of_the_entmax_package():
    x = _randn(3, 5)
    keep, rows = jnp.array([[1.2], [1.5], [2.0]]), jnp.array([1.2, 1.5, 2.0])
    assert np.array_equal(erj.entmax(x, keep), erj.entmax(x, rows))
    g = _randn(3, 5, seed=2)
    _, vjp = jax.vjp(lambda a: erj.entmax(x, a), keep)
    (dk,) = vjp(g)
    assert dk.shape == (3, 1) and np.array_equal(dk[:, 0], jax.vjp(lambda a: erj.entmax(x, a), rows)[1](g)[0])
    _grads(lambda x, a: erj.entmax(x, a, axis=0), x, jnp.array([[1.1, 1.3, 1.5, 2.0, 3.0]]))


def test_import_entmax_ref_does_not_import_jax_and_the_adapter_names_the_install():
    assert "pip install jax" in message_without("jax")


def test_training_guide_jax_example_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "training.md").read_text(encoding="utf-8")
    body = next(s for s in re.split(r"^## ", text, flags=re.M) if s.startswith("JAX"))
    code = "\n".join(re.findall(r"```python\n(.*?)```", body, flags=re.S))
    assert "erj.attention" in code
    with jax.enable_x64(False):
        exec(compile(code, "training.md#jax", "exec"), {"__name__": "training_jax"})


def test_forward_mode_is_refused():
    """Only reverse-mode first derivatives exist; JAX refuses forward mode (the documented status)."""
    with pytest.raises(TypeError, match="forward-mode"):
        jax.hessian(lambda x: erj.entmax15(x)[0])(jnp.array([0.1, 0.5, 0.2]))
