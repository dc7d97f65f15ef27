"""The corpus's operations: for each, its file, its generator, its replay and the library's own
implementation of what it checks."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..checks import CheckReport, CheckRow

from .gen_attention import gen_attention, gen_attention_vjp
from .gen_family import gen_budget_sparsemax, gen_budget_sparsemax_vjp, gen_normmax, gen_normmax_vjp
from .gen_rows import gen_asentmax_scale, gen_entmax, gen_entmax_alpha_vjp, gen_entmax_loss, gen_entmax_vjp
from .read import Corpus, load_corpus
from .replay import (replay_alpha_vjp, replay_attention, replay_entmax, replay_entmax_vjp, replay_family, replay_loss,
                     replay_scale, replay_threshold)


@dataclass(frozen=True)
class Operation:
    """One operation of the corpus: its file, its generator and how to replay it.

    ``replay(corpus, fn, label=..., framework=..., device=..., dtypes=..., **options)``
    returns a :class:`CheckReport`; ``backend_fn(backend)`` is the library's own
    implementation of what ``fn`` must compute (used by :func:`replay_backend`), or None
    when the operation has no backend choice."""

    name: str
    file: str
    generate: Callable
    replay: Callable
    backend_fn: Callable | None
    signature: str


def _er():
    import entmax_ref as er

    return er


def _library(name: str, params: str, post: Callable | None = None, **fixed) -> Callable:
    """An Operation's ``backend_fn``: the library's function ``name`` on backend b (and the
    keywords ``fixed``), with the signature ``fn(<params>)`` the replay inspects to call it
    (``**kw`` allowed last), its result passed through ``post``."""
    P = inspect.Parameter
    sig = inspect.Signature([P(p[2:], P.VAR_KEYWORD) if p.startswith("**") else P(p, P.POSITIONAL_OR_KEYWORD)
                             for p in params.split()])

    def on(b):
        def fn(*args, **kw):
            res = getattr(_er(), name)(*args, backend=b, **fixed, **kw)
            return res if post is None else post(res)

        fn.__name__, fn.__signature__ = name, sig
        return fn

    return on


#: the form of a row VJP (its parameter after the name)
_ROW_VJP = "fn(x, grad, {0}) -> dx (or fn(p, grad, {0}) with vjp_inputs='p')"

OPERATIONS: tuple[Operation, ...] = (
    Operation("entmax", "entmax.jsonl", gen_entmax, replay_entmax, _library("entmax", "x alpha"), "fn(x, alpha) -> p"),
    Operation("threshold", "entmax.jsonl", None, replay_threshold, _library("entmax_threshold", "x alpha"),
              "fn(x, alpha) -> tau"),
    Operation("entmax_vjp", "entmax_vjp.jsonl", gen_entmax_vjp, replay_entmax_vjp,
              _library("entmax_vjp", "p grad alpha"), _ROW_VJP.format("alpha")),
    Operation("entmax_alpha_vjp", "entmax_alpha_vjp.jsonl", gen_entmax_alpha_vjp, replay_alpha_vjp,
              _library("entmax_alpha_vjp", "p grad alpha"), "fn(p, grad, alpha) -> dL/dalpha per row"),
    Operation("entmax_loss", "entmax_loss.jsonl", gen_entmax_loss, replay_loss,
              _library("entmax_loss", "x target alpha"), "fn(x, target, alpha) -> loss per row"),
    Operation("normmax", "normmax.jsonl", gen_normmax, replay_family, _library("normmax", "x alpha"),
              "fn(x, alpha) -> p"),
    Operation("normmax_threshold", "normmax.jsonl", None, replay_family,
              _library("normmax", "x alpha", lambda res: res[1].tau, return_info=True), "fn(x, alpha) -> tau"),
    Operation("normmax_vjp", "normmax_vjp.jsonl", gen_normmax_vjp, replay_family,
              _library("normmax_vjp", "p grad alpha"), _ROW_VJP.format("alpha")),
    Operation("budget_sparsemax", "budget_sparsemax.jsonl", gen_budget_sparsemax, replay_family,
              _library("budget_sparsemax", "x budget"), "fn(x, budget) -> p"),
    Operation("budget_sparsemax_vjp", "budget_sparsemax_vjp.jsonl", gen_budget_sparsemax_vjp, replay_family,
              _library("budget_sparsemax_vjp", "p grad budget"), _ROW_VJP.format("budget")),
    Operation("asentmax_scale", "asentmax_scale.jsonl", gen_asentmax_scale, replay_scale, None,
              "fn(n, beta, gamma, delta, offset) -> s"),
    Operation("attention", "attention.jsonl", gen_attention, replay_attention,
              _library("attention", "q k v **kw"), "fn(q, k, v, **kw) -> out"),
    Operation("attention_vjp", "attention_vjp.jsonl", gen_attention_vjp, replay_attention,
              _library("attention_vjp", "do q k v **kw", lambda res: res[:3]), "fn(grad_out, q, k, v, **kw) -> (dq, dk, dv)"),
)

OPS = tuple(o.name for o in OPERATIONS)


def operation(op: str) -> Operation:
    for o in OPERATIONS:
        if o.name == op:
            return o
    raise ValueError(f"unknown corpus operation {op!r}; choose from {', '.join(OPS)}")


def replay_corpus(corpus, fn: Callable, op: str = "entmax", *, name: str | None = None, vjp_inputs: str = "x",
                  framework: str = "numpy", device: Any = None, dtypes=None) -> CheckReport:
    """Replay the cases of operation ``op`` against ``fn`` and return a :class:`CheckReport`
    (one row per dtype; failures name the case kind, alpha and why it is hard).

    ``corpus`` is a :class:`Corpus` or a directory.  ``fn``'s form depends on ``op`` (see
    :data:`OPERATIONS`): alpha is passed by keyword when fn has an ``alpha`` parameter,
    else positionally when it takes one more argument, else not at all.  Row inputs are
    (1, n) arrays of the case's dtype; attention inputs (B, H, N, D) arrays with the
    keywords the case uses (causal, key_lengths, key_padding_mask, alibi_slopes, beta, gamma) and the
    default scale 1/sqrt(D).
    """
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    o = operation(op)
    label = name or getattr(fn, "__name__", "fn")
    kw = dict(label=label, framework=framework, device=device, dtypes=None if dtypes is None else tuple(dtypes))
    if o.file not in corpus.cases:
        return CheckReport([CheckRow(f"corpus {op}", label, "-", verdict="SKIP", notes=[f"no {o.file} in this corpus"])])
    if o.name in ("attention", "attention_vjp"):
        return o.replay(corpus, fn, op=o.name, **kw)
    if o.name == "asentmax_scale":
        return o.replay(corpus, fn, **kw)
    if o.name == "entmax_vjp":
        return o.replay(corpus, fn, vjp_inputs=vjp_inputs, **kw)
    if o.replay is replay_family:
        return o.replay(corpus, fn, op=o.name, vjp_inputs=vjp_inputs, **kw)
    return o.replay(corpus, fn, **kw)


def replay_backend(corpus, backend: str, ops=None) -> CheckReport:
    """Replay every operation (or those in ``ops``) against this library on ``backend``."""
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    report = CheckReport()
    for o in OPERATIONS:
        if ops is not None and o.name not in ops:
            continue
        if o.backend_fn is None:
            fn = _er().asentmax_scale
        else:
            fn = o.backend_fn(backend)
        if o.replay is replay_family:  # SKIP where the backend lacks the operation
            z = np.zeros((1, 2))
            try:
                fn(*((z, z) if o.name.endswith("_vjp") else (z,)), 2.0)
            except NotImplementedError as exc:
                report.rows.append(CheckRow(f"corpus {o.name}", backend, "-", verdict="SKIP",
                                            notes=[f"not implemented ({str(exc).splitlines()[0][:80]})"]))
                continue
            except Exception:  # noqa: BLE001 - the replay reports it properly
                pass
        report.extend(replay_corpus(corpus, fn, o.name, name=backend, vjp_inputs="p"))
    return report


