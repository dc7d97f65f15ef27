"""``entmax-ref demo``: the long-context claims about sparse attention, computed and plotted.

Each claim is a plain function that returns NumPy arrays (so the test suite can assert
it) and a figure that shows it; nothing is trained.  The claims follow *Long-Context
Generalization with Sparse Attention* (Vasylenko et al.):

``dispersion``
    softmax spreads its mass over everything as the row grows (H/log n -> 1, the mass on
    the relevant token -> 0); SSMax, 1.5-entmax and ASEntmax do not.
``lemma1``
    appending tokens scored below tau/(alpha-1) leaves every entmax probability exactly
    unchanged; softmax dilutes all of them.
``lemma2``
    k tokens a gap Delta above a flat background get exactly 1/k each iff
    Delta >= k^(1-alpha)/(alpha-1), whatever n; softmax needs a gap growing like log n.
``gamma``
    ASEntmax's s = log(n+1)^gamma on IID Gaussian rows: gamma > 0 sharpens and gamma < 0
    softens attention as n grows.
``collapse``
    two sequences that differ in one token: softmax outputs become indistinguishable as
    n grows, entmax outputs keep a fixed distance.
``alibi``
    ALiBi + entmax attends an exact window of width (range + 1/(alpha-1))/slope at any n;
    ALiBi + softmax only decays geometrically and leaks mass to every key.

Usage: ``entmax-ref demo [--out DIR] [--only NAME ...] [--backend NAME] [--no-plots]``.
Figures are PNG files written to ``--out`` (the current directory by default); the
tables are printed.  Plotting needs matplotlib (``pip install 'entmax-ref[plot]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import entmax_ref as er

#: log2 of the row lengths of the dispersion and gamma sweeps.
LOG2_N = tuple(range(6, 21))
#: The Gaussian sweeps use every other length (5 seeds of 2^20 floats each is the cost).
LOG2_N_GAUSS = tuple(range(6, 21, 2))
SEEDS = 5

PLOT_HINT = "pip install 'entmax-ref[plot]'"

#: The PNG file each demo writes.
FIGURES = {
    "dispersion": "dispersion.png",
    "lemma1": "lemma1.png",
    "lemma2": "lemma2.png",
    "gamma": "asentmax_gamma.png",
    "collapse": "collapse.png",
    "alibi": "alibi_window.png",
}

CAPTIONS = {
    "dispersion": (
        "Dispersion as the row grows. Top: one relevant token scored 1 above n - 1 background "
        "tokens. Softmax's normalised entropy stays at 1 and its relevant mass falls to 0; SSMax "
        "(beta = 1) holds 1/2; 1.5-entmax is dense here (the gap is below its one-token threshold "
        "2) but keeps at least 1/4 on the relevant token at every n (it tends to (gap/2)^2 = 1/4); "
        "ASEntmax (s = log(n+1)^0.5) puts all the mass, exactly, on the relevant token. Bottom: "
        "IID N(0, 1) rows, mean of 5 seeds: softmax's entropy rises towards 1 and its top "
        "probability falls towards 0; the entropy of SSMax and of both entmax variants falls as "
        "n grows and their top probability does not vanish."
    ),
    "lemma1": (
        "Lemma 1. A 100-token row, then m appended tokens scored below tau/(alpha-1). The 100 "
        "original 1.5-entmax probabilities do not change at all (the largest change is exactly "
        "0.0, the appended tokens get exactly 0), while softmax hands the new tokens most of its "
        "mass and the original tokens' share falls towards 0."
    ),
    "lemma2": (
        "Lemma 2. k = 4 relevant tokens a gap Delta above n - 4 equal background tokens. Left: "
        "1.5-entmax gives them all the mass, exactly 1/4 each, once Delta >= 4^(-1/2)/(1/2) = 1, "
        "at every n (the curves meet at the dashed line). Right: softmax needs a gap that grows "
        "like log n for the same mass: the gap that gives 0.9 (dots) moves right by about ln 2 each time n "
        "doubles."
    ),
    "gamma": (
        "The ASEntmax exponent on IID N(0, 1) rows (1.5-entmax of s x with s = log(n+1)^gamma; "
        "mean of 5 seeds). As n grows, gamma > 0 keeps the support small and the top probability "
        "high (sharpening), gamma = 0 (plain entmax) lets the support grow slowly, and gamma < 0 "
        "lets it grow fast and the top probability fall (softening)."
    ),
    "collapse": (
        "Representational collapse. Two sequences differ only in the last token's value, which "
        "is scored a gap Delta above the other n - 1 keys. With softmax the attention outputs "
        "become indistinguishable (the distance falls like 1/n); with 1.5-entmax it stays "
        "exactly 1 for Delta = 2 and tends to 1/4 for Delta = 1, at every n."
    ),
    "alibi": (
        "ALiBi hard window. One query over 4096 keys with content scores uniform in [-2, 2] and "
        "ALiBi bias -m d at distance d. 1.5-entmax gives exactly zero weight beyond its farthest "
        "supported key, always inside the bound (range + 2)/m (dashed), whatever n; softmax's "
        "weight only decays geometrically and leaks mass past the bound."
    ),
}


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


# ------------------------------------------------------------------------------ figures
def _figure(nrows: int, ncols: int, size: tuple[float, float]):
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised by the CLI test with a fake import
        raise ImportError(f"entmax-ref demo draws its figures with matplotlib, which is not installed: {PLOT_HINT}") from exc
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


_STYLE = {
    "softmax": dict(color="#d62728", marker="o"),
    "SSMax (beta=1)": dict(color="#ff7f0e", marker="s"),
    "1.5-entmax": dict(color="#1f77b4", marker="^"),
    "ASEntmax (gamma=0.5)": dict(color="#2ca02c", marker="D", linestyle="--"),
}


def _save(fig, out_dir: str, filename: str) -> str:
    path = os.path.join(out_dir, filename)
    fig.savefig(path, dpi=90)
    return path


def plot_dispersion(two, gauss, out_dir: str) -> str:
    fig, ax = _figure(2, 2, (9.0, 6.4))
    for row, data, what in ((0, two, "relevant token"), (1, gauss, "top token")):
        for name, style in _STYLE.items():
            ax[row, 0].plot(data["n"], data["entropy"][name], label=name, ms=4, **style)
            ax[row, 1].plot(data["n"], data["mass"][name], label=name, ms=4, **style)
        ax[row, 0].set_ylabel("normalised entropy H/log n")
        ax[row, 1].set_ylabel(f"mass on the {what}")
        for a in ax[row]:
            a.set_xscale("log", base=2)
            a.set_ylim(-0.03, 1.03)
            a.grid(alpha=0.3)
    ax[0, 0].set_title("two-level row: 1 token 1 above the rest", fontsize=10)
    ax[0, 1].set_title("two-level row: 1 token 1 above the rest", fontsize=10)
    ax[1, 0].set_title(f"IID N(0,1) rows, mean of {SEEDS} seeds", fontsize=10)
    ax[1, 1].set_title(f"IID N(0,1) rows, mean of {SEEDS} seeds", fontsize=10)
    for a in ax[1]:
        a.set_xlabel("row length n")
    ax[0, 1].legend(fontsize=8, loc="center right")
    return _save(fig, out_dir, FIGURES["dispersion"])


def plot_lemma1(res, out_dir: str) -> str:
    fig, ax = _figure(1, 2, (9.0, 3.6))
    m = res["m"]
    ax[0, 0].plot(m, 1.0 - res["entmax_appended_mass"], color="#1f77b4", marker="^", label="1.5-entmax")
    ax[0, 0].plot(m, res["softmax_original_mass"], color="#d62728", marker="o", label="softmax")
    ax[0, 0].set_ylabel("mass on the 100 original tokens")
    ax[0, 0].set_yscale("log")
    ax[0, 0].legend(fontsize=8)
    ax[0, 1].plot(m, res["entmax_max_change"], color="#1f77b4", marker="^", label="1.5-entmax (exactly 0)")
    ax[0, 1].plot(m, res["softmax_max_change"], color="#d62728", marker="o", label="softmax")
    ax[0, 1].set_ylabel("largest change of an original p_i")
    ax[0, 1].legend(fontsize=8)
    for a in ax[0]:
        a.set_xscale("log")
        a.set_xlabel("appended tokens m")
        a.grid(alpha=0.3)
    return _save(fig, out_dir, FIGURES["lemma1"])


def plot_lemma2(res, out_dir: str) -> str:
    fig, ax = _figure(1, 2, (9.0, 3.6))
    colors = ["#9ecae1", "#4292c6", "#08519c", "#08306b"]
    for i, n in enumerate(res["n"]):
        label = f"n = 2^{int(np.log2(n))}"
        ax[0, 0].plot(res["gap"], res["entmax"][i], color=colors[i % 4], label=label)
        ax[0, 1].plot(res["softmax_gap"], res["softmax"][i], color=colors[i % 4], label=label)
        ax[0, 1].plot([res["softmax_gap90"][i]], [0.9], color=colors[i % 4], marker="o", ms=5)
    ax[0, 0].axvline(res["threshold"], color="k", linestyle="--", lw=1)
    ax[0, 0].set_title(f"1.5-entmax, k = {res['k']}: exactly 1 from gap {res['threshold']:g} on", fontsize=10)
    ax[0, 1].set_title(f"softmax, k = {res['k']}: 0.9 reached at ln(9(n-k)/k) (dots)", fontsize=10)
    for a in ax[0]:
        a.set_xlabel("gap Delta")
        a.set_ylabel(f"mass on the {res['k']} relevant tokens")
        a.set_ylim(-0.03, 1.03)
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="lower right")
    return _save(fig, out_dir, FIGURES["lemma2"])


def plot_gamma(res, out_dir: str) -> str:
    fig, ax = _figure(1, 2, (9.0, 3.6))
    cmap = ["#08519c", "#6baed6", "#444444", "#fd8d3c", "#a63603"]
    for i, g in enumerate(res["gamma"]):
        style = dict(color=cmap[i % 5], marker="o", ms=4, label=f"gamma = {g:+g}")
        ax[0, 0].plot(res["n"], res["support"][i], **style)
        ax[0, 1].plot(res["n"], res["pmax"][i], **style)
    ax[0, 0].set_yscale("log")
    ax[0, 0].set_ylabel("support size")
    ax[0, 1].set_ylabel("largest probability")
    ax[0, 1].set_ylim(0, 1.03)
    for a in ax[0]:
        a.set_xscale("log", base=2)
        a.set_xlabel("row length n")
        a.grid(alpha=0.3)
    ax[0, 0].legend(fontsize=8)
    return _save(fig, out_dir, FIGURES["gamma"])


def plot_collapse(res, out_dir: str) -> str:
    fig, ax = _figure(1, 1, (6.0, 3.8))
    a = ax[0, 0]
    for i, gap in enumerate(res["gaps"]):
        ls = "-" if i == 0 else "--"
        a.plot(res["n"], res["softmax"][i], color="#d62728", marker="o", ms=4, linestyle=ls, label=f"softmax, Delta = {gap:g}")
        a.plot(res["n"], res["entmax"][i], color="#1f77b4", marker="^", ms=4, linestyle=ls, label=f"1.5-entmax, Delta = {gap:g}")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("sequence length n")
    a.set_ylabel("||o - o'|| / ||v_a - v_b||")
    a.grid(alpha=0.3)
    a.legend(fontsize=8, loc="lower left")
    return _save(fig, out_dir, FIGURES["collapse"])


def plot_alibi(res, out_dir: str) -> str:
    fig, ax = _figure(1, len(res["slopes"]), (10.0, 3.4))
    for i, m in enumerate(res["slopes"]):
        a = ax[0, i]
        bound = res["bound"][i]
        dmax = int(min(res["n"] - 1, np.ceil(1.6 * bound) + 2))
        d = res["distance"][: dmax + 1]
        soft = res["softmax"][i][: dmax + 1]
        ent = res["entmax"][i][: dmax + 1]
        a.semilogy(d, soft, color="#d62728", lw=1, label="softmax")
        on = ent > 0
        a.semilogy(d[on], ent[on], color="#1f77b4", marker=".", linestyle="none", label="1.5-entmax (0 elsewhere)")
        a.axvline(bound, color="k", linestyle="--", lw=1, label="bound (range + 2)/m")
        a.set_title(f"ALiBi slope m = {m:g}, bound {bound:.1f}", fontsize=10)
        a.text(0.97, 0.97, f"entmax: last key at d = {res['farthest'][i]},\nmass beyond bound = "
               f"{res['entmax_beyond'][i]:g}\nsoftmax: mass beyond bound\n= {res['softmax_beyond'][i]:.1e}",
               transform=a.transAxes, ha="right", va="top", fontsize=7.5,
               bbox=dict(boxstyle="round", fc="white", ec="0.7"))
        a.set_xlabel("distance d to the query")
        a.grid(alpha=0.3)
    ax[0, 0].set_ylabel("attention weight")
    ax[0, 0].legend(fontsize=7, loc="lower left")
    return _save(fig, out_dir, FIGURES["alibi"])


# ------------------------------------------------------------------------------ command
def _fmt(values, spec="{:.4g}") -> str:
    return " ".join(spec.format(v) for v in values)


def _run_dispersion(args, out):
    two = dispersion_two_level(backend=args.backend)
    gauss = dispersion_gaussian(backend=args.backend)
    print("dispersion, two-level row (1 token, gap 1); n =", _fmt(two["n"], "{:d}"))
    for name in two["mass"]:
        print(f"  {name:22s} mass    {_fmt(two['mass'][name])}")
        print(f"  {'':22s} H/log n {_fmt(two['entropy'][name])}")
    print("dispersion, IID N(0,1) rows; n =", _fmt(gauss["n"], "{:d}"))
    for name in gauss["mass"]:
        print(f"  {name:22s} p_max   {_fmt(gauss['mass'][name])}")
        print(f"  {'':22s} H/log n {_fmt(gauss['entropy'][name])}")
    return None if args.no_plots else plot_dispersion(two, gauss, out)


def _run_lemma1(args, out):
    res = lemma1(backend=args.backend)
    print("Lemma 1 (100-token row, m appended tokens below tau/(alpha-1)):")
    print(f"  (before appending: softmax p_max {res['softmax_pmax0']:.4g})")
    print("  m       entmax max |dp|  entmax appended mass  softmax max |dp|  softmax original mass  softmax p_max")
    for i, m in enumerate(res["m"]):
        print(f"  {m:<7d} {res['entmax_max_change'][i]:<16.3g} {res['entmax_appended_mass'][i]:<21.3g} "
              f"{res['softmax_max_change'][i]:<17.4g} {res['softmax_original_mass'][i]:<22.4g} {res['softmax_pmax'][i]:.4g}")
    return None if args.no_plots else plot_lemma1(res, out)


def _run_lemma2(args, out):
    table = lemma2_table(backend=args.backend)
    print("Lemma 2 (support just below / just above the gap k^(1-alpha)/(alpha-1); n = 2^8, 2^12, 2^16):")
    print("  alpha  k   gap      support below          support above")
    for e in table:
        print(f"  {e['alpha']:<5g}  {e['k']:<3d} {e['gap']:<8.4f} {str(e['below']):<22s} {e['above']}")
    sweep = lemma2_sweep(backend=args.backend)
    return None if args.no_plots else plot_lemma2(sweep, out)


def _run_gamma(args, out):
    res = gamma_sweep(backend=args.backend)
    print("ASEntmax exponent on IID N(0,1) rows (s = log(n+1)^gamma); n =", _fmt(res["n"], "{:d}"))
    for i, g in enumerate(res["gamma"]):
        print(f"  gamma {g:+.1f}  support {_fmt(res['support'][i], '{:.1f}')}")
        print(f"  {'':11s} p_max   {_fmt(res['pmax'][i], '{:.3f}')}")
    return None if args.no_plots else plot_gamma(res, out)


def _run_collapse(args, out):
    res = collapse(backend=args.backend)
    print("Representational collapse, ||o - o'|| / ||v_a - v_b||; n =", _fmt(res["n"], "{:d}"))
    for i, gap in enumerate(res["gaps"]):
        print(f"  softmax gap {gap:g}: {_fmt(res['softmax'][i], '{:.3g}')}")
        print(f"  entmax  gap {gap:g}: {_fmt(res['entmax'][i], '{:.3g}')}")
    return None if args.no_plots else plot_collapse(res, out)


def _run_alibi(args, out):
    res = alibi_window(backend=args.backend)
    print(f"ALiBi window (n = {res['n']}, content scores in [-2, 2]):")
    print("  slope  bound   entmax farthest  entmax mass beyond  softmax mass beyond")
    for i, m in enumerate(res["slopes"]):
        print(f"  {m:<6g} {res['bound'][i]:<7.2f} {res['farthest'][i]:<16d} {res['entmax_beyond'][i]:<19.3g} "
              f"{res['softmax_beyond'][i]:.3g}")
    return None if args.no_plots else plot_alibi(res, out)


DEMOS = {
    "dispersion": _run_dispersion,
    "lemma1": _run_lemma1,
    "lemma2": _run_lemma2,
    "gamma": _run_gamma,
    "collapse": _run_collapse,
    "alibi": _run_alibi,
}


def main(argv: list[str] | None = None) -> int:
    """Run the demos; returns the exit status (0 on success, 1 without matplotlib)."""
    parser = argparse.ArgumentParser(prog="entmax-ref demo", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".", help="folder for the PNG figures (default: the current one)")
    parser.add_argument("--only", nargs="+", choices=sorted(DEMOS), help="run only these demos")
    parser.add_argument("--backend", default="numpy", help="engine to compute with (default: the numpy reference)")
    parser.add_argument("--no-plots", action="store_true", help="print the tables, draw nothing")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"entmax-ref demo: plotting needs matplotlib, which is not installed: {PLOT_HINT} "
                  "(or pass --no-plots for the tables alone)", file=sys.stderr)
            return 1
        os.makedirs(args.out, exist_ok=True)
    for name in args.only or list(DEMOS):
        start = time.perf_counter()
        path = DEMOS[name](args, args.out)
        took = time.perf_counter() - start
        if path:
            print(f"  -> {path} ({took:.1f} s)\n     {CAPTIONS[name]}\n")
        else:
            print(f"  ({took:.1f} s)\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
