"""The fields of each corpus file: their JSON type and their role (input, expected value,
tolerance, diagnostic).  One table, read by the writer (which fields get a ``_hex`` sibling,
what a case's id is a digest of), by the JSON Schemas (:mod:`.schema`) and by the replay.

A spec entry is ``name:type:role``.  Types: ``num`` (a number string), ``vec`` (a list of
them), ``mat`` (a list of lists of them), ``t4`` (four levels of lists: an attention tensor), ``int``, ``bool``, ``ints`` (a list of integers),
``bools2`` (a list of lists of booleans), ``shape`` (the attention sizes); a ``?`` after the
type allows null.  Roles: ``in`` (an input written in the case's dtype), ``param`` (a float64
or integer input), ``out`` (an expected value), ``tol`` (its tolerance), ``info`` (a
diagnostic of the generator, not compared).
"""

from __future__ import annotations

from typing import NamedTuple

_ROW = "x:vec:in n:int:param"
_ORACLE = "oracle_err:num:info within_tol_of_oracle:bool:info"
_ATTN = ("alpha:num:param shape:shape:param q:t4:in k:t4:in v:t4:in scale:num:param causal:bool:param "
         "key_lengths:ints?:param key_padding_mask:bools2?:param alibi_slopes:vec?:param beta:mat?:param "
         "gamma:mat?:param delta:num:param offset:num:param")

_SPEC = {
    "entmax": f"alpha:num:param {_ROW} p:vec:out tau:num:out support:int:out tol_p:vec:tol tol_tau:num:tol "
              f"{_ORACLE} reaches_oracle:bool:info",
    "entmax_vjp": f"alpha:num:param {_ROW} p:vec:param grad:vec:in dx:vec:out tol_dx:num:tol ill_posed:bool:info "
                  f"{_ORACLE}",
    "entmax_alpha_vjp": f"alpha:num:param {_ROW} p:vec:param grad:vec:in dalpha:num:out tol_dalpha:num:tol "
                        f"ill_posed:bool:info {_ORACLE}",
    "entmax_loss": f"alpha:num:param {_ROW} target:int:param loss:num:out tol_loss:num:tol grad:vec:out "
                   f"tol_grad:vec:tol {_ORACLE}",
    "normmax": f"alpha:num:param {_ROW} p:vec:out tau:num:out support:int:out tol_p:vec:tol tol_tau:num:tol {_ORACLE}",
    "normmax_vjp": f"alpha:num:param {_ROW} p:vec:param grad:vec:in dx:vec:out tol_dx:num:tol ill_posed:bool:info "
                   f"{_ORACLE}",
    "budget_sparsemax": f"budget:num:param {_ROW} p:vec:out tau:num:info support:int:out tol_p:vec:tol {_ORACLE}",
    "budget_sparsemax_vjp": f"budget:num:param {_ROW} p:vec:param grad:vec:in dx:vec:out tol_dx:vec:tol "
                            f"ill_posed:bool:info {_ORACLE}",
    "asentmax_scale": "n:int:param beta:num:param gamma:num:param delta:num:param offset:num:param s:num:out "
                      "dbeta:num:out dgamma:num:out ddelta:num:out tol_s:num:tol tol_dbeta:num:tol "
                      "tol_dgamma:num:tol tol_ddelta:num:tol oracle_err:num:info",
    "attention": f"{_ATTN} out:t4:out tol_out:t4:tol",
    "attention_vjp": f"{_ATTN} grad_out:t4:in dq:t4:out dk:t4:out dv:t4:out tol_dq:t4:tol tol_dk:t4:tol tol_dv:t4:tol",
}

#: the fields every line has, whatever its file (besides those of :data:`FIELDS`)
COMMON = ("schema", "tcId", "op", "kind", "flags", "dtype", "tol", "why")
#: types whose values are numbers written as strings (and so get a ``_hex`` sibling)
NUMERIC = ("num", "vec", "mat", "t4")


class Field(NamedTuple):
    name: str
    type: str  #: without the "?"
    nullable: bool
    role: str


def _parse(spec: str) -> tuple[Field, ...]:
    out = []
    for item in spec.split():
        name, typ, role = item.split(":")
        out.append(Field(name, typ.rstrip("?"), typ.endswith("?"), role))
    return tuple(out)


#: file kind (the operation that writes it) -> its fields, in the order they are written
FIELDS: dict[str, tuple[Field, ...]] = {op: _parse(spec) for op, spec in _SPEC.items()}


def outputs(op: str) -> tuple[str, ...]:
    """The expected-value fields of ``op``'s cases (each has a tolerance class in ``tol``)."""
    return tuple(f.name for f in FIELDS[op] if f.role == "out")


def numeric(op: str) -> tuple[Field, ...]:
    """The fields of ``op`` written as number strings (each with a ``_hex`` sibling)."""
    return tuple(f for f in FIELDS[op] if f.type in NUMERIC)


def inputs(op: str) -> tuple[str, ...]:
    """The fields a case of ``op`` is identified by (its ``tcId`` is their digest)."""
    return ("dtype",) + tuple(f.name for f in FIELDS[op] if f.role in ("in", "param"))
