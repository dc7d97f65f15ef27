"""The numba attention kernels' own code paths, against the dense formula.

tests/test_attention.py runs every attention test on the numba backend too; its problems
are small, so each backward chunk there is dense (the BLAS path) and runs on one worker.
Here longer rows with sparse supports, several chunks and several workers exercise the
support-only scatter, the dense fallback, the per-worker and the shared (in chunk order)
dK/dV accumulators, the float32 score filter (kept throughout) against float64 score
products, the error path from a worker thread, with the tolerances of
tests/test_attention.py, and results that do not change from run to run.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numba
import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.backends.numba import paths as engine
from test_attention import check_against_dense, dense, grad_tols
from test_attention import problem as _problem
from helper_entry import entry

pytestmark = pytest.mark.numba


def problem(*args, dtype=np.float32, **kw):
    """The attention tests' problems in float32: the fused kernels' inputs (float64
    attention runs the NumPy reference's driver on the numba engine)."""
    return _problem(*args, dtype=dtype, **kw)


nattn = pytest.importorskip("entmax_ref.backends.numba.attention")
nbwd = pytest.importorskip("entmax_ref.backends.numba.attention_backward")
nshared = pytest.importorskip("entmax_ref.backends.numba.attention_chunks")
nfilter = pytest.importorskip("entmax_ref.backends.numba.attention_filter")
nrows = pytest.importorskip("entmax_ref.backends.numba.attention_rows")


@pytest.fixture(params=["scatter", "dense", "shared"])
def path(request, monkeypatch):
    if request.param == "scatter":
        monkeypatch.setattr(nbwd, "DENSE_FRACTION", 2.0)
    elif request.param == "dense":
        monkeypatch.setattr(nbwd, "DENSE_FRACTION", -1.0)
    else:
        monkeypatch.setattr(nbwd, "ACCUMULATOR_BYTES", 0)
        monkeypatch.setattr(nbwd, "DENSE_FRACTION", 2.0)
    return request.param


@pytest.fixture(params=["filter", "float64"])
def scores(request, monkeypatch):
    """The float32 filter kept for every chunk, or float64 score products throughout."""
    monkeypatch.setattr(nshared, "FILTER_FRACTION", 2.0 if request.param == "filter" else 0.0)
    return request.param


@contextlib.contextmanager
def _threads(n):
    """Numba at ``n`` threads (at most its pool) inside the block."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    with _threads(request.param):
        yield request.param


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sparse_rows_forward_and_backward(path, scores, threads, alpha, causal):
    rng, q, k, v = problem(int(alpha * 40) + causal, B=2, Hq=4, Hkv=2, Nq=61, Nk=67, D=5, Dv=3, spread=2.5)
    beta, gamma = rng.uniform(0.2, 1.0, (4, 1)), rng.uniform(-1.0, 1.0, (4, 1))
    kw = dict(causal=causal, key_lengths=[67, 50], alibi_slopes=[0.25, 0.0, 0.125, 0.0], beta=beta, gamma=gamma)
    out, info, d = check_against_dense("numba", q, k, v, alpha, chunk=7, **kw)
    assert info.support[info.n > 0].mean() < 0.5 * info.n[info.n > 0].mean()  # sparse rows
    g_out = rng.standard_normal(out.shape)
    tols = grad_tols(d, q, k, v, g_out, alpha, beta=beta, gamma=gamma)
    g_ref = er.attention_vjp(g_out, q, k, v, alpha=alpha, chunk=7, backend="numpy", **kw)
    for with_out in (False, True):  # skew recomputed per chunk / from the forward
        extra = dict(out=out, tau=info.tau) if with_out else {}
        g = er.attention_vjp(g_out, q, k, v, alpha=alpha, chunk=7, backend="numba", **extra, **kw)
        for name, a, b_, t in zip(("dq", "dk", "dv", "dbeta", "dgamma", "ddelta"), g, g_ref, tols):
            np.testing.assert_allclose(a, b_, rtol=0, atol=t, err_msg=name)


def test_float32_sparse_rows(path, scores, threads):
    """float32 inputs: computed in float64 from their float32 values, rounded once."""
    rng, q, k, v = problem(5, B=1, Hq=2, Hkv=1, Nq=40, Nk=40, D=4, Dv=3, spread=2.5)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    g_out = rng.standard_normal((1, 2, 40, 3)).astype(np.float32)
    kw = dict(alpha=1.5, causal=True, chunk=6)
    out32, info32 = er.attention(q32, k32, v32, return_info=True, backend="numba", **kw)
    up = [a.astype(np.float64) for a in (q32, k32, v32)]
    out64, info64 = er.attention(*up, return_info=True, backend="numpy", **kw)
    assert out32.dtype == np.float32 and np.array_equal(info32.support, info64.support)
    d = dense(*up, alpha=1.5, causal=True)
    tol = float(np.finfo(np.float32).eps) * np.abs(out64).max() + 1e-13
    np.testing.assert_allclose(out32, out64, rtol=0, atol=tol)
    g32 = er.attention_vjp(g_out, q32, k32, v32, backend="numba", **kw)
    g64 = er.attention_vjp(g_out.astype(np.float64), *up, backend="numpy", **kw)
    tols = grad_tols(d, *up, g_out, 1.5)
    for a, b_, t in zip(g32[:3], g64[:3], tols):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b_, rtol=0, atol=float(np.finfo(np.float32).eps) * np.abs(b_).max() + t)


def test_overflow_in_a_worker_raises(scores, threads):
    _, q, k, v = problem(0, B=1, Hq=2, Hkv=1, Nq=30, Nk=30)
    q = q.copy()
    q[0, 1, 20] *= 1e20
    k = k * np.float32(1e20)  # float32: the scale takes the scores of row 20 alone beyond float64
    with pytest.raises(ValueError, match="overflowed"):
        er.attention(q, k, v, chunk=4, scale=1e270, backend="numba")
    with pytest.raises(ValueError, match="overflowed"):
        # grad_out 0: dZ = 0, so no gradient product overflows before the scores are checked
        er.attention_vjp(np.zeros((1, 2, 30, 2)), q, k, v, chunk=4, scale=1e270, tau=np.zeros((1, 2, 30)),
                         backend="numba")


@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.0, 3.0])
def test_filter_on_long_rows(scores, alpha):
    """Long rows (1500 keys, supports of a few dozen): the float32 filter leaves a few
    candidates per row; supports, thresholds and outputs are those of the dense formula."""
    rng, q, k, v = problem(int(alpha * 10), B=1, Hq=2, Hkv=1, Nq=40, Nk=1500, D=16, Dv=4, spread=1.0)
    out, info, d = check_against_dense("numba", q, k, v, alpha, causal=True, alibi_slopes=[0.01, 0.0],
                                       beta=rng.uniform(0.5, 1.5, (2, 1)), gamma=1.0, chunk=16)
    assert info.support.mean() < 0.1 * info.n.mean()
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    check_against_dense("numba", q32, k32, v32, alpha, causal=True, alibi_slopes=[0.01, 0.0], chunk=16)


@pytest.mark.parametrize("alpha", [1.5, 3.0])
def test_filter_product_in_blocks(monkeypatch, alpha):
    """The forward forms the float32 filter product a few rows at a time
    (``FILTER_BLOCK_BYTES``, but at least D rows), up to the last key the block's rows
    see, and runs the row kernel on each block: blocks of 8 rows (across the heads of a
    GQA group, with ALiBi and an ASEntmax scale) give the dense formula's answer and the
    bits of one block per chunk, the support keys included."""
    rng, q, k, v = problem(int(alpha * 7), B=1, Hq=4, Hkv=2, Nq=40, Nk=400, D=8, Dv=4, spread=1.0)
    kw = dict(causal=True, alibi_slopes=[0.01, 0.0, 0.0, 0.02], beta=rng.uniform(0.5, 1.5, (4, 1)), gamma=1.0,
              chunk=16)
    monkeypatch.setattr(nshared, "FILTER_FRACTION", 2.0)
    whole = er.attention(q, k, v, alpha=alpha, return_info=True, backend="numba", **kw)
    calls = []
    def counted(kernel):  # the shape of the score block of each call
        return lambda scores, *a: (calls.append((scores.g32 if scores.filt else scores.g64).shape),
                                   kernel(scores, *a))

    monkeypatch.setattr(nrows, "fwd_rows", counted(nrows.fwd_rows))
    monkeypatch.setattr(nattn, "FILTER_BLOCK_BYTES", 4 * 400 * 3)
    out, info, _ = check_against_dense("numba", q, k, v, alpha, **kw)
    rows, widths = zip(*calls)
    # every row, in blocks of D = 8 rows (the budget's 3 rows, raised to D so that a block
    # reads no more bytes of K than it writes scores); the 16-row chunks split in two
    assert set(rows) == {8} and sum(rows) == 4 * 40
    # causal: a block's product stops at its last query's keys (360 + i + 1 for query i)
    assert min(widths) == 368 and max(widths) == 400
    np.testing.assert_array_equal(out, whole[0])
    for field in ("tau", "support", "support_keys", "row_max", "edge", "edge_p", "skew"):
        np.testing.assert_array_equal(getattr(info, field), getattr(whole[1], field), err_msg=field)


class _PoisonedNumpy:
    """NumPy, but ``empty`` returns memory filled with garbage (NaN, or -7 for integers):
    fresh memory from the allocator is often zero, which would hide a missing fill."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float):
        a = np.empty(shape, dtype)
        a.fill(-7 if np.dtype(dtype).kind in "iu" else np.nan)
        return a


def test_rows_that_see_no_key_are_blank(monkeypatch):
    """The forward's large arrays start uninitialised (the kernels write every row they
    run); a row that no chunk runs (causal with more queries than keys, a batch of length
    0) is the blank row: output and skewed output 0, no support keys, theta -inf.  The
    arrays' memory is poisoned first, so the blank rows must really be written."""
    from entmax_ref.backends import attention_driver

    monkeypatch.setattr(attention_driver, "np", _PoisonedNumpy())  # empty_forward's np.empty
    real_keys = nshared.empty_support_keys

    def poisoned_keys(*args):  # the kernels' module keeps its np: nothing compiles in here
        with monkeypatch.context() as m:
            m.setattr(nshared, "np", _PoisonedNumpy())
            return real_keys(*args)

    monkeypatch.setattr(nshared, "empty_support_keys", poisoned_keys)
    rng, q, k, v = problem(3, B=2, Hq=4, Hkv=2, Nq=90, Nk=60, D=8, Dv=4)
    out, info, _ = check_against_dense("numba", q, k, v, 1.5, causal=True, key_lengths=[60, 0], chunk=16)
    dead = info.n == 0
    assert dead[0].sum() == 4 * 30 and dead[1].all()
    assert np.all(out[dead] == 0) and np.all(info.skew[dead] == 0) and np.all(info.support_keys[dead] == -1)
    assert np.all(np.isneginf(info.theta[dead])) and np.all(info.support[dead] == 0)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 3.0])
