"""The report of the batteries: one :class:`CheckRow` per operation, implementation and
dtype, gathered in a :class:`CheckReport` that prints as a table or writes JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["LEGEND", "CheckReport", "CheckRow"]


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
