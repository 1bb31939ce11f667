"""Batched float32 GEMMs that share one B operand, on the compiled dense-layer product.

A strided batched GEMM whose batches all read the same B (``stride_b == 0``) and an
untransposed A is a weight matrix stored as column panels: ``C_j = A_j @ B`` with each
``A_j`` a panel of contiguous rows. That is how a model runner lays out a constant weight
once at load (ONNX's runner does so for the query/key/value projection of a transformer,
whose batches are the heads: the outputs land head-major without a copy). OpenBLAS would
pack every panel and, per call, B again; the compiled kernel of :mod:`._kdense` reads
both in place. Measured on this machine (one thread, best of 7, same minute): 36 panels of
64 columns x 768 deep on 128 rows ran at 95-120 GFLOP/s against OpenBLAS's 83-87 on the
same numbers as one 2304-column GEMM; 12 panels of 64 (768 columns) 119-120 against 84.

Taken only where the kernel has BLAS's exact semantics: ``alpha == 1`` and ``beta`` 0
(C is written, never read) or 1 (C accumulated), every product summed in order with
fused multiply-adds (the float32 rounding of any GEMM).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ... import validation as v
from ...dtypes import F32
from ._runtime import kernels, parallel_pull, workers

__all__ = ["dense_batched", "weight_panel"]

#: Smallest depth and row count (columns of C) worth the compiled kernel.
MIN_DEPTH = 16
MIN_ROWS = 8


#: Most activation rows for which weights are worth storing as panels. The kernel walks
#: every panel over all rows, so the rows' slice must stay in L2 beside the panel: at 128
#: rows a BERT-base encoder ran 5-7 % faster on panels (CPU time, one thread, the two
#: plans interleaved in one process); at 512 rows 5 % slower than OpenBLAS.
PANEL_MAX_ROWS = 256


def weight_panel(rows: int, depth: int, cols: int, dtype: Any) -> int:
    """Columns per panel of a ``depth x cols`` weight for ``rows`` activation rows (0: BLAS is better)."""
    if dtype != F32 or not MIN_ROWS <= rows <= PANEL_MAX_ROWS or depth < MIN_DEPTH:
        return 0
    compiled = kernels("_kdense")
    width = 0 if compiled is None else int(compiled.PANEL)
    return width if width and cols % width == 0 and cols >= 2 * width else 0


def _takes(p: v.BatchedGemmProblem) -> bool:
    g = p.gemm
    return (
        g.dtype == F32
        and not g.trans_a
        and p.stride_b == 0
        and g.alpha == 1.0
        and g.beta in (0.0, 1.0)
        and g.k >= MIN_DEPTH
        and g.n >= MIN_ROWS
        and p.batch_count >= 2
    )


def dense_batched(p: v.BatchedGemmProblem, flat: Any) -> bool:
    """Run ``p`` on the compiled kernel when it takes it (True), else leave it (False).

    ``flat(region)`` gives a region as a 1-D float32 array from its first element.
    Batches are pulled by the worker threads; B is read by all of them.
    """
    if not _takes(p):
        return False
    compiled = kernels("_kdense")
    if compiled is None:
        return False
    g = p.gemm
    # Column-major C_j (m x n, ldc) = A_j (m x k, lda) @ op(B) (k x n): the kernel's rows are
    # C's columns, its weight rows A's columns, and its x[i, r] is op(B)[r, i].
    x_rs, x_cs = (1, g.ldb) if g.trans_b else (g.ldb, 1)
    a, b, c = flat(p.a), flat(p.b), flat(p.c)
    accumulate = g.beta == 1.0
    # Two runs of consecutive panels per thread: even shares (36 heads in 8-panel pulls
    # left one thread 5 pulls, the other 4), and the kernel prefetches the next panel of
    # a run while it computes one.
    per_pull = -(-p.batch_count // (2 * workers()))

    def pull(items: Iterator[int]) -> None:
        for i in items:
            first = i * per_pull
            last = min(p.batch_count, first + per_pull)
            compiled.batched(
                b, x_rs, x_cs, a, g.lda, p.stride_a, c, g.ldc, p.stride_c,
                g.n, g.k, g.m, first, last, accumulate,
            )  # fmt: skip

    parallel_pull(-(-p.batch_count // per_pull), pull)
    return True
