"""The engines behind :mod:`entmax_ref.torch` and :mod:`entmax_ref.jax`: each public function
of the library as a differentiable operation of a framework, whose backward is the library's
own VJP.

The framework is imported by these modules only: ``import entmax_ref`` imports neither torch
nor JAX.
"""
