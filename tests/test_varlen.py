"""Packed variable-length attention against one er.attention call per sequence.

``attention_varlen`` runs the backend once per sequence on that sequence's slice, so the
reference (``er.attention`` on the unpacked sequence) must agree bit for bit: forward,
info and every gradient.  A second, independent check packs left-padded batches: a
left-padded batch with ``key_padding_mask`` gives each sequence the same rows (causal
alignment, ALiBi distances and ASEntmax n all coincide), to the score rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import EPS, grad_tols, out_tol
from test_attention_shapes import _cpu_engines_only, dense, visibility  # noqa: F401 - the autouse fixture applies here too

import entmax_ref as er

#: (Nq_s, Nk_s) per sequence: Nq < Nk (a continued prefill), Nq > Nk, equal, empty ones.
SEQS = [(3, 5), (4, 4), (0, 3), (5, 2), (2, 0), (1, 6), (0, 0)]


@pytest.fixture
def deterministic(backend):
    """The numba engine's fused kernels pick the float32 filter or the float64 product per
    chunk from what the chunks its worker threads finished first found, which moves
    results by an ulp from run to run; with one thread the order is fixed, so two calls
    on the same sequence are bit-identical (what these tests compare)."""
    if backend != "numba":
        yield backend
        return
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield backend
    finally:
        numba.set_num_threads(before)


def packed(seed, seqs=SEQS, *, Hq=4, Hkv=2, D=3, Dv=2, spread=1.5):
    rng = np.random.default_rng(seed)
    cq = np.concatenate([[0], np.cumsum([a for a, _ in seqs])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum([b for _, b in seqs])]).astype(np.int64)
    q = spread * rng.standard_normal((cq[-1], Hq, D))
    k = spread * rng.standard_normal((ck[-1], Hkv, D))
    v = rng.standard_normal((ck[-1], Hkv, Dv))
    return rng, q, k, v, cq, ck


def unpack(x, i0, i1):
    return np.ascontiguousarray(x[i0:i1].transpose(1, 0, 2)[None])


def per_head_token(name, rng, total_q, Hq):
    """ASEntmax parameters: varlen shape and the (1, Hq, Nq_s) slicer for one sequence."""
    if name == "head":
        beta, gamma = rng.uniform(0.3, 1.0, Hq), rng.uniform(-1, 1, Hq)
    else:
        beta, gamma = rng.uniform(0.3, 1.0, (total_q, Hq)), rng.uniform(-1, 1, (total_q, Hq))
    return beta, gamma


CONFIGS = {
    "plain": dict(alpha=1.5),
    "causal_alibi": dict(alpha=2.0, causal=True, alibi_slopes=[0.5, 0.25, 0.0, 0.1]),
    "softmax_causal": dict(alpha=1.0, causal=True),
    "alpha_per_head": dict(alpha=np.array([1.0, 1.25, 2.0, 3.0]), causal=True),
    "asentmax_head": dict(alpha=1.5, causal=True, scaling="head"),
    "asentmax_token": dict(alpha=1.25, causal=False, scaling="token", alibi_slopes=[0.1, 0.0, 0.3, 0.0]),
}


def _kwargs(cfg, rng, total_q, Hq):
    kw = dict(cfg)
    scaling = kw.pop("scaling", None)
    if scaling is not None:
        kw["beta"], kw["gamma"] = per_head_token(scaling, rng, total_q, Hq)
        kw["delta"] = np.array(0.9)
    return kw


def _seq_kwargs(kw, q0, q1):
    """The per-sequence er.attention keywords: ASEntmax parameters of shape (Hq,) become
    (1, Hq, 1), those of shape (total_q, Hq) the sequence's (1, Hq, Nq_s)."""
    out = dict(kw)
    for name in ("beta", "gamma"):
        if name in kw:
            out[name] = kw[name][q0:q1].T[None] if np.ndim(kw[name]) == 2 else kw[name][None, :, None]
    return out


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_forward_equals_per_sequence_calls(deterministic, cfg):
    backend = deterministic
    rng, q, k, v, cq, ck = packed(3)
    kw = _kwargs(CONFIGS[cfg], rng, len(q), 4)
    out, info = er.attention_varlen(q, k, v, cq, ck, return_info=True, backend=backend, **kw)
    assert out.shape == (len(q), 4, 2) and info.tau.shape == (len(q), 4) and info.skew.shape == (len(q), 4, 2)
    for (q0, q1), (k0, k1) in zip(zip(cq[:-1], cq[1:]), zip(ck[:-1], ck[1:])):
        if q1 == q0:
            continue
        o_s, i_s = er.attention(unpack(q, q0, q1), unpack(k, k0, k1), unpack(v, k0, k1), return_info=True,
                                backend=backend, **_seq_kwargs(kw, q0, q1))
        np.testing.assert_array_equal(out[q0:q1], o_s[0].transpose(1, 0, 2))
        for name in ("tau", "support", "s", "n", "theta", "row_max", "edge", "edge_p"):
            np.testing.assert_array_equal(getattr(info, name)[q0:q1], getattr(i_s, name)[0].T, err_msg=name)
        np.testing.assert_array_equal(info.alpha, i_s.alpha)
        np.testing.assert_array_equal(info.skew[q0:q1], i_s.skew[0].transpose(1, 0, 2))
        if k1 == k0:  # a sequence without keys: zero output, -inf threshold
            assert np.all(out[q0:q1] == 0) and np.all(np.isneginf(info.tau[q0:q1]))


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("path", ["recompute", "tau", "info"])
def test_vjp_equals_per_sequence_calls(deterministic, cfg, path):
    backend = deterministic
    rng, q, k, v, cq, ck = packed(5)
    kw = _kwargs(CONFIGS[cfg], rng, len(q), 4)
    g_out = rng.standard_normal((len(q), 4, 2))
    extra = {}
    if path != "recompute":
        out, info = er.attention_varlen(q, k, v, cq, ck, return_info=True, backend=backend, **kw)
        extra = dict(out=out, tau=info.tau) if path == "tau" else dict(info=info)
    grads = er.attention_varlen_vjp(g_out, q, k, v, cq, ck, backend=backend, **kw, **extra)
    assert grads.dq.shape == q.shape and grads.dk.shape == k.shape and grads.dv.shape == v.shape
    ref = {"beta": np.zeros(np.shape(kw.get("beta", 0.0))), "gamma": np.zeros(np.shape(kw.get("gamma", 0.0))),
           "delta": np.zeros(())}
    dalpha = 0.0
    for (q0, q1), (k0, k1) in zip(zip(cq[:-1], cq[1:]), zip(ck[:-1], ck[1:])):
        if q1 == q0:
            assert np.all(grads.dk[k0:k1] == 0) and np.all(grads.dv[k0:k1] == 0)  # keys nobody queries
            continue
        sk = {}
        if path == "tau":
            sk = dict(out=unpack(extra["out"], q0, q1), tau=extra["tau"][q0:q1].T[None])
        elif path == "info":  # the sequence's own forward info: the packed one holds exactly it
            _, sk["info"] = er.attention(unpack(q, q0, q1), unpack(k, k0, k1), unpack(v, k0, k1), return_info=True,
                                         backend=backend, **_seq_kwargs(kw, q0, q1))
        g = er.attention_vjp(unpack(g_out, q0, q1), unpack(q, q0, q1), unpack(k, k0, k1), unpack(v, k0, k1),
                             backend=backend, **_seq_kwargs(kw, q0, q1), **sk)
        np.testing.assert_array_equal(grads.dq[q0:q1], g.dq[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(grads.dk[k0:k1], g.dk[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(grads.dv[k0:k1], g.dv[0].transpose(1, 0, 2))
        if "beta" in kw:
            for name, part in zip(("beta", "gamma"), g[3:5]):
                if ref[name].ndim == 2:  # per token and head: this sequence's rows
                    ref[name][q0:q1] = part[0].T
                else:  # per head: summed over the sequences
                    ref[name] += part.reshape(-1)
            ref["delta"] += g.ddelta
        if g.dalpha is not None:
            dalpha = dalpha + g.dalpha
    if "beta" in kw:
        for name in ("beta", "gamma", "delta"):
            got = getattr(grads, "d" + name)
            assert got.shape == np.shape(kw[name]), name
            np.testing.assert_allclose(got, ref[name], rtol=8 * EPS, atol=0, err_msg=name)
    else:
        assert grads.dbeta is None
    if isinstance(kw["alpha"], np.ndarray):
        assert grads.dalpha.shape == (4,)
        np.testing.assert_allclose(grads.dalpha, dalpha, rtol=8 * EPS, atol=0)
    else:
        assert grads.dalpha is None


@pytest.mark.parametrize("alpha", [1.0, 1.5, 3.0])
def test_equals_left_padded_batch_with_key_padding_mask(backend, alpha):
    """Independent of the per-sequence loop: pad every sequence on the left to (Nq, Nk),
    mask the padded keys; each sequence's rows agree with the packed call to the dense
    formula's rounding bound, gradients included."""
    seqs = [(3, 5), (4, 4), (5, 2), (1, 6)]
    rng, q, k, v, cq, ck = packed(7, seqs)
    kw = dict(alpha=alpha, causal=True, alibi_slopes=[0.5, 0.25, 0.0, 0.1])
    B, Nq, Nk = len(seqs), max(a for a, _ in seqs), max(b for _, b in seqs)
    qp, kp, vp = np.zeros((B, 4, Nq, 3)), np.zeros((B, 2, Nk, 3)), np.zeros((B, 2, Nk, 2))
    g_out = rng.standard_normal((len(q), 4, 2))
    gp = np.zeros((B, 4, Nq, 2))
    mask = np.zeros((B, Nk), bool)
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(zip(cq[:-1], cq[1:]), zip(ck[:-1], ck[1:]))):
        qp[b, :, Nq - (q1 - q0):] = q[q0:q1].transpose(1, 0, 2)
        gp[b, :, Nq - (q1 - q0):] = g_out[q0:q1].transpose(1, 0, 2)
        kp[b, :, Nk - (k1 - k0):] = k[k0:k1].transpose(1, 0, 2)
        vp[b, :, Nk - (k1 - k0):] = v[k0:k1].transpose(1, 0, 2)
        mask[b, Nk - (k1 - k0):] = True
    out = er.attention_varlen(q, k, v, cq, ck, backend=backend, **kw)
    grads = er.attention_varlen_vjp(g_out, q, k, v, cq, ck, backend=backend, **kw)
    out_p = er.attention(qp, kp, vp, key_padding_mask=mask, backend=backend, **kw)
    g_p = er.attention_vjp(gp, qp, kp, vp, key_padding_mask=mask, backend=backend, **kw)
    vis = visibility(B, Nq, Nk, causal=True, key_padding_mask=mask)
    d = dense(qp, kp, vp, alpha=np.full(4, alpha), visible=vis, alibi_slopes=kw["alibi_slopes"])
    tol = out_tol(d, vp, alpha, np.float64)
    tq, tk, tv = grad_tols(d, qp, kp, vp, gp, alpha)[:3]
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(zip(cq[:-1], cq[1:]), zip(ck[:-1], ck[1:]))):
        rows = slice(Nq - (q1 - q0), Nq)
        keys = slice(Nk - (k1 - k0), Nk)
        np.testing.assert_allclose(out[q0:q1], out_p[b, :, rows].transpose(1, 0, 2), rtol=0, atol=tol)
        np.testing.assert_allclose(grads.dq[q0:q1], g_p.dq[b, :, rows].transpose(1, 0, 2), rtol=0, atol=tq)
        np.testing.assert_allclose(grads.dk[k0:k1], g_p.dk[b, :, keys].transpose(1, 0, 2), rtol=0, atol=tk)
        np.testing.assert_allclose(grads.dv[k0:k1], g_p.dv[b, :, keys].transpose(1, 0, 2), rtol=0, atol=tv)


def test_float32_and_single_sequence(deterministic):
    backend = deterministic
    rng, q, k, v, cq, ck = packed(9, [(6, 6)])
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out = er.attention_varlen(q32, k32, v32, cq, ck, causal=True, backend=backend)
    assert out.dtype == np.float32
    ref = er.attention(unpack(q32, 0, 6), unpack(k32, 0, 6), unpack(v32, 0, 6), causal=True, backend=backend)
    np.testing.assert_array_equal(out, ref[0].transpose(1, 0, 2))


def test_inputs_not_modified(backend):
    rng, q, k, v, cq, ck = packed(11)
    g_out = rng.standard_normal((len(q), 4, 2))
    copies = [a.copy() for a in (q, k, v, cq, ck, g_out)]
    er.attention_varlen_vjp(g_out, q, k, v, cq, ck, causal=True, alpha=np.array([1.0, 1.5, 2.0, 2.0]),
                            backend=backend)
    for a, c in zip((q, k, v, cq, ck, g_out), copies):
        np.testing.assert_array_equal(a, c)


def test_bad_input_names_argument_and_expected_shape():
    rng, q, k, v, cq, ck = packed(13, [(3, 4), (2, 2)])
    with pytest.raises(ValueError, match=r"cu_seqlens_q must end at total_q \(q.shape\[0\]\) = 5, got 4"):
        er.attention_varlen(q, k, v, np.array([0, 3, 4]), ck)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be non-decreasing, got 4 then 2"):
        er.attention_varlen(q, k, v, cq, np.array([0, 4, 2, 6]))
    with pytest.raises(ValueError, match=r"cu_seqlens_q must start at 0"):
        er.attention_varlen(q, k, v, np.array([1, 3, 5]), ck)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be a 1-D array of shape \(num_sequences \+ 1,\)"):
        er.attention_varlen(q, k, v, cq, ck[None])
    with pytest.raises(ValueError, match=r"cu_seqlens_q must hold integers"):
        er.attention_varlen(q, k, v, cq.astype(float), ck)
    with pytest.raises(ValueError, match=r"must have the same shape \(num_sequences \+ 1,\)"):
        er.attention_varlen(q, k, v, np.array([0, 5]), ck)
    with pytest.raises(ValueError, match=r"q must have 3 dimensions \(total_q, Hq, D\)"):
        er.attention_varlen(q[None], k, v, cq, ck)
    with pytest.raises(ValueError, match=r"alpha must be a scalar or one value per query head, shape \(\) or \(4,\)"):
        er.attention_varlen(q, k, v, cq, ck, alpha=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match=r"alibi_slopes must have one slope per query head, shape \(4,\)"):
        er.attention_varlen(q, k, v, cq, ck, alibi_slopes=[0.1, 0.2])
    with pytest.raises(ValueError, match=r"beta \(3,\), gamma \(3,\).*row shape \(5, 4\)"):
        er.attention_varlen(q, k, v, cq, ck, beta=np.ones(3), gamma=np.ones(3))
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape \(5, 4, 2\)"):
        er.attention_varlen_vjp(np.ones((5, 4, 3)), q, k, v, cq, ck)
    with pytest.raises(ValueError, match=r"tau must have shape \(5, 4\)"):
        er.attention_varlen_vjp(np.ones((5, 4, 2)), q, k, v, cq, ck, tau=np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"query heads"):
        er.attention_varlen(q[:, :3], k, v, cq, ck)
    g_out = np.ones((5, 4, 2))
    _, info = er.attention_varlen(q, k, v, cq, ck, alpha=3.0, return_info=True)
    with pytest.raises(ValueError, match=r"info.tau must have shape \(4, 4\)"):
        er.attention_varlen_vjp(g_out[:4], q[:4], k, v, np.array([0, 3, 4]), ck, info=info, alpha=3.0)
    with pytest.raises(ValueError, match="not both"):
        er.attention_varlen_vjp(g_out, q, k, v, cq, ck, info=info, tau=info.tau, alpha=3.0)
    with pytest.raises(ValueError, match="alpha=3.0"):
        er.attention_varlen_vjp(g_out, q, k, v, cq, ck, info=info, alpha=1.5)
    with pytest.raises(TypeError, match="AttentionInfo"):
        er.attention_varlen_vjp(g_out, q, k, v, cq, ck, info=info.tau, alpha=3.0)


@pytest.mark.parametrize("cfg", ["plain", "alpha_per_head", "asentmax_token"])
def test_check_finite_off_is_bit_identical_on_clean_input(deterministic, cfg):
    """check_finite reaches every sequence's er.attention call and decides only whether
    q, k, v (and grad_out) are scanned: on clean input the same bits, forward and backward."""
    import dataclasses

    backend = deterministic
    rng, q, k, v, cq, ck = packed(7)
    kw = _kwargs(CONFIGS[cfg], rng, len(q), 4)
    out, info = er.attention_varlen(q, k, v, cq, ck, return_info=True, backend=backend, **kw)
    out2, info2 = er.attention_varlen(q, k, v, cq, ck, return_info=True, backend=backend, check_finite=False, **kw)
    np.testing.assert_array_equal(out, out2)
    for f in dataclasses.fields(er.AttentionInfo):
        a, b_ = getattr(info, f.name), getattr(info2, f.name)
        assert (a is None) == (b_ is None), f.name
        if a is not None:
            np.testing.assert_array_equal(a, b_, err_msg=f.name)
    g_out = rng.standard_normal((len(q), 4, 2))
    g = er.attention_varlen_vjp(g_out, q, k, v, cq, ck, info=info, backend=backend, **kw)
    g2 = er.attention_varlen_vjp(g_out, q, k, v, cq, ck, info=info2, backend=backend, check_finite=False, **kw)
    for name, a, b_ in zip(g._fields, g, g2):
        assert (a is None) == (b_ is None), name
        if a is not None:
            np.testing.assert_array_equal(a, b_, err_msg=name)


@pytest.mark.parametrize("where", ["q", "k", "v", "grad_out"])
def test_check_finite_on_and_off_with_a_nan(backend, where):
    """A NaN in sequence 1 (queries 3..6, keys 5..8): checked, the ValueError naming the
    array and the entry's position in the packed array; unchecked, the overflow error for
    q and k, non-finite results for v and grad_out."""
    rng, q, k, v, cq, ck = packed(8)
    g_out = rng.standard_normal((len(q), 4, 2))
    arrs = dict(q=q, k=k, v=v, grad_out=g_out)
    row = {"q": 4, "k": 6, "v": 6, "grad_out": 4}[where]
    arrs[where][row, 1, 0] = np.nan
    q, k, v, g_out = arrs["q"], arrs["k"], arrs["v"], arrs["grad_out"]
    named = rf"{where} contains 1 NaN or infinite value; the first is {where}\[{row}, 1, 0\] = "
    if where != "grad_out":
        with pytest.raises(ValueError, match=named):
            er.attention_varlen(q, k, v, cq, ck, backend=backend)
    with pytest.raises(ValueError, match=named):
        er.attention_varlen_vjp(g_out, q, k, v, cq, ck, backend=backend)
    if where in ("q", "k"):
        with pytest.raises(ValueError, match="attention scores overflowed"):
            er.attention_varlen(q, k, v, cq, ck, backend=backend, check_finite=False)
        with pytest.raises(ValueError, match="attention scores overflowed"):
            er.attention_varlen_vjp(g_out, q, k, v, cq, ck, backend=backend, check_finite=False)
        return
    out = er.attention_varlen(q, k, v, cq, ck, backend=backend, check_finite=False)
    g = er.attention_varlen_vjp(g_out, q, k, v, cq, ck, backend=backend, check_finite=False)
    if where == "v":  # key 6's value reaches the outputs of the sequence's rows that hold it
        assert not np.isfinite(out[3:7]).all() and np.isfinite(np.delete(out, np.s_[3:7], axis=0)).all()
    assert not np.isfinite(g.dv[5:9]).all() if where == "grad_out" else not np.isfinite(g.dq[3:7]).all()
    for a in (g.dq, g.dk, g.dv):  # the other sequences never see it
        assert np.isfinite(np.delete(a, np.s_[3:7] if a is g.dq else np.s_[5:9], axis=0)).all()


def test_check_finite_names_packed_positions_of_the_keys_read():
    """The keys of a sequence without queries are never read; a bad key elsewhere is named
    by its packed row, not by its row among the keys that are read."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((5, 2, 3)), rng.standard_normal((9, 1, 3)), rng.standard_normal((9, 1, 2))
    cq, ck = np.array([0, 0, 5]), np.array([0, 4, 9])  # sequence 0: keys 0..3, no queries
    k[1, 0, 0] = np.nan  # never read
    out = er.attention_varlen(q, k, v, cq, ck, backend="numpy")
    assert np.isfinite(out).all()
    k[7, 0, 2] = np.inf
    v[6, 0, 1] = -np.inf
    with pytest.raises(ValueError, match=r"k contains 1 NaN or infinite value; the first is k\[7, 0, 2\] = "):
        er.attention_varlen(q, k, v, cq, ck, backend="numpy")
    with pytest.raises(ValueError, match=r"v contains 1 NaN or infinite value; the first is v\[6, 0, 1\] = "):
        er.attention_varlen_vjp(np.ones((5, 2, 2)), q, np.where(np.isinf(k), 0.0, k), v, cq, ck, backend="numpy")
