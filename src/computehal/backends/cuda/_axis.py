"""Operations along an axis on CUDA (float32 and float64): reductions and (log-)softmax
(``kernels/reduce.cl``), layer / RMS / batch normalisation and LRN (``kernels/norm.cl``).

A tensor is viewed as [outer, length, inner]. With ``inner == 1`` one block of
``REDUCE_LS`` threads folds each row (a few long rows are split across blocks first, then
their partials folded); otherwise one thread folds each (outer, inner) column, so that
neighbouring threads read neighbouring addresses. Layer and RMS normalisation fold a row
per block; batch normalisation and LRN map [N, C, spatial] with the spatial index in grid
x and (image, channel) in grid y, at most 65535 per launch (whole images per piece).
"""

from __future__ import annotations

from typing import Any

from ... import validation as v
from ...types import ReduceOp
from .._common import REDUCE_CODES, ceil_div, chunks
from ._core import I32, I64, CudaCore, Ptr, linear, scalar
from ._device import GRID_YZ_MAX
from ._programs import REDUCE_LS, norm_unit, real_of, reduce_unit

__all__ = ["AxisOps"]

#: Threads per block of the column kernels.
_COLS_BLOCK = 128
#: Blocks a reduction of few long rows is spread over (about two per multiprocessor of a large GPU).
_SPREAD = 256
#: Flags of ``norm_rows`` (``NORM_RMS``, ``NORM_SCALE``, ``NORM_BIAS`` in norm.cl).
_NORM_RMS, _NORM_SCALE, _NORM_BIAS = 1, 2, 4


def _row_block(count: int) -> int:
    """Threads per block along a contiguous run of ``count`` elements (a multiple of 32)."""
    return min(256, ceil_div(count, 32) * 32)


class AxisOps(CudaCore):
    """reduce, softmax, layer_norm, rms_norm, batch_norm and lrn."""

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        assert p.op is not None
        unit, code = reduce_unit(real_of(p.dtype.name)), I32(REDUCE_CODES[p.op])
        x, y = Ptr(p.input.ptr), Ptr(p.output.ptr)
        if p.inner > 1:
            grid, block = linear(p.outer * p.inner, _COLS_BLOCK)
            self._launch(
                unit, "reduce_cols", grid, block,
                x, I64(0), y, I64(0), I64(p.outer), I64(p.length), I64(p.inner), code,
            )  # fmt: skip
            return
        parts = 1
        if p.outer < _SPREAD // 2 and p.length >= 64 * REDUCE_LS:
            parts = min(p.length // (16 * REDUCE_LS), ceil_div(_SPREAD, p.outer))
        if parts == 1:
            self._launch(
                unit, "reduce_rows", (p.outer,), (REDUCE_LS,), x, I64(0), y, I64(0), I64(p.length), code
            )
            return
        # Few long rows: each split across `parts` blocks, then the partials reduced.
        first = I32(REDUCE_CODES[ReduceOp.SUM if p.op is ReduceOp.MEAN else p.op])
        with self._scratches() as held:
            partial = self._scratch_range(p.outer * parts * p.dtype.itemsize)
            held.append(partial)
            self._launch(
                unit, "reduce_rows_split", (p.outer * parts,), (REDUCE_LS,),
                x, I64(0), Ptr(partial.ptr), I64(0), I64(p.length), first, I64(parts), I64(0),
            )  # fmt: skip
            self._launch(
                unit, "reduce_rows_split", (p.outer,), (REDUCE_LS,),
                Ptr(partial.ptr), I64(0), y, I64(0), I64(parts), code, I64(1), I64(p.length),
            )  # fmt: skip

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        unit, log = reduce_unit(real_of(p.dtype.name)), I32(int(p.log))
        x, y = Ptr(p.input.ptr), Ptr(p.output.ptr)
        if p.inner == 1:
            self._launch(
                unit, "softmax_rows", (p.outer,), (REDUCE_LS,), x, I64(0), y, I64(0), I64(p.length), log
            )
            return
        grid, block = linear(p.outer * p.inner, _COLS_BLOCK)
        self._launch(
            unit, "softmax_cols", grid, block,
            x, I64(0), y, I64(0), I64(p.outer), I64(p.length), I64(p.inner), log,
        )  # fmt: skip

    # ------------------------------------------------------------------ normalisation

    def _norm(self, p: v.NormProblem) -> None:
        flags = (_NORM_RMS if p.rms else 0) | (_NORM_SCALE if p.scale is not None else 0)
        flags |= _NORM_BIAS if p.bias is not None else 0
        unused = p.input.ptr  # never read without the flag
        self._launch(
            norm_unit(real_of(p.dtype.name)), "norm_rows", (p.rows,), (REDUCE_LS,),
            Ptr(p.input.ptr), I64(0), Ptr(p.output.ptr), I64(0), I64(p.cols), scalar(p.eps, p.dtype),
            Ptr(unused if p.scale is None else p.scale.ptr), I64(0),
            Ptr(unused if p.bias is None else p.bias.ptr), I64(0), I32(flags),
        )  # fmt: skip

    def _exec_layer_norm(self, p: v.NormProblem) -> None:
        self._norm(p)

    def _exec_rms_norm(self, p: v.NormProblem) -> None:
        self._norm(p)

    def _image_pieces(self, n: int, c: int, spatial: int) -> list[tuple[int, int]]:
        """Pieces of whole images with at most 65535 (image, channel) rows each."""
        return list(chunks(n, 0, most=max(1, GRID_YZ_MAX // max(1, c))))

    def _per_image(self, p: v.BatchNormProblem | v.LrnProblem, kernel: str, *tail: Any) -> None:
        """Launch ``kernel`` over (position, image x channel) in pieces of whole images.

        Its arguments: input and output (pointer, element offset of the piece), then ``tail``.
        """
        unit, block = norm_unit(real_of(p.dtype.name)), _row_block(p.spatial)
        per_image = p.c * p.spatial
        for n0, n1 in self._image_pieces(p.n, p.c, p.spatial):
            self._launch(
                unit, kernel, (ceil_div(p.spatial, block), (n1 - n0) * p.c), (block, 1),
                Ptr(p.input.ptr), I64(n0 * per_image), Ptr(p.output.ptr), I64(n0 * per_image), *tail,
            )  # fmt: skip

    def _exec_batch_norm(self, p: v.BatchNormProblem) -> None:
        self._per_image(
            p, "batch_norm",
            Ptr(p.scale.ptr), I64(0), Ptr(p.bias.ptr), I64(0), Ptr(p.mean.ptr), I64(0),
            Ptr(p.var.ptr), I64(0), I64(p.c), I64(p.spatial), I64(1), scalar(p.eps, p.dtype),
        )  # fmt: skip

    def _exec_lrn(self, p: v.LrnProblem) -> None:
        self._per_image(
            p, "lrn",
            I64(p.c), I64(p.spatial), I64(1), I64(p.size),
            *(scalar(x, p.dtype) for x in (p.alpha, p.beta, p.bias)),
        )  # fmt: skip
