"""GEMM, strided batched GEMM and mixed-precision GEMM (column-major, BLAS semantics)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..dtypes import F32
from ..errors import InvalidArgumentError
from ..memory import Lease, Region, as_count, as_pointer
from ..types import BackendTranspose, MixedPrecision, coerce_enum
from ._core import BLAS_INT_MAX, Operand, Problem, Role, as_scalar, float_dtype, matrix_bytes, record

__all__ = [
    "GemmProblem",
    "BatchedGemmProblem",
    "gemm",
    "batched_gemm",
    "gemm_mixed_precision",
]

_GEMM_OPERANDS = (Operand("a", Role.IN), Operand("b", Role.IN), Operand("c", Role.INOUT))


@record
class GemmProblem(Problem):
    """A validated GEMM: ``C = alpha * op(A) @ op(B) + beta * C``, column-major.

    ``a`` and ``b`` span zero bytes when the product is skipped (``k == 0`` or
    ``alpha == 0``), and ``c`` spans zero bytes when ``m == 0`` or ``n == 0``.
    ``prec`` is set for :meth:`~computehal.ComputeBackend.gemm_mixed_precision`
    (A and B rounded through that 16-bit format, ``dtype`` float32).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _GEMM_OPERANDS

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    alpha: float
    a: Region
    lda: int
    b: Region
    ldb: int
    beta: float
    c: Region
    ldc: int
    dtype: np.dtype[Any]
    prec: MixedPrecision | None = None

    @property
    def empty(self) -> bool:
        """True when C has no elements: nothing to do at all."""
        return self.m == 0 or self.n == 0

    @property
    def product_skipped(self) -> bool:
        """True when A and B are not read and ``C = beta * C`` (BLAS quick return)."""
        return self.k == 0 or self.alpha == 0.0

    @property
    def a_shape(self) -> tuple[int, int]:
        """(rows, cols) of A as stored."""
        return (self.k, self.m) if self.trans_a else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        """(rows, cols) of B as stored."""
        return (self.n, self.k) if self.trans_b else (self.k, self.n)


def _interleaved_columns(m: int, ldc: int, stride_c: int, count: int) -> bool:
    """True when ``count`` C matrices of ``m`` rows sit side by side inside each column of ``ldc``.

    Batch ``i``'s column ``j`` is rows ``[i * stride_c, i * stride_c + m)`` of column ``j``
    of one ``ldc``-long column: disjoint for every batch when ``stride_c >= m`` and the
    last batch ends inside the column. A weight matrix stored as column panels writes one
    row-major product this way, one panel per batch.
    """
    return m <= stride_c and (count - 1) * stride_c + m <= ldc


def _blas_dim(name: str, value: object) -> int:
    count = as_count(name, value)
    if count > BLAS_INT_MAX:
        raise InvalidArgumentError(f"{name} = {count} exceeds the 32-bit BLAS limit {BLAS_INT_MAX}")
    return count


@dataclass(frozen=True)
class _GemmArgs:
    ta: bool
    tb: bool
    m: int
    n: int
    k: int
    alpha: float
    beta: float
    lda: int
    ldb: int
    ldc: int
    a_ptr: int
    b_ptr: int
    c_ptr: int

    @property
    def a_rows_cols(self) -> tuple[int, int]:
        return (self.k, self.m) if self.ta else (self.m, self.k)

    @property
    def b_rows_cols(self) -> tuple[int, int]:
        return (self.n, self.k) if self.tb else (self.k, self.n)


def _gemm_args(
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    b_ptr: object,
    ldb: object,
    beta: object,
    c_ptr: object,
    ldc: object,
) -> _GemmArgs:
    ta = coerce_enum(BackendTranspose, trans_a, "trans_a").is_transposed
    tb = coerce_enum(BackendTranspose, trans_b, "trans_b").is_transposed
    mm, nn, kk = _blas_dim("m", m), _blas_dim("n", n), _blas_dim("k", k)
    al, be = as_scalar("alpha", alpha), as_scalar("beta", beta)
    ilda, ildb, ildc = _blas_dim("lda", lda), _blas_dim("ldb", ldb), _blas_dim("ldc", ldc)
    pa, pb, pc = as_pointer("a_ptr", a_ptr), as_pointer("b_ptr", b_ptr), as_pointer("c_ptr", c_ptr)
    a_rows = kk if ta else mm
    b_rows = nn if tb else kk
    if ilda < max(1, a_rows):
        raise InvalidArgumentError(f"lda = {ilda} must be >= max(1, {a_rows}) (rows of A)")
    if ildb < max(1, b_rows):
        raise InvalidArgumentError(f"ldb = {ildb} must be >= max(1, {b_rows}) (rows of B)")
    if ildc < max(1, mm):
        raise InvalidArgumentError(f"ldc = {ildc} must be >= max(1, m = {mm})")
    return _GemmArgs(ta, tb, mm, nn, kk, al, be, ilda, ildb, ildc, pa, pb, pc)


