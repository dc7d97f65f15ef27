"""The capability table: which backend runs which operation with which ``method=``.

One source of truth (data, in the spirit of SciPy's ``xp_capabilities``).  It drives

* the dispatch errors (:func:`require`): an unknown method name is a ``ValueError`` listing
  the methods of that backend and operation; a known method the backend lacks is a
  ``NotImplementedError`` naming the backends that have it;
* the test parametrisation (``tests/conftest.py`` reads :func:`pairs`);
* the table in ``docs/guides/backends.md`` (:func:`markdown_table`; a test checks that the
  page shows exactly this table).

A method name means one algorithm on every engine (``METHODS``); ``None`` is each
engine's exact default, described per backend in ``DEFAULTS``.

Adding an operation is one entry in ``CAPABILITIES`` (``op: {backend: methods}``);
adding a backend is one key in each operation it implements.  Backends registered at run
time (:func:`entmax_ref.backends.register_backend`) are not in the table unless they pass
``capabilities=``; :func:`require` leaves the method check to such a backend itself.
"""

from __future__ import annotations

from typing import Mapping

__all__ = [
    "CAPABILITIES", "DEFAULTS", "METHODS", "add_backend", "backends_with", "markdown_table", "methods", "pairs",
    "remove_backend", "require",
]

#: Every method name, with the one algorithm it means wherever it exists.
METHODS: dict[str, str] = {
    "sort": "sort-based threshold (alpha in {1, 1.5, 2} only), polished by Newton on the exact support",
    "bisect": "bisection of the threshold on the reference bracket to the last bit of float64",
    "newton": "safeguarded Newton for every alpha (no closed forms, no lower bound)",
}

#: What ``method=None`` (the engine's exact default) is on each built-in backend.
DEFAULTS: dict[str, str] = {
    "numpy": "sort (alpha in {1, 1.5, 2}), bisect otherwise",
    "numba": "Condat / pivot closed forms, then safeguarded Newton to full precision",
    "cupy": "Newton with exact-support termination (alpha in {1.5, 2}), last-bit root finder otherwise",
}

_ROW = (None,)  # operations with no algorithm choice
#: operation -> backend -> the ``method=`` values it accepts (``None`` is the default).
CAPABILITIES: dict[str, dict[str, tuple]] = {
    "entmax_forward": {
        "numpy": (None, "sort", "bisect"),
        "numba": (None, "newton", "bisect"),
        "cupy": (None, "bisect"),
    },
    "entmax_vjp": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "entmax_alpha_vjp": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "attention_forward": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "attention_backward": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "normmax_forward": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "normmax_vjp": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "budget_forward": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
    "budget_vjp": {"numpy": _ROW, "numba": _ROW, "cupy": _ROW},
}


def _op(op: str) -> dict[str, tuple]:
    if op not in CAPABILITIES:
        raise ValueError(f"unknown operation {op!r}; known: {', '.join(CAPABILITIES)}")
    return CAPABILITIES[op]


def methods(backend: str, op: str) -> tuple:
    """The ``method=`` values ``backend`` accepts for ``op`` (empty if it lacks ``op``)."""
    return _op(op).get(backend, ())


def backends_with(op: str, method: str | None = None) -> list[str]:
    """The backends in the table that run ``op`` with ``method``."""
    return [name for name, ms in _op(op).items() if method in ms]


def pairs(op: str = "entmax_forward") -> list[tuple[str, str | None]]:
    """Every ``(backend, method)`` pair in the table for ``op`` (the tests run each one)."""
    return [(name, m) for name, ms in _op(op).items() for m in ms]


def _fmt(methods_: tuple) -> str:
    return ", ".join(repr(m) for m in methods_)


def require(backend: str, op: str, method: str | None = None) -> None:
    """Raise unless ``backend`` runs ``op`` with ``method``.

    Raises
    ------
    ValueError
        ``method`` is not a method name at all (the message lists the valid ones for this
        backend and operation).
    NotImplementedError
        ``method`` exists, but not on ``backend`` (the message names where it exists), or
        ``backend`` does not implement ``op``.
    """
    table = _op(op)
    if backend not in table and not any(backend in t for t in CAPABILITIES.values()):
        return  # a backend registered at run time without a table entry checks for itself
    have = table.get(backend, ())
    if method in have:
        return
    if not have:
        raise NotImplementedError(f"the {backend} backend does not implement {op}; it exists on: "
                                  f"{', '.join(backends_with(op)) or 'no backend'}")
    known = {m for ms in table.values() for m in ms} | set(METHODS) | {None}
    if method not in known:
        raise ValueError(f"unknown method {method!r} for {op} on the {backend} backend; valid methods: {_fmt(have)}")
    where = backends_with(op, method)
    raise NotImplementedError(
        f"method {method!r} is not available on the {backend} backend (it has {_fmt(have)}); "
        f"{method!r} exists on: {', '.join(where) or 'no backend'}"
    )


def add_backend(name: str, capabilities: Mapping[str, tuple]) -> None:
    """Enter a run-time backend's ``{op: methods}`` into the table (``register_backend``)."""
    for op in capabilities:
        _op(op)
    for table in CAPABILITIES.values():
        table.pop(name, None)
    for op, ms in capabilities.items():
        CAPABILITIES[op][name] = tuple(ms)


def remove_backend(name: str) -> None:
    """Drop ``name`` from every row of the table."""
    for table in CAPABILITIES.values():
        table.pop(name, None)


def markdown_table(backends: tuple[str, ...] = ("numpy", "numba", "cupy")) -> str:
    """The capability table as the markdown shown in ``docs/guides/backends.md``."""
    lines = ["| operation | " + " | ".join(f"`{b}`" for b in backends) + " |",
             "|---|" + "---|" * len(backends)]
    for op, table in CAPABILITIES.items():
        cells = []
        for b in backends:
            ms = table.get(b)
            cells.append("-" if ms is None else ", ".join("`None`" if m is None else f'`"{m}"`' for m in ms))
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
