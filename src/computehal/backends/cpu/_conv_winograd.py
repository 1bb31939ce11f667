"""Drivers of the Winograd F(4x4, 3x3) kernels (:mod:`._winograd`): schedules, work split, scratch.

Two tile sizes: F(4x4, 3x3) (:mod:`._winograd`) and, for small images with many
channels, F(2x2, 3x3) (:mod:`._winograd2`, by position only). Two schedules, chosen by
the size of the transformed filter ``U`` (36 C K floats):

* fused (``U`` fits in cache, e.g. 64 channels): work items of a few dozen tiles (a
  range of tile rows of one image, or several whole small images) each run the whole
  pipeline (input transform, 36 GEMMs, output transform) with ``V`` and ``M`` in cache;
* by position (larger ``U``, e.g. 128 to 512 channels): every tile's ``V`` first (by
  image rows), then one GEMM per position over all tiles, each reading its ``U[xi]``
  once, then the output transform (by image rows). The fused schedule would stream the
  whole ``U`` again for every item.

A third schedule, streamed (:func:`winograd_streamed`), keeps nothing between calls:
after every tile's ``V``, each work item takes a block of output channels, transforms
that block of the filter into its own scratch (it stays in L2), runs every position's
GEMM for it and the block's output transform. For one image with many channels the
cached ``U`` (36 C K floats, four times the filter) would stream from memory on every
call and its filter be compared with a copy; :mod:`._conv_select` says where it wins.
Comparing a cached ``U``'s filter in chunks pulled by both threads with the input
transform (instead of one ``memcmp`` first) measured 1-4 % more CPU time on ResNet's
256-channel 14x14 layer at batch 1 and no shorter calls on a loaded machine: not kept.

Work is pulled by the worker threads. ``U`` is laid out in panels of 64 output
channels (:mod:`._kwinograd`), and the per-position GEMMs run on the compiled
dense-layer tile over them (one thread: 16 x (49 x 256 x 256) 86 GFLOP/s against
OpenBLAS ``matmul``'s 73 on the same machine state; ResNet-50's 256-channel 14x14
layer at batch 1 0.84-0.88 of the call's CPU time, its 512-channel 7x7 layer at batch
8 0.75, interleaved in one process). The fused schedule keeps single-threaded BLAS
where ``U`` is one panel (64 output channels): on those shallow products OpenBLAS ran
1.2x the tile's rate. Running a cached ``U`` panel by panel (products and output
transform per 64 channels, one parallel step less) measured 1.01-1.18x the CPU time
of by position: not kept.
Scratch is kept between calls (:func:`._scratch.thread_scratch`): a convolution call allocates
nothing of the size of its images.

Every driver returns False, having written nothing it promises, when an input value
is not finite (the caller then takes an exact algorithm): Winograd's transforms would
spread a NaN or infinity to every output of its tile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import _winograd_cache as _cache
from ._kwinograd import PANEL
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, parallel_ranges, single_threaded_blas, workers
from ._scratch import thread_scratch

__all__ = ["winograd_forward", "winograd_streamed", "winograd_backward_data", "winograd_backward_filter"]

#: Target tiles per fused work item: V and M of an item (36 x tiles x (C + K) floats,
#: about 4 MB for 64 channels: larger items measured faster than L2-sized ones).
ITEM_FLOATS = 1 << 20
MIN_TILES = 32
MAX_TILES = 256
#: Largest transformed filter (floats) of the fused schedule.
FUSED_FILTER_FLOATS = 1 << 18


Item = tuple[int, int, int, int]

#: The kernel module of each output tile size: F(4x4, 3x3) and F(2x2, 3x3).
_MODULE = {4: "_winograd", 2: "_winograd2"}


def _items(n: int, th: int, tw: int, cin: int, kout: int) -> list[Item]:
    """Fused work items ``(n0, n1, th0, th1)`` of about the target tile count, a few per thread."""
    per_image = th * tw
    target = max(MIN_TILES, min(MAX_TILES, ITEM_FLOATS // (36 * (cin + kout))))
    # Enough items for every thread to get a few (load balance on a shared machine).
    target = max(1, min(target, -(-n * per_image // (3 * workers()))))
    if per_image <= target:
        step = max(1, target // per_image)
        return [(n0, min(n, n0 + step), 0, th) for n0 in range(0, n, step)]
    rows = max(1, target // tw)
    return [(i, i + 1, r0, min(th, r0 + rows)) for i in range(n) for r0 in range(0, th, rows)]


def _row_items(n: int, th: int, tw: int) -> list[tuple[int, int, int]]:
    """Transform items ``(image, th0, th1)`` of the by-position schedule: a few per thread."""
    rows = max(1, min(th, -(-(n * th) // (4 * workers())), max(1, 64 // tw)))
    return [(i, r0, min(th, r0 + rows)) for i in range(n) for r0 in range(0, th, rows)]


def _pull(count: int, body: Callable[[int], bool], blas: bool = False) -> bool:
    """Run ``body(i)`` for ``i < count`` on the worker threads; False if any returns False.

    ``blas``: the bodies call BLAS, which is then held to one thread meanwhile (taking and
    releasing that limit costs about 10 us, so only the steps that call BLAS take it:
    since the products moved to the compiled tile, most steps call none).
    """
    ok = [True]

    def run(indices: Iterator[int]) -> None:
        for i in indices:
            if not ok[0]:
                return
            if not body(i):
                ok[0] = False

    if blas:
        with single_threaded_blas():
            parallel_pull(count, run)
    else:
        parallel_pull(count, run)
    return ok[0]


def _transformed_filter(f: FloatArray, tile: int = 4) -> FloatArray | None:
    """``U`` of filters ``f`` [K, C, 3, 3] in output-channel panels (:mod:`._kwinograd`); None: not finite."""
    kout, cin = f.shape[0], f.shape[1]
    size = (tile + 2) ** 2 * cin * kout
    u = thread_scratch("winograd-u", size)[:size]
    panels = _filter_blocks(kout, PANEL)
    return u if _pull(len(panels), lambda i: _panel_transform(f, panels[i], tile, u)) else None


def _panel_transform(f: FloatArray, channels: tuple[int, int], tile: int, u: FloatArray) -> bool:
    """The panels of ``U`` for output channels ``[k0, k1)`` (multiples of :data:`PANEL` apart from ``k1``).

    ``u`` holds the panels of all ``K`` channels (panel ``j`` from ``j PANEL positions C``).
    False when a filter value is not finite.
    """
    k0, k1 = channels
    kern, taps_last = kernels(_MODULE[tile]), kernels("_winograd").taps_last
    cin, positions = f.shape[1], (tile + 2) ** 2
    for p0 in range(k0, k1, PANEL):
        width = min(PANEL, k1 - p0)
        ft = thread_scratch("winograd-ft", 9 * cin * width)[: 9 * cin * width].reshape(cin, 3, 3, width)
        taps_last(f[p0 : p0 + width], ft, False)
        block = u[p0 * positions * cin : (p0 + width) * positions * cin]
        if not kern.filter_transform(ft, block, 0, cin, thread_scratch("winograd-g", 18 * width)):
            return False
    return True


def _item_scratch(
    kern: Any, rows: int, tw: int, tiles: int, cin: int, kout: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """This thread's scratch for a fused work item of ``tiles`` tiles, ``rows`` tile rows of ``tw`` per image.

    ``V`` (36 x tiles x C floats), ``M`` (36 x tiles x K) and the transforms' work area.
    """
    v = thread_scratch("winograd-iv", 36 * tiles * cin)[: 36 * tiles * cin]
    m = thread_scratch("winograd-im", 36 * tiles * kout)[: 36 * tiles * kout]
    size = max(kern.input_item_scratch(rows, tw, cin), kern.output_item_scratch(rows, tw, kout))
    return v, m, thread_scratch("winograd", size)


def _fused(
    x: FloatArray, u: FloatArray, bias: FloatArray | None, y: FloatArray, pt: int, pl: int, relu: bool = False
) -> bool:
    kern = kernels("_winograd")
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    th, tw = -(-oh // 4), -(-ow // 4)
    items = _items(n, th, tw, cin, kout)
    b = bias if bias is not None else np.zeros(1, dtype=np.float32)

    def body(i: int) -> bool:
        n0, n1, t0, t1 = items[i]
        rows = t1 - t0
        tiles = (n1 - n0) * rows * tw
        v, m, work = _item_scratch(kern, rows, tw, tiles, cin, kout)
        for image in range(n0, n1):
            if kern.input_item(x, image, t0, t1, pt, pl, tw, v, tiles, (image - n0) * rows * tw, work):
                return False
        if kout <= PANEL:
            # One panel: U is [36, C, K] as BLAS reads it, and on these shallow products
            # (64 channels, a few hundred tiles) OpenBLAS ran 1.2x the compiled tile's rate.
            np.matmul(v.reshape(36, tiles, cin), u.reshape(36, cin, kout), out=m.reshape(36, tiles, kout))
        else:
            kernels("_kwinograd").position_products(v, u, m, 0, 36, tiles, cin, kout, 36)
        for image in range(n0, n1):
            kern.output_item(
                m, y, image, t0, t1, tw, tiles, (image - n0) * rows * tw, b, _flags(bias, relu), work
            )
        return True

    return _pull(len(items), body, kout <= PANEL)


def _positions(count: int, body: Callable[[int, int], object], blas: bool = False) -> None:
    """Run ``body(xi0, xi1)`` over ``count`` positions in a few ranges per thread."""
    step = max(1, count // (3 * workers()))
    ranges = [(xi, min(count, xi + step)) for xi in range(0, count, step)]

    def each(i: int) -> bool:
        body(*ranges[i])
        return True

    _pull(len(ranges), each, blas)


def _transform_inputs(
    x: FloatArray, geometry: tuple[int, int, int, int], v: FloatArray, tile: int = 4
) -> bool:
    """V of every tile of ``x`` (tile ``(n, th, tw)`` at row ``(n th + th) tw + tw``).

    ``geometry``: (pt, pl, th, tw). False when an input value is not finite.
    """
    pt, pl, th, tw = geometry
    kern = kernels(_MODULE[tile])
    cin, tiles = x.shape[1], x.shape[0] * th * tw
    items = _row_items(x.shape[0], th, tw)

    def body(i: int) -> bool:
        n, r0, r1 = items[i]
        work = thread_scratch("winograd", kern.input_item_scratch(r1 - r0, tw, cin))
        return not kern.input_item(x, n, r0, r1, pt, pl, tw, v, tiles, (n * th + r0) * tw, work)

    return _pull(len(items), body)


def _by_position(
    x: FloatArray,
    u: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, int, int],
    relu: bool = False,
) -> bool:
    """The by-position schedule; ``geometry``: (pt, pl, tile); ReLU after the bias if ``relu``."""
    pt, pl, tile = geometry
    kern = kernels(_MODULE[tile])
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    th, tw = -(-oh // tile), -(-ow // tile)
    tiles, positions = n * th * tw, (tile + 2) ** 2
    v = thread_scratch("winograd-v", positions * tiles * cin)[: positions * tiles * cin]
    m = thread_scratch("winograd-m", positions * tiles * kout)[: positions * tiles * kout]
    if not _transform_inputs(x, (pt, pl, th, tw), v, tile):
        return False
    products = kernels("_kwinograd").position_products
    _positions(positions, lambda xi0, xi1: products(v, u, m, xi0, xi1, tiles, cin, kout, positions))
    items = _row_items(n, th, tw)
    b = bias if bias is not None else np.zeros(1, dtype=np.float32)

    def body(i: int) -> bool:
        image, r0, r1 = items[i]
        work = thread_scratch("winograd", kern.output_item_scratch(r1 - r0, tw, kout))
        kern.output_item(m, y, image, r0, r1, tw, tiles, (image * th + r0) * tw, b, _flags(bias, relu), work)
        return True

    return _pull(len(items), body)


def _conv(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pt: int, pl: int, tile: int
) -> bool:
    """``y`` = 3x3 stride-1 convolution of ``x`` with the filters ``f`` [K, C, 3, 3] (+ bias)."""
    u = _transformed_filter(f, tile)
    return u is not None and _run(x, u, bias, y, (pt, pl, tile))


def _run(
    x: FloatArray,
    u: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, int, int],
    relu: bool = False,
) -> bool:
    """``y`` = the convolution of ``x`` with the transformed filters ``u`` (+ bias, then ReLU if ``relu``).

    ``geometry``: (pt, pl, tile).
    """
    pt, pl, tile = geometry
    if tile == 4 and u.size <= FUSED_FILTER_FLOATS:
        return _fused(x, u, bias, y, pt, pl, relu)
    return _by_position(x, u, bias, y, (pt, pl, tile), relu)


def _flags(bias: FloatArray | None, relu: bool) -> int:
    """The output transform's flags: 1 adds the bias, 2 applies ReLU."""
    return (1 if bias is not None else 0) | (2 if relu else 0)