def test_bitwise_reproducible(path, alpha):
    """The same call gives the same bits every time: the forward and dQ whatever the thread
    count, dK and dV for a given thread count (each worker sums its own chunks' parts;
    with one shared accumulator they are added in chunk order, so those do not depend on
    the thread count either).  The small problems of the check corpus with short chunks:
    the float32 filter pays in some chunks and not in others (a decision that followed
    whichever chunk finished first used to change the scores' rounding from run to run)."""
    from entmax_ref.testing.corpus import attention_corpus

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one numba thread: 1 and 2 threads are the same run")
    rng = np.random.default_rng(7)
    for case in attention_corpus("default", 0, ("causal", "gqa", "cross")):
        do = rng.standard_normal(case.q.shape[:3] + (case.v.shape[3],))
        kw = dict(alpha=alpha, chunk=5, backend="numba", **case.kwargs)

        def run():
            out, info = er.attention(case.q, case.k, case.v, return_info=True, **kw)
            return (out, info.tau) + tuple(er.attention_vjp(do, case.q, case.k, case.v, **kw)[:3])

        with _threads(1):
            one = run()
        with _threads(2):
            twos = [run() for _ in range(4)]
        thread_free = ("out", "tau", "dq") + (("dk", "dv") if path == "shared" else ())
        for two in twos[1:]:
            for name, a, b, c in zip(("out", "tau", "dq", "dk", "dv"), one, twos[0], two):
                assert np.array_equal(b, c), (case.name, name)  # run to run, 2 threads
                if name in thread_free:
                    assert np.array_equal(a, c), (case.name, name)  # 1 thread and 2 threads


