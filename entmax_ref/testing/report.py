"""The report of the batteries: one :class:`CheckRow` per operation, implementation and
dtype, gathered in a :class:`CheckReport` that prints as a table or writes JSON.

Every comparison a row makes is also kept as a per-case record (:meth:`CheckRow.judge`):
``{"tcId", "verdict", "field", "worst", "got", "expected", "error", "bound", "reason"}``, the
case's id (the built-in corpus's case name, or a conformance corpus's ``tcId``), PASS / FAIL /
SKIP (or ACCEPTABLE: a difference on a conformance case whose verdict is ``acceptable``,
counted with the skipped), the compared output, the index of its entry that used the largest
fraction of its tolerance, the result and the expected value there (C99 hex floats, exact),
the absolute error and the tolerance there, and for a case that could not be
compared why (the call raised, returned None, a result of the wrong shape).  ``--json``
writes them all; the table counts them.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["LEGEND", "WIDTH", "CheckReport", "CheckRow"]

#: no line of :meth:`CheckReport.table` is wider
WIDTH = 100

#: what the columns of :meth:`CheckReport.table` mean
LEGEND = """\
abs err: largest |actual - expected| (float64 reference); ulps: that over eps * max(1, |expected|)
err/tol: largest error over its own budget (above 1 fails; docs/validate.md); props: passed/run
NaN: the implementation returned NaN; -: nothing measured; FAIL <cause>: see the failures below"""

#: the budget each compared output is judged by, when the battery names none
#: (the formulas of :mod:`entmax_ref.testing.tolerance`)
BUDGETS = {
    "p": "entmax_tolerance, formula 2",
    "tau": "threshold_tolerance, formula 3",
    "dx": "vjp_tolerance, formula 4",
    "out": "attention_out_tolerance, formula 5",
    "dq": "attention_grad_tolerances, formula 5",
    "dk": "attention_grad_tolerances, formula 5",
    "dv": "attention_grad_tolerances, formula 5",
    "loss": "loss_tolerance, formula 6",
    "dalpha": "alpha_vjp_tolerance, formula 7",
    "s": "asentmax_scale_tolerances, formula 8",
}

#: a passing row whose largest error is this many ulps or more says which budget allowed it
LARGE_ULPS = 1e3


def hexnum(value: float) -> str:
    """The C99 hex-float string of a float (trailing zero hex digits dropped: printf's %a)."""
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    mant, exp = v.hex().split("p")  # [-]0x1.8000000000000p-1
    return f"{mant.rstrip('0').rstrip('.')}p{exp}"


def _case_record(tc_id: str, verdict: str, field_: str | None = None, cmp=None, reason: str = "") -> dict:
    rec = {"tcId": tc_id, "verdict": verdict, "field": field_, "worst": None, "got": None, "expected": None,
           "error": None, "bound": None, "reason": reason}
    if cmp is not None and cmp.worst is not None:
        err = 0.0 if cmp.actual == cmp.expected else abs(cmp.actual - cmp.expected)  # inf == inf: exact
        rec.update(worst=list(cmp.worst), got=hexnum(cmp.actual), expected=hexnum(cmp.expected),
                   error=float(np.inf) if np.isnan(err) else err, bound=cmp.tol)
    return rec


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
    #: why the row failed, in a word (its first failure): tol, NaN, raised, exit, None,
    #: shape, dtype, type, prop, call, import, unmeasured
    cause: str = ""
    #: failure notes beyond the 8 kept in ``notes`` (every case is in ``cases``)
    more_notes: int = 0
    #: one record per compared case and output (module docs)
    cases: list = field(default_factory=list)
    #: where the largest absolute error is: ``{"tcId", "field", "worst", "bound", "budget"}``
    largest: dict = field(default_factory=dict)
    #: the corpus case being run (not a field: named in the note of a call that raises)
    case = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "FAIL"

    def fail(self, msg: str, cause: str = "") -> None:
        self.verdict = "FAIL"
        if not self.cause:
            self.cause = cause
        self.note(msg)

    def note(self, msg: str) -> None:
        if msg in self.notes:
            return
        if len(self.notes) < 8:
            self.notes.append(msg)
        else:
            self.more_notes += 1

    def fail_case(self, msg: str, cause: str) -> None:
        """The current case could not be compared (the call raised, returned None, ...):
        a failing note and a FAIL record for the case."""
        self.fail(msg, cause)
        self.cases.append(_case_record(self.case or "-", "FAIL", reason=msg))

    def skip_case(self, tc_id: str, reason: str) -> None:
        """A case not compared on purpose (an ill-posed gradient): a SKIP record."""
        self.cases.append(_case_record(tc_id, "SKIP", reason=reason))

    def measure(self, cmp, where: str = "", what: str = "", budget: str = "") -> None:
        if cmp.problem:  # a shape or dtype that cannot be compared: nothing measured (the note says why)
            return
        self.measured = True
        if np.isfinite(cmp.max_abs):
            if cmp.max_abs > self.max_abs or not self.largest:
                self.largest = {"tcId": where, "field": what, "worst": list(cmp.abs_at or ()),
                                "bound": cmp.abs_tol, "budget": budget or BUDGETS.get(what, "")}
            self.max_abs = max(self.max_abs, cmp.max_abs)
            self.max_ulps = max(self.max_ulps, cmp.max_ulps)
        elif self.nonfinite != "NaN":
            self.nonfinite = "NaN" if cmp.actual is not None and np.isnan(cmp.actual) else "inf"
        if np.isfinite(cmp.used) and (cmp.used > self.used or not self.tol_ulps):
            self.used, self.tol_ulps = max(cmp.used, self.used), cmp.tol_ulps

    def judge(self, cmp, what: str, where: str, why: str = "", *, tc_id: str | None = None,
              budget: str = "", acceptable: bool = False) -> bool:
        """Record a comparison: its figures, a record for case ``tc_id`` (default ``where``),
        and ``[where] <what's worst entry> (why)`` as a failing note when it is out of
        tolerance.  ``budget`` names the tolerance it was judged by (default: the one
        :data:`BUDGETS` gives ``what``).  With ``acceptable`` (a case whose expected value is
        one of several defensible answers) a difference is an ACCEPTABLE record and a note,
        not a failure.  Returns whether it is within."""
        self.measure(cmp, tc_id or where, what, budget)
        verdict = "PASS" if cmp.ok else "ACCEPTABLE" if acceptable else "FAIL"
        self.record(tc_id or where, verdict, what, cmp, cmp.problem)
        if not cmp.ok:
            msg = f"[{where}] {cmp.describe(what)}" + (f" ({why})" if why else "")
            nan = cmp.actual is not None and np.isnan(cmp.actual)
            if acceptable:
                self.note(msg + " (an acceptable difference, not a failure)")
            else:
                self.fail(msg, cmp.problem_kind or ("NaN" if nan else "tol"))
        return cmp.ok

    def record(self, tc_id: str, verdict: str, what: str | None = None, cmp=None, reason: str = "") -> None:
        """Add case ``tc_id``'s record as it is (a count judged without figures, an error the
        case expects), without the row's figures or notes."""
        self.cases.append(_case_record(tc_id, verdict, what, cmp, reason))

    def prop(self, name: str, ok: bool, why: str = "") -> None:
        self.props_total += 1
        if ok:
            self.props_passed += 1
        else:
            self.fail(f"property {name!r} fails" + (f": {why}" if why else ""), "prop")

    def finish(self) -> None:
        """Close a battery's row: a row that passed without comparing anything fails
        (the checker never passes what it did not measure)."""
        if self.verdict == "PASS" and not self.measured:
            self.fail("nothing was compared: no call returned a result that could be measured", "unmeasured")

    def counts(self) -> tuple[int, int, int]:
        """(cases passed, failed, skipped): a case fails when any of its records fails."""
        by_case: dict = {}
        for rec in self.cases:
            by_case.setdefault(rec["tcId"], set()).add(rec["verdict"])
        verdicts = ["FAIL" if "FAIL" in v else "PASS" if "PASS" in v else "SKIP" for v in by_case.values()]
        return verdicts.count("PASS"), verdicts.count("FAIL"), verdicts.count("SKIP")


def _family(op: str) -> str:
    """An operation without its parameter: ``vjp a=1.5`` -> ``vjp``."""
    return op.split(" a=")[0].split(" B=")[0]


#: the verdict of a skipped row whose reason is listed below the table
SKIP_BELOW = "SKIP (below)"


def _shortened(text: str, width: int) -> str:
    """``text`` in ``width`` characters: its start and its end around a ``~``."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "~" + text[len(text) - (width - 1 - head):]


def _fit(cells: list, widths: list, last: str) -> str:
    line = "  ".join(c.ljust(w) for c, w in zip(cells, widths))
    return (line + "  " + last)[:WIDTH].rstrip()


def _wrapped(head: str, text: str) -> list:
    return textwrap.wrap(text, WIDTH, initial_indent=head, subsequent_indent=" " * 6, break_on_hyphens=False)


@dataclass
class CheckReport:
    """Rows of a battery (or of the whole ``entmax-ref check`` run)."""

    rows: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No row failed (peers included)."""
        return not any(r.failed for r in self.rows)

    @classmethod
    def skipped(cls, op: str, impl: str, why: str, peer: bool = False) -> "CheckReport":
        """One SKIP row: ``impl`` was not run (not installed, not implemented) for ``why``."""
        return cls([CheckRow(op, impl, "-", verdict="SKIP", notes=[why], peer=peer)])

    @classmethod
    def failed_run(cls, op: str, impl: str, why: str, cause: str, peer: bool = False) -> "CheckReport":
        """One FAIL row for a run that could not start or finish (``cause`` as :meth:`CheckRow.fail`)."""
        row = CheckRow(op, impl, "-", peer=peer)
        row.fail(why, cause)
        return cls([row])

    def extend(self, other: "CheckReport") -> "CheckReport":
        self.rows.extend(other.rows)
        return self

    def counts(self) -> dict:
        """``{operation: {"pass": n, "fail": n, "skip": n}}``: cases by verdict, summed over
        implementations and dtypes (a SKIP row, not run at all, counts as one skipped case)."""
        out: dict = {}
        for r in self.rows:
            c = out.setdefault(_family(r.op), {"pass": 0, "fail": 0, "skip": 0})
            if r.verdict == "SKIP":
                c["skip"] += 1
                continue
            for key, n in zip(("pass", "fail", "skip"), r.counts()):
                c[key] += n
        return out

    def to_dict(self) -> dict:
        return {"ok": self.ok, "counts": self.counts(), "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2, default=float)

    def table(self) -> str:
        """The report as a plain-text table at most :data:`WIDTH` columns wide: the rows
        (peers after the others), a short legend, the cases counted by operation, the
        failures, and the budgets that allowed a large error."""
        head = ["operation", "implementation", "dtype", "abs err", "ulps", "err/tol", "props"]
        lines = []
        for r in self.rows:
            skip = r.verdict == "SKIP"
            # "-": nothing measured; NaN / inf: what the implementation returned, not a number
            figures = (["-"] * 3 if skip or not r.measured else [r.nonfinite] * 3 if r.nonfinite
                       else [f"{r.max_abs:.2e}", f"{r.max_ulps:.3g}", f"{r.used:.3g}"])
            props = "-" if skip or not (r.measured or r.props_total) else f"{r.props_passed}/{r.props_total}"
            verdict = ("SKIP" + (f": {r.notes[0]}" if r.notes else "") if skip
                       else f"FAIL {r.cause}".rstrip() if r.failed else r.verdict)
            lines.append(([r.op, r.impl, r.dtype, *figures, props], verdict, r.peer))
        widths = [max([len(h)] + [len(cells[i]) for cells, _, _ in lines]) for i, h in enumerate(head)]
        # a skip's reason that does not fit goes below the table
        room = max(len(SKIP_BELOW), WIDTH - sum(widths) - 2 * len(widths))
        verdicts = [SKIP_BELOW if len(v) > room else v for _, v, _ in lines]
        over = sum(widths) + 2 * len(widths) + max(len(v) for v in ["verdict", *verdicts]) - WIDTH
        if over > 0:  # a long implementation name gives way, keeping its start and its end
            widths[1] = max(len(head[1]), widths[1] - over)
            lines = [([c[0], _shortened(c[1], widths[1]), *c[2:]], v, p) for c, v, p in lines]
        out = [_fit(head, widths, "verdict"), _fit(["-" * w for w in widths], widths, "-------")]
        peers_shown = False
        long_skips = [r for r, v, (_, verdict, _) in zip(self.rows, verdicts, lines) if v != verdict]
        for (cells, _, peer), verdict in zip(lines, verdicts):
            if peer and not peers_shown:
                peers_shown = True
                out.append("peers (third-party implementations: failures do not count in the exit status "
                           "unless --strict-peers)"[:WIDTH])
            out.append(_fit(cells, widths, verdict))
        out += ["", LEGEND]
        counts = self.counts()
        if counts:
            text = ", ".join(f"{op} {c['pass']}/{c['fail']}/{c['skip']}" for op, c in counts.items())
            out += [""] + _wrapped("cases passed/failed/skipped: ", text)
        if long_skips:
            out += ["", "skipped:"]
            for r in long_skips:
                out += _wrapped("  ", f"{r.op} / {r.impl}: {r.notes[0]}")
        fails = [r for r in self.rows if r.failed]
        if fails:
            out += ["", "failures:"]
            for r in fails:
                out += _wrapped("  ", f"{r.op} / {r.impl} / {r.dtype}:")
                for n in r.notes:
                    out += _wrapped("    ", n)
                if r.more_notes:
                    out.append(f"    and {r.more_notes} more (--json lists every case)")
        large = [r for r in self.rows if not r.failed and r.measured and r.max_ulps >= LARGE_ULPS and r.largest]
        if large:
            out += ["", "large errors within their budget:"]
            for r in large:
                at = r.largest
                text = (f"{r.op} / {r.impl} / {r.dtype}: abs err {r.max_abs:.3g} at [{at['tcId']}] "
                        f"{at['field']} {tuple(at['worst'])} is within its bound {at['bound']:.3g}"
                        + (f" ({at['budget']})" if at["budget"] else ""))
                out += _wrapped("  ", text)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()
