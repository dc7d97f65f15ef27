"""The rows and attention problems the corpus is generated from, and why each is hard.

Two sorts of source.  The *random* kinds (:data:`RANDOM_KINDS`: Gaussian rows, the long row,
the attention problems) are drawn from the seed.  Every other kind is *constructed*: ties,
masks, huge offsets, near-ties, entries at the support boundary, subnormal and non-finite
scores, the property tests' frozen failures; they are built the same way whatever the seed, so
that their cases, and so their ``tcId``, are the same in every corpus of this format.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..corpus import FEATURES, AttentionCase, attention_corpus, row_corpus

SIZES = ("small", "full")
#: alpha values the general rows are solved at: softmax, alpha near 1, 1.25, entmax15,
#: sparsemax, and alpha above 2 (3) and far above it (10)
ROW_ALPHAS = (1.0, 1.000001, 1.25, 1.5, 2.0, 3.0, 10.0)
#: the dtypes of every row; some kinds also come in the two 16-bit ones (:data:`LOW`)
DTYPES = ("float64", "float32")
LOW = ("float16", "bfloat16")
#: the alphas of the 16-bit cases
LOW_ALPHAS = (1.0, 1.5, 2.0, 3.0)
#: the kinds drawn from the seed (attention problems are drawn from it too)
RANDOM_KINDS = ("random", "long")
#: the seed the constructed kinds of the built-in corpus are drawn with, whatever the corpus's seed
CONSTRUCTED = 20240


def in_dtype(x64: np.ndarray, dtype: str) -> np.ndarray:
    """``x64`` rounded to the nearest value of ``dtype`` (ties to even), as float64.
    bfloat16 (8 significant bits, float32's exponent range) is rounded here, without
    ml_dtypes; values beyond a dtype's range become infinite."""
    x64 = np.asarray(x64, np.float64)
    if dtype != "bfloat16":
        with np.errstate(over="ignore"):
            return x64.astype(dtype).astype(np.float64)
    out = x64.copy()
    fin = np.isfinite(x64) & (x64 != 0)
    _, e = np.frexp(x64[fin])  # |x| = m 2^e, 0.5 <= m < 1
    quantum = np.ldexp(1.0, np.maximum(e - 8, -133))  # 8 significant bits; subnormals below 2^-126
    out[fin] = np.rint(x64[fin] / quantum) * quantum
    out[np.abs(out) > float.fromhex("0x1.fep+127")] = np.copysign(np.inf, out[np.abs(out) > float.fromhex("0x1.fep+127")])
    return out


def case_rng(*parts) -> np.random.Generator:
    """A generator seeded by a digest of ``parts`` (arrays by their bytes): what a case draws
    (an upstream gradient, a target) depends on the case alone, not on the seed or order."""
    h = hashlib.sha256()
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes() if isinstance(p, np.ndarray) else repr(p).encode())
        h.update(b"|")
    return np.random.default_rng(int.from_bytes(h.digest()[:8], "little"))


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
    dtypes: tuple = DTYPES
    pairs: tuple = ()  #: (alpha, dtype) pairs instead of every alpha in every dtype


#: with 'small', a general row is solved at softmax, 1.5-entmax and sparsemax and at one of these in turn
_TURNS = (1.000001, 1.25, 3.0, 10.0)


def _take_turns(rows: list) -> list:
    """With 'small': each general row (one of :data:`ROW_ALPHAS`) at alphas 1, 1.5, 2 and one of
    :data:`_TURNS` in turn, so that every alpha meets every kind at a third of the cases."""
    i = 0
    for r in rows:
        if r.alphas == ROW_ALPHAS:
            r.alphas = (1.0, 1.5, 2.0, _TURNS[i % len(_TURNS)])
            i += 1
    return rows


def _pick(x: np.ndarray, rows: int, size: str, per_block: int, blocks: int) -> np.ndarray:
    """The first ``per_block`` rows of each of ``blocks`` blocks of ``rows`` (all with 'full')."""
    if size == "full":
        return x
    return np.concatenate([x[b * rows:b * rows + per_block] for b in range(blocks)])


