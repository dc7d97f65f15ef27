"""The fields of each corpus file: their JSON type and their role (input, expected value,
tolerance).  One table, read by the writer (which fields get a ``_hex`` sibling, what a
case's id is a digest of), by the JSON Schemas (:mod:`.schema`), by the replay and by the
manifest (each file's ``id_fields``).

A spec entry is ``name:type:role``.  Types: ``num`` (a number string), ``vec`` (a list of
them), ``mat``, ``t3``, ``t4`` (two, three, four levels of lists: a matrix, a packed or an
attention tensor), ``arr`` (a number string or lists of them, any depth: a parameter that
broadcasts), ``int``, ``bool``, ``ints`` (a list of integers), ``bools2`` (a list of lists of
booleans), ``shape`` and ``vshape`` (the attention sizes), ``error`` (an error class, or
null); a ``?`` after the type allows null.  Roles: ``in`` (an input written in the case's
dtype), ``param`` (a float64 or integer input), ``given`` (an input derived from the others,
offered for implementations that take it: not part of the id), ``out`` (an expected value,
judged by its tolerance class), ``expect`` (an expected outcome compared as it is: the
error class), ``tol`` (the bound of an ``abs:@`` class: present when the class names it).
"""

from __future__ import annotations

from typing import NamedTuple

_ROW = "x:vec:in n:int:param"
_ROW_OUT = "p:vec:out tau:num:out support:int:out tol_p:vec:tol tol_tau:num:tol tol_support:int:tol"
_ATTN = ("alpha:arr:param scale:num:param causal:bool:param alibi_slopes:vec?:param beta:arr?:param "
         "gamma:arr?:param delta:arr:param offset:num:param")
_DENSE = f"shape:shape:param q:t4:in k:t4:in v:t4:in {_ATTN} key_lengths:ints?:param key_padding_mask:bools2?:param"
_PACKED = f"shape:vshape:param q:t3:in k:t3:in v:t3:in cu_seqlens_q:ints:param cu_seqlens_k:ints:param {_ATTN}"
_GRADS = "grad_out:{0}:in dq:{0}:out dk:{0}:out dv:{0}:out tol_dq:{0}:tol tol_dk:{0}:tol tol_dv:{0}:tol"

_SPEC = {
    "entmax": f"alpha:num:param {_ROW} {_ROW_OUT} error:error?:expect",
    "entmax_batch": "alpha:vec:param x:mat:in n:int:param p:mat:out tau:vec:out support:ints:out tol_p:mat:tol "
                    "tol_tau:vec:tol tol_support:ints:tol",
    "entmax_vjp": f"alpha:num:param {_ROW} p:vec:given grad:vec:in dx:vec:out tol_dx:num:tol",
    "entmax_alpha_vjp": f"alpha:num:param {_ROW} p:vec:given grad:vec:in dalpha:num:out tol_dalpha:num:tol",
    "entmax_loss": f"alpha:num:param {_ROW} target:int:param loss:num:out grad:vec:out tol_loss:num:tol "
                   "tol_grad:vec:tol",
    "normmax": f"alpha:num:param {_ROW} {_ROW_OUT}",
    "normmax_vjp": f"alpha:num:param {_ROW} p:vec:given grad:vec:in dx:vec:out tol_dx:num:tol",
    "budget_sparsemax": f"budget:num:param {_ROW} p:vec:out support:int:out tol_p:vec:tol tol_support:int:tol",
    "budget_sparsemax_vjp": f"budget:num:param {_ROW} p:vec:given grad:vec:in dx:vec:out tol_dx:vec:tol",
    "asentmax_scale": "n:int:param beta:num:param gamma:num:param delta:num:param offset:num:param s:num:out "
                      "dbeta:num:out dgamma:num:out ddelta:num:out tol_s:num:tol tol_dbeta:num:tol "
                      "tol_dgamma:num:tol tol_ddelta:num:tol",
    "attention": f"{_DENSE} out:t4:out tol_out:t4:tol",
    "attention_vjp": f"{_DENSE} {_GRADS.format('t4')}",
    "attention_varlen": f"{_PACKED} out:t3:out tol_out:t3:tol",
    "attention_varlen_vjp": f"{_PACKED} {_GRADS.format('t3')}",
}

#: the fields every line has, whatever its file (besides those of :data:`FIELDS`)
COMMON = ("schema", "tcId", "op", "kind", "dtype", "verdict", "flags", "tol", "why")
#: types whose values are numbers written as strings (and so get a ``_hex`` sibling)
NUMERIC = ("num", "vec", "mat", "t3", "t4", "arr")


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


def id_fields(op: str) -> tuple[str, ...]:
    """The fields a case of ``op`` is identified by (its ``tcId`` is their digest): the dtype,
    the inputs and the parameters."""
    return ("dtype",) + tuple(f.name for f in FIELDS[op] if f.role in ("in", "param"))


def inputs_in_dtype(op: str) -> list[str]:
    """The fields of ``op`` whose values are of the case's dtype (the others are float64)."""
    return [f.name for f in numeric(op) if f.role == "in"]