def _gemm_problem(lease: Lease, g: _GemmArgs, dt: np.dtype[Any], prec: MixedPrecision | None) -> GemmProblem:
    size = dt.itemsize
    empty = g.m == 0 or g.n == 0
    reads = not empty and g.k != 0 and g.alpha != 0.0
    a_bytes = matrix_bytes(*g.a_rows_cols, g.lda, size) if reads else 0
    b_bytes = matrix_bytes(*g.b_rows_cols, g.ldb, size) if reads else 0
    a = lease.resolve("a_ptr", g.a_ptr, a_bytes, align=size)
    b = lease.resolve("b_ptr", g.b_ptr, b_bytes, align=size)
    c = lease.resolve("c_ptr", g.c_ptr, matrix_bytes(g.m, g.n, g.ldc, size), align=size)
    return GemmProblem(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a, g.lda, b, g.ldb, g.beta, c, g.ldc, dt, prec)


def gemm(
    lease: Lease,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    b_ptr: object,
    ldb: object,
    beta: object,
    c_ptr: object,
    ldc: object,
    *,
    dtype: object = "float64",
) -> GemmProblem:
    """Validate ``gemm``."""
    dt = float_dtype(dtype)
    g = _gemm_args(trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc)
    return _gemm_problem(lease, g, dt, None)


def gemm_mixed_precision(
    lease: Lease,
    prec: object,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    b_ptr: object,
    ldb: object,
    beta: object,
    c_ptr: object,
    ldc: object,
) -> GemmProblem:
    """Validate ``gemm_mixed_precision`` (float32 buffers, ``prec`` set)."""
    fmt = coerce_enum(MixedPrecision, prec, "prec")
    g = _gemm_args(trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc)
    return _gemm_problem(lease, g, F32, fmt)


@record
class BatchedGemmProblem(Problem):
    """A validated strided batched GEMM; ``gemm`` describes batch 0.

    Batch ``i`` reads A at ``gemm.a.ptr + i * stride_a * itemsize`` (likewise B, C).
    ``a``, ``b`` and ``c`` are the regions spanned by all batches together.
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _GEMM_OPERANDS

    gemm: GemmProblem
    stride_a: int
    stride_b: int
    stride_c: int
    batch_count: int
    a: Region
    b: Region
    c: Region
    dtype: np.dtype[Any]

    @property
    def empty(self) -> bool:
        """True when there is nothing to compute."""
        return self.batch_count == 0 or self.gemm.empty

    def retyped(self, dtype: np.dtype[Any], regions: dict[str, Region]) -> BatchedGemmProblem:
        """Also moves batch 0's regions to the start of the replaced spans."""
        scale = dtype.itemsize / self.dtype.itemsize
        g = self.gemm
        inner: dict[str, Region] = {}
        for name, span in regions.items():
            first: Region = getattr(g, name)
            inner[name] = Region(span.allocation, span.offset, int(first.nbytes * scale))
        gemm_changes: dict[str, Any] = {"dtype": dtype, **inner}
        changes: dict[str, Any] = {"gemm": replace(g, **gemm_changes), "dtype": dtype, **regions}
        return replace(self, **changes)

    def batch(self, i: int) -> GemmProblem:
        """Batch ``i`` as a plain GEMM problem."""
        g = self.gemm
        size = self.dtype.itemsize
        return replace(
            g,
            a=g.a.shifted(i * self.stride_a * size),
            b=g.b.shifted(i * self.stride_b * size),
            c=g.c.shifted(i * self.stride_c * size),
        )


def batched_gemm(
    lease: Lease,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    stride_a: object,
    b_ptr: object,
    ldb: object,
    stride_b: object,
    beta: object,
    c_ptr: object,
    ldc: object,
    stride_c: object,
    batch_count: object,
    *,
    dtype: object = "float32",
) -> BatchedGemmProblem:
    """Validate ``batched_gemm``.

    Besides the GEMM checks, the strides must keep every batch inside its
    allocation, and the C matrices of different batches must not overlap (their
    results would depend on execution order).
    """
    dt = float_dtype(dtype)
    g = _gemm_args(trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc)
    sa, sb, sc = (
        as_count("stride_a", stride_a),
        as_count("stride_b", stride_b),
        as_count("stride_c", stride_c),
    )
    count = as_count("batch_count", batch_count)
    size = dt.itemsize
    empty = g.m == 0 or g.n == 0 or count == 0
    reads = not empty and g.k != 0 and g.alpha != 0.0
    c_elems = matrix_bytes(g.m, g.n, g.ldc, 1)
    if count > 1 and c_elems and sc < c_elems and not _interleaved_columns(g.m, g.ldc, sc, count):
        raise InvalidArgumentError(
            f"stride_c = {sc} is smaller than one C matrix ({c_elems} elements with ldc = "
            f"{g.ldc}); the batches' outputs would overlap"
        )
    a_one = matrix_bytes(*g.a_rows_cols, g.lda, size) if reads else 0
    b_one = matrix_bytes(*g.b_rows_cols, g.ldb, size) if reads else 0
    c_one = 0 if empty else c_elems * size

    def span(name: str, ptr: int, one: int, stride: int) -> Region:
        if empty or one == 0:
            return lease.resolve(name, ptr, 0, align=size)
        return lease.resolve(name, ptr, (stride * (count - 1)) * size + one, align=size)

    a = span("a_ptr", g.a_ptr, a_one, sa)
    b = span("b_ptr", g.b_ptr, b_one, sb)
    c = span("c_ptr", g.c_ptr, c_one, sc)
    first = GemmProblem(
        g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.sized(a_one), g.lda, b.sized(b_one), g.ldb,
        g.beta, c.sized(c_one), g.ldc, dt,
    )  # fmt: skip
    return BatchedGemmProblem(first, sa, sb, sc, count, a, b, c, dt)