def _builtin_rows(size: str, seed: int) -> list[Row]:
    """The built-in corpus's rows: the random kinds from ``seed``, the others from
    :data:`CONSTRUCTED`; with 'small', a few of each kind."""
    quick = "quick" if size == "small" else "default"
    rows = 8 if size == "small" else 32
    out: list[Row] = []
    for s, keep in ((seed, RANDOM_KINDS), (CONSTRUCTED, None)):
        for case in row_corpus(quick, s):
            if (case.name in RANDOM_KINDS) != (keep is not None):
                continue
            x = {"random": lambda a: _pick(a, rows, size, 2, 3), "ties": lambda a: _pick(a, rows, size, 3, 1),
                 "masks": lambda a: np.concatenate([_pick(a, rows, size, 2, 1), a[rows:rows + 2]]),
                 "all-masked": lambda a: a[:1], "extreme": lambda a: _pick(a, rows // 2, size, 1, 3),
                 "tiny": lambda a: _pick(a, rows, size, 2, 1), "long": lambda a: _pick(a, 2, size, 1, 1),
                 }[case.name](case.x)
            low = case.name in ("random", "ties", "masks", "tiny")
            for i, r in enumerate(x):
                dtypes = DTYPES + LOW if low and i == 0 else DTYPES
                # the long row: each alpha in one dtype (its cases are a third of the corpus's bytes)
                pairs = tuple(zip((1.0, 1.5, 2.0, 3.0), DTYPES[::-1] * 2)) if case.name == "long" else ()
                out.append(Row(case.name, _BUILTIN_WHY[case.name], r.copy(), dtypes=dtypes, pairs=pairs))
    return out


def subnormal_rows() -> list[Row]:
    """Rows with subnormal scores of each dtype, and rows whose exact answer has subnormal
    or underflowing entries."""
    rows = [Row("subnormal", "subnormal scores (float64's 5e-324 and 2.2e-308 neighbours) beside 0",
                np.array([5e-324, 0.0, -5e-324, 1e-310, -2.2250738585072009e-308]), dtypes=("float64",)),
            Row("subnormal", "one subnormal score beside scores of order 1 (x - max x rounds to -max x)",
                np.array([1.0, 5e-324, 0.5, -0.25]), dtypes=("float64",)),
            Row("subnormal", "float32 subnormal scores (1e-45 and 1e-40) beside 0",
                np.array([1e-45, 0.0, -1e-45, 1e-40, -1.1754942e-38]).astype(np.float32).astype(np.float64),
                dtypes=("float32",)),
            Row("subnormal", "float16 subnormal scores (6e-8 and 3e-6) beside 0",
                np.array([5.96e-8, 0.0, -5.96e-8, 3e-6]).astype(np.float16).astype(np.float64),
                LOW_ALPHAS, ("float16",)),
            Row("subnormal", "scores 745 and 104 below the maximum: softmax's entries underflow float64 and "
                "float32 (the support still counts them)", np.array([0.0, -745.0, -740.0, -104.0, -0.5]))]
    return rows


def nonfinite_rows() -> list[Row]:
    """Rows with NaN or +inf scores: the library raises ValueError (entmax.jsonl only)."""
    alphas, why = (1.0, 1.5, 2.0), "NaN or +inf scores are an error (ValueError); -inf alone is a mask"
    return [Row("non-finite", why, np.array([np.nan, 0.0, 1.0]), alphas),
            Row("non-finite", why, np.array([np.inf, 0.0, -1.0]), alphas),
            Row("non-finite", why, np.array([-np.inf, 2.0, np.nan, 0.5]), alphas)]


def row_sources(size: str, seed: int) -> list[Row]:
    """The rows every row operation is generated from (the support-boundary rows, which need
    the oracle, come from :func:`boundary_rows`)."""
    from ..oracle import edge_row

    out = _builtin_rows(size, seed)
    rng = np.random.default_rng([CONSTRUCTED, 15])
    big = size == "full"
    # near-ties: the top entries one ulp apart, or 1e-12 apart, or all equal but one
    for i in range(4 if big else 2):
        x = rng.standard_normal(9)
        a, b = np.argsort(x)[-2:]
        x[a] = np.nextafter(x[b], -np.inf)
        out.append(Row("near-ties", "the two largest entries one ulp apart", x, dtypes=DTYPES + (LOW if i == 0 else ())))
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
    out.append(Row("found-by-hypothesis", "frozen example (and the CUDA core's regression row): edge p = 4.96e-4 "
                   "at alpha 100", np.array([0.0, -0.009617]), (100.0,)))
    n_off = 100_000 if big else 2048
    out.append(Row("found-by-hypothesis", f"long row (n = {n_off}) at offset 1e6 (test_long_row_with_offset)",
                   np.random.default_rng(7).standard_normal(n_off) + 1e6, (1.5,), ("float64",)))
    # sparsemax's threshold -1/2 with two equal top entries and entries at it and one ulp either
    # side, unpermuted: the real-number support is 3 (p[2] = 2^-53/3), which float64 arithmetic
    # on the scores finds as 2
    out.append(Row("support-boundary", "2 equal top entries, entries at the threshold -1/2 and one ulp either side: "
                   "support 3, one entry of 3.7e-17", np.array([0.0, -0.5000000000000001, -0.49999999999999994, 0.0,
                                                               -0.5, -1.5]), (2.0,), ("float64",)))
    # alpha far above 2: edge rows whose edge gap is below float64's range
    for alpha, ties, deficit, spread in ((20.0, 1, 1e-3, True), (100.0, 2, 1e-3, True), (100.0, 1, 5e-4, False),
                                         (1000.0, 3, 0.3, True), (1000.0, 1, 0.5, False)):
        for _ in range(3 if big else 1):
            out.append(Row("alpha-far-above-2", f"alpha {alpha:g}: edge entries carry ~{deficit:g} whose gap to the "
                           "threshold underflows float64", edge_row(rng, alpha, ties, deficit, spread), (alpha,)))
    out += subnormal_rows()
    return out if big else _take_turns(out)


def boundary_rows(alpha: float, oracle) -> list[Row]:
    """Rows with entries at the support boundary and one ulp either side, for one alpha > 1:
    k equal top entries with the rest at the threshold (Lemma 2), and a random row with an
    entry inserted at its own exact threshold (correctly rounded)."""
    rng = np.random.default_rng([CONSTRUCTED, 16, int(alpha * 1e6)])
    rows = []
    a1 = alpha - 1.0
    for k in (1, 2, 3):
        # k equal top entries and the rest exactly k^(1-alpha)/(alpha-1) below sit at the
        # threshold (p = 1/k on the top, 0 on the rest); b is that gap rounded to float64
        b = -(k ** (-a1) / a1)
        x = np.concatenate([np.zeros(k), [b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf), b - 1.0]])
        rows.append(Row("support-boundary", f"{k} equal top entries; others at the threshold and one ulp either side",
                        rng.permutation(x), (alpha,)))
    x = rng.standard_normal(10)
    theta = oracle.row(x, alpha).theta  # p_i = [(alpha - 1)(x_i - theta)]_+^(1/(alpha-1)) is 0 from theta down
    for d, what in ((0.0, "at (rounded to float64)"), (np.inf, "one ulp above"), (-np.inf, "one ulp below")):
        y = np.append(x, theta if d == 0.0 else np.nextafter(theta, d))
        rows.append(Row("support-boundary", f"an entry {what} the row's exact threshold", rng.permutation(y), (alpha,)))
    return rows


