"""The bit-for-bit comparison of a row's answer with a correctly rounded oracle's, shared by
the oracle tests of the rows (``tests/test_exact_rows.py``, ``tests/test_exact_normmax.py``)."""

from __future__ import annotations

import numpy as np


def hexs(a) -> str:
    return "[" + ", ".join(float(v).hex() for v in np.ravel(a)) + "]"


def assert_same_row(where: str, got, want) -> None:
    """``got = (p, tau, support)`` equals ``want`` bit for bit (p in the same dtype); a
    failure names ``where`` and prints the hex of got and want."""
    got_p, got_tau, got_k = got
    want_p, want_tau, want_k = want
    assert got_k == want_k, f"{where}\nsupport: got {got_k}, want {want_k}\ngot p  {hexs(got_p)}\nwant p {hexs(want_p)}"
    assert got_p.dtype == want_p.dtype
    bits = np.int64 if got_p.dtype == np.float64 else np.int32
    bad = np.flatnonzero(got_p.view(bits) != want_p.view(bits))
    assert not bad.size, (f"{where}\np at {bad.tolist()}: got {hexs(got_p[bad])}, want {hexs(want_p[bad])}\n"
                          f"got p  {hexs(got_p)}\nwant p {hexs(want_p)}")
    assert got_tau == want_tau, f"{where}\ntau: got {float(got_tau).hex()}, want {float(want_tau).hex()}"
