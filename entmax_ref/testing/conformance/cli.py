"""``entmax-ref corpus``: write the conformance corpus from the command line."""

from __future__ import annotations

import os
import time

from .operations import OPS
from .sources import SIZES
from .write import generate_corpus


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref corpus --out DIR [--seed N] [--size small|full]``."""
    import sys

    from ...cli import ArgumentParser, output_folder

    ap = ArgumentParser(prog="entmax-ref corpus",
                        description="Write the language-neutral conformance corpus (JSON Lines + manifest).")
    ap.add_argument("--out", required=True, metavar="DIR", type=output_folder,
                    help="directory to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="seed (default 0): the same seed gives identical files")
    ap.add_argument("--size", choices=SIZES, default="small", help="small (default) or full")
    ap.add_argument("--ops", default=None, help=f"comma-separated operations to write (default all: {','.join(OPS)})")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.seed < 0:
        print("entmax-ref corpus: --seed must be >= 0", file=sys.stderr)
        return 2
    ops = None if args.ops is None else [o for o in args.ops.split(",") if o]
    t0 = time.perf_counter()
    try:
        m = generate_corpus(args.out, seed=args.seed, size=args.size, ops=ops,
                            progress=lambda f: print(f"writing {os.path.join(args.out, f)}", file=sys.stderr))
    except (ModuleNotFoundError, ValueError) as exc:
        print(f"entmax-ref corpus: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk, found while writing
        print(f"entmax-ref corpus: cannot write {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for f in m["files"]:
        print(f"{f['file']:<27} {f['cases']:>6} cases  sha256 {f['sha256'][:16]}")
    print(f"{m['row_cases']} row cases, {m['attention_cases']} attention cases, format {m['format_major']}, "
          f"seed {m['seed']}, size {m['size']}: {args.out} ({time.perf_counter() - t0:.1f}s)")
    return 0
