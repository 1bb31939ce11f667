"""Lowerings of reductions, softmax and layer normalisation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._lowering import Lowerer, Unmappable, lowers, normalize_axis
from ._tensors import DeviceTensor, broadcast_strides
from .ops_elementwise import emit_binary

_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}


def _reduce_axes(lw: Lowerer) -> list[int] | None:
    """The axes to reduce (None: every axis), from the attribute or the second input."""
    takes_input = lw.opset >= 18 or (lw.node.op == "ReduceSum" and lw.opset >= 13)
    if takes_input:
        if not lw.has(1):
            return None
        axes = lw.need_const(1, "the axes")
        return [int(a) for a in np.asarray(axes).reshape(-1)]
    axes_attr = lw.attr("axes")
    return None if axes_attr is None else [int(a) for a in axes_attr]


def reduce_groups(shape: tuple[int, ...], reduced: set[int]) -> list[tuple[int, bool]]:
    """``shape`` as (extent, reduced) groups: unit dimensions dropped, alike neighbours merged."""
    groups: list[list[Any]] = []
    for axis, extent in enumerate(shape):
        if extent == 1:
            continue
        flag = axis in reduced
        if groups and groups[-1][1] == flag:
            groups[-1][0] *= extent
        else:
            groups.append([extent, flag])
    return [(int(e), bool(f)) for e, f in groups]


def emit_reduce(lw: Lowerer, op: str, x: DeviceTensor, axes: set[int], y: DeviceTensor) -> None:
    """Reduce ``x`` over ``axes`` into ``y`` (one ``reduce`` call per merged group of axes)."""
    groups = reduce_groups(x.shape, axes)
    if not any(flag for _, flag in groups):
        if y.size:
            lw.call("copy_dtod", y, x, y.nbytes)
        return
    if y.size == 0:
        return
    current, shape = x, [e for e, _ in groups]
    flags = [f for _, f in groups]
    while any(flags):
        axis = max(i for i, f in enumerate(flags) if f)
        remaining = shape[:axis] + shape[axis + 1 :]
        last = not any(flags[:axis])
        target = y.view(remaining or (1,)) if last else lw.scratch(remaining, x.dtype, f"reduce{axis}")
        lw.call("reduce", op, current, target, tuple(shape), axis, dtype=x.dt)
        current, shape = target, remaining
        flags = flags[:axis] + flags[axis + 1 :]


@lowers(*_REDUCE)
def reduce(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    axes = _reduce_axes(lw)
    x = lw.tensor(0)
    if not axes:
        if lw.attr("noop_with_empty_axes", 0):
            lw.alias(0, x)
            return
        axes = list(range(len(x_shape)))
    reduced = {normalize_axis(a, len(x_shape)) for a in axes}
    if not any(x_shape[a] != 1 for a in reduced):
        lw.alias(0, x)
        return
    y = lw.output(0)
    emit_reduce(lw, _REDUCE[lw.node.op], x, reduced, y)


@lowers("Softmax", "LogSoftmax")
def softmax(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    rank = len(x_shape)
    x = lw.tensor(0)
    y = lw.output(0)
    if y.size == 0:
        return
    if rank == 0:
        raise Unmappable("Softmax of a scalar")
    legacy = lw.opset < 13
    axis = normalize_axis(int(lw.attr("axis", 1 if legacy else -1)), rank)
    outer = math.prod(x_shape[:axis])
    if legacy:
        shape: tuple[int, ...] = (outer, math.prod(x_shape[axis:]))
        dim = 1
    else:
        inner = math.prod(x_shape[axis + 1 :])
        shape, dim = ((outer, x_shape[axis]), 1) if inner == 1 else ((outer, x_shape[axis], inner), 1)
    kwargs: dict[str, Any] = {"dtype": y.dt}
    if lw.node.op == "LogSoftmax":
        kwargs["log"] = True
    lw.call("softmax", x.view(shape), y.view(shape), shape, dim, **kwargs)


def _affine(lw: Lowerer, i: int, norm_shape: tuple[int, ...], dtype: np.dtype[Any]) -> DeviceTensor | None:
    """Scale or bias of LayerNormalization as ``cols`` values (broadcast on the host or device)."""
    if not lw.has(i):
        return None
    cols = math.prod(norm_shape)
    value = lw.const(i)
    if value is not None:
        full = np.broadcast_to(value.astype(dtype), norm_shape).reshape(cols)
        key = f"{lw.node.inputs[i]}:{cols}:{dtype.name}"
        return lw.weight(np.ascontiguousarray(full), f"affine{i}", key=key)
    tensor = lw.tensor(i)
    if tensor.size == cols and tensor.dtype == dtype:
        return tensor.view((cols,))
    if tensor.dtype != dtype:
        raise Unmappable(f"LayerNormalization parameter {lw.node.inputs[i]!r} has another dtype")
    full_t = lw.scratch((cols,), dtype, f"affine{i}")
    lw.copy(full_t.view(norm_shape), tensor, norm_shape, broadcast_strides(tensor.shape, norm_shape))
    return full_t


@lowers("LayerNormalization")
def layer_norm(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    axis = normalize_axis(int(lw.attr("axis", -1)), len(x_shape))
    eps = float(lw.attr("epsilon", 1e-5))
    rows, cols = math.prod(x_shape[:axis]), math.prod(x_shape[axis:])
    x = lw.tensor(0)
    y = lw.output(0)
    kwargs: dict[str, Any] = {"dtype": y.dt}
    scale = _affine(lw, 1, x_shape[axis:], y.dtype)
    bias = _affine(lw, 2, x_shape[axis:], y.dtype)
    if scale is not None:
        kwargs["scale_ptr"] = scale
    if bias is not None:
        kwargs["bias_ptr"] = bias
    if y.size:
        lw.call("layer_norm", x, y, rows, cols, eps, **kwargs)
    if lw.wants(1) or lw.wants(2):
        _layer_norm_stats(lw, x.view((rows, cols)), rows, cols, eps)


def _layer_norm_stats(lw: Lowerer, x: DeviceTensor, rows: int, cols: int, eps: float) -> None:
    """LayerNormalization's optional Mean and InvStdDev outputs (float32 statistics)."""
    stat_dtype = lw.out_dtype(1) if lw.wants(1) else lw.out_dtype(2)
    if stat_dtype != x.dtype:
        raise Unmappable("LayerNormalization statistics in another dtype than the input")
    mean = lw.output(1) if lw.wants(1) else lw.scratch((rows,), x.dtype, "mean")
    mean = mean.view((rows,))
    if rows == 0:
        return
    lw.call("reduce", "mean", x, mean, (rows, cols), 1, dtype=x.dt)
    if not lw.wants(2):
        return
    centred = lw.scratch((rows, cols), x.dtype, "centred")
    emit_binary(lw, "sub", x, mean.view((rows, 1)), centred)
    lw.call("unary", "square", centred, centred, rows * cols, dtype=x.dt)
    inv = lw.output(2).view((rows,))
    lw.call("reduce", "mean", centred, inv, (rows, cols), 1, dtype=x.dt)
    eps_t = lw.weight(np.asarray([eps], dtype=x.dtype), "eps", key=f"eps:{eps}:{x.dt}")
    emit_binary(lw, "add", inv, eps_t, inv)
    lw.call("unary", "sqrt", inv, inv, rows, dtype=x.dt)
    lw.call("unary", "reciprocal", inv, inv, rows, dtype=x.dt)
