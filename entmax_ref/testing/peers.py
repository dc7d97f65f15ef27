"""The installed peers' rows of ``entmax-ref check``: ``torch.softmax`` and the PyTorch
``entmax`` package (forward and autograd gradients), computed in this process or in a
parallel one while the engines are checked; AdaSplash (GPU only) is named, not run.

The entmax package does not accept all -inf rows (IndexError / NaN), so those rows are
left out of its batteries.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable

from .checks import check_entmax, check_entmax_vjp
from .family_checks import BUDGETS, NORMMAX_ALPHAS, check_budget_sparsemax, check_normmax
from .report import CheckReport, CheckRow

__all__ = ["peer_jobs", "peers_in_a_process"]


def _torch_vjp(f):
    import torch

    def vjp(x, g, alpha=None):
        xt = x.detach().clone().requires_grad_(True)
        (f(xt, alpha) * g).sum().backward()
        return xt.grad

    return vjp


def peer_jobs(size: str, seed: int) -> list[tuple[str, Callable[[], CheckReport]]]:
    """The installed peers: torch.softmax and the PyTorch ``entmax`` package (forward and
    autograd gradients), and AdaSplash (GPU only).  The entmax package does not accept
    all -inf rows (IndexError / NaN), so those rows are left out of its batteries."""
    jobs = []
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        return [("torch", lambda: CheckReport.skipped("entmax package", "torch", "torch is not installed",
                                                      peer=True))]
    if importlib.util.find_spec("entmax") is None:
        jobs.append(("entmax", lambda: CheckReport.skipped("entmax package", "entmax (PyTorch)", "not installed",
                                                           peer=True)))
        fns = []
    else:
        def fns_entmax():
            import entmax

            return [
                ("entmax.sparsemax", 2.0, lambda x, alpha=None: entmax.sparsemax(x, dim=-1)),
                ("entmax.entmax15", 1.5, lambda x, alpha=None: entmax.entmax15(x, dim=-1)),
                *[(f"entmax.entmax_bisect", a, lambda x, alpha=None, a=a: entmax.entmax_bisect(x, a, dim=-1))
                  for a in (1.25, 1.5, 2.0, 3.0)],
            ]
        fns = [("entmax", None, fns_entmax)]

    def torch_softmax(x, alpha=None):
        import torch

        return torch.softmax(x, dim=-1)

    peers = [("torch.softmax", 1.0, torch_softmax)]

    def run_peer(label, a, f):
        rep = check_entmax(f, a, name=label, framework="torch", size=size, seed=seed, masked_rows=False, peer=True)
        rep.extend(check_entmax_vjp(_torch_vjp(f), a, name=label, framework="torch", size=size, seed=seed,
                                    masked_rows=False, peer=True))
        return rep

    for label, a, f in peers:
        jobs.append((f"{label} a={a:g}", lambda label=label, a=a, f=f: run_peer(label, a, f)))
    if fns:
        import entmax  # noqa: F401 - found above

        for label, a, f in fns[0][2]():
            jobs.append((f"{label} a={a:g}", lambda label=label, a=a, f=f: run_peer(label, a, f)))
    if fns:
        # normmax_bisect and budget_bisect (default 50 halvings), forward and autograd;
        # budget_bisect's bracket is not finite on rows with -inf, so those are left out
        def torch_vjp(f):
            def vjp(x, g, prm):
                xt = x.detach().clone().requires_grad_(True)
                (f(xt, prm) * g).sum().backward()
                return xt.grad
            return vjp

        def normmax_peer(x, alpha):
            import entmax

            return entmax.normmax_bisect(x, alpha=alpha, dim=-1)

        def budget_peer(x, budget):
            import entmax

            return entmax.budget_bisect(x, budget=budget, dim=-1)

        for a in NORMMAX_ALPHAS:
            jobs.append((f"entmax.normmax_bisect a={a:g}", lambda a=a: check_normmax(
                normmax_peer, a, vjp=torch_vjp(normmax_peer), name="entmax.normmax_bisect", framework="torch",
                size=size, seed=seed, masked_rows=False, peer=True)))
        for B in BUDGETS:
            jobs.append((f"entmax.budget_bisect B={B:g}", lambda B=B: check_budget_sparsemax(
                budget_peer, B, vjp=torch_vjp(budget_peer), name="entmax.budget_bisect", framework="torch",
                size=size, seed=seed, masked_rows=False, masks=False, peer=True)))
    if importlib.util.find_spec("adasplash") is None:
        why = "not installed (GPU only)"
    else:
        why = ("installed; check it with: entmax-ref check --impl adasplash:adasplash --op attention "
               "--framework torch --device cuda")
    jobs.append(("adasplash", lambda: CheckReport.skipped("attention", "adasplash", why, peer=True)))
    return jobs


def peers_in_a_process(seed: int, size: str) -> tuple[str, Callable[[], CheckReport]]:
    """The peer rows computed by ``entmax-ref check --backends ''`` (peers only) in a child
    process started now, and a job that waits for it and returns its rows.  The peers are
    a third of a warm check, most of it importing torch and the entmax package, and need
    nothing of the backends' rows: on a second core they cost no wall time."""
    import json
    import subprocess
    import tempfile

    out = tempfile.NamedTemporaryFile(prefix="entmax-ref-peers-", suffix=".json", delete=False)
    out.close()
    cmd = [sys.executable, "-m", "entmax_ref", "check", "--backends", "", "--no-progress", "--json", out.name,
           "--seed", str(seed)] + ([f"--{size}"] if size != "default" else [])
    # one thread each for torch and BLAS there: their idle OpenMP workers spin, and would
    # take the core this process computes on
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)

    def finish() -> CheckReport:
        try:
            _, err = proc.communicate()
            try:
                with open(out.name) as fh:
                    rows = json.load(fh)["rows"]
            except (OSError, ValueError, KeyError):
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                return CheckReport.failed_run("peers", "-", f"the peers' process ({' '.join(cmd[1:])}) ended with status "
                               f"{proc.returncode} and no report: " + " / ".join(tail), "raised", peer=True)
            return CheckReport([CheckRow(**r) for r in rows])
        finally:
            os.unlink(out.name)

    return "peers (in a parallel process)", finish
