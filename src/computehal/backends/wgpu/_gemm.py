"""GEMM, strided batched GEMM and mixed-precision GEMM (column-major) in wgpu_gemm.wgsl.

Large products run the 64 x 64-tiled kernel, one workgroup per tile and batch (grid z);
small ones (at most :data:`SMALL_GEMM` elements of C) one invocation per element of C
over all batches. A skipped product (``k == 0`` or ``alpha == 0``) only scales C.
Mixed precision rounds A and B to f16 / bf16 inside the kernels by bit manipulation
(round-to-nearest-even, overflow to infinity), so no ``shader-f16`` feature is needed.
On llvmpipe ``k`` runs in chunks of :data:`LLVMPIPE_K_CHUNK`, C accumulating with
``beta = 1`` after the first chunk.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import UnsupportedError
from ...memory import Region
from ...types import MixedPrecision
from .._common import ceil_div
from ._device import Gpu
from ._queue import MAX_GROUPS, Binding, Step, grid_1d, pack

__all__ = ["batched_gemm", "gemm", "gemm_mixed_precision"]

#: GEMMs with at most this many elements of C per batch use one invocation per element.
SMALL_GEMM = 1024
#: k per dispatch on llvmpipe.
LLVMPIPE_K_CHUNK = 32768


def _steps(
    gpu: Gpu,
    g: v.GemmProblem,
    regions: tuple[Region, Region, Region],
    strides: tuple[int, int, int],
    batches: int,
    round_mode: int,
) -> list[Step]:
    skipped = g.product_skipped
    ba = gpu.dummy() if skipped else gpu.bind("a_ptr", regions[0])
    bb = gpu.dummy() if skipped else gpu.bind("b_ptr", regions[1])
    bc = gpu.bind("c_ptr", regions[2])
    alpha, beta = float(g.alpha), float(g.beta)
    steps = []
    small = not skipped and g.m * g.n <= SMALL_GEMM
    chunk = batches if small else MAX_GROUPS
    # k in chunks on llvmpipe: C = alpha * A_j B_j + beta_j C.
    k_chunks = [(0, g.k)]
    if not skipped and gpu.loop_budget is not None and g.k > LLVMPIPE_K_CHUNK:
        k_chunks = [(k0, min(LLVMPIPE_K_CHUNK, g.k - k0)) for k0 in range(0, g.k, LLVMPIPE_K_CHUNK)]
    for base in range(0, batches, chunk):
        count = min(chunk, batches - base)
        for k0, kc in k_chunks:
            first = k0 == 0
            params = pack(
                g.m, g.n, kc, g.lda, g.ldb, g.ldc,
                ba.elem + (k0 if g.trans_a else k0 * g.lda), bb.elem + (k0 * g.ldb if g.trans_b else k0),
                bc.elem, strides[0], strides[1], strides[2], base,
                g.trans_a, g.trans_b, first and g.beta == 0.0, round_mode, alpha, beta if first else 1.0,
                count,
            )  # fmt: skip
            if small:
                steps.append(Step("gemm_small", params, (ba, bb, bc), grid_1d(g.m * g.n * count, 256)))
            else:
                steps.append(_tile_step(g, skipped, params, (ba, bb, bc), count))
    return steps


def _tile_step(
    g: v.GemmProblem, skipped: bool, params: bytes, bindings: tuple[Binding, ...], count: int
) -> Step:
    """The dispatch of the tiled (or, for a skipped product, the scaling) GEMM kernel."""
    tile, kernel = (16, "gemm_scale") if skipped else (64, "gemm")
    grid = (ceil_div(g.m, tile), ceil_div(g.n, tile), count)
    if grid[0] > MAX_GROUPS or grid[1] > MAX_GROUPS:
        raise UnsupportedError(f"gemm of {g.m} x {g.n} exceeds the device's dispatch grid limits")
    return Step(kernel, params, bindings, grid)


def gemm(gpu: Gpu, p: v.GemmProblem) -> None:
    """Run a validated float32 GEMM."""
    gpu.run(_steps(gpu, p, (p.a, p.b, p.c), (0, 0, 0), 1, 0))


def batched_gemm(gpu: Gpu, p: v.BatchedGemmProblem) -> None:
    """Run a validated strided batched float32 GEMM in one kernel per chunk of 65535 batches."""
    strides = (p.stride_a, p.stride_b, p.stride_c)
    gpu.run(_steps(gpu, p.gemm, (p.a, p.b, p.c), strides, p.batch_count, 0))


def gemm_mixed_precision(gpu: Gpu, p: v.GemmProblem) -> None:
    """Run a validated mixed-precision GEMM (A and B rounded to ``p.prec`` in the kernels)."""
    mode = 1 if p.prec is MixedPrecision.F16 else 2
    gpu.run(_steps(gpu, p, (p.a, p.b, p.c), (0, 0, 0), 1, mode))