@pytest.mark.parametrize("n", [1, 2])
def test_each_kv_head_is_copied_once(monkeypatch, n):
    """The kv-heads' copies are made by the workers (beside the probe chunk, or by a head's
    first chunk), each once per call and batch of heads, and the result does not depend
    on who made them."""
    made = []
    real = nshared.Head.__init__

    def init(self, k, v, b, hk):
        made.append((b, hk))
        real(self, k, v, b, hk)

    rng, q, k, v = problem(5, B=2, Hq=4, Hkv=2, Nq=200, Nk=200, D=8, Dv=4, dtype=np.float32, spread=2.0)
    kw = dict(alpha=1.5, causal=True, chunk=16, backend="numba")
    with _threads(1):
        want = er.attention(q, k, v, **kw)
    monkeypatch.setattr(nshared.Head, "__init__", init)
    with _threads(n):
        got = er.attention(q, k, v, **kw)
    assert sorted(made) == [(b, hk) for b in range(2) for hk in range(2)]
    assert np.array_equal(got, want)


@pytest.fixture
def residual_spy(monkeypatch):
    """The AttentionForward of every numba ``attention_forward`` call, with its spec."""
    from entmax_ref.backends.numba_backend import NumbaBackend

    seen = []
    real = NumbaBackend.attention_forward

    def wrapped(self, q, k, v, spec):
        fwd = real(self, q, k, v, spec)
        seen.append((spec, fwd))
        return fwd

    monkeypatch.setattr(NumbaBackend, "attention_forward", wrapped)
    return seen


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("dtype", [np.float32], ids=["f32"])
def test_output_only_forward_keeps_no_residual(residual_spy, scores, alpha, dtype):
    """``er.attention`` without ``return_info`` asks for no residual: the numba forward then
    forms neither the skewed output nor the support keys (returned as None) and its
    output is bit for bit the output of the call that keeps them; with ``return_info``
    both are there.  Causal, grouped heads, ALiBi and several chunks of long rows."""
    rng, q, k, v = problem(31, B=2, Hq=4, Hkv=2, Nq=300, Nk=300, D=16, Dv=8, dtype=dtype, spread=2.0)
    kw = dict(alpha=alpha, causal=True, chunk=37, alibi_slopes=np.array([0.0, 0.0, 0.1, 0.0]), backend="numba")
    out = er.attention(q, k, v, **kw)
    kept, info = er.attention(q, k, v, return_info=True, **kw)
    (spec0, bare), (spec1, full) = residual_spy
    assert not spec0.residual and bare.skew is None and bare.support_keys is None
    assert spec1.residual and full.skew is not None and (alpha == 1.0 or full.support_keys is not None)
    assert np.array_equal(out, kept)
    for name in ("theta", "support", "row_max", "edge", "edge_p"):
        assert np.array_equal(getattr(bare, name), getattr(full, name)), name