def winograd_forward(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    pt: int,
    pl: int,
    tile: int = 4,
    cached_only: bool = False,
    relu: bool = False,
    frozen: tuple[int, int] | None = None,
) -> bool:
    """Forward 3x3 stride-1 convolution: ``x`` [N, C, H, W], ``f`` [K, C, 3, 3], ``y`` [N, K, OH, OW].

    ``pt`` / ``pl``: top / left padding (the bottom and right follow from the shapes);
    ``tile``: 4 for F(4x4, 3x3), 2 for F(2x2, 3x3) (:mod:`._winograd2`, small images).
    The transformed filter comes from :mod:`._winograd_cache` where it holds ``f``'s
    bytes, and is stored there once ``f`` has been seen unchanged on an earlier call.
    ``cached_only``: decline (False, nothing written) unless the transform is stored or
    about to be (shapes where Winograd wins only without a transform per call).
    ``relu``: apply ReLU (NaN -> 0) to each output row as it is stored. ``frozen``: the
    filter's (allocation serial, byte offset) when its allocation is frozen: its transform
    is then kept at once and served without comparing the filter.
    """
    f = np.ascontiguousarray(f)
    u = _cache.lookup(f, tile, frozen)
    if u is None:
        keep = frozen is not None or _cache.seen_before(f, tile)
        if cached_only and not keep:
            return False
        u = _transformed_filter(f, tile)
        if u is None:
            return False
        if keep:
            u = u.copy()
            _cache.store(f, tile, u, frozen)
    return _run(x, u, bias, y, (pt, pl, tile), relu)


