# Type hints of the public API (PEP 561; the package ships py.typed).  The runtime module
# is entmax_ref/__init__.py; tests/test_typing_stub.py checks that the two agree (names,
# parameters) and CI type-checks a usage example against this stub (python -m mypy).
#
# Arrays: inputs are anything array-like (NumPy arrays, nested lists, scalars; CuPy arrays
# on the cupy backend).  Results are NumPy arrays for NumPy input and arrays of the
# caller's framework otherwise, hence ``Array`` (= Any) for results.
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, overload

from numpy.typing import ArrayLike, NDArray
import numpy as np

from . import backends as backends
from . import testing as testing
from .asentmax import ASEntmaxInfo as ASEntmaxInfo
from .attention import AttentionGradients as AttentionGradients
from .attention import AttentionInfo as AttentionInfo
from .backends import Backend, BackendUnavailableError as BackendUnavailableError
from .diagnostics import RowDiagnostics as RowDiagnostics
from .family import BudgetInfo as BudgetInfo
from .family import NormmaxInfo as NormmaxInfo
from .transforms import EntmaxInfo as EntmaxInfo

Array = Any
BackendArg = str | Backend | None
Method = Literal["sort", "bisect", "newton"] | None

__version__: str
__all__: list[str]

class _FixedAlpha(Protocol):
    """softmax, sparsemax and entmax15: alpha-entmax at a fixed alpha (one signature)."""
    @overload
    def __call__(self, x: ArrayLike, axis: int = ..., *, backend: BackendArg = ...,
                 return_info: Literal[False] = ..., check_finite: bool = ...) -> Array: ...
    @overload
    def __call__(self, x: ArrayLike, axis: int = ..., *, backend: BackendArg = ..., return_info: Literal[True],
                 check_finite: bool = ...) -> tuple[Array, EntmaxInfo]: ...

# transforms
@overload
def entmax(x: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, method: Method = ..., backend: BackendArg = ...,
           return_info: Literal[False] = ..., check_finite: bool = ...) -> Array: ...
@overload
def entmax(x: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, method: Method = ..., backend: BackendArg = ...,
           return_info: Literal[True], check_finite: bool = ...) -> tuple[Array, EntmaxInfo]: ...
softmax: _FixedAlpha
sparsemax: _FixedAlpha
entmax15: _FixedAlpha
def entmax_threshold(x: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, method: Method = ...,
                     backend: BackendArg = ..., check_finite: bool = ...) -> Array: ...

# alpha-normmax and budget-sparsemax
@overload
def normmax(x: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, backend: BackendArg = ...,
            return_info: Literal[False] = ..., check_finite: bool = ...) -> Array: ...
@overload
def normmax(x: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, backend: BackendArg = ...,
            return_info: Literal[True], check_finite: bool = ...) -> tuple[Array, NormmaxInfo]: ...
def normmax_vjp(p: ArrayLike, grad: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                backend: BackendArg = ...) -> Array: ...
def normmax_loss(x: ArrayLike, target: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                 backend: BackendArg = ...) -> Array: ...
def normmax_loss_grad(x: ArrayLike, target: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                      backend: BackendArg = ...) -> Array: ...
@overload
def budget_sparsemax(x: ArrayLike, budget: ArrayLike = ..., axis: int = ..., *, backend: BackendArg = ...,
                     return_info: Literal[False] = ..., check_finite: bool = ...) -> Array: ...
@overload
def budget_sparsemax(x: ArrayLike, budget: ArrayLike = ..., axis: int = ..., *, backend: BackendArg = ...,
                     return_info: Literal[True], check_finite: bool = ...) -> tuple[Array, BudgetInfo]: ...
def budget_sparsemax_vjp(p: ArrayLike, grad: ArrayLike, budget: ArrayLike = ..., axis: int = ..., *,
                         backend: BackendArg = ...) -> Array: ...

# gradients and losses
def entmax_vjp(p: ArrayLike, grad: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
               backend: BackendArg = ...) -> Array: ...
def entmax_alpha_vjp(p: ArrayLike, grad: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                     backend: BackendArg = ...) -> Array: ...
def entmax_jacobian(p: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *, backend: BackendArg = ...) -> Array: ...
def entmax_loss(x: ArrayLike, target: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                backend: BackendArg = ...) -> Array: ...
def entmax_loss_grad(x: ArrayLike, target: ArrayLike, alpha: ArrayLike = ..., axis: int = ..., *,
                     backend: BackendArg = ...) -> Array: ...

# ASEntmax and SSMax
def asentmax_scale(n: ArrayLike, beta: ArrayLike, gamma: ArrayLike, delta: ArrayLike = ...,
                   offset: ArrayLike = ...) -> Array: ...
def asentmax_scale_vjp(grad_s: ArrayLike, n: ArrayLike, beta: ArrayLike, gamma: ArrayLike, delta: ArrayLike = ...,
                       offset: ArrayLike = ...) -> Any: ...
@overload
def asentmax(x: ArrayLike, alpha: ArrayLike = ..., *, beta: ArrayLike, gamma: ArrayLike, delta: ArrayLike = ...,
             offset: ArrayLike = ..., axis: int = ..., backend: BackendArg = ...,
             return_info: Literal[False] = ...) -> Array: ...
@overload
def asentmax(x: ArrayLike, alpha: ArrayLike = ..., *, beta: ArrayLike, gamma: ArrayLike, delta: ArrayLike = ...,
             offset: ArrayLike = ..., axis: int = ..., backend: BackendArg = ...,
             return_info: Literal[True]) -> tuple[Array, ASEntmaxInfo]: ...
