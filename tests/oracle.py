"""The tests' 50-digit oracle: one copy, in the package (entmax_ref.testing.oracle)."""

from entmax_ref.testing.oracle import DPS, edge_row, entmax_mp  # noqa: F401
