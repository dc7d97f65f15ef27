"""The rows and attention problems the corpus is generated from, and why each is hard.

The built-in seeded cases of ``entmax-ref check`` (:mod:`entmax_ref.testing.corpus`) plus the
rows chosen to break implementations: near-ties, entries at the support boundary, huge
offsets, the property tests' frozen failures, alpha far above 2; normmax and
budget-sparsemax rows of their own; the attention problems at several seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..corpus import FEATURES, attention_corpus, row_corpus

SIZES = ("small", "full")
#: alpha values every row source is solved at: softmax, alpha near 1, 1.25, entmax15,
#: sparsemax, and alpha above 2 (3) and far above it (10)
ROW_ALPHAS = (1.0, 1.000001, 1.25, 1.5, 2.0, 3.0, 10.0)
DTYPES = ("float64", "float32")


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
class Row:
    kind: str
    why: str
    x: np.ndarray  #: float64 row
    alphas: tuple = ROW_ALPHAS


def row_sources(size: str, seed: int) -> list[Row]:
    """The rows every row operation is generated from."""
    from ..oracle import edge_row

    out: list[Row] = []
    for case in row_corpus("quick" if size == "small" else "default", seed):
        for r in case.x:
            # long rows at fewer alphas: the 50-digit check of each costs seconds
            alphas = (1.0, 1.5, 2.0, 3.0) if case.name == "long" else ROW_ALPHAS
            out.append(Row(case.name, _BUILTIN_WHY[case.name], r.copy(), alphas))
    rng = np.random.default_rng([seed, 15])
    big = size == "full"
    # near-ties: the top entries one ulp apart, or 1e-12 apart, or all equal but one
    for _ in range(4 if big else 2):
        x = rng.standard_normal(9)
        i, j = np.argsort(x)[-2:]
        x[i] = np.nextafter(x[j], -np.inf)
        out.append(Row("near-ties", "the two largest entries one ulp apart", x))
        y = rng.standard_normal(9)
        y[np.argsort(y)[-2]] = y.max() - 1e-12
        out.append(Row("near-ties", "the two largest entries 1e-12 apart", y))
    z = np.full(8, 0.7)
    z[3] = np.nextafter(0.7, 1.0)
    out.append(Row("near-ties", "all entries equal but one, one ulp above the rest", z))
    # huge offsets that make the spacing of the scores coarse, and differences that overflow
    for off in (1e15, -1e15):
        out.append(Row("huge-offset", f"scores near {off:g} (float64 spacing 0.125)", rng.standard_normal(11) * 4 + off))
    out.append(Row("huge-offset", "scores 1e150 apart (their squares near float64's range)",
                    np.array([1e150, 0.0, -1e150])))
    # the property tests' frozen failures (tests/test_entmax_properties.py)
    out.append(Row("found-by-hypothesis", "frozen example: an all -inf row once warned 0 * -inf in tau",
                    np.full(5, -np.inf), (1.0,)))
    out.append(Row("found-by-hypothesis", "frozen example: the offset form lost the edge entry at alpha 20",
                    np.array([0.0, 0.03125]), (20.0,)))
    out.append(Row("found-by-hypothesis", "frozen example (and the CUDA core's regression row): edge p = 4.96e-4 at alpha 100",
                    np.array([0.0, -0.009617]), (100.0,)))
    n_off = 100_000 if big else 2048
    out.append(Row("found-by-hypothesis", f"long row (n = {n_off}) at offset 1e6 (test_long_row_with_offset)",
                    np.random.default_rng(7).standard_normal(n_off) + 1e6, (1.5,)))
    # alpha far above 2: edge rows whose edge gap is below float64's range
    for alpha, ties, deficit, spread in ((20.0, 1, 1e-3, True), (100.0, 2, 1e-3, True), (100.0, 1, 5e-4, False),
                                         (1000.0, 3, 0.3, True), (1000.0, 1, 0.5, False)):
        for _ in range(3 if big else 1):
            out.append(Row("alpha-far-above-2", f"alpha {alpha:g}: edge entries carry ~{deficit:g} whose gap to the "
                            "threshold underflows float64", edge_row(rng, alpha, ties, deficit, spread), (alpha,)))
    return out


def boundary_rows(alpha: float, rng) -> list[Row]:
    """Rows with entries at (or one ulp from) the support boundary, for one alpha > 1."""
    rows = []
    a1 = alpha - 1.0
    for k in (1, 2, 3):
        # Lemma 2: k equal top entries and the rest exactly k^(1-alpha)/(alpha-1) below sit
        # at the threshold (p = 1/k on the top, 0 on the rest)
        gap = k ** (-a1) / a1
        b = -gap
        x = np.concatenate([np.zeros(k), [b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf), b - 1.0]])
        rows.append(Row("support-boundary", f"{k} equal top entries; others at the threshold and one ulp either side",
                         rng.permutation(x), (alpha,)))
    # a random row with an entry inserted at its own threshold theta (and one ulp either side)
    import entmax_ref as er

    x = rng.standard_normal(10)
    tau = float(er.entmax_threshold(x, alpha, backend="numpy"))
    theta = tau / a1  # p_i = [(alpha - 1) x_i - tau]_+^(1/(alpha-1)) is 0 from x_i = tau / (alpha - 1) down
    for d, what in ((0.0, "exactly at"), (np.inf, "one ulp above"), (-np.inf, "one ulp below")):
        y = np.append(x, theta if d == 0.0 else np.nextafter(theta, d))
        rows.append(Row("support-boundary", f"an entry {what} the row's threshold", rng.permutation(y), (alpha,)))
    return rows



@dataclass
class Context:
    size: str
    seed: int
    oracle: Any  #: exact.RowOracle, the 50-digit oracle
    rows: list
    stats: dict = field(default_factory=dict)
    refs: dict = field(default_factory=dict)  #: (row bytes, alpha) -> the float64 reference (p, tau, support)



def row_cases(ctx: Context):
    """(source row, alpha, dtype, x in dtype, x as float64) for every row case."""
    rng = np.random.default_rng([ctx.seed, 16])
    rows = list(ctx.rows)
    for a in ROW_ALPHAS:
        if a > 1.0:
            rows.extend(boundary_rows(a, rng))
    for src in rows:
        for a in src.alphas:
            for dt in DTYPES:
                with np.errstate(over="ignore"):
                    x = src.x.astype(dt)
                if np.any(np.isinf(x) & np.isfinite(src.x)):
                    continue  # not representable in dt (1e300 in float32)
                yield src, a, dt, x, x.astype(np.float64)



# ----------------------------------------------------------------------------- normmax, budget-sparsemax

#: normmax alphas: near 1 (p ~ t^1000 and t^20: underflow-prone powers), 1.5, 2, 3 and large
NORMMAX_ALPHAS = (1.001, 1.05, 1.5, 2.0, 3.0, 10.0, 50.0)
#: budgets: 0, integers, fractional ones, and n (every entry 1)
BUDGETS = (0.0, 1.0, 2.0, 0.3, 2.5)
#: the built-in row kinds (and how many of each) the family operations are generated from
_FAMILY_KINDS = {"random": 6, "ties": 4, "masks": 6, "all-masked": 1, "extreme": 6, "tiny": 8, "near-ties": 5,
                 "huge-offset": 3}


def family_rows(ctx: Context) -> list[Row]:
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
    out.append(Row("masks", "two finite entries among -inf: fewer unmasked entries than most budgets", x))
    out.append(Row("masks", "a single finite entry", np.array([-np.inf, 0.25, -np.inf, -np.inf])))
    out.append(Row("huge-offset", "scores near 1e6 with a spread of 1e-3 (cancellation in x - tau)",
                    1e6 + rng.standard_normal(12) * 1e-3))
    out.append(Row("near-ties", "all entries equal (uniform p)", np.full(7, -1.75)))
    return out


def normmax_boundary_rows(alpha: float, rng) -> list[Row]:
    """k equal top entries (at 0) and entries exactly at normmax's threshold and one ulp
    either side: with s below the top, k (0 - s)^beta = 1 puts tau at s (beta = alpha/(alpha-1))."""
    beta = alpha / (alpha - 1.0)
    rows = []
    for k in (1, 2, 3):
        s = -((1.0 / k) ** (1.0 / beta))
        x = np.concatenate([np.zeros(k), [s, np.nextafter(s, np.inf), np.nextafter(s, -np.inf), s - 1.0]])
        rows.append(Row("support-boundary", f"{k} equal top entries; others at the threshold (k |s|^beta = 1) "
                         "and one ulp either side", rng.permutation(x), (alpha,)))
    return rows


def family_cases(ctx: Context, params, boundary=None, salt=24):
    """(source row, parameter, dtype, x, x64): every row at a rotation of three of
    ``params`` (all of them with --size full) in both dtypes, plus the boundary rows."""
    rng = np.random.default_rng([ctx.seed, salt])
    rows = family_rows(ctx)
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



def budget_boundary_rows(budget: float, rng) -> list[Row]:
    """Rows whose entries sit exactly on budget-sparsemax's breakpoints (p = 0 or 1) and
    one ulp either side: tau = 0 with entries at 0 and 1."""
    rows = []
    x = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 0.0, np.nextafter(0.0, 1.0), -0.0, -1e-300,
                  0.5, 0.25])
    rows.append(Row("support-boundary", "entries at the breakpoints 0 and 1 and one ulp (or a denormal) away",
                     rng.permutation(x), (budget,)))
    y = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])  # exact ties: tau between the breakpoints of a tied group
    rows.append(Row("ties", "a tied group that the budget splits (entries share the mass equally)", y, (budget,)))
    return rows


def budget_cases(ctx: Context):
    """The family cases at each budget (capped at the row's length n), and at n itself
    alongside budget 0."""
    seen = set()
    for src, b, dt, x, x64 in family_cases(ctx, BUDGETS, budget_boundary_rows, salt=26):
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


def budget_why(src, B, x64):
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



ATTN_WHY = {
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


def attention_problems(ctx: Context):
    """(case, alpha) pairs: the built-in attention corpus at several seeds plus Nq > Nk causal."""
    from ..corpus import AttentionCase

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

