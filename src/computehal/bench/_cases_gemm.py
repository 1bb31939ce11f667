"""GEMM rows: ``gemm`` (float64 / float32 / float16), ``batched_gemm``, bf16 ``gemm_mixed_precision``.

Each is held against the vendor BLAS on the same problem where the device has one
(SciPy BLAS / ``numpy.matmul`` on the CPU, cuBLAS on CUDA), else against the compute
ceiling (the host's sgemm) without a verdict. Results are checked on 16 columns
against NumPy in float64.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from ._context import BenchContext, relative_error
from ._groups import register_group
from ._harness import Case, Limit, Target, compute_case

__all__ = ["gemm_cases"]

_SHORT = {"float64": "f64", "float32": "f32", "float16": "f16"}
_TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 2e-3}
_CHECKED_COLUMNS = 16


def _against(ctx: BenchContext, vendor: Limit | None, key: str) -> tuple[Limit, Target | None]:
    """The vendor reference with the row's target, or the compute ceiling without one."""
    if vendor is not None:
        return vendor, ctx.target(key)
    return ctx.ceilings.compute, None


def _gemm_case(ctx: BenchContext, dtype: str, n: int) -> Case:
    be = ctx.backend
    a = ctx.rng.standard_normal((n, n)).astype(dtype)
    b = ctx.rng.standard_normal((n, n)).astype(dtype)
    pa, pb, pc = ctx.put_colmajor(a), ctx.put_colmajor(b), ctx.empty(n * n * a.itemsize)
    cols = min(n, _CHECKED_COLUMNS)

    def verify() -> float:
        c = ctx.read(pc, (n, n), dtype).T  # column-major storage
        want = a.astype(np.float64) @ b[:, :cols].astype(np.float64)
        return relative_error(c[:, :cols], want)

    limit, target = _against(ctx, ctx.ceilings.vendor.gemm(dtype, n), "gemm")
    flops = 2.0 * n**3
    return compute_case(
        "gemm",
        f"{_SHORT[dtype]} {n}^3",
        functools.partial(be.gemm, "N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n, dtype=dtype),
        flops,
        3.0 * n * n * a.itemsize,
        limit,
        target,
        verify=verify,
        tolerance=_TOLERANCE[dtype],
    )


def _batched_case(ctx: BenchContext) -> Case:
    be = ctx.backend
    count, d = ctx.sizes.batch, ctx.sizes.batch_dim
    a = ctx.rng.standard_normal((count, d, d), dtype=np.float32)
    b = ctx.rng.standard_normal((count, d, d), dtype=np.float32)
    # Row-major [d, d] matrices read column-major are their transposes: C^T = B^T A^T,
    # so passing B first gives each C_i the memory of the row-major product a_i @ b_i.
    pa, pb, pc = ctx.put(a), ctx.put(b), ctx.empty(a.nbytes)
    stride = d * d

    def run() -> None:
        be.batched_gemm(
            "N", "N", d, d, d, 1.0, pb, d, stride, pa, d, stride, 0.0, pc, d, stride, count, dtype="float32"
        )

    def verify() -> float:
        c = ctx.read(pc, (count, d, d))
        last = count - 1
        return max(relative_error(c[i], a[i].astype(np.float64) @ b[i]) for i in (0, last))

    limit, target = _against(ctx, ctx.ceilings.vendor.batched_gemm(count, d), "batched_gemm")
    flops = 2.0 * count * d**3
    params = f"f32 {count} x {d}^3"
    return compute_case("batched_gemm", params, run, flops, 3.0 * a.nbytes, limit, target, verify)


def _mixed_case(ctx: BenchContext, n: int) -> Case:
    be = ctx.backend
    a = ctx.rng.standard_normal((n, n), dtype=np.float32)
    b = ctx.rng.standard_normal((n, n), dtype=np.float32)
    pa, pb, pc = ctx.put_colmajor(a), ctx.put_colmajor(b), ctx.empty(n * n * 4)
    cols = min(n, _CHECKED_COLUMNS)

    def rounded(x: Any) -> Any:
        return x.astype(ml_dtypes.bfloat16).astype(np.float64)

    def verify() -> float:
        c = ctx.read(pc, (n, n)).T
        return relative_error(c[:, :cols], rounded(a) @ rounded(b[:, :cols]))

    vendor = ctx.ceilings.vendor.gemm_mixed_precision("bf16", n)
    limit, target = _against(ctx, vendor, "gemm_mixed_precision")
    flops = 2.0 * n**3
    return compute_case(
        "gemm_mixed_precision",
        f"bf16 {n}^3",
        functools.partial(be.gemm_mixed_precision, "bf16", "N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n),
        flops,
        3.0 * n * n * 4,
        limit,
        target,
        verify=verify,
    )


def gemm_cases(ctx: BenchContext) -> Iterator[Case]:
    """GEMM in three dtypes, strided batched GEMM and bf16 mixed precision."""
    n = ctx.sizes.gemm
    for dtype in ("float64", "float32", "float16"):
        yield _gemm_case(ctx, dtype, n)
    yield _batched_case(ctx)
    yield _mixed_case(ctx, n)


register_group(
    "gemm", gemm_cases, description="gemm (f64/f32/f16), batched_gemm, gemm_mixed_precision", default=True
)
