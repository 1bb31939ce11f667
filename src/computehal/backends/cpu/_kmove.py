"""Compiled data-movement kernels of the CPU backend (numba): the tiled 2-D transposing copy.

NumPy copies a transposed view element by element in the destination's order, so one of
the two operands is walked with a large stride and every element costs a cache miss.
:func:`copy_tiled` copies square tiles instead, so that both operands stay in L1 while
a tile is moved. Any element type numba knows works (the kernels are bit copies).
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._kstream import line_phase, store_fence, stream_copy, transpose16_stream
from ._nb import jit, transpose8

__all__ = ["TILE", "copy_tiled", "fill_lines", "line_phase", "transpose_f32", "transpose_lines", "warm_up"]

#: Edge of a tile (elements): two tiles of float32 take 32 KiB, the size of L1.
TILE = 64


_jit = jit


@_jit
def copy_tiled(
    src: Any,
    s_at: int,
    s_row: int,
    s_col: int,
    dst: Any,
    d_at: int,
    d_row: int,
    d_col: int,
    rows: int,
    cols: int,
) -> None:
    """``dst[d_at + i*d_row + j*d_col] = src[s_at + i*s_row + j*s_col]`` over a rows x cols grid.

    ``src`` and ``dst`` are 1-D arrays of the same element type; strides are in elements
    and may be negative or zero (source only). Tile by tile, so both stay in L1.
    """
    for i0 in range(0, rows, TILE):
        i1 = min(rows, i0 + TILE)
        for j0 in range(0, cols, TILE):
            j1 = min(cols, j0 + TILE)
            for i in range(i0, i1):
                s = s_at + i * s_row
                d = d_at + i * d_row
                for j in range(j0, j1):
                    dst[d + j * d_col] = src[s + j * s_col]


@_jit
def transpose_f32(
    src: Any, s_at: int, s_col: int, dst: Any, d_at: int, d_row: int, rows: int, cols: int
) -> None:
    """``dst[d_at + i*d_row + j] = src[s_at + i + j*s_col]`` over a rows x cols grid (float32 bits).

    Both operands are contiguous along their own axis: 8 x 8 blocks are transposed in
    registers (:func:`._nb.transpose8`), tile by tile; the ragged edges element by element.
    """
    full_i, full_j = rows - rows % 8, cols - cols % 8
    for i0 in range(0, rows, TILE):
        i1 = min(full_i, i0 + TILE)
        for j0 in range(0, cols, TILE):
            j1 = min(full_j, j0 + TILE)
            for i in range(i0, i1, 8):
                for j in range(j0, j1, 8):
                    transpose8(src, s_at + i + j * s_col, s_col, dst, d_at + i * d_row + j, d_row)
    for i in range(rows):
        start = full_j if i < full_i else 0
        for j in range(start, cols):
            dst[d_at + i * d_row + j] = src[s_at + i + j * s_col]


@_jit
def transpose_lines(
    src: Any, s_at: int, s_col: int, dst: Any, d_at: int, d_row: int, rows: int, cols: int
) -> None:
    """:func:`transpose_f32` by 16 x 16 blocks whose destination rows are streamed lines.

    ``dst[d_at]`` starts a 64-byte line and ``d_row`` is a multiple of 16, so every
    block row is a whole line: no destination line is read, none is written twice.
    Blocks go down 16 source rows at a time (16 sequential read streams); the ragged
    edges are copied element by element.
    """
    full_i, full_j = rows - rows % 16, cols - cols % 16
    for j in range(0, full_j, 16):
        for i in range(0, full_i, 16):
            transpose16_stream(src, s_at + i + j * s_col, s_col, dst, d_at + i * d_row + j, d_row)
    for i in range(rows):
        start = full_j if i < full_i else 0
        for j in range(start, cols):
            dst[d_at + i * d_row + j] = src[s_at + i + j * s_col]
    store_fence()


@_jit
def fill_lines(line: Any, dst: Any, start: int, stop: int) -> None:
    """Lines ``[start, stop)`` of ``dst`` (64-byte aligned, 16 uint32 each) = the 16 uint32 ``line``.

    Streamed past the caches: a fill only writes, and a plain store would first read
    every line it writes.
    """
    for i in range(start * 16, stop * 16, 16):
        stream_copy(line, 0, dst, i)
    store_fence()


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for every element size it takes."""
    for dtype in (np.uint16, np.uint32, np.uint64):
        a = np.zeros(4, dtype=dtype)
        copy_tiled(a, 0, 2, 1, a.copy(), 0, 1, 2, 2, 2)
    lines = np.zeros(48, dtype=np.uint32)
    fill_lines(np.ones(16, dtype=np.uint32), lines[line_phase(lines) :], 0, 1)
    b = np.zeros(81, dtype=np.float32)
    transpose_f32(b, 0, 9, b.copy(), 0, 9, 9, 9)
    square = np.zeros(40 * 32, dtype=np.float32)
    out = np.zeros(40 * 32 + 16, dtype=np.float32)
    transpose_lines(square, 0, 40, out, line_phase(out), 32, 40, 18)
