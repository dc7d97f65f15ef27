"""Entmax attention over packed variable-length batches (FlashAttention's varlen layout).

Sequences are stored one after the other: ``q`` is ``(total_q, Hq, D)``, ``k`` and ``v``
are ``(total_k, Hkv, D)`` / ``(total_k, Hkv, Dv)``, and sequence ``s`` owns the queries
``cu_seqlens_q[s] : cu_seqlens_q[s + 1]`` and the keys ``cu_seqlens_k[s] :
cu_seqlens_k[s + 1]``.  Each sequence is an independent :func:`entmax_ref.attention`
problem (causal masking bottom-right aligned *within* the sequence, ALiBi distances
measured within it, ASEntmax's ``n`` counting its visible keys), so the result equals
one :func:`entmax_ref.attention` call per sequence.

No padded batch is formed: each sequence is handed to the backend on its own, as a
``(1, H, N_s, D)`` transposed copy of its slice (the backends take heads-first arrays),
and its results are written back into the packed outputs.  The extra memory is that of
one sequence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from . import _validate as V
from ._interop import public
from .asentmax import broadcast_params, real_param, reduce_to
from ._attention_options import AttentionOptions
from .attention import AttentionGradients, AttentionInfo, alpha_arg, attention_of, attention_vjp_of
from .backends.attention_driver import concat_keys

__all__ = ["attention_varlen", "attention_varlen_vjp"]


def _packed(x: Any, name: str, layout: str):
    arr = V.as_array(x)
    if arr.ndim != 3:
        raise ValueError(f"{name} must have 3 dimensions {layout}, got shape {tuple(arr.shape)}")
    _, odt = V.compute_dtype(arr, name)
    return arr, odt


def _offsets(cu: Any, name: str, total: int, total_name: str) -> np.ndarray:
    """Cumulative sequence offsets as an int64 numpy array, checked."""
    c = V.to_host(cu)  # a small host parameter, like key_lengths
    if c.ndim != 1 or c.shape[0] < 1:
        raise ValueError(f"{name} must be a 1-D array of shape (num_sequences + 1,), got shape {c.shape}")
    if c.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {c.dtype}")
    c = c.astype(np.int64)
    if c[0] != 0:
        raise ValueError(f"{name} must start at 0, got {c[0]}")
    if np.any(np.diff(c) < 0):
        s = int(np.flatnonzero(np.diff(c) < 0)[0])
        raise ValueError(f"{name} must be non-decreasing, got {c[s]} then {c[s + 1]} at index {s}")
    if c[-1] != total:
        raise ValueError(f"{name} must end at {total_name} = {total}, got {c[-1]}")
    return c


class _Packed:
    """The validated packed problem and its per-sequence slices."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, opts: AttentionOptions):
        self.opts = opts
        alpha, alibi_slopes, beta, gamma, delta = opts.alpha, opts.alibi_slopes, opts.beta, opts.gamma, opts.delta
        self.q, oq = _packed(q, "q", "(total_q, Hq, D)")
        self.k, ok = _packed(k, "k", "(total_k, Hkv, D)")
        self.v, ov = _packed(v, "v", "(total_k, Hkv, Dv)")
        q, k, v = self.q, self.k, self.v
        (self.total_q, self.Hq, self.D), (self.total_k, self.Hkv) = q.shape, k.shape[:2]
        self.Dv = v.shape[2]
        if k.shape[:2] != v.shape[:2]:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (total_k, heads)")
        if k.shape[2] != self.D:
            raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same head dim")
        if self.Hkv == 0 or self.Hq % self.Hkv:
            raise ValueError(
                f"the {self.Hq} query heads of q {tuple(q.shape)} must be a multiple of the "
                f"{self.Hkv} key/value heads of k {tuple(k.shape)}"
            )
        self.cq = _offsets(cu_seqlens_q, "cu_seqlens_q", self.total_q, "total_q (q.shape[0])")
        self.ck = _offsets(cu_seqlens_k, "cu_seqlens_k", self.total_k, "total_k (k.shape[0])")
        if self.cq.shape != self.ck.shape:
            raise ValueError(
                f"cu_seqlens_q {self.cq.shape} and cu_seqlens_k {self.ck.shape} must have the same "
                "shape (num_sequences + 1,)"
            )
        self.out_dtype = np.result_type(oq, ok, ov)
        a, head_alpha, self.alpha_shape = alpha_arg(alpha, self.Hq, q.shape)  # validated once, here
        # AttentionInfo.alpha, as er.attention writes it
        self.info_alpha = a if head_alpha is None else tuple(float(h) for h in head_alpha)
        if alibi_slopes is not None and np.shape(alibi_slopes) != (self.Hq,):
            raise ValueError(
                f"alibi_slopes must have one slope per query head, shape ({self.Hq},) for q "
                f"{tuple(q.shape)}, got {np.shape(alibi_slopes)}"
            )
        self.params = None
        if beta is not None and gamma is not None:
            xp = V.namespace(q)
            self.params = {"beta": real_param(beta, "beta", xp), "gamma": real_param(gamma, "gamma", xp),
                           "delta": real_param(delta, "delta", xp)}
            broadcast_params(self.params, (self.total_q, self.Hq))

    def check_finite(self, *extra) -> None:
        """ValueError naming the first NaN or +-inf of q, of the keys and values some query
        reads (a sequence without queries reads none), and of ``extra`` ((array, name)
        pairs packed like q), by its position in the packed array."""
        for arr, name in ((self.q, "q"), *extra):
            V.check_finite(arr, name, allow_neg_inf=False)
        read = [np.arange(k0, k1) for _, _, _, k0, k1 in self.sequences()]
        used = np.concatenate(read) if read else np.zeros(0, np.int64)
        for arr, name in ((self.k, "k"), (self.v, "v")):
            if len(used) == self.total_k:  # every key is read: the packed array as it is
                V.check_finite(arr, name, allow_neg_inf=False)
            else:
                V.check_finite(arr[used], name, allow_neg_inf=False,
                               locate=lambda i: (int(used[i[0]]),) + tuple(i[1:]))

    def sequences(self):
        """(s, q0, q1, k0, k1) of every sequence with at least one query."""
        for s in range(len(self.cq) - 1):
            q0, q1, k0, k1 = int(self.cq[s]), int(self.cq[s + 1]), int(self.ck[s]), int(self.ck[s + 1])
            if q1 > q0:
                yield s, q0, q1, k0, k1

    @staticmethod
    def heads_first(x, i0, i1):
        """Rows i0:i1 of a packed (total, H, d) array as (1, H, i1 - i0, d) (a view)."""
        return x[i0:i1].transpose(1, 0, 2)[None]

    def options(self, q0, q1, **changes) -> AttentionOptions:
        """The options of one sequence (rows q0:q1): beta, gamma, delta shaped (1, Hq, N_s)
        (broadcast views), and ``changes``."""
        if self.params is not None:
            shape = (self.total_q, self.Hq)
            xp = V.namespace(self.q)
            changes.update({name: xp.broadcast_to(self.params[name], shape)[q0:q1].T[None]
                            for name in ("beta", "gamma", "delta")})
        return replace(self.opts, **changes)


