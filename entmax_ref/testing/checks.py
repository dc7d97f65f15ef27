"""Batteries that run a user's callable on the built-in corpus and return a report.

Each ``check_*`` calls the function on every corpus case in every requested dtype,
compares with the float64 reference under the budgets of
:mod:`entmax_ref.testing.tolerance`, checks properties, and returns a :class:`CheckReport`
with one :class:`CheckRow` per dtype.  Nothing raises: an import error, a wrong
signature, an exception inside the function or a result of the wrong shape becomes a
failing row with a one-line message, and the other cases still run.

>>> import entmax_ref as er
>>> from entmax_ref.testing import check_entmax
>>> report = check_entmax(lambda x: er.sparsemax(x, backend="numpy"), alpha=2.0, size="quick")
>>> report.ok
True
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from . import tolerance as T
from ._adapters import from_numpy, to_numpy
from ._memo import memo
from .assertions import (
    attention_grad_tolerances,
    attention_out_tolerance,
    attention_reference,
    compare,
    reference_attention_grads,
)
from .corpus import attention_corpus, golden_cases, row_corpus

__all__ = ["CheckReport", "CheckRow", "check_attention", "check_entmax", "check_entmax_vjp", "check_threshold"]


#: what the columns of :meth:`CheckReport.table` mean
LEGEND = """\
ulps: |error| / (eps * max(1, |expected|)), eps of the row's dtype (2.2e-16 float64, 1.2e-7
      float32), the error measured against the float64 NumPy reference of the same input
      (closed-form values for the golden cases); the largest over the corpus.
err/tol: each entry's |error| as a fraction of its own tolerance, the largest over the corpus:
      1.0 is at the limit, above 1 fails; tolerances come from the dtype, the row length and
      alpha (docs/validate.md).
NaN, inf: the implementation returned NaN (or an infinite error) somewhere: a failure.
-: nothing measured (skipped, or the implementation could not be imported or called: see
      the failures below the table).
props: property checks passed / run: on the simplex, masked entries exactly 0, all-masked
      rows, shift invariance, permutation equivariance, golden values, dtype kept, support /
      threshold consistency, J 1 = 0, symmetric Jacobian, finite differences, loss >= 0,
      grouped heads = repeated k, v, no keys -> zeros.
numpy rows: the reference itself; outside attention (whose reference is the dense p @ v)
      their errors are 0 in float64 and one rounding in float32 by construction; the
      project's test suite holds the reference to a 50-digit oracle; their properties run."""


@dataclass
class CheckRow:
    """One line of the report: an operation, an implementation, a dtype."""

    op: str
    impl: str
    dtype: str
    max_abs: float = 0.0
    max_ulps: float = 0.0
    #: the tolerance (ulps) at the entry that used the largest fraction of its tolerance
    tol_ulps: float = 0.0
    #: that fraction, ``|error| / tolerance`` (<= 1 passes)
    used: float = 0.0
    props_passed: int = 0
    props_total: int = 0
    verdict: str = "PASS"  #: PASS, FAIL, or SKIP (not run: not installed, not implemented)
    notes: list = field(default_factory=list)
    peer: bool = False  #: a third-party implementation (informational in the command's exit status)
    seconds: float = 0.0
    measured: bool = False  #: some output was compared (False: nothing ran, or nothing could be read)
    #: "NaN" when the implementation returned NaN where a number was expected, "inf" for
    #: another non-finite error; "" when every compared entry was finite
    nonfinite: str = ""
    #: the corpus case being run (not a field: named in the note of a call that raises)
    case = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "FAIL"

    def fail(self, msg: str) -> None:
        self.verdict = "FAIL"
        if msg not in self.notes and len(self.notes) < 8:
            self.notes.append(msg)

    def note(self, msg: str) -> None:
        if msg not in self.notes and len(self.notes) < 8:
            self.notes.append(msg)

    def measure(self, cmp) -> None:
        if cmp.problem:  # a shape or dtype that cannot be compared: nothing measured (the note says why)
            return
        self.measured = True
        if np.isfinite(cmp.max_abs):
            self.max_abs = max(self.max_abs, cmp.max_abs)
            self.max_ulps = max(self.max_ulps, cmp.max_ulps)
        elif self.nonfinite != "NaN":
            self.nonfinite = "NaN" if cmp.actual is not None and np.isnan(cmp.actual) else "inf"
        if np.isfinite(cmp.used) and (cmp.used > self.used or not self.tol_ulps):
            self.used, self.tol_ulps = max(cmp.used, self.used), cmp.tol_ulps

    def judge(self, cmp, what: str, where: str, why: str = "") -> bool:
        """Record a comparison: its figures, and ``[where] <what's worst entry> (why)`` as a
        failing note when it is out of tolerance.  Returns whether it is within."""
        self.measure(cmp)
        if not cmp.ok:
            self.fail(f"[{where}] {cmp.describe(what)}" + (f" ({why})" if why else ""))
        return cmp.ok

    def prop(self, name: str, ok: bool, why: str = "") -> None:
        self.props_total += 1
        if ok:
            self.props_passed += 1
        else:
            self.fail(f"property {name!r} fails" + (f": {why}" if why else ""))


