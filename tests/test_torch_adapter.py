"""entmax_ref.torch: differentiable, bit for bit the library's numbers, compilable.

gradcheck (float64, finite differences against the backward) covers every function and
every differentiable argument: x, a tensor alpha, beta, gamma, delta, q, k, v.  The forward
and the gradients must equal the top-level function and its VJP exactly (the same engines
run on the same memory); torch.compile must trace forward and backward in one graph.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import entmax_ref as er  # noqa: E402
import entmax_ref.torch as ert  # noqa: E402
from adapter_cases import message_without, row_pairs  # noqa: E402

F64 = torch.float64
# the top-level functions are called on the same tensors to compare: they read them detached
pytestmark = pytest.mark.filterwarnings("ignore:entmax_ref's functions read a tensor that requires grad detached")


def _randn(*shape, seed=0, dtype=F64, grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)


def _same(ours, theirs):
    """Bit for bit, and of one dtype (the library's result as a tensor: a NumPy array where
    a top-level function returns one for a tensor)."""
    theirs = torch.as_tensor(theirs)
    return ours.dtype == theirs.dtype and torch.equal(ours.detach(), theirs)


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t


def _gradcheck(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs)


ROW_FUNCTIONS = row_pairs(ert)


@pytest.mark.parametrize("name", ROW_FUNCTIONS)
def test_row_functions_gradcheck_and_equal_the_library(name):
    ours, lib = ROW_FUNCTIONS[name]
    x = _randn(3, 6)
    for dim in (-1, 0):
        _gradcheck(lambda x: ours(x, dim=dim), x)
    p = ours(x)
    assert p.requires_grad and _same(p, lib(x))
    g = _randn(3, 6, seed=1, grad=False)
    (dx,) = torch.autograd.grad(p, x, g)
    vjp = {"normmax": lambda: er.normmax_vjp(p.detach(), g),
           "budget_sparsemax": lambda: er.budget_sparsemax_vjp(p.detach(), g, 0.5)}
    alpha = {"softmax": 1.0, "sparsemax": 2.0, "entmax15": 1.5, "entmax alpha=1.3": 1.3, "entmax alpha=2.5": 2.5}
    want = vjp[name]() if name in vjp else er.entmax_vjp(p.detach(), g, alpha[name])
    assert _same(dx, want)


def test_tensor_alpha_per_row_and_shared():
    x = _randn(2, 3, 5)
    alpha = torch.tensor([[1.2, 1.6, 2.3], [1.05, 1.5, 3.0]], dtype=F64, requires_grad=True)
    _gradcheck(lambda x, a: ert.entmax(x, a), x, alpha)
    per_head = torch.tensor([[1.4], [1.8]], dtype=F64, requires_grad=True)  # broadcast over the 3 rows
    _gradcheck(lambda x, a: ert.entmax(x, a), x, per_head)
    shared = torch.tensor(1.7, dtype=F64, requires_grad=True)
    _gradcheck(lambda x, a: ert.entmax(x, a, dim=1), x, shared)
    p = ert.entmax(x, alpha)
    assert torch.equal(p, er.entmax(x, alpha))
    g = _randn(2, 3, 5, seed=3, grad=False)
    dx, da = torch.autograd.grad(p, (x, alpha), g)
    assert torch.equal(dx, er.entmax_vjp(p.detach(), g, alpha.detach()))
    assert torch.equal(da, er.entmax_alpha_vjp(p.detach(), g, alpha.detach()))


@pytest.mark.parametrize("kind", ["entmax", "normmax"])
def test_losses_gradcheck_and_equal_the_library(kind):
    ours = {"entmax": ert.entmax_loss, "normmax": ert.normmax_loss}[kind]
    lib, lib_grad = {"entmax": (er.entmax_loss, er.entmax_loss_grad),
                     "normmax": (er.normmax_loss, er.normmax_loss_grad)}[kind]
    x = _randn(4, 5)
    labels = torch.tensor([0, 4, 2, 1])
    probs = torch.softmax(_randn(4, 5, seed=2, grad=False), -1)
    for target in (labels, probs):
        _gradcheck(lambda x: ours(x, target, 1.5), x)
        loss = ours(x, target, 1.5)
        assert _same(loss, lib(x, target, 1.5))
        w = _randn(4, seed=5, grad=False)
        (dx,) = torch.autograd.grad(loss, x, w)
        assert _same(dx, torch.as_tensor(lib_grad(x, target, 1.5)) * w[:, None])
    _gradcheck(lambda x: ours(x.T, labels, 1.5, dim=0), x)
    with pytest.raises(RuntimeError, match="not the target"):
        ours(x, probs.clone().requires_grad_(True)).sum().backward()


def test_asentmax_and_ssmax_gradients_reach_beta_gamma_delta():
    x = _randn(2, 3, 6)
    x = x.detach().masked_fill(torch.arange(6) >= 4, float("-inf")).requires_grad_(True)  # masked keys: n = 4
    beta = torch.tensor([[0.5], [0.9]], dtype=F64, requires_grad=True)
    gamma = torch.tensor([1.0, 1.3, 0.7], dtype=F64, requires_grad=True)
    delta = torch.tensor(0.8, dtype=F64, requires_grad=True)
    _gradcheck(lambda x, b, g, d: ert.asentmax(x, 1.5, beta=b, gamma=g, delta=d), x, beta, gamma, delta)
    _gradcheck(lambda x, b: ert.ssmax(x, beta=b), x, beta)
    p = ert.asentmax(x, 1.5, beta=beta, gamma=gamma, delta=delta)
    assert torch.equal(p, er.asentmax(x, 1.5, beta=beta, gamma=gamma, delta=delta))
    g = _randn(2, 3, 6, seed=4, grad=False)
    grads = torch.autograd.grad(p, (x, beta, gamma, delta), g)
    want = er.asentmax_vjp(g, x, 1.5, beta=beta, gamma=gamma, delta=delta, p=p.detach())
    for ours, theirs in zip(grads, want):
        assert torch.equal(ours, torch.as_tensor(theirs))


def _qkv(B, Hq, Hkv, N, D, Dv, seed=0):
    return _randn(B, Hq, N, D, seed=seed), _randn(B, Hkv, N + 1, D, seed=seed + 1), _randn(B, Hkv, N + 1, Dv,
                                                                                            seed=seed + 2)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_attention_gradcheck_all_arguments(backend):
    q, k, v = _qkv(1, 2, 1, 4, 3, 2)
    alpha = torch.tensor([1.3, 2.4], dtype=F64, requires_grad=True)
    beta = torch.tensor([[0.5], [0.7]], dtype=F64, requires_grad=True)
    gamma = torch.tensor([[1.0], [1.2]], dtype=F64, requires_grad=True)
    delta = torch.tensor(0.9, dtype=F64, requires_grad=True)

    def fn(q, k, v, a, b, g, d):
        return ert.attention(q, k, v, alpha=a, causal=True, beta=b, gamma=g, delta=d, backend=backend)

    _gradcheck(fn, q, k, v, alpha, beta, gamma, delta)
    _gradcheck(lambda q, k, v: ert.attention(q, k, v, alpha=1.5, key_lengths=[4], alibi_slopes=[0.1, 0.3],
                                             backend=backend), q, k, v)


def test_attention_equals_the_library_bit_for_bit():
    q, k, v = _qkv(2, 4, 2, 6, 4, 3)
    alpha = torch.tensor([1.5, 1.2, 2.0, 2.6], dtype=F64, requires_grad=True)
    beta = torch.tensor([[0.3], [0.5], [0.7], [0.9]], dtype=F64, requires_grad=True)
    kw = dict(alpha=alpha, causal=True, beta=beta, gamma=1.0, key_padding_mask=torch.tensor(
        [[True] * 7, [True, False] + [True] * 5]), backend="numba")
    out = ert.attention(q, k, v, **kw)
    kw_np = {name: _np(a) for name, a in kw.items()}
    qkv = [_np(t) for t in (q, k, v)]
    ref, info = er.attention(*qkv, return_info=True, **kw_np)
    assert _same(out, ref)
    g = _randn(*out.shape, seed=9, grad=False)
    grads = torch.autograd.grad(out, (q, k, v, alpha, beta), g)
    want = er.attention_vjp(_np(g), *qkv, info=info, **kw_np)
    for ours, theirs in zip(grads, (want.dq, want.dk, want.dv, want.dalpha, want.dbeta)):
        assert _same(ours, theirs)


def test_attention_varlen_gradcheck_and_equal_the_library():
    q, k, v = _randn(6, 2, 3), _randn(7, 1, 3, seed=1), _randn(7, 1, 2, seed=2)
    cu_q, cu_k = torch.tensor([0, 2, 6]), torch.tensor([0, 3, 7])
    alpha = torch.tensor([1.3, 1.7], dtype=F64, requires_grad=True)
    beta = torch.tensor([0.5, 0.7], dtype=F64, requires_grad=True)

    def fn(q, k, v, a, b):
        return ert.attention_varlen(q, k, v, cu_q, cu_k, alpha=a, causal=True, beta=b, gamma=1.0)

    _gradcheck(fn, q, k, v, alpha, beta)
    out = fn(q, k, v, alpha, beta)
    qkv = [_np(t) for t in (q, k, v, cu_q, cu_k)]
    ref, info = er.attention_varlen(*qkv, alpha=_np(alpha), causal=True, beta=_np(beta), gamma=1.0, return_info=True)
    assert _same(out, ref)
    g = _randn(*out.shape, seed=9, grad=False)
    want = er.attention_varlen_vjp(_np(g), *qkv, info=info, alpha=_np(alpha), causal=True, beta=_np(beta), gamma=1.0)
    grads = torch.autograd.grad(out, (q, k, v, alpha, beta), g)
    for ours, theirs in zip(grads, (want.dq, want.dk, want.dv, want.dalpha, want.dbeta)):
        assert _same(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_as_the_library_computes_it(dtype):
    x = _randn(3, 7, dtype=dtype)
    p = ert.entmax15(x)
    assert p.dtype == dtype and torch.equal(p, er.entmax15(x))
    g = _randn(3, 7, seed=1, dtype=dtype, grad=False)
    (dx,) = torch.autograd.grad(p, x, g)
    assert dx.dtype == dtype and torch.equal(dx, er.entmax_vjp(p.detach(), g, 1.5))
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in _qkv(1, 2, 2, 3, 4, 4))
    out = ert.attention(q, k, v, causal=True)
    assert out.dtype == dtype and torch.equal(out, er.attention(q, k, v, causal=True))
    out.sum().backward()
    assert q.grad.dtype == dtype and k.grad.dtype == dtype


def test_double_backward_is_refused_clearly():
    x = _randn(2, 5)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.gradgradcheck(ert.entmax15, (x,))
    q, k, v = _qkv(1, 1, 1, 2, 2, 2)
    (dq,) = torch.autograd.grad(ert.attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        dq.sum().backward()


def test_torch_func_grad_jacrev_and_vmap_give_the_autograd_gradients():
    x = _randn(3, 5, grad=False)
    g = _randn(3, 5, seed=1, grad=False)
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(ert.entmax(xr, 1.3), xr, g)
    got = torch.func.grad(lambda t: (ert.entmax(t, 1.3) * g).sum())(x)
    assert torch.equal(got, want)
    jac = torch.func.jacrev(lambda t: ert.sparsemax(t))(x[0])
    assert torch.equal(jac, torch.as_tensor(er.entmax_jacobian(er.sparsemax(x[0]), 2.0)))
    per_row = torch.func.vmap(lambda t: ert.entmax15(t))(x)
    assert torch.equal(per_row, ert.entmax15(x))
    # attention: q, k, v and a tensor alpha through torch.func.grad
    q, k, v = (t.detach() for t in _qkv(1, 2, 1, 3, 2, 2))
    alpha = torch.tensor([1.4, 2.2], dtype=F64)

    def loss(q, a):
        return ert.attention(q, k, v, alpha=a, causal=True).square().sum()

    dq, da = torch.func.grad(loss, argnums=(0, 1))(q, alpha)
    qr, ar = q.clone().requires_grad_(True), alpha.clone().requires_grad_(True)
    want_q, want_a = torch.autograd.grad(loss(qr, ar), (qr, ar))
    assert torch.equal(dq, want_q) and torch.equal(da, want_a)
    vmapped = torch.func.vmap(lambda q: ert.attention(q, k, v, causal=True))(q.expand(3, -1, -1, -1, -1))
    assert torch.equal(vmapped[2], ert.attention(q, k, v, causal=True))


def test_second_derivatives_through_torch_func_are_refused():
    x = _randn(4, grad=False)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.func.grad(lambda t: torch.func.grad(lambda s: ert.entmax15(s)[1])(t)[1])(x)
    with pytest.raises(RuntimeError, match="forward mode"):  # jvp, jacfwd, hessian: not implemented
        torch.func.jvp(ert.entmax15, (x,), (torch.ones_like(x),))


@pytest.mark.parametrize("bad", [True, "1.5", [1.5, 2.0], float("nan")])
def test_a_number_that_is_not_a_number_is_refused_as_the_library_refuses_it(bad):
    x = _randn(2, 3)
    for call in (lambda: ert.entmax(x, bad), lambda: ert.normmax(x, bad), lambda: ert.entmax_loss(x, [0, 1], bad),
                 lambda: ert.asentmax(x, bad, beta=0.5, gamma=1.0), lambda: ert.budget_sparsemax(x, bad)):
        with pytest.raises((TypeError, ValueError)):
            call()
    q, k, v = _qkv(1, 1, 1, 2, 2, 2)
    with pytest.raises((TypeError, ValueError), match="alpha"):
        ert.attention(q, k, v, alpha=bad)


def test_alpha_in_the_keepdims_shape_of_the_entmax_package():
    x = _randn(3, 5)
    keep = torch.tensor([[1.2], [1.5], [2.0]], dtype=F64, requires_grad=True)
    rows = keep.detach()[:, 0].clone().requires_grad_(True)
    _gradcheck(lambda x, a: ert.entmax(x, a), x, keep)
    g = _randn(3, 5, seed=3, grad=False)
    (dk,) = torch.autograd.grad(ert.entmax(x, keep), keep, g)
    (dr,) = torch.autograd.grad(ert.entmax(x, rows), rows, g)
    assert dk.shape == (3, 1) and torch.equal(dk[:, 0], dr)
    _gradcheck(lambda x, a: ert.entmax(x, a, dim=0), x, torch.tensor([[1.1, 1.3, 1.5, 2.0, 3.0]], dtype=F64,
                                                                       requires_grad=True))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ert.entmax15(np.zeros(3))
    from entmax_ref.adapters._torch_host import host

    # a tensor off the CPU (meta stands in for a CUDA tensor without the cupy backend)
    with pytest.raises(TypeError, match=r"q is a tensor on meta.*q\.cpu\(\)"):
        host(torch.empty(1, 1, 2, 2, device="meta"), "q")
    with pytest.raises(ValueError, match="alpha"):
        ert.entmax(_randn(2, 3), torch.tensor([0.5, 1.5], dtype=F64))


def _compiled_step(x, q, k, v):
    # q, k, v as the training guide lays them out: (B, N, H, D) permuted to (B, H, N, D), not contiguous
    q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    assert not q.is_contiguous()
    p = ert.entmax15(x.T, dim=0)
    return (p * torch.arange(x.shape[-1])[:, None]).sum() + ert.attention(q, k, v, causal=True).square().sum()


def _check_compiled(backend):
    torch._dynamo.reset()
    x = _randn(3, 5, dtype=torch.float32)
    # contiguous in (B, N, H, D): the step's permute hands the operations strided q, k, v
    q, k, v = (t.detach().float().permute(0, 2, 1, 3).contiguous().requires_grad_(True) for t in _qkv(1, 2, 2, 6, 4, 4))
    eager = _compiled_step(x, q, k, v)
    want = torch.autograd.grad(eager, (x, q, k, v))
    compiled = torch.compile(_compiled_step, fullgraph=True, backend=backend)  # fullgraph: a break is an error
    got = compiled(x, q, k, v)
    assert torch.equal(got, eager)
    for a, b in zip(torch.autograd.grad(got, (x, q, k, v)), want):
        assert torch.equal(a, b)


def test_torch_compile_fullgraph_traces_forward_and_backward():
    _check_compiled("aot_eager")


@pytest.mark.exhaustive
def test_torch_compile_inductor_on_permuted_inputs(tmp_path, monkeypatch):
    """inductor checks the strides the fake implementations promise against the real
    results (aot_eager does not): permuted inputs, forward and backward.  Cold, it takes
    about 13 CPU s more than the aot_eager test (39 s wall on a loaded 2-core AMD EPYC Zen 4),
    so the default tier checks those strides with opcheck on permuted memory instead
    (test_operations_pass_opcheck_on_permuted_memory)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compiled cold, as in a fresh CI run
    _check_compiled("inductor")


