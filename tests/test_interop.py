"""Arrays from other frameworks: torch tensors (CPU, requires_grad, bfloat16), JAX
arrays and any ``__dlpack__`` object in; results in the caller's array type out; zero-copy
where the memory allows; torch and JAX never imported unless the caller passed them."""

from __future__ import annotations

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref import _interop



@pytest.fixture(autouse=True)
def _numpy_backend():
    """Conversion is the public layer's business, the same for every backend; the NumPy
    reference is deterministic to the bit (the threaded numba attention sums in varying
    order), so results can be compared with array_equal."""
    with er.use_backend("numpy"):
        yield


X = np.array([[-2.0, 0.0, 0.5], [0.3, 1.0, 0.1]])
Q, K, V = (np.random.default_rng(i).normal(size=(1, 2, 3, 2)) for i in range(3))
# a packed batch of two sequences: (total, heads, dim), 4 query heads over 2 kv heads
QP, KP = (np.random.default_rng(i).normal(size=(5, 4 // (1 + i), 2)) for i in range(2))
VP = np.random.default_rng(2).normal(size=(5, 2, 4))
CU_Q, CU_K = np.array([0, 2, 5]), np.array([0, 3, 5])
HEAD_ALPHA = np.array([1.25, 1.5, 2.0, 3.0])
GP = np.random.default_rng(3).normal(size=(5, 4, 4))  # dL/dout of the packed batch

# every public function that takes arrays, as (name, call(to)) where to() converts an input
CALLS = {
    "entmax": lambda to: er.entmax(to(X), 1.3),
    "softmax": lambda to: er.softmax(to(X)),
    "sparsemax": lambda to: er.sparsemax(to(X)),
    "entmax15": lambda to: er.entmax15(to(X)),
    "entmax_threshold": lambda to: er.entmax_threshold(to(X), 1.3),
    "entmax_vjp": lambda to: er.entmax_vjp(to(er.entmax(X, 1.3)), to(X), 1.3),
    "entmax_alpha_vjp": lambda to: er.entmax_alpha_vjp(to(er.entmax(X, 1.3)), to(X), 1.3),
    "entmax_jacobian": lambda to: er.entmax_jacobian(to(er.entmax(X, 1.3)), 1.3),
    "entmax_loss": lambda to: er.entmax_loss(to(X), to(np.array([2, 0])), 1.3),
    "entmax_loss_grad": lambda to: er.entmax_loss_grad(to(X), to(er.entmax(X, 2.0)), 1.3),
    "asentmax": lambda to: er.asentmax(to(X), 1.3, beta=to(np.array([0.5, 1.0])), gamma=1.0),
    "asentmax_vjp": lambda to: er.asentmax_vjp(to(X), to(X), 1.3, beta=0.5, gamma=1.0),
    "asentmax_scale": lambda to: er.asentmax_scale(to(np.array([1.0, 4.0])), beta=0.5, gamma=1.0),
    "ssmax": lambda to: er.ssmax(to(X), beta=0.5),
    "row_diagnostics": lambda to: er.row_diagnostics(to(er.entmax(X, 1.3))),
    "normalized_entropy": lambda to: er.normalized_entropy(to(er.entmax(X, 1.3))),
    "attention": lambda to: er.attention(to(Q), to(K), to(V), alpha=1.5),
    "attention_info": lambda to: er.attention(to(Q), to(K), to(V), alpha=1.5, return_info=True),
    "attention_vjp": lambda to: er.attention_vjp(to(V), to(Q), to(K), to(V), alpha=1.5),
    # the forward's info passed back in, its fields in the caller's array type
    "attention_vjp_info": lambda to: er.attention_vjp(
        to(V), to(Q), to(K), to(V), alpha=1.5, info=er.attention(to(Q), to(K), to(V), alpha=1.5, return_info=True)[1]),
    "normmax": lambda to: er.normmax(to(X), 2.0),
    "normmax_info": lambda to: er.normmax(to(X), to(np.array([1.5, 3.0])), return_info=True),
    "normmax_vjp": lambda to: er.normmax_vjp(to(er.normmax(X, 2.0)), to(X), 2.0),
    "normmax_loss": lambda to: er.normmax_loss(to(X), to(np.array([2, 0])), 2.0),
    "normmax_loss_grad": lambda to: er.normmax_loss_grad(to(X), to(er.normmax(X, 3.0)), 2.0),
    "budget_sparsemax": lambda to: er.budget_sparsemax(to(X), to(np.array([1.5, 2.0])), return_info=True),
    "budget_sparsemax_vjp": lambda to: er.budget_sparsemax_vjp(to(er.budget_sparsemax(X, 1.5)), to(X), 1.5),
    # packed sequences, with one alpha per query head (an array in the caller's type)
    "attention_varlen": lambda to: er.attention_varlen(
        to(QP), to(KP), to(VP), to(CU_Q), to(CU_K), alpha=to(HEAD_ALPHA), return_info=True),
    "attention_varlen_vjp": lambda to: er.attention_varlen_vjp(
        to(GP), to(QP), to(KP), to(VP), to(CU_Q), to(CU_K), alpha=to(HEAD_ALPHA)),
    "attention_varlen_vjp_numpy_alpha": lambda to: er.attention_varlen_vjp(
        to(GP), to(QP), to(KP), to(VP), to(CU_Q), to(CU_K), alpha=HEAD_ALPHA),
}


def _leaves(res):
    """Every array in a result (plain, tuple / NamedTuple, info dataclass)."""
    import dataclasses

    if isinstance(res, tuple):
        return [x for r in res for x in _leaves(r)]
    if dataclasses.is_dataclass(res):
        return [x for f in dataclasses.fields(res) for x in _leaves(getattr(res, f.name))]
    return [] if res is None or type(res) in (int, float) else [res]  # a Python scalar (info.alpha) is no array


@pytest.mark.parametrize("name", list(CALLS))
def test_torch_in_torch_out_same_values(name):
    torch = pytest.importorskip("torch")
    want = CALLS[name](lambda a: a)
    got = CALLS[name](lambda a: torch.from_numpy(np.array(a)))
    for w, g in zip(_leaves(want), _leaves(got), strict=True):
        assert isinstance(g, torch.Tensor)
        assert np.array_equal(g.numpy(), np.asarray(w), equal_nan=True)


@pytest.mark.filterwarnings("ignore:entmax_ref's functions read a tensor that requires grad detached")
@pytest.mark.parametrize("name", ["entmax", "entmax_vjp", "asentmax", "attention_vjp", "row_diagnostics"])
def test_torch_requires_grad_and_bfloat16(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    got = CALLS[name](lambda a: torch.tensor(np.array(a), dtype=torch.float32 if a.dtype.kind == "f" else None,
                                             requires_grad=a.dtype.kind == "f"))
    for g in _leaves(got):
        assert isinstance(g, torch.Tensor) and not g.requires_grad
    if name == "row_diagnostics":
        return
    bf = CALLS[name](lambda a: torch.tensor(np.array(a)).to(torch.bfloat16) if a.dtype.kind == "f" else torch.tensor(a))
    want32 = CALLS[name](lambda a: torch.tensor(np.array(a)).to(torch.bfloat16).float() if a.dtype.kind == "f"
                         else torch.tensor(a))
    if name == "row_diagnostics":  # bfloat16-rounded p is a distribution in bfloat16 only
        return
    for b, w in zip(_leaves(bf), _leaves(want32), strict=True):
        if w.dtype == torch.float32:  # computed in float32, returned in the input's bfloat16
            assert b.dtype == torch.bfloat16 and torch.equal(b, w.to(torch.bfloat16))


def test_a_tensor_that_requires_grad_warns_once_naming_the_torch_adapter(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(_interop, "_told_detached", False)  # as in a new process
    x = torch.tensor(X, requires_grad=True)
    with pytest.warns(UserWarning, match="autograd does not follow. For gradients use entmax_ref.torch") as rec:
        p = er.entmax(x, 1.5)
    assert rec[0].filename == __file__  # the caller's line
    assert not p.requires_grad
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        er.entmax(x, 1.5)  # once per process
        er.entmax(x.detach(), 1.5)


@pytest.mark.filterwarnings("ignore:entmax_ref's functions read a tensor that requires grad detached")
def test_torch_round_trip_is_zero_copy():
    torch = pytest.importorskip("torch")
    t = torch.tensor(X, requires_grad=True)
    view = _interop.to_numpy(t)
    assert np.shares_memory(view, t.detach().numpy())
    bf = t.detach().to(torch.bfloat16)
    assert _interop.to_numpy(bf).ctypes.data == bf.data_ptr()
    out = np.arange(4.0)
    back = _interop._converter(t)(out)
    assert back.data_ptr() == out.ctypes.data
    p = er.entmax(t, 1.5)
    assert p.dtype == torch.float64 and t.grad is None  # the input is neither changed nor traced


# JAX without jax_enable_x64 rounds the float64 residual of an info it holds to float32,
# so a backward from it is not the NumPy one's bit for bit (torch keeps float64)
@pytest.mark.parametrize("name", [c for c in CALLS if c != "attention_vjp_info"])
def test_jax_in_jax_out_same_values(name):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    # JAX without jax_enable_x64 holds float64 as float32 (JAX's own rule), inputs and results
    want = CALLS[name](lambda a: np.asarray(jnp.asarray(a)))
    got = CALLS[name](lambda a: jnp.asarray(a))
    for w, g in zip(_leaves(want), _leaves(got), strict=True):
        assert isinstance(g, jax.Array)
        w = np.asarray(w)
        assert np.array_equal(np.asarray(g), w.astype(np.asarray(g).dtype), equal_nan=True)


def test_jax_bfloat16():
    jax = pytest.importorskip("jax")
    x = jax.numpy.asarray(X, dtype=jax.numpy.bfloat16)
    p = er.entmax(x, 1.5)
    assert isinstance(p, jax.Array) and p.dtype == jax.numpy.bfloat16


@pytest.mark.parametrize("name", ["entmax", "entmax_vjp", "entmax_loss", "asentmax", "attention_info"])
def test_any_dlpack_array_api_object(name):
    xps = pytest.importorskip("array_api_strict")
    want = CALLS[name](lambda a: a)
    got = CALLS[name](lambda a: xps.asarray(a))
    for w, g in zip(_leaves(want), _leaves(got), strict=True):
        assert type(g).__module__.startswith("array_api_strict")
        assert np.array_equal(np.from_dlpack(g), np.asarray(w), equal_nan=True)


class _OnlyDLPack:
    """An array known only through the DLPack protocol (no __array__, no namespace)."""

    def __init__(self, a):
        self._a = np.ascontiguousarray(a)

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_plain_dlpack_object_gives_numpy():
    p = er.entmax(_OnlyDLPack(X), 1.5)
    assert type(p) is np.ndarray and np.array_equal(p, er.entmax(X, 1.5))


def test_framework_array_errors_name_the_argument():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"x contains 1 NaN or \+inf value"):
        er.entmax(torch.tensor([0.0, float("nan")]))
    with pytest.raises(TypeError, match="x has unsupported dtype bool"):
        er.entmax(torch.tensor([True, False]))
