"""``entmax-ref corpus``: write the conformance corpus, or check that a pinned one is what the
generator writes."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .operations import OPS
from .sources import SIZES
from .write import compare_corpora, generate_corpus


def git_source(folder: Path) -> dict:
    """Where the generator's code comes from, in the git checkout of ``folder``: the last
    commit that changed a file outside ``corpus/`` (a corpus committed on top of it names it
    too), and whether those files differ from it now; {} outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(folder), *args, "--", ":/", ":(top,exclude)corpus"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    try:
        commit = git("log", "-1", "--format=%H")
        if commit.returncode != 0 or not commit.stdout.strip():
            return {}
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit.stdout.strip(), "source": "modified" if changed.stdout.strip() else "committed"}


def main(argv: list[str] | None = None) -> int:
    """``entmax-ref corpus --out DIR [--seed N] [--size small|full] [--ops ...]`` or
    ``entmax-ref corpus --check DIR``."""
    from ...cli import ArgumentParser, output_folder

    ap = ArgumentParser(prog="entmax-ref corpus",
                        description="Write the language-neutral conformance corpus (JSON Lines + manifest), "
                                    "or check a pinned one.")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", metavar="DIR", type=output_folder, help="directory to write (created if missing)")
    what.add_argument("--check", metavar="DIR", help="write the corpus DIR's manifest describes (seed, size, files) "
                      "into a temporary folder and compare every byte but the manifest's provenance; exit 1 if one "
                      "differs")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random kinds (default 0)")
    ap.add_argument("--size", choices=SIZES, default="small", help="small (default: the pinned corpus) or full")
    ap.add_argument("--ops", default=None, help=f"comma-separated operations to write (default all: {','.join(OPS)})")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.seed < 0:
        print("entmax-ref corpus: --seed must be >= 0", file=sys.stderr)
        return 2
    ops = None if args.ops is None else [o for o in args.ops.split(",") if o]
    if args.check:
        return _check(Path(args.check))
    out = Path(args.out)
    t0 = time.perf_counter()
    try:
        m = generate_corpus(out, seed=args.seed, size=args.size, ops=ops, source=git_source(Path(__file__).parent),
                            progress=lambda f: print(f"writing {out / f}", file=sys.stderr))
    except (ModuleNotFoundError, ValueError) as exc:
        print(f"entmax-ref corpus: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk, found while writing
        print(f"entmax-ref corpus: cannot write {exc.filename or out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for f in m["files"]:
        print(f"{f['file']:<27} {f['cases']:>6} cases  sha256 {f['sha256'][:16]}")
    print(f"{m['row_cases']} row cases, {m['attention_cases']} attention cases, format {m['format_major']}."
          f"{m['format_minor']}, seed {m['seed']}, size {m['size']}: {out} ({time.perf_counter() - t0:.1f}s)")
    return 0


def _check(pinned: Path) -> int:
    """Regenerate the corpus ``pinned`` describes and compare it with ``pinned``."""
    try:
        m = json.loads((pinned / "manifest.json").read_text())
        seed, size, ops = m["seed"], m["size"], [f["op"] for f in m["files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"entmax-ref corpus: {pinned} has no readable manifest.json ({exc})", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="entmax-ref-corpus-") as tmp:
        generate_corpus(tmp, seed=seed, size=size, ops=ops)
        diff = compare_corpora(pinned, tmp)
    if diff:
        print(f"{pinned} is not what this generator writes (seed {seed}, size {size}):", file=sys.stderr)
        for line in diff:
            print(f"  {line}", file=sys.stderr)
        print(f"regenerate it with: entmax-ref corpus --out {pinned} --seed {seed} --size {size}", file=sys.stderr)
        return 1
    count = sum(1 for _ in pinned.rglob("*") if _.is_file())
    print(f"{pinned}: every byte of its {count} files but the manifest's provenance is what the generator writes "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
