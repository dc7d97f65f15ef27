"""Every public function runs on a device-like array type that refuses NumPy conversion.

The stand-in (tests/strict_array.py) behaves like CuPy: ``np.asarray`` on it raises, it
will not mix with NumPy arrays, and its backend computes on it.  A public function that
calls NumPy on an array it was given fails here, on the CPU, instead of on a GPU.  The
results must equal, bit for bit, those of the NumPy reference on NumPy arrays (the
stand-in backend computes with the reference), and array results stay StrictArrays.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import strict_array as S

import entmax_ref as er



@pytest.fixture(autouse=True, scope="module")
def _strict_backend():
    """The stand-in backend, registered for this module only (unless the whole run asked for
    it with ENTMAX_REF_TEST_STRICT=1, see conftest.py)."""
    already = S.NAME in er.backends._REGISTRY
    S.register()
    yield
    if not already:
        S.unregister()

#: public callables that take no arrays (names, contexts)
NO_ARRAYS = {"available_backends", "get_backend", "use_backend"}


def _data():
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((3, 2, 5))
    x[0, 1, 3] = -np.inf
    p = er.entmax(x, 1.5, backend="numpy")
    B, Hq, Hkv, Nq, Nk, D = 2, 4, 2, 3, 5, 4
    return dict(
        x=x, p=p, g=rng.standard_normal(x.shape), alpha_rows=np.array([[1.2, 1.5], [2.0, 1.0], [3.0, 1.7]]),
        target=rng.integers(0, 5, (3, 2)), target_p=er.softmax(rng.standard_normal(x.shape), backend="numpy"),
        n=np.array([[3, 9], [1, 120], [7, 2]]), beta=np.array([0.5, 0.25]), gamma=np.array([1.0, 0.5]),
        grad_s=rng.standard_normal((3, 2)), positions=np.array([0, 2]), scores=x,
        q=rng.standard_normal((B, Hq, Nq, D)), k=rng.standard_normal((B, Hkv, Nk, D)),
        v=rng.standard_normal((B, Hkv, Nk, 3)), do=rng.standard_normal((B, Hq, Nq, 3)),
        key_lengths=np.array([5, 2]), slopes=np.array([0.5, 0.25, 0.125, 0.0]),
        head_beta=np.full((1, Hq, 1), 0.3), head_gamma=np.full((1, Hq, 1), 0.5),
        pq=rng.standard_normal((5, Hq, D)), pk=rng.standard_normal((7, Hkv, D)), pv=rng.standard_normal((7, Hkv, 3)),
        pdo=rng.standard_normal((5, Hq, 3)), cu_q=np.array([0, 2, 5]), cu_k=np.array([0, 3, 7]),
        head_alpha=np.array([1.5, 2.0, 1.25, 1.5]),
    )


def _attention_vjp(d, be):
    kw = dict(alpha=1.5, causal=True, key_lengths=d["key_lengths"], alibi_slopes=d["slopes"], beta=d["head_beta"],
              gamma=d["head_gamma"], backend=be)
    out, info = er.attention(d["q"], d["k"], d["v"], return_info=True, **kw)
    return er.attention_vjp(d["do"], d["q"], d["k"], d["v"], out=out, tau=info.tau, **kw)


#: name -> call(data, backend); ``data`` holds NumPy arrays or StrictArrays
CALLS = {
    "softmax": lambda d, be: er.softmax(d["x"], backend=be, return_info=True),
    "sparsemax": lambda d, be: er.sparsemax(d["x"], backend=be, return_info=True),
    "entmax15": lambda d, be: er.entmax15(d["x"], axis=1, backend=be, return_info=True),
    "entmax": lambda d, be: er.entmax(d["x"], d["alpha_rows"], backend=be, return_info=True),
    "entmax_threshold": lambda d, be: er.entmax_threshold(d["x"], 1.25, method="bisect", backend=be),
    "entmax_vjp": lambda d, be: er.entmax_vjp(d["p"], d["g"], 1.5, backend=be),
    "entmax_alpha_vjp": lambda d, be: er.entmax_alpha_vjp(d["p"], d["g"], 1.5, backend=be),
    "entmax_jacobian": lambda d, be: er.entmax_jacobian(d["p"], 1.5, backend=be),
    "entmax_loss": lambda d, be: (er.entmax_loss(d["x"], d["target"], 1.5, backend=be),
                                  er.entmax_loss(d["x"], d["target_p"], 1.3, backend=be),
                                  er.entmax_loss(d["x"], [[0, 1], [2, 3], [4, 0]], 2.0, backend=be)),  # host target
    "entmax_loss_grad": lambda d, be: er.entmax_loss_grad(d["x"], d["target"], 2.0, backend=be),
    "asentmax": lambda d, be: er.asentmax(d["x"], 1.5, beta=d["beta"], gamma=d["gamma"], backend=be,
                                          return_info=True),
    "asentmax_vjp": lambda d, be: er.asentmax_vjp(d["g"], d["x"], 1.5, beta=d["beta"], gamma=d["gamma"], backend=be),
    "asentmax_scale": lambda d, be: er.asentmax_scale(d["n"], d["beta"], d["gamma"]),
    "asentmax_scale_vjp": lambda d, be: er.asentmax_scale_vjp(d["grad_s"], d["n"], d["beta"], d["gamma"]),
    "ssmax": lambda d, be: er.ssmax(d["x"], beta=d["beta"], backend=be, return_info=True),
    "ssmax_vjp": lambda d, be: er.ssmax_vjp(d["g"], d["x"], beta=d["beta"], backend=be),
    "attention": lambda d, be: er.attention(d["q"], d["k"], d["v"], causal=True, key_lengths=d["key_lengths"],
                                            alibi_slopes=d["slopes"], beta=d["head_beta"], gamma=d["head_gamma"],
                                            return_info=True, backend=be),
    "attention_vjp": _attention_vjp,
    "attention_varlen": lambda d, be: er.attention_varlen(d["pq"], d["pk"], d["pv"], d["cu_q"], d["cu_k"], causal=True,
                                                          alpha=d["head_alpha"], return_info=True, backend=be),
    "attention_varlen_vjp": lambda d, be: er.attention_varlen_vjp(d["pdo"], d["pq"], d["pk"], d["pv"], d["cu_q"],
                                                                  d["cu_k"], causal=True, alpha=d["head_alpha"],
                                                                  backend=be),
    "keys_visible": lambda d, be: er.keys_visible(3, 5, causal=True, key_lengths=d["key_lengths"], batch=2),
    "support_size": lambda d, be: er.support_size(d["p"]),
    "max_probability": lambda d, be: er.max_probability(d["p"], axis=2),
    "normalized_entropy": lambda d, be: (er.normalized_entropy(d["p"]), er.normalized_entropy(d["p"], n=d["n"]),
                                         er.normalized_entropy(d["p"], scores=d["scores"])),
    "mass_on": lambda d, be: er.mass_on(d["p"], d["positions"]),
    "normmax": lambda d, be: er.normmax(d["x"], 1.5, backend=be, return_info=True),
    "normmax_vjp": lambda d, be: er.normmax_vjp(er.normmax(d["x"], 2.0, backend=be), d["g"], 2.0, backend=be),
    "normmax_loss": lambda d, be: (er.normmax_loss(d["x"], d["target"], 1.5, backend=be),
                                   er.normmax_loss(d["x"], d["target_p"], 2.0, backend=be)),
    "normmax_loss_grad": lambda d, be: er.normmax_loss_grad(d["x"], d["target"], 2.0, backend=be),
    "budget_sparsemax": lambda d, be: er.budget_sparsemax(d["x"], 2.0, backend=be, return_info=True),
    "budget_sparsemax_vjp": lambda d, be: er.budget_sparsemax_vjp(er.budget_sparsemax(d["x"], 2.0, backend=be), d["g"],
                                                                  2.0, backend=be),
    "row_diagnostics": lambda d, be: er.row_diagnostics(d["p"], scores=d["scores"], positions=d["positions"]),
}


def test_every_public_function_is_covered():
    public = {n for n in er.__all__ if callable(getattr(er, n)) and not inspect.isclass(getattr(er, n))}
    assert set(CALLS) == public - NO_ARRAYS


def _leaves(obj, path="result"):
    """(path, leaf) for every array or scalar inside tuples, NamedTuples and dataclasses."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, tuple):
        names = getattr(obj, "_fields", None) or range(len(obj))
        for name, item in zip(names, obj):
            yield from _leaves(item, f"{path}[{name}]")
    elif obj is not None:
        yield path, obj


@pytest.mark.parametrize("name", sorted(CALLS))
def test_public_function_runs_on_the_strict_array_type(name):
    data = _data()
    want = CALLS[name](data, "numpy")
    got = CALLS[name]({k: S.asarray(v) for k, v in data.items()}, S.NAME)
    want_leaves, got_leaves = list(_leaves(want)), list(_leaves(got))
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    for (path, w), (_, g) in zip(want_leaves, got_leaves):
        if isinstance(w, np.ndarray):
            assert isinstance(g, S.StrictArray), f"{name}: {path} left the device as {type(g).__name__}"
            g = g.get()
            assert g.dtype == w.dtype and g.shape == w.shape, (path, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_array_equal(g, w, err_msg=f"{name}: {path}")


def test_the_stand_in_refuses_what_cupy_refuses():
    a = S.asarray(np.arange(3.0))
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match="host/device mix"):
        np.ones(3) + a
    with pytest.raises(TypeError, match="host/device mix"):
        a.__array_namespace__().where(a > 0, np.ones(3), a)
    with pytest.raises(TypeError, match="cannot compute on"):
        er.sparsemax(np.arange(3.0), backend=S.NAME)  # arrays are never moved silently
    np.testing.assert_array_equal(a.get(), np.arange(3.0))
