"""1x1 convolutions without padding (one group): GEMMs on the images in place, split into tasks.

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
  or in the compiled kernel for the shapes :func:`._conv_gemm._kernel_takes` names.

Tasks are pulled by the worker threads; BLAS runs single-threaded in them (see
:mod:`._conv_gemm`). The products multiply exactly the terms of the direct definition.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._conv_epilogue import epilogue_range
from ._conv_gemm import KERNEL_CHUNK, KERNEL_MAX_DEPTH, MIN_CHANNELS, MIN_COLUMNS, multiply, pull, row_blocks
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, workers
from ._scratch import thread_scratch

__all__ = ["pointwise_forward", "pointwise_backward_data", "pointwise_backward_filter", "pointwise_tasks"]

#: Tasks per thread of a compiled 1x1 layer run as pool tasks (several images; one image
#: runs on :mod:`._kgemm_par`). Measured when one image ran as tasks too: the kernel's
#: rate does not drop with fewer output channels per task (BLAS's does), but finer tasks
#: did not pay either:
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
            multiply(fmat[k0:k1], src, ys[i, k0:k1, r0 * ow : r1 * ow], part)

    pull(len(tasks), run)
    return False


def _compiled_layer(dtype: Any, stride: tuple[int, int], c: int, k: int, pixels: int) -> bool:
    """True when the compiled product (:mod:`._kgemm`) takes this float32 stride-1 1x1 layer from BLAS.

    Strided layers (several images: each task gathers its own rows) keep the per-task
    choice of :func:`._conv_gemm.multiply`.
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

    One image runs as one compiled call per thread (:mod:`._kgemm_par`: the caller and
    the pool's workers pull blocks of output channels, each packing its own panels).
    Several images run as pulled tasks over the filter packed once by the caller; the
    operands go to the kernel as flat arrays and offsets (no views built per task).
    """
    n, c = x.shape[0], x.shape[1]
    k, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    rows, pixels = compiled.ROWS, oh * ow
    start = np.zeros(k, dtype=np.float32) if bias is None else np.ascontiguousarray(bias)
    residual, mode = epilogue
    whole = kernels("_kgemm_par") if n == 1 else None
    if whole is not None:  # one image: the whole parallel loop in one compiled call
        flat_out = y.reshape(-1)
        flat_r = flat_out if residual is None else residual
        whole.pointwise_image(
            fmat.reshape(-1), start, k, c, x.reshape(-1), pixels, flat_out, KERNEL_CHUNK, flat_r, mode
        )
        return
    tasks = pointwise_tasks(n, oh, ow, k, KERNEL_TASKS_PER_THREAD, rows)
    panels = -(-k // rows)
    packed = np.empty(panels * rows * c, dtype=np.float32)
    pbias = np.empty(panels * rows, dtype=np.float32)
    flat_f = fmat.reshape(-1)
    compiled.pack_filter(flat_f, c, start, k, c, rows, packed, pbias)
    flat_y, flat_x = y.reshape(-1), x.reshape(-1)
    flat_r = flat_y if residual is None else residual
    block = compiled.pixel_block(min(c, KERNEL_CHUNK))

    def run(items: Iterator[int]) -> None:
        for t in items:
            i, r0, r1, k0, k1 = tasks[t]
            compiled.product_packed(
                packed, pbias, k0 // rows, k1 - k0, c, flat_x, i * c * pixels + r0 * ow, pixels,
                flat_y, (i * k + k0) * pixels + r0 * ow, pixels, (r1 - r0) * ow, block, KERNEL_CHUNK,
                flat_r, mode,
            )  # fmt: skip

    parallel_pull(len(tasks), run)  # no BLAS call: its thread limit need not be taken


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

    pull(len(tasks), run)


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

    pull(len(tasks), run)
    np.sum(partials, axis=0, out=gf.reshape(k, c))
