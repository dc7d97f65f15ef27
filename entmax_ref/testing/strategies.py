"""Hypothesis strategies for entmax property tests (yours and ours).

>>> from hypothesis import given
>>> from entmax_ref.testing.strategies import score_arrays, alphas
>>> @given(score_arrays(), alphas())
... def test_simplex(x, alpha):
...     ...
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = ["alpha_columns", "alphas", "attention_problems", "score_arrays", "score_rows"]

#: alphas every suite should hit: softmax, near-softmax, the paper's 1.5, sparsemax, beyond.
SPECIAL_ALPHAS = (1.0, 1.0 + 1e-6, 1.25, 1.33, 1.5, 2.0, 3.0)


def alphas(min_value: float = 1.0, max_value: float = 4.0) -> st.SearchStrategy[float]:
    """alpha values in [min_value, max_value], biased towards the special ones."""
    special = [a for a in SPECIAL_ALPHAS if min_value <= a <= max_value]
    return st.one_of(st.sampled_from(special), st.floats(min_value, max_value))


@st.composite
def score_rows(draw, *, dtype=np.float64, min_n: int = 1, max_n: int = 24, max_rows: int = 4,
               magnitude: float = 1e3, ties: bool = True, masks: bool = True, offsets: bool = True):
    """A 2-D (rows, n) array of scores.

    Rows mix continuous values, values drawn from a coarse grid (multiples of 1/4, which
    produce exact ties, including ties at the threshold), -inf masks (sometimes all of a
    row), and a large common offset per row (entmax is shift invariant, so this tests the
    max shift).
    """
    dtype = np.dtype(dtype)
    rows = draw(st.integers(1, max_rows))
    n = draw(st.integers(min_n, max_n))
    width = 32 if dtype == np.float32 else 64
    cont = st.floats(-magnitude, magnitude, width=width, allow_subnormal=False)
    grid = st.integers(-8, 8).map(lambda k: k / 4)
    elems = st.one_of(cont, grid) if ties else cont
    x = draw(hnp.arrays(np.float64, (rows, n), elements=elems))
    if masks and draw(st.booleans()):
        mask = draw(hnp.arrays(np.bool_, (rows, n), elements=st.booleans()))
        x = np.where(mask, -np.inf, x)
    if offsets and draw(st.booleans()):
        x = x + draw(st.sampled_from([1e3, -1e4, 1e6]))
    return x.astype(dtype)


def score_arrays(**kwargs):
    """Like :func:`score_rows`, returned with an extra leading axis at random (3-D) so that
    axis handling gets exercised; use ``axis=-1``."""
    return score_rows(**kwargs).flatmap(
        lambda x: st.sampled_from([x, x[None], x[:, None, :]])
    )


@st.composite
def alpha_columns(draw, rows: int, *, min_value: float = 1.0, max_value: float = 4.0):
    """A (rows,) float64 array of per-row alphas (for batched-alpha properties)."""
    return np.array([draw(alphas(min_value, max_value)) for _ in range(rows)], dtype=np.float64)


@st.composite
def attention_problems(draw, *, dtype=np.float64, max_batch: int = 2, max_heads: int = 4, max_len: int = 19,
                       max_dim: int = 8, causal: bool | None = None, gqa: bool = True, key_lengths: bool = True,
                       alibi: bool = True, asentmax: bool = False):
    """An attention problem ``(q, k, v, kwargs)`` for :func:`entmax_ref.attention`.

    Sizes are irregular (any length up to ``max_len``, Nq != Nk), heads may be grouped
    (Hq a multiple of Hkv), and kwargs may hold ``causal`` (drawn when ``causal`` is
    None), ``key_lengths`` (including 0: a batch with nothing to attend), ``alibi_slopes``
    (including NoPE heads with slope 0) and per-head ASEntmax ``beta``/``gamma``.
    """
    dtype = np.dtype(dtype)
    B = draw(st.integers(1, max_batch))
    Hkv = draw(st.integers(1, max(1, max_heads // 2)))
    Hq = Hkv * (draw(st.integers(1, 2)) if gqa else 1)
    Nq, Nk = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    D, Dv = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))
    el = st.floats(-3, 3, width=32 if dtype == np.float32 else 64, allow_subnormal=False)
    q = draw(hnp.arrays(dtype, (B, Hq, Nq, D), elements=el))
    k = draw(hnp.arrays(dtype, (B, Hkv, Nk, D), elements=el))
    v = draw(hnp.arrays(dtype, (B, Hkv, Nk, Dv), elements=el))
    kw: dict = {"causal": draw(st.booleans()) if causal is None else causal}
    if key_lengths and draw(st.booleans()):
        kw["key_lengths"] = np.array([draw(st.integers(0, Nk)) for _ in range(B)])
    if alibi and draw(st.booleans()):
        kw["alibi_slopes"] = np.array([draw(st.sampled_from([0.0, 0.0625, 0.25, 1.0])) for _ in range(Hq)])
    if asentmax and draw(st.booleans()):
        kw["beta"] = np.array([[draw(st.floats(0.1, 2.0))] for _ in range(Hq)])
        kw["gamma"] = np.array([[draw(st.floats(0.25, 2.0))] for _ in range(Hq)])
    return q, k, v, kw
