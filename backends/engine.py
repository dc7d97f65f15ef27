"""Which engine answers ``backend="auto"``: the rule, written once (:func:`auto_engine`).

For CuPy arrays, ``cupy``.  For NumPy arrays:

* inputs whose largest array has at most :data:`AUTO_SMALL` elements run on the ``numpy``
  reference (exact too, microseconds to milliseconds at these sizes, nothing to compile);
* larger inputs run on ``numba`` when the kernels that this call needs are compiled,
  either in the on-disk cache (``entmax-ref compile`` puts them there, and so does any
  ``backend="numba"`` call) or in this process; otherwise on the ``numpy`` reference.

The choice depends only on the call (its operation, shapes, dtype, alpha, method) and on
the state of the cache: never on timing, and a call made with ``"auto"`` never compiles.
No process and no thread is started to fill the cache; ``backend="numba"`` compiles what
it needs in the calling process, as numba does.  The first time in a process that a call
answers on the reference because its kernels are not compiled, the ``entmax_ref`` logger
says so (level INFO), naming ``entmax-ref compile``.

"The kernels this call needs" is counted in *units*: a unit is the set of compiled kernels
behind one solver path (:data:`entmax_ref.backends.numba_precompile.UNITS`, which compiles
each one for each dtype and leaves a marker file ``compiled/<unit>-<dtype>`` in the cache
folder).  One small function per operation family below names the units of a call; a
change in how the numba backend dispatches changes that function only.  A unit is
*compiled* when its marker exists or this process has run it on numba (:func:`note`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ._base import is_cupy

#: ``"auto"`` computes on the NumPy reference when no array argument has more elements than this
AUTO_SMALL = 4096
#: the input dtypes the numba kernels are compiled for
DTYPES = ("float64", "float32")

#: a call's needs: a function that returns the names of the units it runs (evaluated only
#: when the choice depends on it)
Need = Callable[[], Iterable[str]]

_LOG = logging.getLogger("entmax_ref")
_known: set[tuple[str, str]] = set()  # (unit, dtype) compiled in this process or seen marked
_lock = threading.Lock()
_said = [False]


# -- the units of a call, one function per operation family ---------------------------------


def _alphas(alpha: Any) -> np.ndarray:
    return np.asarray(alpha, dtype=np.float64).ravel()


def entmax_forward(alpha: Any, method: str | None = None) -> tuple[str, ...]:
    """The units of an entmax forward with per-row ``alpha`` and ``method`` (the numba row
    drivers' choice, :func:`entmax_ref.backends.numba.rows.entmax_rows`): with
    ``method=None`` the row unit of each solver path its rows take (:func:`row_runs`)."""
    a = _alphas(alpha)
    if a.size == 0:
        return ()
    if method is None:
        return tuple(ROW_UNITS[p] for p in sorted({p for _, _, p in row_runs(a)}))
    return ("entmax_big",) if method != "bisect" and bool((a > 2.0).all()) else ("entmax_any",)


def _by_alpha(alpha: Any, unit: str) -> tuple[str, ...]:
    a = _alphas(alpha)
    if a.size == 0:
        return ()
    big = a > 2.0
    return (f"{unit}_big",) if big.all() else (unit,) if not big.any() else (f"{unit}_any",)


def entmax_vjp(alpha: Any) -> tuple[str, ...]:
    """The unit of an entmax VJP (one kernel for alpha <= 2, one for alpha > 2, one for both)."""
    return _by_alpha(alpha, "entmax_vjp")


def entmax_alpha_vjp(alpha: Any) -> tuple[str, ...]:
    """The unit of an entmax VJP with respect to alpha (as :func:`entmax_vjp`)."""
    return _by_alpha(alpha, "entmax_alpha_vjp")


def family(op: str) -> tuple[str, ...]:
    """The unit of a normmax or budget-sparsemax operation: ``normmax_forward``,
    ``normmax_vjp``, ``budget_forward`` or ``budget_vjp`` (one kernel each)."""
    return ({"normmax_forward": "normmax", "budget_forward": "budget"}.get(op, op),)


#: The solver paths of the numba attention kernels, by index: each path's kernels call one
#: row solver.  A kv-head group whose heads take different solvers runs each run of
#: heads of one path through that path's kernel (:func:`path_runs`).
SOLVER_PATHS = ("softmax", "sparsemax", "entmax15", "entmax", "big")


#: The row unit (:data:`UNITS`) of each solver path: the forward of rows that take it.
ROW_UNITS = ("softmax", "sparsemax", "entmax15", "entmax", "entmax_big")


#: The row solver that ``method=None`` takes for an alpha: the first path whose test holds
#: (the tests take a float or a float64 array), else ``entmax`` (1 < alpha < 2).
_PATH_TESTS = (("big", lambda a: a > 2.0), ("softmax", lambda a: a == 1.0), ("sparsemax", lambda a: a == 2.0),
               ("entmax15", lambda a: a == 1.5))


def _paths(a: np.ndarray) -> np.ndarray:
    """The index in :data:`SOLVER_PATHS` of each float64 alpha (:data:`_PATH_TESTS`)."""
    return np.select([test(a) for _, test in _PATH_TESTS], [SOLVER_PATHS.index(p) for p, _ in _PATH_TESTS],
                     SOLVER_PATHS.index("entmax"))


def solver_path(alpha: float) -> int:
    """The index in :data:`SOLVER_PATHS` of rows with this alpha (:data:`_PATH_TESTS`; in
    Python on the float: the drivers ask it per head and block)."""
    a = float(alpha)
    return SOLVER_PATHS.index(next((p for p, test in _PATH_TESTS if test(a)), "entmax"))


def row_runs(alphas: Any) -> list[tuple[int, int, int]]:
    """Rows with these alphas (one each) as runs ``(lo, hi, path)`` of consecutive rows
    that take one solver path, in row order."""
    a = _alphas(alphas)
    if a.size == 0:
        return []
    if (a == a[0]).all():  # one alpha (the common case): one pass over the alphas
        return [(0, a.size, solver_path(a[0]))]
    paths = _paths(a)
    bounds = [0, *(np.flatnonzero(paths[1:] != paths[:-1]) + 1).tolist(), paths.size]
    return [(lo, hi, int(paths[lo])) for lo, hi in zip(bounds[:-1], bounds[1:])]


def path_runs(alphas: Any, per_head: int, r0: int, r1: int) -> list[tuple[int, int, int]]:
    """The rows ``r0 .. r1 - 1`` of a kv-head group (query head ``h`` holds rows ``h *
    per_head`` to ``(h + 1) * per_head - 1``; ``alphas`` one per head) as runs ``(lo, hi,
    path)`` of consecutive rows whose heads take one solver path, in row order."""
    runs: list[tuple[int, int, int]] = []
    for h, a in enumerate(_alphas(alphas).tolist()):
        lo, hi = max(r0, h * per_head), min(r1, (h + 1) * per_head)
        if lo >= hi:
            continue
        p = solver_path(a)
        if runs and runs[-1][2] == p and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi, p)
        else:
            runs.append((lo, hi, p))
    return runs


def attention(alpha: Any, forward: bool) -> tuple[str, ...]:
    """The units an attention call may run: the fused forward of the solver paths of its
    alphas (:func:`solver_path`; the decoding path runs the same row kernels on scores of
    its own, unit ``decode``, when every alpha > 1), the row solvers of its
    alphas (a key mask with holes runs the NumPy driver on them), and for the backward its
    kernels and the row VJPs (the forward too: it may run first)."""
    paths = sorted({solver_path(a) for a in _alphas(alpha).tolist()})
    names = [SOLVER_PATHS[p] for p in paths]
    decode = () if "softmax" in names else ("decode",)  # a softmax head never takes the decoding path
    units = (*(f"attention_{p}" for p in names), *decode, *entmax_forward(alpha))
    if not forward:
        units += ("attention_vjp", *entmax_vjp(alpha), *entmax_alpha_vjp(alpha))
    return units


#: every unit, by name; :data:`entmax_ref.backends.numba_precompile.UNITS` has the call that
#: compiles each one
UNITS = ("softmax", "sparsemax", "entmax15", "entmax", "entmax_big", "entmax_any",
         "entmax_vjp", "entmax_vjp_big", "entmax_vjp_any",
         "entmax_alpha_vjp", "entmax_alpha_vjp_big", "entmax_alpha_vjp_any",
         "normmax", "normmax_vjp", "budget", "budget_vjp",
         *(f"attention_{p}" for p in SOLVER_PATHS), "decode",
         "attention_vjp")


def all_units() -> tuple[str, ...]:
    """Every unit (what a call whose needs are not named waits for)."""
    return UNITS


# -- compiled or not ------------------------------------------------------------------------


def marker_folder() -> Path:
    """The folder of the unit markers: ``compiled/`` in the current kernel cache folder."""
    from .cache_folder import CACHE_DIR

    return CACHE_DIR / "compiled"


def marker(unit: str, dtype: str) -> Path:
    """The file that marks ``unit`` compiled for ``dtype`` in the current kernel cache."""
    return marker_folder() / f"{unit}-{dtype}"


def compiled(units: Iterable[str], dtype: str) -> bool:
    """Whether every unit of ``units`` is compiled for ``dtype``: marked in the disk cache
    or run in this process."""
    missing = [u for u in units if (u, dtype) not in _known]
    if not missing:
        return True
    from .cache_folder import CACHE

    if not CACHE:
        return False
    found = [u for u in missing if marker(u, dtype).exists()]
    with _lock:
        _known.update((u, dtype) for u in found)
    return len(found) == len(missing)


def note(units: Iterable[str], dtype: Any) -> None:
    """Record that the numba backend ran ``units`` for ``dtype`` in this process (their
    kernels are compiled now; with the disk cache on they were saved too, and a marker says
    so to the next process)."""
    dt = np.dtype(dtype).name
    new = [u for u in units if (u, dt) not in _known]
    if not new:
        return
    with _lock:
        _known.update((u, dt) for u in new)
    from .cache_folder import CACHE

    if CACHE:
        for u in new:
            try:
                m = marker(u, dt)
                m.parent.mkdir(parents=True, exist_ok=True)
                m.touch()
            except OSError:
                pass


def forget() -> None:
    """Forget what this process knows to be compiled (after the cache folder is cleared)."""
    with _lock:
        _known.clear()


def _compute_dtype(arrays: Iterable[Any]) -> str:
    """The dtype the numba kernels run for these (NumPy) arrays: float32 when every float
    array is float32 or narrower, float64 otherwise."""
    kinds = [a.dtype for a in arrays if isinstance(a, np.ndarray)]
    if kinds and all(d.kind == "f" and d.itemsize <= 4 for d in kinds):
        return "float32"
    return "float64"


# -- the rule -------------------------------------------------------------------------------


def auto_engine(arrays: tuple[Any, ...], need: Need | None, cpu: Iterable[str]) -> str:
    """The engine ``backend="auto"`` runs a call on (see the module docstring): the name of
    one of ``cpu`` (the usable CPU engines, best first) or ``"cupy"``.  ``need`` names the
    units of the call; without it, a call waits for every unit to be compiled."""
    if any(is_cupy(a) for a in arrays):
        return "cupy"
    name = next(iter(cpu))
    if name != "numba":
        return name
    if max((int(getattr(a, "size", 0)) for a in arrays if a is not None), default=0) <= AUTO_SMALL:
        return "numpy"
    try:
        units = tuple(need()) if need is not None else all_units()
    except Exception:  # noqa: BLE001 - an argument the call rejects next: wait for every unit
        units = all_units()
    if compiled(units, _compute_dtype(arrays)):
        return "numba"
    with _lock:
        say, _said[0] = not _said[0], True
    if say:
        _LOG.info("entmax-ref: the numba kernels this call needs are not compiled, so backend='auto' "
                  "answered on the NumPy reference (exact, slower on large inputs); run `entmax-ref "
                  "compile` once to put every kernel in the cache (%s)", _where())
    return "numpy"


def _where() -> str:
    from .cache_folder import CACHE, CACHE_DIR

    return f"cache: {CACHE_DIR}" if CACHE else "the kernel cache is off: ENTMAX_REF_NUMBA_CACHE=0 or unwritable"
