"""``entmax-ref check``: cross-validate backends, installed peers, or your implementation.

Usage::

    entmax-ref check                       # every available backend + installed peers
    entmax-ref check --quick | --thorough  # corpus size
    entmax-ref check --impl pkg.mod:fn --op entmax --alpha 1.5 [--framework torch]
    entmax-ref check --json report.json --seed 3
    entmax-ref check --corpus DIR [--impl pkg.mod:fn --op entmax]   # replay a conformance corpus

Exit status: 0 when every backend row (and every ``--impl`` row) is within tolerance,
1 otherwise, 2 on bad command-line usage.  Peer rows (the PyTorch ``entmax`` package,
torch.softmax, AdaSplash) are measured and shown with their verdict, but count towards
the exit status only with ``--strict-peers``: a third-party package's accuracy is not a
fault of this installation.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Callable

import numpy as np

from .checks import CheckReport, CheckRow, check_attention, check_entmax, check_entmax_vjp, check_threshold
from .corpus import FEATURES, row_corpus
from .calling import guarded_call
from .family_checks import BUDGETS, NORMMAX_ALPHAS, check_budget_sparsemax, check_normmax
from .peers import peer_jobs, peers_in_a_process
from . import tolerance as T
from ..cli import ArgumentParser, alpha_value, non_negative, output_file, seed_value
from .assertions import compare

ALPHAS = (1.0, 1.25, 1.5, 2.0, 3.0)
OPS = ("entmax", "threshold", "entmax_vjp", "attention", "attention_vjp", "normmax", "budget_sparsemax")
#: operations only a conformance corpus (--corpus) replays
CORPUS_ONLY_OPS = ("entmax_batch", "entmax_alpha_vjp", "entmax_loss", "asentmax_scale", "normmax_threshold",
                   "normmax_vjp", "budget_sparsemax_vjp", "attention_varlen", "attention_varlen_vjp")


# ----------------------------------------------------------------------------- backend jobs


def _guard(op: str, impl: str, probe: Callable[[], object], run: Callable[[], CheckReport]) -> CheckReport:
    """SKIP when the backend does not implement the op (NotImplementedError on a tiny call)."""
    try:
        probe()
    except NotImplementedError as exc:
        return CheckReport.skipped(op, impl, f"not implemented ({str(exc).splitlines()[0][:80]})")
    except Exception:  # noqa: BLE001 - the battery reports it properly
        pass
    return run()


def _timed_cases(rep: CheckReport, op: str, b: str, size: str, seed: int, skip: tuple):
    """For float64 then float32, a timed row ``op`` of backend ``b`` added to ``rep``;
    yields ``(row, case, dtype, x, x64)`` for the row corpus's cases not named in ``skip``
    (``x`` in the dtype, ``x64`` its float64 values)."""
    for dt in (np.dtype(np.float64), np.dtype(np.float32)):
        row = CheckRow(op, b, dt.name)
        rep.rows.append(row)
        t0 = time.perf_counter()
        for case in row_corpus(size, seed):
            if case.name not in skip:
                row.case = case.id
                x = case.x.astype(dt)
                yield row, case, dt, x, x.astype(np.float64)
        row.seconds = time.perf_counter() - t0
        row.finish()


def _check_loss(b: str, alpha: float, size: str, seed: int) -> CheckReport:
    """entmax_loss and its gradient on backend b vs the float64 NumPy reference.

    Budget: :func:`tolerance.loss_tolerance` (formula 6); the gradient p - q takes the probability budgets plus one float64 rounding
    of the subtraction."""
    import entmax_ref as er

    rep = CheckReport()
    rng = np.random.default_rng(seed + 21)
    for row, case, dt, x, x64 in _timed_cases(rep, f"loss a={alpha:g}", b, size, seed, ("all-masked", "long")):
        # class 0 (finite in every corpus row) or the row's argmax, at random
        target = np.where(rng.random(len(x)) < 0.5, 0, np.argmax(x64, axis=1))
        res = guarded_call(row, lambda: (er.entmax_loss(x, target, alpha, backend=b),
                                         er.entmax_loss_grad(x, target, alpha, backend=b)))
        if res is None:
            continue
        got, grad = res
        L = er.entmax_loss(x64, target, alpha, backend="numpy")
        p = er.entmax(x64, alpha, backend="numpy")
        onehot = np.eye(x.shape[1])[target]
        tol = T.loss_tolerance(x64, p, onehot, L, dt)
        cmp = compare(got, L, tol, dt, name="loss")
        row.judge(cmp, "loss", case.id)
        # p's budget plus the rounding of p - q to the gradient's dtype (x's dtype)
        gtol = T.entmax_tolerance(p, alpha, dt) + T.unit_roundoff(np.asarray(grad).dtype) * np.abs(p - onehot)
        cg = compare(grad, p - onehot, gtol, dt, name="grad")
        row.judge(cg, "loss gradient", case.id, budget="entmax_tolerance plus the rounding of p - q")
        if case.name == "random":
            row.prop("loss >= 0", bool(np.all(np.asarray(got) >= 0)))
            zero = er.entmax_loss(x, p.astype(dt).astype(np.float64) / p.astype(dt).astype(np.float64).sum(1, keepdims=True),
                                  alpha, backend=b)
            row.prop("loss(x; entmax(x)) = 0", bool(np.all(np.abs(zero) <= tol)), f"max {np.abs(zero).max():.3g}")
    return rep


def _check_asentmax(b: str, alpha: float, size: str, seed: int) -> CheckReport:
    """asentmax forward and dx on backend b vs the float64 NumPy reference (per-row beta,
    gamma); budgets of the probabilities and of the VJP of the scaled row times |s|."""
    import entmax_ref as er

    rep = CheckReport()
    rng = np.random.default_rng(seed + 31)
    for row, case, dt, x, x64 in _timed_cases(rep, f"asentmax a={alpha:g}", b, size, seed, ("extreme", "long")):
        beta = rng.uniform(0.2, 1.5, len(x))
        gamma = rng.uniform(0.5, 1.5, len(x))
        g = rng.standard_normal(x.shape)
        res = guarded_call(row, lambda: (er.asentmax(x, alpha, beta=beta, gamma=gamma, backend=b),
                                         er.asentmax_vjp(g.astype(dt), x, alpha, beta=beta, gamma=gamma, backend=b).dx))
        if res is None:
            continue
        p, dx = res
        pr, info = er.asentmax(x64, alpha, beta=beta, gamma=gamma, backend="numpy", return_info=True)
        cmp = compare(p, pr, T.entmax_tolerance(pr, alpha, dt, masked=np.isneginf(x64)), dt)
        row.judge(cmp, "p", case.id)
        s = np.where(np.isfinite(info.s), info.s, 1.0)
        dz = er.entmax_vjp(pr, g, alpha, backend="numpy")
        dxr = er.asentmax_vjp(g, x64, alpha, beta=beta, gamma=gamma, backend="numpy").dx
        tol = np.abs(s)[:, None] * T.vjp_tolerance(pr, g, dz, alpha, dt)
        c2 = compare(dx, dxr, tol, dt, name="dx")
        row.judge(c2, "dx", case.id, budget="vjp_tolerance times |s|, formula 4")
        if case.name == "masks":
            row.prop("masked entries are exactly 0", bool(np.all(np.asarray(p)[np.isneginf(x64)] == 0)))
    return rep


def backend_jobs(b: str, size: str, seed: int) -> list[tuple[str, Callable[[], CheckReport]]]:
    """(label, thunk) for every operation on backend ``b``."""
    import entmax_ref as er

    x0 = np.array([[0.0, 1.0, -1.0]])
    q0 = np.zeros((1, 1, 2, 2))
    jobs = []
    for a in ALPHAS:
        jobs.append((f"entmax a={a:g} [{b}]", lambda a=a: _guard(
            f"entmax a={a:g}", b, lambda: er.entmax(x0, a, backend=b),
            lambda: check_entmax(lambda x, alpha: er.entmax(x, alpha, backend=b), a, name=b, size=size, seed=seed))))
        jobs.append((f"threshold a={a:g} [{b}]", lambda a=a: _guard(
            f"threshold a={a:g}", b, lambda: er.entmax_threshold(x0, a, backend=b),
            lambda: check_threshold(lambda x, alpha: er.entmax_threshold(x, alpha, backend=b), a, name=b,
                                    size=size, seed=seed))))
        jobs.append((f"vjp a={a:g} [{b}]", lambda a=a: _guard(
            f"vjp a={a:g}", b, lambda: er.entmax_vjp(x0 ** 2 / 2, x0, a, backend=b),
            lambda: check_entmax_vjp(lambda p, g, alpha: er.entmax_vjp(p, g, alpha, backend=b), a, inputs="p",
                                     name=b, size=size, seed=seed))))
    for a in (1.0, 1.5, 2.0):
        jobs.append((f"loss a={a:g} [{b}]", lambda a=a: _check_loss(b, a, size, seed)))
    jobs.append((f"asentmax a=1.5 [{b}]", lambda: _check_asentmax(b, 1.5, size, seed)))
    for a in NORMMAX_ALPHAS:
        jobs.append((f"normmax a={a:g} [{b}]", lambda a=a: _guard(
            f"normmax a={a:g}", b, lambda: er.normmax(x0, a, backend=b),
            lambda: check_normmax(lambda x, alpha: er.normmax(x, alpha, backend=b), a,
                                  vjp=lambda x, g, alpha: er.normmax_vjp(er.normmax(x, alpha, backend=b), g, alpha,
                                                                         backend=b),
                                  name=b, size=size, seed=seed))))
    for B in BUDGETS:
        jobs.append((f"budget B={B:g} [{b}]", lambda B=B: _guard(
            f"budget B={B:g}", b, lambda: er.budget_sparsemax(x0, 1.0, backend=b),
            lambda: check_budget_sparsemax(
                lambda x, budget: er.budget_sparsemax(x, budget, backend=b), B,
                vjp=lambda x, g, budget: er.budget_sparsemax_vjp(er.budget_sparsemax(x, budget, backend=b), g, budget,
                                                                 backend=b),
                name=b, size=size, seed=seed))))
    for a in ALPHAS:
        jobs.append((f"attention a={a:g} [{b}]", lambda a=a: _guard(
            f"attention a={a:g}", b, lambda: er.attention(q0, q0, q0, alpha=a, backend=b),
            lambda: check_attention(
                lambda q, k, v, **kw: er.attention(q, k, v, backend=b, **kw), a,
                vjp=lambda do, q, k, v, **kw: er.attention_vjp(do, q, k, v, backend=b, **kw)[:3],
                name=b, features=FEATURES, size=size, seed=seed))))
    return jobs


# ----------------------------------------------------------------------------- --impl


def resolve_impl(path: str) -> Callable:
    """``package.module:function`` (``function`` may be dotted) to the callable; raises
    ValueError with a one-line message when it does not resolve."""
    if ":" not in path:
        raise ValueError(f"--impl {path!r} must look like package.module:function")
    mod_name, attr = path.split(":", 1)
    # like ``python -m``, find modules in the current directory (the console script's
    # sys.path starts with its own bin folder instead)
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        obj = importlib.import_module(mod_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is a usage problem
        raise ValueError(f"cannot import module {mod_name!r} for --impl {path!r}: {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(cwd)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {mod_name!r} has no attribute {attr!r} (--impl {path!r})") from None
    return obj


def impl_report(path: str, op: str, alphas, args) -> CheckReport:
    label = path
    try:
        fn = resolve_impl(path)
    except ValueError as exc:
        return CheckReport.failed_run(op, label, str(exc), "import")
    common = dict(name=label, framework=args.framework, device=args.device, size=args.size, seed=args.seed,
                  dtypes=args.dtype, alpha_arg=args.alpha_arg)
    family = {key: val for key, val in common.items() if key != "alpha_arg"}
    rep = CheckReport()
    for a in alphas:
        if op == "entmax":
            rep.extend(check_entmax(fn, a, masked_rows=not args.no_masked_rows, **common))
        elif op == "threshold":
            rep.extend(check_threshold(fn, a, masked_rows=not args.no_masked_rows, **common))
        elif op == "entmax_vjp":
            rep.extend(check_entmax_vjp(fn, a, inputs=args.vjp_inputs, masked_rows=not args.no_masked_rows, **common))
        elif op == "attention":
            rep.extend(check_attention(fn, a, features=args.features, **common))
        elif op == "attention_vjp":
            rep.extend(check_attention(None, a, vjp=fn, features=args.features, **common))
        elif op == "normmax":  # the family batteries pass alpha / budget positionally: fn(x, alpha)
            rep.extend(check_normmax(fn, a, masked_rows=not args.no_masked_rows, **family))
    if op == "budget_sparsemax":
        for B in args.budget or [2.0]:
            rep.extend(check_budget_sparsemax(fn, B, masked_rows=not args.no_masked_rows, **family))
    return rep


# ----------------------------------------------------------------------------- --corpus


def _corpus_jobs(args):
    """Jobs replaying ``--corpus DIR``: against ``--impl`` for ``--op``, or against every
    selected backend for every operation; None (after a message) when it cannot be read."""
    from .conformance import CorpusError, load_corpus, replay_backend, replay_corpus

    try:
        corpus = load_corpus(args.corpus)
    except CorpusError as exc:
        print(f"entmax-ref check: {exc}", file=sys.stderr)
        return None
    dtypes = tuple(args.dtype) if args.dtype_given else None
    from .conformance import OPS as CORPUS_OPS

    if args.impl and args.op not in CORPUS_OPS:
        print(f"entmax-ref check: the corpus has no {args.op} cases; --op is one of {', '.join(CORPUS_OPS)} "
              "with --corpus", file=sys.stderr)
        return None
    alphas = tuple(args.alpha) if args.alpha else None
    if alphas is not None:
        from .conformance.operations import operation
        from .conformance.replay import selected

        files = [operation(args.op).file] if args.impl else list(corpus.cases)
        cases = [c for f in files for c in corpus.cases.get(f, [])]
        print(f"corpus {args.corpus}: {len(selected(cases, alphas=alphas))} of {len(cases)} cases selected (--alpha "
              f"{', '.join(f'{a:g}' for a in alphas)}; cases without alpha are all replayed)")
    if args.impl:
        def run_impl():
            try:
                fn = resolve_impl(args.impl)
            except ValueError as exc:
                return CheckReport.failed_run(f"corpus {args.op}", args.impl, str(exc), "import")
            return replay_corpus(corpus, fn, args.op, name=args.impl, vjp_inputs=args.vjp_inputs,
                                 framework=args.framework, device=args.device, dtypes=dtypes, alphas=alphas)

        return [(f"corpus {args.op} [{args.impl}]", run_impl)]
    import entmax_ref as er

    names = er.available_backends() if args.backends is None else args.backends
    return [(f"corpus [{b}]", lambda b=b: replay_backend(corpus, b, alphas=alphas, dtypes=dtypes)) for b in names]


# ----------------------------------------------------------------------------- main


def _alpha_arg(text: str) -> str | int | None:
    """--alpha-arg: 'none', a position (digits) or a keyword name."""
    if text.lower() == "none":
        return None
    return int(text) if text.isdigit() else text


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="entmax-ref check", description=__doc__.split("\n\n")[0].replace("``", ""),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="size", action="store_const", const="quick", help="small corpus")
    size.add_argument("--thorough", dest="size", action="store_const", const="thorough", help="large corpus")
    ap.set_defaults(size="default")
    ap.add_argument("--seed", type=seed_value, default=0, help="corpus seed (default 0)")
    ap.add_argument("--json", metavar="PATH", type=output_file,
                    help="write the full report as JSON, with one record per case")
    ap.add_argument("--impl", metavar="PKG.MOD:FN", help="check your function instead of the backends")
    ap.add_argument("--op", choices=OPS + CORPUS_ONLY_OPS, default="entmax",
                    help=f"what --impl computes (default entmax; {', '.join(CORPUS_ONLY_OPS)} only with --corpus)")
    ap.add_argument("--corpus", metavar="DIR",
                    help="replay a conformance corpus (written by entmax-ref corpus) instead of the built-in cases")
    ap.add_argument("--alpha", type=alpha_value, action="append",
                    help="alpha >= 1 (repeatable; default 1.5 for --impl)")
    ap.add_argument("--alpha-arg", type=_alpha_arg, default="alpha", metavar="NAME|POSITION|none",
                    help="how --impl takes alpha: by keyword NAME (default 'alpha', passed only if the function "
                         "has it), as positional argument POSITION (1 for fn(x, a)), or 'none'")
    ap.add_argument("--budget", type=non_negative, action="append",
                    help="budget for --op budget_sparsemax (repeatable; default 2)")
    ap.add_argument("--framework", choices=("numpy", "torch", "jax", "cupy"), default="numpy",
                    help="array type --impl takes (default numpy)")
    ap.add_argument("--device", default=None, help="device for torch/cupy inputs (e.g. cuda)")
    ap.add_argument("--dtype", action="append", choices=("float64", "float32", "float16"),
                    help="dtypes to test (repeatable; default float64 and float32)")
    ap.add_argument("--vjp-inputs", choices=("x", "p"), default="x",
                    help="--op entmax_vjp: fn(x, grad, alpha) (default) or fn(p, grad, alpha)")
    ap.add_argument("--features", default="causal,gqa,cross",
                    help=f"attention features your function supports, from {','.join(FEATURES)}")
    ap.add_argument("--no-masked-rows", action="store_true", help="leave all -inf rows out of the corpus")
    ap.add_argument("--backends", default=None, help="comma-separated backends (default: every available one)")
    ap.add_argument("--no-peers", action="store_true", help="do not run the installed peers")
    ap.add_argument("--strict-peers", action="store_true", help="peer failures count in the exit status")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (a bar on a terminal, else one line per job)")
    ap.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="processes that compile the numba kernels first, in parallel (default: one per CPU; "
                         "0: compile each kernel on first use instead)")
    return ap


#: the operations the numba rows of the check run (with ``method=None``): their declared
#: kernels are compiled first (:func:`_start_compile`)
CHECK_OPS = ("entmax_forward", "entmax_vjp", "budget_forward", "budget_vjp", "attention_forward", "attention_backward")


def _start_compile(args, bar) -> Callable[[], None]:
    """Start compiling the declared kernels of :data:`CHECK_OPS` into the disk cache, in
    ``args.jobs`` worker processes fed by a thread (nothing to do when they are cached
    already or the cache is off), counting them on ``bar``; returns the function that waits
    for it.  The rows that need no kernel (the reference's, the peers') run meanwhile: a
    cold check's compile then hides the CPU time they take."""
    import threading

    from ..backends.numba_precompile import compile_kernels

    rep: dict = {}

    def run() -> None:
        try:
            rep.update(compile_kernels(CHECK_OPS, jobs=args.jobs, methods=(None,), progress=bar))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread by wait()
            rep["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if "raised" in rep:
            raise rep["raised"]
        if not args.no_progress and rep.get("compiled"):
            bar.close()
            print(f"compiled {len(rep['compiled'])} numba kernel signatures in {rep['seconds']:.1f}s "
                  f"({rep['jobs']} processes; once per kernel version, as entmax-ref compile does)",
                  file=sys.stderr, flush=True)

    return wait


def _usage(ap: argparse.ArgumentParser, args) -> None:
    """The option values argparse cannot check alone: a bad one is a one-line usage error
    (exit status 2) before any work."""
    args.dtype_given = bool(args.dtype)
    args.dtype = tuple(args.dtype or ("float64", "float32"))
    args.features = tuple(f for f in args.features.split(",") if f)
    bad = set(args.features) - set(FEATURES)
    if bad:
        ap.error(f"unknown --features {', '.join(sorted(bad))}; choose from {', '.join(FEATURES)}")
    if args.op in CORPUS_ONLY_OPS and not args.corpus:
        ap.error(f"--op {args.op} needs --corpus DIR")
    if args.op == "normmax" and any(a <= 1.0 for a in args.alpha or ()):
        ap.error("normmax needs --alpha > 1")
    if args.jobs is not None and args.jobs < 0:
        ap.error(f"--jobs must be >= 0, got {args.jobs}")
    from ..backends import unavailable_reason

    args.backends = None if args.backends is None else [s for s in args.backends.split(",") if s]
    for name in args.backends or ():
        try:
            unavailable_reason(name)
        except ValueError as exc:
            ap.error(f"--backends: {exc}")


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    try:
        args = ap.parse_args(argv)
        _usage(ap, args)
    except SystemExit as exc:
        return int(exc.code or 0)
    import entmax_ref as er

    from ..backends.numba_precompile import Progress

    t0 = time.perf_counter()
    kernels = False  # whether the numba rows' kernels are to be compiled first
    first_kernel_job: int | None = None  # the jobs from this one on may run numba kernels
    if args.corpus:
        jobs = _corpus_jobs(args)
        if jobs is None:
            return 2
    elif args.impl:
        jobs = [(f"{args.op} [{args.impl}]", lambda: impl_report(args.impl, args.op, args.alpha or [1.5], args))]
    else:
        names = er.available_backends() if args.backends is None else args.backends
        kernels = "numba" in names and args.jobs != 0 and er.backends.unavailable_reason("numba") is None
        jobs = []
        for b in names:
            if b != "numpy" and first_kernel_job is None:
                first_kernel_job = len(jobs)
            reason = er.backends.unavailable_reason(b)
            if reason:
                jobs.append((b, lambda b=b, reason=reason: CheckReport.skipped("all", b, reason)))
            else:
                jobs.extend(backend_jobs(b, args.size, args.seed))
        if not args.no_peers:
            from ..backends.numba_precompile import default_jobs

            if names and default_jobs() > 1:  # the peers (torch's import included) on the other core
                jobs.append(peers_in_a_process(args.seed, args.size))
            else:
                jobs.extend(peer_jobs(args.size, args.seed))
    bar = Progress(len(jobs), not args.no_progress)
    compiled = _start_compile(args, bar) if kernels else None  # waits for the kernels' compile
    report = CheckReport()
    for i, (label, job) in enumerate(jobs):
        if compiled is not None and i == first_kernel_job:
            compiled()
            compiled = None
        try:
            report.extend(job())
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - one broken job must not stop the others
            report.extend(CheckReport.failed_run(label, "-", f"raised {type(exc).__name__}: {exc}",
                                  "exit" if isinstance(exc, SystemExit) else "raised"))
        bar.step(label)
    bar.close()
    wall = time.perf_counter() - t0
    print(report.table())
    counted = [r for r in report.rows if r.failed and (args.strict_peers or not r.peer)]
    peer_fail = [r for r in report.rows if r.failed and r.peer and not args.strict_peers]
    summary = (f"\n{len(report.rows)} rows, {sum(r.failed for r in report.rows)} failed"
               + (f" ({len(peer_fail)} peer rows, not counted; --strict-peers counts them)" if peer_fail else "")
               + f", wall time {wall:.1f}s")
    print(summary)
    if args.json:
        d = report.to_dict()
        d.update(wall_seconds=wall, seed=args.seed, size=args.size, exit_status=int(bool(counted)))
        import json

        try:
            with open(args.json, "w") as fh:
                json.dump(d, fh, indent=2, default=float)
        except OSError as exc:
            print(f"entmax-ref check: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 1 if counted else 0
