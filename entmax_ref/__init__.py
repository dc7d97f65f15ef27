"""entmax-ref: exact, framework-free reference implementations of alpha-entmax, ASEntmax
and sparse attention, with interchangeable NumPy / Numba / CuPy backends.

>>> import entmax_ref as er
>>> er.sparsemax([-2.0, 0.0, 0.5]).tolist()
[0.0, 0.25, 0.75]
"""

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
