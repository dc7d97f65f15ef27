"""The ``entmax-ref`` command.

``entmax-ref``            print the transforms of a small example (a smoke test)
``entmax-ref check ...``  cross-validate backends, peers or your implementation
``entmax-ref bench ...``  time the engines against their peers, as ratios
``entmax-ref demo ...``   plot the paper's claims
``entmax-ref corpus ...`` write the language-neutral conformance corpus (JSON Lines)
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

_SUBCOMMANDS = {
    "check": "entmax_ref.testing.command",
    "bench": "entmax_ref.bench",
    "demo": "entmax_ref.demo",
    "corpus": "entmax_ref.testing.conformance",
}


def _example() -> int:
    import entmax_ref as er

    x = np.array([-2.0, 0.0, 0.5])
    print(f"x = {x.tolist()}   backends here: {', '.join(er.available_backends())}")
    for name, alpha in (("softmax", 1.0), ("entmax 1.25", 1.25), ("entmax15", 1.5), ("sparsemax", 2.0), ("entmax 3", 3.0)):
        p, info = er.entmax(x, alpha, return_info=True)
        print(f"{name:>12}: p = {np.array2string(p, precision=6, floatmode='fixed')}  "
              f"tau = {float(info.tau): .6f}  support = {int(info.support)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("example",):
        return _example()
    if argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    module = _SUBCOMMANDS.get(argv[0])
    if module is None:
        print(f"entmax-ref: unknown command {argv[0]!r}; choose from: {', '.join(_SUBCOMMANDS)}", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        print(f"entmax-ref {argv[0]}: unavailable ({exc})", file=sys.stderr)
        return 2
    return int(mod.main(argv[1:]) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
