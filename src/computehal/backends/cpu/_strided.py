"""Strided copies and broadcast views: dimension simplification and thread splitting.

A strided problem (a shape and, per operand, element strides over it) is first
simplified by the shared ``collapse``: dimensions of extent 1 go, and neighbours that
every operand walks as one merge. What remains is usually one to
three dimensions, which NumPy iterates with long inner loops, or which the tiled kernel
of :mod:`._kmove` copies when the copy transposes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._common import collapse
from ._plumbing import FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges, workers

__all__ = ["STREAM_MIN_BYTES", "Layout", "simplify", "strided_view", "split_run", "copy_layout"]

#: Both edges of a transposed block at least this long: the tiled kernel beats NumPy.
TILED_MIN = 32
#: Outputs of at least this many bytes are written by whole 64-byte lines streamed past
#: the caches (a plain store first reads the line it writes; such outputs leave L2 anyway).
STREAM_MIN_BYTES = 1 << 23

Layout = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


def simplify(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> Layout:
    """:func:`~computehal.backends._common.collapse` as tuples (at least one dimension)."""
    dims, steps = collapse(shape, *strides)
    return tuple(dims), tuple(tuple(s) for s in steps)


def strided_view(flat: FloatArray, origin: int, shape: Sequence[int], strides: Sequence[int]) -> FloatArray:
    """A view of ``flat`` with element ``[0, ..., 0]`` at ``origin`` (strides in elements).

    Built by the ``ndarray`` constructor, which checks that every element addressed lies
    inside ``flat`` (``as_strided`` does not, and costs ten times as much a call).
    """
    size = flat.dtype.itemsize
    return np.ndarray(
        tuple(shape), flat.dtype, buffer=flat, offset=origin * size, strides=tuple(s * size for s in strides)
    )


def split_run(shape: tuple[int, ...], axis: int, run: Callable[[tuple[slice, ...]], None]) -> None:
    """Call ``run(index)`` on slabs of ``shape`` along ``axis``, split over the worker threads."""
    total = math.prod(shape)
    extent = shape[axis] if shape else 1
    grain = max(1, PARALLEL_THRESHOLD * extent // max(1, total))

    def part(start: int, stop: int) -> None:
        index = [slice(None)] * len(shape)
        if shape:
            index[axis] = slice(start, stop)
        run(tuple(index))

    parallel_ranges(extent, part, grain=grain)


def _split_axis(shape: tuple[int, ...], inner: int) -> int:
    """The axis to split threads over: the longest one other than ``inner`` (when there is one)."""
    if len(shape) <= 1:
        return 0
    return max((e, -i, i) for i, e in enumerate(shape) if i != inner)[2]


def copy_layout(src: FloatArray, src_origin: int, dst: FloatArray, dst_origin: int, layout: Layout) -> None:
    """``dst`` view = ``src`` view for a simplified layout (1-D arrays of one bit-copy type)."""
    shape, (ss, ds) = layout
    inner = min(range(len(ds)), key=lambda i: abs(ds[i])) if shape else 0
    # The source's own innermost axis (a broadcast axis, stride 0, does not count).
    walked = [(abs(s), i) for i, s in enumerate(ss) if s != 0]
    source_inner = min(walked)[1] if walked else inner
    tiled = (
        len(shape) >= 2
        and source_inner != inner
        and abs(ss[source_inner]) < abs(ss[inner])
        and min(shape[inner], shape[source_inner]) >= TILED_MIN
    )
    compiled = kernels("_kmove") if tiled else None
    if compiled is not None:
        _copy_tiled(compiled, src, src_origin, dst, dst_origin, layout, source_inner, inner)
        return
    src_view = strided_view(src, src_origin, shape, ss)
    dst_view = strided_view(dst, dst_origin, shape, ds)

    def run(index: tuple[slice, ...]) -> None:
        np.copyto(dst_view[index], src_view[index])

    split_run(shape, _split_axis(shape, inner), run)


def _copy_tiled(
    compiled: Any,
    src: FloatArray,
    src_origin: int,
    dst: FloatArray,
    dst_origin: int,
    layout: Layout,
    rows: int,
    cols: int,
) -> None:
    """The tiled kernel over the (``rows``, ``cols``) plane, for every index of the other axes."""
    shape, (ss, ds) = layout
    others = [i for i in range(len(shape)) if i not in (rows, cols)]
    outer = [
        (
            src_origin + sum(k * ss[a] for k, a in zip(index, others, strict=True)),
            dst_origin + sum(k * ds[a] for k, a in zip(index, others, strict=True)),
        )
        for index in np.ndindex(*(shape[a] for a in others))
    ]
    # Threads take whole planes, or bands of rows of a plane when planes are few.
    n_rows, plane = shape[rows], shape[rows] * shape[cols]
    registers = src.dtype.itemsize == 4 and ss[rows] == 1 and ds[cols] == 1
    streamed = registers and _lines_aligned(
        compiled, dst, [d for _, d in outer], ds[rows], plane * len(outer)
    )
    bands = 1 if len(outer) >= 2 * workers() else max(1, min(n_rows // TILED_MIN, 2 * workers()))

    def run(start: int, stop: int) -> None:
        for t in range(start, stop):
            which, band = divmod(t, bands)
            s_at, d_at = outer[which]
            r0, r1 = n_rows * band // bands, n_rows * (band + 1) // bands
            if registers:
                (compiled.transpose_lines if streamed else compiled.transpose_f32)(
                    src.view(np.float32), s_at + r0, ss[cols], dst.view(np.float32),
                    d_at + r0 * ds[rows], ds[rows], r1 - r0, shape[cols],
                )  # fmt: skip
                continue
            compiled.copy_tiled(
                src, s_at + r0 * ss[rows], ss[rows], ss[cols],
                dst, d_at + r0 * ds[rows], ds[rows], ds[cols], r1 - r0, shape[cols],
            )  # fmt: skip

    tasks = len(outer) * bands
    parallel_ranges(tasks, run, grain=tasks if plane * len(outer) < PARALLEL_THRESHOLD else 1)


def _lines_aligned(compiled: Any, dst: FloatArray, starts: list[int], row: int, count: int) -> bool:
    """Whether a 4-byte transposed copy of ``count`` elements streams whole destination lines.

    True when it is large enough and every destination row (``starts`` plus multiples of
    ``row``) begins a 64-byte line.
    """
    if count * 4 < STREAM_MIN_BYTES or row % 16:
        return False
    phase = compiled.line_phase(dst.view(np.float32))
    return phase >= 0 and all((d - phase) % 16 == 0 for d in starts)
