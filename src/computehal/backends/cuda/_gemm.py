"""GEMMs on CUDA: cuBLAS for the products, two small kernels for what BLAS leaves out.

float32 / float64 GEMMs (and their strided batches) are cuBLAS ``s`` / ``d`` GEMMs with
the caller's transposes and leading dimensions. float16 / bfloat16 storage GEMMs read
A and B as they are with ``gemmEx`` (float32 compute: the product of two 16-bit values is
exact in float32) into a float32 copy of C, which is rounded back to nearest-even: the
same arithmetic as widening every operand. Mixed precision rounds A and B through the
16-bit format first (``kernels/cuda_narrow.cu``). ``C = beta * C`` when the product is
skipped (BLAS quick return) is a kernel, since cuBLAS does not promise to leave C alone
then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ... import validation as v
from ...dtypes import F32, F64
from ...types import MixedPrecision
from .._common import chunks
from ._core import I32, I64, CudaCore, Ptr, linear, scalar
from ._device import Batch
from ._programs import narrow_unit

__all__ = ["GemmOps"]

#: cuBLAS takes batch counts as 32-bit ints.
_MOST_BATCHES = v.BLAS_INT_MAX
_WIDE = {"float16": "f16", "bfloat16": "bf16"}


class GemmOps(CudaCore):
    """gemm, batched_gemm and gemm_mixed_precision."""

    def _scale_c(self, p: v.GemmProblem, c: int, stride_c: int = 0, batches: int = 1) -> None:
        """BLAS quick return ``C = beta * C`` (write-only when ``beta == 0``) for every batch."""
        f64 = p.dtype == F64
        grid, block = linear(p.m * p.n * batches)
        self._launch(
            narrow_unit(), "scale_c_f64" if f64 else "scale_c_f32", (min(grid[0], 1 << 16),), block,
            Ptr(c), I64(p.ldc), I64(stride_c), I64(p.m), I64(p.n), I64(batches), scalar(p.beta, p.dtype),
        )  # fmt: skip

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        if p.dtype.name in _WIDE:
            self._gemm_16(p, None)
        elif p.product_skipped:
            self._scale_c(p, p.c.ptr)
        else:
            self._session.gemm(
                p.dtype.name, p.trans_a, p.trans_b, (p.m, p.n, p.k), p.alpha,
                (p.a.ptr, p.lda), (p.b.ptr, p.ldb), p.beta, (p.c.ptr, p.ldc),
            )  # fmt: skip

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        g = p.gemm
        if g.dtype.name in _WIDE:
            self._gemm_16(g, p)
        elif g.product_skipped:
            self._scale_c(g, p.c.ptr, p.stride_c, p.batch_count)
        else:
            self._batched(g, p, (p.c.ptr, g.dtype.itemsize))

    def _batched(self, g: v.GemmProblem, p: v.BatchedGemmProblem, c_at: tuple[int, int]) -> None:
        """cuBLAS over the batches of ``p`` (A and B of its dtype), at most 2**31 - 1 per call.

        ``c_at`` is the address of batch 0's C and the byte size of its elements (4 when C
        is the float32 copy of a 16-bit C).
        """
        size = g.dtype.itemsize
        c, c_size = c_at
        for first, stop in chunks(p.batch_count, 0, most=_MOST_BATCHES):
            self._session.gemm(
                g.dtype.name, g.trans_a, g.trans_b, (g.m, g.n, g.k), g.alpha,
                (p.a.ptr + first * p.stride_a * size, g.lda), (p.b.ptr + first * p.stride_b * size, g.ldb),
                g.beta, (c + first * p.stride_c * c_size, g.ldc),
                Batch(p.stride_a, p.stride_b, p.stride_c, stop - first),
            )  # fmt: skip

    def _gemm_16(self, g: v.GemmProblem, p: v.BatchedGemmProblem | None) -> None:
        """A float16 / bfloat16 GEMM: gemmEx into a float32 copy of C, rounded back."""
        c_region = g.c if p is None else p.c
        count = c_region.nbytes // 2
        short = _WIDE[g.dtype.name]
        with self._scratches() as held:
            wide = self._scratch_range(count * 4)
            held.append(wide)
            self._cast_bits(f"cast_{short}_f32", c_region.ptr, wide.ptr, count)
            if g.product_skipped:
                stride_c, batches = (0, 1) if p is None else (p.stride_c, p.batch_count)
                self._scale_c(replace(g, c=wide, dtype=F32), wide.ptr, stride_c, batches)
            elif p is None:
                self._session.gemm(
                    g.dtype.name, g.trans_a, g.trans_b, (g.m, g.n, g.k), g.alpha,
                    (g.a.ptr, g.lda), (g.b.ptr, g.ldb), g.beta, (wide.ptr, g.ldc),
                )  # fmt: skip
            else:
                self._batched(g, p, (wide.ptr, 4))
            self._cast_bits(f"cast_f32_{short}", wide.ptr, c_region.ptr, count)

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        fmt = p.prec
        assert fmt is not None
        if p.product_skipped:
            self._scale_c(p, p.c.ptr)
            return
        caps = self._device_record().capabilities
        native = caps.supports_bf16 if fmt is MixedPrecision.BF16 else caps.supports_fp16
        # Native: 16-bit operands for gemmEx. Otherwise: operands rounded but kept in float32
        # for sgemm, which is the same arithmetic (16-bit products are exact in float32).
        mode = (1 if fmt is MixedPrecision.F16 else 2) + (0 if native else 2)
        with self._scratches() as held:
            a16 = self._narrowed(held, p.a, *p.a_shape, p.lda, mode)
            b16 = self._narrowed(held, p.b, *p.b_shape, p.ldb, mode)
            kind = ("float16" if fmt is MixedPrecision.F16 else "bfloat16") if native else "float32"
            self._session.gemm(
                kind, p.trans_a, p.trans_b, (p.m, p.n, p.k), p.alpha,
                (a16.ptr, p.a_shape[0]), (b16.ptr, p.b_shape[0]), p.beta, (p.c.ptr, p.ldc),
            )  # fmt: skip

    def _narrowed(self, held: list[Any], region: Any, rows: int, cols: int, ld: int, mode: int) -> Any:
        """A compact column-major copy of a stored float32 matrix, rounded per ``mode``."""
        scratch = self._scratch_range(max(1, rows * cols) * (2 if mode <= 2 else 4))
        held.append(scratch)
        grid, block = linear(rows * cols)
        self._launch(
            narrow_unit(), "narrow_matrix", (min(grid[0], 1 << 16),), block,
            Ptr(region.ptr), I64(ld), I64(rows), I64(cols), Ptr(scratch.ptr), I32(mode),
        )  # fmt: skip
        return scratch
