"""GEMM on the CPU: BLAS called in place on the caller's memory and leading dimensions.

No operand is copied (the shared dispatcher has already copied aside an A or B that C
overlaps, which BLAS leaves undefined).

BLAS never runs its own threads here: a GEMM large enough for OpenBLAS to thread
(:data:`SPLIT_MACS` multiply-adds, OpenBLAS's own threshold) is split into blocks of C's
columns (or rows, for tall C), one per worker thread, each a single-threaded BLAS call;
batched GEMMs split batches the same way. A float32 GEMV with unit-stride vectors (a
decoding step's products) runs instead as one compiled loop per thread pulling blocks of
the matrix's columns (:mod:`._kgemv`): GPT-2-small's step took 0.88-0.95 of its time with
the two halves as Python tasks (paired runs in one process), 0.92-0.98 on one thread.
OpenBLAS's threads spin for a while after each call, so letting it thread while the
backend's own workers run the convolutions, attention and element-wise ops between GEMMs
puts two busy pools on the same cores: on a 2-core machine a BERT-base encoder ran 4-5x
slower that way than with one pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F32
from ...memory import Region, ceil_div
from ...types import MixedPrecision
from .._common import round_up
from ._blas import gemm_at, gemv_at
from ._gemm_dense import dense_batched, weight_panel
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas, workers

__all__ = ["GemmOps"]

#: Batched GEMM hands each thread at least this many multiply-adds.
BATCH_GRAIN_FLOPS = 1 << 21
#: A GEMM (or GEMV) of this many multiply-adds or more is split over the worker threads
#: (OpenBLAS threads from here on: ``SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD``).
SPLIT_MACS = 1 << 18
#: Split points fall on multiples of this many columns / rows (BLAS kernels' unrolling).
SPLIT_ALIGN = 16


def split_gemm(p: v.GemmProblem) -> None:
    """``p`` on its own addresses, split over the worker threads when it is large.

    Each part is one single-threaded BLAS call on a block of C's columns (or of its rows,
    when C is taller than wide); the blocks never overlap, and every part reads the whole
    of the other operand.
    """
    a, b, c = p.a.ptr, p.b.ptr, p.c.ptr
    macs = p.m * p.n * max(1, p.k)
    if p.empty or p.product_skipped or (macs < SPLIT_MACS and p.m > 1 and p.n > 1):
        # Nothing to thread: OpenBLAS runs GEMMs this small on the calling thread itself,
        # so the process-wide limit (and its cost) is not taken.
        run_gemm(p, a, b, c)
        return
    if workers() == 1 or macs < SPLIT_MACS:
        # Small GEMVs (OpenBLAS threads them from far fewer multiply-adds than GEMMs).
        with single_threaded_blas():
            run_gemm(p, a, b, c)
        return
    if (p.m == 1 or p.n == 1) and _pulled_gemv(p):
        return
    size = p.dtype.itemsize
    by_columns = p.n >= p.m
    total = p.n if by_columns else p.m
    parts = min(workers(), max(1, total // SPLIT_ALIGN))

    def run(start: int, stop: int) -> None:
        if by_columns:
            b_at = b + start * size * (1 if p.trans_b else p.ldb)
            part = replace(p, n=stop - start)
            run_gemm(part, a, b_at, c + start * p.ldc * size)
        else:
            a_at = a + start * size * (p.lda if p.trans_a else 1)
            part = replace(p, m=stop - start)
            run_gemm(part, a_at, b, c + start * size)

    bounds = [min(total, round_up(total * i // parts, SPLIT_ALIGN)) for i in range(parts)] + [total]

    def pull(items: Iterator[int]) -> None:
        for i in items:
            run(bounds[i], bounds[i + 1])

    with single_threaded_blas():
        parallel_pull(parts, pull)


def _pulled_gemv(p: v.GemmProblem) -> bool:
    """A float32 GEMV with unit-stride vectors on the compiled pulled loop (:mod:`._kgemv`).

    The caller and one worker take blocks of the matrix's columns from a shared counter;
    the caller waits only for blocks the worker took. False (nothing done) where it does
    not apply.
    """
    if p.n == 1:  # C (m x 1) = op(A) (m x k) @ op(B) (k x 1): A is the matrix.
        rows, cols = (p.k, p.m) if p.trans_a else (p.m, p.k)
        trans, matrix, lda, vector = p.trans_a, p.a, p.lda, p.b
        inc, inc_out = p.ldb if p.trans_b else 1, 1
    else:  # C^T (n x 1) = op(B)^T @ op(A)^T: B is the matrix.
        rows, cols = (p.n, p.k) if p.trans_b else (p.k, p.n)
        trans, matrix, lda, vector = not p.trans_b, p.b, p.ldb, p.a
        inc, inc_out = 1 if p.trans_a else p.lda, p.ldc
    compiled = kernels("_kgemv") if p.dtype == F32 and inc == inc_out == 1 else None
    if compiled is None:
        return False
    flat = CpuPlumbing._flat
    y = flat(p.c, F32)[: cols if trans else rows]
    with single_threaded_blas():
        compiled.gemv(trans, rows, cols, p.alpha, flat(matrix, F32), lda, flat(vector, F32), p.beta, y)
    return True


def run_gemm(p: v.GemmProblem, a: int, b: int, c: int) -> None:
    """One GEMM of ``p``'s shape on the given addresses, with BLAS's quick returns."""
    if p.empty:
        return
    if p.product_skipped:
        # BLAS quick return for k == 0 or alpha == 0: C = beta * C (write-only if beta == 0).
        gemm_at(p.dtype, False, False, p.m, p.n, 0, 0.0, c, max(1, p.m), c, 1, p.beta, c, p.ldc)
        return
    if p.n == 1 or p.m == 1:
        _run_gemv(p, a, b, c)
        return
    gemm_at(p.dtype, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, p.lda, b, p.ldb, p.beta, c, p.ldc)


def _run_gemv(p: v.GemmProblem, a: int, b: int, c: int) -> None:
    """A GEMM with one column (or one row) of C as one ``?gemv``.

    OpenBLAS's ``?gemm`` packs the whole matrix operand even when the other is a vector
    (the decoding step of a transformer is all such products), which makes it one to two
    orders of magnitude slower than ``?gemv`` on the same numbers.
    """
    if p.n == 1:
        # C (m x 1) = op(A) (m x k) @ op(B) (k x 1): A is the matrix, op(B) the vector.
        rows, cols = (p.k, p.m) if p.trans_a else (p.m, p.k)
        incx = p.ldb if p.trans_b else 1
        gemv_at(p.dtype, p.trans_a, rows, cols, p.alpha, a, p.lda, b, incx, p.beta, c, 1)
        return
    # C (1 x n) = op(A) (1 x k) @ op(B) (k x n): C^T = op(B)^T @ op(A)^T, B is the matrix.
    rows, cols = (p.n, p.k) if p.trans_b else (p.k, p.n)
    incx = 1 if p.trans_a else p.lda
    gemv_at(p.dtype, not p.trans_b, rows, cols, p.alpha, b, p.ldb, a, incx, p.beta, c, p.ldc)


class GemmOps(CpuPlumbing):
    """``gemm``, ``batched_gemm`` and ``gemm_mixed_precision``."""

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        split_gemm(p)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        g = p.gemm
        if dense_batched(p, lambda region: self._flat(region, F32)):
            return
        size = g.dtype.itemsize
        a0, b0, c0 = g.a.ptr, g.b.ptr, g.c.ptr

        def run(start: int, stop: int) -> None:
            for i in range(start, stop):
                run_gemm(
                    g, a0 + i * p.stride_a * size, b0 + i * p.stride_b * size, c0 + i * p.stride_c * size
                )

        grain = max(1, BATCH_GRAIN_FLOPS // max(1, g.m * g.n * max(1, g.k)))
        if workers() > 1 and p.batch_count >= 2 * grain:
            # Batches go to the worker threads, each with single-threaded BLAS (the
            # C matrices of different batches never overlap, and no input overlaps a C).
            def pull(items: Iterator[int]) -> None:
                for j in items:
                    run(j * grain, min(p.batch_count, (j + 1) * grain))

            with single_threaded_blas():
                parallel_pull(ceil_div(p.batch_count, grain), pull)
        elif p.batch_count == 1:
            split_gemm(g)
        else:
            with single_threaded_blas():
                run(0, p.batch_count)

    def _gemm_weight_panel(self, rows: int, depth: int, cols: int, dtype: np.dtype[Any]) -> int:
        """:meth:`~computehal.ComputeBackend.gemm_weight_panel`: 64-column panels for float32
        weights with 8-256 activation rows, at least 16 deep, run on the compiled dense-layer
        product (:mod:`._gemm_dense`), which reads the panels in place where BLAS repacks the
        weight on every call; 0 where BLAS on the matrix as it is is faster (more rows, a
        shallow product, a width that does not divide ``cols``) or the kernel cannot be
        compiled."""
        return weight_panel(rows, depth, cols, dtype)

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        fmt = p.prec
        assert fmt is not None
        if p.product_skipped:
            run_gemm(p, p.a.ptr, p.b.ptr, p.c.ptr)
            return
        a = self._rounded(p.a, *p.a_shape, p.lda, fmt)
        b = self._rounded(p.b, *p.b_shape, p.ldb, fmt)
        gemm_at(
            F32, p.trans_a, p.trans_b, p.m, p.n, p.k, np.float32(p.alpha).item(),
            a.ctypes.data, a.shape[0], b.ctypes.data, b.shape[0],
            np.float32(p.beta).item(), p.c.ptr, p.ldc,
        )  # fmt: skip

    def _rounded(self, region: Region, rows: int, cols: int, ld: int, fmt: MixedPrecision) -> FloatArray:
        """A Fortran-ordered float32 copy of a stored matrix, rounded through ``fmt``."""
        import ml_dtypes

        narrow: Any = np.float16 if fmt is MixedPrecision.F16 else ml_dtypes.bfloat16
        stored = self._matrix(region, rows, cols, ld, F32)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asfortranarray(stored.astype(narrow, order="F").astype(F32, order="F"))
