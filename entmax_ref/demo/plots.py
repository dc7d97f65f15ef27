"""The figures of ``entmax-ref demo``: one ``plot_*`` per claim, drawn from the results of
:mod:`.compute` with matplotlib (``pip install 'entmax-ref[plot]'``), imported on first use.
"""

from __future__ import annotations

import os

import numpy as np

from .compute import SEEDS

__all__ = [
    "CAPTIONS", "FIGURES", "PLOT_HINT", "plot_alibi", "plot_collapse", "plot_dispersion", "plot_gamma", "plot_lemma1",
    "plot_lemma2",
]

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