@dataclass
class Context:
    size: str
    seed: int
    oracle: Any  #: exact.RowOracle
    rows: list = field(default_factory=list)
    family: Any = None  #: exact.FamilyOracle, made on first use

    def __post_init__(self):
        if not self.rows:
            self.rows = row_sources(self.size, self.seed)
            for a in ROW_ALPHAS:
                if a > 1.0:
                    self.rows.extend(boundary_rows(a, self.oracle))


def row_cases(ctx: Context, nonfinite: bool = False):
    """(source row, alpha, dtype, x in dtype as float64) for every row case; the non-finite
    rows (an error) only with ``nonfinite``."""
    rows = list(ctx.rows) + (nonfinite_rows() if nonfinite else [])
    for src in rows:
        pairs = src.pairs or [(a, dt) for dt in src.dtypes for a in src.alphas if dt in DTYPES or a in LOW_ALPHAS]
        for a, dt in pairs:
            x = in_dtype(src.x, dt)
            if not np.any(np.isinf(x) & np.isfinite(src.x)):  # else not representable in dt (1e300 in float32)
                yield src, a, dt, x


# ----------------------------------------------------------------------------- normmax, budget-sparsemax

#: normmax alphas: near 1 (p ~ t^1000 and t^20: underflow-prone powers), 1.5, 2, 3 and large
NORMMAX_ALPHAS = (1.001, 1.05, 1.5, 2.0, 3.0, 10.0, 50.0)
#: budgets: 0, integers, fractional ones, and n (every entry 1)
BUDGETS = (0.0, 1.0, 2.0, 0.3, 2.5)
#: the kinds (and how many of each) the family operations take from the entmax rows
_FAMILY_KINDS = {"random": 4, "ties": 3, "masks": 4, "all-masked": 1, "extreme": 3, "tiny": 4, "near-ties": 4,
                 "huge-offset": 3, "subnormal": 1}