def asentmax_vjp(grad: ArrayLike, x: ArrayLike, alpha: ArrayLike = ..., *, beta: ArrayLike, gamma: ArrayLike,
                 delta: ArrayLike = ..., offset: ArrayLike = ..., p: ArrayLike | None = ..., axis: int = ...,
                 backend: BackendArg = ...) -> Any: ...
@overload
def ssmax(x: ArrayLike, *, beta: ArrayLike, offset: ArrayLike = ..., axis: int = ..., backend: BackendArg = ...,
          return_info: Literal[False] = ...) -> Array: ...
@overload
def ssmax(x: ArrayLike, *, beta: ArrayLike, offset: ArrayLike = ..., axis: int = ..., backend: BackendArg = ...,
          return_info: Literal[True]) -> tuple[Array, ASEntmaxInfo]: ...
def ssmax_vjp(grad: ArrayLike, x: ArrayLike, *, beta: ArrayLike, offset: ArrayLike = ..., p: ArrayLike | None = ...,
              axis: int = ..., backend: BackendArg = ...) -> Any: ...

# attention
@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, alpha: float | ArrayLike = ..., scale: float | None = ...,
              causal: bool = ..., key_lengths: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
              beta: ArrayLike | None = ..., gamma: ArrayLike | None = ..., delta: ArrayLike = ...,
              offset: ArrayLike = ..., chunk: int | None = ..., return_info: Literal[False] = ...,
              backend: BackendArg = ..., key_padding_mask: ArrayLike | None = ...,
              check_finite: bool = ...) -> Array: ...
@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, alpha: float | ArrayLike = ..., scale: float | None = ...,
              causal: bool = ..., key_lengths: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
              beta: ArrayLike | None = ..., gamma: ArrayLike | None = ..., delta: ArrayLike = ...,
              offset: ArrayLike = ..., chunk: int | None = ..., return_info: Literal[True],
              backend: BackendArg = ..., key_padding_mask: ArrayLike | None = ...,
              check_finite: bool = ...) -> tuple[Array, AttentionInfo]: ...
def attention_vjp(grad_out: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, *, info: AttentionInfo | None = ...,
                  out: ArrayLike | None = ..., tau: ArrayLike | None = ..., alpha: float | ArrayLike = ...,
                  scale: float | None = ..., causal: bool = ..., key_lengths: ArrayLike | None = ...,
                  alibi_slopes: ArrayLike | None = ..., beta: ArrayLike | None = ..., gamma: ArrayLike | None = ...,
                  delta: ArrayLike = ..., offset: ArrayLike = ..., chunk: int | None = ..., backend: BackendArg = ...,
                  key_padding_mask: ArrayLike | None = ..., check_finite: bool = ...) -> AttentionGradients: ...
def keys_visible(nq: int, nk: int, *, causal: bool = ..., key_lengths: ArrayLike | None = ...,
                 batch: int = ..., key_padding_mask: ArrayLike | None = ...) -> NDArray[np.int64]: ...
@overload
def attention_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     alpha: float | ArrayLike = ..., scale: float | None = ..., causal: bool = ...,
                     alibi_slopes: ArrayLike | None = ..., beta: ArrayLike | None = ..., gamma: ArrayLike | None = ...,
                     delta: ArrayLike = ..., offset: ArrayLike = ..., chunk: int | None = ...,
                     return_info: Literal[False] = ..., backend: BackendArg = ...,
                     check_finite: bool = ...) -> Array: ...
@overload
def attention_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
                     alpha: float | ArrayLike = ..., scale: float | None = ..., causal: bool = ...,
                     alibi_slopes: ArrayLike | None = ..., beta: ArrayLike | None = ..., gamma: ArrayLike | None = ...,
                     delta: ArrayLike = ..., offset: ArrayLike = ..., chunk: int | None = ...,
                     return_info: Literal[True], backend: BackendArg = ...,
                     check_finite: bool = ...) -> tuple[Array, AttentionInfo]: ...
def attention_varlen_vjp(grad_out: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                         cu_seqlens_k: ArrayLike, *, info: AttentionInfo | None = ..., out: ArrayLike | None = ...,
                         tau: ArrayLike | None = ..., alpha: float | ArrayLike = ..., scale: float | None = ...,
                         causal: bool = ..., alibi_slopes: ArrayLike | None = ..., beta: ArrayLike | None = ...,
                         gamma: ArrayLike | None = ..., delta: ArrayLike = ..., offset: ArrayLike = ...,
                         chunk: int | None = ..., backend: BackendArg = ...,
                         check_finite: bool = ...) -> AttentionGradients: ...

# diagnostics
def normalized_entropy(p: ArrayLike, *, n: ArrayLike | None = ..., scores: ArrayLike | None = ...,
                       axis: int = ...) -> Array: ...
def support_size(p: ArrayLike, *, axis: int = ...) -> Array: ...
def max_probability(p: ArrayLike, *, axis: int = ...) -> Array: ...
def mass_on(p: ArrayLike, positions: ArrayLike, *, axis: int = ...) -> Array: ...
def row_diagnostics(p: ArrayLike, *, n: ArrayLike | None = ..., scores: ArrayLike | None = ...,
                    positions: ArrayLike | None = ..., axis: int = ...) -> RowDiagnostics: ...

# backends
def available_backends() -> list[str]: ...
def get_backend(name: str) -> Backend: ...
def use_backend(name: str) -> AbstractContextManager[Backend | None]: ...
