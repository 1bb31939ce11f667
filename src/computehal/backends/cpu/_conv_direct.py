"""Convolutions of images with few channels without im2col: the 7x7 stride-2 stem of ResNet.

The input rows that a band of output rows reads are copied into a zero-padded, stride-phase-split layout
(``[C, sh, sw, Hq, Wq]``: phase (a, b) holds padded pixel (a + u sh, b + v sw) at (u,
v)), in which filter tap (c, r, s) of output pixel (o, q) sits at ``o Wq + q`` plus an
offset fixed per tap. Output pixels are taken on that grid, ``Wq`` to a row (the
columns from ``Ow`` on are computed and dropped), so a run of output pixels reads a
unit-stride segment for every tap: the compiled product :func:`._kgemm.product_table`
then multiplies the packed filter by them through the table of tap offsets, with no
column matrix, and stores each vector's kept lanes compressed (``vcompressps``)
straight into the output rows (a scratch block copied out afterwards had cost a
fifth of the stem's time).

Each task is one band of output rows of one image (several bands per image, so that the
pulled tasks balance the two unequal vCPUs), and splits its own input rows into this
thread's scratch with the compiled :func:`._kdirect.split_phases` before multiplying
them (the NumPy split of whole images had cost 5 % of the stem's time on one core, and
ran before any task could start where images were fewer than tasks). The phase copy is
the input's size (plus padding, and the few rows that two bands share) per image, where im2col writes
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
BLOCK_PIXELS = 1152
#: Bands of output rows per thread that the images are cut into (at least a block each).
TASKS_PER_THREAD = 8


def direct_applies(c: int, ow: int, dh: int, dw: int) -> bool:
    """True for shapes the direct kernel takes: few input channels, wide rows, no dilation."""
    compiled = kernels("_kgemm") is not None and kernels("_kdirect") is not None
    return c <= MAX_CHANNELS and ow >= MIN_WIDTH and dh == dw == 1 and compiled


def _block_rows(oh: int, ow: int, wq: int, tile: int) -> int:
    """Output rows per block: at most :data:`BLOCK_PIXELS` pixels, the last tile as full as can be.

    A block of ``r`` rows is ``(r - 1) wq + ow`` pixels on the grid, multiplied in tiles of
    ``tile``; the stem's 8 rows (917 pixels) left a last tile of 5 of 48 pixels (4 % of
    the multiply-adds for nothing), 10 rows (1147 pixels) fill it.
    """
    most = max(1, min(oh, BLOCK_PIXELS // wq))

    def used(r: int) -> float:
        width = (r - 1) * wq + ow
        return width / (-(-width // tile) * tile)

    return max(range(max(1, most // 2), most + 1), key=lambda r: (round(used(r), 2), r))


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
    """One call's packed filter, tap table, band of rows per task and geometry."""

    def __init__(
        self, x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pads: Any, relu: bool
    ) -> None:
        self.kern = kern = kernels("_kgemm")
        self.split_kern = kernels("_kdirect")
        self.flat_x = np.ascontiguousarray(x).reshape(-1)
        self.image = x.shape[1:]
        self.y, (self.pt, self.pl, self.sh, self.sw) = y, pads
        self.k, c, fh, fw = f.shape
        self.oh, self.ow = y.shape[2], y.shape[3]
        self.depth = c * fh * fw
        self.wq = self.ow + (fw - 1) // self.sw
        self.rows = _block_rows(self.oh, self.ow, self.wq, kern.LANES * kern.VECTORS)
        band = -(-(x.shape[0] * self.oh) // (TASKS_PER_THREAD * workers()))
        self.band = min(self.oh, max(self.rows, band))
        self.shape = (c, self.sh, self.sw, self.band + (fh - 1) // self.sh, self.wq)
        self.size = int(np.prod(self.shape))
        self.offsets = _tap_offsets(self.shape, fh, fw)
        panels = -(-self.k // kern.ROWS) * kern.ROWS
        self.packed = np.empty(panels * self.depth, dtype=np.float32)
        self.pbias = np.empty(panels, dtype=np.float32)
        start = np.zeros(self.k, dtype=np.float32) if bias is None else np.ascontiguousarray(bias)
        flat_f = np.ascontiguousarray(f).reshape(-1)
        kern.pack_filter(flat_f, self.depth, start, self.k, self.depth, kern.ROWS, self.packed, self.pbias)
        # The output's planes written in place (a copy back where the caller's is not contiguous).
        self.target = y if y.flags.c_contiguous else np.empty(y.shape, dtype=np.float32)
        self.flat_y = self.target.reshape(-1)
        self.relu = relu
        self.planes = self.target.reshape(y.shape[0], self.k, self.oh * self.ow)

    def tasks(self, n: int) -> list[tuple[int, int, int]]:
        """``(image, first row, end row)``: the bands of output rows of every image."""
        return [
            (i, r0, min(self.oh, r0 + self.band)) for i in range(n) for r0 in range(0, self.oh, self.band)
        ]

    def band_of(self, i: int, r0: int, r1: int, phases: FloatArray) -> None:
        """Output rows ``r0 .. r1`` (at most a band) of image ``i``, its input split into ``phases``."""
        c, h, w = self.image
        _, sh, sw, hq, wq = self.shape
        geometry = (sh, sw, self.pt, self.pl, hq, wq, self.ow)
        filt = (self.packed, self.pbias, self.depth)
        self.split_kern.direct_band(
            self.flat_x, i * c * h * w, self.image, phases, geometry, (i, r0, r1, self.rows), filt,
            self.offsets, self.planes, self.relu,
        )  # fmt: skip


def direct_forward(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pads: Any, relu: bool = False
) -> None:
    """``y`` = convolution of float32 ``x`` with ``f`` [K, C, Fh, Fw] (one group) plus ``bias``.

    ``relu``: ReLU (NaN -> 0) applied to each block of output rows after its product,
    while it is in cache.

    ``pads``: (pt, pl, sh, sw); the caller checks :func:`direct_applies`. The tasks are
    bands of output rows (:data:`TASKS_PER_THREAD` per thread, at least a block of
    :data:`BLOCK_PIXELS` each), pulled by the threads; each splits its own input rows.
    """
    job = _Direct(x, f, bias, y, pads, relu)
    tasks, size = job.tasks(x.shape[0]), job.size

    def run(items: Iterator[int]) -> None:
        phases = thread_scratch("direct-phases", size)[:size]
        for t in items:
            job.band_of(*tasks[t], phases)

    parallel_pull(len(tasks), run)
    if job.target is not y:
        y[...] = job.target
