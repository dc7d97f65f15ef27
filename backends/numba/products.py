"""Matrix products of the numba attention, on the calling thread: BLAS without a thread cap.

The attention drivers run ``numba.get_num_threads()`` worker threads, each alternating a
score product and a ``nogil`` row kernel.  A multi-threaded BLAS called from them wakes its
own thread pool, whose threads then spin against the workers on the same cores (about 3x
slower on 2 cores); capping BLAS at one thread would change the caller's whole process.
:func:`matmul_into` instead cuts a product into BLAS calls of at most
:data:`CALL_MADDS` multiply-adds, which OpenBLAS runs on the calling thread (it starts its
pool only for larger products: its ``GEMM_MULTITHREAD_THRESHOLD`` of 4 x 65,536), so the
caller's BLAS settings are neither read nor changed and no BLAS thread wakes.  The calls go
to SciPy's BLAS (``scipy.linalg.cython_blas``, through numba's own ``numba_xxgemm``
wrapper, the function behind numba's ``np.dot``), with leading dimensions, so the blocks
are read and written in place: a slice of the keys, a transposed view, a block of the
output, no copies.

The blocks change how a product's sums are split (over the inner dimension beyond
:data:`INNER_BLOCK`), never what is computed: every product here is a filter (whose
rounding the error bound of :func:`~.attention_filter.score_errors` covers), a float64
product that BLAS rounds in an unspecified order anyway, or a dK, dV part of the dense
backward.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic
from numba.np.linalg import ensure_blas, get_blas_kind

from ..cache_folder import NUMBA_VERSION, tested
from ._jit import f64, jit, kernel

#: The most multiply-adds of one BLAS call (2^18): OpenBLAS runs a product of at most
#: this size on the calling thread.  Blocks of 64 x 64 scores at D = 64 run at the speed
#: of one whole-product call with BLAS held at one thread (float32 and float64, AVX-512).
CALL_MADDS = 2**18

#: The most rows of the output in one block.
ROW_BLOCK = 64

#: The longest inner dimension of one block (longer sums are split and added up).
INNER_BLOCK = 256

#: Whether the blocks go straight to numba's BLAS wrapper (:func:`_xxgemm`, which binds
#: ``numba_xxgemm``, a function of numba's own C helpers): on the numba releases this
#: package is tested on (:data:`~entmax_ref.backends.cache_folder.TESTED_NUMBA`); on any
#: other, each block is a public ``np.dot`` of contiguous copies (:func:`_dot_block`).
DIRECT_BLAS = tested(NUMBA_VERSION)

_CHAR = ir.IntType(8)
_VOIDP = ir.IntType(8).as_pointer()


@intrinsic
def _xxgemm(typingctx, trans, dims, a, b, beta, c):
    """Fortran ``?gemm``: ``c = op(a) op(b) + beta c`` (column-major, alpha 1) with ``trans
    = (transa, transb)`` (0 for "N", 1 for "T"), ``dims = (m, n, k)`` and each operand an
    ``(array, leading dimension)`` pair, on the data of the arrays (their first element);
    returns the wrapper's status (0)."""
    ensure_blas()
    arrays = [t.types[0] if isinstance(t, types.BaseTuple) else None for t in (a, b, c)]
    if any(t is None for t in arrays) or len({t.dtype for t in arrays}) != 1:
        raise TypingError(f"_xxgemm: (array, leading dimension) operands of one float dtype, not {a}, {b}, {c}")
    dtype = arrays[2].dtype
    kind = get_blas_kind(dtype)
    sig = types.intc(trans, dims, a, b, beta, c)

    def codegen(context, builder, sig, args):
        from numba.np.arrayobj import make_array

        fnty = ir.FunctionType(ir.IntType(32), [_CHAR, _CHAR, _CHAR, cgutils.intp_t, cgutils.intp_t,
                                                cgutils.intp_t, _VOIDP, _VOIDP, cgutils.intp_t, _VOIDP,
                                                cgutils.intp_t, _VOIDP, _VOIDP, cgutils.intp_t])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")
        one = cgutils.alloca_once_value(builder, context.get_constant(dtype, 1.0))
        bslot = cgutils.alloca_once_value(builder, context.cast(builder, args[4], sig.args[4], dtype))

        def item(i, j):  # (value, type) of entry j of the tuple argument i
            return builder.extract_value(args[i], j), sig.args[i].types[j]

        def trans(j):
            flag, _ = item(0, j)
            return builder.select(builder.icmp_signed("!=", flag, flag.type(0)), _CHAR(ord("t")), _CHAR(ord("n")))

        def intp(i, j):
            val, ty = item(i, j)
            return context.cast(builder, val, ty, types.intp)

        def operand(i):  # the data pointer and the leading dimension of an (array, ld) pair
            val, ty = item(i, 0)
            return builder.bitcast(make_array(ty)(context, builder, val).data, _VOIDP), intp(i, 1)

        (ap, lda), (bp, ldb), (cp, ldc) = operand(2), operand(3), operand(5)
        return builder.call(fn, (_CHAR(ord(kind)), trans(0), trans(1), intp(1, 0), intp(1, 1), intp(1, 2),
                                 builder.bitcast(one, _VOIDP), ap, lda, bp, ldb, builder.bitcast(bslot, _VOIDP),
                                 cp, ldc))

    return sig, codegen


