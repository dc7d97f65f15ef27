"""The ``entmax-ref`` command (also ``python -m entmax_ref``).

``entmax-ref``            print the transforms of a small example (a smoke test)
``entmax-ref check ...``  cross-validate backends, peers or your implementation
``entmax-ref bench ...``  time the engines against their peers, as ratios
``entmax-ref demo ...``   plot the paper's claims
``entmax-ref corpus ...`` write the language-neutral conformance corpus (JSON Lines)
``entmax-ref compile ...`` compile the numba kernels into the disk cache, in parallel
``entmax-ref cache info|clear`` show or delete the current numba kernel cache folder
``entmax-ref --version``  the installed version (and numba's, and where kernels are cached)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys

import numpy as np

_SUBCOMMANDS = {
    "check": "entmax_ref.testing.command",
    "bench": "entmax_ref.bench",
    "demo": "entmax_ref.demo",
    "corpus": "entmax_ref.testing.conformance",
    "compile": "entmax_ref.backends.numba_precompile",
    "cache": "entmax_ref.backends.numba_cache",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with usage errors in one line, ``PROG: error: MESSAGE (PROG --help)``,
    and exit status 2 (argparse's convention), instead of the whole usage text first."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def alpha_value(text: str) -> float:
    """An ``--alpha`` on the command line: a finite number >= 1."""
    value = _number(text)
    if value < 1.0:
        raise argparse.ArgumentTypeError(f"alpha must be >= 1, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (a budget)."""
    value = _number(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def seed_value(text: str) -> int:
    """A ``--seed``: an integer >= 0 (NumPy's generators take no negative seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed must be >= 0, got {text!r}")
    return value


def _writable_folder(folder: str, what: str) -> None:
    """ArgumentTypeError unless files can be created in ``folder`` or, when it does not
    exist yet, in the nearest folder above it that does (where it would be created)."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise argparse.ArgumentTypeError(f"{what}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{what}: cannot write in {probe} (permission denied)")


def output_file(text: str) -> str:
    """A file the command will write (``--json``): its folder must exist and be writable,
    so that a run does not end by losing its results."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder of {text} does not exist: {folder}")
    _writable_folder(folder, text)
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text} (permission denied)")
    return text


def output_folder(text: str) -> str:
    """A folder the command will create if needed and write into (``corpus --out``)."""
    _writable_folder(text, text)
    return text


def _example() -> int:
    import entmax_ref as er

    x = np.array([-2.0, 0.0, 0.5])
    print(f"x = {x.tolist()}   backends here: {', '.join(er.available_backends())}")
    for name, alpha in (("softmax", 1.0), ("entmax 1.25", 1.25), ("entmax15", 1.5), ("sparsemax", 2.0), ("entmax 3", 3.0)):
        p, info = er.entmax(x, alpha, return_info=True)
        print(f"{name:>12}: p = {np.array2string(p, precision=6, floatmode='fixed')}  "
              f"tau = {float(info.tau): .6f}  support = {int(info.support)}")
    return 0


#: one line per command for ``--help`` (a command missing here shows its module's summary)
_SUMMARIES = {
    "example": "print the transforms of a small example (the default; a smoke test)",
    "check": "cross-validate the backends, the installed peers or your implementation",
    "bench": 'time the engines against their peers, as ratios (pip install "entmax-ref[bench]")',
    "demo": 'plot the paper\'s claims (pip install "entmax-ref[plot]")',
    "compile": "compile the numba kernels into the disk cache ahead of time, in parallel processes",
    "cache": "show (info) or delete (clear) this version's numba kernel cache folder",
}


def _summary(name: str) -> str:
    if name in _SUMMARIES:
        return _SUMMARIES[name]
    spec = importlib.util.find_spec(_SUBCOMMANDS[name])
    doc = ""
    if spec is not None and spec.origin:
        import ast

        with open(spec.origin, encoding="utf-8") as fh:
            doc = ast.get_docstring(ast.parse(fh.read())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ")
    return first.split(":", 1)[-1].replace("``", "").strip() if first else ""


def _help() -> str:
    names = ["example", *_SUBCOMMANDS]
    width = max(len(n) for n in [*names, "-h, --help"]) + 2
    lines = [
        f"usage: entmax-ref [-h] [--version] [{{{','.join(names)}}}] [options]",
        "",
        "Exact, framework-free reference implementations of alpha-entmax, ASEntmax and",
        "entmax attention (NumPy, Numba and CuPy engines).  python -m entmax_ref is the same.",
        "",
        "commands:",
        *(f"  {n:<{width}}{_summary(n)}" for n in names),
        "",
        "options:",
        f"  {'-h, --help':<{width}}show this message and exit",
        f"  {'--version':<{width}}show the version (and numba's, and the kernel cache folder) and exit",
        "",
        "Run entmax-ref COMMAND --help for the options of a command.",
    ]
    return "\n".join(lines)


def _version() -> str:
    import entmax_ref as er

    parts = [f"entmax-ref {er.__version__}"]
    if importlib.util.find_spec("numba") is not None:
        from .backends.cache_folder import CACHE, CACHE_DIR, NUMBA_VERSION

        parts.append(f"numba {NUMBA_VERSION}, kernel cache: {CACHE_DIR if CACHE else 'off'}")
    return " (".join(parts) + (")" if len(parts) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_help())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        print(_version())
        return 0
    if argv and argv[0] != "example" and argv[0] not in _SUBCOMMANDS:
        print(f"entmax-ref: unknown command {argv[0]!r}; choose from: {', '.join(['example', *_SUBCOMMANDS])} "
              "(entmax-ref --help)", file=sys.stderr)
        return 2
    from .backends import env_backend

    try:
        if not {"-h", "--help"} & set(argv[1:]):
            env_backend()  # a misspelt engine is one line, before any work
    except ValueError as exc:
        print(f"entmax-ref: {exc}", file=sys.stderr)
        return 2
    if not argv or argv[0] == "example":
        return _example()
    module = _SUBCOMMANDS[argv[0]]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        print(f"entmax-ref {argv[0]}: unavailable ({exc})", file=sys.stderr)
        return 2
    return int(mod.main(argv[1:]) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