def family_rows(ctx: Context) -> list[Row]:
    """The rows (n <= 64) normmax and budget-sparsemax are generated from: a subset of the
    entmax row sources (their oracles cost tens of ms a row) plus rows of their own."""
    out, seen = [], {}
    for r in ctx.rows:
        cap = _FAMILY_KINDS.get(r.kind, 0) * (3 if ctx.size == "full" else 1)
        if len(r.x) <= 64 and seen.get(r.kind, 0) < cap and "float64" in r.dtypes:
            seen[r.kind] = seen.get(r.kind, 0) + 1
            out.append(Row(r.kind, r.why, r.x))
    rng = np.random.default_rng([CONSTRUCTED, 23])
    x = rng.standard_normal(6)
    x[[1, 4]] = -np.inf
    out.append(Row("masks", "two finite entries among -inf: fewer unmasked entries than most budgets", x))
    out.append(Row("masks", "a single finite entry", np.array([-np.inf, 0.25, -np.inf, -np.inf])))
    out.append(Row("huge-offset", "scores near 1e6 with a spread of 1e-3 (cancellation in x - tau)",
                   1e6 + rng.standard_normal(12) * 1e-3))
    out.append(Row("near-ties", "all entries equal (uniform p)", np.full(7, -1.75)))
    return out


def normmax_boundary_rows(alpha: float) -> list[Row]:
    """k equal top entries (at 0) and entries exactly at normmax's threshold and one ulp
    either side: with s below the top, k (0 - s)^beta = 1 puts tau at s (beta = alpha/(alpha-1))."""
    rng = np.random.default_rng([CONSTRUCTED, 24, int(alpha * 1e6)])
    beta = alpha / (alpha - 1.0)
    rows = []
    for k in (1, 2, 3):
        s = -((1.0 / k) ** (1.0 / beta))
        x = np.concatenate([np.zeros(k), [s, np.nextafter(s, np.inf), np.nextafter(s, -np.inf), s - 1.0]])
        rows.append(Row("support-boundary", f"{k} equal top entries; others at the threshold (k |s|^beta = 1) "
                        "and one ulp either side", rng.permutation(x), (alpha,)))
    return rows


def family_cases(ctx: Context, params, boundary=None):
    """(source row, parameter, dtype, x): every row at a rotation of three of ``params``
    (all of them with --size full) in both dtypes, plus the boundary rows."""
    picks = []
    for i, src in enumerate(family_rows(ctx)):
        ps = params if ctx.size == "full" else [params[(i + j) % len(params)] for j in (0, 2, 4)]
        picks.extend((src, p) for p in ps)
    if boundary is not None:
        for p in params:
            picks.extend((src, p) for src in boundary(p))
    for src, prm in picks:
        for dt in DTYPES:
            x = in_dtype(src.x, dt)
            if not np.any(np.isinf(x) & np.isfinite(src.x)):
                yield src, prm, dt, x


