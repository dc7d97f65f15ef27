"""The corpus's operations: for each, its file, its generator, its replay and the library's own
implementation of what it checks."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..report import CheckReport, CheckRow
from .gen_attention import gen_attention, gen_attention_varlen, gen_attention_varlen_vjp, gen_attention_vjp
from .gen_family import gen_budget_sparsemax, gen_budget_sparsemax_vjp, gen_normmax, gen_normmax_vjp
from .gen_rows import (gen_asentmax_scale, gen_entmax, gen_entmax_alpha_vjp, gen_entmax_batch, gen_entmax_loss,
                       gen_entmax_vjp)
from .read import Corpus, load_corpus
from .replay import replay_attention, replay_rows, replay_scale


@dataclass(frozen=True)
class Operation:
    """One operation of the corpus: its file, its generator and how to replay it.

    ``replay(corpus, fn, op=..., label=..., framework=..., device=..., dtypes=...,
    alphas=..., vjp_inputs=...)`` returns a :class:`CheckReport`; ``backend_fn(backend)`` is the
    library's own implementation of what ``fn`` computes (used by :func:`replay_backend`),
    returning every field the file checks."""

    name: str
    file: str
    generate: Callable | None
    replay: Callable
    backend_fn: Callable
    signature: str


def _er():
    import entmax_ref as er

    return er


def _library(params: str, compute: Callable) -> Callable:
    """An Operation's ``backend_fn``: ``compute(er, backend, *args, **kw)`` on backend b, with
    the signature ``fn(<params>)`` the replay inspects to call it (``**kw`` allowed last)."""
    P = inspect.Parameter
    sig = inspect.Signature([P(p[2:], P.VAR_KEYWORD) if p.startswith("**") else P(p, P.POSITIONAL_OR_KEYWORD)
                             for p in params.split()])

    def on(b):
        def fn(*args, **kw):
            return compute(_er(), b, *args, **kw)

        fn.__name__, fn.__signature__ = params.split()[0], sig
        return fn

    return on


def _with_info(name: str) -> Callable:
    """The library's ``name`` with return_info: (p, tau, support)."""
    def compute(er, b, x, **prm):
        p, info = getattr(er, name)(x, backend=b, return_info=True, **prm)
        return p, getattr(info, "tau", None), info.support

    return compute


def _loss(er, b, x, target, alpha):
    return (er.entmax_loss(x, target, alpha, backend=b), er.entmax_loss_grad(x, target, alpha, backend=b))


def _scale(er, b, n, beta, gamma, delta, offset):
    g = er.asentmax_scale_vjp(1.0, n, beta, gamma, delta, offset)
    return er.asentmax_scale(n, beta, gamma, delta, offset), g.dbeta, g.dgamma, g.ddelta


#: the form of a row VJP (its parameter after the name)
_ROW_VJP = "fn(x, grad, {0}) -> dx (or fn(p, grad, {0}) with vjp_inputs='p')"
_ROWS = "-> p, or (p, tau) or (p, tau, support) or (p, info)"

