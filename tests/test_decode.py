"""The numba backend's decoding path (few queries over a long key cache, split over the keys).

:mod:`entmax_ref.backends.numba.decode` is taken from ``DECODE_MIN_KEYS`` keys on; here
that threshold is lowered so that small problems take it, and every problem is checked
against the dense formula (the tolerances of tests/test_attention.py), against the
chunked forward (the path it replaces) and, through ``attention_vjp(info=)``, for the
residual it leaves to the backward.  The cases cover what the path supports (causal,
key_lengths, ALiBi, ASEntmax scales, grouped heads, alpha per head, one-run key masks),
the cases it hands back to the chunked forward (a softmax head, key masks with holes), the
float32 filter's fallback on suspect rows, candidate buffers that grow, several key
blocks and threads, and the overflow error.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import entmax_ref as er
from test_attention import check_against_dense, grad_tols
from test_attention import problem as _problem

pytestmark = pytest.mark.numba

dec = pytest.importorskip("entmax_ref.backends.numba.decode")


def problem(*args, dtype=np.float32, **kw):
    """The attention tests' problems in float32: float64 attention runs the NumPy
    reference's driver on the numba engine, never the decoding path."""
    return _problem(*args, dtype=dtype, **kw)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls that take the decoding path, at its real thresholds."""
    calls = []
    real = dec.decode_forward

    def wrapped(*a):
        calls.append(a[0].shape)
        return real(*a)

    monkeypatch.setattr(dec, "decode_forward", wrapped)
    return calls


@pytest.fixture
def taken(monkeypatch, spy):
    """Small problems take the decoding path; ``taken`` counts the calls that did."""
    monkeypatch.setattr(dec, "DECODE_MIN_KEYS", 16)
    return spy


@pytest.fixture(params=[(1, 8192), (2, 64)], ids=["1thread", "2threads-blocks"])
def threads(request, monkeypatch):
    n, block = request.param
    monkeypatch.setattr(dec, "KEY_BLOCK", block)  # small blocks (one a kv-head here: 4 kv-heads, 2 threads)
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    yield n
    numba.set_num_threads(before)


def _chunked(monkeypatch, fn):
    """``fn()`` with the decoding path off (the chunked forward)."""
    with monkeypatch.context() as m:
        m.setattr(dec, "DECODE_MIN_KEYS", 1 << 62)
        return fn()


def _same_forward(a, b):
    out_a, info_a = a
    out_b, info_b = b
    assert np.array_equal(info_a.support, info_b.support)
    assert np.array_equal(info_a.support_keys, info_b.support_keys)  # the backward's residual
    np.testing.assert_array_equal(info_a.tau, info_b.tau)
    np.testing.assert_array_equal(out_a, out_b)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_decode_forward_and_backward(taken, threads, monkeypatch, alpha, nq, causal):
    rng, q, k, v = problem(int(alpha * 10) + 3 * nq + causal, B=2, Hq=4, Hkv=2, Nq=nq, Nk=300, D=5, Dv=3,
                           spread=2.5)
    beta, gamma = rng.uniform(0.2, 1.0, (4, 1)), rng.uniform(-1.0, 1.0, (4, 1))
    kw = dict(causal=causal, key_lengths=[300, 211], alibi_slopes=[0.25, 0.0, 0.125, 0.0], beta=beta, gamma=gamma)
    out, info, d = check_against_dense("numba", q, k, v, alpha, **kw)
    assert taken and info.support[info.n > 0].mean() < 0.5 * info.n[info.n > 0].mean()  # sparse rows
    ref = _chunked(monkeypatch, lambda: er.attention(q, k, v, alpha=alpha, return_info=True, backend="numba", **kw))
    _same_forward((out, info), ref)
    g_out = rng.standard_normal(out.shape)
    tols = grad_tols(d, q, k, v, g_out, alpha, beta=beta, gamma=gamma)
    g_ref = er.attention_vjp(g_out, q, k, v, alpha=alpha, backend="numpy", **kw)
    g = er.attention_vjp(g_out, q, k, v, alpha=alpha, info=info, backend="numba", **kw)
    g_chunked = er.attention_vjp(g_out, q, k, v, alpha=alpha, info=ref[1], backend="numba", **kw)
    for name, a, b_, c_, t in zip(("dq", "dk", "dv", "dbeta", "dgamma", "ddelta"), g, g_ref, g_chunked, tols):
        np.testing.assert_allclose(a, b_, rtol=0, atol=t, err_msg=name)
        np.testing.assert_array_equal(a, c_, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32], ids=["f32"])
def test_decode_dtypes_against_numpy(taken, dtype):
    """float32 inputs are computed in float64 from their float32 values and rounded once:
    the same support as the NumPy reference on the float64 copies."""
    rng, q, k, v = problem(7, B=1, Hq=8, Hkv=8, Nq=1, Nk=3000, D=16, Dv=8, dtype=dtype, spread=1.5)
    out, info = er.attention(q, k, v, alpha=1.5, return_info=True, backend="numba")
    up = [a.astype(np.float64) for a in (q, k, v)]
    out64, info64 = er.attention(*up, alpha=1.5, return_info=True, backend="numpy")
    assert taken and out.dtype == dtype
    assert np.array_equal(info.support, info64.support)
    tol = 8 * float(np.finfo(dtype).eps) * np.abs(out64).max() + 1e-13
    np.testing.assert_allclose(out, out64, rtol=0, atol=tol)


def test_decode_alpha_per_head_and_gqa(taken, monkeypatch):
    rng, q, k, v = problem(11, B=2, Hq=4, Hkv=2, Nq=2, Nk=400, D=4, Dv=3, spread=2.5)
    alpha = np.array([1.5, 3.0, 1.25, 2.0])
    kw = dict(alpha=alpha, causal=True, key_lengths=[400, 123])
    out, info = er.attention(q, k, v, return_info=True, backend="numba", **kw)
    assert taken
    ref_np = er.attention(q, k, v, return_info=True, backend="numpy", **kw)
    assert np.array_equal(info.support, ref_np[1].support)
    np.testing.assert_allclose(out, ref_np[0], rtol=0, atol=1e-12)
    _same_forward((out, info), _chunked(monkeypatch, lambda: er.attention(q, k, v, return_info=True,
                                                                          backend="numba", **kw)))
    g_out = rng.standard_normal(out.shape)
    g = er.attention_vjp(g_out, q, k, v, info=info, backend="numba", **kw)
    g_np = er.attention_vjp(g_out, q, k, v, backend="numpy", **kw)
    for a, b_ in zip(g[:3], g_np[:3]):
        np.testing.assert_allclose(a, b_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(g.dalpha, g_np.dalpha, rtol=0, atol=1e-10)


def test_decode_routes_softmax_heads_and_holes_to_the_chunked_forward(taken):
    rng, q, k, v = problem(12, B=2, Hq=2, Hkv=1, Nq=1, Nk=200, D=4, Dv=3)
    for alpha in (np.array([1.0, 1.5]), 1.0):
        out = er.attention(q, k, v, alpha=alpha, backend="numba")
        np.testing.assert_allclose(out, er.attention(q, k, v, alpha=alpha, backend="numpy"), rtol=0, atol=1e-12)
    assert not taken
    holes = np.ones((2, 200), bool)
    holes[0, 50:60] = False
    out = er.attention(q, k, v, key_padding_mask=holes, backend="numba")
    np.testing.assert_allclose(out, er.attention(q, k, v, key_padding_mask=holes, backend="numpy"),
                               rtol=0, atol=1e-12)
    assert not taken
    run = np.zeros((2, 200), bool)
    run[0, 20:180] = True
    run[1, :77] = True
    out, info = er.attention(q, k, v, key_padding_mask=run, return_info=True, backend="numba")
    assert len(taken) == 2  # one key-sliced problem per batch
    ref = er.attention(q, k, v, key_padding_mask=run, return_info=True, backend="numpy")
    assert np.array_equal(info.support, ref[1].support)
    np.testing.assert_allclose(out, ref[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("hkv", [1, 4], ids=["blocks", "fused"])
def test_decode_key_blocks_and_fused_heads(taken, monkeypatch, hkv):
    """Fewer kv-heads than twice the threads: each kv-head's keys are split into several
    blocks, and phase 2 waits for all of them (two rounds of the threads).  As many or
    more: a kv-head is one block and its rows follow its scan in the same work item (one
    round).  Both give the dense formula's results and the chunked forward's bits."""
    monkeypatch.setattr(dec, "KEY_BLOCK", 64)
    rounds = []
    real = dec.run_parallel

    def counted(items, work, workers, cost=None):
        rounds.append(len(items))
        return real(items, work, workers, cost)

    monkeypatch.setattr(dec, "run_parallel", counted)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        rng, q, k, v = problem(30 + hkv, B=1, Hq=4, Hkv=hkv, Nq=1, Nk=700, D=4, Dv=3, spread=2.5)
        out, info, _ = check_against_dense("numba", q, k, v, 1.5, causal=True, key_lengths=[650])
        assert taken
        if hkv == 1:
            assert len(rounds) == 2 and rounds[0] > hkv  # several blocks, then the rows
        else:
            assert rounds == [hkv]  # one block a kv-head, its rows in the same item
        ref = _chunked(monkeypatch, lambda: er.attention(q, k, v, alpha=1.5, return_info=True, backend="numba",
                                                         causal=True, key_lengths=[650]))
        _same_forward((out, info), ref)
    finally:
        numba.set_num_threads(before)


def test_decode_many_candidates_and_suspect_rows(taken):
    """A zero query ties every key (all 6,000 are candidates); keys whose float32 product
    overflows send their rows the exact way."""
    rng, q, k, v = problem(13, B=1, Hq=3, Hkv=1, Nq=1, Nk=6000, D=4, Dv=2)
    q[0, 0] = 0.0
    k[0, 0, 17] = 1e30  # q . k overflows float32 (and stays finite in float64)
    q[0, 1] = 1e10 * np.sign(q[0, 1])
    out, info = er.attention(q, k, v, alpha=1.5, return_info=True, backend="numba")
    ref = er.attention(q, k, v, alpha=1.5, return_info=True, backend="numpy")
    assert taken and info.support[0, 0, 0] == 6000
    assert np.array_equal(info.support, ref[1].support)
    np.testing.assert_allclose(out, ref[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(info.tau, ref[1].tau, rtol=1e-15, atol=0)


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_decode_scans_k_and_v_itself(taken, where, bad):
    """The decoding path reads every entry of k and v, so the public layer leaves their
    NaN/inf scan to it: the same error, naming the entry (a value off the support too)."""
    rng, q, k, v = problem(15, B=1, Hq=2, Hkv=1, Nq=1, Nk=500, D=3, Dv=2)
    arr = k if where == "k" else v
    arr[0, 0, 321, 1] = bad
    what = "NaN" if np.isnan(bad) else "NaN or infinite"
    with pytest.raises(ValueError, match=rf"{where} contains 1 .*{where}\[0, 0, 321, 1\]") as exc:
        er.attention(q, k, v, backend="numba")
    assert what.split()[0] in str(exc.value)
    assert taken  # the decoding path found it


def test_decode_degenerate_shapes_still_scan_k_and_v(taken):
    """No query rows (the public layer's exact empty answer, no engine call): k and v are
    scanned by the public layer."""
    rng, q, k, v = problem(17, B=1, Hq=2, Hkv=1, Nq=1, Nk=300, D=3, Dv=2)
    k[0, 0, 5, 0] = np.nan
    with pytest.raises(ValueError, match=r"k contains 1 NaN"):
        er.attention(q[:, :, :0], k, v, backend="numba")
    assert not taken


# --------------------------------------------------------------------------- check_finite=False
def _same_residual(a, b):
    _same_forward(a, b)
    for name in ("skew", "row_max", "edge", "edge_p", "theta"):
        np.testing.assert_array_equal(getattr(a[1], name), getattr(b[1], name), err_msg=name)


@pytest.mark.parametrize("nq,nk", [(1, 2048), (4, 2048), (16, 8192)])
@pytest.mark.parametrize("dtype", [np.float32], ids=["f32"])
def test_decode_check_finite_off_is_bit_identical_on_clean_input(spy, nq, nk, dtype):
    """At the path's real thresholds (Nq <= 16, 2048 keys per 4 queries): skipping the
    scan of V changes no bit of the output, the residual or the gradients."""
    rng, q, k, v = problem(20 + nq, B=1, Hq=2, Hkv=1, Nq=nq, Nk=nk, D=8, Dv=4, dtype=dtype, spread=2.0)
    kw = dict(alpha=1.5, causal=True, backend="numba")
    on = er.attention(q, k, v, return_info=True, **kw)
    off = er.attention(q, k, v, return_info=True, check_finite=False, **kw)
    assert len(spy) == 2  # both took the decoding path
    _same_residual(on, off)
    g_out = rng.standard_normal(on[0].shape).astype(dtype)
    g = er.attention_vjp(g_out, q, k, v, info=on[1], **kw)
    g2 = er.attention_vjp(g_out, q, k, v, info=off[1], check_finite=False, **kw)
    for name, a, b_ in zip(("dq", "dk", "dv"), g, g2):
        np.testing.assert_array_equal(a, b_, err_msg=name)


@pytest.mark.parametrize("alpha", [1.5, 3.0])
def test_decode_output_only_forward_keeps_no_residual(taken, monkeypatch, alpha):
    """Without ``return_info`` the decoding path forms neither the skewed output nor the
    support keys (returned as None), and its output is bit for bit that of the call that
    keeps them."""
    seen = []
    real = dec.decode_forward

    def wrapped(q, k, v, spec):
        seen.append(real(q, k, v, spec))
        return seen[-1]

    monkeypatch.setattr(dec, "decode_forward", wrapped)
    rng, q, k, v = problem(41, B=2, Hq=4, Hkv=2, Nq=3, Nk=700, D=8, Dv=4, spread=2.0)
    kw = dict(alpha=alpha, causal=True, backend="numba")
    out = er.attention(q, k, v, **kw)
    kept, info = er.attention(q, k, v, return_info=True, **kw)
    assert len(seen) == 2
    assert seen[0].skew is None and seen[0].support_keys is None
    assert seen[1].skew is not None and seen[1].support_keys is not None
    assert np.array_equal(out, kept)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_decode_check_finite_off_reads_v_on_the_support_only(taken, monkeypatch, bad):
    """Without the scan the decoding path reads V only on each row's support (and the
    public layer does not ask the backend to scan): a NaN/inf in every entry of v off
    every row's support leaves the output and info the clean run's bits; one at a key in
    the support of some rows makes exactly those rows non-finite, the others clean."""
    from dataclasses import replace

    from entmax_ref.backends.numba_backend import NumbaBackend

    asked = []
    hook = NumbaBackend.attention_scans_inputs
    monkeypatch.setattr(NumbaBackend, "attention_scans_inputs",
                        lambda self, *a: asked.append(a[3].check_finite) or hook(self, *a))
    rng, q, k, v = problem(18, B=1, Hq=4, Hkv=2, Nq=2, Nk=3000, D=4, Dv=3, spread=2.5)
    kw = dict(alpha=1.5, backend="numba")
    out, info = er.attention(q, k, v, return_info=True, **kw)
    assert asked == [True] and len(taken) == 1
    keys = info.support_keys[0]  # (Hq, Nq, W): every row's support, listed
    assert np.all(keys[..., 0] >= 0)
    held = np.zeros((2, 3000), bool)  # per kv-head: a key some row's support holds
    for hk in range(2):
        kk = keys[2 * hk:2 * hk + 2]
        held[hk, kk[kk >= 0]] = True
    assert held.sum() < 0.1 * held.size
    vb = v.copy()
    vb[0][~held] = bad
    off = er.attention(q, k, vb, return_info=True, check_finite=False, **kw)
    assert asked == [True] and len(taken) == 2  # not asked again; decoded
    _same_residual((out, info), off)
    with pytest.raises(ValueError, match=r"v contains \d+ NaN or infinite values"):
        er.attention(q, k, vb, **kw)  # checked: named, as before
    spec = replace(_spec_of(q), check_finite=False)
    assert not dec.scans_inputs(q, k, v, spec) and dec.scans_inputs(q, k, v, replace(spec, check_finite=True))
    j = int(keys[1, 1, 0])  # a key of kv-head 0 in the support of query head 1's row 1
    vb = v.copy()
    vb[0, 0, j, 2] = bad
    out3 = er.attention(q, k, vb, check_finite=False, **kw)
    holds = np.zeros((4, 2), bool)
    holds[:2] = (keys[:2] == j).any(-1)
    assert holds[1, 1] and not holds.all()
    assert np.array_equal(~np.isfinite(out3[0]).all(-1), holds)
    np.testing.assert_array_equal(out3[0][~holds], out[0][~holds])


def _spec_of(q):
    from entmax_ref.backends._base import AttentionSpec

    return AttentionSpec(alpha=1.5, scale=1.0 / np.sqrt(q.shape[3]))


@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_decode_check_finite_off_nonfinite_q_or_k_is_the_overflow_error(taken, where, bad):
    """Unscanned, K is still read for the scores: a NaN/inf in k (or q) makes its rows
    suspect, the exact pass finds the non-finite score and raises the overflow error."""
    rng, q, k, v = problem(19, B=1, Hq=2, Hkv=1, Nq=1, Nk=500, D=3, Dv=2)
    arr = q if where == "q" else k
    arr[0, 0, 0 if where == "q" else 321, 1] = bad
    with pytest.raises(ValueError, match="attention scores overflowed"):
        er.attention(q, k, v, backend="numba", check_finite=False)
    assert taken