def _permuted(*shape, seed=0):
    """A tensor of ``shape`` whose memory is in another order (as ``.permute`` or ``.T`` gives)."""
    return _randn(*reversed(shape), seed=seed, grad=False).permute(*reversed(range(len(shape))))


def _attention_args(varlen=False):
    from entmax_ref._attention_options import AttentionOptions

    if varlen:
        q, k, v = _permuted(5, 2, 3), _permuted(6, 1, 3, seed=1), _permuted(6, 1, 2, seed=2)
        cu = [torch.tensor([0, 2, 5]), torch.tensor([0, 3, 6])]
    else:
        q, k, v = _permuted(1, 2, 4, 3), _permuted(1, 1, 5, 3, seed=1), _permuted(1, 1, 5, 2, seed=2)
        cu = [None, None]
    beta = torch.tensor([0.5, 0.7] if varlen else [[0.5], [0.7]], dtype=F64)  # per head
    arrays, static = AttentionOptions.encode(dict(alpha=torch.tensor([1.3, 2.5], dtype=F64), causal=True,
                                                  beta=beta, gamma=1.0))
    return q, k, v, *cu, arrays, static


def _vjp_args(varlen=False):
    q, k, v, cu_q, cu_k, arrays, static = _attention_args(varlen)
    out, *residual = torch.ops.entmax_ref.attention(q, k, v, cu_q, cu_k, arrays, static)
    return _permuted(*out.shape, seed=7), q, k, v, residual, cu_q, cu_k, arrays, static