@public
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, alpha=1.5, scale=None, causal=False,
                     alibi_slopes=None, beta=None, gamma=None, delta=1.0, offset=1.0, chunk=None,
                     return_info=False, backend=None, check_finite=True):
    """alpha-entmax attention of a packed batch of variable-length sequences.

    Sequence ``s`` has the queries ``q[cu_seqlens_q[s]:cu_seqlens_q[s+1]]`` and the keys and
    values ``k, v[cu_seqlens_k[s]:cu_seqlens_k[s+1]]`` (FlashAttention's
    ``flash_attn_varlen_func`` layout) and attends to nothing else.  The result equals
    :func:`entmax_ref.attention` applied to each sequence on its own (with ``(1, H, N_s,
    d)`` arrays), bit for bit: the same backend code runs on each sequence.

    * causal masking is bottom-right aligned per sequence: query ``i`` of a sequence with
      ``Nq_s`` queries and ``Nk_s`` keys sees its keys ``j <= i + Nk_s - Nq_s``;
    * ALiBi distances ``|i + Nk_s - Nq_s - j|`` are within the sequence;
    * ASEntmax's ``n_i`` counts the keys row ``i`` sees in its own sequence.

    Parameters
    ----------
    q : (total_q, Hq, D) array
    k : (total_k, Hkv, D) array, Hq a multiple of Hkv
    v : (total_k, Hkv, Dv) array
    cu_seqlens_q, cu_seqlens_k : (num_sequences + 1,) integer arrays
        Cumulative offsets: start at 0, non-decreasing, end at total_q / total_k.  A
        sequence may be empty (no queries, or no keys: its rows then get a zero output).
    alpha : float or (Hq,) array
        As in :func:`entmax_ref.attention` (one value per query head allowed).
    scale, alibi_slopes, offset, chunk, backend
        As in :func:`entmax_ref.attention`.
    check_finite : bool
        Reject NaN and +-inf in q, k and v (ValueError naming the first by its position
        in the packed array, e.g. ``q[4, 2, 1]``).  Turn off only for speed on inputs
        known to be clean; a non-finite entry then does what it does in
        :func:`entmax_ref.attention` with ``check_finite=False``, per sequence.  The keys
        of a sequence without queries are never read, whatever ``check_finite``.
    beta, gamma, delta : array_like or None
        ASEntmax parameters, broadcast (NumPy rules) against ``(total_q, Hq)``: per head
        shape ``(Hq,)``, per token and head ``(total_q, Hq)``.
    return_info : bool
        Also return an :class:`entmax_ref.AttentionInfo` whose per-row fields (tau,
        support, s, n and the residual theta, row_max, edge, edge_p) are shaped
        ``(total_q, Hq)`` (``skew``: ``(total_q, Hq, Dv)``; ``support_keys``, when the
        backend keeps them: ``(total_q, Hq, W)``); pass it whole to
        :func:`attention_varlen_vjp` as ``info=`` (the lossless residual).

    Returns
    -------
    out : (total_q, Hq, Dv) array, dtype as :func:`entmax_ref.attention`; ``(out, info)``
        with ``return_info``.

    Raises
    ------
    ValueError: everything :func:`entmax_ref.attention` rejects, offsets that are not
    1-D integers starting at 0, non-decreasing and ending at the total length, offsets of
    different lengths for q and k, beta/gamma/delta that do not broadcast to (total_q, Hq).

    Examples
    --------
    Two sequences packed together.  The first query sees key 0 only; the second sees
    scores (0, 1), where sparsemax puts all mass on key 1; the third query is a sequence of
    its own and sees only the key of value 5.

    >>> import numpy as np, entmax_ref as er
    >>> q = np.ones((3, 1, 1)); k = np.array([[[0.0]], [[1.0]], [[5.0]]]); v = k.copy()
    >>> cu_q = np.array([0, 2, 3]); cu_k = np.array([0, 2, 3])
    >>> er.attention_varlen(q, k, v, cu_q, cu_k, alpha=2, scale=1.0, causal=True)[:, 0, 0].tolist()
    [0.0, 1.0, 5.0]
    """
    return attention_varlen_of(q, k, v, cu_seqlens_q, cu_seqlens_k, AttentionOptions.of(locals()),
                               return_info=return_info)


