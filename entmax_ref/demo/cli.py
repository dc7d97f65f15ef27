"""The ``entmax-ref demo`` command: computes each claim (:mod:`.compute`), prints its
table and draws its figure (:mod:`.plots`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, NamedTuple

from .compute import (
    alibi_window,
    collapse,
    dispersion_gaussian,
    dispersion_two_level,
    gamma_sweep,
    lemma1,
    lemma2_sweep,
    lemma2_table,
)
from .plots import CAPTIONS, PLOT_HINT, plot_alibi, plot_collapse, plot_dispersion, plot_gamma, plot_lemma1, plot_lemma2

_DESCRIPTION = "entmax-ref demo: the long-context claims about sparse attention, computed and plotted."


def _fmt(values, spec="{:.4g}") -> str:
    return " ".join(spec.format(v) for v in values)


class Demo(NamedTuple):
    """One demo: ``compute(backend)`` returns its arrays (:mod:`.compute`), ``report(res)``
    prints its table, ``plot(res, out)`` draws its figure and returns the file's path."""

    compute: Callable
    report: Callable
    plot: Callable


def _report_dispersion(res):
    two, gauss = res
    for title, data, label in (("two-level row (1 token, gap 1)", two, "mass   "),
                               ("IID N(0,1) rows", gauss, "p_max  ")):
        print(f"dispersion, {title}; n =", _fmt(data["n"], "{:d}"))
        for name in data["mass"]:
            print(f"  {name:22s} {label} {_fmt(data['mass'][name])}")
            print(f"  {'':22s} H/log n {_fmt(data['entropy'][name])}")


def _table(title, header, lines):
    print(title)
    print("  " + header)
    for line in lines:
        print("  " + line)


def _report_lemma1(res):
    print("Lemma 1 (100-token row, m appended tokens below tau/(alpha-1)):")
    _table(f"  (before appending: softmax p_max {res['softmax_pmax0']:.4g})",
           "m       entmax max |dp|  entmax appended mass  softmax max |dp|  softmax original mass  softmax p_max",
           (f"{m:<7d} {res['entmax_max_change'][i]:<16.3g} {res['entmax_appended_mass'][i]:<21.3g} "
            f"{res['softmax_max_change'][i]:<17.4g} {res['softmax_original_mass'][i]:<22.4g} {res['softmax_pmax'][i]:.4g}"
            for i, m in enumerate(res["m"])))


def _report_lemma2(res):
    _table("Lemma 2 (support just below / just above the gap k^(1-alpha)/(alpha-1); n = 2^8, 2^12, 2^16):",
           "alpha  k   gap      support below          support above",
           (f"{e['alpha']:<5g}  {e['k']:<3d} {e['gap']:<8.4f} {str(e['below']):<22s} {e['above']}" for e in res[0]))


def _report_sweep(title, key, res, labels):
    """A sweep over ``res[key]``: ``labels`` are (label, result key, format) per line."""
    print(f"{title}; n =", _fmt(res["n"], "{:d}"))
    for i, value in enumerate(res[key]):
        for label, field, spec in labels:
            print(f"  {label.format(value)} {_fmt(res[field][i], spec)}")


def _report_alibi(res):
    _table(f"ALiBi window (n = {res['n']}, content scores in [-2, 2]):",
           "slope  bound   entmax farthest  entmax mass beyond  softmax mass beyond",
           (f"{m:<6g} {res['bound'][i]:<7.2f} {res['farthest'][i]:<16d} {res['entmax_beyond'][i]:<19.3g} "
            f"{res['softmax_beyond'][i]:.3g}" for i, m in enumerate(res["slopes"])))


DEMOS = {
    "dispersion": Demo(lambda b: (dispersion_two_level(backend=b), dispersion_gaussian(backend=b)),
                       _report_dispersion, lambda res, out: plot_dispersion(*res, out)),
    "lemma1": Demo(lambda b: lemma1(backend=b), _report_lemma1, plot_lemma1),
    "lemma2": Demo(lambda b: (lemma2_table(backend=b), lemma2_sweep(backend=b)), _report_lemma2,
                   lambda res, out: plot_lemma2(res[1], out)),
    "gamma": Demo(lambda b: gamma_sweep(backend=b), lambda res: _report_sweep(
        "ASEntmax exponent on IID N(0,1) rows (s = log(n+1)^gamma)", "gamma", res,
        (("gamma {:+.1f}  support", "support", "{:.1f}"), (" " * 11 + " p_max  ", "pmax", "{:.3f}"))), plot_gamma),
    "collapse": Demo(lambda b: collapse(backend=b), lambda res: _report_sweep(
        "Representational collapse, ||o - o'|| / ||v_a - v_b||", "gaps", res,
        (("softmax gap {:g}:", "softmax", "{:.3g}"), ("entmax  gap {:g}:", "entmax", "{:.3g}"))), plot_collapse),
    "alibi": Demo(lambda b: alibi_window(backend=b), _report_alibi, plot_alibi),
}


def main(argv: list[str] | None = None) -> int:
    """Run the demos; returns the exit status (0 on success, 1 without matplotlib)."""
    parser = argparse.ArgumentParser(prog="entmax-ref demo", description=_DESCRIPTION)
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
        demo = DEMOS[name]
        res = demo.compute(args.backend)
        demo.report(res)
        path = None if args.no_plots else demo.plot(res, args.out)
        took = time.perf_counter() - start
        if path:
            print(f"  -> {path} ({took:.1f} s)\n     {CAPTIONS[name]}\n")
        else:
            print(f"  ({took:.1f} s)\n")
    return 0
