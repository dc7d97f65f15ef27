"""How the batteries call a user's function: the signature checks, where alpha goes, and
the guards that turn an exception or a result of the wrong kind into a failing row.

Shared by :mod:`entmax_ref.testing.checks`, :mod:`entmax_ref.testing.family_checks` and the
corpus replay, so that every battery calls a function the same way and says the same thing
when it cannot.
"""

from __future__ import annotations

import inspect
import time
from typing import Callable

import numpy as np

from ._adapters import to_numpy
from .corpus import row_corpus
from .report import CheckReport, CheckRow


class CallError(Exception):
    pass


def positional_capacity(fn) -> tuple[int, int, bool, set]:
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


def caller(fn: Callable, data_args: int, op: str, form: str, alpha_arg: str | int | None = ALPHA_KEYWORD) -> Callable:
    """``call(*data, alpha=a)`` that calls ``fn`` with alpha placed as ``alpha_arg`` says.

    ``alpha_arg`` is explicit, never guessed from the signature's positions:

    * a string: the keyword alpha is passed by.  The default, ``"alpha"``, passes it only
      when ``fn`` has a parameter called ``alpha`` (or ``**kwargs``), so that ``fn(x)``
      computing a fixed alpha (``sparsemax``) needs nothing; any other name must be a
      parameter of ``fn``;
    * an int: alpha is the positional argument right after the data, whose 0-based
      number this is (1 for ``fn(x, alpha)``, 2 for ``fn(p, grad, alpha)``);
    * None: alpha is never passed.

    Raises CallError with a clear message when ``fn`` cannot be called that way."""
    if not callable(fn):
        raise CallError(f"{fn!r} is not callable")
    if not (alpha_arg is None or isinstance(alpha_arg, (str, int)) and not isinstance(alpha_arg, bool)):
        raise CallError(f"alpha_arg must be a keyword name, a position or None, got {alpha_arg!r}")
    try:
        req, mx, var_kw, names = positional_capacity(fn)
    except (TypeError, ValueError):  # builtins without a signature: fn(*data), or as alpha_arg says
        explicit = alpha_arg is not None and alpha_arg != ALPHA_KEYWORD
        req, mx, var_kw, names = data_args, 10**6, explicit, {alpha_arg} if explicit else set()
    label = f"{getattr(fn, '__name__', 'fn')}{signature_text(fn)}"
    if isinstance(alpha_arg, int):
        if alpha_arg != data_args:
            raise CallError(f"alpha_arg={alpha_arg} must be {data_args}: {op} passes alpha positionally only "
                             f"right after the {data_args} data argument(s)")
        if mx <= data_args or req > data_args + 1:
            raise CallError(f"wrong signature: {op} calls {form} with alpha as positional argument "
                             f"{alpha_arg} (alpha_arg), which {label} cannot take")
        return lambda *a, alpha=None, **kw: fn(*a, alpha, **kw)
    if alpha_arg not in (None, ALPHA_KEYWORD) and alpha_arg not in names and not var_kw:
        raise CallError(f"alpha_arg={alpha_arg!r} is not a parameter of {label}")
    by_name = alpha_arg is not None and alpha_arg in names  # fills one of fn's parameters
    if mx < data_args or req > data_args + by_name:
        hint = (f"; alpha is passed by keyword {alpha_arg!r} (alpha_arg): pass alpha_arg={data_args} to give it as "
                "the next positional argument" if req == data_args + 1 else "")
        raise CallError(f"wrong signature: {op} calls {form}, but the function's signature is {label}{hint}")
    if alpha_arg is None or (alpha_arg == ALPHA_KEYWORD and alpha_arg not in names and not var_kw):
        return lambda *a, alpha=None, **kw: fn(*a, **kw)
    return lambda *a, alpha=None, **kw: fn(*a, **{alpha_arg: alpha}, **kw)