def budget_boundary_rows(budget: float) -> list[Row]:
    """Rows whose entries sit exactly on budget-sparsemax's breakpoints (p = 0 or 1) and
    one ulp either side: tau = 0 with entries at 0 and 1."""
    rng = np.random.default_rng([CONSTRUCTED, 26, int(budget * 1e6)])
    x = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 0.0, np.nextafter(0.0, 1.0), -0.0, -1e-300,
                  0.5, 0.25])
    y = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])  # exact ties: tau between the breakpoints of a tied group
    return [Row("support-boundary", "entries at the breakpoints 0 and 1 and one ulp (or a denormal) away",
                rng.permutation(x), (budget,)),
            Row("ties", "a tied group that the budget splits (entries share the mass equally)", y, (budget,))]


def budget_cases(ctx: Context):
    """The family cases at each budget (capped at the row's length n), and at n itself
    alongside budget 0."""
    seen = set()
    for src, b, dt, x in family_cases(ctx, BUDGETS, budget_boundary_rows):
        if np.any(np.isfinite(x) & (x - 1.0 == x)):
            # |x| >= 2^53: x - 1 rounds to x, so the box's breakpoints collapse and float64
            # cannot represent the exact fractional entries (p = clip(x - tau, 0, 1) is off by up
            # to one there: no oracle-grade expected value exists)
            continue
        for B in dict.fromkeys((float(min(b, len(x))),) + ((float(len(x)),) if b == BUDGETS[0] else ())):
            key = (id(src), B, dt)
            if key not in seen:
                seen.add(key)
                yield src, B, dt, x


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


# ----------------------------------------------------------------------------- attention

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
    "per-head alpha": "one alpha per query head (softmax, 1.5-entmax, sparsemax, alpha 3), grouped-query heads",
    "asentmax per token": "ASEntmax beta and gamma per head and token, delta per head, offset 0.5",
    "long keys": "D = 64 and a few hundred keys, grouped-query heads, causal with Nq < Nk",
    "long keys asentmax": "D = 64 and 192 keys, grouped-query heads, ASEntmax per head, one alpha per head, ALiBi, "
                          "key padding",
    "float16": "float16 inputs (computed in float32, returned in float16)",
    "varlen": "packed sequences of different lengths (cu_seqlens), one with no keys, one with no queries",
}

#: alphas of the attention problems
ATTN_ALPHAS = (1.0, 1.5, 2.0, 3.0)


def short(rng, shape, bits: int = 4) -> np.ndarray:
    """Gaussian values rounded to ``bits`` fractional bits (multiples of 2^-bits, |x| < 4): short
    in both number forms, exact in every 16-bit dtype, and with dot products of up to 64
    terms exact in float32 too."""
    return np.clip(np.rint(rng.standard_normal(shape) * 2 ** bits) / 2 ** bits, -3.9375, 3.9375)


#: with 'small', the built-in problems run in float32 (and these in float64 too), one alpha each in turn
_ATTN_F64 = ("full", "causal Nq>Nk", "key_padding_mask", "gqa")


