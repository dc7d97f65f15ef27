"""The family oracles live in the package (one copy): :mod:`entmax_ref.testing.family_oracle`."""

from entmax_ref.testing.family_oracle import DPS, budget_exact, budget_np, mp, normmax_mp, normmax_np  # noqa: F401
