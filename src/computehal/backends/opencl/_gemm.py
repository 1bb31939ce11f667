"""GEMM on OpenCL: packed panels with a register-tiled micro-kernel (CPU profile) or
work-group tiles staged in local memory (GPU profile), for float32 and float64.

The CPU profile packs op(A) and op(B) into MR-row / NR-column panels (``kernels/gemm.cl``)
and runs one work-item per work-group over an MR x NR register block (what PoCL turns
into vector code); the GPU profile reads the operands in place with the work-group tiled
kernel of ``kernels/gemm_wg.cl``. Convolutions reuse the same engine on packed operands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F32, F64
from ...memory import as_count
from ...types import MixedPrecision, TileShape
from .._common import ceil_div, round_up
from ._core import OpenCLCore
from ._runtime import Operand

__all__ = ["GemmOps", "GEMM_TILE"]

I32 = np.int32
I64 = np.int64

#: GEMM micro-tile (see kernels/gemm_tile.h): VW-wide vectors, MR = 2 * VW rows, NR columns.
GEMM_TILE = {F32: (8, 6), F64: (4, 6)}
#: Work-group tiled GEMM of the GPU profile (kernels/gemm_wg.cl): work-group TSX x TSY, a WM x WN
#: register block per work-item, k staged through local memory TK at a time. The first shape the
#: device accepts is used.
_WG_TILES = ((16, 16, 4, 4, 16), (8, 8, 4, 4, 16), (4, 4, 4, 4, 8), (1, 1, 4, 4, 4))
#: Largest walk of NR-blocks one GEMM work-item makes along n.
_MAX_NB = 24
#: Upper bound for the packed A and B panels of one GEMM chunk, in bytes.
GEMM_SCRATCH = 256 << 20
_ROUND_MODES = {MixedPrecision.F16: 1, MixedPrecision.BF16: 2}


class GemmOps(OpenCLCore):
    """GEMM, batched GEMM and mixed-precision GEMM, and the panel engine convolutions use."""

    _wg_tile: tuple[int, int, int, int, int] = _WG_TILES[0]

    def _configure(self) -> None:
        super()._configure()
        self._wg_tile = self._pick_wg_tile()

    def _pick_wg_tile(self) -> tuple[int, int, int, int, int]:
        """The largest work-group GEMM tile whose group size and float64 local tiles fit the device."""
        sizes = self._max_item_sizes
        for tile in _WG_TILES:
            tsx, tsy, wm, wn, tk = tile
            local = (tk * (tsx * wm + 1) + tk * (tsy * wn + 1)) * 8
            if tsx * tsy <= self._max_wg and tsx <= sizes[0] and tsy <= sizes[1] and local <= self._local_mem:
                return tile
        return _WG_TILES[-1]

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        """The float32 tile the GEMM kernel uses for this problem.

        CPU profile: ``tile_m`` rows and ``tile_n`` columns of C belong to one work-item, an
        MR x NR register block walked ``tile_n / NR`` times along n; ``tile_k`` is 1 (k streams
        through the registers one rank-1 update at a time from packed panels).

        GPU profile: ``tile_m`` x ``tile_n`` is the tile of C of one work-group (TSX * WM by
        TSY * WN) and ``tile_k`` the depth staged in local memory per step.
        """
        self._memory()
        mm, nn = as_count("m", m), as_count("n", n)
        as_count("k", k)
        if self._profile == "gpu":
            tsx, tsy, wm, wn, tk = self._wg_tile
            return TileShape(tsx * wm, tsy * wn, tk)
        vw, nr = GEMM_TILE[F32]
        mr = 2 * vw
        nb = self._walk(ceil_div(max(mm, 1), mr), ceil_div(max(nn, 1), nr), 1)
        return TileShape(mr, nr * nb, 1)

    # ------------------------------------------------------------------ engine

    def _walk(self, a_panels: int, b_panels: int, batches: int) -> int:
        """NR-blocks one work-item walks along n: long walks keep the A panel in cache, while
        enough work-groups remain to keep every compute unit busy."""
        nb = (a_panels * b_panels * batches) // (64 * self._compute_units)
        return max(1, min(_MAX_NB, nb, b_panels))

    def _gemm_kernels(self, dtype: np.dtype[Any]) -> dict[str, Any]:
        vw, nr = GEMM_TILE[dtype]
        return {
            name: self._kernel("gemm.cl", name, dtype, VW=vw, NR=nr)
            for name in ("pack_a", "pack_b", "gemm_panels", "scale_c")
        }

    def _panels(
        self,
        dtype: np.dtype[Any],
        mnk: tuple[int, int, int],
        alpha: float,
        beta: float,
        batches: int,
        a: tuple[Any, int],
        b: tuple[Any, int],
        c: Operand,
        c_stride: int,
        ldc: int,
    ) -> None:
        """C = alpha * Ap * Bp + beta * C per batch over packed panels ``a`` / ``b`` (buffer, stride)."""
        m, n, k = mnk
        if self._profile == "gpu":
            self._wg_launch(
                dtype, mnk, alpha, beta, batches,
                (Operand(a[0], 0), a[1], (0, 0, 1)), (Operand(b[0], 0), b[1], (0, 0, 1)),
                c, c_stride, ldc,
            )  # fmt: skip
            return
        vw, nr = GEMM_TILE[dtype]
        a_panels, b_panels = ceil_div(m, 2 * vw), ceil_div(n, nr)
        nb = self._walk(a_panels, b_panels, batches)
        real = dtype.type
        self._launch(
            self._gemm_kernels(dtype)["gemm_panels"],
            (a_panels, ceil_div(b_panels, nb), batches),
            (1, 1, 1),
            a[0], I64(a[1]), b[0], I64(b[1]), c.buffer, I64(c.offset), I64(c_stride), I32(ldc),
            I32(m), I32(n), I32(k), real(alpha), real(beta), I32(nb),
        )  # fmt: skip

    def _wg_launch(
        self,
        dtype: np.dtype[Any],
        mnk: tuple[int, int, int],
        alpha: float,
        beta: float,
        batches: int,
        a: tuple[Operand, int, tuple[int, int, int]],
        b: tuple[Operand, int, tuple[int, int, int]],
        c: Operand,
        c_stride: int,
        ldc: int,
        mode: int = 0,
    ) -> None:
        """One launch of the work-group tiled kernel over every batch.

        ``a`` / ``b`` are (operand, batch stride, (row stride, column stride, layout code)) of
        op(A) and op(B) as ``kernels/gemm_wg.cl`` describes them (code 1: gemm.cl's panels).
        """
        m, n, k = mnk
        tsx, tsy, wm, wn, tk = self._wg_tile
        vw, nr = GEMM_TILE[dtype]
        kernel = self._kernel(
            "gemm_wg.cl", "gemm_wg", dtype, VW=vw, NR=nr, TSX=tsx, TSY=tsy, WM=wm, WN=wn, TK=tk
        )
        real = dtype.type
        (ao, sa, la), (bo, sb, lb) = a, b
        self._launch(
            kernel,
            (ceil_div(m, tsx * wm) * tsx, ceil_div(n, tsy * wn) * tsy, batches),
            (tsx, tsy, 1),
            ao.buffer, I64(ao.offset), I64(sa), I64(la[0]), I64(la[1]), I32(la[2]),
            bo.buffer, I64(bo.offset), I64(sb), I64(lb[0]), I64(lb[1]), I32(lb[2]),
            c.buffer, I64(c.offset), I64(c_stride), I32(ldc), I32(m), I32(n), I32(k),
            real(alpha), real(beta), I32(mode),
        )  # fmt: skip

    def _gemm(
        self, p: v.GemmProblem, batches: int = 1, strides: tuple[int, int, int] = (0, 0, 0), mode: int = 0
    ) -> None:
        """Multiply ``batches`` GEMMs described by batch 0 ``p`` (operands never overlap C here:
        the shared dispatcher copied any that did aside); ``mode`` rounds A and B (1 f16, 2 bf16)."""
        dtype = p.dtype
        size = dtype.itemsize
        kernels = self._gemm_kernels(dtype)
        real = dtype.type
        c = self._at(p.c, size)
        sa, sb, sc = strides
        if p.product_skipped:
            self._launch(
                kernels["scale_c"], (p.m, p.n, batches), None,
                c.buffer, I64(c.offset), I64(sc), I32(p.ldc), I32(p.m), I32(p.n), real(p.beta),
            )  # fmt: skip
            return
        a, b = self._at(p.a, size), self._at(p.b, size)
        if self._profile == "gpu":
            a_layout = (p.lda, 1, 0) if p.trans_a else (1, p.lda, 0)
            b_layout = (p.ldb, 1, 0) if p.trans_b else (1, p.ldb, 0)
            self._wg_launch(
                dtype, (p.m, p.n, p.k), p.alpha, p.beta, batches,
                (a, sa, a_layout), (b, sb, b_layout), c, sc, p.ldc, mode,
            )  # fmt: skip
            return
        self._packed_gemm(p, kernels, batches, strides, mode, (a, b, c))

    def _packed_gemm(
        self,
        p: v.GemmProblem,
        kernels: dict[str, Any],
        batches: int,
        strides: tuple[int, int, int],
        mode: int,
        abc: tuple[Operand, Operand, Operand],
    ) -> None:
        """The CPU profile: pack and multiply, in chunks whose panels fit GEMM_SCRATCH."""
        size = p.dtype.itemsize
        vw, nr = GEMM_TILE[p.dtype]
        mr = 2 * vw
        a, b, c = abc
        sa, sb, sc = strides
        limit = max(1, GEMM_SCRATCH // size)
        per_batch = (round_up(p.m, mr) + round_up(p.n, nr)) * p.k
        batch_step = max(1, min(batches, limit // max(1, per_batch)))
        rows_step = round_up(p.m, mr) if per_batch <= limit else max(mr, (limit // 2 // p.k) // mr * mr)
        cols_step = round_up(p.n, nr) if per_batch <= limit else max(nr, (limit // 2 // p.k) // nr * nr)
        for b0 in range(0, batches, batch_step):
            nb = min(batch_step, batches - b0)
            for i0 in range(0, p.m, rows_step):
                for j0 in range(0, p.n, cols_step):
                    m, n = min(rows_step, p.m - i0), min(cols_step, p.n - j0)
                    a_off = a.offset + b0 * sa + (i0 * p.lda if p.trans_a else i0)
                    b_off = b.offset + b0 * sb + (j0 if p.trans_b else j0 * p.ldb)
                    c_blk = Operand(c.buffer, c.offset + b0 * sc + i0 + j0 * p.ldc)
                    ap_stride, bp_stride = ceil_div(m, mr) * mr * p.k, ceil_div(n, nr) * nr * p.k
                    ap = self._scratch_buffer("ap", ap_stride * nb * size)
                    bp = self._scratch_buffer("bp", bp_stride * nb * size)
                    self._launch(
                        kernels["pack_a"], (p.k, ceil_div(m, mr), nb), None,
                        a.buffer, I64(a_off), I64(sa), I32(p.lda), I32(int(p.trans_a)), I32(m), I32(p.k),
                        ap, I64(ap_stride), I32(mode),
                    )  # fmt: skip
                    self._launch(
                        kernels["pack_b"], (p.k, ceil_div(n, nr), nb), None,
                        b.buffer, I64(b_off), I64(sb), I32(p.ldb), I32(int(p.trans_b)), I32(p.k), I32(n),
                        bp, I64(bp_stride), I32(mode),
                    )  # fmt: skip
                    self._panels(
                        p.dtype, (m, n, p.k), p.alpha, p.beta, nb, (ap, ap_stride), (bp, bp_stride),
                        c_blk, sc, p.ldc,
                    )  # fmt: skip

    # ------------------------------------------------------------------ hooks

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        with self._lock:
            self._gemm(p)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        with self._lock:
            self._gemm(p.gemm, p.batch_count, (p.stride_a, p.stride_b, p.stride_c))

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        assert p.prec is not None
        with self._lock:
            self._gemm(p, mode=_ROUND_MODES[p.prec])
