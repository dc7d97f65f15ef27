"""The row functions that the differentiable adapters wrap, one table for the torch and the
JAX adapter tests (test_torch_adapter.py, test_jax_adapter.py)."""

from __future__ import annotations

import subprocess
import sys

import entmax_ref as er

#: case name -> (the function's name, its arguments after x)
ROW_CASES = {
    "softmax": ("softmax", ()),
    "sparsemax": ("sparsemax", ()),
    "entmax15": ("entmax15", ()),
    "entmax alpha=1.3": ("entmax", (1.3,)),
    "entmax alpha=2.5": ("entmax", (2.5,)),
    "normmax": ("normmax", ()),
    "budget_sparsemax": ("budget_sparsemax", (0.5,)),
}


def row_pairs(adapter):
    """case name -> (the adapter module's function, the library's), each called as
    ``f(x, **kwargs)`` with the case's arguments bound."""
    def bind(module, name, args):
        fn = getattr(module, name)
        return (lambda x, **kw: fn(x, *args, **kw)) if args else fn

    return {case: (bind(adapter, name, args), bind(er, name, args)) for case, (name, args) in ROW_CASES.items()}


def message_without(framework: str) -> str:
    """What ``import entmax_ref.<framework>`` says in a fresh process where the framework
    cannot be imported, once it is checked there that ``import entmax_ref`` imports no
    framework."""
    code = (f"import sys; import entmax_ref; assert {framework!r} not in sys.modules, '{framework} imported'; "
            f"sys.modules[{framework!r}] = None\n"
            f"try:\n    import entmax_ref.{framework}\nexcept ImportError as e:\n    print(e)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
