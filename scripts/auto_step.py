"""The cost of ``backend="auto"`` against ``backend="numba"`` on a warm small training step.

One attention forward and backward (1 x 2 x 48 x 16, alpha per head, float64) with the
kernels compiled: ``auto`` runs them on numba with compiling refused
(``entmax_ref/backends/auto.py``), so the two differ by the rule's own work alone.  The
steps alternate (numba, auto, numba, ...) in one process, so that a noisy machine shows as
spread rather than as a difference.

Usage::

    python scripts/auto_step.py                  # 15 rounds of 200 steps each
    python scripts/auto_step.py --rounds 30 --steps 100

Prints the per-round ratio auto / numba (median and range) and the median step times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import entmax_ref as er


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 48, 16)) for _ in range(3))
    alpha = np.array([1.5, 1.25])
    do = rng.standard_normal(q.shape)

    def step(backend):
        o, info = er.attention(q, k, v, alpha=alpha, backend=backend, return_info=True)
        return er.attention_vjp(do, q, k, v, info=info, alpha=alpha, backend=backend)

    for backend in ("numba", None):  # compile (numba) and load (auto) before timing
        step(backend)
    times: dict[str, list[float]] = {"numba": [], "auto": []}
    for _ in range(args.rounds):
        for name, backend in (("numba", "numba"), ("auto", None)):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(backend)
            times[name].append((time.perf_counter() - t0) / args.steps)
    ratios = np.array(times["auto"]) / np.array(times["numba"])
    print(f"auto / numba: median {np.median(ratios):.3f} (range {ratios.min():.3f}-{ratios.max():.3f}) over "
          f"{args.rounds} rounds of {args.steps} steps; step: numba {1e6 * np.median(times['numba']):.0f} us, "
          f"auto {1e6 * np.median(times['auto']):.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