def attention_varlen_of(q, k, v, cu_seqlens_q, cu_seqlens_k, opts: AttentionOptions, *, return_info: bool = False):
    """:func:`attention_varlen` of the options record ``opts`` (what the public function
    and the adapters call)."""
    P = _Packed(q, k, v, cu_seqlens_q, cu_seqlens_k, opts)
    if opts.check_finite:  # here, naming packed positions: the sequences' calls need not scan again
        P.check_finite()
    xp = V.namespace(P.q)
    out = xp.zeros((P.total_q, P.Hq, P.Dv), P.out_dtype)
    if return_info:
        tau = xp.full((P.total_q, P.Hq), -np.inf)
        support = xp.zeros((P.total_q, P.Hq), np.int64)
        s_info = xp.full((P.total_q, P.Hq), np.nan if P.params is not None else 1.0)
        n = xp.zeros((P.total_q, P.Hq), np.int64)
        skew = xp.zeros((P.total_q, P.Hq, P.Dv))
        resid = {"theta": xp.full((P.total_q, P.Hq), -np.inf), "row_max": xp.full((P.total_q, P.Hq), -np.inf),
                 "edge": xp.full((P.total_q, P.Hq), -np.inf), "edge_p": xp.zeros((P.total_q, P.Hq))}
        keys = []  # each sequence's (rows, Hq, width) support keys, in row order (None: kept none)
    for _, q0, q1, k0, k1 in P.sequences():
        res = attention_of(P.heads_first(P.q, q0, q1), P.heads_first(P.k, k0, k1), P.heads_first(P.v, k0, k1),
                           P.options(q0, q1, check_finite=False), return_info=return_info)
        o, info = res if return_info else (res, None)
        out[q0:q1] = o[0].transpose(1, 0, 2)
        if info is not None:
            tau[q0:q1] = info.tau[0].T
            support[q0:q1] = info.support[0].T
            s_info[q0:q1] = info.s[0].T
            n[q0:q1] = info.n[0].T
            skew[q0:q1] = info.skew[0].transpose(1, 0, 2)
            for name, field in resid.items():
                field[q0:q1] = getattr(info, name)[0].T
            keys.append(None if info.support_keys is None else info.support_keys[0].transpose(1, 0, 2))
    if not return_info:
        return out
    return out, AttentionInfo(tau, support, s_info, n, skew, resid["theta"], resid["row_max"], resid["edge"],
                              resid["edge_p"], P.info_alpha, concat_keys(keys))


