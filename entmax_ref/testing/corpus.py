"""The built-in corpus: seeded score rows and attention problems, in three sizes.

Row cases (each a float64 (rows, n) array; cast to the dtype under test):

* ``random``   Gaussian rows at scales 0.5, 2 and 10;
* ``ties``     multiples of 1/4 (exact ties, also at the threshold);
* ``masks``    random -inf entries, a single finite entry per row;
* ``all-masked`` rows that are entirely -inf (the contract: all zeros);
* ``extreme``  large offsets (1e4, -1e5) and a large spread (scale 1e3);
* ``tiny``     n = 1 and n = 2;
* ``long``     one long row batch (n = 1024 / 4096 / 32768);
* ``golden``   rows whose exact answer is known in closed form (see :data:`GOLDEN`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SIZES = ("quick", "default", "thorough")

#: (x, alpha, exact p): hand-checkable answers.
GOLDEN = [
    ([-2.0, 0.0, 0.5], 2.0, [0.0, 0.25, 0.75]),
    ([0.0, 1.0], 1.5, [((np.sqrt(7) - 1) / 4) ** 2, ((1 + np.sqrt(7)) / 4) ** 2]),
    ([0.0, np.log(3.0)], 1.0, [0.25, 0.75]),
    ([1.0, 1.0, -np.inf], 3.0, [0.5, 0.5, 0.0]),
    # Lemma 2: k = 2 top entries at a gap >= k^(1 - alpha) / (alpha - 1) get exactly 1/2
    ([0.0, 0.0, -1.0, -2.0], 3.0, [0.5, 0.5, 0.0, 0.0]),
    ([0.0, 0.0, -4.0, -5.0], 1.25, [0.5, 0.5, 0.0, 0.0]),
    ([5.0, 5.0, 5.0, 5.0], 1.5, [0.25] * 4),
]


@dataclass
class RowCase:
    name: str  #: the kind of case (two ``tiny`` cases share it)
    x: np.ndarray  #: (rows, n) float64
    id: str = ""  #: unique in the corpus (the name unless it is shared); the reports' case id

    def __post_init__(self):
        self.id = self.id or self.name


def row_corpus(size: str = "default", seed: int = 0) -> list[RowCase]:
    """The row cases (see the module docs); ``size`` scales rows and lengths."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    rng = np.random.default_rng(seed)
    rows = {"quick": 8, "default": 32, "thorough": 256}[size]
    n = {"quick": 17, "default": 61, "thorough": 250}[size]
    long_n = {"quick": 1024, "default": 4096, "thorough": 32768}[size]
    cases = [RowCase("random", np.concatenate([rng.standard_normal((rows, n)) * s for s in (0.5, 2.0, 10.0)]))]
    cases.append(RowCase("ties", rng.integers(-8, 9, (rows, n)) / 4.0))
    m = rng.standard_normal((rows, n)) * 2
    m[rng.random((rows, n)) < 0.4] = -np.inf
    m[:, 0] = rng.standard_normal(rows)  # at least one finite entry per row
    single = np.full((4, n), -np.inf)
    single[np.arange(4), rng.integers(0, n, 4)] = rng.standard_normal(4)
    cases.append(RowCase("masks", np.concatenate([m, single])))
    cases.append(RowCase("all-masked", np.full((2, n), -np.inf)))
    ext = [rng.standard_normal((rows // 2 or 1, n)) + off for off in (1e4, -1e5)]
    ext.append(rng.standard_normal((rows // 2 or 1, n)) * 1e3)
    cases.append(RowCase("extreme", np.concatenate(ext)))
    cases.append(RowCase("tiny", rng.standard_normal((rows, 1)), "tiny n=1"))
    cases.append(RowCase("tiny", rng.standard_normal((rows, 2)), "tiny n=2"))
    cases.append(RowCase("long", rng.standard_normal((2, long_n)) * 3))
    return cases


def golden_cases(alpha: float | None = None):
    """GOLDEN entries, all or those for one alpha."""
    return [(np.array([x]), a, np.array([p])) for x, a, p in GOLDEN if alpha is None or a == alpha]


@dataclass
class AttentionCase:
    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kwargs: dict = field(default_factory=dict)  #: causal, key_lengths, alibi_slopes, beta, gamma, scale


FEATURES = ("causal", "gqa", "key_lengths", "alibi", "asentmax", "cross", "key_padding_mask")


def attention_corpus(size: str = "default", seed: int = 0, features=("causal", "gqa", "cross")) -> list[AttentionCase]:
    """Attention problems with irregular sizes (not multiples of a block size).

    ``features`` selects what the implementation under test supports: "causal", "gqa"
    (Hq = 2 Hkv), "key_lengths" (right padding, one batch with no keys), "alibi",
    "asentmax" (per-head beta and gamma), "cross" (Nq != Nk), "key_padding_mask" (a (B, Nk)
    bool ``key_padding_mask``: left padding, and left with right padding).  Plain full attention with
    Nq = Nk is always included.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    bad = set(features) - set(FEATURES)
    if bad:
        raise ValueError(f"unknown attention features {sorted(bad)}; choose from {FEATURES}")
    rng = np.random.default_rng(seed)
    N = {"quick": 13, "default": 37, "thorough": 203}[size]
    D = {"quick": 8, "default": 16, "thorough": 64}[size]

    def qkv(B, Hq, Hkv, Nq, Nk, Dv=None):
        return (rng.standard_normal((B, Hq, Nq, D)), rng.standard_normal((B, Hkv, Nk, D)),
                rng.standard_normal((B, Hkv, Nk, Dv or D)))

    cases = [AttentionCase("full", *qkv(2, 2, 2, N, N))]
    if "causal" in features:
        cases.append(AttentionCase("causal", *qkv(1, 2, 2, N, N), {"causal": True}))
    if "cross" in features:
        cases.append(AttentionCase("Nq!=Nk", *qkv(1, 2, 2, N // 2 + 1, N + 6, D // 2 + 1)))
        if "causal" in features:
            cases.append(AttentionCase("causal Nq<Nk", *qkv(1, 1, 1, N // 3 + 1, N + 4), {"causal": True}))
    if "gqa" in features:
        cases.append(AttentionCase("gqa", *qkv(1, 4, 2, N, N), {"causal": "causal" in features}))
    if "key_lengths" in features:
        cases.append(AttentionCase("key_lengths", *qkv(3, 2, 2, N, N + 3), {"key_lengths": [N + 3, N // 2, 0]}))
    if "alibi" in features:
        cases.append(AttentionCase("alibi", *qkv(1, 3, 3, N, N),
                                   {"alibi_slopes": [0.5, 0.125, 0.0], "causal": "causal" in features}))
    if "asentmax" in features:
        cases.append(AttentionCase("asentmax", *qkv(1, 2, 2, N, N),
                                   {"beta": np.array([[0.5], [1.0]]), "gamma": np.array([[1.0], [0.5]]),
                                    "causal": "causal" in features}))
    if "key_padding_mask" in features:
        mask = np.ones((3, N), bool)
        mask[0, : N // 3] = False  # left padding
        mask[1, : N // 4] = False  # left and right padding
        mask[1, N - N // 5:] = False
        cases.append(AttentionCase("key_padding_mask", *qkv(3, 2, 2, N, N),
                                   {"key_padding_mask": mask, "causal": "causal" in features}))
    return cases