@dataclass
class CheckReport:
    """Rows of a battery (or of the whole ``entmax-ref check`` run)."""

    rows: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No row failed (peers included)."""
        return not any(r.failed for r in self.rows)

    def extend(self, other: "CheckReport") -> "CheckReport":
        self.rows.extend(other.rows)
        return self

    def to_dict(self) -> dict:
        return {"ok": self.ok, "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2, default=float)

    def table(self) -> str:
        """The report as a plain-text table (with the notes of failing rows below it)."""
        head = ("operation", "implementation", "dtype", "max abs err", "ulps", "err/tol", "props", "verdict")
        lines = []
        for r in self.rows:
            skip = r.verdict == "SKIP"
            # "-": nothing measured; NaN / inf: what the implementation returned, not a number
            figures = (("-",) * 3 if skip or not r.measured else (r.nonfinite,) * 3 if r.nonfinite
                       else (f"{r.max_abs:.2e}", f"{r.max_ulps:.3g}", f"{r.used:.3g}"))
            lines.append((r.op, r.impl, r.dtype, *figures,
                          "-" if skip or not (r.measured or r.props_total) else f"{r.props_passed}/{r.props_total}",
                          r.verdict + (" (peer)" if r.peer and r.failed else "")
                          + (f": {r.notes[0]}" if skip and r.notes else "")))
        widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
        widths[-1] = len(head[-1])
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*ln) for ln in lines]
        out += ["", LEGEND]
        notes = [f"  {r.op} / {r.impl} / {r.dtype}: {n}" for r in self.rows if r.failed for n in r.notes]
        if notes:
            out += ["", "failures:"] + notes
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


# ----------------------------------------------------------------------------- calling


class _CallError(Exception):
    pass


def _positional_capacity(fn) -> tuple[int, int, bool, set]:
    """(required positional, max positional (inf with *args), has **kwargs, names)."""
    sig = inspect.signature(fn)
    req = mx = 0
    var_kw = False
    names = set()
    for p in sig.parameters.values():
        names.add(p.name)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            mx += 1
            req += p.default is p.empty
        elif p.kind == p.VAR_POSITIONAL:
            mx = 10**6
        elif p.kind == p.VAR_KEYWORD:
            var_kw = True
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            req += 10**6  # a required keyword we do not know
    return req, mx, var_kw, names


#: how the batteries pass alpha unless told otherwise: by keyword ``alpha``, if fn has it
ALPHA_KEYWORD = "alpha"


def _caller(fn: Callable, data_args: int, op: str, form: str, alpha_arg: str | int | None = ALPHA_KEYWORD) -> Callable:
    """``call(*data, alpha=a)`` that calls ``fn`` with alpha placed as ``alpha_arg`` says.

    ``alpha_arg`` is explicit, never guessed from the signature's positions:

    * a string: the keyword alpha is passed by.  The default, ``"alpha"``, passes it only
      when ``fn`` has a parameter called ``alpha`` (or ``**kwargs``), so that ``fn(x)``
      computing a fixed alpha (``sparsemax``) needs nothing; any other name must be a
      parameter of ``fn``;
    * an int: alpha is the positional argument right after the data, whose 0-based
      number this is (1 for ``fn(x, alpha)``, 2 for ``fn(p, grad, alpha)``);
    * None: alpha is never passed.

    Raises _CallError with a clear message when ``fn`` cannot be called that way."""
    if not callable(fn):
        raise _CallError(f"{fn!r} is not callable")
    if not (alpha_arg is None or isinstance(alpha_arg, (str, int)) and not isinstance(alpha_arg, bool)):
        raise _CallError(f"alpha_arg must be a keyword name, a position or None, got {alpha_arg!r}")
    try:
        req, mx, var_kw, names = _positional_capacity(fn)
    except (TypeError, ValueError):  # builtins without a signature: fn(*data), or as alpha_arg says
        explicit = alpha_arg is not None and alpha_arg != ALPHA_KEYWORD
        req, mx, var_kw, names = data_args, 10**6, explicit, {alpha_arg} if explicit else set()
    label = f"{getattr(fn, '__name__', 'fn')}{_signature(fn)}"
    if isinstance(alpha_arg, int):
        if alpha_arg != data_args:
            raise _CallError(f"alpha_arg={alpha_arg} must be {data_args}: {op} passes alpha positionally only "
                             f"right after the {data_args} data argument(s)")
        if mx <= data_args or req > data_args + 1:
            raise _CallError(f"wrong signature: {op} calls {form} with alpha as positional argument "
                             f"{alpha_arg} (alpha_arg), which {label} cannot take")
        return lambda *a, alpha=None, **kw: fn(*a, alpha, **kw)
    if alpha_arg not in (None, ALPHA_KEYWORD) and alpha_arg not in names and not var_kw:
        raise _CallError(f"alpha_arg={alpha_arg!r} is not a parameter of {label}")
    by_name = alpha_arg is not None and alpha_arg in names  # fills one of fn's parameters
    if mx < data_args or req > data_args + by_name:
        hint = (f"; alpha is passed by keyword {alpha_arg!r} (alpha_arg): pass alpha_arg={data_args} to give it as "
                "the next positional argument" if req == data_args + 1 else "")
        raise _CallError(f"wrong signature: {op} calls {form}, but the function's signature is {label}{hint}")
    if alpha_arg is None or (alpha_arg == ALPHA_KEYWORD and alpha_arg not in names and not var_kw):
        return lambda *a, alpha=None, **kw: fn(*a, **kw)
    return lambda *a, alpha=None, **kw: fn(*a, **{alpha_arg: alpha}, **kw)


def _signature(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _run(row: CheckRow, call, *args, **kw):
    """call(*args); an exception becomes a failing note (None returned)."""
    try:
        return call(*args, **kw)
    except Exception as exc:  # noqa: BLE001 - the user's function may raise anything
        row.fail(raised(row, exc))
        return None


def raised(row: CheckRow, exc: Exception) -> str:
    """The failing note of a call that raised ``exc``, naming the corpus case it ran."""
    msg = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    if row.case == "all-masked":
        return (f"[all-masked] {msg} (on rows that are entirely -inf, which must give zeros; "
                "--no-masked-rows, or masked_rows=False, leaves them out)")
    return f"[{row.case}] {msg}" if row.case else msg


def _attention_grads(row: CheckRow, vjp, *args, **kw) -> list | None:
    """vjp(*args, **kw) of an attention: its first three results (dq, dk, dv) as NumPy, or
    None when it raised or returned something else (with a failing note on ``row``)."""
    res = _run(row, vjp, *args, **kw)
    if res is None:
        return None
    try:
        return [to_numpy(g) for g in list(res)[:3]]
    except TypeError as exc:
        row.fail(f"vjp must return (dq, dk, dv): {exc}")
        return None


def _dtypes(dtypes) -> list[np.dtype]:
    return [np.dtype(d) for d in dtypes]


def _battery(report: CheckReport, op: str, fn: Callable, name: str | None, dtypes, peer: bool,
             data_args: int, battery: str, form: str, alpha_arg):
    """Yield ``(dtype, row, call)`` for each dtype: ``row`` is added to ``report`` and timed
    until the caller's loop body ends; a fn that cannot be called as ``form`` gets a failing
    row and is not yielded."""
    label = name or getattr(fn, "__name__", "fn")
    for dt in _dtypes(dtypes):
        row = CheckRow(op, label, dt.name, peer=peer)
        report.rows.append(row)
        t0 = time.perf_counter()
        try:
            call = _caller(fn, data_args, battery, form, alpha_arg)
        except _CallError as exc:
            row.fail(str(exc))
            continue
        yield dt, row, call
        row.seconds = time.perf_counter() - t0


def _ref(x64, alpha):
    import entmax_ref as er

    return memo("entmax", lambda: er.entmax(x64, alpha, return_info=True, backend="numpy"), x64, alpha=alpha)


def _rows_of(size, seed, masked_rows, long_rows=True):
    cases = row_corpus(size, seed)
    return [c for c in cases if (masked_rows or c.name != "all-masked") and (long_rows or c.name != "long")]


def _dtype_ok(row: CheckRow, res, dt) -> None:
    got = str(getattr(res, "dtype", ""))
    if dt.name not in got:
        row.fail(f"returned dtype {got or type(res).__name__} for {dt.name} input")


# ----------------------------------------------------------------------------- entmax


def check_entmax(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                 name: str | None = None, dtypes=("float64", "float32"),
                 framework: str = "numpy", device: Any = None, size: str = "default", seed: int = 0,
                 masked_rows: bool = True, peer: bool = False) -> CheckReport:
    """Run the alpha-entmax battery on ``fn``.

    ``fn(x)`` or ``fn(x, alpha=...)`` must return alpha-entmax of the (rows, n) array ``x``
    along its last axis, in x's dtype; ``x`` is a ``framework`` array ('numpy', 'torch',
    'jax', 'cupy') on ``device``.  ``alpha_arg`` says how alpha is passed: by keyword
    ``alpha`` when fn has that parameter (the default), by another keyword name, as
    positional argument number ``alpha_arg`` (an int: 1 for ``fn(x, a)``), or not at all
    (None); it is never guessed from positions, so ``fn(x, dim=-1)`` keeps its ``dim``.

    Compared with the reference on every corpus case (random, ties, masks, all-masked
    rows unless ``masked_rows=False``, extreme magnitudes, tiny and long rows) under
    :func:`entmax_ref.testing.tolerance.entmax_tolerance`; properties: output dtype, on the
    simplex, masked entries exactly 0, all-masked rows give zeros, shift invariance,
    permutation equivariance, golden values.
    """
    report = CheckReport()
    a = float(alpha)
    for dt, row, call in _battery(report, f"entmax a={a:g}", fn, name, dtypes, peer, 1, "check_entmax",
                                  "fn(x) or fn(x, alpha=...)", alpha_arg):

        def run(x):
            res = _run(row, call, from_numpy(x, framework, device), alpha=a)
            return res, (None if res is None else _safe_np(row, res))

        cases = _rows_of(size, seed, masked_rows)
        seen_dtype = False
        for case in cases:
            row.case = case.name
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, _ = _ref(x64, a)
            res, got = run(x)
            if got is None:
                continue
            if not seen_dtype:
                seen_dtype = True
                ok_before = row.verdict
                _dtype_ok(row, res, dt)
                row.prop("dtype", row.verdict == ok_before or row.verdict == "FAIL" and ok_before == "FAIL",
                         f"got {getattr(res, 'dtype', '?')}")
            tol = T.entmax_tolerance(p, a, dt, masked=np.isneginf(x64))
            cmp = compare(got, p, tol, dt, support=True)
            if not row.judge(cmp, "p", case.name):
                continue
            if case.name == "masks":
                row.prop("masked entries are exactly 0", bool(np.all(got[np.isneginf(x64)] == 0)))
            if case.name == "all-masked":
                row.prop("all-masked rows give zeros", bool(np.all(got == 0)))
            if case.name == "random":
                live = np.isfinite(x64).any(axis=1)
                s = got.astype(np.float64).sum(axis=1)
                row.prop("on the simplex", bool(np.all(got >= 0) and np.all(np.abs(s - 1)[live] <= tol.sum(axis=1)[live])),
                         f"min p {got.min():.3g}, worst |sum - 1| {np.abs(s - 1).max():.3g}")
                shift = np.float64(3.0).astype(dt)
                _, got2 = run(x + shift)
                if got2 is not None:
                    p2, _ = _ref(x64 + float(shift), a)
                    c2 = compare(got2, p2, T.entmax_tolerance(p2, a, dt), dt)
                    row.prop("shift invariance", c2.ok, c2.describe("p(x + 3)"))
                perm = np.random.default_rng(seed + 1).permutation(x.shape[1])
                _, got3 = run(np.ascontiguousarray(x[:, perm]))
                if got3 is not None and got3.shape == got.shape:
                    row.prop("permutation equivariance", bool(np.all(np.abs(got3[:, np.argsort(perm)] - got) <= 2 * tol)))
        for gx, ga, gp in golden_cases(a):
            res, got = run(gx.astype(dt))
            if got is not None:
                c = compare(got, gp, T.entmax_tolerance(gp, a, dt, masked=np.isneginf(gx)), dt)
                row.prop("golden value", c.ok, f"entmax({gx[0].tolist()}) = {gp[0].tolist()}: {c.describe('p')}")
    return report


def _safe_np(row: CheckRow, res) -> np.ndarray | None:
    try:
        return to_numpy(res)
    except TypeError as exc:
        row.fail(str(exc))
        return None


def check_threshold(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                    name: str | None = None, dtypes=("float64", "float32"),
                    framework: str = "numpy", device: Any = None, size: str = "default", seed: int = 0,
                    masked_rows: bool = True, peer: bool = False) -> CheckReport:
    """Run the threshold battery: ``fn(x)`` / ``fn(x, alpha=...)`` returns tau per row, shape
    (rows,), in the units p = [(alpha-1) x - tau]_+ ** (1/(alpha-1)) (logsumexp at 1).
    ``alpha_arg`` as in :func:`check_entmax`.

    Compared under :func:`entmax_ref.testing.tolerance.threshold_tolerance`; property:
    the threshold form at the returned tau sums to 1 within the probability budgets
    (support/threshold consistency), and all-masked rows give -inf.
    """
    report = CheckReport()
    a = float(alpha)
    for dt, row, call in _battery(report, f"threshold a={a:g}", fn, name, dtypes, peer, 1, "check_threshold",
                                  "fn(x) or fn(x, alpha=...)", alpha_arg):
        for case in _rows_of(size, seed, masked_rows):
            row.case = case.name
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, info = _ref(x64, a)
            res = _run(row, call, from_numpy(x, framework, device), alpha=a)
            got = None if res is None else _safe_np(row, res)
            if got is None:
                continue
            got = got.reshape(-1) if got.size == len(x) else got
            cmp = compare(got, info.tau, T.threshold_tolerance(info.tau, a, dt, x.shape[1]), dt)
            if not row.judge(cmp, "tau", case.name):
                continue
            if case.name == "random":
                from entmax_ref.backends._base import tau_to_theta

                theta = tau_to_theta(got.astype(np.float64), np.full(len(x), a))
                pp = T.e_alpha(x64 - theta[:, None], a)
                # the envelope of the threshold error the tau budget allows, in x-space units
                slack = T.threshold_tolerance(info.tau, a, dt, x.shape[1]) / (a - 1 if a > 1 else 1.0)
                budget = T.entmax_tolerance(p, a, dt, extra_delta=slack).sum(axis=1)
                row.prop("support/threshold consistency", bool(np.all(np.abs(pp.sum(axis=1) - 1) <= budget)),
                         f"worst |sum p(tau) - 1| {np.abs(pp.sum(axis=1) - 1).max():.3g}")
            if case.name == "all-masked":
                row.prop("all-masked rows give -inf", bool(np.all(np.isneginf(got))))
    return report


# ----------------------------------------------------------------------------- VJP


def check_entmax_vjp(fn: Callable, alpha: float = 1.5, *, alpha_arg: str | int | None = ALPHA_KEYWORD,
                     inputs: str = "x", name: str | None = None,
                     dtypes=("float64", "float32"), framework: str = "numpy", device: Any = None,
                     size: str = "default", seed: int = 0, masked_rows: bool = True,
                     peer: bool = False) -> CheckReport:
    """Run the VJP battery on ``fn``.

    ``inputs="x"``: ``fn(x, grad)`` / ``fn(x, grad, alpha=...)`` returns the gradient of
    ``sum(grad * entmax(x, alpha))`` w.r.t. x (what autograd gives).  ``inputs="p"``:
    ``fn(p, grad, alpha=...)`` takes the forward's output instead (like
    :func:`entmax_ref.entmax_vjp`).  ``alpha_arg`` as in :func:`check_entmax` (2 for
    ``fn(p, grad, a)``).  Compared under
    :func:`entmax_ref.testing.tolerance.vjp_tolerance`; rows whose gradient is ill-posed
    (alpha >= 2 and an entry at the threshold) are counted in the notes, not compared.
    Properties: rows of the VJP sum to 0 (J 1 = 0), the Jacobian built from VJPs is
    symmetric, and (float64) agreement with central finite differences of the reference.
    """
    import entmax_ref as er

    if inputs not in ("x", "p"):
        raise ValueError(f"inputs must be 'x' or 'p', got {inputs!r}")
    report = CheckReport()
    a = float(alpha)
    rng = np.random.default_rng(seed + 7)
    form = "fn(x, grad) or fn(x, grad, alpha=...)" if inputs == "x" else "fn(p, grad) or fn(p, grad, alpha=...)"
    for dt, row, call in _battery(report, f"vjp a={a:g}", fn, name, dtypes, peer, 2, "check_entmax_vjp", form,
                                  alpha_arg):

        def vjp(x, g, p):
            first = x if inputs == "x" else p
            res = _run(row, call, from_numpy(first, framework, device), from_numpy(g, framework, device), alpha=a)
            return None if res is None else _safe_np(row, res)

        skipped = 0
        for case in _rows_of(size, seed, masked_rows):
            row.case = case.name
            x = case.x.astype(dt)
            x64 = x.astype(np.float64)
            p, info = _ref(x64, a)
            g = rng.standard_normal(x.shape).astype(dt)
            pin = p.astype(dt)
            p_used = pin.astype(np.float64) if inputs == "p" else p
            dx = er.entmax_vjp(p_used, g.astype(np.float64), a, backend="numpy")
            got = vjp(x, g, pin)
            if got is None:
                continue
            tol = T.vjp_tolerance(p_used, g, dx, a, dt)
            if inputs == "x":
                from entmax_ref.backends._base import tau_to_theta

                bad = T.ill_posed_rows(x64, tau_to_theta(info.tau, np.full(len(x), a)), a, dt)
                skipped += int(bad.sum())
                tol = np.where(bad[:, None], np.inf, tol)
            cmp = compare(got, dx, tol, dt)
            if not row.judge(cmp, "dx", case.name):
                continue
            if case.name == "random":
                s = got.astype(np.float64).sum(axis=1)
                row.prop("rows sum to 0 (J 1 = 0)", bool(np.all(np.abs(s) <= tol.sum(axis=1))),
                         f"worst |sum| {np.abs(s).max():.3g}")
        # the Jacobian from n VJPs is symmetric
        xs = np.random.default_rng(seed + 3).standard_normal((1, 6)).astype(dt)
        xs64 = xs.astype(np.float64)
        ps, _ = _ref(xs64, a)
        eye = np.eye(6, dtype=dt)
        cols = [vjp(xs, eye[i:i + 1], ps.astype(dt)) for i in range(6)]
        if all(c is not None and c.shape == (1, 6) for c in cols):
            J = np.concatenate(cols).astype(np.float64)
            tolJ = T.vjp_tolerance(np.repeat(ps, 6, 0), eye, J, a, dt)
            row.prop("Jacobian is symmetric", bool(np.all(np.abs(J - J.T) <= 2 * tolJ)),
                     f"max |J - J^T| {np.abs(J - J.T).max():.3g}")
        if dt == np.float64:
            # central differences of the (exact) reference forward, h = eps^(1/3)
            xf = np.random.default_rng(seed + 5).standard_normal((3, 7))
            gf = np.random.default_rng(seed + 6).standard_normal((3, 7))
            pf, _ = _ref(xf, a)
            h = np.finfo(np.float64).eps ** (1 / 3)
            fd = np.empty_like(xf)
            for j in range(xf.shape[1]):
                e = np.zeros_like(xf)
                e[:, j] = h
                fd[:, j] = ((_ref(xf + e, a)[0] - _ref(xf - e, a)[0]) * gf).sum(axis=1) / (2 * h)
            got = vjp(xf, gf, pf)
            if got is not None and got.shape == fd.shape:
                # truncation h^2/6 |f'''| + rounding eps/h, with |f'''| <= 1e2 on these rows
                budget = 1e2 * h * h + 4 * np.finfo(np.float64).eps / h
                row.prop("finite differences", bool(np.all(np.abs(got - fd) <= budget * (1 + np.abs(gf).max()))),
                         f"max |vjp - fd| {np.abs(got - fd).max():.3g}")
        if skipped:
            row.note(f"{skipped} ill-posed row(s) not compared (alpha >= 2 with an entry at the threshold)")
    return report


# ----------------------------------------------------------------------------- attention


def _attention_signature(fn, data: int, op: str) -> tuple[set, bool]:
    """(parameter names, has ``**kwargs``) of an attention function, once it is checked
    that it can be called as ``fn(q, k, v, **kw)`` (``data`` 3) or ``vjp(grad_out, q, k,
    v, **kw)`` (``data`` 4): _CallError when not; ({"alpha"}, True) without a signature."""
    try:
        _caller(fn, data, op, "vjp(grad_out, q, k, v, **kw)" if data == 4 else "fn(q, k, v, **kw)")
        _, _, var_kw, names = _positional_capacity(fn)
    except _CallError:
        raise
    except (TypeError, ValueError):
        return {"alpha"}, True
    return names, var_kw


def _attn_kwargs(case, alpha, names, var_kw, alpha_arg):
    kw = {k: v for k, v in case.kwargs.items() if v is not None and v is not False}
    if alpha_arg is not None and (alpha_arg in names or var_kw):
        kw[alpha_arg] = alpha
    return kw


def check_attention(fn: Callable | None, alpha: float = 1.5, *, alpha_arg: str | None = ALPHA_KEYWORD,
                    vjp: Callable | None = None, name: str | None = None, features=("causal", "gqa", "cross"),
                    dtypes=("float64", "float32"), framework: str = "numpy",
                    device: Any = None, size: str = "default", seed: int = 0, peer: bool = False) -> CheckReport:
    """Run the attention battery.

    ``fn(q, k, v, **kw)`` returns the (B, Hq, Nq, Dv) output of entmax attention; ``kw``
    holds alpha under the keyword ``alpha_arg`` (default ``alpha``, when fn has that
    parameter or ``**kwargs``; None: never passed) and what the case uses: ``causal=True``,
    ``key_lengths``, ``alibi_slopes``, ``beta``/``gamma`` (see
    :func:`entmax_ref.testing.corpus.attention_corpus` and ``features``).  The scale is
    left to fn's default, which must be 1/sqrt(D); causal masking is bottom-right aligned.
    ``vjp(grad_out, q, k, v, **kw)`` (optional) returns ``(dq, dk, dv)``.

    Compared under the budgets of tolerance formula 5.  Properties: output dtype, rows
    with no key give zeros (with "key_lengths"), grouped-query heads equal repeated k/v
    (with "gqa").
    """
    report = CheckReport()
    a = float(alpha)
    label = name or getattr(fn if fn is not None else vjp, "__name__", "fn")
    cases = attention_corpus(size, seed, features)
    rng = np.random.default_rng(seed + 11)
    grads_out = {id(c): rng.standard_normal(c.q.shape[:3] + (c.v.shape[3],)) for c in cases}
    jobs = [(f, op) for f, op in ((fn, "attention"), (vjp, "attention vjp")) if f is not None]
    for f, op in jobs:
        for dt in _dtypes(dtypes):
            row = CheckRow(f"{op} a={a:g}", label, dt.name, peer=peer)
            report.rows.append(row)
            t0 = time.perf_counter()
            data = 4 if op == "attention vjp" else 3
            try:
                if isinstance(alpha_arg, int):
                    raise _CallError(f"check_attention passes alpha by keyword; alpha_arg must be a name or None, "
                                     f"got {alpha_arg!r}")
                names, var_kw = _attention_signature(f, data, f"check_attention ({op})")
            except _CallError as exc:
                row.fail(str(exc))
                continue
            first = True
            for case in cases:
                q, k, v = (t.astype(dt) for t in (case.q, case.k, case.v))
                kw = _attn_kwargs(case, a, names, var_kw, alpha_arg)
                ref = attention_reference(q, k, v, dt, alpha=a, **case.kwargs)
                args = [from_numpy(t, framework, device) for t in (q, k, v)]
                if op == "attention":
                    res = _run(row, f, *args, **kw)
                    got = None if res is None else _safe_np(row, res)
                    if got is None:
                        continue
                    if first:
                        first = False
                        before = row.verdict
                        _dtype_ok(row, res, dt)
                        row.prop("dtype", row.verdict == before, f"got {getattr(res, 'dtype', '?')}")
                    cmp = compare(got, ref.out, attention_out_tolerance(ref, v, dt), dt)
                    if not row.judge(cmp, "out", case.name):
                        continue
                    if case.name == "key_lengths":
                        kl = np.asarray(case.kwargs["key_lengths"])
                        row.prop("no keys gives a zero output", bool(np.all(got[kl == 0] == 0)))
                    if case.name == "gqa":
                        rep = q.shape[1] // k.shape[1]
                        k2, v2 = (from_numpy(np.repeat(t, rep, axis=1), framework, device) for t in (k, v))
                        res2 = _run(row, f, args[0], k2, v2, **kw)
                        got2 = None if res2 is None else _safe_np(row, res2)
                        if got2 is not None:
                            row.prop("grouped heads equal repeated k, v", bool(np.all(np.abs(got2 - got) <= 2 * (
                                attention_out_tolerance(ref, v, dt)))))
                else:
                    do = grads_out[id(case)].astype(dt)
                    got = _attention_grads(row, f, from_numpy(do, framework, device), *args, **kw)
                    if got is None:
                        continue
                    q64, k64, v64, do64 = (t.astype(np.float64) for t in (q, k, v, do))
                    exp = reference_attention_grads(do64, q64, k64, v64, alpha=a, **case.kwargs)
                    tols = attention_grad_tolerances(ref, q64, k64, v64, do64, dt, exp)
                    for gname, g_act, g_exp, tol in zip(("dq", "dk", "dv"), got, exp, tols):
                        cmp = compare(g_act, g_exp, tol, dt, name=gname)
                        row.judge(cmp, gname, case.name)
                    if case.name == "key_lengths" and len(got) == 3 and got[0].shape == q.shape:
                        kl = np.asarray(case.kwargs["key_lengths"])
                        row.prop("no keys gives zero gradients", bool(np.all(got[0][kl == 0] == 0)))
            row.seconds = time.perf_counter() - t0
    return report