@pytest.mark.parametrize("mask", ["run", "holes"])
def test_output_only_forward_under_key_masks(residual_spy, mask):
    """Key masks route through the per-batch key runs (or the NumPy driver, for holes),
    which join the batches' results: with no residual kept there is none to join (each
    batch's forward is asked for none, and the key runs form none), and the output is
    still bit for bit that of the call that keeps it."""
    rng, q, k, v = problem(33, B=2, Hq=2, Hkv=1, Nq=40, Nk=90, D=8, Dv=4, dtype=np.float32, spread=2.0)
    keep = np.ones((2, 90), bool)
    keep[0, :17] = False  # left padding: one run of keys
    if mask == "holes":
        keep[1, 30:35] = False
    kw = dict(alpha=1.5, key_padding_mask=keep, backend="numba")
    out = er.attention(q, k, v, **kw)
    bare = list(residual_spy)
    assert bare and not any(spec.residual for spec, _ in bare)
    if mask == "run":
        assert all(fwd.skew is None and fwd.support_keys is None for _, fwd in bare)
    kept, info = er.attention(q, k, v, return_info=True, **kw)
    assert np.array_equal(out, kept)
    assert info.skew is not None


# --------------------------------------------------------------------------- the support keys
def _keys_of_dense(d, cap):
    """What ``info.support_keys`` must hold: each row's support under the dense formula,
    ascending, then -1; -2 and then -1 where it has more than ``cap`` keys; as wide as the
    largest support that fits."""
    B, Hq, Nq, _ = d.p.shape
    want = np.full((B, Hq, Nq, cap), -1, np.int32)
    for row in np.ndindex(B, Hq, Nq):
        keys = np.flatnonzero(d.p[row] > 0)
        if keys.size > cap:
            want[row][0] = -2
        else:
            want[row][:keys.size] = keys
    fits = d.support[d.support <= cap]
    return want[..., :max(1, int(fits.max(initial=0)))]


