"""entmax-ref: exact, framework-free reference implementations of alpha-entmax, ASEntmax
and sparse attention, with interchangeable NumPy / Numba / CuPy backends.

>>> import entmax_ref as er
>>> er.sparsemax([-2.0, 0.0, 0.5]).tolist()
[0.0, 0.25, 0.75]
"""

import os as _os

# In a source checkout the engines live in the top-level ``backends/`` folder, which an
# install maps to ``entmax_ref.backends``.  When this package is imported from the clone
# itself (its root on sys.path, any install or none), let ``entmax_ref.backends`` resolve
# to that folder, so the source tree never shadows a working install with a broken one.
# Only ``backends`` is mapped (the clone's root is not added to ``__path__``: that made every
# top-level folder, ``entmax_ref`` itself included, a subpackage, and pkgutil.walk_packages
# recursed without end).
_here = _os.path.dirname(_os.path.abspath(__file__))
_src = _os.path.join(_os.path.dirname(_here), "backends")
if not _os.path.isdir(_os.path.join(_here, "backends")) and _os.path.isfile(_os.path.join(_src, "_base.py")):
    import importlib.util as _ilu
    import sys as _sys

    if __name__ + ".backends" not in _sys.modules:
        _spec = _ilu.spec_from_file_location(__name__ + ".backends", _os.path.join(_src, "__init__.py"),
                                             submodule_search_locations=[_src])
        _mod = _ilu.module_from_spec(_spec)
        _sys.modules[_spec.name] = _mod
        try:
            _spec.loader.exec_module(_mod)
        except BaseException:
            del _sys.modules[_spec.name]
            raise
    backends = _sys.modules[__name__ + ".backends"]  # as an import would bind it
    del _ilu, _sys
del _here, _src

from .asentmax import (
    ASEntmaxInfo,
    asentmax,
    asentmax_scale,
    asentmax_scale_vjp,
    asentmax_vjp,
    ssmax,
    ssmax_vjp,
)
from .attention import AttentionGradients, AttentionInfo, attention, attention_vjp, keys_visible
from .backends import BackendUnavailableError, available_backends, get_backend, use_backend
from .diagnostics import (
    RowDiagnostics,
    mass_on,
    max_probability,
    normalized_entropy,
    row_diagnostics,
    support_size,
)
from .family import (
    BudgetInfo,
    NormmaxInfo,
    budget_sparsemax,
    budget_sparsemax_vjp,
    normmax,
    normmax_loss,
    normmax_loss_grad,
    normmax_vjp,
)
from .gradients import entmax_alpha_vjp, entmax_jacobian, entmax_vjp
from .losses import entmax_loss, entmax_loss_grad
from .transforms import EntmaxInfo, entmax, entmax15, entmax_threshold, softmax, sparsemax
from .varlen import attention_varlen, attention_varlen_vjp

__version__ = "0.1.0"

__all__ = [
    "ASEntmaxInfo",
    "AttentionGradients",
    "AttentionInfo",
    "BackendUnavailableError",
    "BudgetInfo",
    "EntmaxInfo",
    "NormmaxInfo",
    "RowDiagnostics",
    "asentmax",
    "asentmax_scale",
    "asentmax_scale_vjp",
    "asentmax_vjp",
    "attention",
    "attention_varlen",
    "attention_varlen_vjp",
    "attention_vjp",
    "available_backends",
    "budget_sparsemax",
    "budget_sparsemax_vjp",
    "entmax",
    "entmax15",
    "entmax_alpha_vjp",
    "entmax_jacobian",
    "entmax_loss",
    "entmax_loss_grad",
    "entmax_threshold",
    "entmax_vjp",
    "get_backend",
    "keys_visible",
    "mass_on",
    "max_probability",
    "normalized_entropy",
    "normmax",
    "normmax_loss",
    "normmax_loss_grad",
    "normmax_vjp",
    "row_diagnostics",
    "softmax",
    "sparsemax",
    "ssmax",
    "ssmax_vjp",
    "support_size",
    "use_backend",
]