def _sequence_info(info, q0: int, q1: int):
    """The :class:`AttentionInfo` of one sequence (rows q0:q1) of a packed one, heads first
    as :func:`entmax_ref.attention` returns it: (1, Hq, N_s), skew (1, Hq, N_s, Dv)."""
    xp = V.namespace(info.tau)

    def rows(a):
        return None if a is None else xp.ascontiguousarray(a[q0:q1].T[None])

    def per_key(a):
        return None if a is None else xp.ascontiguousarray(a[q0:q1].transpose(1, 0, 2)[None])

    return AttentionInfo(rows(info.tau), rows(info.support), rows(info.s), rows(info.n), per_key(info.skew),
                         rows(info.theta), rows(info.row_max), rows(info.edge), rows(info.edge_p), info.alpha,
                         per_key(info.support_keys))


@public
def attention_varlen_vjp(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, *, info=None, out=None, tau=None, alpha=1.5,
                         scale=None, causal=False, alibi_slopes=None, beta=None, gamma=None, delta=1.0,
                         offset=1.0, chunk=None, backend=None, check_finite=True):
    """Gradients through :func:`attention_varlen`, given ``grad_out = dL/dout``
    (total_q, Hq, Dv).

    Each sequence's gradients are those of :func:`entmax_ref.attention_vjp` on it alone
    (bit for bit); ``info`` (the packed :class:`entmax_ref.AttentionInfo` of
    ``attention_varlen(..., return_info=True)``, recommended: the lossless residual), or
    ``out`` and ``tau`` (the forward's output and ``info.tau``, packed as (total_q, Hq,
    Dv) and (total_q, Hq)), are passed on per sequence, with the meaning they have there.
    A sequence's keys get gradient only from its own queries.  ``check_finite`` (default
    True) rejects NaN and +-inf in q, k, v and grad_out (naming the first by its position
    in the packed array); off, a non-finite entry does
    what it does in :func:`entmax_ref.attention_vjp` with ``check_finite=False``, per
    sequence.

    Returns
    -------
    AttentionGradients(dq, dk, dv, dbeta, dgamma, ddelta, dalpha): dq, dk, dv packed like
    q, k, v; dbeta, dgamma, ddelta shaped like beta, gamma, delta (None without ASEntmax);
    dalpha shaped like alpha when alpha is an array, else None.

    Raises
    ------
    ValueError: everything :func:`attention_varlen` rejects, grad_out / out / tau / the
    fields of info of the wrong shape, both info and tau, and everything
    :func:`entmax_ref.attention_vjp` rejects in an info (another alpha, other masks).
    TypeError: ``info`` that is not an :class:`entmax_ref.AttentionInfo`.

    Examples
    --------
    >>> import numpy as np, entmax_ref as er
    >>> q = np.ones((3, 1, 1)); k = np.array([[[0.0]], [[1.0]], [[5.0]]]); v = k.copy()
    >>> cu = np.array([0, 2, 3])
    >>> g = er.attention_varlen_vjp(np.ones((3, 1, 1)), q, k, v, cu, cu, alpha=2, scale=1.0, causal=True)
    >>> g.dv[:, 0, 0].tolist()  # each key has all the mass of one query
    [1.0, 1.0, 1.0]
    """
    return attention_varlen_vjp_of(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, AttentionOptions.of(locals()),
                                   info=info, out=out, tau=tau)


