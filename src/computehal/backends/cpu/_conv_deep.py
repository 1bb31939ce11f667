"""Convolutions of one small deep image on the dense-layer product: ResNet's last 3x3 layers at batch 1.

One image with few output pixels (:data:`MAX_PIXELS`, 7x7 in ResNet-50: its 512-channel
3x3 layers, stride 1 at 7x7 and stride 2 from 14x14) and a deep filter (``C Fh Fw``
of 4608): the im2col columns [C Fh Fw, P] are built once, split over the threads by
input channels (:class:`._conv_gemm.Columns`), then every task multiplies a block of
filter rows by all of them on :func:`._kdense.product_rows`: the filter rows are the
kernel's streamed rows (read in place once, no packing, the next tile's rows
prefetched), the columns its small weight panel (rows of P floats, kept in cache),
starting from the bias written into the block; ReLU follows over the block while it
is in cache.

Measured on one thread (CPU time, best of 11, loaded machine), columns then product:
512 channels at 7x7, stride 1, OpenBLAS 3.41 ms, this product 3.00; stride 2 from
14x14 3.25 vs 2.83. With 196 pixels (the 256-channel stride-2 layer) BLAS stays
faster (2.52 vs 3.18 ms): the product's row tiles then walk four panels of columns.

The products are the direct definition's terms plus padding zeros (as im2col's), so
a filter holding inf or NaN must not reach padded outputs: the caller checks as it
does for im2col.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ._conv_epilogue import epilogue_range
from ._conv_gemm import Columns
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, workers
from ._scratch import thread_scratch

__all__ = ["MAX_PIXELS", "deep_applies", "deep_forward"]

#: Most output pixels of the image (one panel of the dense-layer product).
MAX_PIXELS = 64
#: Fewest filter values per output channel (``C Fh Fw``): shallower products stay on im2col.
MIN_DEPTH = 1024
#: Output-channel tasks per thread (the two vCPUs run at different speeds: pulled).
TASKS_PER_THREAD = 4


def deep_applies(n: int, depth: int, pixels: int, dilated: bool) -> bool:
    """True for the shapes :func:`deep_forward` takes: one float32 image, few pixels, deep filter."""
    return (
        n == 1
        and pixels <= MAX_PIXELS
        and depth >= MIN_DEPTH
        and not dilated
        and kernels("_kdense") is not None
        and kernels("_kcols") is not None
    )


def _bounds(total: int, parts: int, align: int) -> list[tuple[int, int]]:
    """``parts`` ranges covering ``[0, total)``, their bounds multiples of ``align``."""
    edges = sorted({min(total, -(-(total * j // parts) // align) * align) for j in range(parts + 1)})
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if a < b]


def deep_forward(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, ...],
    relu: bool = False,
) -> None:
    """``y`` [1, K, OH, OW] = float32 ``x`` [1, C, H, W] convolved with ``f`` [K, C, Fh, Fw] plus ``bias``.

    ``geometry``: (pt, pl, sh, sw, dh, dw) (no dilation: :func:`deep_applies`);
    ``relu``: ReLU (NaN -> 0) applied to each task's block after its product.
    """
    dense = kernels("_kdense")
    c, (k, _, fh, fw) = x.shape[1], f.shape
    pixels, depth = y.shape[2] * y.shape[3], c * fh * fw
    columns = Columns(x, fh, fw, y.shape[3], geometry)
    cols = thread_scratch("deep-columns", depth * pixels)[: depth * pixels].reshape(depth, pixels)
    fills = _bounds(c, 2 * workers(), 1)

    def fill(items: Iterator[int]) -> None:
        for t in items:
            c0, c1 = fills[t]
            columns.fill(0, 1, 0, pixels, c0, c1, cols[c0 * fh * fw : c1 * fh * fw])

    parallel_pull(len(fills), fill)
    tasks = _bounds(k, TASKS_PER_THREAD * workers(), dense.ROWS)
    flat_f = np.ascontiguousarray(f).reshape(-1)
    flat_c, flat_y = cols.reshape(-1), y.reshape(-1)

    def multiply(items: Iterator[int]) -> None:
        for t in items:
            k0, k1 = tasks[t]
            lo, hi = k0 * pixels, k1 * pixels
            if bias is not None:
                flat_y[lo:hi].reshape(k1 - k0, pixels)[...] = bias[k0:k1, None]
            rows, add = k1 - k0, bias is not None
            dense.product_rows(
                flat_f, k0 * depth, flat_c, pixels, flat_y, lo, pixels, rows, depth, pixels, add
            )
            if relu:
                epilogue_range(flat_y[lo:hi], None, True)

    parallel_pull(len(tasks), multiply)  # no BLAS call: its thread limit need not be taken