OPERATIONS: tuple[Operation, ...] = (
    Operation("entmax", "entmax.jsonl", gen_entmax, replay_rows, _library("x alpha", _with_info("entmax")),
              f"fn(x, alpha) {_ROWS}"),
    Operation("threshold", "entmax.jsonl", None, replay_rows,
              _library("x alpha", lambda er, b, x, alpha: er.entmax_threshold(x, alpha, backend=b)), "fn(x, alpha) -> tau"),
    Operation("entmax_batch", "entmax_batch.jsonl", gen_entmax_batch, replay_rows,
              _library("x alpha", _with_info("entmax")), f"fn(x, alpha) {_ROWS}, alpha one per row"),
    Operation("entmax_vjp", "entmax_vjp.jsonl", gen_entmax_vjp, replay_rows,
              _library("p grad alpha", lambda er, b, p, grad, alpha: er.entmax_vjp(p, grad, alpha, backend=b)),
              _ROW_VJP.format("alpha")),
    Operation("entmax_alpha_vjp", "entmax_alpha_vjp.jsonl", gen_entmax_alpha_vjp, replay_rows,
              _library("p grad alpha", lambda er, b, p, grad, alpha: er.entmax_alpha_vjp(p, grad, alpha, backend=b)),
              "fn(p, grad, alpha) -> dL/dalpha per row"),
    Operation("entmax_loss", "entmax_loss.jsonl", gen_entmax_loss, replay_rows, _library("x target alpha", _loss),
              "fn(x, target, alpha) -> loss per row, or (loss, grad)"),
    Operation("normmax", "normmax.jsonl", gen_normmax, replay_rows, _library("x alpha", _with_info("normmax")),
              f"fn(x, alpha) {_ROWS}"),
    Operation("normmax_threshold", "normmax.jsonl", None, replay_rows,
              _library("x alpha", lambda er, b, x, alpha: er.normmax(x, alpha, backend=b, return_info=True)[1].tau),
              "fn(x, alpha) -> tau"),
    Operation("normmax_vjp", "normmax_vjp.jsonl", gen_normmax_vjp, replay_rows,
              _library("p grad alpha", lambda er, b, p, grad, alpha: er.normmax_vjp(p, grad, alpha, backend=b)),
              _ROW_VJP.format("alpha")),
    Operation("budget_sparsemax", "budget_sparsemax.jsonl", gen_budget_sparsemax, replay_rows,
              _library("x budget", _with_info("budget_sparsemax")), "fn(x, budget) -> p, or (p, tau, support)"),
    Operation("budget_sparsemax_vjp", "budget_sparsemax_vjp.jsonl", gen_budget_sparsemax_vjp, replay_rows,
              _library("p grad budget", lambda er, b, p, grad, budget: er.budget_sparsemax_vjp(p, grad, budget,
                                                                                                backend=b)),
              _ROW_VJP.format("budget")),
    Operation("asentmax_scale", "asentmax_scale.jsonl", gen_asentmax_scale, replay_scale,
              _library("n beta gamma delta offset", _scale),
              "fn(n, beta, gamma, delta, offset) -> s, or (s, ds/dbeta, ds/dgamma, ds/ddelta)"),
    Operation("attention", "attention.jsonl", gen_attention, replay_attention,
              _library("q k v **kw", lambda er, b, q, k, v, **kw: er.attention(q, k, v, backend=b, **kw)),
              "fn(q, k, v, **kw) -> out"),
    Operation("attention_vjp", "attention_vjp.jsonl", gen_attention_vjp, replay_attention,
              _library("do q k v **kw", lambda er, b, do, q, k, v, **kw: er.attention_vjp(do, q, k, v, backend=b,
                                                                                          **kw)[:3]),
              "fn(grad_out, q, k, v, **kw) -> (dq, dk, dv)"),
    Operation("attention_varlen", "attention_varlen.jsonl", gen_attention_varlen, replay_attention,
              _library("q k v cu_seqlens_q cu_seqlens_k **kw", lambda er, b, *a, **kw: er.attention_varlen(
                  *a, backend=b, **kw)), "fn(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw) -> out"),
    Operation("attention_varlen_vjp", "attention_varlen_vjp.jsonl", gen_attention_varlen_vjp, replay_attention,
              _library("do q k v cu_seqlens_q cu_seqlens_k **kw", lambda er, b, *a, **kw: er.attention_varlen_vjp(
                  *a, backend=b, **kw)[:3]), "fn(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, **kw) -> (dq, dk, dv)"),
)

OPS = tuple(o.name for o in OPERATIONS)


def operation(op: str) -> Operation:
    for o in OPERATIONS:
        if o.name == op:
            return o
    raise ValueError(f"unknown corpus operation {op!r}; choose from {', '.join(OPS)}")


def replay_corpus(corpus, fn: Callable, op: str = "entmax", *, name: str | None = None, vjp_inputs: str = "x",
                  framework: str = "numpy", device: Any = None, dtypes=None, alphas=None) -> CheckReport:
    """Replay the cases of operation ``op`` against ``fn`` and return a :class:`CheckReport`:
    one row per dtype, each with a record per case and output in ``row.cases`` (tcId,
    verdict, field, worst index, got, expected, error, bound, reason:
    :mod:`entmax_ref.testing.report`).

    ``corpus`` is a :class:`Corpus` or a directory.  ``fn``'s form depends on ``op`` (see
    :data:`OPERATIONS`): the parameter (alpha, budget) is passed by keyword when fn has a
    parameter of that name, else positionally after the data.  Row inputs are (1, n) arrays
    of the case's dtype; attention inputs the case's arrays with the keywords it uses.
    ``dtypes`` and ``alphas`` select cases (a case is selected when every alpha it uses is
    one of ``alphas``).  Every field the file holds that ``fn`` returns is judged: a
    function that returns p alone has its support counted from p (its entries > 0).
    """
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    o = operation(op)
    label = name or getattr(fn, "__name__", "fn")
    if o.file not in corpus.cases:
        return CheckReport([CheckRow(f"corpus {op}", label, "-", verdict="SKIP", notes=[f"no {o.file} in this corpus"])])
    if vjp_inputs not in ("x", "p"):
        raise ValueError(f"vjp_inputs must be 'x' or 'p', got {vjp_inputs!r}")
    return o.replay(corpus.cases[o.file], fn, op=o.name, label=label, framework=framework, device=device,
                    dtypes=None if dtypes is None else tuple(dtypes), alphas=alphas, vjp_inputs=vjp_inputs)


def replay_backend(corpus, backend: str, ops=None, alphas=None, dtypes=None) -> CheckReport:
    """Replay every operation (or those in ``ops``) against this library on ``backend``: the
    cases whose every alpha is in ``alphas`` and whose dtype is in ``dtypes`` (all when None)."""
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    report = CheckReport()
    for o in OPERATIONS:
        if ops is not None and o.name not in ops:
            continue
        report.extend(replay_corpus(corpus, o.backend_fn(backend), o.name, name=backend, vjp_inputs="p",
                                    alphas=alphas, dtypes=dtypes))
    return report