def signature_text(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def guarded_call(row: CheckRow, call, *args, **kw):
    """call(*args); an exception, a ``sys.exit()`` inside the call, or a result of None
    becomes a failing note and a FAIL record of the row's case (None returned)."""
    try:
        res = call(*args, **kw)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's function may raise anything
        row.fail_case(raised(row, exc), "exit" if isinstance(exc, SystemExit) else "raised")
        return None
    if res is None:
        row.fail_case(_at_case(row, "returned None instead of an array"), "None")
    return res


def _at_case(row: CheckRow, msg: str) -> str:
    return f"[{row.case}] {msg}" if row.case else msg


def raised(row: CheckRow, exc: BaseException) -> str:
    """The failing note of a call that raised ``exc``, naming the corpus case it ran."""
    if isinstance(exc, SystemExit):
        return _at_case(row, f"called sys.exit({exc.code!r}) (SystemExit)")
    msg = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    if row.case == "all-masked":
        return (f"[all-masked] {msg} (on rows that are entirely -inf, which must give zeros; "
                "--no-masked-rows, or masked_rows=False, leaves them out)")
    return _at_case(row, msg)


def attention_grads(row: CheckRow, vjp, *args, **kw) -> list | None:
    """vjp(*args, **kw) of an attention: its first three results (dq, dk, dv) as NumPy, or
    None when it raised or returned something else (with a failing note on ``row``)."""
    res = guarded_call(row, vjp, *args, **kw)
    if res is None:
        return None
    try:
        return [to_numpy(g) for g in list(res)[:3]]
    except TypeError as exc:
        row.fail_case(_at_case(row, f"vjp must return (dq, dk, dv): {exc}"), "type")
        return None


def dtypes_of(dtypes) -> list[np.dtype]:
    return [np.dtype(d) for d in dtypes]


def battery_rows(report: CheckReport, op: str, fn: Callable, name: str | None, dtypes, peer: bool,
             data_args: int, battery: str, form: str, alpha_arg):
    """Yield ``(dtype, row, call)`` for each dtype: ``row`` is added to ``report`` and timed
    until the caller's loop body ends; a fn that cannot be called as ``form`` gets a failing
    row and is not yielded."""
    label = name or getattr(fn, "__name__", "fn")
    for dt in dtypes_of(dtypes):
        row = CheckRow(op, label, dt.name, peer=peer)
        report.rows.append(row)
        t0 = time.perf_counter()
        try:
            call = caller(fn, data_args, battery, form, alpha_arg)
        except CallError as exc:
            row.fail(str(exc), "call")
            continue
        yield dt, row, call
        row.seconds = time.perf_counter() - t0
        row.finish()


def rows_of(size, seed, masked_rows, long_rows=True):
    cases = row_corpus(size, seed)
    return [c for c in cases if (masked_rows or c.name != "all-masked") and (long_rows or c.name != "long")]


def dtype_ok(row: CheckRow, res, dt) -> None:
    got = str(getattr(res, "dtype", ""))
    if dt.name not in got:
        row.fail(f"returned dtype {got or type(res).__name__} for {dt.name} input", "dtype")


def safe_np(row: CheckRow, res) -> np.ndarray | None:
    try:
        return to_numpy(res)
    except TypeError as exc:
        row.fail_case(_at_case(row, str(exc)), "type")
        return None


def attention_signature(fn, data: int, op: str) -> tuple[set, bool]:
    """(parameter names, has ``**kwargs``) of an attention function, once it is checked
    that it can be called as ``fn(q, k, v, **kw)`` (``data`` 3) or ``vjp(grad_out, q, k,
    v, **kw)`` (``data`` 4): CallError when not; ({"alpha"}, True) without a signature."""
    try:
        caller(fn, data, op, "vjp(grad_out, q, k, v, **kw)" if data == 4 else "fn(q, k, v, **kw)")
        _, _, var_kw, names = positional_capacity(fn)
    except CallError:
        raise
    except (TypeError, ValueError):
        return {"alpha"}, True
    return names, var_kw
