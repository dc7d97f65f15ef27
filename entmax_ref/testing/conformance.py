"""The conformance corpus: expected values as language-neutral data files.

``entmax-ref corpus --out DIR [--seed N] [--size small|full]`` writes ``DIR/manifest.json``
and one JSON Lines file per operation (one case per line), so that implementations in any
language (C++, Rust, Julia, JavaScript, a CUDA harness) can be tested against this
reference without Python.  :func:`load_corpus` reads a corpus back (checking its schema
version and SHA-256 checksums) and :func:`replay_corpus` / ``entmax-ref check --corpus DIR
[--impl mod:fn]`` replays it against an implementation.  The schema is documented in
``docs/corpus.md``.

Not to be confused with :mod:`entmax_ref.testing.corpus`, the *built-in* seeded case set
that ``entmax-ref check`` generates in memory; this module reuses its row and attention
generators and adds the cases chosen to break implementations (near-ties, entries at the
support boundary, huge offsets, alpha near 1 and far above 2, the property tests' frozen
failures).

Every float is a string: the shortest decimal that round-trips the value in the case's
``dtype`` for inputs, in float64 for expected values and tolerances; ``"-inf"``, ``"inf"``
and ``"nan"`` spell the non-finite values.  Expected values are the float64 reference
(NumPy backend); the row operations are checked at generation time against the 50-digit
mpmath oracle (:mod:`entmax_ref.testing.oracle`), and each row case records how far the
written value is from it (``oracle_err``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import tolerance as T
from .assertions import (attention_grad_tolerances, attention_out_tolerance, attention_reference, compare,
                         reference_attention_grads)
from .calling import CallError as _CallError, attention_grads as _attention_grads, caller as _caller
from .calling import attention_signature as _attention_signature, guarded_call as _run, safe_np as _safe_np
from .calling import positional_capacity as _positional_capacity
from .checks import CheckReport, CheckRow
from ._adapters import from_numpy
from .corpus import FEATURES, attention_corpus, row_corpus

__all__ = [
    "SCHEMA_VERSION",
    "SIZES",
    "OPERATIONS",
    "Corpus",
    "CorpusError",
    "generate_corpus",
    "load_corpus",
    "replay_backend",
    "replay_corpus",
]

SCHEMA_VERSION = 1
SIZES = ("small", "full")
#: alpha values every row source is solved at: softmax, alpha near 1, 1.25, entmax15,
#: sparsemax, and alpha above 2 (3) and far above it (10)
ROW_ALPHAS = (1.0, 1.000001, 1.25, 1.5, 2.0, 3.0, 10.0)
DTYPES = ("float64", "float32")
#: the float64 accuracy contract (tests/test_oracle.py): alpha <= 2 rows are within this of the oracle
ORACLE_ATOL = 4e-15


class CorpusError(ValueError):
    """A corpus directory that is missing, of another schema version, or corrupted."""


# ----------------------------------------------------------------------------- numbers


def num(value: float, dtype: str = "float64") -> str:
    """The shortest decimal string that round-trips ``value`` in ``dtype`` ("-inf", "inf", "nan")."""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if dtype == "float32":
        return str(np.float32(v))
    return repr(v)


def nums(a, dtype: str = "float64"):
    """A (nested) list of :func:`num` strings for an array."""
    a = np.asarray(a)
    if a.ndim == 0:
        return num(a, dtype)
    return [nums(r, dtype) for r in a] if a.ndim > 1 else [num(v, dtype) for v in a.tolist()]


def parse(strings, dtype: str = "float64") -> np.ndarray:
    """A (nested) list of number strings back to an array of ``dtype``."""
    return np.asarray(np.array(strings, dtype=object).astype(np.float64), dtype=np.dtype(dtype))


def _roundtrips(strings, values: np.ndarray, dtype: str) -> None:
    back = parse(strings, dtype)
    same = (back == values) | (np.isnan(back) & np.isnan(values))
    if not np.all(same):  # pragma: no cover - a formatting bug
        raise AssertionError(f"number strings do not round-trip in {dtype}")


# ----------------------------------------------------------------------------- row sources

#: why each built-in corpus case (entmax_ref.testing.corpus.row_corpus) is hard
_BUILTIN_WHY = {
    "random": "Gaussian scores at scale 0.5, 2 or 10",
    "ties": "exact ties (multiples of 1/4), some at the threshold",
    "masks": "-inf (masked) entries; some rows have a single finite entry",
    "all-masked": "every entry -inf: p = 0, tau = -inf, support 0",
    "extreme": "huge offsets (1e4, -1e5) or a huge spread (scale 1e3)",
    "tiny": "n = 1 or n = 2",
    "long": "a long row (summation error grows with n)",
}


@dataclass
class _Row:
    kind: str
    why: str
    x: np.ndarray  #: float64 row
    alphas: tuple = ROW_ALPHAS


def _row_sources(size: str, seed: int) -> list[_Row]:
    """The rows every row operation is generated from."""
    from .oracle import edge_row

    out: list[_Row] = []
    for case in row_corpus("quick" if size == "small" else "default", seed):
        for r in case.x:
            # long rows at fewer alphas: the 50-digit check of each costs seconds
            alphas = (1.0, 1.5, 2.0, 3.0) if case.name == "long" else ROW_ALPHAS
            out.append(_Row(case.name, _BUILTIN_WHY[case.name], r.copy(), alphas))
    rng = np.random.default_rng([seed, 15])
    big = size == "full"
    # near-ties: the top entries one ulp apart, or 1e-12 apart, or all equal but one
    for _ in range(4 if big else 2):
        x = rng.standard_normal(9)
        i, j = np.argsort(x)[-2:]
        x[i] = np.nextafter(x[j], -np.inf)
        out.append(_Row("near-ties", "the two largest entries one ulp apart", x))
        y = rng.standard_normal(9)
        y[np.argsort(y)[-2]] = y.max() - 1e-12
        out.append(_Row("near-ties", "the two largest entries 1e-12 apart", y))
    z = np.full(8, 0.7)
    z[3] = np.nextafter(0.7, 1.0)
    out.append(_Row("near-ties", "all entries equal but one, one ulp above the rest", z))
    # huge offsets that make the spacing of the scores coarse, and differences that overflow
    for off in (1e15, -1e15):
        out.append(_Row("huge-offset", f"scores near {off:g} (float64 spacing 0.125)", rng.standard_normal(11) * 4 + off))
    out.append(_Row("huge-offset", "scores 1e150 apart (their squares near float64's range)",
                    np.array([1e150, 0.0, -1e150])))
    # the property tests' frozen failures (tests/test_entmax_properties.py)
    out.append(_Row("found-by-hypothesis", "frozen example: an all -inf row once warned 0 * -inf in tau",
                    np.full(5, -np.inf), (1.0,)))
    out.append(_Row("found-by-hypothesis", "frozen example: the offset form lost the edge entry at alpha 20",
                    np.array([0.0, 0.03125]), (20.0,)))
    out.append(_Row("found-by-hypothesis", "frozen example (and the CUDA core's regression row): edge p = 4.96e-4 at alpha 100",
                    np.array([0.0, -0.009617]), (100.0,)))
    n_off = 100_000 if big else 2048
    out.append(_Row("found-by-hypothesis", f"long row (n = {n_off}) at offset 1e6 (test_long_row_with_offset)",
                    np.random.default_rng(7).standard_normal(n_off) + 1e6, (1.5,)))
    # alpha far above 2: edge rows whose edge gap is below float64's range
    for alpha, ties, deficit, spread in ((20.0, 1, 1e-3, True), (100.0, 2, 1e-3, True), (100.0, 1, 5e-4, False),
                                         (1000.0, 3, 0.3, True), (1000.0, 1, 0.5, False)):
        for _ in range(3 if big else 1):
            out.append(_Row("alpha-far-above-2", f"alpha {alpha:g}: edge entries carry ~{deficit:g} whose gap to the "
                            "threshold underflows float64", edge_row(rng, alpha, ties, deficit, spread), (alpha,)))
    return out


def _boundary_rows(alpha: float, rng) -> list[_Row]:
    """Rows with entries at (or one ulp from) the support boundary, for one alpha > 1."""
    rows = []
    a1 = alpha - 1.0
    for k in (1, 2, 3):
        # Lemma 2: k equal top entries and the rest exactly k^(1-alpha)/(alpha-1) below sit
        # at the threshold (p = 1/k on the top, 0 on the rest)
        gap = k ** (-a1) / a1
        b = -gap
        x = np.concatenate([np.zeros(k), [b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf), b - 1.0]])
        rows.append(_Row("support-boundary", f"{k} equal top entries; others at the threshold and one ulp either side",
                         rng.permutation(x), (alpha,)))
    # a random row with an entry inserted at its own threshold theta (and one ulp either side)
    import entmax_ref as er

    x = rng.standard_normal(10)
    tau = float(er.entmax_threshold(x, alpha, backend="numpy"))
    theta = tau / a1  # p_i = [(alpha - 1) x_i - tau]_+^(1/(alpha-1)) is 0 from x_i = tau / (alpha - 1) down
    for d, what in ((0.0, "exactly at"), (np.inf, "one ulp above"), (-np.inf, "one ulp below")):
        y = np.append(x, theta if d == 0.0 else np.nextafter(theta, d))
        rows.append(_Row("support-boundary", f"an entry {what} the row's threshold", rng.permutation(y), (alpha,)))
    return rows


# ----------------------------------------------------------------------------- the oracle


class _Oracle:
    """The 50-digit oracle, memoised on (row, alpha)."""

    def __init__(self):
        from . import oracle

        self.mp = oracle.mp
        self.entmax_mp = oracle.entmax_mp
        self.cache: dict = {}
        self.calls = 0

    def row(self, x64: np.ndarray, alpha: float, tau: float):
        key = (x64.tobytes(), alpha)
        if key not in self.cache:
            self.calls += 1
            if not np.isfinite(x64).any():  # all masked: p = 0, tau = -inf (the contract)
                self.cache[key] = ([self.mp.mpf(0)] * len(x64), self.mp.mpf("-inf"))
                return self.cache[key]
            start = tau / (alpha - 1.0) if alpha != 1.0 and np.isfinite(tau) else None
            p, T_ = self.entmax_mp(x64, alpha, start)
            with self.mp.workdps(50):
                tau_mp = T_ if alpha == 1.0 else (self.mp.mpf(alpha) - 1) * T_
            self.cache[key] = (p, tau_mp)
        return self.cache[key]


def _mp_err(mp, got, exact) -> float:
    with mp.workdps(50):
        return float(max((abs(mp.mpf(float(g)) - e) for g, e in zip(got, exact)), default=mp.mpf(0)))


# ----------------------------------------------------------------------------- generators


@dataclass
class _Context:
    size: str
    seed: int
    oracle: _Oracle
    rows: list
    stats: dict = field(default_factory=dict)


_REF_CACHE: dict = {}


def _ref(x64, alpha):
    """The float64 reference (p, tau, support) of one row (memoised for one generation)."""
    import entmax_ref as er

    key = (x64.tobytes(), alpha)
    if key not in _REF_CACHE:
        p, info = er.entmax(x64[None], alpha, backend="numpy", return_info=True)
        _REF_CACHE[key] = (p[0], float(info.tau[0]), int(info.support[0]))
    p, tau, support = _REF_CACHE[key]
    return p.copy(), tau, support


def _prefill_refs(ctx: _Context) -> None:
    """Solve every row case's reference in one call per (n, alpha): a tenth of the time of
    one call per row, and row for row the same numbers (the solver works per row)."""
    import entmax_ref as er

    groups: dict = {}
    for _, a, _, _, x64 in _row_cases(ctx):
        key = (x64.tobytes(), a)
        if key not in _REF_CACHE:
            groups.setdefault((len(x64), a), {})[key] = x64
    for (_, a), rows in groups.items():
        X = np.stack(list(rows.values()))
        p, info = er.entmax(X, a, backend="numpy", return_info=True)
        for i, key in enumerate(rows):
            _REF_CACHE[key] = (p[i], float(info.tau[i]), int(info.support[i]))


def _row_cases(ctx: _Context):
    """(source row, alpha, dtype, x in dtype, x as float64) for every row case."""
    rng = np.random.default_rng([ctx.seed, 16])
    rows = list(ctx.rows)
    for a in ROW_ALPHAS:
        if a > 1.0:
            rows.extend(_boundary_rows(a, rng))
    for src in rows:
        for a in src.alphas:
            for dt in DTYPES:
                with np.errstate(over="ignore"):
                    x = src.x.astype(dt)
                if np.any(np.isinf(x) & np.isfinite(src.x)):
                    continue  # not representable in dt (1e300 in float32)
                yield src, a, dt, x, x.astype(np.float64)


def gen_entmax(ctx: _Context):
    """entmax.jsonl: p, tau and support of alpha-entmax (softmax at alpha 1, sparsemax at 2)."""
    mp = ctx.oracle.mp
    for src, a, dt, x, x64 in _row_cases(ctx):
        p, tau, support = _ref(x64, a)
        tol_p = T.entmax_tolerance(p[None], a, dt, masked=np.isneginf(x64)[None])[0]
        tol_tau = float(T.threshold_tolerance(np.array([tau]), a, dt, len(x))[0])
        exact, tau_mp = ctx.oracle.row(x64, a, tau)
        with mp.workdps(50):
            tau_err = 0.0 if not np.isfinite(tau) else float(abs(mp.mpf(tau) - tau_mp))
            per_entry = np.array([float(abs(mp.mpf(float(g)) - e)) for g, e in zip(p, exact)])
        err = float(per_entry.max(initial=0.0))
        budget = T.entmax_tolerance(p[None], a, "float64", masked=np.isneginf(x64)[None])[0]
        within = not (np.any(per_entry > budget) or (np.isfinite(tau) and tau_err > T.threshold_tolerance(
            np.array([tau]), a, "float64", len(x))[0]))
        reaches = err <= ORACLE_ATOL
        if not reaches and a <= 2.0:
            raise RuntimeError(f"the float64 reference misses the {ORACLE_ATOL:g} contract at alpha={a!r}: "
                               f"x={x64.tolist()!r} (error {err:.3g})")
        case = {"op": "entmax", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
                "p": nums(p), "tau": num(tau), "support": support, "tol_p": nums(tol_p), "tol_tau": num(tol_tau),
                "oracle_err": num(err), "reaches_oracle": bool(reaches), "within_tol_of_oracle": bool(within),
                "why": src.why}
        if not within:
            case["why"] += "; the float64 reference is further from the oracle than its own float64 tolerance"
        if not reaches:
            case["why"] += ("; ill-conditioned (alpha > 2): float64 is within its budget of the 50-digit oracle "
                            "but not within 4e-15")
        _roundtrips(case["x"], x, dt)
        yield case


def _vjp_mp(mp, exact, g, a):
    with mp.workdps(50):
        a2 = 2 - mp.mpf(a)
        u = [e ** a2 if e > 0 else mp.mpf(0) for e in exact]
        su = mp.fsum(u)
        if su == 0:
            return [mp.mpf(0)] * len(exact)
        m = mp.fsum(ui * mp.mpf(float(gi)) for ui, gi in zip(u, g)) / su
        return [ui * (mp.mpf(float(gi)) - m) for ui, gi in zip(u, g)]


def gen_entmax_vjp(ctx: _Context):
    """entmax_vjp.jsonl: dx = J^T grad at x (u = p^(2-alpha): dx = u (grad - <u, grad> / sum u))."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 17])
    for src, a, dt, x, x64 in _row_cases(ctx):
        if a > 10.0:
            continue  # u = p^(2 - alpha) overflows float64 on these rows' edge entries
        p, tau, _ = _ref(x64, a)
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = er.entmax_vjp(p[None], g64[None], a, backend="numpy")
        tol = float(T.vjp_tolerance(p[None], g64[None], dx, a, dt)[0, 0]) if len(x) else 0.0
        from entmax_ref.backends._base import tau_to_theta

        ill = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, dt)[0])
        exact, _ = ctx.oracle.row(x64, a, tau)
        dx_mp = _vjp_mp(mp, exact, g64, a)
        err = _mp_err(mp, dx[0], dx_mp)
        ill64 = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, "float64")[0])
        tol64 = float(T.vjp_tolerance(p[None], g64[None], dx, a, "float64")[0, 0]) if len(x) else 0.0
        within = ill64 or err <= tol64
        why = src.why + ("; ill-posed gradient (alpha >= 2 with an entry at the threshold): compare only "
                         "implementations that take p" if ill else "")
        yield {"op": "entmax_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "p": nums(p), "grad": nums(g, dt), "dx": nums(dx[0]), "tol_dx": num(tol), "ill_posed": ill,
               "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": why}


