"""The CuPy backend: raw CUDA kernels (``cuda/*.cu``) behind the backend contract.

CuPy arrays in, CuPy arrays out; user data never leaves the device.  Small parameter
arrays the contract gives as NumPy (per-row alpha, ALiBi slopes, key lengths, the ASEntmax
row scale) are uploaded as they are, and each attention call reads back one int32 status
flag (non-finite scores, an unconverged row) so that it can raise like the reference.

Kernels are compiled on first use (``_cuda_loader``), never at import.  The numerical core
of every kernel is the ``__host__ __device__`` code of ``cuda/entmax_core.cuh``, which the
tests also compile with g++ and run on the CPU (``tests/test_cuda_core.py``):

* rows: sparsemax and 1.5-entmax by Newton with exact-support termination, softmax in
  closed form, any other alpha (and ``method="bisect"``) by a last-bit root finder, all in
  float64 whatever the storage dtype; ``n_iter`` counts passes over the row (it is not 0
  for sparsemax / 1.5-entmax as on the NumPy backend, which sorts);
* one warp per row when ``n <= CupyTuning.warp_max_n``, else one block per row;
* alpha-normmax and budget-sparsemax (``cuda/family_rows.cu``, core in
  ``cuda/family_core.cuh``): no sort on the GPU, so normmax runs monotone Newton on the
  beta-norm of the whole row and budget-sparsemax shrinks a bracket onto its breakpoints;
  same answers as the sort-based reference up to rounding (checked on the CPU by
  ``tests/test_cuda_family_core.py``);
* attention: query chunks, ``cupy.matmul`` (cuBLAS) for the products, raw kernels for
  the row solves and the backward's elementwise work, all in float64 whatever the
  input's dtype, as the CPU engines score (so that the supports are theirs, and TF32
  cannot touch a product), the results rounded to the input's dtype once at the end;
  theta, the edge residual (row max, edge, edge probability: p is rebuilt from it for
  alpha > 2) and the skewed output are kept per row, memory is O(chunk x Nk).

Every kernel takes one argument record (``cuda/entmax_teams.cuh``,
``cuda/entmax_attention.cu``), passed by value as a one-element NumPy array of the
structured dtype with the same fields (:data:`RECORDS`).

Methods (see :mod:`entmax_ref.backends.capabilities`): ``None`` (the default solvers
above) and ``"bisect"``; ``"sort"`` and ``"newton"`` (Newton for every alpha) are CPU-only
(NotImplementedError naming where they exist).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import cupy
import numpy as np

from . import _cuda_loader as L
from ._base import AttentionForward, AttentionGrads, AttentionResidual, AttentionSpec, RowSolve
from .capabilities import require
from .constants import CUDA_MAX_PASSES
from .geometry import attendable_keys, chunk_bounds, key_offset
from .attention_driver import backward_by_key_runs, forward_by_key_runs

_METHODS = {None: 0, "bisect": 1}  # the kernels' method codes (the table says which exist)
_ROWS = "entmax_rows.cu"
_ATTN = "entmax_attention.cu"
_FAMILY = "family_rows.cu"
_F64 = np.float64
_PTR = np.uint64  # a device pointer in an argument record


def _record(*fields) -> np.dtype:
    """The layout of a kernel's argument record: its fields in order, with C's alignment."""
    return np.dtype(list(fields), align=True)


#: er::RowForwardArgs<T> (the pointers' targets of type T: x, p)
ROW_FORWARD = _record(("x", _PTR), ("prm", _PTR), ("p", _PTR), ("threshold", _PTR), ("support", _PTR),
                      ("n_iter", _PTR), ("converged", _PTR), ("rows", np.int64), ("n", np.int32),
                      ("method", np.int32), ("max_iter", np.int32))
#: er::RowVjpArgs<T> (p, g, dx of type T)
ROW_VJP = _record(("p", _PTR), ("g", _PTR), ("prm", _PTR), ("dx", _PTR), ("dalpha", _PTR), ("rows", np.int64),
                  ("n", np.int32))
#: er::AttnChunk
ATTN_CHUNK = _record(("row_scale", _PTR), ("slopes", _PTR), ("key_lengths", _PTR), ("rows", np.int64),
                     ("i0", np.int64), ("nq", np.int64), ("offset", np.int64), ("scale", _F64), ("alpha", _F64),
                     ("n_keys", np.int32), ("chunk", np.int32), ("heads", np.int32), ("causal", np.int32))
#: er::AttnForwardArgs
ATTN_FORWARD = _record(("c", ATTN_CHUNK), ("dots", _PTR), ("u", _PTR), ("theta", _PTR), ("support", _PTR),
                       ("row_max", _PTR), ("edge", _PTR), ("edge_p", _PTR), ("sum_u", _PTR), ("bad", _PTR),
                       ("max_iter", np.int64))
#: er::AttnBackwardArgs
ATTN_BACKWARD = _record(("c", ATTN_CHUNK), ("dots", _PTR), ("dp", _PTR), ("theta", _PTR), ("row_max", _PTR),
                        ("edge", _PTR), ("edge_p", _PTR), ("delta", _PTR), ("ds", _PTR))
#: er::AttnProbsArgs
ATTN_PROBS = _record(("c", ATTN_CHUNK), ("dots", _PTR), ("u", _PTR), ("theta", _PTR), ("row_max", _PTR),
                     ("edge", _PTR), ("edge_p", _PTR), ("sum_u", _PTR))
#: er::NarrowArgs
NARROW = _record(("in", _PTR), ("out", _PTR), ("n", np.int64))
#: Each record's C++ type (tests/test_cuda_emu_kernels.py compares the layouts).
RECORDS = {"er::RowForwardArgs<double>": ROW_FORWARD, "er::RowVjpArgs<double>": ROW_VJP,
           "er::AttnChunk": ATTN_CHUNK, "er::AttnForwardArgs": ATTN_FORWARD, "er::AttnBackwardArgs": ATTN_BACKWARD,
           "er::AttnProbsArgs": ATTN_PROBS, "er::NarrowArgs": NARROW}


def _args(dtype: np.dtype, **fields) -> np.ndarray:
    """A one-element record of ``dtype`` (CuPy passes it by value): device arrays as their
    pointers, None as a null pointer, records and numbers as they are."""
    rec = np.zeros(1, dtype)
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, np.ndarray) and value.dtype.names:
            rec[name] = value[0]
        elif isinstance(value, cupy.ndarray):
            rec[name] = value.data.ptr
        else:
            rec[name] = value
    return rec


def _launch(kernel, grid, block, dtype: np.dtype, **fields) -> None:
    """``kernel`` on one record of ``dtype`` made of ``fields``.  The arrays stay referenced
    here until the launch is queued: memory freed sooner could be handed to another array
    and written before the kernel runs."""
    kernel(grid, block, (_args(dtype, **fields),))


@dataclass(frozen=True)
class CupyTuning:
    """Launch parameters of the cupy backend.

    warp_max_n: rows of at most this many entries get one warp each, longer rows one block.
    warps_per_block: rows per block for the warp-per-row kernels.
    block: threads per block for the block-per-row kernels (multiple of 32, <= 512).
    max_iter: cap on solver passes per row (a row that needs more is reported unconverged).
    attention_bytes: budget for one chunk's score buffers when ``spec.chunk`` is None.
    """

    warp_max_n: int = 1024
    warps_per_block: int = 4
    block: int = 256
    max_iter: int = CUDA_MAX_PASSES
    attention_bytes: int = 512 * 2**20

    @classmethod
    def default(cls) -> "CupyTuning":
        return cls()

    def __post_init__(self):
        if self.block % 32 or not 32 <= self.block <= L.MAX_BLOCK:
            raise ValueError(f"block must be a multiple of 32 in [32, {L.MAX_BLOCK}], got {self.block}")
        if not 1 <= self.warps_per_block <= L.MAX_BLOCK // 32:
            raise ValueError(f"warps_per_block must be in [1, {L.MAX_BLOCK // 32}], got {self.warps_per_block}")


def _scalar_name(dtype) -> str:
    return "double" if np.dtype(dtype) == np.float64 else "float"


def _compute_dtype(dtype) -> np.dtype:
    """The rows' storage type: float64 stays; float32, float16 and bfloat16 are stored in
    float32 (and solved in float64, as every row kernel computes)."""
    dt = np.dtype(dtype)
    if dt == np.float64:
        return dt
    if dt.kind == "f" or dt.name == "bfloat16":
        return np.dtype(np.float32)
    raise TypeError(f"the cupy backend computes on float arrays, got {dt}")


def _device(a, dtype=None):
    """A C-contiguous device array (uploads NumPy parameter arrays, copies only if needed)."""
    return cupy.ascontiguousarray(cupy.asarray(a, dtype=dtype))


def _alpha_groups(spec: AttentionSpec, Hq: int, Hkv: int):
    """For alpha per query head: [(heads, kv heads, spec)] per distinct alpha, each spec a
    scalar-alpha problem on those query heads (their ALiBi slopes and row scales), whose
    key/value heads are the ones they read (one per query head)."""
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    ha = np.asarray(spec.head_alpha, np.float64)
    out = []
    for a in np.unique(ha):
        heads = np.flatnonzero(ha == a).tolist()
        out.append((heads, [h // (Hq // Hkv) for h in heads], replace(
            spec, alpha=float(a), head_alpha=None,
            alibi_slopes=None if spec.alibi_slopes is None else spec.alibi_slopes[heads],
            row_scale=None if spec.row_scale is None else spec.row_scale[:, heads])))
    return out


def _gather_heads(parts, fields, B: int, Hq: int):
    """Per field, the (B, Hq, ...) array whose heads come from the groups' ``parts``
    ([(heads, result)]); None where the groups return None."""
    out = {}
    for name in fields:
        pieces = [(heads, getattr(r, name)) for heads, r in parts]
        if any(piece is None for _, piece in pieces):
            out[name] = None
            continue
        full = cupy.empty((B, Hq) + pieces[0][1].shape[2:], pieces[0][1].dtype)
        for heads, piece in pieces:
            full[:, heads] = piece
        out[name] = full
    return out


def _key_holes(spec: AttentionSpec, Nk: int):
    """For a key_padding_mask with holes: the attendable keys of each batch (host index
    arrays) and the problem on them moved to the front (no mask, a key length per batch).
    Scores without a causal bound or ALiBi do not depend on a key's position, so this is
    the same problem; with either, a ValueError."""
    if spec.causal or spec.alibi_slopes is not None:
        raise ValueError("the cupy backend's attention does not support a key_padding_mask with holes together "
                         "with causal or ALiBi (only one run of keys per batch); use backend='numba' or "
                         "'numpy' (move the arrays to the host)")
    idx = [np.flatnonzero(row) for row in attendable_keys(Nk, spec.key_mask, spec.key_lengths)]
    return idx, replace(spec, key_mask=None, key_lengths=np.array([len(i) for i in idx], np.int64))


def _keys_to_front(t, idx):
    out = cupy.zeros(t.shape, t.dtype)
    for b, i in enumerate(idx):
        out[b, :, :len(i)] = t[b][:, i.tolist()]
    return out


class CupyBackend:
    """Raw CUDA kernels on CuPy arrays (see the module docstring)."""

    name = "cupy"

    def __init__(self, tuning: CupyTuning | None = None):
        self.tuning = tuning or CupyTuning.default()

    def owns(self, x) -> bool:
        return isinstance(x, cupy.ndarray)

    def warmup(self) -> None:
        """Compile every kernel for the current device now (e.g. before benchmarking)."""
        for source in L.KERNELS:
            for expr in L.name_expressions(source):
                L.get_module(source).get_function(expr)

    # ------------------------------------------------------------------ launching
    def _launch_rows(self, source: str, name: str, scalar: str, dtype, **fields) -> None:
        """``name``'s warp-per-row kernel for rows of at most ``warp_max_n`` entries, else
        its block-per-row kernel (``cuda/entmax_teams.cuh``), on one record of ``dtype``
        (whose ``rows`` and ``n`` are the rows' count and length)."""
        t, rows = self.tuning, fields["rows"]
        if fields["n"] <= t.warp_max_n:
            per = t.warps_per_block
            _launch(L.get_kernel(source, f"{name}_warp", scalar), ((rows + per - 1) // per,), (32 * per,), dtype,
                    **fields)
        else:
            _launch(L.get_kernel(source, f"{name}_block", scalar), (rows,), (t.block,), dtype, **fields)

    def _row_forward(self, source: str, name: str, x, prm, method: int = 0) -> RowSolve:
        """A forward row kernel (er::RowForwardArgs) with ``prm`` one float64 per row (alpha,
        the budget)."""
        rows, n = x.shape
        if n >= 2**31:
            raise ValueError(f"rows longer than 2**31 - 1 entries are not supported (n = {n})")
        cdt = _compute_dtype(x.dtype)
        xc = cupy.ascontiguousarray(x, dtype=cdt)
        prm = _device(prm, _F64)
        out = dict(p=cupy.empty((rows, n), cdt), threshold=cupy.empty(rows, _F64), support=cupy.empty(rows, np.int64),
                   n_iter=cupy.empty(rows, np.int64), converged=cupy.empty(rows, np.bool_))
        if rows:
            self._launch_rows(source, name, _scalar_name(cdt), ROW_FORWARD, x=xc, prm=prm, rows=rows, n=n,
                              method=method, max_iter=self.tuning.max_iter, **out)
        return RowSolve(out["p"].astype(x.dtype, copy=False), out["threshold"], out["support"], out["n_iter"],
                        out["converged"])

    def _row_vjp(self, source: str, name: str, p, g, prm=None, per_row: bool = False):
        """A VJP row kernel (er::RowVjpArgs), ``prm`` one float64 per row (alpha) or None;
        the (rows, n) gradient, or with ``per_row`` one float64 per row."""
        out_dtype = np.result_type(p.dtype, g.dtype)
        cdt = _compute_dtype(out_dtype)
        pc, gc = cupy.ascontiguousarray(p, dtype=cdt), cupy.ascontiguousarray(g, dtype=cdt)
        rows, n = pc.shape
        out = cupy.empty(rows, _F64) if per_row else cupy.empty((rows, n), cdt)
        if rows:
            self._launch_rows(source, name, _scalar_name(cdt), ROW_VJP, p=pc, g=gc,
                              prm=None if prm is None else _device(prm, _F64), rows=rows, n=n,
                              **{"dalpha" if per_row else "dx": out})
        return out if per_row else out.astype(out_dtype, copy=False)

    def _attn_kernel(self, name: str, n_keys: int, rows: int):
        t = self.tuning
        if n_keys <= t.warp_max_n and not name.startswith("attn_probs_from_"):
            per = t.warps_per_block
            return L.get_kernel(_ATTN, f"{name}_warp"), ((rows + per - 1) // per,), (32 * per,)
        return L.get_kernel(_ATTN, f"{name}_block"), (rows,), (t.block,)

    def _narrow(self, a, dtype):
        """A float64 result in ``dtype``: to float32 by ``narrow_to_float`` (er::store keeps
        subnormals, which CuPy's -ftz=true cast would flush), then CuPy's cast for float16."""
        dtype = np.dtype(dtype)
        if dtype == np.float64:
            return a
        out = cupy.empty(a.shape, np.float32)
        if a.size:
            blocks = min((a.size + 255) // 256, 65535)
            _launch(L.get_kernel(_ATTN, "narrow_to_float"), (blocks,), (256,), NARROW,
                    **{"in": cupy.ascontiguousarray(a), "out": out, "n": a.size})
        return out if dtype == np.float32 else out.astype(dtype)

    # ------------------------------------------------------------------ rows
    def entmax_forward(self, x, alpha, method: str | None) -> RowSolve:
        require(self.name, "entmax_forward", method)
        return self._row_forward(_ROWS, "entmax_forward", x, alpha, _METHODS[method])

    def entmax_vjp(self, p, g, alpha):
        return self._row_vjp(_ROWS, "entmax_vjp", p, g, alpha)

    def entmax_alpha_vjp(self, p, g, alpha):
        return self._row_vjp(_ROWS, "entmax_alpha_vjp", p, g, alpha, per_row=True)

    # ------------------------------------------------------------------ normmax, budget
    def normmax_forward(self, x, alpha) -> RowSolve:
        """Monotone Newton on the beta-norm over the whole row from tau = max - 1 (no sort on
        the GPU; ``n_iter`` counts passes), ``cuda/family_core.cuh``."""
        return self._row_forward(_FAMILY, "normmax_forward", x, alpha)

    def normmax_vjp(self, p, g, alpha):
        return self._row_vjp(_FAMILY, "normmax_vjp", p, g, alpha)

    def budget_forward(self, x, budget) -> RowSolve:
        """The breakpoint bracket shrunk by halving / snapping to the largest inner
        breakpoint, then the closed form on the piece (``cuda/family_core.cuh``)."""
        return self._row_forward(_FAMILY, "budget_forward", x, budget)

    def budget_vjp(self, p, g):
        return self._row_vjp(_FAMILY, "budget_vjp", p, g)

    # ------------------------------------------------------------------ attention
    def _attn_setup(self, q, k, v, spec: AttentionSpec):
        """Shapes, q, k, v in float64 (the CPU engines' scoring precision), the chunk's
        geometry record without its per-chunk fields, the chunk size and the longest key
        run."""
        if spec.key_mask is not None:  # the drivers above take every mask off first
            raise ValueError("key_mask must be resolved before the kernels' setup")
        B, Hq, Nq, D = q.shape
        Hkv, Nk, Dv = v.shape[1], v.shape[2], v.shape[3]
        if Hq % Hkv:
            raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
        if Nk >= 2**31:
            raise ValueError(f"at most 2**31 - 1 keys are supported (Nk = {Nk})")
        qc, kc, vc = (cupy.ascontiguousarray(t, dtype=_F64) for t in (q, k, v))
        lengths = None if spec.key_lengths is None else np.asarray(spec.key_lengths, np.int64)
        terms = dict(row_scale=None if spec.row_scale is None else _device(spec.row_scale, _F64),
                     slopes=None if spec.alibi_slopes is None else _device(spec.alibi_slopes, _F64),
                     key_lengths=None if lengths is None else _device(lengths, np.int64),
                     nq=Nq, offset=key_offset(Nq, Nk), scale=spec.scale, alpha=spec.alpha, heads=Hq,
                     causal=int(bool(spec.causal)))
        if spec.chunk is not None:
            chunk = max(1, int(spec.chunk))
        else:  # two float64 (rows, keys) buffers of every head's rows
            per_row = 2 * B * Hq * max(Nk, 1) * 8
            chunk = int(max(1, min(max(Nq, 1), self.tuning.attention_bytes // per_row)))
        max_len = Nk if lengths is None else int(min(Nk, max(int(lengths.max(initial=0)), 0)))
        return (B, Hq, Nq, D, Hkv, Nk, Dv, Hq // Hkv), (qc, kc, vc), terms, chunk, max_len

    @staticmethod
    def _chunk(terms: dict, i0: int, cc: int, kend: int, rows: int) -> np.ndarray:
        """The er::AttnChunk record of one query chunk (its device arrays stay referenced
        by ``terms`` until the call ends)."""
        return _args(ATTN_CHUNK, rows=rows, i0=i0, n_keys=kend, chunk=cc, **terms)

    @staticmethod
    def _skewed(o, u, vv, su, alpha: float):
        """The skewed output sum_j u_ij v_j / sum_j u_ij of a chunk's rows (o = P V at
        alpha = 1, where u = p)."""
        if alpha == 1.0:
            return o
        sum_u = su.reshape(u.shape[:-1] + (1,))
        return cupy.where(sum_u > 0, cupy.matmul(u, vv) / cupy.where(sum_u > 0, sum_u, 1.0), 0.0)

    def attention_forward(self, q, k, v, spec: AttentionSpec) -> AttentionForward:
        if spec.head_alpha is not None:  # one launch sequence per distinct alpha
            parts = [(heads, self.attention_forward(q[:, heads], k[:, kv], v[:, kv], sub))
                     for heads, kv, sub in _alpha_groups(spec, q.shape[1], k.shape[1])]
            names = [n for n in AttentionForward._fields if n != "support_keys"]
            return AttentionForward(**_gather_heads(parts, names, q.shape[0], q.shape[1]))
        if spec.key_mask is not None:  # padding (one run of keys per batch): per batch, key-sliced
            return forward_by_key_runs(self.attention_forward, q, k, v, spec,
                                       lambda: self._forward_holes(q, k, v, spec))
        (B, Hq, Nq, D, Hkv, Nk, Dv, G), (qc, kc, vc), terms, chunk, max_len = self._attn_setup(q, k, v, spec)
        res = dict(theta=cupy.full((B, Hq, Nq), -np.inf, _F64), support=cupy.zeros((B, Hq, Nq), np.int64),
                   row_max=cupy.full((B, Hq, Nq), -np.inf, _F64), edge=cupy.full((B, Hq, Nq), -np.inf, _F64),
                   edge_p=cupy.zeros((B, Hq, Nq), _F64))
        out = cupy.zeros((B, Hq, Nq, Dv), _F64)
        skew = cupy.zeros((B, Hq, Nq, Dv), _F64)
        bad = cupy.zeros(1, np.int32)
        q5 = qc.reshape(B, Hkv, G, Nq, D)
        for i0, i1, kend in chunk_bounds(max_len, Nq, Nk, chunk, spec.causal):
            cc, rows = i1 - i0, B * Hq * (i1 - i0)
            qch = cupy.ascontiguousarray(q5[:, :, :, i0:i1]).reshape(B, Hkv, G * cc, D)
            kk, vv = kc[:, :, :kend], vc[:, :, :kend]
            s = cupy.ascontiguousarray(cupy.matmul(qch, kk.transpose(0, 1, 3, 2)))  # (B, Hkv, G*cc, kend)
            u, su = cupy.empty_like(s), cupy.empty(rows, _F64)
            kernel, grid, block = self._attn_kernel("attn_forward", kend, rows)
            _launch(kernel, grid, block, ATTN_FORWARD, c=self._chunk(terms, i0, cc, kend, rows), dots=s, u=u,
                    sum_u=su, bad=bad, max_iter=self.tuning.max_iter, **res)
            o = cupy.matmul(s, vv)  # p v
            out[:, :, i0:i1] = o.reshape(B, Hq, cc, Dv)
            skew[:, :, i0:i1] = self._skewed(o, u, vv, su, spec.alpha).reshape(B, Hq, cc, Dv)
        self._check(bad)
        return AttentionForward(self._narrow(out, q.dtype), res["theta"], res["support"], skew, res["row_max"],
                                res["edge"], res["edge_p"])

    def _forward_holes(self, q, k, v, spec: AttentionSpec) -> AttentionForward:
        idx, sub = _key_holes(spec, k.shape[2])
        k, v = cupy.asarray(k), cupy.asarray(v)
        return self.attention_forward(q, _keys_to_front(k, idx), _keys_to_front(v, idx), sub)

    def _backward_holes(self, do, q, k, v, res, skew, spec: AttentionSpec) -> AttentionGrads:
        """dK and dV of the keys moved to the front, put back in place (0 on masked keys)."""
        idx, sub = _key_holes(spec, k.shape[2])
        k, v = cupy.asarray(k), cupy.asarray(v)
        g = self.attention_backward(do, q, _keys_to_front(k, idx), _keys_to_front(v, idx), res, skew, sub)
        dk, dv = cupy.zeros(k.shape, g.dk.dtype), cupy.zeros(v.shape, g.dv.dtype)
        for b, i in enumerate(idx):
            dk[b][:, i.tolist()] = g.dk[b, :, :len(i)]
            dv[b][:, i.tolist()] = g.dv[b, :, :len(i)]
        return g._replace(dk=dk, dv=dv)

    def _backward_per_head_alpha(self, do, q, k, v, res, skew, spec: AttentionSpec) -> AttentionGrads:
        """The backward of the forward's split by alpha: dK and dV summed over the query
        heads that read each key/value head."""
        B, Hq = q.shape[:2]
        q, k, v, do = (cupy.asarray(t) for t in (q, k, v, do))
        dk, dv, parts = None, None, []
        for heads, kv, sub in _alpha_groups(spec, Hq, k.shape[1]):
            res_h = AttentionResidual(*(None if f is None else f[:, heads]
                                        for f in (getattr(res, n, None) for n in AttentionResidual._fields)))
            g = self.attention_backward(do[:, heads], q[:, heads], k[:, kv], v[:, kv], res_h,
                                        None if skew is None else skew[:, heads], sub)
            if dk is None:
                dk, dv = cupy.zeros(k.shape, g.dk.dtype), cupy.zeros(v.shape, g.dv.dtype)
            for j, h in enumerate(kv):
                dk[:, h] += g.dk[:, j]
                dv[:, h] += g.dv[:, j]
            parts.append((heads, g))
        got = _gather_heads(parts, ("dq", "drow_scale", "dalpha"), B, Hq)
        return AttentionGrads(got["dq"], dk, dv, got["drow_scale"], got["dalpha"])

    @staticmethod
    def _check(bad) -> None:
        status = int(bad.get()[0])  # the one scalar read back per call
        if status == 1:
            raise ValueError("attention scores overflowed (non-finite s * scale * q.k + bias); "
                             "rescale q, k, the scale or the ASEntmax scale")
        if status == 2:
            raise RuntimeError("an attention row did not converge within CupyTuning.max_iter solver passes")

    def attention_backward(self, do, q, k, v, res, skew, spec: AttentionSpec) -> AttentionGrads:
        """From the forward's residual ``res``: theta, and for alpha > 2 the edge (row_max,
        edge, edge_p), from which the kernels rebuild p as the row solver wrote it (an entry
        the backward's product scores within rounding of the edge is the edge).  Products
        and sums in float64, dq, dk, dv rounded to the inputs' dtypes at the end."""
        if spec.head_alpha is not None:
            return self._backward_per_head_alpha(do, q, k, v, res, skew, spec)
        if spec.key_mask is not None:
            return backward_by_key_runs(self.attention_backward, do, q, k, v, res, skew, spec,
                                        lambda: self._backward_holes(do, q, k, v, res, skew, spec))
        (B, Hq, Nq, D, Hkv, Nk, Dv, G), (qc, kc, vc), terms, chunk, max_len = self._attn_setup(q, k, v, spec)
        doc = cupy.ascontiguousarray(do, dtype=_F64)
        if spec.alpha > 2.0 and (res.row_max is None or res.edge is None or res.edge_p is None):
            raise ValueError("alpha > 2 needs the forward's row_max, edge and edge_p to rebuild p exactly")
        th = _device(res.theta, _F64)
        # not read for alpha <= 2 (any array of the right shape will do)
        resid = dict(theta=th, **{n: th if a is None else _device(a, _F64)
                                  for n, a in (("row_max", res.row_max), ("edge", res.edge), ("edge_p", res.edge_p))})
        skew_all = None if skew is None else _device(skew, _F64)
        dq = cupy.zeros((B, Hq, Nq, D), _F64)
        dk = cupy.zeros((B, Hkv, Nk, D), _F64)
        dv = cupy.zeros((B, Hkv, Nk, Dv), _F64)
        ds = cupy.zeros((B, Hq, Nq), _F64) if spec.row_scale is not None else None
        da = cupy.zeros((B, Hq, Nq), _F64) if spec.alpha_grad else None
        q5 = qc.reshape(B, Hkv, G, Nq, D)
        do5 = doc.reshape(B, Hkv, G, Nq, Dv)
        for i0, i1, kend in chunk_bounds(max_len, Nq, Nk, chunk, spec.causal):
            cc, rows = i1 - i0, B * Hq * (i1 - i0)
            c = self._chunk(terms, i0, cc, kend, rows)
            qch = cupy.ascontiguousarray(q5[:, :, :, i0:i1]).reshape(B, Hkv, G * cc, D)
            doch = cupy.ascontiguousarray(do5[:, :, :, i0:i1]).reshape(B, Hkv, G * cc, Dv)
            kk, vv = kc[:, :, :kend], vc[:, :, :kend]
            s = cupy.ascontiguousarray(cupy.matmul(qch, kk.transpose(0, 1, 3, 2)))
            if skew_all is None:  # recompute the skewed output from the residual
                p, u, su = s.copy(), cupy.empty_like(s), cupy.empty(rows, _F64)
                name = "attn_probs_from_edge" if spec.alpha > 2.0 else "attn_probs_from_theta"
                kernel, grid, block = self._attn_kernel(name, kend, rows)
                _launch(kernel, grid, block, ATTN_PROBS, c=c, dots=p, u=u, sum_u=su, **resid)
                sk = self._skewed(cupy.matmul(p, vv) if spec.alpha == 1.0 else None, u, vv, su, spec.alpha)
                del p, u
            else:
                sk = skew_all[:, :, i0:i1].reshape(B, Hkv, G * cc, Dv)
            delta = cupy.ascontiguousarray((doch * sk).sum(axis=-1)).reshape(rows)
            dp = cupy.ascontiguousarray(cupy.matmul(doch, vv.transpose(0, 1, 3, 2)))  # dO v^T
            dp_up = None if da is None else dp.copy()
            kernel, grid, block = self._attn_kernel("attn_backward", kend, rows)
            _launch(kernel, grid, block, ATTN_BACKWARD, c=c, dots=s, dp=dp, delta=delta, ds=ds, **resid)
            # s now holds p, dp holds s_i * dZ.
            if da is not None:  # dL/dalpha of each row at fixed scores: the row alpha-VJP of p and dO v^T
                da[:, :, i0:i1] = self.entmax_alpha_vjp(s.reshape(rows, kend), dp_up.reshape(rows, kend),
                                                        np.full(rows, spec.alpha)).reshape(B, Hq, cc)
            dv[:, :, :kend] += cupy.matmul(s.transpose(0, 1, 3, 2), doch)
            dq[:, :, i0:i1] = (spec.scale * cupy.matmul(dp, kk)).reshape(B, Hq, cc, D)
            dk[:, :, :kend] += spec.scale * cupy.matmul(dp.transpose(0, 1, 3, 2), qch)
        return AttentionGrads(self._narrow(dq, q.dtype), self._narrow(dk, k.dtype), self._narrow(dv, v.dtype), ds, da)
