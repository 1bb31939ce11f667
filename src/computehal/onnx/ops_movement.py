"""Lowerings of data movement: views, Concat, Split, Slice, Transpose, Expand, Gather, Scatter.

Reshape, Flatten, Squeeze and Unsqueeze are views of their input (no call at all), as are
slices and splits that select one contiguous run. Everything else is ``copy_strided``
(``copy_dtod`` for contiguous runs) or a row ``gather`` / ``scatter`` whose indices are
integers computed on the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ._lowering import Lowerer, Unmappable, lowers, normalize_axis
from ._tensors import DeviceTensor, broadcast_strides, coalesce, contiguous_strides


@lowers("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def view(lw: Lowerer) -> None:
    lw.alias(0, lw.tensor(0))


def copy_or_view(lw: Lowerer, src: DeviceTensor, shape: tuple[int, ...], src_strides: Sequence[int]) -> None:
    """Output 0 = ``src`` read over ``shape`` with ``src_strides``: a view when that is contiguous."""
    if math.prod(shape) == 0:
        lw.output(0)
        return
    dims, (ss, ds) = coalesce(shape, src_strides, contiguous_strides(shape))
    if len(dims) == 1 and ss[0] == 1 and ds[0] == 1:
        lw.alias(0, src.view(shape))
        return
    y = lw.output(0)
    lw.copy(y, src, shape, src_strides)


@lowers("Concat")
def concat(lw: Lowerer) -> None:
    y = lw.output(0)
    axis = normalize_axis(int(lw.attr("axis")), len(y.shape))
    outer, inner, total = math.prod(y.shape[:axis]), math.prod(y.shape[axis + 1 :]), y.shape[axis]
    offset = 0
    for i in range(len(lw.node.inputs)):
        if not lw.has(i):
            continue
        extent = lw.shape(i)[axis]
        if extent and outer and inner:
            x = lw.tensor(i)
            lw.copy(
                y.view(y.shape, offset * inner),
                x,
                (outer, extent * inner),
                (extent * inner, 1),
                (total * inner, 1),
            )
        offset += extent


def _split_sizes(lw: Lowerer, extent: int, parts: int) -> list[int]:
    if lw.opset < 13 and lw.attr("split") is not None:
        return [int(s) for s in lw.attr("split")]
    if lw.opset >= 13 and lw.has(1):
        return [int(s) for s in np.asarray(lw.need_const(1, "the split sizes")).reshape(-1)]
    count = int(lw.attr("num_outputs", parts))
    step = -(-extent // count)
    return [min(step, max(0, extent - j * step)) for j in range(count)]


@lowers("Split")
def split(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    axis = normalize_axis(int(lw.attr("axis", 0)), len(x_shape))
    sizes = _split_sizes(lw, x_shape[axis], len(lw.node.outputs))
    if sum(sizes) != x_shape[axis] or len(sizes) != len(lw.node.outputs):
        raise Unmappable(f"split sizes {sizes} do not divide axis {axis} of {list(x_shape)}")
    x = lw.tensor(0)
    outer, inner = math.prod(x_shape[:axis]), math.prod(x_shape[axis + 1 :])
    offset = 0
    for j, size in enumerate(sizes):
        if lw.wants(j):
            part = x.view(x.shape, offset * inner)
            strides = contiguous_strides(x_shape)
            shape = x_shape[:axis] + (size,) + x_shape[axis + 1 :]
            _output_j(lw, j, part, shape, strides, outer)
        offset += size


def _output_j(
    lw: Lowerer, j: int, src: DeviceTensor, shape: tuple[int, ...], strides: tuple[int, ...], outer: int
) -> None:
    name = lw.node.outputs[j]
    if outer == 1 or math.prod(shape) == 0:
        lw.outputs[name] = src.view(shape)
        return
    y = lw.output(j, shape)
    lw.copy(y, src, shape, strides)


def _slice_params(lw: Lowerer, rank: int) -> tuple[list[int], list[int], list[int], list[int]]:
    if lw.opset < 10:
        starts, ends = list(lw.attr("starts")), list(lw.attr("ends"))
        axes = list(lw.attr("axes", range(len(starts))))
        return [int(s) for s in starts], [int(e) for e in ends], [int(a) for a in axes], [1] * len(starts)

    def ints(i: int, what: str) -> list[int]:
        return [int(v) for v in np.asarray(lw.need_const(i, what)).reshape(-1)]

    starts, ends = ints(1, "Slice starts"), ints(2, "Slice ends")
    axes = ints(3, "Slice axes") if lw.has(3) else list(range(len(starts)))
    steps = ints(4, "Slice steps") if lw.has(4) else [1] * len(starts)
    return starts, ends, axes, steps


@lowers("Slice")
def slice_(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    rank = len(x_shape)
    starts, ends, axes, steps = _slice_params(lw, rank)
    begin = [0] * rank
    step = [1] * rank
    count = list(x_shape)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = normalize_axis(a, rank)
        dim = x_shape[a]
        if st == 0:
            raise Unmappable("Slice step 0")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        begin[a], step[a] = s, st
        count[a] = max(0, -(-(e - s) // st))
    x = lw.tensor(0)
    strides = contiguous_strides(x_shape)
    origin = sum(b * s for b, s in zip(begin, strides, strict=True)) if all(count) else 0
    src_strides = [s * st for s, st in zip(strides, step, strict=True)]
    copy_or_view(lw, x.view(x.shape, origin), tuple(count), src_strides)


@lowers("Transpose")
def transpose(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    perm = [int(p) for p in lw.attr("perm", list(reversed(range(len(x_shape)))))]
    strides = contiguous_strides(x_shape)
    x = lw.tensor(0)
    copy_or_view(lw, x, tuple(x_shape[p] for p in perm), [strides[p] for p in perm])


@lowers("Expand")
def expand(lw: Lowerer) -> None:
    out_shape = lw.out_shape(0)
    x = lw.tensor(0)
    copy_or_view(lw, x, out_shape, broadcast_strides(x.shape, out_shape))


def _normalized(indices: np.ndarray, extent: int) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64)
    return np.where(idx < 0, idx + extent, idx)


@lowers("Gather")
def gather(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    axis = normalize_axis(int(lw.attr("axis", 0)), len(x_shape))
    outer, extent, inner = math.prod(x_shape[:axis]), x_shape[axis], math.prod(x_shape[axis + 1 :])
    x = lw.tensor(0)
    y = lw.output(0)

    def rows(indices: np.ndarray) -> np.ndarray:
        idx = _normalized(indices, extent).reshape(1, -1)
        flat: np.ndarray = (np.arange(outer, dtype=np.int64).reshape(-1, 1) * extent + idx).reshape(-1)
        return flat

    arg = lw.host_arg(rows, 1, label="Gather rows")
    if y.size:
        lw.call("gather", x.view((outer * extent, inner)), arg, y, outer * extent, inner, dtype=y.dt)


def _flat_positions(shape: tuple[int, ...], indices: np.ndarray, axis: int) -> np.ndarray:
    """Flat element positions in a tensor of ``shape`` of GatherElements / ScatterElements indices."""
    idx = _normalized(indices, shape[axis])
    if idx.size and (idx.min() < 0 or idx.max() >= shape[axis]):
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise InvalidArgumentError(f"index {bad} is out of range for axis {axis} of extent {shape[axis]}")
    strides = contiguous_strides(shape)
    grid = np.indices(idx.shape, dtype=np.int64)
    flat = np.zeros(idx.shape, dtype=np.int64)
    for d in range(idx.ndim):
        flat += (idx if d == axis else grid[d]) * strides[d]
    return flat.reshape(-1)


@lowers("GatherElements")
def gather_elements(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    axis = normalize_axis(int(lw.attr("axis", 0)), len(x_shape))
    x = lw.tensor(0)
    y = lw.output(0)
    arg = lw.host_arg(lambda i: _flat_positions(x_shape, i, axis), 1, label="GatherElements positions")
    if y.size:
        lw.call("gather", x.view((x.size, 1)), arg, y.view((y.size, 1)), x.size, 1, dtype=y.dt)


@lowers("ScatterElements")
def scatter_elements(lw: Lowerer) -> None:
    reduction = lw.attr("reduction", "none")
    if reduction != "none":
        raise Unmappable(f"ScatterElements reduction={reduction!r}")
    x_shape = lw.shape(0)
    axis = normalize_axis(int(lw.attr("axis", 0)), len(x_shape))
    x, updates = lw.tensor(0), lw.tensor(2)
    y = lw.output(0)
    if y.size == 0:
        return
    lw.call("copy_dtod", y, x, y.nbytes)
    arg: Any = lw.host_arg(lambda i: _flat_positions(x_shape, i, axis), 1, label="ScatterElements positions")
    if updates.size:
        lw.call("scatter", updates.view((updates.size, 1)), arg, y.view((y.size, 1)), y.size, 1, dtype=y.dt)


@lowers("Where")
def where(lw: Lowerer) -> None:
    """``Where(cond, x, y)`` with ``cond`` known on the host: both sides side by side, one gather."""
    if not lw.is_host(0):
        raise Unmappable("the Where condition must be known on the host (a constant or an integer fact)")
    from .ops_elementwise import operand

    out_shape = lw.out_shape(0)
    y = lw.output(0)
    n = y.size
    if n == 0:
        return
    pair = lw.scratch((2 * n,), y.dtype, "sides")
    for side, i in ((0, 1), (1, 2)):
        src = operand(lw, i, y.dtype)
        lw.copy(pair.view(out_shape, side * n), src, out_shape, broadcast_strides(src.shape, out_shape))

    def positions(cond: np.ndarray) -> np.ndarray:
        flat = np.broadcast_to(np.asarray(cond, dtype=np.bool_), out_shape).reshape(-1)
        index = np.arange(n, dtype=np.int64)
        chosen: np.ndarray = np.where(flat, index, index + n)
        return chosen

    arg = lw.host_arg(positions, 0, label="Where positions")
    lw.call("gather", pair.view((2 * n, 1)), arg, y.view((n, 1)), 2 * n, 1, dtype=y.dt)


@lowers("Pad")
def pad(lw: Lowerer) -> None:
    """Constant-mode Pad: ``fill`` with the value, then the input copied inside (negative pads crop)."""
    mode = lw.attr("mode", "constant")
    if mode != "constant":
        raise Unmappable(f"Pad mode={mode!r}")
    x_shape = lw.shape(0)
    rank = len(x_shape)
    if lw.opset < 11:
        pads = [int(p) for p in lw.attr("pads")]
        value = float(lw.attr("value", 0.0))
    else:
        pads = [int(p) for p in np.asarray(lw.need_const(1, "the pads")).reshape(-1)]
        value = float(np.asarray(lw.need_const(2, "the Pad value")).reshape(-1)[0]) if lw.has(2) else 0.0
    axes = list(range(rank))
    if lw.has(3):
        axes = [normalize_axis(int(a), rank) for a in np.asarray(lw.need_const(3, "the axes")).reshape(-1)]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    x = lw.tensor(0)
    y = lw.output(0)
    if y.size == 0:
        return
    lw.call("fill", y, y.size, value, dtype=y.dt)
    counts = [x_shape[a] - max(0, -begin[a]) - max(0, -end[a]) for a in range(rank)]
    if min(counts, default=1) <= 0:
        return
    xs, ys = contiguous_strides(x_shape), contiguous_strides(y.shape)
    src_off = sum(max(0, -begin[a]) * xs[a] for a in range(rank))
    dst_off = sum(max(0, begin[a]) * ys[a] for a in range(rank))
    lw.copy(y.view(y.shape, dst_off), x.view(x.shape, src_off), counts, xs, ys)


@lowers("Dropout")
def dropout(lw: Lowerer) -> None:
    """Dropout that passes its input through (inference, or ratio 0); the mask is all True."""
    training = lw.const(2) if lw.has(2) else np.asarray(False)
    if training is None:
        raise Unmappable("Dropout's training_mode must be a constant")
    ratio = lw.const(1) if lw.has(1) else np.asarray(lw.attr("ratio", 0.5))
    if bool(np.asarray(training).reshape(-1)[0]) and (
        ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0
    ):
        raise Unmappable("training-mode Dropout is random")
    lw.alias(0, lw.tensor(0))
    if lw.wants(1):
        lw.host_const(1, np.ones(lw.shape(0), dtype=np.bool_))
