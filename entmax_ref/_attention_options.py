"""The options of an attention call, as one frozen record.

:class:`AttentionOptions` holds every keyword of :func:`entmax_ref.attention` but the arrays
q, k, v and what selects the output (``return_info``): alpha, the scale, the masks, ALiBi,
the ASEntmax parameters, the chunk, the engine and ``check_finite``.  The public functions
(``attention``, ``attention_vjp``, ``attention_varlen``, ``attention_varlen_vjp``) build it
from their keywords, the torch and JAX adapters pass it through their operations, and
``attention._prepare`` validates it and builds the engines' ``AttentionSpec`` from it (the
one place that does).

The record holds the options as the caller gave them (numbers, arrays of any type, None).
An adapter encodes a call's options (:meth:`AttentionOptions.encode`) as the values that
are arrays, which travel as the framework's tensors (the differentiable ones among them:
alpha, beta, gamma, delta), and one string of the others (numbers, bools, strings, None;
each float as the shortest string that reads back as the same float), a static, hashable
argument of a torch operation or of a JAX ``custom_vjp``; :meth:`AttentionOptions.join`
builds the record again from both.  The encoding uses only what ``torch.compile`` traces
(``isinstance``, ``repr``, tuples), so a compiled call keeps its options as constants.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np


@dataclass(frozen=True)
class AttentionOptions:
    """The keywords of an attention call (:func:`entmax_ref.attention` documents each)."""

    alpha: Any = 1.5
    scale: Any = None
    causal: Any = False
    key_lengths: Any = None
    key_padding_mask: Any = None
    alibi_slopes: Any = None
    beta: Any = None
    gamma: Any = None
    delta: Any = 1.0
    offset: Any = 1.0
    chunk: Any = None
    backend: Any = None
    check_finite: Any = True

    #: the field names, in order
    FIELDS: ClassVar[tuple] = ("alpha", "scale", "causal", "key_lengths", "key_padding_mask", "alibi_slopes", "beta",
                               "gamma", "delta", "offset", "chunk", "backend", "check_finite")
    #: the options that get a gradient when they are arrays (AttentionGradients.dalpha, ...)
    DIFFERENTIABLE: ClassVar[tuple] = ("alpha", "beta", "gamma", "delta")

    @classmethod
    def of(cls, names: Mapping[str, Any]) -> "AttentionOptions":
        """The options among ``names``, a public function's keyword arguments (its
        ``locals()`` on entry); the ones it does not take keep their defaults."""
        return cls(**{name: names[name] for name in cls.FIELDS if name in names})

    @classmethod
    def encode(cls, names: Mapping[str, Any]) -> tuple[list, str]:
        """``(arrays, static)`` of the options among ``names`` (as :meth:`of` takes them):
        the values that are arrays (anything but None, a bool, a number or a string: a list
        too), in field order, and a string of every other option that also names those
        arrays, so that :meth:`join` needs only their values."""
        defaults = cls()
        arrays, array_names, scalars = [], [], []
        for name in cls.FIELDS:
            value = names[name] if name in names else getattr(defaults, name)
            if _is_scalar(value):
                scalars.append((name, *_scalar_text(value)))
            else:
                arrays.append(value)
                array_names.append(name)
        return arrays, repr((tuple(scalars), tuple(array_names)))

    @classmethod
    def join(cls, static: str, arrays: Any) -> "AttentionOptions":
        """The record whose options :meth:`encode` gave as ``static`` and ``arrays``."""
        scalars, array_names = ast.literal_eval(static)
        values = {name: _SCALARS[kind](text) for name, kind, text in scalars}
        return cls(**values, **dict(zip(array_names, arrays)))

    @staticmethod
    def arrays_of(static: str) -> tuple:
        """The names of the array options that :meth:`encode` gave with ``static``, in order."""
        return tuple(ast.literal_eval(static)[1])


def _is_scalar(v: Any) -> bool:
    """None, a bool, a number or a string, Python's or NumPy's (not an array, not a list)."""
    return v is None or isinstance(v, (bool, int, float, str, np.bool_, np.number))


def _scalar_text(v: Any) -> tuple[str, str]:
    """(kind, text) of a scalar option: its Python value as text that reads back exactly."""
    if isinstance(v, np.generic):
        v = v.item()  # the Python value a NumPy scalar holds (a bool stays a bool)
    if v is None:
        return "none", ""
    if isinstance(v, bool):
        return "bool", repr(v)
    if isinstance(v, int):
        return "int", repr(v)
    if isinstance(v, float):
        return "float", repr(v)  # the shortest text float() reads back bit for bit (inf, nan too)
    return "str", repr(v)


_SCALARS = {"none": lambda text: None, "bool": lambda text: text == "True", "int": int, "float": float,
            "str": ast.literal_eval}