@pytest.mark.parametrize("op, args", [
    ("entmax", lambda: (_permuted(2, 4), 1.5, None, -1, None, None)),
    ("entmax", lambda: (_permuted(2, 4), 1.5, torch.tensor([1.2, 1.8, 2.0, 3.5], dtype=F64), 0, None, None)),
    ("entmax_vjp", lambda: (_permuted(2, 4), _permuted(2, 4, seed=1), 1.5, None, -1, None)),
    ("entmax_alpha_vjp", lambda: (_permuted(3, 4), _permuted(3, 4, seed=1), torch.tensor([1.2, 1.8, 3.0], dtype=F64),
                                  -1, None)),
    ("normmax", lambda: (_permuted(2, 4), 2.0, 0, None)),
    ("budget_sparsemax_vjp", lambda: (_permuted(2, 4), _permuted(2, 4, seed=1), 1.5, -1, None)),
    ("asentmax", lambda: (_permuted(2, 4), 1.5, torch.tensor(0.5, dtype=F64), torch.tensor(1.0, dtype=F64),
                          torch.tensor(1.0, dtype=F64), 1.0, -1, None)),
    ("asentmax_vjp", lambda: (_permuted(2, 4), _permuted(2, 4, seed=1), _permuted(2, 4, seed=2).softmax(-1), 1.5,
                              torch.tensor(0.5, dtype=F64), torch.tensor(1.0, dtype=F64), torch.tensor(1.0, dtype=F64),
                              1.0, -1, None)),
    ("fy_loss", lambda: (_permuted(2, 4), torch.tensor([0, 3]), "entmax", 1.5, -1, None)),
    ("fy_loss_grad", lambda: (_permuted(2, 4), torch.tensor([0, 3]), "normmax", 2.0, -1, None)),
    ("attention", _attention_args),
    ("attention", lambda: _attention_args(varlen=True)),
    ("attention_vjp", _vjp_args),
    ("attention_vjp", lambda: _vjp_args(varlen=True)),
])
def test_operations_pass_opcheck_on_permuted_memory(op, args):
    """torch.library.opcheck: the schema and the fake (shape-only) implementation agree
    with the real one, strides included, on inputs whose memory is permuted (what
    torch.compile's inductor relies on; it would otherwise fail in the backward)."""
    torch.library.opcheck(getattr(torch.ops.entmax_ref, op), args())


