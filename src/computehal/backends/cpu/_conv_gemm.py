"""GEMM convolutions split into cache-sized tasks: 1x1 filters, and blocked im2col.

* 1x1 filters without padding (ResNet's projections and bottlenecks) are one GEMM per
  block of output rows: ``y[n] (K x P) = f (K x C) @ x[n] (C x P)`` read in place (a
  stride-2 block is first gathered into scratch). Both gradients are the transposed
  products; the filter gradient sums per-thread partials.
* Other filters (the 7x7 stride-2 stem, strided layers, small images with many
  channels) build the im2col columns of a block of output pixels in scratch
  (:func:`._kcols.im2col_block`, a few hundred columns that stay in cache) and multiply
  them by the filter matrix at once; small images are batched several to a block.

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

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas, workers
from ._scratch import thread_scratch

__all__ = [
    "pointwise_forward",
    "pointwise_backward_data",
    "pointwise_backward_filter",
    "im2col_forward",
    "row_blocks",
]

#: Output pixels per task of a GEMM convolution (and at least this many per block).
MIN_COLUMNS = 256
#: Floats of im2col columns one task aims for (about a megabyte).
COLUMN_FLOATS = 1 << 18
#: Output widths from which im2col copies row segments instead of gathering by table.
WIDE_ROWS = 32


def row_blocks(n: int, oh: int, ow: int) -> list[tuple[int, int, int]]:
    """Tasks ``(image, first row, end row)`` over the output rows, at least 3 per thread in all."""
    rows = max(-(-MIN_COLUMNS // max(1, ow)), -(-(n * oh) // (3 * workers())))
    rows = min(oh, max(1, rows))
    return [(i, r0, min(oh, r0 + rows)) for i in range(n) for r0 in range(0, oh, rows)]


def _pull(count: int, run: Any) -> None:
    with single_threaded_blas():
        parallel_pull(count, run)


def _strided_rows(
    x: FloatArray, i: int, r0: int, r1: int, sh: int, sw: int, ow: int, out: FloatArray
) -> None:
    """``out`` [C, r1 - r0, ow] = input pixels (r * sh, q * sw) of image ``i`` for output rows r0..r1."""
    out[...] = x[i, :, r0 * sh : (r1 - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw]


def pointwise_forward(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, sh: int, sw: int
) -> None:
    """``y`` = 1x1 convolution (no padding) of ``x`` [N, C, H, W] with ``f`` [K, C, 1, 1], plus bias."""
    n, c = x.shape[0], x.shape[1]
    k, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    dt: Any = x.dtype
    tasks = row_blocks(n, oh, ow)
    fmat = np.ascontiguousarray(f.reshape(k, c))
    ys = y.reshape(n, k, oh * ow)
    xs = x.reshape(n, c, -1)

    def run(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1 = tasks[t]
            cols = (r1 - r0) * ow
            if sh == sw == 1:
                src = xs[i, :, r0 * ow : r1 * ow]
            else:
                buf = thread_scratch("pointwise", c * cols, dt)[: c * cols].reshape(c, r1 - r0, ow)
                _strided_rows(x, i, r0, r1, sh, sw, ow, buf)
                src = buf.reshape(c, cols)
            out = ys[i, :, r0 * ow : r1 * ow]
            np.matmul(fmat, src, out=out)
            if bias is not None:
                out += bias[:, None]

    _pull(len(tasks), run)


def pointwise_backward_data(gy: FloatArray, f: FloatArray, gx: FloatArray, sh: int, sw: int) -> None:
    """``gx`` = data gradient of a 1x1 convolution without padding (zero where no output reads)."""
    n, c, h, w = gx.shape
    k, oh, ow = gy.shape[1], gy.shape[2], gy.shape[3]
    dt: Any = gx.dtype
    tasks = row_blocks(n, oh, ow)
    fmat = np.ascontiguousarray(f.reshape(k, c))
    gys = np.ascontiguousarray(gy).reshape(n, k, oh * ow)
    gxs = gx.reshape(n, c, h * w)

    def run(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1 = tasks[t]
            cols = (r1 - r0) * ow
            grad = gys[i, :, r0 * ow : r1 * ow]
            if sh == sw == 1:
                np.matmul(fmat.T, grad, out=gxs[i, :, r0 * ow : r1 * ow])
                continue
            buf = thread_scratch("pointwise", c * cols, dt)[: c * cols].reshape(c, cols)
            np.matmul(fmat.T, grad, out=buf)
            last = h if r1 == oh else r1 * sh
            gx[i, :, r0 * sh : last] = 0
            gx[i, :, r0 * sh : (r1 - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw] = buf.reshape(c, r1 - r0, ow)

    _pull(len(tasks), run)


def pointwise_backward_filter(x: FloatArray, gy: FloatArray, gf: FloatArray, sh: int, sw: int) -> None:
    """``gf`` [K, C, 1, 1] = filter gradient of a 1x1 convolution without padding."""
    n, c = x.shape[0], x.shape[1]
    k, oh, ow = gy.shape[1], gy.shape[2], gy.shape[3]
    dt: Any = x.dtype
    tasks = row_blocks(n, oh, ow)
    gys = np.ascontiguousarray(gy).reshape(n, k, oh * ow)
    xs = x.reshape(n, c, -1)
    partials: list[FloatArray] = []
    lock = threading.Lock()

    def run(items: Iterator[int]) -> None:
        acc = np.zeros((k, c), dtype=dt)
        with lock:
            partials.append(acc)
        part = np.empty((k, c), dtype=dt)
        for t in items:
            i, r0, r1 = tasks[t]
            cols = (r1 - r0) * ow
            if sh == sw == 1:
                src = xs[i, :, r0 * ow : r1 * ow]
            else:
                buf = thread_scratch("pointwise", c * cols, dt)[: c * cols].reshape(c, r1 - r0, ow)
                _strided_rows(x, i, r0, r1, sh, sw, ow, buf)
                src = buf.reshape(c, cols)
            np.matmul(gys[i, :, r0 * ow : r1 * ow], src.T, out=part)
            acc += part

    _pull(len(tasks), run)
    np.sum(partials, axis=0, out=gf.reshape(k, c))


def _column_tasks(n: int, pixels: int, crs: int) -> list[tuple[int, int, int, int]]:
    """im2col tasks ``(n0, n1, p0, p1)``: pixel blocks of one image, or several whole images."""
    target = max(MIN_COLUMNS, COLUMN_FLOATS // max(1, crs))
    target = max(32, min(target, -(-(n * pixels) // (2 * workers()))))
    if pixels >= target:
        return [(i, i + 1, p0, min(pixels, p0 + target)) for i in range(n) for p0 in range(0, pixels, target)]
    step = max(1, target // pixels)
    return [(i, min(n, i + step), 0, pixels) for i in range(0, n, step)]


def im2col_forward(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, geometry: tuple[int, ...]
) -> None:
    """``y`` = convolution of ``x`` with ``f`` [K, C, Fh, Fw] (one group), im2col block by block.

    ``geometry``: (pt, pl, sh, sw, dh, dw).
    """
    pt, pl, sh, sw, dh, dw = geometry
    n, c = x.shape[0], x.shape[1]
    k, _, fh, fw = f.shape
    oh, ow = y.shape[2], y.shape[3]
    pixels, crs = oh * ow, c * fh * fw
    dt: Any = x.dtype
    kern = kernels("_kcols")
    geometry_rows = (fh, fw, sh, sw, pt, pl, dh, dw)
    geom = np.array(geometry_rows, dtype=np.int64)
    fmat = np.ascontiguousarray(f.reshape(k, crs))
    ys = y.reshape(n, k, pixels)
    tasks = _column_tasks(n, pixels, crs)

    def run(items: Iterator[int]) -> None:
        for t in items:
            n0, n1, p0, p1 = tasks[t]
            width = (n1 - n0) * (p1 - p0)
            cols = thread_scratch("im2col", crs * width, dt)[: crs * width].reshape(crs, width)
            if ow >= WIDE_ROWS:
                buf = thread_scratch("im2col-rows", kern.rows_scratch(p0, p1, ow, geometry_rows), dt)
                for i in range(n0, n1):
                    kern.im2col_rows(x, i, p0, p1, ow, geom, cols, (i - n0) * (p1 - p0), buf)
            else:
                table = thread_scratch("im2col-taps", fh * fw * (p1 - p0), np.int64)
                table = table[: fh * fw * (p1 - p0)].reshape(fh * fw, p1 - p0)
                kern.tap_offsets(p0, p1, ow, geom, x.shape[2], x.shape[3], table)
                for i in range(n0, n1):
                    kern.im2col_block(x, i, table, cols, (i - n0) * (p1 - p0))
            if n1 == n0 + 1:
                np.matmul(fmat, cols, out=ys[n0, :, p0:p1])
            else:
                out = thread_scratch("im2col-out", k * width, dt)[: k * width].reshape(k, width)
                np.matmul(fmat, cols, out=out)
                ys[n0:n1] = out.reshape(k, n1 - n0, pixels).transpose(1, 0, 2)
            if bias is not None:
                ys[n0:n1, :, p0:p1] += bias[:, None]

    _pull(len(tasks), run)
