"""Tools for testing entmax implementations against this reference.

``entmax_ref.testing.strategies`` holds Hypothesis strategies (needs ``hypothesis``, from
the ``test`` extra); it is imported on demand, so ``import entmax_ref.testing`` does not
require Hypothesis.
"""