def test_import_entmax_ref_does_not_import_torch_and_the_adapter_names_the_install():
    assert "pip install torch" in message_without("torch")


def _guide_code(heading: str) -> str:
    """The python blocks of docs/guides/training.md under a heading starting with ``heading``."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "training.md").read_text(encoding="utf-8")
    section = re.split(r"^## ", text, flags=re.M)
    body = next(s for s in section if s.startswith(heading))
    return "\n".join(re.findall(r"```python\n(.*?)```", body, flags=re.S))


def test_training_guide_torch_example_runs():
    code = _guide_code("PyTorch")
    assert "ert.attention" in code
    exec(compile(code, "training.md#pytorch", "exec"), {"__name__": "training_torch"})


@pytest.mark.numba
def test_bench_training_step_table_and_json(tmp_path, monkeypatch, capsys):
    """``entmax-ref bench --training-only``: progress on stderr, a table of at most 100
    columns whose ratio is ours over the peer's time, the machine line, and --json."""
    pytest.importorskip("entmax")
    import json

    import numba

    from entmax_ref import bench

    monkeypatch.setattr(bench, "GAP", bench.GAP)  # main() sets it from --gap
    threads = numba.get_num_threads(), torch.get_num_threads()
    path = tmp_path / "bench.json"
    try:
        assert bench.main(["--training-only", "--quick", "--training-n", "16", "--gap", "0", "--json", str(path)]) == 0
    finally:
        numba.set_num_threads(threads[0])
        torch.set_num_threads(threads[1])
    out, err = capsys.readouterr()
    assert "[1/1] training step" in err and "training step" not in out.splitlines()[0]
    assert bench.machine() in out.splitlines()[0] and "cores" in bench.machine()
    assert all(len(line) <= 100 for line in out.splitlines()[1:])
    (row,) = json.loads(path.read_text())["results"]
    assert row["case"].startswith("training step") and row["baseline"] == "eager torch + entmax.entmax_bisect"
    ratio = row["ours_api_ms"] / row["baseline_ms"]
    figures = out.splitlines()[-1].split()
    assert figures[-3:] == ["<=", "0.1x", "yes" if row["met"] else "NO"]  # ">= 10x faster" as a time ratio
    assert float(figures[-5]) == pytest.approx(1 / row["speedup"], rel=1e-2) and ratio > 0