def attention_varlen_vjp_of(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, opts: AttentionOptions, *, info=None,
                            out=None, tau=None):
    """:func:`attention_varlen_vjp` of the options record ``opts`` (what the public
    function and the adapters call)."""
    P = _Packed(q, k, v, cu_seqlens_q, cu_seqlens_k, opts)
    do = V.as_array(grad_out)
    expect = (P.total_q, P.Hq, P.Dv)
    if tuple(do.shape) != expect:
        raise ValueError(f"grad_out must have the output's shape {expect} (total_q, Hq, Dv), got {tuple(do.shape)}")
    out = None if out is None else V.as_array(out)
    tau = None if tau is None else V.as_array(tau)
    if out is not None and tuple(out.shape) != expect:
        raise ValueError(f"out must have shape {expect} (total_q, Hq, Dv), got {tuple(out.shape)}")
    if tau is not None and tuple(tau.shape) != expect[:2]:
        raise ValueError(f"tau must have shape {expect[:2]} (total_q, Hq), got {tuple(tau.shape)}")
    if info is not None:
        if not isinstance(info, AttentionInfo):
            raise TypeError(f"info must be the AttentionInfo of er.attention_varlen(..., return_info=True), "
                            f"got {type(info).__name__}")
        if tau is not None:
            raise ValueError("pass the forward's residual once: info (recommended) or tau, not both")
        for name in ("tau", "support", "s", "n", "theta", "row_max", "edge", "edge_p", "skew"):
            a = getattr(info, name)
            want = expect if name == "skew" else expect[:2]
            if a is None or tuple(a.shape) != want:
                got = None if a is None else tuple(a.shape)
                raise ValueError(f"info.{name} must have shape {want} (the packed rows of this call), got {got}")
    if opts.check_finite:  # first here, so that the error names a packed position
        P.check_finite((do, "grad_out"))
    xp = V.namespace(P.q)

    def like(x):
        _, odt = V.compute_dtype(x, "x")
        return xp.zeros(x.shape, odt)

    dq, dk, dv = like(P.q), like(P.k), like(P.v)
    dscale = None if P.params is None else {name: xp.zeros((P.total_q, P.Hq)) for name in P.params}
    dalpha = None
    for _, q0, q1, k0, k1 in P.sequences():
        g = attention_vjp_of(P.heads_first(do, q0, q1), P.heads_first(P.q, q0, q1), P.heads_first(P.k, k0, k1),
                             P.heads_first(P.v, k0, k1), P.options(q0, q1),
                             out=None if out is None else P.heads_first(out, q0, q1),
                             tau=None if tau is None else tau[q0:q1].T[None],
                             info=None if info is None else _sequence_info(info, q0, q1))
        dq[q0:q1] = g.dq[0].transpose(1, 0, 2)
        dk[k0:k1] = g.dk[0].transpose(1, 0, 2)
        dv[k0:k1] = g.dv[0].transpose(1, 0, 2)
        if dscale is not None:
            for name, part in zip(("beta", "gamma", "delta"), (g.dbeta, g.dgamma, g.ddelta)):
                dscale[name][q0:q1] = V.namespace(part).broadcast_to(part, (1, P.Hq, q1 - q0))[0].T
        if g.dalpha is not None:
            dalpha = g.dalpha if dalpha is None else dalpha + g.dalpha
    if dalpha is None and P.alpha_shape is not None:  # no sequence has a query
        dalpha = V.namespace(opts.alpha).asarray(np.zeros(P.alpha_shape))
    if dscale is None:
        return AttentionGradients(dq, dk, dv, dalpha=dalpha)
    red = {name: reduce_to(dscale[name], P.params[name].shape) for name in dscale}
    return AttentionGradients(dq, dk, dv, red["beta"], red["gamma"], red["delta"], dalpha)