def attention_problems(ctx: Context):
    """(problem, alpha, dtypes) triples: the built-in attention corpus (every feature, Nq > Nk
    causal) at one alpha each in turn (every alpha in both dtypes with 'full'), problems with
    one alpha per head and ASEntmax per token, a float16 problem, and the D = 64 problems with
    a few hundred keys (inputs of 4 fractional bits: :func:`short`)."""
    full = ctx.size == "full"
    for s in range(3 if full else 1):
        rng = np.random.default_rng([ctx.seed, 21, s])
        cases = attention_corpus("quick", ctx.seed * 1000 + s, FEATURES)
        D = cases[0].q.shape[-1]
        cases.append(AttentionCase("causal Nq>Nk", rng.standard_normal((1, 2, 9, D)), rng.standard_normal((1, 2, 5, D)),
                                   rng.standard_normal((1, 2, 5, D)), {"causal": True}))
        for i, case in enumerate(cases):
            dtypes = DTYPES if full or case.name in _ATTN_F64 else ("float32",)
            for a in ATTN_ALPHAS if full else ATTN_ALPHAS[i % 4:i % 4 + 1]:
                yield case, a, dtypes
        q, k, v = rng.standard_normal((1, 4, 7, D)), rng.standard_normal((1, 2, 9, D)), rng.standard_normal((1, 2, 9, D))
        yield AttentionCase("per-head alpha", q, k, v, {"causal": True}), [1.0, 1.5, 2.0, 3.0], DTYPES
        q, k, v = (rng.standard_normal((2, 2, 6, D)) for _ in range(3))
        beta = rng.uniform(0.25, 1.5, (2, 2, 6))
        gamma = rng.uniform(0.5, 2.0, (2, 2, 6))
        yield AttentionCase("asentmax per token", q, k, v, {"beta": beta, "gamma": gamma, "delta": np.array([[0.5], [1.0]]),
                                                            "offset": 0.5, "causal": True}), 1.5, DTYPES
        q, k, v = (short(rng, (1, 2, 5, D)) for _ in range(3))
        yield AttentionCase("float16", q, k, v, {"causal": True}), 1.5, ("float16",)
    rng = np.random.default_rng([ctx.seed, 21, 100])
    big = 2 if full else 1
    q, k, v = short(rng, (1, 2, 16 * big, 64)), short(rng, (1, 1, 256 * big, 64)), short(rng, (1, 1, 256 * big, 64))
    yield AttentionCase("long keys", q, k, v, {"causal": True}), 1.5, ("float32",)
    q, k, v = short(rng, (1, 2, 8, 64)), short(rng, (1, 1, 192 * big, 64)), short(rng, (1, 1, 192 * big, 32))
    mask = np.ones((1, 192 * big), bool)
    mask[0, :20] = False
    yield AttentionCase("long keys asentmax", q, k, v, {
        "beta": np.array([[0.75], [1.25]]), "gamma": np.array([[1.0], [0.5]]), "alibi_slopes": [0.0625, 0.0],
        "key_padding_mask": mask}), [1.5, 2.0], ("float64",)


def attention_vjp_problems(ctx: Context):
    """The problems of the attention gradients: those of :func:`attention_problems`, with a
    D = 64 problem of fewer keys (its dk and dv have a number per key and dimension)."""
    for case, a, dts in attention_problems(ctx):
        if not case.name.startswith("long keys"):
            yield case, a, dts
    rng = np.random.default_rng([ctx.seed, 21, 101])
    q, k, v = short(rng, (1, 2, 8, 64)), short(rng, (1, 1, 96, 64)), short(rng, (1, 1, 96, 64))
    yield AttentionCase("long keys", q, k, v, {"causal": True}), 2.0, ("float32",)


@dataclass
class VarlenProblem:
    name: str
    q: np.ndarray  #: (total_q, Hq, D)
    k: np.ndarray  #: (total_k, Hkv, D)
    v: np.ndarray  #: (total_k, Hkv, Dv)
    cu_seqlens_q: list
    cu_seqlens_k: list
    kwargs: dict = field(default_factory=dict)


def varlen_problems(ctx: Context):
    """(problem, alpha, dtypes): packed sequences of 5, 0 and 7 queries against 9, 4 and 0
    keys (a sequence without queries, one without keys), causal and not, grouped-query heads."""
    rng = np.random.default_rng([ctx.seed, 21, 200])
    cq, ck = [0, 5, 5, 12], [0, 9, 13, 13]
    for causal, a in ((True, 1.5), (False, 2.0), (True, 1.0)):
        q, k, v = rng.standard_normal((12, 4, 8)), rng.standard_normal((13, 2, 8)), rng.standard_normal((13, 2, 6))
        yield VarlenProblem("varlen", q, k, v, cq, ck, {"causal": causal}), a, DTYPES
