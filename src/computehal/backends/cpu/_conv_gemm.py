"""GEMM convolutions split into cache-sized tasks: blocked im2col, and the products it and 1x1 layers use.

* 1x1 filters (:mod:`._conv_pointwise`) multiply the images in place; strided 1x1 layers of
  several images gather each task's rows and multiply them here, in BLAS or in the compiled
  kernel for the shapes :func:`_kernel_takes` names.
* Other filters (the 7x7 stride-2 stem, strided layers, small images with many
  channels) build the im2col columns of a block of output pixels in scratch
  (:func:`._kcols.im2col_block`, a few hundred columns that stay in cache) and multiply
  them by the filter matrix at once; small images are batched several to a block, and
  where all images hold too few pixels for every thread to get a block, the columns
  are built once and the GEMM is split by output channels.
* A bias is written into the output block first and BLAS adds the product to it
  (beta = 1), which costs what beta = 0 does (OpenBLAS zeroes C in a pass of its own);
  only a filter much smaller than the output (the stem's) is copied with the bias as
  one more column. Copying ResNet's 512-channel 3x3 filter (9.4 MB) for its bias cost
  a fifth of that layer's time at batch 1.

Tasks are pulled by the worker threads, each running single-threaded BLAS: with a
two-thread BLAS, every small GEMM would end in a barrier that a busy machine stretches
to milliseconds (measured: 1x1 convolutions at a tenth of the single-thread rate).
The products go through ``numpy.matmul`` on views (no copies): NumPy's OpenBLAS build
ran these shapes (N = K = 64 to 512 output channels, the pixels as BLAS's M) at 1.2 to
1.8x the rate of SciPy's build called on the same memory (measured single-threaded,
interleaved: 66 vs 36-39 GFLOP/s for ResNet's 256 -> 64 1x1 layer).
These products multiply exactly the terms of the direct definition, except im2col's
padding zeros, so the caller keeps an im2col convolution with padding to finite filters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._blas import gemm_at
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas, workers
from ._scratch import thread_scratch

__all__ = ["Columns", "im2col_forward", "multiply", "pull", "row_blocks"]

#: Output pixels per task of a GEMM convolution (and at least this many per block).
MIN_COLUMNS = 256
#: Fewest output channels of a task that splits them.
MIN_CHANNELS = 64
#: Output pixels per thread below which im2col builds all columns first and splits the GEMM by
#: output channels (:func:`_im2col_shared`). ResNet's 128-channel stride-2 3x3 layer at batch 1
#: (784 pixels) runs as four pulled tasks of fill and GEMM instead: CPU time of both threads,
#: 20th percentile of 55 interleaved calls, 3.30 ms vs 3.82 shared (the two GEMM halves each
#: packed all 3.6 MB of columns); 196 pixels (its 256-channel layer) stay shared (tasks of 49
#: pixels each read the whole filter).
SHARED_PIXELS = 256
#: Floats of im2col columns one task aims for (about a megabyte).
COLUMN_FLOATS = 1 << 18
#: Output widths from which im2col copies row segments instead of gathering by table.
WIDE_ROWS = 32
#: Output pixels per filter matrix column from which im2col copies the filter to append the
#: bias as a column (the stem) instead of writing the bias into the output first.
BIAS_COLUMN_RATIO = 16
#: Products the compiled kernel (:mod:`._kgemm`) takes instead of BLAS: depth (input
#: channels times taps) up to KERNEL_MAX_DEPTH, or up to KERNEL_MAX_DEPTH output
#: channels over at least KERNEL_MIN_WIDTH pixels (in depth slices of KERNEL_CHUNK that
#: keep a tile's pixels in L1). CPU time on one core, best of 9-11, against NumPy's
#: OpenBLAS: ResNet's 64 -> 256 1x1 layer at batch 8 123-135 vs 101-109 GFLOP/s,
#: 64 -> 64 114-117 vs 102-108, 256 -> 64 86 vs 74-75 (batch 1: 102 vs 97); but
#: 256 -> 1024 at 14x14 108 vs 122, 1024 -> 256 98 vs 115, 128 -> 512 at 28x28 equal,
#: the stem (64 output channels, depth 148) equal.
KERNEL_MAX_DEPTH = 64
KERNEL_CHUNK = 64
KERNEL_MIN_WIDTH = 1024


def row_blocks(n: int, oh: int, ow: int) -> list[tuple[int, int, int]]:
    """Tasks ``(image, first row, end row)`` over the output rows, at least 3 per thread in all."""
    rows = max(-(-MIN_COLUMNS // max(1, ow)), -(-(n * oh) // (3 * workers())))
    rows = min(oh, max(1, rows))
    return [(i, r0, min(oh, r0 + rows)) for i in range(n) for r0 in range(0, oh, rows)]


def pull(count: int, run: Any) -> None:
    with single_threaded_blas():
        parallel_pull(count, run)


def _flat(matrix: FloatArray) -> FloatArray:
    """The memory of a matrix with contiguous rows as a 1-D array from its first element."""
    rows, cols = matrix.shape
    extent = (rows - 1) * (matrix.strides[0] // matrix.itemsize) + cols if rows and cols else 0
    flat: FloatArray = np.lib.stride_tricks.as_strided(matrix, shape=(extent,), strides=(matrix.itemsize,))
    return flat


def _kernel_takes(dtype: Any, rows: int, depth: int, width: int) -> bool:
    """True when the compiled product (:mod:`._kgemm`) beats BLAS on this float32 shape."""
    if dtype != np.float32:
        return False
    return depth <= KERNEL_MAX_DEPTH or (rows <= KERNEL_MAX_DEPTH and width >= KERNEL_MIN_WIDTH)


def multiply(fmat: FloatArray, cols: FloatArray, out: FloatArray, bias: FloatArray | None) -> None:
    """``out`` [K', W] = ``fmat`` [K', R] @ ``cols`` [R, W] plus ``bias`` [K'] per row (rows contiguous).

    Shapes :func:`_kernel_takes` names go to the compiled kernel, starting from the bias.
    Otherwise the bias is written first and BLAS adds the product to it (beta = 1): OpenBLAS zeroes
    C in a pass of its own for beta = 0, so this costs what the plain product does, with
    neither a pass over the output afterwards nor a copy of the filter with a bias column.
    """
    rows, depth, width = fmat.shape[0], fmat.shape[1], cols.shape[1]
    compiled = kernels("_kgemm") if _kernel_takes(out.dtype, rows, depth, width) else None
    if compiled is not None and depth > 0:
        start = np.zeros(rows, dtype=out.dtype) if bias is None else np.ascontiguousarray(bias)
        block = compiled.pixel_block(min(depth, KERNEL_CHUNK))
        compiled.product(
            _flat(fmat), fmat.strides[0] // 4, _flat(cols), cols.strides[0] // 4, start,
            _flat(out), out.strides[0] // 4, rows, depth, width, block, KERNEL_CHUNK,
        )  # fmt: skip
        return
    if bias is None:
        np.matmul(fmat, cols, out=out)
        return
    out[...] = bias[:, None]
    size = out.dtype.itemsize
    gemm_at(
        out.dtype, False, False, cols.shape[1], fmat.shape[0], fmat.shape[1], 1.0,
        cols.ctypes.data, cols.strides[0] // size, fmat.ctypes.data, fmat.strides[0] // size,
        1.0, out.ctypes.data, out.strides[0] // size,
    )  # fmt: skip


def _column_tasks(n: int, pixels: int, crs: int) -> list[tuple[int, int, int, int]]:
    """im2col tasks ``(n0, n1, p0, p1)``: pixel blocks of one image, or several whole images."""
    target = max(MIN_COLUMNS, COLUMN_FLOATS // max(1, crs))
    target = max(32, min(target, -(-(n * pixels) // (2 * workers()))))
    if pixels >= target:
        return [(i, i + 1, p0, min(pixels, p0 + target)) for i in range(n) for p0 in range(0, pixels, target)]
    step = max(1, target // pixels)
    return [(i, min(n, i + step), 0, pixels) for i in range(0, n, step)]


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` near-equal ranges covering ``[0, total)``."""
    return [(total * j // parts, total * (j + 1) // parts) for j in range(parts)]


class Columns:
    """Builds the im2col columns of a pixel range of images, for a range of input channels."""

    def __init__(self, x: FloatArray, fh: int, fw: int, ow: int, geometry: tuple[int, ...]) -> None:
        pt, pl, sh, sw, dh, dw = geometry
        self.x, self.fh, self.fw, self.ow = x, fh, fw, ow
        self.rows = (fh, fw, sh, sw, pt, pl, dh, dw)
        self.geom = np.array(self.rows, dtype=np.int64)
        self.kern = kernels("_kcols")

    def fill(
        self, n0: int, n1: int, p0: int, p1: int, c0: int, c1: int, cols: FloatArray, col0: int = 0
    ) -> None:
        """Write columns ``col0 ..`` of ``cols`` [(c1 - c0) Fh Fw, ...].

        They cover images n0..n1, pixels p0..p1 of each, input channels c0..c1.
        """
        x, kern, dt = self.x[:, c0:c1], self.kern, self.x.dtype
        if self.ow >= WIDE_ROWS:
            buf = thread_scratch("im2col-rows", kern.rows_scratch(p0, p1, self.ow, self.rows), dt)
            for i in range(n0, n1):
                at = col0 + (i - n0) * (p1 - p0)
                kern.im2col_rows(x[i : i + 1], 0, p0, p1, self.ow, self.geom, cols, at, buf)
            return
        taps = self.fh * self.fw
        table = thread_scratch("im2col-taps", taps * (p1 - p0), np.int64)[: taps * (p1 - p0)]
        table = table.reshape(taps, p1 - p0)
        kern.tap_offsets(p0, p1, self.ow, self.geom, x.shape[2], x.shape[3], table)
        for i in range(n0, n1):
            kern.im2col_block(x[i : i + 1], 0, table, cols, col0 + (i - n0) * (p1 - p0))


def im2col_forward(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, ...],
    relu: bool = False,
) -> None:
    """``y`` = convolution of ``x`` with ``f`` [K, C, Fh, Fw] (one group) plus ``bias``, by im2col blocks.

    ``geometry``: (pt, pl, sh, sw, dh, dw). Few output pixels in all (fewer than
    :data:`SHARED_PIXELS` per thread: one small image, or a few 7x7 ones) take
    :func:`_im2col_shared` instead. ``relu``: each task applies ReLU
    (NaN -> 0) to its output block after its GEMM, while the block is in cache.
    """
    n, c = x.shape[0], x.shape[1]
    k, _, fh, fw = f.shape
    oh, ow = y.shape[2], y.shape[3]
    pixels, crs = oh * ow, c * fh * fw
    dt: Any = x.dtype
    columns = Columns(x, fh, fw, ow, geometry)
    fmat = f.reshape(k, crs)
    ys = y.reshape(n, k, pixels)
    clamp = kernels("_kepilogue").relu_region if relu else None
    if n * pixels < workers() * SHARED_PIXELS and k >= 2 * MIN_CHANNELS:
        _im2col_shared(columns, fmat, bias, ys, clamp)
        return
    tasks = _column_tasks(n, pixels, crs)
    rows = crs
    if bias is not None and crs * BIAS_COLUMN_RATIO <= n * pixels:
        # A small filter (the stem's): the bias as one more column of the filter matrix,
        # and a row of ones under the columns (the stem at batch 1, one core: 2.8-2.9 ms
        # of CPU time this way, 3.0-3.1 ms writing the bias into the output first).
        fmat, bias, rows = np.concatenate([fmat, bias[:, None]], axis=1), None, crs + 1

    def run(items: Iterator[int]) -> None:
        for t in items:
            n0, n1, p0, p1 = tasks[t]
            width = (n1 - n0) * (p1 - p0)
            cols = thread_scratch("im2col", rows * width, dt)[: rows * width].reshape(rows, width)
            columns.fill(n0, n1, p0, p1, 0, c, cols)
            cols[crs:] = 1
            if n1 == n0 + 1:
                multiply(fmat, cols, ys[n0, :, p0:p1], bias)
            else:
                out = thread_scratch("im2col-out", k * width, dt)[: k * width].reshape(k, width)
                multiply(fmat, cols, out, bias)
                ys[n0:n1] = out.reshape(k, n1 - n0, pixels).transpose(1, 0, 2)
            if clamp is not None:
                clamp(ys, n0, n1, 0, k, p0, p1)

    pull(len(tasks), run)


def _im2col_shared(
    columns: Columns, fmat: FloatArray, bias: FloatArray | None, ys: FloatArray, clamp: Any = None
) -> None:
    """im2col for few output pixels: all columns at once, then the GEMM split by output channels.

    Splitting the pixels would leave each thread a GEMM a few dozen columns wide that
    reads the whole filter matrix (4608 x 512 floats for ResNet's last 3x3 layers) for
    them; instead the threads build the columns by input-channel blocks, then each
    multiplies its own block of filter rows by all of them (one block per thread: every
    block's GEMM packs all the columns again). ``fmat``: the filter as [K, C Fh Fw];
    ``clamp``: :func:`._kepilogue.relu_region`, applied to each block after its GEMM, or None.
    """
    n, k, pixels = ys.shape
    c = columns.x.shape[1]
    taps, width, rows = columns.fh * columns.fw, n * pixels, fmat.shape[1]
    cols = thread_scratch("im2col-shared", rows * width, fmat.dtype)[: rows * width].reshape(rows, width)
    fills = [(i, c0, c1) for i in range(n) for c0, c1 in _split(c, max(1, min(c, -(-2 * workers() // n))))]

    def fill(items: Iterator[int]) -> None:
        for t in items:
            i, c0, c1 = fills[t]
            columns.fill(i, i + 1, 0, pixels, c0, c1, cols[c0 * taps : c1 * taps], i * pixels)

    parts = _split(k, max(1, min(workers(), k // MIN_CHANNELS)))

    def products(items: Iterator[int]) -> None:
        for t in items:
            k0, k1 = parts[t]
            part = None if bias is None else bias[k0:k1]
            if n == 1:
                multiply(fmat[k0:k1], cols, ys[0, k0:k1], part)
            else:
                out = thread_scratch("im2col-out", (k1 - k0) * width, fmat.dtype)[: (k1 - k0) * width]
                out = out.reshape(k1 - k0, width)
                multiply(fmat[k0:k1], cols, out, part)
                ys[:, k0:k1] = out.reshape(k1 - k0, n, pixels).transpose(1, 0, 2)
            if clamp is not None:
                clamp(ys, 0, n, k0, k1, 0, pixels)

    pull(len(fills), fill)
    pull(len(parts), products)
