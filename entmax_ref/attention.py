"""Multi-head alpha-entmax attention, forward and backward, without a seq x seq matrix.

Scores ``z_ij = s_i * scale * (q_i . k_j) + bias_ij`` and ``o_i = sum_j p_ij v_j`` with
``p_i = alpha-entmax(z_i)`` over the keys row i may attend.  ``s_i`` is the ASEntmax scale
of the query row (:func:`entmax_ref.asentmax_scale` of the number of keys it may attend)
when ``beta``/``gamma`` are given, else 1; ``bias`` is ALiBi.  The math, with the backward
from the threshold and the skewed output, is in docs/attention.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ._repr import short_repr
from . import _validate as V
from ._interop import public
from .asentmax import broadcast_params, real_param, scale_vjp
from .asentmax import row_scale as row_scale_of
from .backends import geometry, resolve_backend
from ._attention_residual import any_big, check_tau, info_alpha, residual_from_info
from ._attention_options import AttentionOptions
from ._attention_shapes import ShapeGuard
from .backends._base import AttentionResidual, AttentionSpec, theta_to_tau
from .backends._base import NonFiniteInput


@dataclass(frozen=True)
class AttentionInfo:
    """Per-row facts of an :func:`attention` call, each shaped (B, Hq, Nq) unless noted.

    Attributes
    ----------
    tau : float64 threshold of the score row, in :func:`entmax_ref.entmax`'s units
        (logsumexp at alpha = 1); -inf for a row with nothing to attend.
    support : int64 number of keys with nonzero probability.
    s : float64 row scale (1 without ASEntmax; NaN for a row with nothing to attend,
        where the ASEntmax scale is undefined).
    n : int64 number of keys the row may attend after the causal and padding masks.
    skew : float64 (B, Hq, Nq, Dv) skewed output sum_j u_ij v_j / sum_j u_ij with
        u = p ** (2 - alpha) (the quantity FlashAttention-style backward kernels keep;
        equal to the output at alpha = 1), 0 on empty rows.
    theta : float64 x-space threshold, p_ij = [1 + (alpha - 1)(z_ij - theta_i)]_+^(1/(alpha-1))
        (exp(z_ij - theta_i) at alpha = 1): the threshold the backend solved, without the
        conversion to tau (which loses relative precision as alpha -> 1); -inf on empty rows.
    row_max, edge, edge_p : float64 the row's largest score m, its smallest support entry
        relative to it c = min_{p_ij > 0} (z_ij - m), and that entry's probability q
        (-inf, -inf, 0 on empty rows).  For alpha > 2 the backward rebuilds p from them,
        as the row solvers write it: theta cannot resolve the support's edge there.
    alpha : float, the alpha of the call, or with alphas that differ between query heads
        the tuple of them, one float per head (checked by :func:`attention_vjp`).
    support_keys : int32 (B, Hq, Nq, W) or None: the numba backend's forward keeps each
        row's support as key indices (ascending, then -1; -2, -1, ... on a row with more than
        max(64, 2 Dv) keys), W the most a row holds, so that its backward computes the scores
        of those keys only, with no q.k product and no search for the support; None from
        the other backends.

    Pass the whole object to ``attention_vjp(..., info=info)``: it is the lossless
    residual of the forward (theta, the edge and the skewed output), so the backward
    solves nothing again and rebuilds every probability exactly as the forward had it.
    """

    tau: Any
    support: Any
    s: Any
    n: Any
    skew: Any
    # the backward's residual (attention_vjp(info=)): kept out of the repr
    theta: Any = field(default=None, repr=False)
    row_max: Any = field(default=None, repr=False)
    edge: Any = field(default=None, repr=False)
    edge_p: Any = field(default=None, repr=False)
    alpha: Any = None  #: a float, or a tuple with one float per query head
    support_keys: Any = field(default=None, repr=False)

    __repr__ = short_repr


class AttentionGradients(NamedTuple):
    """Gradients of :func:`attention_vjp`.  dq, dk, dv are shaped and typed like q, k, v;
    dbeta, dgamma, ddelta are float64 shaped like beta, gamma, delta (None without
    ASEntmax); dalpha is float64 shaped like alpha when alpha was given as an array
    (shape () or (Hq,)), None when it was a Python or NumPy scalar."""

    dq: Any
    dk: Any
    dv: Any
    dbeta: Any = None
    dgamma: Any = None
    ddelta: Any = None
    dalpha: Any = None

    __repr__ = short_repr


@dataclass(frozen=True)
class _Problem:
    q: Any
    k: Any
    v: Any
    spec: AttentionSpec
    backend: Any
    n: np.ndarray  # (B, Hq, Nq) int64
    s_info: np.ndarray  # (B, Hq, Nq) float64
    params: dict | None  # beta, gamma, delta as float64 arrays, offset
    out_dtypes: tuple  # q, k, v
    alpha_shape: tuple | None  # () or (Hq,) when alpha was an array (dalpha wanted), else None
    alpha_b: Any  # alpha as a float, or (1, Hq, 1) float64 when it differs between heads
    kv_unscanned: tuple = ()  # (k, v) as given when the backend's forward scans them for NaN/inf itself


def _tensor(x: Any, name: str, ndim: int, finite: bool = True):
    arr = V.as_array(x, name)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(arr.shape)}")
    cdt, odt = V.compute_dtype(arr, name)
    if finite:
        V.check_finite(arr, name, allow_neg_inf=False)
    return arr, cdt, odt


def _scalar(x: Any, name: str) -> float:
    if type(x) is float and math.isfinite(x):  # a Python float: nothing to convert
        return float(x)
    a = V.real_array(x, name) if V.namespace(x) is np else V.namespace(x).asarray(x)
    if a.ndim != 0 or not V.is_real_dtype(a.dtype) or a.dtype.kind == "b":
        raise ValueError(f"{name} must be a real scalar, got {V.shown(x)!r}")
    val = float(a)
    if not np.isfinite(val):
        raise ValueError(f"{name} must be finite, got {val!r}")
    return val


@public
def keys_visible(nq: int, nk: int, *, causal: bool = False, key_lengths=None, batch: int = 1,
                 key_padding_mask=None) -> np.ndarray:
    """Number of keys each query row may attend, shape (B, 1, Nq), int64.

    Causal masking is bottom-right aligned: query i sees keys j <= i + Nk - Nq.
    ``key_lengths[b]`` keys (a prefix) are valid in batch b; ``key_padding_mask[b, j]``
    (a (B, Nk) bool array) is True where key j of batch b may be attended.  A key counts
    when every given mask allows it.

    >>> import entmax_ref as er
    >>> er.keys_visible(3, 5, causal=True, key_lengths=[4]).tolist()
    [[[3, 4, 4]]]
    >>> er.keys_visible(3, 5, causal=True, key_padding_mask=[[False, False, True, True, True]]).tolist()
    [[[1, 2, 3]]]
    """
    lengths = None if key_lengths is None else V.to_host(key_lengths)
    mask = None if key_padding_mask is None else V.to_host(key_padding_mask).astype(bool)
    n = geometry.keys_visible(nq, nk, causal=causal, key_lengths=lengths, batch=batch, key_mask=mask)
    return V.namespace(key_lengths, key_padding_mask).asarray(n)  # in the masks' namespace


def alpha_arg(alpha: Any, Hq: int, q_shape: tuple) -> tuple[float, Any, tuple | None]:
    """(alpha of the spec, (Hq,) float64 per-head alpha or None, the array shape of alpha
    or None for a scalar).  An array alpha of equal values runs as a scalar."""
    if isinstance(alpha, (bool, np.bool_)):
        raise ValueError(f"alpha must be a real scalar or an array of shape ({Hq},), got {V.shown(alpha)!r}")
    if isinstance(alpha, (int, float, np.integer, np.floating)):
        a = _scalar(alpha, "alpha")
        if a < 1.0:
            raise ValueError(f"alpha must be >= 1, got {a!r}")
        return a, None, None
    arr = V.to_host(alpha)  # a small host parameter (one value per head)
    real = arr.dtype.kind in "fiu" or np.dtype(arr.dtype).name in V._LOW_PRECISION  # bfloat16 etc. too
    if not real or arr.shape not in ((), (Hq,)):
        raise ValueError(
            f"alpha must be a scalar or one value per query head, shape () or ({Hq},) for q "
            f"{tuple(q_shape)}; got dtype {arr.dtype} and shape {tuple(arr.shape)}"
        )
    a = np.asarray(arr, np.float64)
    if not np.all(np.isfinite(a)) or np.any(a < 1.0):
        raise ValueError(f"alpha must be finite and >= 1 for every head, got {a.tolist()!r}")
    if a.ndim == 0:
        return float(a), None, ()
    if Hq == 0 or np.all(a == a[0]):  # one value: the scalar kernels
        return (float(a[0]) if Hq else 1.5), None, (Hq,)
    return float(a[0]), np.ascontiguousarray(a), (Hq,)


def _key_mask_arg(mask: Any, B: int, Nk: int, k_shape: tuple) -> np.ndarray | None:
    """key_padding_mask as a (B, Nk) bool numpy array (None when not given): a host
    parameter of the backend contract, like key_lengths."""
    if mask is None:
        return None
    m = V.to_host(mask)
    if m.dtype != np.bool_ or m.shape != (B, Nk):
        raise ValueError(
            f"key_padding_mask must be a bool array of shape ({B}, {Nk}) (batch, keys) for k "
            f"{tuple(k_shape)}, True where a key may be attended; got dtype {m.dtype} and shape "
            f"{tuple(m.shape)}"
        )
    return np.ascontiguousarray(m)


def _key_lengths_arg(key_lengths: Any, B: int, Nk: int, q_shape: tuple, k_shape: tuple) -> np.ndarray | None:
    """key_lengths as a (B,) int64 numpy array (None when not given): a small host
    parameter of the backend contract."""
    if key_lengths is None:
        return None
    kl = V.to_host(key_lengths)
    if kl.shape != (B,):
        raise ValueError(f"key_lengths must have shape ({B},) for q {tuple(q_shape)}, got {kl.shape}")
    if kl.dtype.kind not in "iu":
        if kl.dtype.kind != "f" or not np.all(np.isfinite(kl)) or np.any(kl != np.round(kl)):
            raise ValueError(f"key_lengths must be integers, got {kl.tolist()!r}")
    if np.any(kl < 0) or np.any(kl > Nk):
        raise ValueError(f"key_lengths must lie in [0, {Nk}] for k {tuple(k_shape)}, got {kl.tolist()!r}")
    return np.ascontiguousarray(kl, np.int64)


def _slopes_arg(alibi_slopes: Any, Hq: int, q_shape: tuple) -> np.ndarray | None:
    """alibi_slopes as a (Hq,) float64 numpy array (None when not given)."""
    if alibi_slopes is None:
        return None
    sl = real_param(V.to_host(alibi_slopes), "alibi_slopes")
    if sl.shape != (Hq,):
        raise ValueError(
            f"alibi_slopes must have one slope per query head, shape ({Hq},) for q "
            f"{tuple(q_shape)}, got {sl.shape}"
        )
    return np.ascontiguousarray(sl)


def _prepare(q, k, v, opts: AttentionOptions, forward: bool = False, residual: bool = True) -> _Problem:
    """Validate an attention call (the arrays and ``opts``) and build its engine's
    ``AttentionSpec``, the one place that does: ``forward`` for a forward alone,
    ``residual`` when a backward will follow it (a backward computes dalpha when alpha is
    an array)."""
    alpha, scale, causal, key_lengths, key_padding_mask = (opts.alpha, opts.scale, opts.causal, opts.key_lengths,
                                                            opts.key_padding_mask)
    alibi_slopes, beta, gamma, delta, offset, chunk = (opts.alibi_slopes, opts.beta, opts.gamma, opts.delta,
                                                       opts.offset, opts.chunk)
    check_finite = bool(opts.check_finite)  # truthiness, as the row transforms take it
    q, cq, oq = _tensor(q, "q", 4, finite=check_finite)
    k, ck, ok = _tensor(k, "k", 4, finite=False)  # scanned last (or by the backend's forward)
    v, cv, ov = _tensor(v, "v", 4, finite=False)
    B, Hq, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (batch, heads, keys)"
        )
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape[3] != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same head dim")
    if Hkv == 0 and Hq == 0:
        pass  # no heads at all: an empty output
    elif Hkv == 0 or Hq % Hkv:
        raise ValueError(
            f"the {Hq} query heads of q {tuple(q.shape)} must be a multiple of the {Hkv} "
            f"key/value heads of k {tuple(k.shape)}"
        )
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {V.shown(causal)!r}")
    a, head_alpha, alpha_shape = alpha_arg(alpha, Hq, q.shape)
    key_mask = _key_mask_arg(key_padding_mask, B, Nk, k.shape)
    if scale is None:
        # head dim 0: every score q . k is the empty sum 0, whatever the scale
        sc = 1.0 / float(np.sqrt(D)) if D else 1.0
    else:
        sc = _scalar(scale, "scale")
    lengths = _key_lengths_arg(key_lengths, B, Nk, q.shape, k.shape)
    slopes = _slopes_arg(alibi_slopes, Hq, q.shape)
    if chunk is not None and (not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 1):
        raise ValueError(f"chunk must be a positive integer or None, got {V.shown(chunk)!r}")

    xp = V.namespace(q)
    n = xp.broadcast_to(xp.asarray(geometry.keys_visible(Nq, Nk, causal=bool(causal), key_lengths=lengths, batch=B,
                                                         key_mask=key_mask)), (B, Hq, Nq))
    params = None
    row_scale = None
    s_info = xp.ones((B, Hq, Nq))
    if (beta is None) != (gamma is None):
        raise ValueError("beta and gamma must be given together (SSMax: gamma=1, delta=0, alpha=1)")
    if beta is not None:
        off = _scalar(offset, "offset")
        params = {"beta": real_param(beta, "beta", xp), "gamma": real_param(gamma, "gamma", xp),
                  "delta": real_param(delta, "delta", xp)}
        broadcast_params(params, (B, Hq, Nq))
        live = n > 0
        # checked (domain, overflow) on the rows that attend something only; the error names (b, h, i)
        row_scale = row_scale_of(xp.ascontiguousarray(n), params, off, live, "query row (b, h, i) =")
        s_info = xp.where(live, row_scale, np.nan)
        params["offset"] = off
    elif any(not (type(a) in (float, int) and a == 1.0) and bool(V.namespace(a).any(V.namespace(a).asarray(a) != 1.0))
             for a in (delta, offset)):
        raise ValueError("delta and offset only apply with beta and gamma (the ASEntmax scale)")

    cdt = V.common_dtype(cq, ck, cv)
    be = resolve_backend(opts.backend, q, k, v)
    if B * Hq * Nq == 0 or D == 0 or v.shape[3] == 0:
        be = ShapeGuard(be)
    spec = AttentionSpec(alpha=a, scale=sc, causal=bool(causal), key_lengths=lengths,
                         alibi_slopes=slopes, row_scale=row_scale, chunk=chunk, head_alpha=head_alpha,
                         key_mask=key_mask, check_finite=check_finite, residual=residual,
                         alpha_grad=not forward and alpha_shape is not None)

    def canon(x):
        return np.ascontiguousarray(x.astype(cdt, copy=False)) if isinstance(x, np.ndarray) else x.astype(cdt)

    alpha_b = a if head_alpha is None else xp.asarray(head_alpha[None, :, None])
    qc, kc, vc = canon(q), canon(k), canon(v)
    # a forward that reads every entry of k and v anyway (the numba decoding path) scans
    # them itself: one pass over the key cache instead of two.  check_finite=False: no
    # scan at all, and the backend is not asked (spec.check_finite tells it not to scan)
    scans = (getattr(be, "attention_scans_inputs", None)
             if check_finite and forward and not isinstance(be, ShapeGuard) else None)
    unscanned = (k, v) if scans is not None and scans(qc, kc, vc, spec) else ()
    if check_finite and not unscanned:
        V.check_finite(k, "k", allow_neg_inf=False)
        V.check_finite(v, "v", allow_neg_inf=False)
    return _Problem(qc, kc, vc, spec, be, xp.ascontiguousarray(n), s_info, params,
                    (oq, ok, ov), alpha_shape, alpha_b, unscanned)


@public
def attention(q, k, v, *, alpha=1.5, scale=None, causal=False, key_lengths=None, alibi_slopes=None,
              beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None, return_info=False, backend=None,
              key_padding_mask=None, check_finite=True):
    """alpha-entmax attention ``o_i = sum_j entmax(z_i)_j v_j``, exact, in query chunks.

    ``z_ij = s_i * scale * (q_i . k_j) + bias_ij`` over the keys row i may attend:

    * causal masking is bottom-right aligned (query i of Nq sees keys j <= i + Nk - Nq, the
      FlashAttention convention, so decoding Nq = 1 against a cache works);
      ``key_lengths[b]`` masks right padding (keys j >= key_lengths[b]) and
      ``key_padding_mask[b, j] = False`` any key (left padding, holes);
    * ``bias_ij = -slope_h * |i + Nk - Nq - j|`` (ALiBi; with the causal mask this is
      ``-slope_h * (i_abs - j)``), one slope per query head (0 = a NoPE head);
    * ``s_i = delta + beta * log(n_i + offset) ** gamma`` (ASEntmax) when beta and gamma are
      given, with n_i the number of keys row i may attend after masking; else 1.  SSMax is
      gamma = 1, delta = 0, alpha = 1.  The scale multiplies the content score, not the bias.

    The rows are solved exactly by the backend's row solver; the score matrix is never
    materialised: peak extra memory is O(chunk x Nk) (``chunk`` query rows per step,
    chosen automatically).  A row with nothing to attend gives a zero output.

    Parameters
    ----------
    q : (B, Hq, Nq, D) array
    k : (B, Hkv, Nk, D) array, Hq a multiple of Hkv (grouped-query heads share k and v)
    v : (B, Hkv, Nk, Dv) array
    alpha : float or array of shape () or (Hq,)
        Any alpha >= 1 (1 is softmax attention, 2 sparsemax); an (Hq,) array gives each
        query head its own alpha (heads sharing a kv head may differ).
    scale : float or None
        Multiplies q . k; default 1 / sqrt(D).
    causal : bool
    key_lengths : (B,) integers in [0, Nk] or None
    key_padding_mask : (B, Nk) bool array or None
        True where key j of batch b may be attended; combines with ``causal`` and
        ``key_lengths`` (a key is visible when all allow it).  ASEntmax's n counts the
        visible keys.
    alibi_slopes : (Hq,) floats or None
    beta, gamma, delta : array_like or None
        ASEntmax parameters, broadcast (NumPy rules) against (B, Hq, Nq): per head use
        shape (Hq, 1), per head and token (Hq, Nq) or (B, Hq, Nq).  delta defaults to 1.
    offset : float
        The c > 0 in log(n + c) (1 in the paper's code: log(i + 2) for causal row i).
    chunk : int or None
        Query rows per step (None: the largest whose (rows, Nk) float64 block fits in
        about 8 MiB).
    return_info : bool
        Also return :class:`AttentionInfo` (tau, support, s, n, skewed output).
    backend : str or None
        See :func:`entmax_ref.use_backend`.
    check_finite : bool
        Reject NaN and +-inf in q, k and v (ValueError naming the first).  Turn off only
        for speed on inputs known to be clean: nothing then scans q, k and v, and the
        numba backend's decoding path (a few queries over a long key cache) reads v on
        each row's support only instead of all of it.  What a non-finite entry does then
        is in the Notes.  alpha, scale, key_lengths, key_padding_mask, alibi_slopes,
        beta, gamma, delta and offset are checked either way.

    Returns
    -------
    out : (B, Hq, Nq, Dv), in the floating dtype of q, k, v combined (float64 if any is
        float64; float16/bfloat16 are computed in float32; integers become float64).
        Accumulation is float64 throughout.  ``(out, info)`` when ``return_info``.

    Raises
    ------
    ValueError: shape mismatches (naming the shapes), NaN/inf in q, k, v (with
    ``check_finite``), alibi_slopes, beta, gamma, delta, alpha < 1 or an alpha array not
    of shape () or (Hq,), key_lengths out of [0, Nk], a key_padding_mask not bool of
    shape (B, Nk), beta/gamma not broadcastable to (B, Hq, Nq), beta without gamma,
    log(n + offset) <= 0 on a row with n > 0 visible keys, a scale that overflows (naming
    beta, gamma, delta and the row), scores that overflow.  Degenerate shapes (head dim
    0, value dim 0, no query rows) have exact answers (docs/conventions.md).

    Notes
    -----
    With ``check_finite=False`` a NaN or infinite entry of q, k or v is a broken promise
    of the caller, and what it does is specified only this far (numpy and numba
    backends; docs/attention.md has the details):

    * in q, or in a key that the scores read (any key that some query may attend): the
      ValueError "attention scores overflowed (non-finite s * scale * q.k + bias)", as
      for finite scores that overflow; -inf is no mask there.  An entry that no score
      reads (the q of a row that sees no key, a key masked by ``key_lengths`` or
      ``key_padding_mask``) may be ignored instead;
    * in v, at key j: info is unchanged except ``info.skew``, and the output and skewed
      output of every row whose support holds key j are NaN or infinite.  The other rows
      are the clean input's, bit for bit, on the numba backend (chunked and decoding
      paths read v on the support only); the numpy reference forms ``p @ v`` over each
      query chunk's keys, so they may be NaN there too.

    No call hangs or reads out of bounds, and no entry of the result is finite but
    different from the clean input's.

    Examples
    --------
    One query, two keys with scores 0 and 1 (scale 1): sparsemax gives (0, 1); 1.5-entmax
    p = [z/2 - tau]_+^2 with tau = (1 - sqrt(7)) / 4 gives ((1 + sqrt 7)/4)^2 = 0.8307 to
    the second key.  With v = identity the output is p itself.

    >>> import numpy as np, entmax_ref as er
    >>> q = np.array([[[[1.0]]]]); k = np.array([[[[0.0], [1.0]]]]); v = np.eye(2)[None, None]
    >>> er.attention(q, k, v, alpha=2, scale=1.0).tolist()
    [[[[0.0, 1.0]]]]
    >>> er.attention(q, k, v, alpha=1.5, scale=1.0).round(4).tolist()
    [[[[0.1693, 0.8307]]]]
    """
    return attention_of(q, k, v, AttentionOptions.of(locals()), return_info=return_info)


def attention_of(q, k, v, opts: AttentionOptions, *, return_info: bool = False):
    """:func:`attention` of the options record ``opts`` (what the public function and the
    adapters call)."""
    prob = _prepare(q, k, v, opts, forward=True, residual=bool(return_info))
    try:
        fwd = prob.backend.attention_forward(prob.q, prob.k, prob.v, prob.spec)
    except NonFiniteInput:
        for arr, name in zip(prob.kv_unscanned, "kv"):
            V.check_finite(arr, name, allow_neg_inf=False)  # raises, naming the entry
        raise
    out_dtype = V.result_dtype(*prob.out_dtypes)
    out = fwd.out.astype(out_dtype, copy=False)
    if not return_info:
        return out
    tau = theta_to_tau(fwd.theta, prob.alpha_b)
    return out, AttentionInfo(tau, fwd.support, prob.s_info, prob.n, fwd.skew, fwd.theta, fwd.row_max, fwd.edge,
                              fwd.edge_p, info_alpha(prob), fwd.support_keys)


@public
def attention_vjp(grad_out, q, k, v, *, info=None, out=None, tau=None, alpha=1.5, scale=None, causal=False,
                  key_lengths=None, alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0,
                  chunk=None, backend=None, key_padding_mask=None, check_finite=True):
    """Gradients of a loss through :func:`attention`, given ``grad_out = dL/dout``.

    Takes the same keyword arguments as :func:`attention`.  The residual of the forward
    can be passed in one of two ways (or not at all: the forward is then run first):

    * ``info`` (recommended): the :class:`AttentionInfo` of ``attention(...,
      return_info=True)``.  Lossless: the backward rebuilds every probability exactly as
      the forward had it, from the backend's own threshold ``info.theta`` (alpha <= 2) or
      the support's edge ``info.row_max, info.edge, info.edge_p`` (alpha > 2, where theta
      cannot resolve the edge entry), and uses ``info.skew``; nothing is solved again.
    * ``tau`` (the forward's ``info.tau``; kept for compatibility): for alpha <= 2,
      ``theta = (tau + 1)/(alpha - 1)`` and ``p = e_alpha(z - theta)``; this conversion
      loses relative precision as alpha -> 1 (about eps/(alpha - 1) in theta).  For
      alpha > 2 tau cannot give the edge, so the rows are solved again (tau is only
      checked).  Prefer ``info``.

    Per row, with ``u = p ** (2 - alpha)`` on the support, the skewed output
    ``skew_i = sum_j u_ij v_j / sum_j u_ij`` and ``delta_i = dO_i . skew_i``:

    * ``dZ_ij = u_ij (dO_i . v_j - delta_i)`` (the entmax VJP, never stored whole);
    * ``dV_j = sum_i p_ij dO_i``, ``dQ_i = scale * s_i * sum_j dZ_ij k_j``,
      ``dK_j = scale * sum_i s_i dZ_ij q_i`` (summed over the query heads of a kv head);
    * ``dL/ds_i = sum_j dZ_ij * scale * (q_i . k_j)``, chained to beta, gamma and delta by
      :func:`entmax_ref.asentmax_scale_vjp`;
    * when ``alpha`` is an array: ``dL/dalpha`` per row is the row transform's alpha VJP
      (:func:`entmax_ref.entmax_alpha_vjp`) of ``p_i`` and ``dL/dp_ij = dO_i . v_j`` on the
      support, exact through alpha -> 1, summed over each head's rows (over all rows for
      a shape () alpha).

    For alpha > 2, where u is unbounded at the support's edge, ``dZ`` is formed as
    :func:`entmax_ref.entmax_vjp` forms it (u / max u in log space; the entry of largest u
    as ``sum_{j != m} u_j (g_m - g_j) / sum_j u_j``), finite wherever the true value is.

    ``out`` is used only at alpha = 1 together with ``tau``: there the skewed output is
    the output, so no per-chunk recomputation of it is needed.  A row with nothing to
    attend contributes nothing.

    ``check_finite`` (default True) rejects NaN and +-inf in q, k, v and grad_out
    (ValueError naming the first).  Turn it off only for speed on inputs known to be
    clean; ``out`` and ``tau`` are checked either way.  Off, a non-finite entry does what
    it does in :func:`attention` (whose forward runs first when neither ``info`` nor
    ``tau`` is given), and in the backward:

    * in q or k: the overflow ValueError where a score reads it.  The numba backward
      given ``info`` scores only the forward's support keys, so an entry of k off every
      row's support is not read (the gradients are then the clean input's);
    * in v or grad_out: it reaches the gradients as NaN or infinite entries (a row i of
      grad_out: at least dv of row i's support keys); which entries is unspecified
      beyond that (numba works on the support only; numpy's dense products over each
      query chunk's keys spread it wider).

    No call hangs or reads out of bounds, and no gradient entry is finite but different
    from the clean input's.

    Returns
    -------
    AttentionGradients(dq, dk, dv, dbeta, dgamma, ddelta, dalpha); dbeta, dgamma, ddelta
    are None without ASEntmax; dalpha is float64 shaped like alpha when alpha is an array
    (shape () or (Hq,)), None when it is a Python or NumPy scalar (no extra work then).

    Raises
    ------
    ValueError: everything :func:`attention` rejects, and grad_out / out / tau of the
    wrong shape or with NaN (grad_out: with ``check_finite``; tau may be -inf only on
    rows with nothing to attend), both
    ``info`` and ``tau``, an ``info`` from a forward with another alpha, other masks or
    other shapes.  TypeError: ``info`` that is not an :class:`AttentionInfo`.

    Examples
    --------
    Sparsemax of (0, 1) is (0, 1), on the flat part of the simplex, so no gradient
    reaches q or k; dv is p^T dO.

    >>> import numpy as np, entmax_ref as er
    >>> q = np.array([[[[1.0]]]]); k = np.array([[[[0.0], [1.0]]]]); v = np.eye(2)[None, None]
    >>> out, info = er.attention(q, k, v, alpha=2, scale=1.0, return_info=True)
    >>> g = er.attention_vjp(np.ones((1, 1, 1, 2)), q, k, v, info=info, alpha=2, scale=1.0)
    >>> g.dq.tolist(), g.dv.tolist()
    ([[[[0.0]]]], [[[[0.0, 0.0], [1.0, 1.0]]]])
    """
    return attention_vjp_of(grad_out, q, k, v, AttentionOptions.of(locals()), info=info, out=out, tau=tau)


def attention_vjp_of(grad_out, q, k, v, opts: AttentionOptions, *, info=None, out=None, tau=None):
    """:func:`attention_vjp` of the options record ``opts`` (what the public function and
    the adapters call)."""
    prob = _prepare(q, k, v, opts)
    B, Hq, Nq, _ = prob.q.shape
    Dv = prob.v.shape[3]
    do, cdo, _ = _tensor(grad_out, "grad_out", 4, finite=prob.spec.check_finite)
    if tuple(do.shape) != (B, Hq, Nq, Dv):
        raise ValueError(f"grad_out must have the output's shape {(B, Hq, Nq, Dv)}, got {tuple(do.shape)}")
    # kept in its own precision: the backend accumulates in float64 whatever it gets
    do = np.ascontiguousarray(do.astype(cdo, copy=False)) if isinstance(do, np.ndarray) else do.astype(cdo)
    skew = None
    if info is not None and tau is not None:
        raise ValueError("pass the forward's residual once: info (recommended) or tau, not both")
    if info is not None:
        if not isinstance(info, AttentionInfo):
            raise TypeError(f"info must be the AttentionInfo of er.attention(..., return_info=True), "
                            f"got {type(info).__name__}")
        res, skew = residual_from_info(info, prob, (B, Hq, Nq))
    elif tau is None or any_big(prob):
        if tau is not None:  # alpha > 2: checked, but the edge is not in tau: solve again
            check_tau(tau, prob, (B, Hq, Nq))
        fwd = prob.backend.attention_forward(prob.q, prob.k, prob.v, prob.spec)
        res, skew = fwd, fwd.skew
    else:
        theta = check_tau(tau, prob, (B, Hq, Nq))
        res = AttentionResidual(theta)
        if out is not None:
            o, _, _ = _tensor(out, "out", 4)
            if tuple(o.shape) != (B, Hq, Nq, Dv):
                raise ValueError(f"out must have shape {(B, Hq, Nq, Dv)}, got {tuple(o.shape)}")
            if prob.spec.alpha == 1.0 and prob.spec.head_alpha is None:
                skew = V.namespace(o).ascontiguousarray(o.astype(np.float64))
    grads = prob.backend.attention_backward(do, prob.q, prob.k, prob.v, res, skew, prob.spec)
    dq, dk, dv = (V.cast(g, dt) for g, dt in zip(grads[:3], prob.out_dtypes))
    dalpha = None
    if prob.alpha_shape is not None:  # per row -> per head (summed over batch and queries), on the host
        n_host = V.to_host(prob.n)
        da = np.where(n_host > 0, V.to_host(grads.dalpha).astype(np.float64), 0.0)
        dalpha = da.sum(axis=(0, 2)) if prob.alpha_shape else np.asarray(da.sum())
        dalpha = V.namespace(opts.alpha).asarray(dalpha)  # in alpha's namespace
    if prob.params is None:
        return AttentionGradients(dq, dk, dv, dalpha=dalpha)
    live = prob.n > 0
    xp = V.namespace(prob.n)
    ds = xp.where(live, grads.drow_scale.astype(np.float64, copy=False), 0.0)
    p = prob.params
    sg = scale_vjp(ds, prob.n, p["beta"], p["gamma"], p["delta"], p["offset"], live, "query row (b, h, i) =",
                    finite=prob.spec.check_finite)  # unchecked input may reach ds: NaN in dbeta, not an error
    return AttentionGradients(dq, dk, dv, sg.dbeta, sg.dgamma, sg.ddelta, dalpha)
