"""Data movement on CUDA: device copies, fills, strided copies, row gather and scatter.

``copy_dtod`` is ``cudaMemcpy`` device to device. Everything else is a bit copy of 16-,
32- or 64-bit elements (``kernels/movement.cl``, the fills of ``kernels/elementwise.cl``),
so it takes every storage dtype and NaN payloads survive. Device-side indices are checked
on the device (their smallest and largest value are folded there and only those two
numbers are read back) before anything is written. Rows go in grid dimension y, at most
65535 per launch: longer index lists are launched in pieces.
"""

from __future__ import annotations

import math

import numpy as np

from ... import validation as v
from ...errors import InvalidArgumentError, UnsupportedError
from ...memory import Region
from .._common import ceil_div, chunks, collapse, fill_pattern, strided_outer
from ._core import I64, CudaCore, Ptr, linear, split_outer
from ._device import GRID_YZ_MAX
from ._programs import REDUCE_LS, elementwise_unit, movement_unit

__all__ = ["MovementOps"]


def _row_block(cols: int) -> int:
    """Threads per block along a row (a multiple of 32, at most 256)."""
    return min(256, ceil_div(cols, 32) * 32)


class MovementOps(CudaCore):
    """copy_dtod, fill, copy_strided, gather and scatter."""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        if p.src != p.dst:
            self._session.copy(p.dst.ptr, p.src.ptr, p.nbytes)

    def _fill_bits(self, ptr: int, count: int, pattern: np.generic) -> None:
        grid, block = linear(count)
        self._launch(
            elementwise_unit("float"), f"fill_u{pattern.dtype.itemsize * 8}", grid, block,
            Ptr(ptr), I64(0), pattern, I64(count),
        )  # fmt: skip

    def _exec_fill(self, p: v.FillProblem) -> None:
        self._fill_bits(p.region.ptr, p.count, fill_pattern(p.value, p.dtype))

    def _exec_copy_strided(self, p: v.StridedProblem) -> None:
        size = p.dtype.itemsize
        dims, sets = collapse(p.shape, p.src_strides, p.dst_strides)
        ss, ds = sets
        inner = dims[-1]
        block = _row_block(inner)
        for piece, (os_, od) in split_outer(dims, sets):
            self._launch(
                movement_unit(), f"copy_strided_{size * 8}", (ceil_div(inner, block), math.prod(piece[:-1])),
                (block, 1), Ptr(p.src.ptr), I64(p.src_origin + os_), Ptr(p.dst.ptr), I64(p.dst_origin + od),
                I64(inner), I64(1), I64(ss[-1]), I64(ds[-1]), *(I64(x) for x in strided_outer(piece, ss, ds)),
            )  # fmt: skip

    # ------------------------------------------------------------------ gather / scatter

    def _upload_indices(self, held: list[Region], values: np.ndarray) -> int:
        """A device copy of an int64 index array (in a scratch range kept in ``held``)."""
        data = np.ascontiguousarray(values, dtype=np.int64)
        scratch = self._scratch_range(max(8, data.nbytes))
        held.append(scratch)
        if data.nbytes:
            self._session.write(scratch.ptr, data.view(np.uint8))
        return scratch.ptr

    def _device_indices(self, held: list[Region], p: v.RowsProblem) -> str:
        """Check the device indices of ``p`` against ``p.rows`` on the device; their kernel suffix."""
        assert p.index is not None and p.index_dtype is not None
        kind = f"i{p.index_dtype.itemsize * 8}"
        found = self._scratch_range(16)
        held.append(found)
        self._launch(
            movement_unit(), f"index_range_{kind}", (1,), (REDUCE_LS,),
            Ptr(p.index.ptr), I64(0), I64(p.count), Ptr(found.ptr),
        )  # fmt: skip
        low, high = (int(x) for x in self._read_words(found.ptr, 2))
        if low < 0:
            raise InvalidArgumentError(f"index {low} is negative")
        if high >= p.rows:
            raise InvalidArgumentError(f"index {high} is out of range for {p.rows} rows")
        return kind

    def _no_columns(self, held: list[Region], p: v.RowsProblem) -> bool:
        """True when rows have no columns: nothing to copy, but device indices are still checked."""
        if p.cols:
            return False
        if p.indices is None:
            self._device_indices(held, p)
        return True

    def _exec_gather(self, p: v.RowsProblem) -> None:
        bits = p.dtype.itemsize * 8
        block = _row_block(p.cols)
        with self._scratches() as held:
            if self._no_columns(held, p):
                return
            if p.indices is not None:
                idx, kind = self._upload_indices(held, p.indices), "i64"
            else:
                assert p.index is not None
                kind = self._device_indices(held, p)
                idx = p.index.ptr
            for r0, r1 in chunks(p.count, 0, most=GRID_YZ_MAX):
                self._launch(
                    movement_unit(), f"gather_{bits}_{kind}", (ceil_div(p.cols, block), r1 - r0), (block, 1),
                    Ptr(p.input.ptr), I64(0), Ptr(idx), I64(r0), Ptr(p.output.ptr), I64(r0 * p.cols),
                    I64(p.cols), I64(r1 - r0),
                )  # fmt: skip

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        bits = p.dtype.itemsize * 8
        block = _row_block(p.cols)
        with self._scratches() as held:
            if self._no_columns(held, p):
                return
            if p.indices is None:
                self._scatter_device(held, p)
                return
            # Host indices: each destination row once, with the last source naming it.
            destinations, sources = v.last_occurrences(p.indices)
            src, dst = self._upload_indices(held, sources), self._upload_indices(held, destinations)
            for r0, r1 in chunks(int(destinations.size), 0, most=GRID_YZ_MAX):
                self._launch(
                    movement_unit(), f"scatter_pairs_{bits}", (ceil_div(p.cols, block), r1 - r0), (block, 1),
                    Ptr(p.input.ptr), I64(0), Ptr(src), Ptr(dst), I64(r0), Ptr(p.output.ptr), I64(0),
                    I64(p.cols), I64(r1 - r0),
                )  # fmt: skip

    def _scatter_device(self, held: list[Region], p: v.RowsProblem) -> None:
        """Scatter with device indices: each row claimed by its last index (atomic max), then copied.

        Pieces of at most 65535 indices run in order, each claiming afresh, so a later
        piece's rows overwrite an earlier piece's: the last index still wins.
        """
        assert p.index is not None
        if p.count > np.iinfo(np.int32).max:
            raise UnsupportedError("scatter with more than 2**31 - 1 device indices")
        kind = self._device_indices(held, p)
        bits = p.dtype.itemsize * 8
        winner = self._scratch_range(p.rows * 4)
        held.append(winner)
        block = _row_block(p.cols)
        for r0, r1 in chunks(p.count, 0, most=GRID_YZ_MAX):
            count = r1 - r0
            self._fill_bits(winner.ptr, p.rows, np.uint32(0xFFFFFFFF))
            grid, line = linear(count)
            self._launch(
                movement_unit(), f"scatter_claim_{kind}", grid, line,
                Ptr(p.index.ptr), I64(r0), I64(count), Ptr(winner.ptr),
            )  # fmt: skip
            self._launch(
                movement_unit(), f"scatter_won_{bits}_{kind}", (ceil_div(p.cols, block), count), (block, 1),
                Ptr(p.input.ptr), I64(r0 * p.cols), Ptr(p.index.ptr), I64(r0), Ptr(winner.ptr),
                Ptr(p.output.ptr), I64(0), I64(p.cols), I64(count),
            )  # fmt: skip
