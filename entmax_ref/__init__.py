"""entmax-ref: exact, framework-free reference implementations of alpha-entmax, ASEntmax
and sparse attention, with interchangeable NumPy / Numba / CuPy backends.

>>> import entmax_ref as er
>>> er.sparsemax([-2.0, 0.0, 0.5]).tolist()
[0.0, 0.25, 0.75]
"""

from .backends import BackendUnavailableError, available_backends, get_backend, use_backend
from .gradients import entmax_alpha_vjp, entmax_jacobian, entmax_vjp
from .losses import entmax_loss, entmax_loss_grad
from .transforms import EntmaxInfo, entmax, entmax15, entmax_threshold, softmax, sparsemax

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "EntmaxInfo",
    "available_backends",
    "entmax",
    "entmax15",
    "entmax_alpha_vjp",
    "entmax_jacobian",
    "entmax_loss",
    "entmax_loss_grad",
    "entmax_threshold",
    "entmax_vjp",
    "get_backend",
    "softmax",
    "sparsemax",
    "use_backend",
]
