"""Data movement on the device: byte copies, fills, strided copies, row gather and scatter.

``copy_dtod`` of whole words between two buffers is a ``copy_buffer_to_buffer``; any
other range (odd offsets or sizes, or both ends in one buffer, which wgpu's copy
refuses) runs ``copy_bytes`` (wgpu_movement.wgsl), in which each invocation owns one
destination word. ``fill`` writes the value's bit pattern with ``fill_words`` the same
way (the value is rounded to the dtype on the host, like any scalar argument).
``copy_strided`` (wgpu_strided.wgsl) copies one 32-bit element per invocation.

Gather and scatter (wgpu_rows.wgsl) with host indices upload the validated snapshot
(scatter: the last occurrence of each row, computed on the host). Device indices are
checked by ``index_check`` on the device; the copy kernels write nothing when it found
a bad index, and the host then reads the status word to raise the same
InvalidArgumentError as the host path.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ... import validation as v
from ...errors import InvalidArgumentError
from ...memory import Region
from .._common import ceil_div, collapse, fill_pattern
from ._device import Gpu
from ._queue import Copy, Step, grid_1d, pack, vec6

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
    bits = int(fill_pattern(p.value, p.dtype))
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
    params = pack(count, p.cols, src.elem, dst.elem, 0, p.rows, 0, 0)
    step = Step(kernel, params, (src, idx, dst, gpu.dummy()), grid_1d(count * p.cols, 256))
    gpu.run([step], retire=[buffer])


def _device_rows(gpu: Gpu, p: v.RowsProblem, scatter: bool) -> None:
    """Gather / scatter with indices in device memory, checked there before anything is written."""
    assert p.index is not None and p.index_dtype is not None
    if p.count == 0:
        return
    wide = p.index_dtype.itemsize == 8
    src, dst = gpu.bind("input_ptr", p.input), gpu.bind("output_ptr", p.output)
    bi = gpu.bind("indices_ptr", p.index)
    status, bs = gpu.temporary(4 * (1 + (p.rows if scatter else 0)), "computehal-index-status")
    params = pack(p.count, p.cols, src.elem, dst.elem, bi.elem, p.rows, wide, scatter)
    bindings = (src, bi, dst, bs)
    kernel = "scatter_device" if scatter else "gather_device"
    steps = [
        Step("index_check", params, bindings, grid_1d(p.count, 256)),
        Step(kernel, params, bindings, grid_1d(p.count * p.cols, 256)),
    ]
    gpu.run(steps)
    bad = int(np.frombuffer(gpu.queue.read(status, 0, 4), dtype=np.uint32)[0])
    gpu.run([], retire=[status])
    if bad:
        # Nothing was written; report the indices as the host path does.
        raw = gpu.queue.read(p.index.payload, p.index.offset, p.index.nbytes)
        indices = np.frombuffer(raw, dtype=p.index_dtype)
        low, high = int(indices.min()), int(indices.max())
        if low < 0:
            raise InvalidArgumentError(f"index {low} is negative")
        raise InvalidArgumentError(f"index {high} is out of range for {p.rows} rows")


def gather(gpu: Gpu, p: v.RowsProblem) -> None:
    """Run a validated gather (host or device indices)."""
    if p.indices is None:
        _device_rows(gpu, p, scatter=False)
        return
    _rows(gpu, "gather", p, p.indices.astype(np.uint32), int(p.indices.size))


def scatter(gpu: Gpu, p: v.RowsProblem) -> None:
    """Run a validated scatter (host or device indices; the last occurrence of a row wins)."""
    if p.indices is None:
        _device_rows(gpu, p, scatter=True)
        return
    destinations, sources = v.last_occurrences(p.indices)
    pairs = np.empty(2 * destinations.size, dtype=np.uint32)
    pairs[0::2] = destinations
    pairs[1::2] = sources
    _rows(gpu, "scatter", p, pairs, int(destinations.size))