def _filter_blocks(kout: int, block: int) -> list[tuple[int, int]]:
    """Output-channel blocks ``(k0, k1)``, a multiple of :data:`PANEL` channels each (the last fewer)."""
    block = max(PANEL, block - block % PANEL)
    return [(k0, min(kout, k0 + block)) for k0 in range(0, kout, block)]


def _by_blocks(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    geometry: tuple[int, int, int, int],
    relu: bool = False,
) -> bool:
    """The convolution by output-channel blocks: every tile's ``V``, then per block its filter and outputs.

    ``geometry``: (pt, pl, tile, block). Each work item of the second step takes a
    block of ``block`` output channels: it rearranges and transforms that block of the
    filter into its own scratch (a few hundred kilobytes that stay in L2), runs every
    position's GEMM for it and transforms the block's outputs back (one parallel step
    less than by position). False when a value is not finite (``y`` then undefined).
    """
    pt, pl, tile, block = geometry
    kern = kernels(_MODULE[tile])
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    th, tw = -(-oh // tile), -(-ow // tile)
    tiles, positions = n * th * tw, (tile + 2) ** 2
    v = thread_scratch("winograd-v", positions * tiles * cin)[: positions * tiles * cin]
    if not _transform_inputs(x, (pt, pl, th, tw), v, tile):
        return False
    blocks = _filter_blocks(kout, block)
    b = bias if bias is not None else np.zeros(kout, dtype=np.float32)
    products = kernels("_kwinograd").position_products
    flags = _flags(bias, relu)

    def body(i: int) -> bool:
        k0, k1 = blocks[i]
        width = k1 - k0
        u = thread_scratch("winograd-ub", positions * cin * width)[: positions * cin * width]
        if not _panel_transform(f[k0:k1], (0, width), tile, u):
            return False
        m = thread_scratch("winograd-mb", positions * tiles * width)[: positions * tiles * width]
        products(v, u, m, 0, positions, tiles, cin, width, positions)
        work = thread_scratch("winograd", kern.output_item_scratch(th, tw, width))
        for image in range(n):
            out = y[image : image + 1, k0:k1]
            kern.output_item(m, out, 0, 0, th, tw, tiles, image * th * tw, b[k0:k1], flags, work)
        return True

    return _pull(len(blocks), body)


def winograd_streamed(
    x: FloatArray,
    f: FloatArray,
    bias: FloatArray | None,
    y: FloatArray,
    pt: int,
    pl: int,
    tile: int,
    block: int,
    relu: bool = False,
) -> bool:
    """:func:`winograd_forward` with the filter transformed per block of ``block`` output channels.

    Nothing is kept between calls (:func:`_by_blocks`): where a cached
    ``U`` (up to 4x the filter) would be read from memory and the filter compared with
    its copy (twice the filter read again) on every call, for one image with many
    channels that traffic can cost more than the transform (see :mod:`._conv_select`).
    False (``y`` undefined) when a value is not finite.
    """
    return _by_blocks(x, np.ascontiguousarray(f), bias, y, (pt, pl, tile, block), relu)


def winograd_backward_data(
    gy: FloatArray, f: FloatArray, gx: FloatArray, pt: int, pl: int, tile: int = 4
) -> bool:
    """Data gradient: the convolution of ``gy`` with the flipped filter, K and C swapped.

    ``gx[h, w] = sum_r,s gy[h + pt - r, w + pl - s] f[r, s]``: a forward convolution
    reading ``gy`` at (h - (2 - pt) + r', ...) with ``f`` flipped (r' = 2 - r).
    """
    flipped = np.ascontiguousarray(f[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    return _conv(gy, flipped, None, gx, 2 - pt, 2 - pl, tile)


def _untransform(total: FloatArray, gf: FloatArray) -> None:
    """``gf`` [K, C, 3, 3] from the summed transformed gradient ``total`` [36, C, K]."""
    kern = kernels("_winograd")
    kout, cin = gf.shape[0], gf.shape[1]
    out = np.empty((cin, 3, 3, kout), dtype=np.float32)

    def run(c0: int, c1: int) -> None:
        kern.filter_untransform(total, out, c0, c1, thread_scratch("winograd-g", 18 * kout))

    parallel_ranges(cin, run, grain=max(1, (1 << 15) // max(1, 9 * kout)))
    gf[...] = out.transpose(3, 0, 1, 2)


def _filter_fused(x: FloatArray, gy: FloatArray, pt: int, pl: int) -> FloatArray | None:
    """The summed transformed filter gradient, each thread adding its items into its own partial."""
    kern = kernels("_winograd")
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = gy.shape[1], gy.shape[2], gy.shape[3]
    th, tw = -(-oh // 4), -(-ow // 4)
    items = _items(n, th, tw, cin, kout)
    partials: list[FloatArray] = []
    finite = [True]
    lock = threading.Lock()

    def run(indices: Iterator[int]) -> None:
        acc = np.zeros(36 * cin * kout, dtype=np.float32)
        with lock:
            partials.append(acc)
        for i in indices:
            n0, n1, t0, t1 = items[i]
            rows = t1 - t0
            tiles = (n1 - n0) * rows * tw
            v, mg, work = _item_scratch(kern, rows, tw, tiles, cin, kout)
            for image in range(n0, n1):
                first = (image - n0) * rows * tw
                bad = kern.input_item(x, image, t0, t1, pt, pl, tw, v, tiles, first, work)
                if bad or kern.grad_item(gy, image, t0, t1, tw, mg, tiles, first, work) or not finite[0]:
                    finite[0] = False
                    return
            kern.position_filter_gemms(v, mg, acc, 0, 36, tiles, cin, kout, 1.0)

    with single_threaded_blas():
        parallel_pull(len(items), run)
    if not finite[0]:
        return None
    total = partials[0]
    for extra in partials[1:]:
        total += extra
    return total


def _filter_by_position(x: FloatArray, gy: FloatArray, pt: int, pl: int) -> FloatArray | None:
    """The transformed filter gradient: V and A dY A^T of every tile, then one GEMM per position."""
    kern = kernels("_winograd")
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = gy.shape[1], gy.shape[2], gy.shape[3]
    th, tw = -(-oh // 4), -(-ow // 4)
    tiles = n * th * tw
    v = thread_scratch("winograd-v", 36 * tiles * cin)[: 36 * tiles * cin]
    mg = thread_scratch("winograd-m", 36 * tiles * kout)[: 36 * tiles * kout]
    if not _transform_inputs(x, (pt, pl, th, tw), v):
        return None
    items = _row_items(n, th, tw)

    def body(i: int) -> bool:
        image, r0, r1 = items[i]
        work = thread_scratch("winograd", kern.output_item_scratch(r1 - r0, tw, kout))
        return not kern.grad_item(gy, image, r0, r1, tw, mg, tiles, (image * th + r0) * tw, work)

    if not _pull(len(items), body):
        return None
    du = np.empty((36, cin, kout), dtype=np.float32)
    vt, mgs = v.reshape(36, tiles, cin).transpose(0, 2, 1), mg.reshape(36, tiles, kout)
    _positions(36, lambda xi0, xi1: np.matmul(vt[xi0:xi1], mgs[xi0:xi1], out=du[xi0:xi1]), True)
    return du.reshape(-1)


def winograd_backward_filter(x: FloatArray, gy: FloatArray, gf: FloatArray, pt: int, pl: int) -> bool:
    """Filter gradient ``gf`` [K, C, 3, 3] of a 3x3 stride-1 convolution."""
    cin, kout = x.shape[1], gy.shape[1]
    if 36 * cin * kout <= FUSED_FILTER_FLOATS:
        total = _filter_fused(x, gy, pt, pl)
    else:
        total = _filter_by_position(x, gy, pt, pl)
    if total is None:
        return False
    _untransform(total, gf)
    return True
