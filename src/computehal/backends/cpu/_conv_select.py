"""Convolution algorithms chosen per shape, ahead of the general GEMM paths of :mod:`._conv`.

Each ``fast_*`` function returns True when it has computed the result, or False to
leave the problem to the general algorithms (any shape it does not cover, numba
missing, or an operand holding inf or NaN where an algorithm would spread it to
results that never read it). The choices, measured against the machine's sgemm rate
with ``computehal bench`` (ratios in the module docstrings of each algorithm):

* 1x1 convolutions without padding (one group): GEMMs on the images in place
  (:mod:`._conv_pointwise`), split into row blocks over the worker threads, all three passes;
  the forward pass also splits the output channels where the pixels give fewer than two
  tasks per thread (batch 1 at 14x14 and 7x7 ran on one core before).
  Products of depth (input channels) 64 or less run on a compiled register-tile kernel
  (:mod:`._kgemm`) instead of BLAS: it reads the pixels in place and writes each output
  once (OpenBLAS zeroes C, then reads and writes it again). CPU time on one core, best
  of 11, batch 8: 64 -> 256 channels at 56x56 123-135 vs 101-109 GFLOP/s, 64 -> 64
  114-117 vs 102-108 (with the earlier 8 x 2 tile; the 8 x 3 tile over a packed filter
  gained 10-15 % more, see :mod:`._kgemm`). Stride-1 float32 layers with at most 64
  input channels or at least 128 pixels per image now run whole on it (the filter
  packed once per call, narrow tiles for the last pixels of 14x14 images, the residual
  and ReLU applied as it stores); BLAS keeps 7x7 images and strided layers of several
  images (see :mod:`._conv_pointwise` for the figures).
* 3x3 stride-1 convolutions (one group, no dilation, at least :data:`WINOGRAD_MIN_CHANNELS`
  channels in and out, :data:`WINOGRAD_MIN_MACS` multiply-adds or more, at least
  :data:`WINOGRAD_MIN_TILES` output tiles), float32: Winograd F(4x4, 3x3)
  (:mod:`._conv_winograd`) for the forward pass and both gradients. It does 4x fewer
  multiply-adds than the direct definition. Measured on one core against a one-thread
  sgemm (direct definition's FLOPs), ResNet-50 at batch 8: 64 channels at 56x56 1.27,
  128 at 28x28 1.09, 256 at 14x14 1.00; the per-tap GEMMs of the general path 0.5-0.7.
* Other forward convolutions with one group that are strided, have few input channels
  or small images (the 7x7 stride-2 stem, 256 / 512 channels at 14x14 / 7x7): im2col
  blocks that stay in cache, batched over small images (:mod:`._conv_gemm`); the
  per-tap GEMMs of the general path run at half its rate on 7x7 images. With few output
  pixels in all (under 256 a thread: batch 1 from 14x14 down, 512 channels at 7x7 at
  batch 8; see :data:`._conv_gemm.SHARED_PIXELS`), the columns are built once and the
  threads split the GEMM by output channels instead of reading the whole filter matrix
  each (CPU time against a one-thread sgemm, 512 channels at 7x7, batch 8: 0.70 vs 0.61
  by pixel blocks; F(2x2, 3x3) 0.62, its 16 C K transformed
  filter written and read back every call; per-tap GEMMs 0.26). A bias is written
  into the output before the GEMM adds to it (the stem's small filter is instead copied
  with the bias as one more column): copying the 512-channel filter for its bias was a
  fifth of that layer's time at batch 1 (CPU time on one core 4.1-5.1 ms, 3.5 ms
  without the copy; the strided 512-channel 3x3 layer at 14x14 alike).
* Of those, one image of at most 64 output pixels with a deep filter (ResNet-50's
  512-channel 3x3 layers at batch 1, 7x7 outputs): the columns once, then the
  dense-layer product over the filter rows in place (:mod:`._conv_deep`), 0.91-0.99 of
  the CPU time of im2col on BLAS at stride 1 and 0.93-0.95 at stride 2 (in one
  process, interleaved, loaded machine).
* Of those, convolutions of images with at most 4 channels and rows of 32 pixels or more
  (the stem), float32: the im2col-free kernel of :mod:`._conv_direct` (each band of
  output rows splits its input rows into stride phases, every tap a unit-stride segment
  read through a table of offsets, the outputs stored in place). The stem at batch 8,
  CPU time of one thread, interleaved: 93-96 GFLOP/s vs im2col 79-81 against a
  one-thread sgemm of 135-140 (im2col's column building was 17 % of its time); batch
  1 82-88 vs 73-75. Bench rounds (two threads, shared machine): 0.77 and 0.96 of
  sgemm, where im2col gave 0.52-0.59. Bands as tasks with a compiled split and blocks
  that fill the last tile: 0.84-0.87 of a one-thread sgemm through the backend on one
  worker (CPU time, interleaved with the previous whole-image tasks' 0.77-0.78).
* Transformed Winograd filters are kept between calls (:mod:`._winograd_cache`, checked
  against a copy of the filter's bytes on every use, so no write or free can make it
  stale), which moves two more shapes to Winograd once their filter has been seen
  unchanged (:func:`cached_winograd_tile`): 512 channels at 7x7, batch 8, F(4x4, 3x3)
  (CPU time, best of 15: 13.3 ms vs im2col 16.3-17.8) and 256 channels at 14x14, batch
  1, F(2x2, 3x3) (1.9-2.8 ms vs 2.5-3.4); the shapes Winograd already took skip their
  filter transform too (256 channels at 14x14, batch 8, F(4x4, 3x3): 10.0-13.1 ms vs
  11.8-15.9 through the backend).
* One image with many channels at F(4x4, 3x3) (ResNet's 128 channels at 28x28, batch 1):
  the streamed schedule (:func:`streamed_winograd_tile`), the filter transformed per
  block of 64 output channels on every call and nothing cached: its ``U`` (2.4 MB,
  four times the filter) no longer streams from memory and the filter is no longer
  compared with a copy. ResNet-50 at batch 1 through the ONNX runner, per call,
  interleaved on a loaded machine: median 1.21-1.54 ms vs 1.52-1.82 cached (10th
  percentile 1.00-1.29 vs 1.19-1.49; CPU time of both threads 1.71-1.96 vs
  1.83-2.16); alone, best of 15: 0.80 vs 0.94 ms. F(2x2, 3x3) streamed (256 channels
  at 14x14) measured slower (2.19 vs 1.93 ms, CPU time 3.56 vs 2.71: its transform and
  rearrangement are a quarter of the work, against a fifth for F(4x4, 3x3)), and so
  did running its cached ``U`` by output-channel blocks (CPU time 3.1-3.2 ms: every
  block's GEMMs pack ``V`` again); it stays cached and by position.
* A lone ReLU after the convolution (ResNet's, folded by the ONNX runner) is applied by
  the Winograd output transforms, the im2col tasks and the direct kernel to each block
  as they store it, instead of a pass over the whole output afterwards (through the
  backend, interleaved, 20th percentile of 40 calls: the stem 2.33 vs 2.47 ms, 64
  channels at 56x56 1.30 vs 1.36, 128 at 28x28 1.83 vs 1.88; 256 at 14x14 equal).
  im2col with its output checked afterwards applies it after the check (an output
  NaN must still be seen); 1x1 convolutions on the compiled product as it stores (with
  a residual too, :func:`._conv_pointwise.pointwise_forward`), on BLAS after the product.
* im2col multiplies padding zeros by the filter, so a filter holding inf or NaN must go
  to the exact algorithm; that is checked on whichever is smaller, the filter before or
  the output after (:func:`_im2col_checked`). Scanning the 9.4 MB filter of ResNet's
  512-channel layers every call had cost a quarter of their time at batch 1 (CPU time,
  one core: 3x3 at 7x7 4.7-4.8 -> 3.1-4.0 ms, stride 2 at 14x14 4.6 -> 2.9-3.1 ms).

What still limits the rows that miss 0.8 of sgemm is the product and the memory, not
the split. The compiled product (8 x 3 register tile over a packed filter) runs
ResNet's 1x1 products at 0.65-0.8 of a one-thread sgemm's CPU-time rate, about BLAS's
rate on 256 -> 64 and above it on 64 -> 256; packing the pixels into tile-major panels,
running all channel panels over one tile at a time, full-depth passes and prefetching
the next block into L2 were measured equal or slower; prefetching each inner step's
pixels two tiles ahead into L1 gained 10-15 % on 256 -> 64 (107-111 vs 91-98 GFLOP/s,
one thread, against a one-thread sgemm of 140-148: still 0.75). The 1x1 rows read 3.2 MB per image
for 103 MFLOP, so they are the rows a busy memory system moves most: on the shared
machine the same code measured 0.41-0.95 (256 -> 64), 0.60-0.99 (64 -> 256) and
0.57-0.94 (256 -> 512 stride 2) of sgemm from one bench round to the next.

Re-measured later (batch 8, through the backend on one worker, CPU time against a
one-thread sgemm, interleaved): 256 -> 64 0.77-0.91, 64 -> 256 0.86-1.0, the stem
0.84-0.88 (its bands without the phase split 0.93-0.98: the split, which reads the
input from memory, is the 5-7 % between; tap
offsets rounded to 64 bytes, on the wrong data, gained only 3 %). Tried again and not
kept: every channel panel over one tile before the next gained 8-10 % on one warm
image but lost at batch 8 (kernel alone on 8 images: 256 -> 64 0.67 vs 0.90, 64 ->
256 0.48 vs 0.95); prefetching the next block's pixels (and outputs) into L2, spread
over a block's tiles: 0.77-0.80 vs 0.81-0.86 (256 -> 64); on 64 -> 256 equal (pixels
only) or worse (with the outputs: 0.80 vs 0.95); depth
slices of 32 or 128 and 8 tasks per thread instead of 2 at batch 8 within the noise.
In the quiet bench runs the 1x1 rows reached 138-166 GFLOP/s on two threads against
a two-thread sgemm of 207-210 (1.75x its one-thread rate), while one worker runs them
at 0.85-1.0 of a one-thread sgemm: what they lose is in going from one thread to two,
which a loaded machine could not resolve. Deep products on few pixels (batch 1 from
14x14 down) stay at 0.65-0.9 in BLAS.

``onednn`` on PyPI ships oneDNN with its C API, but only beside about 600 MB of Intel
SYCL / OpenCL runtime wheels; the algorithms here are written with numba, LLVM IR and
NumPy's / SciPy's BLAS instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ._conv_deep import deep_applies, deep_forward
from ._conv_direct import direct_applies, direct_forward
from ._conv_epilogue import finish_epilogue, relu_in_place
from ._conv_gemm import im2col_forward
from ._conv_pointwise import pointwise_backward_data, pointwise_backward_filter, pointwise_forward
from ._conv_winograd import (
    winograd_backward_data,
    winograd_backward_filter,
    winograd_forward,
    winograd_streamed,
)
from ._plumbing import FloatArray
from ._runtime import kernels

__all__ = [
    "fast_forward",
    "fast_backward_data",
    "fast_backward_filter",
    "cached_winograd_tile",
    "streamed_winograd_tile",
    "forward_algorithm",
    "pointwise_applies",
    "winograd_applies",
    "winograd2_applies",
]

#: Channels in and out below which the transforms cost more than the GEMMs save.
WINOGRAD_MIN_CHANNELS = 16
#: Direct multiply-adds below which a call is too small to be worth the transforms.
WINOGRAD_MIN_MACS = 1 << 22
#: Largest C * K for Winograd (the transformed filter takes 144 C K bytes of scratch).
WINOGRAD_MAX_FILTER = 1 << 20
#: Fewest output tiles of a Winograd variant: below, writing and reading the transformed
#: filter costs more than the GEMMs save, and the GEMMs are too narrow (ResNet's
#: 512-channel 7x7 layer at batch 8 has 32 4x4 tiles: 0.40 of sgemm by F(4x4, 3x3),
#: 0.54-0.69 by im2col, single core; it has 128 2x2 tiles, for F(2x2, 3x3)). 128 channels
#: at 28x28, batch 1 (49 tiles), CPU time against a one-thread sgemm: F(4x4, 3x3) 0.80,
#: F(2x2, 3x3) 0.73, per-tap GEMMs 0.72, im2col 0.54.
WINOGRAD_MIN_TILES = 48
#: Fewest 2x2 tiles of F(2x2, 3x3): its filter transform (16 C K floats written, read
#: back by the GEMMs) only pays off over many tiles. ResNet's 512-channel 7x7 layer,
#: one core: batch 8 (128 tiles) 20.5 ms vs 16.7 ms by im2col; batch 32 (512 tiles)
#: 46 ms vs 62 ms.
WINOGRAD2_MIN_TILES = 256
#: Fewest 4x4 / 2x2 tiles from which Winograd beats im2col with its transformed filter
#: cached (CPU time on one core, best of 11: 512 channels at 7x7, batch 8 (32 4x4 tiles):
#: F(4x4, 3x3) 19.8 ms vs im2col 25.9; 256 channels at 14x14, batch 1 (49 2x2 tiles):
#: F(2x2, 3x3) 2.7 ms vs 3.3; 512 channels at 7x7, batch 1: im2col 3.1 ms, F(2x2) 6.4).
CACHED_MIN_TILES4 = 32
CACHED_MIN_TILES2 = 48
#: Most 4x4 tiles of the streamed schedule (one image): see :func:`streamed_winograd_tile`.
STREAMED_MAX_TILES = 64
#: Smallest transformed filter (bytes) that the streamed schedule takes instead of a cached one.
STREAMED_MIN_FILTER_BYTES = 1 << 21
#: Output channels per work item of the streamed schedule.
STREAMED_BLOCK = 64
#: Multiply-adds below which the general paths' single call costs less than a task split.
GEMM_MIN_MACS = 1 << 18


def _macs(p: v.ConvProblem) -> int:
    return p.n * p.oh * p.ow * p.k * p.cg * p.fh * p.fw


def pointwise_applies(p: v.ConvProblem) -> bool:
    """True for a 1x1 convolution without padding (one group) that the task-split GEMMs take."""
    return (
        p.groups == 1
        and p.fh == p.fw == 1
        and not (p.ph or p.pw or p.pb or p.pr)
        and p.dtype in (np.float32, np.float64)
        and _macs(p) >= GEMM_MIN_MACS
    )


def _im2col_applies(p: v.ConvProblem) -> bool:
    return (
        p.groups == 1
        and p.dtype in (np.float32, np.float64)
        and _macs(p) >= GEMM_MIN_MACS
        and (p.sh > 1 or p.sw > 1 or p.c < WINOGRAD_MIN_CHANNELS or p.oh * p.ow < 256)
        and kernels("_kcols") is not None
    )


def _finite(a: FloatArray) -> bool:
    return bool(np.isfinite(a).all())


def _im2col_checked(
    p: v.ConvProblem,
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, ...],
    relu: bool = False,
) -> bool:
    """im2col (or the direct kernel) into ``y``; False where padding zeros met a non-finite filter value.

    ``y`` is then undefined. Both multiply padding zeros by the filter, so an inf or NaN in it would reach
    outputs the definition keeps finite. Whichever of the filter and the output is
    smaller is checked: the filter before (the stem), or the output after (ResNet's
    512-channel 3x3 layers at batch 1, where scanning the 9.4 MB filter took a quarter
    of the call): every filter value multiplies something for every output pixel, so
    an all-finite output means the filter was finite. ``relu``: ReLU applied to ``y``
    (in each task while its block is in cache, unless the output is to be checked).
    """
    padded = bool(geometry[0] or geometry[1] or p.pb or p.pr)
    filter_first = f.size <= y.size
    if padded and filter_first and not _finite(f):
        return False
    fused = relu and (filter_first or not padded)
    if _direct_takes(p):
        direct_forward(x, f, bias, y, (geometry[0], geometry[1], p.sh, p.sw), fused)
    elif _deep_takes(p):
        deep_forward(x, f, bias, y, geometry, fused)
    else:
        im2col_forward(x, f, bias, y, geometry, fused)
    if padded and not filter_first and not _finite(y) and not _finite(f):
        return False
    if relu and not fused:
        relu_in_place(y)
    return True


def _deep_takes(p: v.ConvProblem) -> bool:
    """True for the im2col shapes of one small deep image that :mod:`._conv_deep` computes instead."""
    dilated = p.dh != 1 or p.dw != 1
    return p.dtype == np.float32 and deep_applies(p.n, p.c * p.fh * p.fw, p.oh * p.ow, dilated)


def _direct_takes(p: v.ConvProblem) -> bool:
    """True for the im2col shapes that the direct kernel (:mod:`._conv_direct`) computes instead."""
    return p.dtype == np.float32 and direct_applies(p.c, p.ow, p.dh, p.dw)


def forward_algorithm(p: v.ConvProblem, f: FloatArray) -> str:
    """The algorithm :func:`fast_forward` takes for ``p`` ("" for the general paths)."""
    if pointwise_applies(p):
        return "pointwise"
    if winograd_applies(p):
        return "winograd"
    if winograd2_applies(p):
        return "winograd2"
    if _im2col_applies(p):
        return "direct" if _direct_takes(p) else "im2col"
    return ""


def cached_winograd_tile(p: v.ConvProblem) -> int:
    """The Winograd tile that beats im2col on ``p`` once its transformed filter is cached (0: none).

    Too few tiles for Winograd with a filter transform per call, enough without one
    (:mod:`._winograd_cache`): F(4x4, 3x3) from :data:`CACHED_MIN_TILES4` 4x4 tiles
    (ResNet's 512-channel 7x7 layer at batch 8), else F(2x2, 3x3) from
    :data:`CACHED_MIN_TILES2` 2x2 tiles (its 256-channel 14x14 layer at batch 1).
    """
    if not _winograd_shape(p) or winograd_applies(p) or winograd2_applies(p):
        return 0
    if _tiles(p, 4) >= CACHED_MIN_TILES4:
        return 4
    if _tiles(p, 2) >= CACHED_MIN_TILES2 and kernels("_winograd2") is not None:
        return 2
    return 0


def streamed_winograd_tile(p: v.ConvProblem) -> int:
    """4 when F(4x4, 3x3) computes ``p`` by the streamed schedule, else 0.

    One image with many channels (ResNet's 128 channels at 28x28): the filter
    transformed per block of output channels on every call
    (:func:`._conv_winograd.winograd_streamed`) instead of a cached ``U`` read from
    memory and compared with the filter. F(2x2, 3x3) (256 channels at 14x14) keeps its
    cached transform: streamed, it measured slower (see the module docstring).
    """
    if not winograd_applies(p) or _tiles(p, 4) > STREAMED_MAX_TILES:
        return 0
    return 4 if 36 * p.c * p.k * 4 >= STREAMED_MIN_FILTER_BYTES else 0


def _tiles(p: v.ConvProblem, tile: int) -> int:
    return p.n * -(-p.oh // tile) * -(-p.ow // tile)


def _winograd_shape(p: v.ConvProblem) -> bool:
    return (
        p.dtype == np.float32
        and p.groups == 1
        and p.fh == p.fw == 3
        and p.sh == p.sw == 1
        and p.dh == p.dw == 1
        and min(p.c, p.k) >= WINOGRAD_MIN_CHANNELS
        and p.c * p.k <= WINOGRAD_MAX_FILTER
        and p.n * p.oh * p.ow * p.c * p.k * 9 >= WINOGRAD_MIN_MACS
        and kernels("_winograd") is not None
        and kernels("_kwinograd") is not None
    )


def winograd_applies(p: v.ConvProblem) -> bool:
    """True when the Winograd F(4x4, 3x3) kernels compute ``p``."""
    return _winograd_shape(p) and _tiles(p, 4) >= WINOGRAD_MIN_TILES


def winograd2_applies(p: v.ConvProblem) -> bool:
    """True when F(2x2, 3x3) computes ``p``: too few 4x4 tiles, many 2x2 ones (small images, large batch)."""
    return (
        _winograd_shape(p)
        and _tiles(p, 4) < WINOGRAD_MIN_TILES
        and _tiles(p, 2) >= WINOGRAD2_MIN_TILES
        and kernels("_winograd2") is not None
    )


def fast_forward(
    p: v.ConvProblem,
    x: FloatArray,
    f: FloatArray,
    y: FloatArray,
    bias: FloatArray | None,
    epilogue: tuple[FloatArray | None, bool] = (None, False),
) -> bool:
    """``y`` = forward convolution (plus ``bias``, then ``epilogue``) by a shape-specific algorithm.

    ``epilogue``: ``(residual, relu)``, ``y = relu(y + residual)``; True means it was applied too.
    False leaves the problem to the general algorithms, which then overwrite ``y`` (an
    im2col attempt that met a non-finite filter may have written it). The compiled 1x1
    product applies the whole epilogue as it stores; the Winograd, im2col and direct
    algorithms a lone ReLU, to each block of output as they store it (the separate pass
    over ``y`` it replaces cost ResNet-50 at batch 1 about 0.1 ms per 200 000 outputs);
    anything left runs as one pass afterwards.
    """
    residual, relu = epilogue
    algorithm = forward_algorithm(p, f)
    if algorithm == "pointwise":
        wanted = residual is not None or relu
        if not pointwise_forward(x, f, bias, y, p.sh, p.sw, epilogue if wanted else None):
            finish_epilogue(y, residual, relu)
        return True
    fused = relu and residual is None
    if not _fused_forward(p, algorithm, (x, f, bias, y), fused):
        return False
    if not fused:
        finish_epilogue(y, residual, relu)
    return True


def _fused_forward(p: v.ConvProblem, algorithm: str, operands: tuple[Any, ...], relu: bool) -> bool:
    """:func:`fast_forward` by ``algorithm`` (not the 1x1 product), ReLU applied as it stores if ``relu``."""
    x, f, bias, y = operands
    pads = (p.ph, p.pw)
    frozen = (p.f.allocation.serial, p.f.offset) if p.f.allocation.frozen else None
    streamed = algorithm == "winograd" and streamed_winograd_tile(p)
    if streamed:
        if winograd_streamed(x, f, bias, y, *pads, streamed, STREAMED_BLOCK, relu):
            return True
    elif algorithm in ("winograd", "winograd2"):
        tile = 2 if algorithm == "winograd2" else 4
        if winograd_forward(x, f, bias, y, *pads, tile, relu=relu, frozen=frozen):
            return True
    elif algorithm == "im2col" and (tile := cached_winograd_tile(p)):
        if winograd_forward(x, f, bias, y, *pads, tile, cached_only=True, relu=relu, frozen=frozen):
            return True
    if algorithm in ("im2col", "direct") or (algorithm.startswith("winograd") and _im2col_applies(p)):
        return _im2col_checked(p, x, f, bias, y, (*pads, p.sh, p.sw, p.dh, p.dw), relu)
    return False


def fast_backward_data(p: v.ConvProblem, gy: FloatArray, f: FloatArray, gx: FloatArray) -> bool:
    """``gx`` = data gradient by a shape-specific algorithm, if one applies."""
    if pointwise_applies(p):
        pointwise_backward_data(gy, f, gx, p.sh, p.sw)
        return True
    if winograd_applies(p) and winograd_backward_data(gy, f, gx, p.ph, p.pw):
        return True
    if winograd2_applies(p) and winograd_backward_data(gy, f, gx, p.ph, p.pw, 2):
        return True
    if p.sh == p.sw == 1 and p.oh * p.ow < 256 and _im2col_applies(p) and _finite(f):
        # Stride 1, small images: the forward convolution of gy with the flipped filter,
        # K and C swapped, padded by the dilated filter's extent less the padding.
        flipped = np.ascontiguousarray(f[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        top, left = p.dh * (p.fh - 1) - p.ph, p.dw * (p.fw - 1) - p.pw
        im2col_forward(gy, flipped, None, gx, (top, left, 1, 1, p.dh, p.dw))
        return True
    return False


def fast_backward_filter(p: v.ConvProblem, x: FloatArray, gy: FloatArray, gf: FloatArray) -> bool:
    """``gf`` = filter gradient by a shape-specific algorithm, if one applies."""
    if pointwise_applies(p):
        pointwise_backward_filter(x, gy, gf, p.sh, p.sw)
        return True
    if winograd_applies(p):
        return winograd_backward_filter(x, gy, gf, p.ph, p.pw)
    return False
