"""Convolutions of images with few channels without im2col: the 7x7 stride-2 stem of ResNet.

The input of each image is copied once into a zero-padded, stride-phase-split layout
(``[C, sh, sw, Hq, Wq]``: phase (a, b) holds padded pixel (a + u sh, b + v sw) at (u,
v)), in which filter tap (c, r, s) of output pixel (o, q) sits at ``o Wq + q`` plus an
offset fixed per tap. Output pixels are taken on that grid, ``Wq`` to a row (the
columns from ``Ow`` on are computed and dropped), so a run of output pixels reads a
unit-stride segment for every tap: the compiled product :func:`._kgemm.product_table`
then multiplies the packed filter by them through the table of tap offsets, with no
column matrix, and stores each vector's kept lanes compressed (``vcompressps``)
straight into the output rows (a scratch block copied out afterwards had cost a
fifth of the stem's time).

The phase copy is the input's size (plus padding) per image, where im2col writes
C Fh Fw floats for every output pixel (12x the input for the stem) and reads them back.
Measured on the stem (see :mod:`._conv_select`). A tile of one output row (3 or 4
channels by the row's 7 vectors, 112 pixels) was tried first: 4 x 7 spilled
accumulators to the stack, 3 x 7 (7 loads per 21 multiply-adds) ran at half the rate
of the 8 x 3 tile on the grid. The products multiply exactly the
terms of the direct definition plus padding zeros, so the caller keeps padded
convolutions to finite filters (as for im2col).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, workers
from ._scratch import thread_scratch

__all__ = ["direct_applies", "direct_forward"]

#: Most input channels of a direct convolution (a block of output rows reads C sh sw
#: phase planes, which must stay in L2 beside the output block).
MAX_CHANNELS = 4
#: Fewest output columns (the grid's extra Fw // sw columns per row are computed for nothing).
MIN_WIDTH = 32
#: Output pixels of one block (the scratch holds K of them per output channel).
BLOCK_PIXELS = 1024


def direct_applies(c: int, ow: int, dh: int, dw: int) -> bool:
    """True for shapes the direct kernel takes: few input channels, wide rows, no dilation."""
    return c <= MAX_CHANNELS and ow >= MIN_WIDTH and dh == dw == 1 and kernels("_kgemm") is not None


def _split_phases(x: FloatArray, i: int, pt: int, pl: int, out: FloatArray) -> None:
    """``out[c, a, b, u, v]`` = image ``i`` of ``x`` at (a + u sh - pt, b + v sw - pl), 0 outside.

    Only the border outside the image is zeroed (zeroing the whole buffer first had cost
    a third of the split).
    """
    h, w = x.shape[2], x.shape[3]
    _, sh, sw, hq, wq = out.shape
    for a in range(sh):
        u0, u1 = max(0, -(-(pt - a) // sh)), max(0, min(hq, -(-(h + pt - a) // sh)))
        for b in range(sw):
            v0, v1 = max(0, -(-(pl - b) // sw)), max(0, min(wq, -(-(w + pl - b) // sw)))
            phase = out[:, a, b]
            if u1 <= u0 or v1 <= v0:
                phase[...] = 0
                continue
            phase[:, :u0] = 0
            phase[:, u1:] = 0
            phase[:, u0:u1, :v0] = 0
            phase[:, u0:u1, v1:] = 0
            r0, c0 = a + u0 * sh - pt, b + v0 * sw - pl
            rows = slice(r0, r0 + (u1 - u0 - 1) * sh + 1, sh)
            phase[:, u0:u1, v0:v1] = x[i, :, rows, c0 : c0 + (v1 - v0 - 1) * sw + 1 : sw]


@functools.lru_cache(maxsize=64)
def _tap_offsets(shape: tuple[int, ...], fh: int, fw: int) -> Any:
    """Offset of tap (c, r, s) from its output pixel in the phase layout, in filter order.

    Kept per shape (building the table with NumPy took 45 us of the stem's call); the
    callers only read it (a read-only array would be another type to numba, compiled anew).
    """
    c, sh, sw, hq, wq = shape
    cc, rr, ss = np.meshgrid(np.arange(c), np.arange(fh), np.arange(fw), indexing="ij")
    plane = ((cc * sh + rr % sh) * sw + ss % sw) * (hq * wq)
    return np.ascontiguousarray((plane + (rr // sh) * wq + ss // sw).ravel(), dtype=np.int64)


class _Direct:
    """One call's packed filter, tap table and geometry."""

    def __init__(
        self, x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pads: Any, relu: bool
    ) -> None:
        self.kern = kern = kernels("_kgemm")
        self.x, self.y, (self.pt, self.pl, sh, sw) = x, y, pads
        self.k, c, fh, fw = f.shape
        self.oh, self.ow = y.shape[2], y.shape[3]
        self.depth = c * fh * fw
        self.shape = (c, sh, sw, self.oh + (fh - 1) // sh, self.ow + (fw - 1) // sw)
        self.size = int(np.prod(self.shape))
        self.wq = self.shape[4]
        self.offsets = _tap_offsets(self.shape, fh, fw)
        panels = -(-self.k // kern.ROWS) * kern.ROWS
        self.packed = np.empty(panels * self.depth, dtype=np.float32)
        self.pbias = np.empty(panels, dtype=np.float32)
        start = np.zeros(self.k, dtype=np.float32) if bias is None else np.ascontiguousarray(bias)
        flat_f = np.ascontiguousarray(f).reshape(-1)
        kern.pack_filter(flat_f, self.depth, start, self.k, self.depth, kern.ROWS, self.packed, self.pbias)
        self.rows = max(1, min(self.oh, BLOCK_PIXELS // self.wq))
        # The output's planes written in place (a copy back where the caller's is not contiguous).
        self.target = y if y.flags.c_contiguous else np.empty(y.shape, dtype=np.float32)
        self.flat_y = self.target.reshape(-1)
        self.clamp = kernels("_kepilogue").relu_region if relu else None
        self.planes = self.target.reshape(y.shape[0], self.k, self.oh * self.ow)

    def split(self, i: int, out: FloatArray) -> None:
        _split_phases(self.x, i, self.pt, self.pl, out.reshape(self.shape))

    def rows_of(self, phases: FloatArray, x0: int, i: int, r0: int, r1: int) -> None:
        """Output rows ``r0 .. r1`` of image ``i`` from its phases at ``phases[x0:]``."""
        k, wq, ow = self.k, self.wq, self.ow
        width = (r1 - r0 - 1) * wq + ow
        out = self.flat_y[(i * k * self.oh + r0) * ow :]
        start, plane = x0 + r0 * wq, self.oh * ow
        self.kern.product_table(
            self.packed, self.pbias, k, self.depth, phases, start, self.offsets, out, plane, width, wq, ow
        )
        if self.clamp is not None:
            self.clamp(self.planes, i, i + 1, 0, k, r0 * ow, r1 * ow)


def direct_forward(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pads: Any, relu: bool = False
) -> None:
    """``y`` = convolution of float32 ``x`` with ``f`` [K, C, Fh, Fw] (one group) plus ``bias``.

    ``relu``: ReLU (NaN -> 0) applied to each block of output rows after its product,
    while it is in cache.

    ``pads``: (pt, pl, sh, sw); the caller checks :func:`direct_applies`. Whole images are
    tasks while there are at least two per thread; otherwise all images are split first
    and the tasks are blocks of output rows.
    """
    job = _Direct(x, f, bias, y, pads, relu)
    n, oh, size = x.shape[0], job.oh, job.size
    if n >= 2 * workers():

        def whole(items: Iterator[int]) -> None:
            buf = thread_scratch("direct-phases", size)[:size]
            for i in items:
                job.split(i, buf)
                for r0 in range(0, oh, job.rows):
                    job.rows_of(buf, 0, i, r0, min(oh, r0 + job.rows))

        parallel_pull(n, whole)
    else:
        _row_blocks(job, n)
    if job.target is not y:
        y[...] = job.target


def _row_blocks(job: _Direct, n: int) -> None:
    """All images split into phases first, then blocks of output rows as the tasks."""
    oh, size = job.oh, job.size
    phases = np.empty(n * size, dtype=np.float32)
    for i in range(n):
        job.split(i, phases[i * size : (i + 1) * size])
    tasks = [(i, r0, min(oh, r0 + job.rows)) for i in range(n) for r0 in range(0, oh, job.rows)]

    def blocks(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1 = tasks[t]
            job.rows_of(phases, i * size, i, r0, r1)

    parallel_pull(len(tasks), blocks)
