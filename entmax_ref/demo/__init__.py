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

The package: :mod:`.compute` (the claims as functions returning arrays), :mod:`.plots`
(their figures) and :mod:`.cli` (the command, which prints the tables).
"""

from __future__ import annotations

from . import compute, plots
from .cli import DEMOS, main
from .compute import *  # noqa: F403 - the names in compute.__all__
from .plots import *  # noqa: F403 - the names in plots.__all__

__all__ = sorted([*compute.__all__, *plots.__all__, "DEMOS", "main"])