def _alpha_vjp_mp(mp, exact, g, a):
    with mp.workdps(50):
        a = mp.mpf(a)
        a1 = a - 1
        on = [e > 0 for e in exact]
        ell = [mp.log(e) if o else mp.mpf(0) for e, o in zip(exact, on)]

        def h(w):
            return (mp.expm1(w) - w) / w ** 2 if w != 0 else mp.mpf(1) / 2

        c = [-li ** 2 * h(-a1 * li) for li in ell]
        u = [e ** (2 - a) if o else mp.mpf(0) for e, o in zip(exact, on)]
        su = mp.fsum(u)
        if su == 0:
            return mp.mpf(0)
        m = mp.fsum(e * ci for e, ci in zip(exact, c)) / su
        return mp.fsum(mp.mpf(float(gi)) * (e * ci - ui * m) for gi, e, ci, ui in zip(g, exact, c, u))


def gen_entmax_alpha_vjp(ctx: _Context):
    """entmax_alpha_vjp.jsonl: dL/dalpha = sum_i grad_i dp_i/dalpha, float64, rows with n <= 64."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 18])
    for src, a, dt, x, x64 in _row_cases(ctx):
        if dt != "float64" or a > 10.0 or len(x) > 64:
            continue
        p, tau, _ = _ref(x64, a)
        g = rng.standard_normal(len(x))
        da = float(np.asarray(er.entmax_alpha_vjp(p[None], g[None], a, backend="numpy"))[0])
        exact, _ = ctx.oracle.row(x64, a, tau)
        err = float(abs(mp.mpf(da) - _alpha_vjp_mp(mp, exact, g, a)))
        tol = float(T.alpha_vjp_tolerance(p[None], g[None], da, a, dt)[0])
        from entmax_ref.backends._base import tau_to_theta

        ill = bool(T.ill_posed_rows(x64[None], tau_to_theta(np.array([tau]), np.array([a])), a, "float64")[0])
        within = ill or err <= tol
        yield {"op": "entmax_alpha_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x),
               "x": nums(x, dt), "p": nums(p), "grad": nums(g), "dalpha": num(da), "tol_dalpha": num(tol),
               "ill_posed": ill, "oracle_err": num(err), "within_tol_of_oracle": bool(within),
               "why": src.why + ("; ill-posed at x (alpha >= 2 with an entry at the threshold): dalpha is "
                                 "exact for the p given, not for x" if ill else "")}


def _loss_mp(mp, exact, x64, target, a):
    with mp.workdps(50):
        a = mp.mpf(a)

        def omega(ps):
            if a == 1:
                return mp.fsum(pi * mp.log(pi) for pi in ps if pi > 0)
            return (mp.fsum(pi ** a for pi in ps if pi > 0) - 1) / (a * (a - 1))

        q = [mp.mpf(1) if i == target else mp.mpf(0) for i in range(len(exact))]
        top = mp.mpf(float(x64.max()))
        lin = mp.fsum((e - qi) * (mp.mpf(float(v)) - top) for e, qi, v in zip(exact, q, x64) if e != qi)
        return omega(q) - omega(exact) + lin


def gen_entmax_loss(ctx: _Context):
    """entmax_loss.jsonl: the Fenchel-Young loss for a target class, and its gradient p - onehot."""
    import entmax_ref as er

    mp = ctx.oracle.mp
    rng = np.random.default_rng([ctx.seed, 19])
    items = []
    for src, a, dt, x, x64 in _row_cases(ctx):
        finite = np.flatnonzero(np.isfinite(x64))
        if not len(finite) or len(x) > 64 or a > 10.0:
            continue
        items.append((src, a, dt, x, x64, int(finite[0]) if rng.random() < 0.5 else int(np.argmax(x64))))
    losses: dict = {}  # one call per (n, alpha): the loss is computed row by row
    groups: dict = {}
    for i, it in enumerate(items):
        groups.setdefault((len(it[4]), it[1]), []).append(i)
    for (_, a), idx in groups.items():
        L = er.entmax_loss(np.stack([items[i][4] for i in idx]), np.array([items[i][5] for i in idx]), a,
                           backend="numpy")
        losses.update(zip(idx, np.asarray(L, np.float64).tolist()))
    for i, (src, a, dt, x, x64, target) in enumerate(items):
        loss = losses[i]
        p, tau, _ = _ref(x64, a)
        onehot = np.eye(len(x))[target]
        grad = p - onehot
        tol = float(T.loss_tolerance(x64[None], p[None], onehot[None], loss, dt)[0])
        tol_g = T.entmax_tolerance(p[None], a, dt)[0] + T.unit_roundoff(np.float64) * np.abs(grad)
        exact, _ = ctx.oracle.row(x64, a, tau)
        err = float(abs(mp.mpf(loss) - _loss_mp(mp, exact, x64, target, a)))
        within = err <= float(T.loss_tolerance(x64[None], p[None], onehot[None], loss, "float64")[0])
        yield {"op": "entmax_loss", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "target": target, "loss": num(loss), "tol_loss": num(tol), "grad": nums(grad), "tol_grad": nums(tol_g),
               "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": src.why}


def gen_asentmax_scale(ctx: _Context):
    """asentmax_scale.jsonl: s = delta + beta log(n + c)^gamma and ds/dbeta, ds/dgamma, ds/ddelta."""
    import entmax_ref as er

    from .oracle import mp

    rng = np.random.default_rng([ctx.seed, 20])
    grid = [(n, c) for n in (0, 1, 2, 7, 100, 4095, 1_000_000) for c in (1.0, 0.5, float(np.e) - 1.0)
            if math.log(n + c) > 0]
    for n, c in grid:
        for _ in range(6 if ctx.size == "full" else 2):
            beta = float(rng.choice([0.0, 0.5, 1.0, 2.5, -0.75, float(rng.uniform(0.1, 3))]))
            gamma = float(rng.choice([1.0, 0.5, 2.0, float(rng.uniform(0.2, 3))]))
            delta = float(rng.choice([1.0, 0.0, -0.5]))
            s = float(er.asentmax_scale(n, beta, gamma, delta, c))
            gr = er.asentmax_scale_vjp(1.0, n, beta, gamma, delta, c)
            db, dg, dd = float(gr.dbeta), float(gr.dgamma), float(gr.ddelta)
            with mp.workdps(50):
                L = mp.log(mp.mpf(n) + mp.mpf(c))
                Lg = L ** mp.mpf(gamma)
                s_mp = mp.mpf(delta) + mp.mpf(beta) * Lg
                dg_mp = mp.mpf(beta) * Lg * mp.log(L)
                errs = (float(abs(mp.mpf(s) - s_mp)), float(abs(mp.mpf(db) - Lg)), float(abs(mp.mpf(dg) - dg_mp)))
            tols = T.asentmax_scale_tolerances(n, beta, gamma, delta, c, s, dg)
            if any(e > t for e, t in zip(errs, tols)) or dd != 1.0:
                raise RuntimeError(f"asentmax_scale reference off the oracle: n={n}, beta={beta}, gamma={gamma}")
            yield {"op": "asentmax_scale", "kind": "scale", "dtype": "float64", "n": n, "beta": num(beta),
                   "gamma": num(gamma), "delta": num(delta), "offset": num(c), "s": num(s), "dbeta": num(db),
                   "dgamma": num(dg), "ddelta": num(dd), "tol_s": num(tols[0]), "tol_dbeta": num(tols[1]),
                   "tol_dgamma": num(tols[2]), "tol_ddelta": "0.0", "oracle_err": num(max(errs)),
                   "why": "n = 0 with c = e - 1 (log = 1), c < 1, long contexts, negative beta and delta"
                   if n == 0 else "length-dependent temperature of ASEntmax"}


# ----------------------------------------------------------------------------- normmax, budget-sparsemax

#: normmax alphas: near 1 (p ~ t^1000 and t^20: underflow-prone powers), 1.5, 2, 3 and large
NORMMAX_ALPHAS = (1.001, 1.05, 1.5, 2.0, 3.0, 10.0, 50.0)
#: budgets: 0, integers, fractional ones, and n (every entry 1)
BUDGETS = (0.0, 1.0, 2.0, 0.3, 2.5)
#: the built-in row kinds (and how many of each) the family operations are generated from
_FAMILY_KINDS = {"random": 6, "ties": 4, "masks": 6, "all-masked": 1, "extreme": 6, "tiny": 8, "near-ties": 5,
                 "huge-offset": 3}


def _family_rows(ctx: _Context) -> list[_Row]:
    """The rows (n <= 64) normmax and budget-sparsemax are generated from: a subset of the
    entmax row sources (their oracles cost tens of ms a row) plus rows of their own."""
    out, seen = [], {}
    for r in ctx.rows:
        cap = _FAMILY_KINDS.get(r.kind, 0) * (3 if ctx.size == "full" else 1)
        if len(r.x) <= 64 and seen.get(r.kind, 0) < cap:
            seen[r.kind] = seen.get(r.kind, 0) + 1
            out.append(r)
    rng = np.random.default_rng([ctx.seed, 23])
    x = rng.standard_normal(6)
    x[[1, 4]] = -np.inf
    out.append(_Row("masks", "two finite entries among -inf: fewer unmasked entries than most budgets", x))
    out.append(_Row("masks", "a single finite entry", np.array([-np.inf, 0.25, -np.inf, -np.inf])))
    out.append(_Row("huge-offset", "scores near 1e6 with a spread of 1e-3 (cancellation in x - tau)",
                    1e6 + rng.standard_normal(12) * 1e-3))
    out.append(_Row("near-ties", "all entries equal (uniform p)", np.full(7, -1.75)))
    return out


def _normmax_boundary_rows(alpha: float, rng) -> list[_Row]:
    """k equal top entries (at 0) and entries exactly at normmax's threshold and one ulp
    either side: with s below the top, k (0 - s)^beta = 1 puts tau at s (beta = alpha/(alpha-1))."""
    beta = alpha / (alpha - 1.0)
    rows = []
    for k in (1, 2, 3):
        s = -((1.0 / k) ** (1.0 / beta))
        x = np.concatenate([np.zeros(k), [s, np.nextafter(s, np.inf), np.nextafter(s, -np.inf), s - 1.0]])
        rows.append(_Row("support-boundary", f"{k} equal top entries; others at the threshold (k |s|^beta = 1) "
                         "and one ulp either side", rng.permutation(x), (alpha,)))
    return rows


def _family_cases(ctx: _Context, params, boundary=None, salt=24):
    """(source row, parameter, dtype, x, x64): every row at a rotation of three of
    ``params`` (all of them with --size full) in both dtypes, plus the boundary rows."""
    rng = np.random.default_rng([ctx.seed, salt])
    rows = _family_rows(ctx)
    picks = []
    for i, src in enumerate(rows):
        ps = params if ctx.size == "full" else [params[(i + j) % len(params)] for j in (0, 2, 4)]
        picks.extend((src, p) for p in ps)
    if boundary is not None:
        for p in params:
            picks.extend((src, p) for src in boundary(p, rng))
    for src, prm in picks:
        for dt in DTYPES:
            with np.errstate(over="ignore"):
                x = src.x.astype(dt)
            if np.any(np.isinf(x) & np.isfinite(src.x)):
                continue
            yield src, prm, dt, x, x.astype(np.float64)


class _FamilyOracle:
    """The normmax (50 digits) and budget (exact rational) oracles, memoised per row."""

    def __init__(self):
        from . import family_oracle

        self.fo = family_oracle
        self.cache: dict = {}

    def normmax(self, x64, alpha):
        key = ("n", x64.tobytes(), alpha)
        if key not in self.cache:
            self.cache[key] = self.fo.normmax_mp(x64, alpha)
        return self.cache[key]

    def budget(self, x64, budget):
        key = ("b", x64.tobytes(), budget)
        if key not in self.cache:
            self.cache[key] = self.fo.budget_exact(x64, budget)
        return self.cache[key]


def _family_oracle(ctx: _Context) -> _FamilyOracle:
    if "family_oracle" not in ctx.stats:
        ctx.stats["family_oracle"] = _FamilyOracle()
    return ctx.stats["family_oracle"]


def _normmax_ref(x64, a):
    import entmax_ref as er

    p, info = er.normmax(x64[None], a, backend="numpy", return_info=True)
    return p[0], float(info.tau[0]), int(info.support[0])


def gen_normmax(ctx: _Context):
    """normmax.jsonl: p, tau and support of alpha-normmax, checked against the 50-digit oracle."""
    from .family_checks import normmax_threshold_tolerance, normmax_tolerance

    fo = _family_oracle(ctx)
    mp = fo.fo.mp
    for src, a, dt, x, x64 in _family_cases(ctx, NORMMAX_ALPHAS, _normmax_boundary_rows):
        p, tau, support = _normmax_ref(x64, a)
        tol_p = normmax_tolerance(p[None], [tau], x64[None], a, dt)[0]
        tol_tau = float(normmax_threshold_tolerance(x64[None], dt)[0]) if np.isfinite(tau) else 0.0
        exact, tau_mp = fo.normmax(x64, a)
        with mp.workdps(50):
            per_entry = np.array([float(abs(mp.mpf(float(v)) - e)) for v, e in zip(p, exact)])
            tau_err = 0.0 if tau_mp is None else float(abs(mp.mpf(tau) - tau_mp))
        err = float(per_entry.max(initial=0.0))
        within = bool(np.all(per_entry <= normmax_tolerance(p[None], [tau], x64[None], a, "float64")[0])
                      and (tau_mp is None) == (not np.isfinite(tau))
                      and tau_err <= float(normmax_threshold_tolerance(x64[None], "float64")[0]))
        case = {"op": "normmax", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
                "p": nums(p), "tau": num(tau), "support": support, "tol_p": nums(tol_p), "tol_tau": num(tol_tau),
                "oracle_err": num(max(err, tau_err)), "within_tol_of_oracle": within, "why": src.why}
        if not within:
            case["why"] += "; the float64 reference is further from the oracle than its own float64 tolerance"
        _roundtrips(case["x"], x, dt)
        yield case


def _normmax_vjp_mp(mp, x64, tau_mp, exact, g, alpha):
    """dx = c - p sum(c), c_i = r_i (g_i - <p, g>), r_i = gg t_i^(gg-1) / sum_j t_j^gg on
    the support, t = x - tau, gg = 1/(alpha-1) (differentiating the KKT conditions)."""
    with mp.workdps(50):
        if tau_mp is None:
            return [mp.mpf(0)] * len(x64)
        gg = 1 / (mp.mpf(alpha) - 1)
        t = [mp.mpf(float(v)) - tau_mp if np.isfinite(v) and mp.mpf(float(v)) > tau_mp else None for v in x64]
        S = mp.fsum(ti ** gg for ti in t if ti is not None)
        r = [gg * ti ** (gg - 1) / S if ti is not None else mp.mpf(0) for ti in t]
        m = mp.fsum(e * mp.mpf(float(gi)) for e, gi in zip(exact, g))
        c = [ri * (mp.mpf(float(gi)) - m) for ri, gi in zip(r, g)]
        sc = mp.fsum(c)
        return [ci - e * sc for ci, e in zip(c, exact)]


def gen_normmax_vjp(ctx: _Context):
    """normmax_vjp.jsonl: dx = J^T grad of alpha-normmax at x, checked against the oracle."""
    import entmax_ref as er

    from .family_checks import normmax_vjp_tolerance

    fo = _family_oracle(ctx)
    mp = fo.fo.mp
    rng = np.random.default_rng([ctx.seed, 25])
    for src, a, dt, x, x64 in _family_cases(ctx, NORMMAX_ALPHAS, _normmax_boundary_rows):
        p, tau, _ = _normmax_ref(x64, a)
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = np.asarray(er.normmax_vjp(p[None], g64[None], a, backend="numpy"), np.float64)
        tol, ill = normmax_vjp_tolerance(p[None], x64[None], [tau], g64[None], dx, a, dt, ill_posed_inf=False)
        tol64, ill64 = normmax_vjp_tolerance(p[None], x64[None], [tau], g64[None], dx, a, "float64")
        exact, tau_mp = fo.normmax(x64, a)
        err = _mp_err(mp, dx[0], _normmax_vjp_mp(mp, x64, tau_mp, exact, g64, a))
        ill = bool(ill[0])
        within = bool(ill64[0]) or err <= float(tol64[0, 0])
        why = src.why + ("; ill-posed gradient (alpha >= 2 with an entry at the threshold): compare only "
                         "implementations that take p" if ill else "")
        yield {"op": "normmax_vjp", "kind": src.kind, "alpha": num(a), "dtype": dt, "n": len(x), "x": nums(x, dt),
               "p": nums(p), "grad": nums(g, dt), "dx": nums(dx[0]), "tol_dx": num(tol[0, 0]),
               "ill_posed": ill, "oracle_err": num(err), "within_tol_of_oracle": bool(within), "why": why}


def _budget_boundary_rows(budget: float, rng) -> list[_Row]:
    """Rows whose entries sit exactly on budget-sparsemax's breakpoints (p = 0 or 1) and
    one ulp either side: tau = 0 with entries at 0 and 1."""
    rows = []
    x = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 0.0, np.nextafter(0.0, 1.0), -0.0, -1e-300,
                  0.5, 0.25])
    rows.append(_Row("support-boundary", "entries at the breakpoints 0 and 1 and one ulp (or a denormal) away",
                     rng.permutation(x), (budget,)))
    y = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])  # exact ties: tau between the breakpoints of a tied group
    rows.append(_Row("ties", "a tied group that the budget splits (entries share the mass equally)", y, (budget,)))
    return rows


def _budget_cases(ctx: _Context):
    """The family cases at each budget (capped at the row's length n), and at n itself
    alongside budget 0."""
    seen = set()
    for src, b, dt, x, x64 in _family_cases(ctx, BUDGETS, _budget_boundary_rows, salt=26):
        if np.any(np.isfinite(x64) & (x64 - 1.0 == x64)):
            # |x| >= 2^53: x - 1 rounds to x, so the box's breakpoints collapse and float64
            # cannot represent the exact fractional entries (p = clip(x - tau, 0, 1) is off by up
            # to one there: no oracle-grade expected value exists)
            continue
        for B in dict.fromkeys((float(min(b, len(x))),) + ((float(len(x)),) if b == BUDGETS[0] else ())):
            key = (id(src), B, dt)
            if key not in seen:
                seen.add(key)
                yield src, B, dt, x, x64


def _budget_why(src, B, x64):
    live = int(np.isfinite(x64).sum())
    extra = []
    if B == 0.0:
        extra.append("budget 0 (p = 0)")
    elif B == len(x64):
        extra.append("budget n (every unmasked entry 1)")
    elif B > live:
        extra.append(f"budget {B:g} above the {live} unmasked entries (those are 1)")
    elif B != int(B):
        extra.append(f"fractional budget {B:g}")
    return "; ".join([src.why] + extra)


def gen_budget_sparsemax(ctx: _Context):
    """budget_sparsemax.jsonl: p = clip(x - tau, 0, 1) with sum p = budget, against the exact rational oracle."""
    import entmax_ref as er

    from .family_checks import budget_tolerance

    fo = _family_oracle(ctx)
    for src, B, dt, x, x64 in _budget_cases(ctx):
        p, info = er.budget_sparsemax(x64[None], B, backend="numpy", return_info=True)
        p, tau, support = p[0], float(info.tau[0]), int(info.support[0])
        exact, _ = fo.budget(x64, B)
        err = max((float(abs(Fraction(float(v)) - e)) for v, e in zip(p, exact)), default=0.0)
        within = err <= float(budget_tolerance(x64[None], B, "float64").max(initial=0.0))
        case = {"op": "budget_sparsemax", "kind": src.kind, "budget": num(B), "dtype": dt, "n": len(x),
                "x": nums(x, dt), "p": nums(p), "tau": num(tau), "support": support,
                "tol_p": nums(budget_tolerance(x64[None], B, dt)[0]), "oracle_err": num(err),
                "within_tol_of_oracle": bool(within), "why": _budget_why(src, B, x64)}
        if not within:
            case["why"] += "; the float64 reference is further from the exact projection than its own tolerance"
        _roundtrips(case["x"], x, dt)
        yield case


def gen_budget_sparsemax_vjp(ctx: _Context):
    """budget_sparsemax_vjp.jsonl: dx_i = g_i - mean over the free set F = {0 < p < 1} of g on F, 0 elsewhere."""
    import entmax_ref as er

    from .family_checks import budget_vjp_tolerance

    fo = _family_oracle(ctx)
    rng = np.random.default_rng([ctx.seed, 27])
    for src, B, dt, x, x64 in _budget_cases(ctx):
        p = er.budget_sparsemax(x64[None], B, backend="numpy")
        g = rng.standard_normal(len(x)).astype(dt)
        g64 = g.astype(np.float64)
        dx = np.asarray(er.budget_sparsemax_vjp(p, g64[None], B, backend="numpy"), np.float64)
        tol, ill = budget_vjp_tolerance(x64[None], p, g64[None], dx, B, dt, ill_posed_inf=False)
        tol64, _ = budget_vjp_tolerance(x64[None], p, g64[None], dx, B, "float64")
        exact, _ = fo.budget(x64, B)
        free = [i for i, e in enumerate(exact) if 0 < e < 1]
        mean = sum((Fraction(float(g64[i])) for i in free), Fraction(0)) / len(free) if free else Fraction(0)
        dx_exact = [Fraction(float(g64[i])) - mean if i in free else Fraction(0) for i in range(len(x))]
        err = max((float(abs(Fraction(float(v)) - e)) for v, e in zip(dx[0], dx_exact)), default=0.0)
        ill = bool(ill[0])
        within = ill or err <= float(tol64.max(initial=0.0))
        why = _budget_why(src, B, x64) + ("; ill-posed gradient (an entry at a breakpoint 0 or 1): compare only "
                                          "implementations that take p" if ill else "")
        yield {"op": "budget_sparsemax_vjp", "kind": src.kind, "budget": num(B), "dtype": dt, "n": len(x),
               "x": nums(x, dt), "p": nums(p[0]), "grad": nums(g, dt), "dx": nums(dx[0]),
               "tol_dx": nums(tol[0]), "ill_posed": ill, "oracle_err": num(err),
               "within_tol_of_oracle": bool(within), "why": why}


_ATTN_WHY = {
    "full": "plain attention, Nq = Nk, two batches and heads",
    "causal": "causal mask (bottom-right aligned)",
    "Nq!=Nk": "cross attention, Nq != Nk, Dv != D",
    "causal Nq<Nk": "causal with Nq < Nk (a decoding chunk against a longer cache)",
    "gqa": "grouped-query heads (Hq = 2 Hkv)",
    "key_lengths": "right padding by key_lengths, one batch with no keys (zero output)",
    "alibi": "ALiBi slopes, one head with slope 0",
    "asentmax": "ASEntmax scale per head (beta, gamma)",
    "causal Nq>Nk": "causal with Nq > Nk: the first queries see no key (zero rows)",
    "key_padding_mask": "a (B, Nk) key mask: left padding, and left with right padding",
}


def _attention_problems(ctx: _Context):
    """(case, alpha) pairs: the built-in attention corpus at several seeds plus Nq > Nk causal."""
    from .corpus import AttentionCase

    seeds = range(6 if ctx.size == "full" else 2)  # small problems (N = 13, D = 8) keep the files small
    size = "quick"
    alphas = (1.0, 1.5, 2.0, 3.0)
    for s in seeds:
        rng = np.random.default_rng([ctx.seed, 21, s])
        cases = attention_corpus(size, ctx.seed * 1000 + s, FEATURES)
        D = cases[0].q.shape[-1]
        cases.append(AttentionCase("causal Nq>Nk", rng.standard_normal((1, 2, 9, D)), rng.standard_normal((1, 2, 5, D)),
                                   rng.standard_normal((1, 2, 5, D)), {"causal": True}))
        for case in cases:
            for a in alphas:
                yield case, a


def _attn_fields(case, a, dt):
    q, k, v = (t.astype(dt) for t in (case.q, case.k, case.v))
    kw = case.kwargs
    beta, gamma = kw.get("beta"), kw.get("gamma")
    fields = {"alpha": num(a), "dtype": dt, "shape": {"B": q.shape[0], "Hq": q.shape[1], "Hkv": k.shape[1],
                                                      "Nq": q.shape[2], "Nk": k.shape[2], "D": q.shape[3],
                                                      "Dv": v.shape[3]},
              "q": nums(q, dt), "k": nums(k, dt), "v": nums(v, dt), "scale": num(1.0 / np.sqrt(q.shape[3])),
              "causal": bool(kw.get("causal", False)),
              "key_lengths": None if kw.get("key_lengths") is None else [int(i) for i in kw["key_lengths"]],
              "key_padding_mask": None if kw.get("key_padding_mask") is None
              else np.asarray(kw["key_padding_mask"], bool).tolist(),
              "alibi_slopes": None if kw.get("alibi_slopes") is None else nums(np.asarray(kw["alibi_slopes"], float)),
              "beta": None if beta is None else nums(np.asarray(beta, float)),
              "gamma": None if gamma is None else nums(np.asarray(gamma, float)),
              "delta": "1.0", "offset": "1.0"}
    return q, k, v, fields


def gen_attention(ctx: _Context):
    """attention.jsonl: entmax attention outputs (float64 reference) with per-entry budgets."""
    for case, a in _attention_problems(ctx):
        for dt in DTYPES:
            q, k, v, fields = _attn_fields(case, a, dt)
            ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
            tol = attention_out_tolerance(ref, v, dt)
            yield {"op": "attention", "kind": case.name, **fields, "out": nums(ref.out), "tol_out": nums(tol),
                   "why": _ATTN_WHY[case.name]}


def gen_attention_vjp(ctx: _Context):
    """attention_vjp.jsonl: dq, dk, dv for an upstream grad_out (float64 reference)."""
    rng = np.random.default_rng([ctx.seed, 22])
    for case, a in _attention_problems(ctx):
        g = rng.standard_normal(case.q.shape[:3] + (case.v.shape[3],))
        for dt in DTYPES:
            q, k, v, fields = _attn_fields(case, a, dt)
            do = g.astype(dt)
            q64, k64, v64, do64 = (t.astype(np.float64) for t in (q, k, v, do))
            kw = {kk: vv for kk, vv in case.kwargs.items() if vv is not None}
            exp = reference_attention_grads(do64, q64, k64, v64, alpha=a, **kw)
            ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
            tols = attention_grad_tolerances(ref, q64, k64, v64, do64, dt, exp)
            yield {"op": "attention_vjp", "kind": case.name, **fields, "grad_out": nums(do, dt),
                   "dq": nums(exp[0]), "dk": nums(exp[1]), "dv": nums(exp[2]),
                   "tol_dq": nums(tols[0]), "tol_dk": nums(tols[1]), "tol_dv": nums(tols[2]),
                   "why": _ATTN_WHY[case.name]}


# ----------------------------------------------------------------------------- replay


def _rows1(case, key, dtype):
    return parse(case[key], dtype)[None]


def _row_label(case):
    prm = f"budget={case['budget']}" if "budget" in case else f"alpha={case['alpha']}"
    return f"{case['kind']} {prm} n={case['n']}"


def _param_caller(fn, data_args, op, form, param):
    """A caller passing the (required) parameter by keyword ``param`` when fn has it (or
    ``**kwargs``), else positionally right after the data."""
    try:
        _, _, var_kw, names = _positional_capacity(fn)
    except (TypeError, ValueError):
        names, var_kw = set(), False
    return _caller(fn, data_args, op, form, param if (param in names or var_kw) else data_args)


def _dtype_groups(report, cases, dtypes, op, label):
    """The cases by dtype (only ``dtypes``, when given): yields ``(dtype, cases, row)`` with
    a row ``corpus <op>`` added to ``report``, timed until the caller's loop body ends."""
    by_dt: dict = {}
    for c in cases:
        if dtypes is None or c["dtype"] in dtypes:
            by_dt.setdefault(c["dtype"], []).append(c)
    for dt, group in by_dt.items():
        row = CheckRow(f"corpus {op}", label, dt)
        report.rows.append(row)
        t0 = time.perf_counter()
        yield dt, group, row
        row.seconds = time.perf_counter() - t0


def _replay_rows(cases, fn, op, form, data_args, compute, label, framework, device, dtypes, param=None):
    """Shared loop of the row replays: one CheckRow per dtype; ``compute(call, case, dt)``
    returns (got, expected, tol) arrays or None (skipped).  ``param`` (normmax's "alpha",
    "budget") names a required parameter taken from the case; by default alpha is passed
    as :func:`checks._caller` does."""
    report = CheckReport()
    for dt, group, row in _dtype_groups(report, cases, dtypes, op, label):
        try:
            call = (_caller(fn, data_args, f"corpus {op}", form) if param is None
                    else _param_caller(fn, data_args, f"corpus {op}", form, param))
        except _CallError as exc:
            row.fail(str(exc))
            continue
        skipped = 0
        for c in group:
            def run(*arrays):
                res = _run(row, call, *(from_numpy(a, framework, device) for a in arrays),
                           alpha=float(c[param or "alpha"]))
                return None if res is None else _safe_np(row, res)

            out = compute(run, c, dt)
            if out is None:
                skipped += 1
                continue
            if out is False:
                continue
            for what, got, exp, tol in out:
                cmp = compare(got, exp, tol, np.dtype(dt), name=what)
                row.judge(cmp, what, _row_label(c), c["why"])
        if skipped:
            row.note(f"{skipped} ill-posed case(s) not compared")
    return report


def _replay_entmax(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        return [("p", got, parse(c["p"])[None], parse(c["tol_p"])[None])]

    return _replay_rows(corpus.cases["entmax.jsonl"], fn, "entmax", "fn(x, alpha)", 1, compute, **kw)


def _replay_threshold(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        return [("tau", got.reshape(-1), parse([c["tau"]]), parse([c["tol_tau"]]))]

    return _replay_rows(corpus.cases["entmax.jsonl"], fn, "threshold", "fn(x, alpha)", 1, compute, **kw)


def _replay_entmax_vjp(corpus, fn, *, vjp_inputs="x", **kw):
    if vjp_inputs not in ("x", "p"):
        raise ValueError(f"vjp_inputs must be 'x' or 'p', got {vjp_inputs!r}")

    def compute(run, c, dt):
        if vjp_inputs == "x" and c["ill_posed"]:
            return None
        first = _rows1(c, "x", dt) if vjp_inputs == "x" else _rows1(c, "p", dt)
        got = run(first, _rows1(c, "grad", dt))
        if got is None:
            return False
        return [("dx", got, parse(c["dx"])[None], float(c["tol_dx"]))]

    form = f"fn({vjp_inputs}, grad, alpha)"
    return _replay_rows(corpus.cases["entmax_vjp.jsonl"], fn, "entmax_vjp", form, 2, compute, **kw)


def _replay_alpha_vjp(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "p", dt), _rows1(c, "grad", dt))
        if got is None:
            return False
        return [("dalpha", got.reshape(-1), parse([c["dalpha"]]), parse([c["tol_dalpha"]]))]

    return _replay_rows(corpus.cases["entmax_alpha_vjp.jsonl"], fn, "entmax_alpha_vjp", "fn(p, grad, alpha)",
                        2, compute, **kw)


def _replay_loss(corpus, fn, **kw):
    def compute(run, c, dt):
        got = run(_rows1(c, "x", dt), np.array([c["target"]]))
        if got is None:
            return False
        return [("loss", got.reshape(-1), parse([c["loss"]]), parse([c["tol_loss"]]))]

    return _replay_rows(corpus.cases["entmax_loss.jsonl"], fn, "entmax_loss", "fn(x, target, alpha)", 2,
                        compute, **kw)


def _replay_family(corpus, fn, *, op, vjp_inputs="x", **kw):
    """normmax / normmax_threshold / budget_sparsemax and their VJPs."""
    if vjp_inputs not in ("x", "p"):
        raise ValueError(f"vjp_inputs must be 'x' or 'p', got {vjp_inputs!r}")
    param = "budget" if op.startswith("budget") else "alpha"
    vjp = op.endswith("_vjp")
    file = (op[:-4] if vjp else op.replace("_threshold", "")) + ("_vjp" if vjp else "") + ".jsonl"

    def compute(run, c, dt):
        if vjp:
            if vjp_inputs == "x" and c["ill_posed"]:
                return None
            got = run(_rows1(c, vjp_inputs, dt), _rows1(c, "grad", dt))
            return False if got is None else [("dx", got, parse(c["dx"])[None], parse(c["tol_dx"])[None]
                                                if isinstance(c["tol_dx"], list) else float(c["tol_dx"]))]
        got = run(_rows1(c, "x", dt))
        if got is None:
            return False
        if op == "normmax_threshold":
            return [("tau", got.reshape(-1), parse([c["tau"]]), parse([c["tol_tau"]]))]
        return [("p", got, parse(c["p"])[None], parse(c["tol_p"])[None])]

    first = vjp_inputs if vjp else "x"
    form = f"fn({first}, grad, {param})" if vjp else f"fn(x, {param})"
    return _replay_rows(corpus.cases[file], fn, op, form, 2 if vjp else 1, compute, param=param, **kw)


def _replay_scale(corpus, fn, *, label, framework="numpy", device=None, dtypes=None):
    report = CheckReport()
    row = CheckRow("corpus asentmax_scale", label, "float64")
    report.rows.append(row)
    t0 = time.perf_counter()
    for c in corpus.cases["asentmax_scale.jsonl"]:
        args = [c["n"]] + [float(c[k]) for k in ("beta", "gamma", "delta", "offset")]
        res = _run(row, fn, *args)
        got = None if res is None else _safe_np(row, res)
        if got is None:
            continue
        cmp = compare(got.reshape(-1), parse([c["s"]]), parse([c["tol_s"]]), np.float64, name="s")
        row.judge(cmp, "s", f"n={c['n']} beta={c['beta']} gamma={c['gamma']}")
    row.seconds = time.perf_counter() - t0
    return report


def _attn_args(c):
    dt = c["dtype"]
    q, k, v = (parse(c[n], dt) for n in ("q", "k", "v"))
    kw: dict[str, Any] = {}
    if c["causal"]:
        kw["causal"] = True
    if c["key_lengths"] is not None:
        kw["key_lengths"] = np.array(c["key_lengths"])
    if c.get("key_padding_mask") is not None:
        kw["key_padding_mask"] = np.array(c["key_padding_mask"], bool)
    if c["alibi_slopes"] is not None:
        kw["alibi_slopes"] = parse(c["alibi_slopes"])
    if c["beta"] is not None:
        kw["beta"], kw["gamma"] = parse(c["beta"]), parse(c["gamma"])
    return q, k, v, kw


def _replay_attention(corpus, fn, *, op="attention", label, framework="numpy", device=None, dtypes=None):
    file = "attention.jsonl" if op == "attention" else "attention_vjp.jsonl"
    report = CheckReport()
    for dt, group, row in _dtype_groups(report, corpus.cases[file], dtypes, op, label):
        data = 3 if op == "attention" else 4
        try:
            names, var_kw = _attention_signature(fn, data, f"corpus {op}")
        except _CallError as exc:
            row.fail(str(exc))
            continue
        for c in group:
            q, k, v, kw = _attn_args(c)
            if "alpha" in names or var_kw:
                kw["alpha"] = float(c["alpha"])
            args = [from_numpy(t, framework, device) for t in (q, k, v)]
            where = f"{c['kind']} alpha={c['alpha']}"
            if op == "attention":
                res = _run(row, fn, *args, **kw)
                got = None if res is None else _safe_np(row, res)
                if got is None:
                    continue
                checks = [("out", got, parse(c["out"]), parse(c["tol_out"]))]
            else:
                got = _attention_grads(row, fn, from_numpy(parse(c["grad_out"], dt), framework, device), *args, **kw)
                if got is None:
                    continue
                checks = [(n, g, parse(c[n]), parse(c["tol_" + n])) for n, g in zip(("dq", "dk", "dv"), got)]
            for what, got_, exp, tol in checks:
                cmp = compare(got_, exp, tol, np.dtype(dt), name=what)
                row.judge(cmp, what, where, c["why"])
    return report


# ----------------------------------------------------------------------------- the table


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
    Operation("entmax", "entmax.jsonl", gen_entmax, _replay_entmax, _library("entmax", "x alpha"), "fn(x, alpha) -> p"),
    Operation("threshold", "entmax.jsonl", None, _replay_threshold, _library("entmax_threshold", "x alpha"),
              "fn(x, alpha) -> tau"),
    Operation("entmax_vjp", "entmax_vjp.jsonl", gen_entmax_vjp, _replay_entmax_vjp,
              _library("entmax_vjp", "p grad alpha"), _ROW_VJP.format("alpha")),
    Operation("entmax_alpha_vjp", "entmax_alpha_vjp.jsonl", gen_entmax_alpha_vjp, _replay_alpha_vjp,
              _library("entmax_alpha_vjp", "p grad alpha"), "fn(p, grad, alpha) -> dL/dalpha per row"),
    Operation("entmax_loss", "entmax_loss.jsonl", gen_entmax_loss, _replay_loss,
              _library("entmax_loss", "x target alpha"), "fn(x, target, alpha) -> loss per row"),
    Operation("normmax", "normmax.jsonl", gen_normmax, _replay_family, _library("normmax", "x alpha"),
              "fn(x, alpha) -> p"),
    Operation("normmax_threshold", "normmax.jsonl", None, _replay_family,
              _library("normmax", "x alpha", lambda res: res[1].tau, return_info=True), "fn(x, alpha) -> tau"),
    Operation("normmax_vjp", "normmax_vjp.jsonl", gen_normmax_vjp, _replay_family,
              _library("normmax_vjp", "p grad alpha"), _ROW_VJP.format("alpha")),
    Operation("budget_sparsemax", "budget_sparsemax.jsonl", gen_budget_sparsemax, _replay_family,
              _library("budget_sparsemax", "x budget"), "fn(x, budget) -> p"),
    Operation("budget_sparsemax_vjp", "budget_sparsemax_vjp.jsonl", gen_budget_sparsemax_vjp, _replay_family,
              _library("budget_sparsemax_vjp", "p grad budget"), _ROW_VJP.format("budget")),
    Operation("asentmax_scale", "asentmax_scale.jsonl", gen_asentmax_scale, _replay_scale, None,
              "fn(n, beta, gamma, delta, offset) -> s"),
    Operation("attention", "attention.jsonl", gen_attention, _replay_attention,
              _library("attention", "q k v **kw"), "fn(q, k, v, **kw) -> out"),
    Operation("attention_vjp", "attention_vjp.jsonl", gen_attention_vjp, _replay_attention,
              _library("attention_vjp", "do q k v **kw", lambda res: res[:3]), "fn(grad_out, q, k, v, **kw) -> (dq, dk, dv)"),
)

OPS = tuple(o.name for o in OPERATIONS)


def _operation(op: str) -> Operation:
    for o in OPERATIONS:
        if o.name == op:
            return o
    raise ValueError(f"unknown corpus operation {op!r}; choose from {', '.join(OPS)}")


# ----------------------------------------------------------------------------- write / load


def _need_mpmath() -> None:
    try:
        import mpmath  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError('generating the corpus needs mpmath (its 50-digit oracle checks every row case): '
                                  'pip install "entmax-ref[corpus]"', name="mpmath") from None


def generate_corpus(out, *, seed: int = 0, size: str = "small", ops=None,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Write the conformance corpus into directory ``out`` and return its manifest.

    Parameters
    ----------
    out : path
        Created if missing; the corpus files in it are overwritten.
    seed : int
        The same seed (and entmax-ref version) gives byte-identical files on one platform.
    size : {"small", "full"}
        "small": >= 1,000 row cases and >= 100 attention cases, written in seconds;
        "full": more and longer rows (n = 100,000 among them) and more attention problems.
    ops : iterable of str or None
        Write only the files of these operations (names of :data:`OPERATIONS`); all by default.
    progress : callable or None
        Called with each file's name as it starts.

    Raises
    ------
    ValueError for a bad size or seed; ModuleNotFoundError (naming the ``corpus`` extra)
    without mpmath; RuntimeError if a float64 probability with alpha <= 2 misses the
    50-digit oracle by more than 4e-15 (the library's accuracy contract).  A case whose
    reference is within that but further from the oracle than its own float64 tolerance
    is written with ``"within_tol_of_oracle": false`` and counted in the manifest.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if ops is not None:
        ops = tuple(ops)
        for op in ops:
            _operation(op)
    _need_mpmath()
    import entmax_ref as er

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = _Context(size, int(seed), _Oracle(), [])
    ctx.rows = _row_sources(size, int(seed))
    _REF_CACHE.clear()
    _prefill_refs(ctx)
    files = []
    for o in OPERATIONS:
        if o.generate is None or (ops is not None and o.name not in ops):
            continue
        if progress:
            progress(o.file)
        h = hashlib.sha256()
        count = beyond = 0
        with open(out / o.file, "wb") as fh:
            for case in o.generate(ctx):
                count += 1
                beyond += case.get("within_tol_of_oracle") is False
                line = (json.dumps({"id": f"{o.name}-{count:05d}", **case}, separators=(",", ":"),
                                   allow_nan=False) + "\n").encode()
                h.update(line)
                fh.write(line)
        files.append({"file": o.file, "op": o.name, "cases": count, "sha256": h.hexdigest(),
                      "beyond_oracle_tol": beyond})
    _REF_CACHE.clear()
    manifest = {
        "format": "entmax-ref conformance corpus",
        "schema_version": SCHEMA_VERSION,
        "entmax_ref_version": er.__version__,
        "seed": int(seed),
        "size": size,
        "files": files,
        "row_cases": sum(f["cases"] for f in files if not f["op"].startswith("attention")),
        "attention_cases": sum(f["cases"] for f in files if f["op"].startswith("attention")),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@dataclass
class Corpus:
    """A loaded corpus: its directory, manifest and the cases of each file (dicts, as in
    the files: numbers are strings; :func:`parse` turns them into arrays)."""

    path: Path
    manifest: dict
    cases: dict  #: file name -> list of case dicts

    def __len__(self) -> int:
        return sum(len(v) for v in self.cases.values())


def load_corpus(path) -> Corpus:
    """Read a corpus written by ``entmax-ref corpus``, checking it first.

    Raises :class:`CorpusError` (a ValueError) when the directory or manifest is missing,
    the schema version is not :data:`SCHEMA_VERSION`, a file is missing, or its SHA-256
    or case count differs from the manifest's.
    """
    path = Path(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CorpusError(f"{path} is not a corpus: no manifest.json (write one with: entmax-ref corpus --out {path})")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{mpath}: not JSON ({exc})") from None
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise CorpusError(f"{path}: schema version {version!r}; this entmax-ref reads version {SCHEMA_VERSION} "
                          "(regenerate the corpus with this version)")
    cases = {}
    for f in manifest.get("files", []):
        fp = path / f["file"]
        if not fp.is_file():
            raise CorpusError(f"{path}: {f['file']} is listed in the manifest but missing")
        data = fp.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != f["sha256"]:
            raise CorpusError(f"{fp}: SHA-256 {digest} differs from the manifest's {f['sha256']} (corrupted or edited)")
        lines = [json.loads(ln) for ln in data.decode().splitlines() if ln]
        if len(lines) != f["cases"]:
            raise CorpusError(f"{fp}: {len(lines)} cases, the manifest says {f['cases']}")
        cases[f["file"]] = lines
    return Corpus(path, manifest, cases)


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
    o = _operation(op)
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
    if o.replay is _replay_family:
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
        if o.replay is _replay_family:  # SKIP where the backend lacks the operation
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


# ----------------------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref corpus --out DIR [--seed N] [--size small|full]``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="entmax-ref corpus",
                                 description="Write the language-neutral conformance corpus (JSON Lines + manifest).")
    ap.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="seed (default 0): the same seed gives identical files")
    ap.add_argument("--size", choices=SIZES, default="small", help="small (default) or full")
    ap.add_argument("--ops", default=None, help=f"comma-separated operations to write (default all: {','.join(OPS)})")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.seed < 0:
        print("entmax-ref corpus: --seed must be >= 0", file=sys.stderr)
        return 2
    ops = None if args.ops is None else [o for o in args.ops.split(",") if o]
    t0 = time.perf_counter()
    try:
        m = generate_corpus(args.out, seed=args.seed, size=args.size, ops=ops,
                            progress=lambda f: print(f"writing {os.path.join(args.out, f)}", file=sys.stderr))
    except (ModuleNotFoundError, ValueError) as exc:
        print(f"entmax-ref corpus: {exc}", file=sys.stderr)
        return 2
    for f in m["files"]:
        print(f"{f['file']:<27} {f['cases']:>6} cases  sha256 {f['sha256'][:16]}")
    print(f"{m['row_cases']} row cases, {m['attention_cases']} attention cases, schema {m['schema_version']}, "
          f"seed {m['seed']}, size {m['size']}: {args.out} ({time.perf_counter() - t0:.1f}s)")
    return 0
