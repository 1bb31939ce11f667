"""Data movement on the device: byte copies, fills, row gather and scatter.

``copy_dtod`` of whole words between two buffers is a ``copy_buffer_to_buffer``; any
other range (odd offsets or sizes, or both ends in one buffer, which wgpu's copy
refuses) runs ``copy_bytes`` (wgpu_movement.wgsl), in which each invocation owns one
destination word. ``fill`` writes the value's bit pattern with ``fill_words`` the same
way (the value is rounded to the dtype on the host, like any scalar argument).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ... import validation as v
from ...memory import Region
from .._common import ceil_div, refuse_extensions
from ._device import Gpu
from ._queue import Copy, Step, grid_1d, pack
from ._shapes import collapse, vec6

__all__ = ["copy_dtod", "copy_range", "copy_strided", "fill", "gather", "scatter"]


def copy_range(gpu: Gpu, src: Region, dst: Region) -> None:
    """Copy ``dst.nbytes`` bytes from ``src`` to ``dst`` (not overlapping, or identical: nothing to do)."""
    nbytes = dst.nbytes
    if src == dst:
        return
    if (src.offset | dst.offset | nbytes) % 4 == 0 and src.payload is not dst.payload:
        gpu.run([], [Copy(src.payload, src.offset, dst.payload, dst.offset, nbytes)])
        return
    bs = gpu.bind("src_ptr", src, align=1)
    bd = gpu.bind("dst_ptr", dst, align=1)
    words = ceil_div(bd.byte + nbytes, 4) - bd.byte // 4
    params = pack(words, bd.byte, bs.byte, nbytes, 0)
    gpu.run([Step("copy_bytes", params, (bs, bd), grid_1d(words, 256))])


def copy_dtod(gpu: Gpu, p: v.CopyProblem) -> None:
    """Copy ``p.nbytes`` bytes from ``p.src`` to ``p.dst``."""
    copy_range(gpu, p.src, p.dst.sized(p.nbytes))


def copy_strided(gpu: Gpu, p: v.StridedProblem) -> None:
    """Copy a strided view of 32-bit elements (16-bit dtypes arrive widened by the base)."""
    shape, (src_strides, dst_strides) = collapse(p.shape, p.src_strides, p.dst_strides)
    bs, bd = gpu.bind("src_ptr", p.src), gpu.bind("dst_ptr", p.dst)
    total = p.size
    params = pack(
        *vec6(shape), *vec6(src_strides), *vec6(dst_strides),
        total, bs.elem + p.src_origin, bd.elem + p.dst_origin, len(shape),
    )  # fmt: skip
    gpu.run([Step("copy_strided", params, (bs, bd), grid_1d(total, 256))])


def fill(gpu: Gpu, p: v.FillProblem) -> None:
    """Write ``p.value`` rounded to ``p.dtype`` into ``p.count`` elements."""
    bits = int(np.asarray(p.value, dtype=p.dtype).view(np.uint16 if p.dtype.itemsize == 2 else np.uint32))
    pattern = bits | (bits << 16) if p.dtype.itemsize == 2 else bits
    bd = gpu.bind("ptr", p.region, align=p.dtype.itemsize)
    words = ceil_div(bd.byte + p.region.nbytes, 4) - bd.byte // 4
    params = pack(words, bd.byte, 0, p.region.nbytes, pattern)
    gpu.run([Step("fill_words", params, (gpu.dummy(), bd), grid_1d(words, 256))])


def _rows(gpu: Gpu, kernel: str, p: v.RowsProblem, words: npt.NDArray[np.uint32], count: int) -> None:
    if count == 0:
        return  # scatter of no rows
    src = gpu.bind("input_ptr", p.input)
    dst = gpu.bind("output_ptr", p.output)
    buffer, idx = gpu.temporary(words.nbytes, "computehal-indices")
    gpu.queue.upload(buffer, words)
    params = pack(count, p.cols, src.elem, dst.elem, 0)
    gpu.run([Step(kernel, params, (src, idx, dst), grid_1d(count * p.cols, 256))], retire=[buffer])


def gather(gpu: Gpu, p: v.RowsProblem) -> None:
    """Run a validated gather with host indices."""
    refuse_extensions("wgpu", "gather", p)
    assert p.indices is not None
    _rows(gpu, "gather", p, p.indices.astype(np.uint32), int(p.indices.size))


def scatter(gpu: Gpu, p: v.RowsProblem) -> None:
    """Run a validated scatter with host indices (the last occurrence of a row wins)."""
    refuse_extensions("wgpu", "scatter", p)
    assert p.indices is not None
    destinations, sources = v.last_occurrences(p.indices)
    pairs = np.empty(2 * destinations.size, dtype=np.uint32)
    pairs[0::2] = destinations
    pairs[1::2] = sources
    _rows(gpu, "scatter", p, pairs, int(destinations.size))