@jit(_nrt=False)
def _orient(a):
    """(transposed, leading dimension) of a 2-D view for BLAS: 0 when its rows are
    contiguous (row-major), 1 when its columns are; (-1, 0) for any other strides."""
    size = a.itemsize
    rows, cols = a.shape
    if a.strides[1] == size or cols <= 1:
        if rows <= 1:
            return 0, max(cols, 1)
        if a.strides[0] % size == 0 and a.strides[0] // size >= max(cols, 1):
            return 0, a.strides[0] // size
    if a.strides[0] == size or rows <= 1:
        if cols <= 1:
            return 1, max(rows, 1)
        if a.strides[1] % size == 0 and a.strides[1] // size >= max(rows, 1):
            return 1, a.strides[1] // size
    return -1, 0


@kernel((lambda x: (x[:, ::1], x[:, ::1], x[:, ::1], f64),  # whole C-contiguous operands
         lambda x: (x[:, ::1], x[:, :], x[:, ::1], f64),  # the transposed keys up to a chunk's last key
         lambda x: (x[::1, :], x[:, ::1], x[:, ::1], f64) if x == f64 else None),  # the backward's P.T, U.T
        ops=("attention_forward", "attention_backward"))
def matmul_into(x, y, out, beta):
    """``out = x @ y + beta * out`` (``beta`` 0: ``out``'s old values are not read) in BLAS
    calls of at most :data:`CALL_MADDS` multiply-adds, on the calling thread.

    ``x`` (m, k), ``y`` (k, n) and ``out`` (m, n) are views of one float dtype, each with
    contiguous rows or (``x``, ``y``) contiguous columns: slices and transposes of
    C-contiguous arrays; any other strides raise ValueError."""
    m, kk = x.shape
    n = y.shape[1]
    if y.shape[0] != kk or out.shape[0] != m or out.shape[1] != n:
        raise ValueError("matmul_into: the shapes do not match")
    tx, ldx = _orient(x)  # a block of a view has the view's strides: one orientation for all
    ty, ldy = _orient(y)
    to, ldc = _orient(out)
    if tx < 0 or ty < 0 or to != 0:
        raise ValueError("matmul_into: an operand has neither contiguous rows nor contiguous columns")
    if m == 0 or n == 0:
        return
    if kk == 0:
        for i in range(m):  # loops, not slice arithmetic: no shape-error formatting to compile
            for j in range(n):
                out[i, j] = 0.0 if beta == 0.0 else beta * out[i, j]
        return
    kb = min(kk, INNER_BLOCK)
    mb = min(m, ROW_BLOCK)
    nb = max(1, CALL_MADDS // (kb * mb))
    for i0 in range(0, m, mb):
        i1 = min(m, i0 + mb)
        for j0 in range(0, n, nb):
            j1 = min(n, j0 + nb)
            c = out[i0:i1, j0:j1]
            for k0 in range(0, kk, kb):
                k1 = min(kk, k0 + kb)
                xs = x[i0:i1, k0:k1]
                ys = y[k0:k1, j0:j1]
                # row-major c (m x n) is the column-major c^T = y^T x^T: Fortran's A is
                # the block of y, its B the block of x
                b = beta if k0 == 0 else 1.0
                if DIRECT_BLAS:  # a compile-time constant: the other branch is not compiled
                    _xxgemm((ty, tx), (j1 - j0, i1 - i0, k1 - k0), (ys, ldy), (xs, ldx), b, (c, ldc))
                else:
                    _dot_block(xs, ys, b, c)


@jit
def _dot_block(xs, ys, beta, c):
    """``c = xs @ ys + beta * c`` through numba's public ``np.dot`` (on contiguous copies
    of the blocks): :func:`matmul_into`'s product where :data:`DIRECT_BLAS` is off."""
    p = np.dot(np.ascontiguousarray(xs), np.ascontiguousarray(ys))
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            c[i, j] = p[i, j] if beta == 0.0 else p[i, j] + beta * c[i, j]
