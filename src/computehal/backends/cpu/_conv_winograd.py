"""Drivers of the Winograd F(4x4, 3x3) kernels (:mod:`._winograd`): work split and scratch.

Each call splits the output tiles into work items of about :data:`TILES_PER_ITEM`
tiles (a range of tile rows of one image, or several whole small images), pulled by
the worker threads, each running its GEMMs on single-threaded BLAS. Scratch is one
flat float32 array per thread, kept between calls (:func:`thread_scratch`): a
convolution call allocates nothing of the size of its images.

Every driver returns False, having written nothing it promises, when an input value
is not finite (the caller then takes an exact algorithm): Winograd's transforms would
spread a NaN or infinity to every output of its tile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._plumbing import FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas, workers

__all__ = ["winograd_forward", "winograd_backward_data", "winograd_backward_filter", "thread_scratch"]

#: Target tiles per work item: V and M of an item (36 x tiles x (C + K) floats) stay
#: near the size of L2 for 64 channels; wider channels take at least MIN_TILES.
ITEM_FLOATS = 1 << 18
MIN_TILES = 32
MAX_TILES = 256

_local = threading.local()


def thread_scratch(name: str, size: int, dtype: Any = np.float32) -> FloatArray:
    """An array of at least ``size`` elements owned by this thread (grown, never shrunk).

    Kept between calls, so that a convolution does not fault in fresh pages for its
    scratch each time.
    """
    buffers: dict[tuple[str, Any], FloatArray] | None = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    key = (name, np.dtype(dtype))
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = np.empty(max(size, 1), dtype=dtype)
    return buf


def _items(n: int, th: int, tw: int, cin: int, kout: int) -> list[tuple[int, int, int, int]]:
    """Work items ``(n0, n1, th0, th1)`` of about the target tile count, at least one per thread."""
    per_image = th * tw
    target = max(MIN_TILES, min(MAX_TILES, ITEM_FLOATS // (36 * (cin + kout))))
    # Enough items for every thread to get a few (load balance on a shared machine).
    target = max(1, min(target, -(-n * per_image // (3 * workers()))))
    if per_image <= target:
        step = max(1, target // per_image)
        return [(n0, min(n, n0 + step), 0, th) for n0 in range(0, n, step)]
    rows = max(1, target // tw)
    return [(i, i + 1, r0, min(th, r0 + rows)) for i in range(n) for r0 in range(0, th, rows)]


def _run(items: list[tuple[int, int, int, int]], body: Any) -> bool:
    """Run ``body(item, ...)`` over the items on the worker threads; False if any returns False."""
    ok = [True]

    def run(indices: Iterator[int]) -> None:
        for i in indices:
            if not ok[0]:
                return
            if not body(items[i]):
                ok[0] = False

    with single_threaded_blas():
        parallel_pull(len(items), run)
    return ok[0]


def _transformed_filter(ft: FloatArray) -> FloatArray | None:
    """``U`` [36, Cin, Kout] of filters ``ft`` [Cin, 3, 3, Kout], or None if one is not finite."""
    kern = kernels("_winograd")
    u = thread_scratch("winograd-u", 36 * ft.shape[0] * ft.shape[3])[: 36 * ft.shape[0] * ft.shape[3]]
    return u if kern.filter_transform(ft, u) else None


def _conv(x: FloatArray, ft: FloatArray, bias: FloatArray | None, y: FloatArray, pt: int, pl: int) -> bool:
    """``y`` = 3x3 stride-1 convolution of ``x`` with the filters ``ft`` [C, 3, 3, K] (+ bias)."""
    kern = kernels("_winograd")
    u = _transformed_filter(ft)
    if u is None:
        return False
    n, cin = x.shape[0], x.shape[1]
    kout, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    th, tw = -(-oh // 4), -(-ow // 4)
    items = _items(n, th, tw, cin, kout)
    b = bias if bias is not None else np.zeros(1, dtype=np.float32)
    has_bias = bias is not None

    def body(item: tuple[int, int, int, int]) -> bool:
        n0, n1, t0, t1 = item
        work = thread_scratch("winograd", kern.forward_scratch(n1 - n0, t1 - t0, tw, cin, kout))
        ok: bool = kern.forward_item(x, y, u, b, has_bias, n0, n1, t0, t1, pt, pl, work)
        return ok

    return _run(items, body)


def winograd_forward(
    x: FloatArray, f: FloatArray, bias: FloatArray | None, y: FloatArray, pt: int, pl: int
) -> bool:
    """Forward 3x3 stride-1 convolution: ``x`` [N, C, H, W], ``f`` [K, C, 3, 3], ``y`` [N, K, OH, OW].

    ``pt`` / ``pl``: top / left padding (the bottom and right follow from the shapes).
    """
    ft = np.ascontiguousarray(f.transpose(1, 2, 3, 0))
    return _conv(x, ft, bias, y, pt, pl)


def winograd_backward_data(gy: FloatArray, f: FloatArray, gx: FloatArray, pt: int, pl: int) -> bool:
    """Data gradient: the convolution of ``gy`` with the flipped filter, K and C swapped.

    ``gx[h, w] = sum_r,s gy[h + pt - r, w + pl - s] f[r, s]``: a forward convolution
    reading ``gy`` at (h - (2 - pt) + r', ...) with ``f`` flipped (r' = 2 - r).
    """
    ft = np.ascontiguousarray(f[:, :, ::-1, ::-1].transpose(0, 2, 3, 1))
    return _conv(gy, ft, None, gx, 2 - pt, 2 - pl)


def winograd_backward_filter(x: FloatArray, gy: FloatArray, gf: FloatArray, pt: int, pl: int) -> bool:
    """Filter gradient ``gf`` [K, C, 3, 3] of a 3x3 stride-1 convolution.

    Each thread sums its items' transformed gradients into its own [36, C, K] partial;
    the partials are added and transformed back once.
    """
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
            work = thread_scratch("winograd", kern.filter_grad_scratch(n1 - n0, t1 - t0, tw, cin, kout))
            if not finite[0] or not kern.filter_grad_item(x, gy, acc, n0, n1, t0, t1, pt, pl, work):
                finite[0] = False
                return

    with single_threaded_blas():
        parallel_pull(len(items), run)
    if not finite[0]:
        return False
    total = partials[0]
    for extra in partials[1:]:
        total += extra
    out = np.empty((cin, 3, 3, kout), dtype=np.float32)
    kern.filter_untransform(total, out)
    gf[...] = out.transpose(3, 0, 1, 2)
    return True
