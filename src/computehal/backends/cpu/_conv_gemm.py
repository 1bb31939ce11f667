"""GEMM convolutions split into cache-sized tasks: 1x1 filters, and blocked im2col.

* 1x1 filters without padding (ResNet's projections and bottlenecks) are one GEMM per
  block of output rows (and of output channels, for small images at batch 1):
  ``y[n] (K x P) = f (K x C) @ x[n] (C x P)`` read in place (a stride-2 block is first
  gathered into scratch). Both gradients are the transposed
  products; the filter gradient sums per-thread partials.
* Stride-1 1x1 layers in float32 with at most 64 input channels, or at least
  :data:`KERNEL_MIN_PIXELS` pixels per image, run on the compiled product
  (:mod:`._kgemm`) as a whole (:func:`_pointwise_compiled`): the filter packed once per
  call (by the tasks themselves where one image is split by output channels), operands
  handed over as flat arrays and offsets (building three strided views per task had
  cost 13-15 us of a 100-300 us batch-1 task), and one image split into channel blocks
  on filter panel bounds (the kernel's rate does not drop with fewer channels per task,
  BLAS's does: 512 -> 128 at 28x28 split 8 ways ran at 78 GFLOP/s in BLAS, 113 in the
  kernel). ResNet-50's stride-1 1x1 layers at batch 1, two workers, wall time, this path
  against the previous per-task choice interleaved in one process (medians of 30):
  64 -> 64 at 56x56 0.78 of the time, 64 -> 256 0.87, 256 -> 64 0.82, 128 -> 512 at
  28x28 0.81, 512 -> 128 0.81, 256 -> 1024 at 14x14 0.95, 1024 -> 256 0.87 (on a quiet
  minute 256 -> 1024 took 0.51 ms, 200 GFLOP/s). The kernel also applies a fused
  residual and ReLU as it stores (the ``epilogue`` of :func:`pointwise_forward`). At
  7x7 (49 pixels, 77 % of the kernel's lanes used) BLAS is faster (one core:
  512 -> 2048 88 vs 73 GFLOP/s).
* One image of at most :data:`DENSE_MAX_PIXELS` pixels with more than 64 input
  channels (ResNet-50's 7x7 stage, and its 1024 -> 2048 stride-2 projection once
  gathered) runs on the dense-layer product instead (:func:`_pointwise_dense`,
  :mod:`._kdense`): the filter rows are its activation rows, read in place, and the
  image [C, P] its weight panel, so nothing is packed; each task starts its block of
  output channels from the bias and adds the residual / applies ReLU to it while it is
  in cache. One thread, a task's 512 x C block (cold: a 64 MB pass between calls), CPU
  time best of 9: 512 -> 2048 at 7x7 351-503 us vs BLAS's 480-627; warm 108-113 vs
  101-108 GFLOP/s. Multiplying the filter transposed into 64-column panels instead (the
  kernel's full lanes: 134 vs BLAS's 108 GFLOP/s warm) lost to the transposition (260 us
  per task) or, cached, to checking the filter's bytes (a cold 1 MB ``memcmp`` 260 us).
  Through the backend, two workers, interleaved (best / median of 20, GFLOP/s, busy
  machine): 512 -> 2048 at 7x7 86.8 / 83.9 vs BLAS 78.6 / 76.6, 2048 -> 512 93.1 /
  86.9 vs 75.5 / 72.1, 1024 -> 2048 stride 2 from 14x14 113 / 51.5 vs 92.6 / 37.6;
  in ResNet-50 at batch 1 (interleaved runs of one session, best of 11, very busy
  machine) 1.64 vs 2.09 ms, 1.39 vs 1.83, 4.29 vs 5.76. The product then prefetches the
  next tile's filter rows while a tile runs, over the whole depth
  (:func:`._kdense.product_rows`): one task, one thread, best / median of 15, cold:
  512 -> 2048 442 / 486 us vs 551 / 566 without (BLAS 632 / 705), 2048 -> 512 495 / 532
  vs 508 / 525 (635 / 706), 1024 -> 2048 832 / 876 vs 864 / 966 (1066 / 1201).
* A strided 1x1 layer on one image is gathered once into scratch and then multiplied as
  a stride-1 one: its tasks split the output channels and each had gathered the same
  pixels (ResNet-50's projections at batch 1, two workers: 0.95-0.99 of the time).
  At larger batches each task gathers its own image's rows and multiplies them in BLAS,
  or in the compiled kernel for the shapes :func:`_kernel_takes` names.
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

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._blas import gemm_at
from ._conv_epilogue import epilogue_range
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas, workers
from ._scratch import thread_scratch

__all__ = [
    "pointwise_forward",
    "pointwise_backward_data",
    "pointwise_backward_filter",
    "im2col_forward",
    "pointwise_tasks",
    "row_blocks",
]

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
#: Tasks per thread of a compiled 1x1 layer on one image. The kernel's rate does not drop
#: with fewer output channels per task (BLAS's does), but finer tasks did not pay either:
#: two workers, wall time, medians of 30 interleaved, quiet machine, 2 / 4 / 8 tasks per
#: thread: 64 -> 256 at 56x56 186 / 167 / 169 GFLOP/s, 256 -> 1024 at 14x14 199 / 179 /
#: 172, 512 -> 128 at 28x28 203 / 204 / 204; with another process on one core, 1 to 4
#: per thread within 5 % of each other.
KERNEL_TASKS_PER_THREAD = 2
#: Fewest pixels per image of a deep stride-1 1x1 layer for the compiled product.
KERNEL_MIN_PIXELS = 128
#: Most pixels of one image whose deep 1x1 layer runs on the dense-layer product (:func:`_pointwise_dense`).
DENSE_MAX_PIXELS = 64
#: Tasks per thread of :func:`_pointwise_dense`.
DENSE_TASKS_PER_THREAD = 2


def row_blocks(n: int, oh: int, ow: int) -> list[tuple[int, int, int]]:
    """Tasks ``(image, first row, end row)`` over the output rows, at least 3 per thread in all."""
    rows = max(-(-MIN_COLUMNS // max(1, ow)), -(-(n * oh) // (3 * workers())))
    rows = min(oh, max(1, rows))
    return [(i, r0, min(oh, r0 + rows)) for i in range(n) for r0 in range(0, oh, rows)]


def _pull(count: int, run: Any) -> None:
    with single_threaded_blas():
        parallel_pull(count, run)


def _source_rows(
    x: FloatArray, xs: FloatArray, i: int, r0: int, r1: int, sh: int, sw: int, ow: int
) -> FloatArray:
    """Input pixels (r * sh, q * sw) of image ``i`` for output rows r0..r1, as [C, (r1 - r0) ow].

    At stride 1 a view of ``xs`` (``x`` as [N, C, H W]); otherwise gathered into this
    thread's "pointwise" scratch.
    """
    c, cols = x.shape[1], (r1 - r0) * ow
    if sh == sw == 1:
        view: FloatArray = xs[i, :, r0 * ow : r1 * ow]
        return view
    buf = thread_scratch("pointwise", c * cols, x.dtype)[: c * cols].reshape(c, r1 - r0, ow)
    buf[...] = x[i, :, r0 * sh : (r1 - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw]
    return buf.reshape(c, cols)


def pointwise_tasks(
    n: int, oh: int, ow: int, k: int, per_thread: int = 2, align: int = 1
) -> list[tuple[int, int, int, int, int]]:
    """Forward tasks ``(image, first row, end row, first channel, end channel)``: ``per_thread`` per thread.

    Whole images while there are enough of them; otherwise row blocks of at least
    :data:`MIN_COLUMNS` pixels, and where even those are too few (one small image, as at
    batch 1 in ResNet's later stages), the output channels are split too: every thread
    then multiplies a block of filter rows by the same image. Channel bounds fall on
    multiples of ``align`` (the compiled product's filter panels).
    """
    want = per_thread * workers()
    rows_min = min(oh, -(-MIN_COLUMNS // max(1, ow)))
    pieces = 1 if n >= want else max(1, min(-(-want // n), oh // rows_min))
    rows = -(-oh // pieces)
    parts = 1 if n * pieces >= want else max(1, min(-(-want // (n * pieces)), k // MIN_CHANNELS))
    bounds = [min(k, -(-(k * j // parts) // align) * align) for j in range(parts + 1)]
    return [
        (i, r0, min(oh, r0 + rows), bounds[j], bounds[j + 1])
        for i in range(n)
        for r0 in range(0, oh, rows)
        for j in range(parts)
        if bounds[j] < bounds[j + 1]
    ]


def pointwise_forward(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    sh: int,
    sw: int,
    epilogue: tuple[FloatArray | None, bool] | None = None,
) -> bool:
    """``y`` = 1x1 convolution (no padding) of ``x`` [N, C, H, W] with ``f`` [K, C, 1, 1], plus bias.

    ``epilogue``: ``(residual, relu)``, a residual laid out as ``y`` (1-D, disjoint from
    it) or None, and whether ReLU follows. True when it was applied as the outputs were
    stored (the compiled path); False leaves it to the caller (``y`` holds the plain
    convolution).
    """
    n, c = x.shape[0], x.shape[1]
    k, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    fmat = np.ascontiguousarray(f.reshape(k, c))
    if (sh, sw) != (1, 1) and n == 1:
        # One image: its tasks split the output channels, and each would gather the same
        # pixels (four times for ResNet's projections at batch 1); gathered once here.
        size = c * oh * ow
        dense = thread_scratch("pointwise-image", size, x.dtype)[:size].reshape(1, c, oh, ow)
        dense[...] = x[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw]
        x, sh, sw = dense, 1, 1
    residual, relu = (None, False) if epilogue is None else epilogue
    product = kernels("_kdense") if _dense_layer(x.dtype, (sh, sw), n, c, oh * ow) else None
    if product is not None:
        _pointwise_dense(product, x, fmat, bias, y, residual, relu)
        return True
    compiled = kernels("_kgemm") if _compiled_layer(x.dtype, (sh, sw), c, k, oh * ow) else None
    if compiled is not None:
        mode = (compiled.ADD_RESIDUAL if residual is not None else 0) | (compiled.RELU if relu else 0)
        _pointwise_compiled(compiled, x, fmat, bias, y, (residual, mode))
        return True
    tasks = pointwise_tasks(n, oh, ow, k)
    ys = y.reshape(n, k, oh * ow)
    xs = x.reshape(n, c, -1)

    def run(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1, k0, k1 = tasks[t]
            src = _source_rows(x, xs, i, r0, r1, sh, sw, ow)
            part = None if bias is None else bias[k0:k1]
            _multiply(fmat[k0:k1], src, ys[i, k0:k1, r0 * ow : r1 * ow], part)

    _pull(len(tasks), run)
    return False


def _compiled_layer(dtype: Any, stride: tuple[int, int], c: int, k: int, pixels: int) -> bool:
    """True when the compiled product (:mod:`._kgemm`) takes this float32 stride-1 1x1 layer from BLAS.

    Strided layers (several images: each task gathers its own rows) keep the per-task
    choice of :func:`_multiply`.
    """
    if dtype != np.float32 or stride != (1, 1):
        return False
    return c <= KERNEL_MAX_DEPTH or pixels >= KERNEL_MIN_PIXELS


def _dense_layer(dtype: Any, stride: tuple[int, int], n: int, c: int, pixels: int) -> bool:
    """True when :func:`_pointwise_dense` takes this (gathered) 1x1 layer: one small deep float32 image."""
    small = n == 1 and c > KERNEL_MAX_DEPTH and pixels <= DENSE_MAX_PIXELS
    return dtype == np.float32 and stride == (1, 1) and small


def _pointwise_dense(
    dense: Any,
    x: FloatArray,
    fmat: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    residual: FloatArray | None,
    relu: bool,
) -> None:
    """One small image's 1x1 layer on the dense-layer product (:mod:`._kdense`), split by output channels.

    Each task computes ``y[k0:k1]`` (P pixels, contiguous) ``= fmat[k0:k1] @ x`` with the
    filter rows as the kernel's activation rows (read in place, no packing) and the image
    [C, P] as its weight panel (rows of P floats), starting from the bias written into its
    block; then adds the residual and applies ReLU over the same block while it is in cache.
    """
    c, pixels = x.shape[1], x.shape[2] * x.shape[3]
    k = y.shape[1]
    tasks = pointwise_tasks(1, x.shape[2], x.shape[3], k, DENSE_TASKS_PER_THREAD, dense.ROWS)
    flat_f, flat_x, flat_y = fmat.reshape(-1), x.reshape(-1), y.reshape(-1)

    def run(items: Iterator[int]) -> None:
        for t in items:
            k0, k1 = tasks[t][3], tasks[t][4]
            lo, hi = k0 * pixels, k1 * pixels
            if bias is not None:
                flat_y[lo:hi].reshape(k1 - k0, pixels)[...] = bias[k0:k1, None]
            dense.product_rows(
                flat_f, k0 * c, flat_x, pixels, flat_y, lo, pixels, k1 - k0, c, pixels, bias is not None
            )
            epilogue_range(flat_y[lo:hi], None if residual is None else residual[lo:hi], relu)

    parallel_pull(len(tasks), run)  # no BLAS call: its thread limit need not be taken


def _pointwise_compiled(
    compiled: Any,
    x: FloatArray,
    fmat: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    epilogue: tuple[FloatArray | None, int],
) -> None:
    """:func:`pointwise_forward` at stride 1 on the compiled product, the filter packed once per call.

    ``epilogue``: the residual (or None) and the kernel's epilogue mode bits.

    Where every task multiplies the whole image (one image split by output channels)
    each task packs its own filter panels; otherwise the caller packs them all first.
    Operands go to the kernel as flat arrays and offsets (no views built per task).
    """
    n, c = x.shape[0], x.shape[1]
    k, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    rows, pixels = compiled.ROWS, oh * ow
    tasks = pointwise_tasks(n, oh, ow, k, 2 if n > 1 else KERNEL_TASKS_PER_THREAD, rows)
    in_task = n == 1 and all(t[1] == 0 and t[2] == oh for t in tasks)
    panels = -(-k // rows)
    packed = np.empty(panels * rows * c, dtype=np.float32)
    pbias = np.empty(panels * rows, dtype=np.float32)
    start = np.zeros(k, dtype=np.float32) if bias is None else np.ascontiguousarray(bias)
    flat_f = fmat.reshape(-1)
    if not in_task:
        compiled.pack_filter(flat_f, c, start, k, c, rows, packed, pbias)
    flat_y, flat_x = y.reshape(-1), x.reshape(-1)
    residual, mode = epilogue
    flat_r = flat_y if residual is None else residual
    block = compiled.pixel_block(min(c, KERNEL_CHUNK))

    def run(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1, k0, k1 = tasks[t]
            if in_task:
                at = k0 // rows * rows * c
                compiled.pack_filter(
                    flat_f[k0 * c :], c, start[k0:], k1 - k0, c, rows, packed[at:], pbias[k0 // rows * rows :]
                )
            compiled.product_packed(
                packed, pbias, k0 // rows, k1 - k0, c, flat_x, i * c * pixels + r0 * ow, pixels,
                flat_y, (i * k + k0) * pixels + r0 * ow, pixels, (r1 - r0) * ow, block, KERNEL_CHUNK,
                flat_r, mode,
            )  # fmt: skip

    parallel_pull(len(tasks), run)  # no BLAS call: its thread limit need not be taken


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


def _multiply(fmat: FloatArray, cols: FloatArray, out: FloatArray, bias: FloatArray | None) -> None:
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
            src = _source_rows(x, xs, i, r0, r1, sh, sw, ow)
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


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` near-equal ranges covering ``[0, total)``."""
    return [(total * j // parts, total * (j + 1) // parts) for j in range(parts)]


class _Columns:
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
    columns = _Columns(x, fh, fw, ow, geometry)
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
                _multiply(fmat, cols, ys[n0, :, p0:p1], bias)
            else:
                out = thread_scratch("im2col-out", k * width, dt)[: k * width].reshape(k, width)
                _multiply(fmat, cols, out, bias)
                ys[n0:n1] = out.reshape(k, n1 - n0, pixels).transpose(1, 0, 2)
            if clamp is not None:
                clamp(ys, n0, n1, 0, k, p0, p1)

    _pull(len(tasks), run)


def _im2col_shared(
    columns: _Columns, fmat: FloatArray, bias: FloatArray | None, ys: FloatArray, clamp: Any = None
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

    def multiply(items: Iterator[int]) -> None:
        for t in items:
            k0, k1 = parts[t]
            part = None if bias is None else bias[k0:k1]
            if n == 1:
                _multiply(fmat[k0:k1], cols, ys[0, k0:k1], part)
            else:
                out = thread_scratch("im2col-out", (k1 - k0) * width, fmat.dtype)[: (k1 - k0) * width]
                out = out.reshape(k1 - k0, width)
                _multiply(fmat[k0:k1], cols, out, part)
                ys[:, k0:k1] = out.reshape(k1 - k0, n, pixels).transpose(1, 0, 2)
            if clamp is not None:
                clamp(ys, 0, n, k0, k1, 0, pixels)

    _pull(len(fills), fill)
    _pull(len(parts), multiply)
