"""The ``entmax-ref demo`` command: computes each claim (:mod:`.compute`), prints its
table and draws its figure (:mod:`.plots`)."""

from __future__ import annotations

import argparse
import os
import sys
import time

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
        path = DEMOS[name](args, args.out)
        took = time.perf_counter() - start
        if path:
            print(f"  -> {path} ({took:.1f} s)\n     {CAPTIONS[name]}\n")
        else:
            print(f"  ({took:.1f} s)\n")
    return 0
