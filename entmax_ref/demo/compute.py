"""The claims of ``entmax-ref demo`` as plain functions that return NumPy arrays.

Nothing here prints or plots: the test suite asserts these numbers, :mod:`.plots` draws
them and :mod:`.cli` prints them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import entmax_ref as er

__all__ = [
    "LOG2_N", "LOG2_N_GAUSS", "SEEDS", "alibi_window", "collapse", "dispersion_gaussian", "dispersion_two_level",
    "gamma_sweep", "lemma1", "lemma2_gap", "lemma2_sweep", "lemma2_table",
]

#: log2 of the row lengths of the dispersion and gamma sweeps.
LOG2_N = tuple(range(6, 21))
#: The Gaussian sweeps use every other length (5 seeds of 2^20 floats each is the cost).
LOG2_N_GAUSS = tuple(range(6, 21, 2))
SEEDS = 5


# ------------------------------------------------------------------------------ helpers
def _two_level(n: int, k: int, gap: float) -> np.ndarray:
    """k relevant tokens at ``gap`` (the first k positions), n - k background tokens at 0."""
    x = np.zeros(n)
    x[:k] = gap
    return x


def lemma2_gap(k, alpha):
    """The gap Delta*_k = k^(1-alpha)/(alpha-1) above which alpha-entmax gives exactly 1/k
    to each of k tokens standing above a flat background (alpha > 1).

    Examples
    --------
    >>> from entmax_ref.demo import lemma2_gap
    >>> [round(float(lemma2_gap(k, 1.5)), 3) for k in (1, 4, 16)]
    [2.0, 1.0, 0.5]
    >>> float(lemma2_gap(4, 2.0))
    0.25
    """
    k = np.asarray(k, dtype=np.float64)
    return k ** (1.0 - alpha) / (alpha - 1.0)


# ------------------------------------------------------------------------------ claims
def dispersion_two_level(log2_n=LOG2_N, gap=1.0, *, backend="numpy") -> dict[str, Any]:
    """Normalised entropy and relevant mass of one token ``gap`` above n - 1 zeros.

    Methods: softmax, SSMax (beta = 1), 1.5-entmax, ASEntmax (alpha 1.5, beta 1, gamma 0.5,
    delta 0).  Returns ``{"n": (m,), "entropy": {method: (m,)}, "mass": {method: (m,)},
    "support": {method: (m,)}}``.
    """
    ns = np.array([2**e for e in log2_n])
    out: dict[str, Any] = {"n": ns, "entropy": {}, "mass": {}, "support": {}}
    fns = _methods(backend)
    for name, fn in fns.items():
        ent, mass, supp = [], [], []
        for n in ns:
            p = fn(_two_level(int(n), 1, gap))
            ent.append(float(er.normalized_entropy(p)))
            mass.append(float(p[0]))
            supp.append(int(er.support_size(p)))
        out["entropy"][name], out["mass"][name], out["support"][name] = (np.array(ent) + 0.0, np.array(mass), np.array(supp))
    return out


def dispersion_gaussian(log2_n=LOG2_N_GAUSS, seeds=SEEDS, *, backend="numpy") -> dict[str, Any]:
    """Normalised entropy, top-token mass and support on IID N(0, 1) rows (mean over seeds).

    Same methods as :func:`dispersion_two_level`; row s of each length uses seed s.
    """
    ns = np.array([2**e for e in log2_n])
    out: dict[str, Any] = {"n": ns, "entropy": {}, "mass": {}, "support": {}}
    fns = _methods(backend)
    stats = {name: ([], [], []) for name in fns}
    for n in ns:
        x = _gaussian_rows(int(n), seeds)
        for name, fn in fns.items():
            p = fn(x)
            stats[name][0].append(float(er.normalized_entropy(p).mean()))
            stats[name][1].append(float(er.max_probability(p).mean()))
            stats[name][2].append(float(er.support_size(p).mean()))
    for name, (ent, mass, supp) in stats.items():
        out["entropy"][name], out["mass"][name], out["support"][name] = (np.array(ent) + 0.0, np.array(mass), np.array(supp))
    return out


def _gaussian_rows(n: int, seeds: int) -> np.ndarray:
    return np.stack([np.random.default_rng(s).standard_normal(n) for s in range(seeds)])


def _methods(backend):
    return {
        "softmax": lambda x: er.softmax(x, backend=backend),
        "SSMax (beta=1)": lambda x: er.ssmax(x, beta=1.0, backend=backend),
        "1.5-entmax": lambda x: er.entmax15(x, backend=backend),
        "ASEntmax (gamma=0.5)": lambda x: er.asentmax(x, 1.5, beta=1.0, gamma=0.5, delta=0.0, backend=backend),
    }


def lemma1(appended=(1, 10, 100, 1_000, 10_000, 100_000), n0=100, alpha=1.5, seed=0, *,
           backend="numpy") -> dict[str, Any]:
    """Append m tokens scored below tau/(alpha - 1) to an n0-token N(0, 1) row.

    The appended scores are uniform in [tau/(alpha-1) - 3, tau/(alpha-1)], tau being the
    original row's threshold.  Returns per m: the largest change of the original entmax
    probabilities, the entmax mass on the appended tokens, and softmax's mass on the
    original tokens, the largest change of an original softmax probability, and softmax's
    largest probability.
    """
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(n0)
    p0, info = er.entmax(x0, alpha, return_info=True, backend=backend)
    q0 = er.softmax(x0, backend=backend)
    cut = float(info.tau) / (alpha - 1.0)  # z <= cut: below the threshold
    rows = {"m": np.array(appended), "entmax_max_change": [], "entmax_appended_mass": [],
            "softmax_original_mass": [], "softmax_max_change": [], "softmax_pmax": []}
    for m in appended:
        x = np.concatenate([x0, cut - 3.0 * rng.random(m)])
        p = er.entmax(x, alpha, backend=backend)
        q = er.softmax(x, backend=backend)
        rows["entmax_max_change"].append(float(np.abs(p[:n0] - p0).max()))
        rows["entmax_appended_mass"].append(float(p[n0:].sum()))
        rows["softmax_original_mass"].append(float(q[:n0].sum()))
        rows["softmax_max_change"].append(float(np.abs(q[:n0] - q0).max()))
        rows["softmax_pmax"].append(float(q.max()))
    return {key: np.array(val) for key, val in rows.items()} | {"threshold": cut, "softmax_pmax0": float(q0.max())}


def lemma2_table(alphas=(1.25, 1.5, 2.0), ks=(1, 2, 4, 8, 16, 32), log2_n=(8, 12, 16), *,
                 backend="numpy") -> list[dict[str, Any]]:
    """Support just below and just above the Lemma-2 gap, per (alpha, k), at several n.

    Below is Delta* (1 - 1e-3), above is Delta* (1 + 1e-6).  Each entry: alpha, k, gap,
    ``below`` and ``above`` (support per n) and ``mass_above`` (relevant mass per n).
    """
    table = []
    for alpha in alphas:
        gaps = lemma2_gap(np.array(ks), alpha)
        entries = [{"alpha": alpha, "k": k, "gap": float(g), "below": [], "above": [], "mass_above": []}
                   for k, g in zip(ks, gaps)]
        for e in log2_n:
            n = 2**e
            x = np.zeros((2 * len(ks), n))
            for i, (k, g) in enumerate(zip(ks, gaps)):
                x[2 * i, :k] = g * (1 - 1e-3)
                x[2 * i + 1, :k] = g * (1 + 1e-6)
            p = er.entmax(x, alpha, backend=backend)
            supp = er.support_size(p)
            for i, (entry, k) in enumerate(zip(entries, ks)):
                entry["below"].append(int(supp[2 * i]))
                entry["above"].append(int(supp[2 * i + 1]))
                entry["mass_above"].append(float(p[2 * i + 1, :k].sum()))
        table.extend(entries)
    return table


def lemma2_sweep(gaps=None, softmax_gaps=None, k=4, log2_n=(6, 10, 13, 16), alpha=1.5, *,
                 backend="numpy") -> dict[str, Any]:
    """Relevant mass of k tokens vs the gap Delta, for entmax and softmax, at several n.

    Softmax gets a wider gap range (it needs gaps of order log n); ``softmax_gap90`` is the
    gap at which its relevant mass is 0.9, ln(9 (n - k) / k).
    """
    gaps = np.linspace(0.0, 3.0, 31) if gaps is None else np.asarray(gaps, dtype=np.float64)
    sgaps = np.linspace(0.0, 15.0, 61) if softmax_gaps is None else np.asarray(softmax_gaps, dtype=np.float64)
    ns = np.array([2**e for e in log2_n])
    ent, soft = np.zeros((len(ns), len(gaps))), np.zeros((len(ns), len(sgaps)))
    for i, n in enumerate(ns):
        x = np.zeros((len(gaps), int(n)))
        x[:, :k] = gaps[:, None]
        ent[i] = er.entmax(x, alpha, backend=backend)[:, :k].sum(axis=1)
        x = np.zeros((len(sgaps), int(n)))
        x[:, :k] = sgaps[:, None]
        soft[i] = er.softmax(x, backend=backend)[:, :k].sum(axis=1)
    return {"gap": gaps, "softmax_gap": sgaps, "n": ns, "k": k, "alpha": alpha, "entmax": ent,
            "softmax": soft, "threshold": float(lemma2_gap(k, alpha)),
            "softmax_gap90": np.log(9.0 * (ns - k) / k)}


def gamma_sweep(gammas=(-1.0, -0.5, 0.0, 0.5, 1.0), log2_n=LOG2_N_GAUSS, seeds=SEEDS, *,
                backend="numpy") -> dict[str, Any]:
    """Support and top probability of 1.5-entmax(log(n+1)^gamma x) on IID N(0, 1) rows."""
    ns = np.array([2**e for e in log2_n])
    support, pmax = np.zeros((len(gammas), len(ns))), np.zeros((len(gammas), len(ns)))
    for j, n in enumerate(ns):
        x = _gaussian_rows(int(n), seeds)
        for i, g in enumerate(gammas):
            p = er.asentmax(x, 1.5, beta=1.0, gamma=g, delta=0.0, backend=backend)
            support[i, j] = er.support_size(p).mean()
            pmax[i, j] = er.max_probability(p).mean()
    return {"gamma": np.array(gammas), "n": ns, "support": support, "pmax": pmax}


def collapse(log2_n=tuple(range(4, 17)), gaps=(1.0, 2.0), dv=8, seed=0, *, backend="numpy") -> dict[str, Any]:
    """||o - o'|| / ||v_a - v_b|| for one query over n keys, the last key scored ``gap``
    above the rest, when two sequences differ only in that key's value (v_a vs v_b).

    Computed with :func:`entmax_ref.attention` (head dim 1: q = 1, k_j = score_j, scale 1).
    Returns ``{"n", "gaps", "softmax": (gaps, n), "entmax": (gaps, n)}``.
    """
    rng = np.random.default_rng(seed)
    ns = np.array([2**e for e in log2_n])
    res = {"n": ns, "gaps": np.array(gaps), "softmax": np.zeros((len(gaps), len(ns))),
           "entmax": np.zeros((len(gaps), len(ns)))}
    q = np.ones((1, 1, 1, 1))
    for j, n in enumerate(ns):
        v = rng.standard_normal((1, 1, int(n), dv))
        v2 = v.copy()
        v2[0, 0, -1] = rng.standard_normal(dv)
        dist = np.linalg.norm(v[0, 0, -1] - v2[0, 0, -1])
        for i, gap in enumerate(gaps):
            k = np.zeros((1, 1, int(n), 1))
            k[0, 0, -1, 0] = gap
            for name, alpha in (("softmax", 1.0), ("entmax", 1.5)):
                o1 = er.attention(q, k, v, alpha=alpha, scale=1.0, backend=backend)
                o2 = er.attention(q, k, v2, alpha=alpha, scale=1.0, backend=backend)
                res[name][i, j] = np.linalg.norm(o1 - o2) / dist
    return res


def alibi_window(slopes=(1.0, 0.5, 0.125), n=4096, alpha=1.5, seed=0, *, backend="numpy") -> dict[str, Any]:
    """Weights by distance of the last query of a causal ALiBi head, entmax vs softmax.

    Content scores c_j are uniform in [-2, 2]; the query sees z_j = c_j - m (n - 1 - j).
    Thresholds come from :func:`entmax_ref.attention` (``info.tau``), and the weights from
    the threshold form p_j = [(alpha-1) z_j - tau]_+^(1/(alpha-1)) (exp(z_j - tau) for
    softmax).  Per slope: the weights by distance d = 0..n-1, the bound
    (max c - min c + 1/(alpha-1))/m, entmax's farthest supported distance, and each
    method's mass beyond the bound.
    """
    rng = np.random.default_rng(seed)
    c = rng.uniform(-2.0, 2.0, n)
    d = np.arange(n)[::-1]  # distance of key j from the query at position n - 1
    q = np.ones((1, 1, 1, 1))
    k = c.reshape(1, 1, n, 1)
    v = np.zeros((1, 1, n, 1))
    out = {"slopes": np.array(slopes), "n": n, "distance": np.arange(n), "entmax": [], "softmax": [],
           "bound": [], "farthest": [], "entmax_beyond": [], "softmax_beyond": [], "support": []}
    for m in slopes:
        z = c - m * d
        weights = {}
        for name, a in (("entmax", alpha), ("softmax", 1.0)):
            _, info = er.attention(q, k, v, alpha=a, scale=1.0, causal=True, alibi_slopes=[m],
                                   return_info=True, backend=backend)
            tau = float(info.tau.ravel()[0])
            if a == 1.0:
                p = np.exp(z - tau)
            else:
                p = np.maximum((a - 1.0) * z - tau, 0.0) ** (1.0 / (a - 1.0))
            if name == "entmax":
                out["support"].append(int(info.support.ravel()[0]))
            by_d = np.zeros(n)
            by_d[d] = p
            weights[name] = by_d
        bound = (c.max() - c.min() + 1.0 / (alpha - 1.0)) / m
        out["bound"].append(float(bound))
        out["farthest"].append(int(np.flatnonzero(weights["entmax"] > 0).max()))
        beyond = np.arange(n) > bound
        for name in ("entmax", "softmax"):
            out[name].append(weights[name])
            out[f"{name}_beyond"].append(float(weights[name][beyond].sum()))
    return {key: (np.array(val) if isinstance(val, list) else val) for key, val in out.items()}