def _without_keys(info):
    return dataclasses.replace(info, support_keys=None)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("cap", [64, "median"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_from_the_support_keys(path, threads, monkeypatch, alpha, cap, causal):
    """The forward keeps each row's support as key indices (exactly the dense formula's
    support); the backward from them (rows that have them compute their support's scores
    only) agrees with the backward that finds the support again and with the NumPy
    engine, within the rounding bounds.  A cap at the median support leaves chunks with
    rows of both kinds."""
    rng, q, k, v = problem(int(alpha * 40) + 7 * causal, B=2, Hq=4, Hkv=2, Nq=61, Nk=67, D=5, Dv=3, spread=2.5)
    beta, gamma = rng.uniform(0.2, 1.0, (4, 1)), rng.uniform(-1.0, 1.0, (4, 1))
    kw = dict(causal=causal, key_lengths=[67, 50], alibi_slopes=[0.25, 0.0, 0.125, 0.0], beta=beta, gamma=gamma)
    if cap == "median":
        d = dense(q, k, v, alpha=alpha, **kw)
        cap = int(np.median(d.support[d.n > 0]))
    monkeypatch.setattr(nshared, "keys_width", lambda dv: cap)
    out, info, d = check_against_dense("numba", q, k, v, alpha, chunk=7, **kw)
    assert info.support_keys.dtype == np.int32
    assert np.array_equal(info.support_keys, _keys_of_dense(d, cap))
    stored = info.support_keys[..., 0] != -2
    assert stored.any() and (cap == 64 or not stored.all())
    g_out = rng.standard_normal(out.shape)
    tols = grad_tols(d, q, k, v, g_out, alpha, beta=beta, gamma=gamma)
    g_ref = er.attention_vjp(g_out, q, k, v, alpha=alpha, chunk=7, backend="numpy", info=info, **kw)
    g_keys = er.attention_vjp(g_out, q, k, v, alpha=alpha, chunk=7, backend="numba", info=info, **kw)
    g_find = er.attention_vjp(g_out, q, k, v, alpha=alpha, chunk=7, backend="numba", info=_without_keys(info), **kw)
    for name, a, b_, c, t in zip(("dq", "dk", "dv", "dbeta", "dgamma", "ddelta"), g_keys, g_find, g_ref, tols):
        np.testing.assert_allclose(a, b_, rtol=0, atol=t, err_msg=name)
        np.testing.assert_allclose(a, c, rtol=0, atol=t, err_msg=name)


@pytest.mark.parametrize("alpha", [1.5, 3.0])
def test_support_keys_under_left_padding(alpha):
    """A key mask with one run of keys (left padding) runs as the key-sliced problem: the
    keys are relative to the run's start in the forward and in the backward alike."""
    rng, q, k, v = problem(3, B=1, Hq=2, Hkv=1, Nq=30, Nk=45, D=4, Dv=3, spread=2.5)
    mask = np.ones((1, 45), bool)
    mask[0, :9] = False
    kw = dict(alpha=alpha, causal=True, key_padding_mask=mask, chunk=6)
    out, info = er.attention(q, k, v, return_info=True, backend="numba", **kw)
    d = dense(q, k[:, :, 9:], v[:, :, 9:], alpha=alpha, causal=True)  # the same problem, sliced
    assert np.array_equal(info.support_keys, _keys_of_dense(d, 64))
    g_out = rng.standard_normal(out.shape)
    tols = grad_tols(d, q, k[:, :, 9:], v[:, :, 9:], g_out, alpha)
    g = er.attention_vjp(g_out, q, k, v, info=info, backend="numba", **kw)
    g_ref = er.attention_vjp(g_out, q, k, v, info=info, backend="numpy", **kw)
    assert not g.dk[:, :, :9].any() and not g.dv[:, :, :9].any()
    for name, a, b_, t in zip(("dq", "dk", "dv"), g, (g_ref.dq, g_ref.dk[:, :, 9:], g_ref.dv[:, :, 9:]), tols):
        a = a if name == "dq" else a[:, :, 9:]
        np.testing.assert_allclose(a, b_, rtol=0, atol=t, err_msg=name)


def test_support_keys_width_follows_the_value_dim():
    """Room for max(64, 2 Dv) keys a row (never more bytes than the float64 skewed output),
    trimmed to the most a row holds: at Dv = 48, supports of 65-96 keys are kept, larger
    ones are found again; the gradients from them are the dense formula's."""
    rng, q, k, v = problem(4, B=1, Hq=2, Hkv=1, Nq=24, Nk=400, D=8, Dv=48, spread=1.0)
    kw = dict(alpha=1.25, causal=False, chunk=8, backend="numba")
    out, info = er.attention(q, k, v, return_info=True, **kw)
    d = dense(q, k, v, alpha=1.25)
    assert np.array_equal(info.support, d.support)
    assert (d.support > 64).any() and (d.support <= 96).any() and (d.support > 96).any()
    assert np.array_equal(info.support_keys, _keys_of_dense(d, 96))
    assert info.support_keys.shape[3] > 64
    g_out = rng.standard_normal(out.shape)
    tols = grad_tols(d, q, k, v, g_out, 1.25)
    g = er.attention_vjp(g_out, q, k, v, info=info, **kw)
    g_ref = er.attention_vjp(g_out, q, k, v, info=info, **{**kw, "backend": "numpy"})
    for name, a, b_, t in zip(("dq", "dk", "dv"), g, g_ref, tols):
        np.testing.assert_allclose(a, b_, rtol=0, atol=t, err_msg=name)


def test_backward_with_support_keys_forms_no_score_product(monkeypatch):
    """Where every row of a chunk has its support's keys, the backward forms no q.k product
    (and runs no filter pass); a row without them (support above the cap) needs one."""
    rng, q, k, v = problem(11, B=1, Hq=2, Hkv=1, Nq=40, Nk=300, D=8, Dv=4, spread=2.0)
    g_out = rng.standard_normal((1, 2, 40, 4))
    kw = dict(alpha=1.5, causal=True, chunk=8, backend="numba")
    _, info = er.attention(q, k, v, return_info=True, **kw)
    assert (info.support_keys[..., 0] != -2).all()
    g_ref = er.attention_vjp(g_out, q, k, v, info=_without_keys(info), **kw)
    tols = grad_tols(dense(q, k, v, alpha=1.5, causal=True), q, k, v, g_out, 1.5)

    def no_product(*a, **k_):
        raise AssertionError("the backward formed a score product")

    with monkeypatch.context() as m:
        m.setattr(nbwd, "chunk_scores", no_product)
        g = er.attention_vjp(g_out, q, k, v, info=info, **kw)
        for a, b_, t in zip(g[:3], g_ref[:3], tols):
            np.testing.assert_allclose(a, b_, rtol=0, atol=t)
        keys = info.support_keys.copy()
        keys[0, 1, 20, 0] = -2  # one row without keys: its chunk forms the product
        with pytest.raises(AssertionError, match="score product"):
            er.attention_vjp(g_out, q, k, v, info=dataclasses.replace(info, support_keys=keys), **kw)


def test_support_keys_of_another_call_are_refused():
    """Keys that cannot be this call's support (out of order, not visible to the row) and
    keys of the wrong type or shape raise, naming support_keys; they are never read past
    the row's keys."""
    rng, q, k, v = problem(2, B=1, Hq=2, Hkv=1, Nq=20, Nk=20, D=4, Dv=3, spread=2.5)
    kw = dict(alpha=1.5, causal=True, backend="numba")
    _, info = er.attention(q, k, v, return_info=True, **kw)
    g_out = np.ones((1, 2, 20, 3))
    row = (0, 0, 19)
    assert info.support[row] >= 2

    def vjp(keys):
        return er.attention_vjp(g_out, q, k, v, info=dataclasses.replace(info, support_keys=keys), **kw)

    swapped = info.support_keys.copy()
    swapped[row][:2] = swapped[row][1::-1]
    early = info.support_keys.copy()
    early[0, 0, 3, 0] = 10  # row 3 sees keys 0..3 (causal)
    negative = info.support_keys.copy()
    negative[row][0] = -5
    for keys in (swapped, early, negative):
        with pytest.raises(ValueError, match="support_keys do not belong"):
            vjp(keys)
    for keys in (info.support_keys.astype(np.int64), info.support_keys[..., :1, :], info.support_keys[..., :0]):
        with pytest.raises(ValueError, match="info.support_keys must be"):
            vjp(keys)


def test_range_pass_extrema_and_nan_count():
    """The filter's range pass (integer extrema of the float32 scores) gives NumPy's min
    and max, signed zeros and infinities included, counts NaN, and (inf, -inf) when empty."""
    g = np.random.default_rng(7).standard_normal((5, 300)).astype(np.float32)
    g[1, 10], g[1, 200] = -np.inf, np.inf
    g[2] = -1.0
    g[2, 5], g[2, 6] = -0.0, 0.0
    g[3, 17] = np.nan
    g[4] = -g[4] ** 2 - 1.0  # all negative
    for r in range(5):
        for j0, j1 in [(0, 300), (7, 8), (3, 299), (11, 150)]:
            lo, hi, nan = entry(nfilter._g_range)(g, r, j0, j1)
            seg = g[r, j0:j1]
            assert nan == np.isnan(seg).sum()
            if nan == 0:
                assert (lo, hi) == (seg.min(), seg.max())
    lo, hi, nan = entry(nfilter._g_range)(g, 2, 4, 7)
    assert (lo, hi, nan) == (-1.0, 0.0, 0) and not np.signbit(hi)
    assert entry(nfilter._g_range)(g, 0, 5, 5) == (np.inf, -np.inf, 0)


def test_filter_keys_above_the_line():
    """The filter's keys above the float32 line (a bit mask and its set bits for a long row,
    a branch-free pass for the rest) are NumPy's, ascending, at lengths around the mask's
    64-key words and its minimum row."""
    from entmax_ref.backends.numba.candidates import MASK_MIN

    rng = np.random.default_rng(11)
    g = rng.standard_normal((3, 2 * MASK_MIN + 131)).astype(np.float32)
    g[1, ::7] = np.inf
    g[2] = 0.5  # every key right at the line, then above it
    for r, gc in [(0, 1.2), (0, -5.0), (0, 9.0), (1, 3.0), (2, 0.5), (2, np.nextafter(np.float32(0.5), -1))]:
        gc = np.float32(gc)
        for n in (0, 1, 63, 64, MASK_MIN - 1, MASK_MIN, MASK_MIN + 65, g.shape[1]):
            idx = np.full(g.shape[1], -7, np.int64)
            m = entry(nfilter._above)(g, r, n, gc, idx, np.empty(g.shape[1]))
            np.testing.assert_array_equal(idx[:m], np.flatnonzero(g[r, :n] > gc))


@pytest.mark.parametrize("mask", ["run", "holes"])
def test_key_masks_are_routed_once(monkeypatch, mask):
    """The numba backend routes a key mask once, forward and backward: one run of keys per
    batch reaches the numba drivers as unmasked per-batch problems (the backend's entry is
    not called again, the NumPy reference not at all); a mask with holes goes to the
    NumPy reference's driver with the compiled row solver, once."""
    from entmax_ref.backends import numpy_attention
    from entmax_ref.backends.numba_backend import NumbaBackend

    seen = {"entry": [], "fwd": [], "bwd": [], "ref_fwd": [], "ref_bwd": []}

    def spy(owner, name, key, spec_at):
        real = getattr(owner, name)

        def wrapped(*a):
            seen[key].append(a[spec_at].key_mask is not None)
            return real(*a)

        monkeypatch.setattr(owner, name, wrapped)

    spy(NumbaBackend, "attention_forward", "entry", 4)
    spy(nattn, "attention_forward", "fwd", 4)
    spy(nbwd, "attention_backward", "bwd", 7)
    spy(numpy_attention, "attention_forward", "ref_fwd", 4)
    spy(numpy_attention, "attention_backward", "ref_bwd", 7)
    # float32: float64 attention runs the NumPy reference's driver whatever the mask
    rng, q, k, v = problem(35, B=2, Hq=2, Hkv=1, Nq=40, Nk=90, D=8, Dv=4, spread=2.0, dtype=np.float32)
    keep = np.ones((2, 90), bool)
    keep[0, :17] = False  # left padding: one run of keys
    if mask == "holes":
        keep[1, 30:35] = False
    kw = dict(alpha=1.5, key_padding_mask=keep, backend="numba")
    out, info = er.attention(q, k, v, return_info=True, **kw)
    er.attention_vjp(np.ones_like(out), q, k, v, info=info, out=out, **kw)
    assert seen["entry"] == [True]
    if mask == "run":
        assert seen["fwd"] == [False, False] and seen["bwd"] == [False, False]
        assert seen["ref_fwd"] == [] and seen["ref_bwd"] == []
    else:
        assert seen["fwd"] == [] and seen["bwd"] == []
        assert seen["ref_fwd"] == [True] and seen["ref_bwd"] == [True]


@pytest.mark.parametrize("dtype", [np.float32])
def test_a_group_of_heads_on_different_solver_paths_gives_each_head_its_own_paths_bits(dtype):
    """A kv-head group whose query heads take five row solvers (alpha 1.5, 1.25, 3, 2, 1.5:
    two runs of heads on one path, and a path that comes back) runs each run through its
    path's kernel: every head gets the bits the same group gives it with that head's alpha
    on every head, on the chunked path and the decoding path."""
    ndec = pytest.importorskip("entmax_ref.backends.numba.decode")
    alphas = np.array([1.5, 1.25, 1.25, 3.0, 2.0, 1.5])
    rng, q, k, v = problem(7, B=1, Hq=6, Hkv=1, Nq=24, Nk=24, D=8, Dv=4, spread=2.0, dtype=dtype)
    qd = rng.standard_normal((1, 6, 1, 8)).astype(dtype)
    kd, vd = rng.standard_normal((2, 1, 1, ndec.DECODE_MIN_KEYS, 8)).astype(dtype)
    path = [engine.solver_path(a) for a in alphas]
    runs = [(0, 1, path[0]), (1, 3, path[1]), (3, 4, path[3]), (4, 5, path[4]), (5, 6, path[5])]  # per head
    for (q_, k_, v_), kw, nq in (((q, k, v), dict(causal=True), 24), ((qd, kd, vd), {}, 1)):
        calls = []

        caller = []

        def spy(kernel):  # records (caller, first row, end row, path) of each row kernel call
            return lambda *a: (calls.append((caller[-1], a[2], a[2] + a[0].qc.shape[0], a[-1])), kernel(*a))[1]

        def runs_from(name, runs):  # notes which driver hands the rows to the kernels
            return lambda *a: (caller.append(name), runs(*a))[1]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nrows, "fwd_rows", spy(nrows.fwd_rows))
            for mod, name in ((nattn, "chunked"), (ndec, "decoding")):
                mp.setattr(mod, "fwd_runs", runs_from(name, mod.fwd_runs))
            mixed, info = er.attention(q_, k_, v_, alpha=alphas, return_info=True, backend="numba", **kw)
        # one row kernel call per run of heads on one path, from the decoding path in its case
        name = "chunked" if nq > 1 else "decoding"
        assert calls == [(name, lo * nq, hi * nq, p) for lo, hi, p in runs]
        for h, a in enumerate(alphas):
            alone, ia = er.attention(q_, k_, v_, alpha=np.full(6, a), return_info=True, backend="numba", **kw)
            np.testing.assert_array_equal(mixed[:, h], alone[:, h])
            np.testing.assert_array_equal(info.tau[:, h], ia.tau[:, h])
            np.testing.assert_array_equal(info.support[:, h], ia.support[:, h])

